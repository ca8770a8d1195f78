"""q6: symmetric int6 per group of 32 along K (the Q4_0 rule at 6 bits, f16 scale per group), int8 activations
per 32-k block, integer dot products: the bits of llama.cpp's Q6_K output tensor (6.5 bits per weight).

A body scheme (--quant q6: a Q5_0 GGUF's blocks are kept in it exactly, `from_blocks`; K-quant files whose types
a 4-bit scheme does not hold land here, compiler/auto_quant.py) and an embedding / lm_head scheme (--head-quant
q6). Parts: qweight u8[N, 3K/4] (per 32-k block
6 chunks: 4 of low nibbles as q4's, 2 of high bit pairs as t2's; quant/packing.py), scales f16[N, K/32]
panel-interleaved. K must be a multiple of 32. Kernels: linear_q6, embed_q6."""
from __future__ import annotations

import numpy as np

from .packing import (Q6_CHUNKS, Q6_GROUP, Q6_LAYOUT, QA, _bias, _block_sums, deinterleave_rows, interleave_rows,
                      pack_group_scales, quantize_act_blocks, unpack_group_scales)
from .scheme import KernelTraits, Scheme, register


def quantize_q6(w: np.ndarray) -> dict[str, np.ndarray]:
    """Symmetric int6 per group of 32 along K (the Q4_0 rule at 6 bits; llama.cpp's Q6_K head has the same
    6.5 bits per weight): m = the element of largest |w| in the group (with its sign), d = f16(m / -32),
    q = clip(rint(w / d), -32, 31)."""
    w = np.asarray(w, np.float32)
    N, K = w.shape
    wg = w.reshape(N, K // Q6_GROUP, Q6_GROUP)
    idx = np.abs(wg).argmax(axis=-1)
    d16 = (np.take_along_axis(wg, idx[..., None], axis=-1)[..., 0] / np.float32(-32)).astype(np.float16)
    d = d16.astype(np.float32)[..., None]
    q = np.where(d != 0, np.clip(np.rint(wg / np.where(d != 0, d, np.float32(1))), -32, 31), 0)
    return pack_q6(q.reshape(N, K).astype(np.int8), d16)


def pack_q6(q: np.ndarray, scales: np.ndarray) -> dict[str, np.ndarray]:
    """int6 codes q (-32..31, [N, K]) and group-of-32 scales [N, K/32] -> the q6 parts {"qweight", "scales"}."""
    q = np.asarray(q)
    if q.ndim != 2 or q.shape[1] % Q6_GROUP or q.min(initial=0) < -32 or q.max(initial=0) > 31:
        raise ValueError(f"q6: codes must be [N, K] in -32..31 with K % {Q6_GROUP} == 0")
    N, K = q.shape
    KB = K // Q6_GROUP
    code = (q.astype(np.int16) + 32).astype(np.uint8).reshape(N, KB, Q6_GROUP)
    lo = (code & 15).reshape(N, KB, 4, 2, 4)                      # [n, block, chunk, nibble, b]
    hi = (code >> 4).reshape(N, KB, 2, 4, 4)                      # [n, block, chunk, bit pair, b]
    lo_bytes = lo[:, :, :, 0] | (lo[:, :, :, 1] << 4)
    hi_bytes = np.bitwise_or.reduce(hi << (2 * np.arange(4, dtype=np.uint8))[None, None, None, :, None], axis=3)
    rowbytes = np.concatenate([lo_bytes, hi_bytes], axis=2).astype(np.uint8).reshape(N, K * 6 // 8)
    return {"qweight": interleave_rows(rowbytes, 4),
            "scales": pack_group_scales(np.asarray(scales).astype(np.float16).reshape(N, KB))}


def unpack_q6(qweight: np.ndarray) -> np.ndarray:
    """q6 packed uint8 [N, 3K/4] -> int codes q (-32..31) int16 [N, K]."""
    N, BPR = qweight.shape
    KB = BPR // (Q6_CHUNKS * 4)
    b = deinterleave_rows(np.asarray(qweight, np.uint8), 4).reshape(N, KB, Q6_CHUNKS, 4)
    lo = np.stack([b[:, :, :4] & 15, b[:, :, :4] >> 4], axis=3).reshape(N, KB, Q6_GROUP)
    hi = np.stack([(b[:, :, 4:] >> (2 * j)) & 3 for j in range(4)], axis=3).reshape(N, KB, Q6_GROUP)
    return ((hi.astype(np.int16) << 4) | lo).reshape(N, KB * Q6_GROUP) - 32


def dequantize_q6(parts) -> np.ndarray:
    q = unpack_q6(parts["qweight"]).astype(np.float32)
    d = unpack_group_scales(np.asarray(parts["scales"])).astype(np.float32)
    N, K = q.shape
    return (q.reshape(N, K // Q6_GROUP, Q6_GROUP) * d[..., None]).reshape(N, K)


def linear_q6_ref(x, qweight, scales, bias=None) -> np.ndarray:
    xq, dx = quantize_act_blocks(x)
    q = unpack_q6(qweight).astype(np.int32)
    d = unpack_group_scales(np.asarray(scales)).astype(np.float64)     # [N, K/32]: one scale per block
    return _bias((_block_sums(xq, q, QA) * dx.astype(np.float64)[:, None, :] * d[None]).sum(axis=2), bias)


class _Slicer:
    """Sub-matrices with their own codes and scales (bundles cut at multiples of 32 columns): requantizing does not
    always give a block back (one whose largest magnitude is positive, a Q5_0 block's +15 d)."""

    def __init__(self, parts):
        self.q = unpack_q6(parts["qweight"])
        self.d = unpack_group_scales(np.asarray(parts["scales"]))

    def parts(self, rows=slice(None), cols=slice(None)) -> dict:
        gcols = np.arange(self.q.shape[1])[cols][::Q6_GROUP] // Q6_GROUP
        return pack_q6(np.ascontiguousarray(self.q[rows, cols]), self.d[rows][:, gcols])


class Q6Scheme(Scheme):
    name = "q6"
    bits_per_weight = 6 + 16 / 32
    description = ("int6 per group of 32 along K (symmetric, f16 scale per group), int8 activations per 32-k "
                   "block, integer dot products")
    parts = ("qweight", "scales")
    group = Q6_GROUP
    k_multiple, k_multiple_why = Q6_GROUP, f"the group size {Q6_GROUP}"
    body = True
    default_head = "q8g32"
    stacking = {"qweight": 4, "scales": 1}
    linear_ref = staticmethod(linear_q6_ref)
    kernel_ops = {"linear_q6": KernelTraits("linear", "q6", Q6_LAYOUT, "group", "block", k_multiple=QA, group=Q6_GROUP),
                  "embed_q6": KernelTraits("embed", "q6", Q6_LAYOUT, "group", k_multiple=Q6_GROUP, group=Q6_GROUP)}

    def _quantize(self, w):
        return quantize_q6(w)

    def dequantize(self, parts):
        return dequantize_q6(parts)

    def from_blocks(self, blocks):
        """The parts holding a file's symmetric blocks of up to 6 bits (models/gguf/blocks.py: Q5_0, Q4_0: signed
        codes q - zero in -32..31 with the block's f16 scale, exactly), or None."""
        if blocks is None or blocks.zero is None or blocks.bits > 6 or blocks.group != Q6_GROUP:
            return None
        return pack_q6(blocks.codes.astype(np.int16) - blocks.zero, blocks.scales)

    def cutter(self, parts):
        return _Slicer(parts)

    def linear_kernel(self, T, N, K, bias, segs=()):
        return "linear_q6", self._params(T, N, K, bias, segs)

    def embed_kernel(self, T, V, D):
        return "embed_q6", {"T": int(T), "V": int(V), "D": int(D)}


Q6 = register(Q6Scheme())
