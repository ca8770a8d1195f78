"""The reference backend: executes a model definition eagerly in numpy (float64 by default). It is the oracle the
compiled packages are tested against, and is itself tested against `transformers`."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from . import family
from .rope import apply_rope, cos_sin
from .spec import ModelSpec


class NumpyGraph:
    """Graph backend with a growing KV cache; `pos` is the number of tokens already in the cache."""

    def __init__(self, spec: ModelSpec, weight: Callable[[str], np.ndarray], dtype=np.float64):
        self.spec, self.dtype = spec, dtype
        self._weight, self._cache = weight, {}
        self.k: list[np.ndarray] = [np.zeros((0, spec.n_kv_heads, spec.head_dim), dtype)] * spec.n_layers
        self.v: list[np.ndarray] = list(self.k)
        self.pos = 0
        self._T = 0
        self.expert_lookahead = 0   # > 0: record expert predictions (models/llama.py) in `predictions`
        self.predictions: dict[int, np.ndarray] = {}   # MoE layer -> the last call's predicted ids [T, k]
        self.selections: list[np.ndarray] = []         # every route's selected ids [T, k], in call order

    def w(self, name: str) -> np.ndarray:
        if name not in self._cache:
            self._cache[name] = np.asarray(self._weight(name), dtype=self.dtype)
        return self._cache[name]

    def embed(self, ids, w):
        self._T = len(ids)
        rows = self.w(w)[np.asarray(ids)]
        return rows * self.dtype(self.spec.embed_scale) if self.spec.embed_scale != 1.0 else rows

    def _rms(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.spec.rms_eps) * w

    def rmsnorm(self, x, w):
        return self._rms(x, self.w(w))

    def head_rmsnorm(self, x, w, n_heads):
        T = x.shape[0]
        return self._rms(x.reshape(T, n_heads, -1), self.w(w)).reshape(T, -1)

    def linear(self, x, w, b=None):
        y = x @ self.w(w).T
        return y + self.w(b) if b is not None else y

    def rope(self, x, n_heads, table="rope"):
        T = x.shape[0]
        c, s = cos_sin(self.spec, np.arange(self.pos, self.pos + T), table)
        return apply_rope(x.reshape(T, n_heads, -1), c, s).reshape(T, -1)

    def softcap(self, x, cap):
        return cap * np.tanh(x / cap)

    kv_round = None   # (K's, V's) functions rows -> rows as the package's caches give them back (quant/kv_cache.py), or None
    key_mean = None   # layer -> mu f32[n_kv_heads * head_dim] the K cache holds keys less (quant/key_mean.py), or None

    def kv_store(self, layer, k, v):
        T, sh = k.shape[0], (self.spec.n_kv_heads, self.spec.head_dim)
        k, v = (x.reshape(T, *sh) for x in (k, v))
        if self.key_mean is not None:   # softmax ignores the constant q . mu this takes off a query's scores
            k = k - np.asarray(self.key_mean[layer], self.dtype).reshape(sh)
        if self.kv_round is not None:
            k, v = (f(x).astype(self.dtype) for f, x in zip(self.kv_round, (k, v)))
        self.k[layer] = np.concatenate([self.k[layer][:self.pos], k])
        self.v[layer] = np.concatenate([self.v[layer][:self.pos], v])

    def attention(self, q, layer):
        s = self.spec
        T, S = q.shape[0], self.pos + q.shape[0]
        rep = s.n_heads // s.n_kv_heads
        qh = q.reshape(T, s.n_heads, s.head_dim)
        k = np.repeat(self.k[layer][:S], rep, axis=1)  # [S, NH, D]
        v = np.repeat(self.v[layer][:S], rep, axis=1)
        sc = np.einsum("thd,shd->hts", qh, k) / np.sqrt(s.head_dim)
        if s.attn_softcap:
            sc = s.attn_softcap * np.tanh(sc / s.attn_softcap)
        qpos = (self.pos + np.arange(T))[:, None]
        mask = np.arange(S)[None, :] > qpos
        if s.window(layer):  # sliding window: keys at positions <= q - W are invisible too
            mask |= np.arange(S)[None, :] <= qpos - s.window(layer)
        sc = np.where(mask[None], -np.inf, sc)
        sc = np.exp(sc - sc.max(-1, keepdims=True))
        p = sc / sc.sum(-1, keepdims=True)
        return np.einsum("hts,shd->thd", p, v).reshape(T, -1)

    def add(self, a, b):
        return a + b

    def swiglu(self, gate, up):
        return gate / (1 + np.exp(-gate)) * up

    def gelu_mul(self, gate, up):
        return gelu_tanh(gate) * up

    def bitlinear(self, x, w):
        from .bitnet import bitlinear_ref

        return bitlinear_ref(x, self._weight(w + ".weight"), float(self._weight(w + ".weight_scale")[0]))

    def relu2_mul(self, gate, up):
        return np.maximum(gate, 0) ** 2 * up

    def route(self, x, router, top_k, normalize):
        top, wts = route_top_k(x @ self.w(router).T, top_k, normalize)
        self.selections.append(top)
        return top, wts

    def experts(self, x, routing, experts):
        top, wts = routing
        out = np.zeros_like(x)
        for e in np.unique(top):
            rows, slot = np.nonzero(top == e)
            gate, up, down = experts[e]
            h = self.swiglu(self.linear(x[rows], gate), self.linear(x[rows], up))   # linear: a subclass's scheme
            out[rows] += wts[rows, slot][:, None] * self.linear(h, down)
        return out

    def sigmoid_gate(self, x, w, y):
        return y / (1 + np.exp(-(x @ self.w(w).T)))

    def predict_experts(self, x, norm, router, top_k, experts, layer):
        """Records the guess (predictions[layer]: expert ids [T, k]); the oracle of the runtime's prediction recall."""
        self.predictions[layer] = route_top_k(self.rmsnorm(x, norm) @ self.w(router).T, top_k, False)[0]


def gelu_tanh(x):
    """transformers' gelu_pytorch_tanh: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x * x * x)))


def route_top_k(logits: np.ndarray, top_k: int, normalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """(expert ids [T, k], weights [T, k]): softmax over the experts, the k most probable (ties: the lower id),
    renormalized to sum 1 when `normalize`."""
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    top = np.argsort(-p, axis=-1, kind="stable")[:, :top_k]
    wts = np.take_along_axis(p, top, axis=-1)
    return top, (wts / wts.sum(-1, keepdims=True) if normalize else wts)


class NumpyModel:
    """Runs a ModelSpec's forward pass with NumpyGraph: logits of a token sequence, greedy generation."""

    def __init__(self, spec: ModelSpec, weight: Callable[[str], np.ndarray], dtype=np.float64):
        self.spec, self._weight, self.dtype = spec, weight, dtype
        self.fwd = family(spec)
        self.reset()

    def reset(self):
        self.g = NumpyGraph(self.spec, self._weight, self.dtype)

    def forward(self, ids) -> np.ndarray:
        """Append ids to the context; logits [len(ids), vocab]."""
        x = self.fwd.body(self.g, list(ids))
        logits = self.fwd.head(self.g, x)
        self.g.pos += len(ids)
        return logits

    def logits(self, ids) -> np.ndarray:
        self.reset()
        return self.forward(ids)

    def greedy(self, ids, n: int) -> list[int]:
        self.reset()
        out, last = [], self.forward(ids)[-1]
        for _ in range(n):
            t = int(np.argmax(last))
            out.append(t)
            last = self.forward([t])[-1]
        return out
