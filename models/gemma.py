"""Gemma 2 and Gemma 3 (text) forward pass, written once against models.graph.Graph: Llama's layout plus (Gemma 3)
per-head q/k norms or (Gemma 2) logit soft-capping of attention scores and of the final logits,
norms after attention and after the FFN (four per layer), a GeGLU FFN (gelu_tanh), embeddings scaled by
sqrt(hidden) (ModelSpec.embed_scale), and sliding-window layers that rotate with their own RoPE base
(ModelSpec.rope_table). Gemma's RMSNorm multiplies by (1 + w) and its attention scales by query_pre_attn_scalar^-1/2;
both are folded into the weights as they are read (weight_transforms), so every backend runs plain ops."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .graph import Graph, Value
from .spec import ModelSpec

EMBED = "model.embed_tokens.weight"
NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")


def body(g: Graph, ids: Value) -> Value:
    """Token ids [T] -> hidden states [T, hidden] (also fills the KV cache rows of these tokens)."""
    s = g.spec
    x = g.embed(ids, EMBED)
    for i in range(s.n_layers):
        p = f"model.layers.{i}."
        a, m = p + "self_attn.", p + "mlp."
        h = g.rmsnorm(x, p + "input_layernorm.weight")
        q = g.linear(h, a + "q_proj.weight")
        if s.qk_norm:   # Gemma 3 (Gemma 2 has none)
            q = g.head_rmsnorm(q, a + "q_norm.weight", s.n_heads)
        k = g.linear(h, a + "k_proj.weight")
        if s.qk_norm:
            k = g.head_rmsnorm(k, a + "k_norm.weight", s.n_kv_heads)
        v = g.linear(h, a + "v_proj.weight")
        table = s.rope_table(i)
        q, k = g.rope(q, s.n_heads, table), g.rope(k, s.n_kv_heads, table)
        g.kv_store(i, k, v)
        o = g.linear(g.attention(q, i), a + "o_proj.weight")
        x = g.add(x, g.rmsnorm(o, p + "post_attention_layernorm.weight"))
        h = g.rmsnorm(x, p + "pre_feedforward_layernorm.weight")
        f = g.linear(g.gelu_mul(g.linear(h, m + "gate_proj.weight"), g.linear(h, m + "up_proj.weight")),
                     m + "down_proj.weight")
        x = g.add(x, g.rmsnorm(f, p + "post_feedforward_layernorm.weight"))
    return x


def head(g: Graph, x: Value) -> Value:
    """Hidden states [T, hidden] -> logits [T, vocab] (the lm_head is the unscaled embedding when tied; Gemma 2
    soft-caps them)."""
    logits = g.linear(g.rmsnorm(x, "model.norm.weight"), g.spec.lm_head_name)
    return g.softcap(logits, g.spec.final_softcap) if g.spec.final_softcap else logits


def weight_shapes(s: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Every checkpoint tensor the forward pass reads, with the shape it must have."""
    hd, q, kv, f, d = s.head_dim, s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim, s.intermediate_size, s.hidden_size
    w: dict[str, tuple[int, ...]] = {EMBED: (s.vocab_size, d), "model.norm.weight": (d,)}
    if not s.tie_word_embeddings:
        w["lm_head.weight"] = (s.vocab_size, d)
    for i in range(s.n_layers):
        p, a, m = f"model.layers.{i}.", f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        w.update({p + n + ".weight": (d,) for n in NORMS})
        w.update({a + "q_proj.weight": (q, d), a + "k_proj.weight": (kv, d), a + "v_proj.weight": (kv, d),
                  a + "o_proj.weight": (d, q),
                  m + "gate_proj.weight": (f, d), m + "up_proj.weight": (f, d), m + "down_proj.weight": (d, f)})
        if s.qk_norm:
            w.update({a + "q_norm.weight": (hd,), a + "k_norm.weight": (hd,)})
    return w


def weight_transforms(s: ModelSpec) -> dict[str, Callable[[np.ndarray], np.ndarray]]:
    """Checkpoint name -> what the stored tensor becomes as it is read: every norm weight w -> 1 + w (Gemma's
    RMSNorm), and the q norm also times q_scale (query_pre_attn_scalar in place of head_dim)."""
    one_plus = lambda w: 1.0 + np.asarray(w, np.float32)   # noqa: E731
    out = {"model.norm.weight": one_plus}
    for i in range(s.n_layers):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        out.update({p + n + ".weight": one_plus for n in NORMS})
        if s.qk_norm:   # Gemma 3: the q scale rides on the q norm
            out[a + "k_norm.weight"] = one_plus
            out[a + "q_norm.weight"] = lambda w: (1.0 + np.asarray(w, np.float32)) * np.float32(s.q_scale)
        elif s.q_scale != 1.0:   # Gemma 2: on the q projection
            out[a + "q_proj.weight"] = lambda w: np.asarray(w, np.float32) * np.float32(s.q_scale)
    return out
