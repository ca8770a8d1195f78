"""The mean key a q4 K cache takes off every key before rounding it (compile time; the kv_q4 kernel's `mean`).

Keys sit off zero: per head, a few channels hold a large mean against their spread across tokens (models with a
bias on k, and every real checkpoint we measured). A 4-bit block then spends its levels on that offset. Attention
reads keys only through q . k, and softmax over the keys a query sees ignores a constant added to all of its
scores: q . (k - mu) = q . k - q . mu, the same for every key of that query. So a fixed mu per layer and KV head can
be taken off each key as it is written, and nothing on the reading side changes; rows keep their meaning when they
move (window caches, speculation's compaction) or are saved.

mu is measured on calibration text: each key with its RoPE rotation undone (the un-rotated key's mean is what does
not depend on position), averaged over the tokens (each sequence's first token left out: the attention sink carries
massive activations unlike any other token), then rotated back as the average over the positions 0..max_ctx-1 a key
can take (a channel pair's mean survives where its frequency is low enough that it turns little over the context,
and averages out where it turns fast). SmolLM2-135M, q4 keys (torch simulation, 512-token windows): +3.6%
perplexity with the mean, +5.1% without; with the q4 block's own minimum (kv_quant.py) +1.6% against +2.5%."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..models import family
from ..models.numpy_backend import NumpyGraph
from ..models.rope import apply_rope, inv_freq
from ..models.spec import ModelSpec


def applies(spec: ModelSpec) -> bool:
    """Whether softmax ignores the shift: not where scores are soft-capped first (Gemma 2: cap * tanh(s / cap) of
    a shifted score is no shifted capped score)."""
    return not spec.attn_softcap


def key_mean_name(layer: int) -> str:
    """The package weight holding layer's mu, f32[n_kv_heads * head_dim]."""
    return f"layers.{layer}.kv_key_mean"


def _unit_rotation(spec: ModelSpec, layer: int, positions: np.ndarray, n_ctx: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [len(positions), head_dim/2] of the layer's RoPE angles (no attention factor: it scales q and k
    alike); identity for a layer without RoPE."""
    if not spec.uses_rope(layer):
        z = np.zeros((len(positions), spec.head_dim // 2))
        return z + 1, z
    ang = np.asarray(positions, np.float64)[:, None] * inv_freq(spec, spec.rope_table(layer), n_ctx)[None, :]
    return np.cos(ang), np.sin(ang)


class _KeyTap(NumpyGraph):
    """The float graph, summing each layer's un-rotated keys past the sequence's first token."""

    sums: dict[int, np.ndarray]
    count: dict[int, int]
    n_ctx: int

    def w(self, name: str) -> np.ndarray:
        return np.asarray(self._weight(name), self.dtype)   # not kept: one matrix at a time in memory

    def kv_store(self, layer, k, v):
        super().kv_store(layer, k, v)
        T, s = k.shape[0], self.spec
        pos = self.pos + np.arange(T)
        keep = pos >= 1
        c, sn = _unit_rotation(s, layer, pos[keep], self.n_ctx)
        pre = apply_rope(np.asarray(k, np.float64).reshape(T, s.n_kv_heads, s.head_dim)[keep], c, -sn)
        self.sums[layer] = self.sums.get(layer, 0) + pre.sum(0)
        self.count[layer] = self.count.get(layer, 0) + int(keep.sum())


def key_means(spec: ModelSpec, weight: Callable[[str], np.ndarray], seqs: Sequence[Sequence[int]], max_ctx: int,
              progress: Callable[[int, int], None] | None = None) -> dict[str, np.ndarray]:
    """{key_mean_name(layer): mu f32[n_kv_heads * head_dim]} of every layer, from the float model over seqs."""
    fwd = family(spec)
    sums: dict[int, np.ndarray] = {}
    count: dict[int, int] = {}
    for i, ids in enumerate(seqs):
        g = _KeyTap(spec, weight, np.float32)
        g.sums, g.count, g.n_ctx = sums, count, max_ctx
        fwd.body(g, list(ids))   # the layers only: no head
        if progress:
            progress(i + 1, len(seqs))
    positions = np.arange(max_ctx)
    out = {}
    for layer in range(spec.n_layers):
        pre = sums[layer] / max(count.get(layer, 0), 1)                     # [H, D]
        c, s = _unit_rotation(spec, layer, positions, max_ctx)
        mu = apply_rope(pre[None], c.mean(0, keepdims=True), s.mean(0, keepdims=True))[0]
        out[key_mean_name(layer)] = np.ascontiguousarray(mu.reshape(-1), np.float32)
    return out


CALIB_TOKENS, CALIB_SEQ = 512, 256   # two windows of the calibration text: the mean of a few hundred keys is stable


def calibrated_key_means(spec: ModelSpec, weight: Callable[[str], np.ndarray], tokenizer_json, max_ctx: int,
                         calib=None, progress: Callable[[int, int], None] | None = None) -> dict[str, np.ndarray]:
    """key_means over the calibration text (quant/calibration.py: --calib FILE, else the built-in sample); a
    checkpoint without a tokenizer.json takes fixed pseudo-random ids."""
    from pathlib import Path

    from .calibration import calibration_ids

    if tokenizer_json is not None and Path(tokenizer_json).is_file():
        seqs = calibration_ids(tokenizer_json, calib, n_tokens=CALIB_TOKENS, seq_len=CALIB_SEQ)
    else:
        rng = np.random.default_rng(0)
        seqs = [rng.integers(0, spec.vocab_size, CALIB_SEQ).tolist() for _ in range(CALIB_TOKENS // CALIB_SEQ)]
    return key_means(spec, weight, seqs, max_ctx, progress)
