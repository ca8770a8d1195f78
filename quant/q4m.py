"""q4m32: int4 per group of 32 along K with an f16 scale and an f16 minimum per group: w = d * q + m, q in 0..15
(llama.cpp's Q4_1 grid), int8 activations per 32-k block, integer dot products. 5 bits per weight.

Why a minimum: llama.cpp's Q4_1 and its K-quant Q4_K (the bulk of every Q4_K_M file) are asymmetric: each group of
32 has a scale and an offset. Their values do not lie on q4g32's symmetric grid, and requantizing them there adds a
second 4-bit rounding (measured: +24% perplexity on SmolLM2's Q4_1 file, +50% on Gemma 3's Q4_K_M). This scheme
holds them: a Q4_1 block exactly (the same codes, f16 scale and f16 minimum; a Q4_0 block too, minimum -8 d), a
Q4_K sub-block with its scale
d * sc and minimum -dmin * m (6-bit factors of the super-block's f16 d, dmin) each rounded once to f16, a relative
error <= 2^-11 of the scale (`from_blocks`; models/gguf/blocks.py reads the files' blocks).

Kernel math: with xq, dx the int8 activations of a 32-k block, sum_k w[k] x[k] = dx * (d * sum(q xq) + m * sum(xq));
sum(xq) is the block sum the activation pass already makes (the other block schemes subtract their code offset
with it). Parts: qweight u8[N, K/2] (codes q in q4's panels, no offset: layout "q4u"), scales and mins f16[N, K/32]
panel-interleaved (packing.pack_group_scales). Kernels: linear_q4m, the block family with `minimum` set. A body
scheme (the head keeps q8)."""
from __future__ import annotations

import numpy as np

from .packing import (QA, _bias, _block_sums, pack_codes, pack_group_scales, quantize_act_blocks, unpack_codes,
                      unpack_group_scales)
from .scheme import KernelTraits, Scheme, register

G = 32
LAYOUT = "q4u"   # q4's byte layout, unsigned codes (quant/packing.LAYOUTS)


def quantize_q4m(w: np.ndarray) -> dict[str, np.ndarray]:
    """Per group of 32 (llama.cpp's Q4_1 rule, rounded against the stored f16 values): m = f16(min w),
    d = f16((max w - m) / 15), q = clip(rint((w - m) / d), 0, 15)."""
    w = np.asarray(w, np.float32)
    N, K = w.shape
    wg = w.reshape(N, K // G, G)
    m16 = wg.min(-1).astype(np.float16)
    m = m16.astype(np.float32)[..., None]
    d16 = ((wg.max(-1) - m[..., 0]) / np.float32(15)).astype(np.float16)
    d = d16.astype(np.float32)[..., None]
    q = np.where(d > 0, np.clip(np.rint((wg - m) / np.where(d > 0, d, np.float32(1))), 0, 15), 0)
    return pack_q4m(q.reshape(N, K).astype(np.uint8), d16, m16)


def pack_q4m(q: np.ndarray, scales: np.ndarray, mins: np.ndarray) -> dict[str, np.ndarray]:
    """Codes q (0..15, [N, K]), scales and minimums [N, K/32] (rounded to f16 here) -> the q4m32 parts."""
    q = np.asarray(q)
    N, K = q.shape
    s16, m16 = np.asarray(scales).astype(np.float16), np.asarray(mins).astype(np.float16)
    if K % G or s16.shape != (N, K // G) or m16.shape != (N, K // G):
        raise ValueError(f"q4m32: codes {q.shape}, scales {s16.shape} and mins {m16.shape} do not match")
    return {"qweight": pack_codes(q.astype(np.uint8), LAYOUT), "scales": pack_group_scales(s16),
            "mins": pack_group_scales(m16)}


def unpack_q4m(parts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """parts -> (codes u8 [N, K], scales f32 [N, K/32], mins f32 [N, K/32]), row-major."""
    return (unpack_codes(parts["qweight"], LAYOUT),
            unpack_group_scales(np.asarray(parts["scales"])).astype(np.float32),
            unpack_group_scales(np.asarray(parts["mins"])).astype(np.float32))


def dequantize_q4m(parts) -> np.ndarray:
    q, d, m = unpack_q4m(parts)
    N, K = q.shape
    return (q.reshape(N, K // G, G).astype(np.float32) * d[..., None] + m[..., None]).reshape(N, K)


def linear_q4m_ref(x, qweight, scales, mins, bias=None) -> np.ndarray:
    xq, dx = quantize_act_blocks(x)
    q = unpack_codes(qweight, LAYOUT).astype(np.int32)
    d = unpack_group_scales(np.asarray(scales)).astype(np.float64)     # [N, K/32]
    m = unpack_group_scales(np.asarray(mins)).astype(np.float64)
    xsum = xq.reshape(xq.shape[0], -1, QA).sum(axis=2).astype(np.float64)             # [T, K/32]
    blocks = _block_sums(xq, q, QA) * d[None] + xsum[:, None, :] * m[None]             # [T, N, K/32]
    return _bias((blocks * dx.astype(np.float64)[:, None, :]).sum(axis=2), bias)


class _Slicer:
    """Sub-matrices of stored q4m32 parts with their own codes, scales and minimums (bundles cut at multiples of
    32 columns): requantizing would not give a Q4_K sub-block back, whose codes need not span 0..15."""

    def __init__(self, parts):
        self.q, self.d, self.m = unpack_q4m(parts)

    def parts(self, rows=slice(None), cols=slice(None)) -> dict:
        q = np.ascontiguousarray(self.q[rows, cols])
        gcols = np.arange(self.q.shape[1])[cols][::G] // G
        return pack_q4m(q, self.d[rows][:, gcols], self.m[rows][:, gcols])


class Q4MScheme(Scheme):
    name = "q4m32"
    bits_per_weight = 4 + 32 / G
    description = ("int4 per group of 32 along K with an f16 scale and an f16 minimum per group (llama.cpp's Q4_1 "
                   "grid; holds Q4_1 and Q4_K blocks), int8 activations per 32-k block, integer dot products")
    parts = ("qweight", "scales", "mins")
    group = G
    k_multiple, k_multiple_why = G, f"the group size {G}"
    head = False              # the head keeps q8g32 (its default): an embedding gather of this layout is not built
    default_head = "q8g32"
    stacking = {"qweight": 4, "scales": 1, "mins": 1}
    linear_ref = staticmethod(linear_q4m_ref)
    kernel_ops = {"linear_q4m": KernelTraits("linear", "block", LAYOUT, "group", "block", k_multiple=QA, group=G,
                                             minimum=True)}

    def _quantize(self, w):
        return quantize_q4m(w)

    def dequantize(self, parts):
        return dequantize_q4m(parts)

    def from_blocks(self, blocks) -> dict[str, np.ndarray] | None:
        """The parts holding a file's 4-bit blocks (models/gguf/blocks.py AffineBlocks: codes 0..15, f32 scale and
        minimum per group of 32: Q4_1, Q4_K, Q4_0), or None if they are not such blocks."""
        if blocks is None or blocks.bits != 4 or blocks.group != G:
            return None
        return pack_q4m(blocks.codes, blocks.scales, blocks.mins)

    def cutter(self, parts):
        return _Slicer(parts)

    def linear_kernel(self, T, N, K, bias, segs=()):
        return "linear_q4m", self._params(T, N, K, bias, segs)


Q4M32 = register(Q4MScheme())
