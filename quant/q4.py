"""q4gG (G = 32, 64, 128): symmetric int4 per group of G along K (llama.cpp Q4_0 rule, f16 scale per group),
int8 activations per 32-k block, integer dot products.

Parts: qweight u8[N, K/2] (codes q + 8, quant/packing.py panels: low nibble k = 8c + b, high nibble k = 8c + 4 + b),
scales f16[N, K/G] panel-interleaved (packing.pack_group_scales). 4 + 16/G bits per weight. K must be a multiple
of G. GPTQ (quant/gptq.py) produces the same parts (q4_scales, q4_codes, pack_q4 are shared with it).
Kernels: linear_q4, embed_q4 (with G)."""
from __future__ import annotations

import numpy as np

from .packing import (QA, _bias, _block_sums, pack_codes, pack_group_scales, quantize_act_blocks, unpack_codes,
                      unpack_group_scales)
from .scheme import KernelTraits, Scheme, register

GROUPS = (32, 64, 128)   # the group sizes the kernels take (param G)


def quantize_q4(w: np.ndarray, G: int) -> dict[str, np.ndarray]:
    """Symmetric int4 per group of G along K (llama.cpp Q4_0 rule): m = the element of largest |w| in the
    group (with its sign), d = f16(m / -8), q = clip(rint(w / d), -8, 7); m itself maps to -8 exactly."""
    w = np.asarray(w, np.float32)
    N, K = w.shape
    wg = w.reshape(N, K // G, G)
    d16 = q4_scales(wg)
    q = q4_codes(wg, d16.astype(np.float32)[..., None]).reshape(N, K)
    return pack_q4(q, d16)


def q4_scales(wg: np.ndarray) -> np.ndarray:
    """The q4 scale rule on groups along the last axis (f32 [..., G]) -> f16 [...]: d = f16(m / -8), m the
    element of largest |w| (with its sign). Shared by RTN (quantize_q4) and GPTQ (quant/gptq.py)."""
    wg = np.asarray(wg, np.float32)
    idx = np.abs(wg).argmax(axis=-1)
    m = np.take_along_axis(wg, idx[..., None], axis=-1)[..., 0]
    return (m / np.float32(-8)).astype(np.float16)


def q4_codes(w: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Round-to-nearest int4 codes of w f32 against scales d f32 (broadcast to w; already f16 values):
    clip(rint(w / d), -8, 7) in f32 arithmetic, 0 where d == 0 -> int8 in -8..7."""
    w, d = np.asarray(w, np.float32), np.asarray(d, np.float32)
    q = np.clip(np.rint(w / np.where(d != 0, d, np.float32(1))), -8, 7)
    return np.where(d != 0, q, 0).astype(np.int8)


def pack_q4(q: np.ndarray, scales: np.ndarray) -> dict[str, np.ndarray]:
    """int4 codes q (-8..7, [N, K]) and group scales [N, K/G] (rounded to f16 here: pass f16-exact values so
    that the codes were computed against the stored scale) -> the q4 parts {"qweight", "scales"}."""
    q = np.asarray(q)
    if q.min(initial=0) < -8 or q.max(initial=0) > 7:
        raise ValueError("q4: codes out of -8..7")
    s16 = np.asarray(scales).astype(np.float16)
    if q.ndim != 2 or s16.ndim != 2 or s16.shape[0] != q.shape[0] or q.shape[1] % s16.shape[1]:
        raise ValueError(f"q4: codes {q.shape} and scales {s16.shape} do not match")
    return {"qweight": pack_codes((q.astype(np.int16) + 8).astype(np.uint8), "q4"), "scales": pack_group_scales(s16)}


def dequantize_q4(parts) -> np.ndarray:
    q = unpack_codes(parts["qweight"], "q4").astype(np.float32) - 8
    d = unpack_group_scales(np.asarray(parts["scales"])).astype(np.float32)
    N, K = q.shape
    G = K // d.shape[1]
    return (q.reshape(N, K // G, G) * d[..., None]).reshape(N, K)


def linear_q4_ref(x, qweight, scales, bias=None) -> np.ndarray:
    xq, dx = quantize_act_blocks(x)
    q = unpack_codes(qweight, "q4").astype(np.int32) - 8
    d = unpack_group_scales(np.asarray(scales)).astype(np.float64)     # [N, K/G]
    G = q.shape[1] // d.shape[1]
    d_blk = np.repeat(d, G // QA, axis=1)                                  # [N, K/QA]
    return _bias((_block_sums(xq, q, QA) * dx.astype(np.float64)[:, None, :] * d_blk[None]).sum(axis=2), bias)


class Q4Scheme(Scheme):
    parts = ("qweight", "scales")
    default_head = "q8g32"
    gptq = True
    stacking = {"qweight": 4, "scales": 1}
    linear_ref = staticmethod(linear_q4_ref)
    kernel_ops = {"linear_q4": KernelTraits("linear", "block", "q4", "group", "block", k_multiple=QA, groups=GROUPS),
                  "embed_q4": KernelTraits("embed", "block", "q4", "group", groups=GROUPS)}

    def __init__(self, group: int):
        self.group = int(group)
        self.name = f"q4g{group}"
        self.bits_per_weight = 4 + 16 / group
        self.description = (f"int4 per group of {group} along K (symmetric, f16 scale per group), "
                            "int8 activations per 32-k block, integer dot products")
        self.k_multiple, self.k_multiple_why = self.group, f"the group size {group}"

    def _quantize(self, w):
        return quantize_q4(w, self.group)

    def dequantize(self, parts):
        return dequantize_q4(parts)

    def linear_kernel(self, T, N, K, bias, segs=()):
        return "linear_q4", {**self._params(T, N, K, bias, segs), "G": self.group}

    def embed_kernel(self, T, V, D):
        return "embed_q4", {"T": int(T), "V": int(V), "D": int(D), "G": self.group}


Q4G32 = register(Q4Scheme(32))
Q4G64 = register(Q4Scheme(64))
Q4G128 = register(Q4Scheme(128))
