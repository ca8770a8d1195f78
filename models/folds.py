"""Constants a checkpoint's architecture applies around its matrices, folded into the weights as they are read
(Checkpoint.transform), so that every backend runs the plain ops of models/graph.py:

- q_scale (Granite's attention_multiplier in place of 1/sqrt(head_dim)): the q projection (or its q norm) times it;
- residual_scale (Granite): each block's output projection (o_proj, down_proj) times it;
- logit_scale (Granite: 1 / logits_scaling): the final norm times it (the head is linear in it; a tied head stays
  the unscaled embedding);
- partial rotary (Phi-3/4: RoPE on the first rotary_dim dims of each head, pairs (i, i + rotary_dim/2)): the q and k
  rows of each head permuted so that those pairs become the full-head pairs (j, j + head_dim/2) and the unrotated
  dims pair among themselves with frequency 0 (models/rope.py pads the table with zeros). Attention reads q and k
  only through their dot products, which one permutation of both leaves unchanged."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .spec import ModelSpec

Fn = Callable[[np.ndarray], np.ndarray]


def rotary_permutation(head_dim: int, rotary_dim: int) -> np.ndarray:
    """Index array p with new[j] = old[p[j]] within one head (see the module docstring)."""
    r, rest = rotary_dim // 2, (head_dim - rotary_dim) // 2
    first = np.concatenate([np.arange(r), rotary_dim + np.arange(rest)])
    second = np.concatenate([r + np.arange(r), rotary_dim + rest + np.arange(rest)])
    return np.concatenate([first, second])


def _per_head(perm: np.ndarray, head_dim: int) -> Fn:
    def fn(w):
        w = np.asarray(w, np.float32)
        heads = w.shape[0] // head_dim
        return w.reshape(heads, head_dim, *w.shape[1:])[:, perm].reshape(w.shape)
    return fn


def _times(c: float) -> Fn:
    return lambda w: np.asarray(w, np.float32) * np.float32(c)


def _then(f: Fn | None, g: Fn) -> Fn:
    return g if f is None else (lambda w: g(f(w)))


def llama_folds(s: ModelSpec, dense_mlp: Callable[[ModelSpec, int], tuple[str, str, str]]) -> dict[str, Fn]:
    """Checkpoint name -> transform for a Llama-family spec (empty when it has none of the constants above)."""
    out: dict[str, Fn] = {}

    def add(name: str, fn: Fn) -> None:
        out[name] = _then(out.get(name), fn)

    if s.logit_scale != 1.0:
        add("model.norm.weight", _times(s.logit_scale))
    rot = s.rotary_dim and s.rotary_dim != s.head_dim
    perm = _per_head(rotary_permutation(s.head_dim, s.rotary_dim), s.head_dim) if rot else None
    for i in range(s.n_layers):
        a = f"model.layers.{i}.self_attn."
        if perm:
            for p in ("q", "k"):
                add(a + f"{p}_proj.weight", perm)
                if s.attention_bias:
                    add(a + f"{p}_proj.bias", perm)
                if s.qk_norm:
                    add(a + f"{p}_norm.weight", perm)
        if s.q_scale != 1.0:
            for n in ((a + "q_norm.weight",) if s.qk_norm else
                      (a + "q_proj.weight",) + ((a + "q_proj.bias",) if s.attention_bias else ())):
                add(n, _times(s.q_scale))
        if s.residual_scale != 1.0:
            down = dense_mlp(s, i)[2]
            for n in (a + "o_proj.weight", down):
                add(n, _times(s.residual_scale))
            if s.o_bias:
                add(a + "o_proj.bias", _times(s.residual_scale))
            if s.mlp_bias:
                add(down.removesuffix(".weight") + ".bias", _times(s.residual_scale))
    return out
