"""q8g32: llama.cpp's Q8_0 grid: symmetric int8 per group of 32 along K with an f16 scale per group, int8
activations per 32-k block, integer dot products. A Q8_0 GGUF's blocks land here exactly (the same codes and the
same f16 scales: requantizing a dequantized Q8_0 block reproduces it, its largest element being +-127 d), so
`--quant auto` keeps them bit for bit. 8.5 bits per weight; tighter than q8's per-row scale on rows with outliers.

Parts: qweight u8[N, K] (codes q + 128 in q8's panels), scales f16[N, K/32] panel-interleaved like q4's
(packing.pack_group_scales). Kernels: linear_q8g32, the block family's q8 layout with group scales; embed_q8g32, the
row gather of such a table (so a Q8_0 embedding / lm_head is kept too)."""
from __future__ import annotations

import numpy as np

from .packing import (QA, _bias, _block_sums, pack_codes, pack_group_scales, quantize_act_blocks, unpack_codes,
                      unpack_group_scales)
from .scheme import KernelTraits, Scheme, register

G = 32


def quantize_q8g32(w: np.ndarray) -> dict[str, np.ndarray]:
    """llama.cpp's quantize_row_q8_0 rule per group of 32: d = f16(max|w| / 127), q = rint(w / d) in -127..127."""
    w = np.asarray(w, np.float32)
    N, K = w.shape
    wg = w.reshape(N, K // G, G)
    d = (np.abs(wg).max(-1) / np.float32(127)).astype(np.float16)
    df = d.astype(np.float32)
    q = np.clip(np.rint(wg / np.where(df > 0, df, np.float32(1))[..., None]), -127, 127)
    q = np.where(df[..., None] > 0, q, 0).reshape(N, K).astype(np.int16)
    return {"qweight": pack_codes((q + 128).astype(np.uint8), "q8"), "scales": pack_group_scales(d)}


def dequantize_q8g32(parts) -> np.ndarray:
    q = unpack_codes(parts["qweight"], "q8").astype(np.float32) - 128
    d = unpack_group_scales(np.asarray(parts["scales"])).astype(np.float32)
    N, K = q.shape
    return (q.reshape(N, K // G, G) * d[..., None]).reshape(N, K)


def linear_q8g32_ref(x, qweight, scales, bias=None) -> np.ndarray:
    xq, dx = quantize_act_blocks(x)
    q = unpack_codes(qweight, "q8").astype(np.int32) - 128
    d = unpack_group_scales(np.asarray(scales)).astype(np.float64)      # [N, K/32]: one per activation block
    return _bias((_block_sums(xq, q, QA) * dx.astype(np.float64)[:, None, :] * d[None]).sum(axis=2), bias)


class Q8G32Scheme(Scheme):
    name = "q8g32"
    bits_per_weight = 8 + 16 / G
    description = "int8 per group of 32 along K (llama.cpp Q8_0: f16 scale per group), int8 activations per 32-k block"
    parts = ("qweight", "scales")
    k_multiple, k_multiple_why = G, "the group size 32"
    head = True   # a Q8_0 GGUF's embedding / lm_head kept too (embed_q8g32: q8's codes with group scales)
    default_head = "q8g32"
    stacking = {"qweight": 4, "scales": 1}
    linear_ref = staticmethod(linear_q8g32_ref)
    kernel_ops = {"linear_q8g32": KernelTraits("linear", "block", "q8", "group", "block", k_multiple=QA, groups=(G,)),
                  "embed_q8g32": KernelTraits("embed", "block", "q8", "group", groups=(G,))}

    def _quantize(self, w):
        return quantize_q8g32(w)

    def dequantize(self, parts):
        return dequantize_q8g32(parts)

    def linear_kernel(self, T, N, K, bias, segs=()):
        return "linear_q8g32", {**self._params(T, N, K, bias, segs), "G": G}

    def embed_kernel(self, T, V, D):
        return "embed_q8g32", {"T": int(T), "V": int(V), "D": int(D), "G": G}


Q8G32 = register(Q8G32Scheme())
