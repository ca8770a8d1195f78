"""q8: symmetric int8 per output row (f32 scale per row), int8 activations per 32-k block, integer dot products.

Parts: qweight u8[N, K] (codes q + 128, quant/packing.py panels: 1 code per byte, k = 4c + b), scales f32[N]
in natural row order. 8 + 32/K bits per weight. K must be a multiple of the activation block QA = 32.
Kernels: linear_q8, embed_q8 (compiler/ops/linear_block.py, compiler/ops/elementwise.py)."""
from __future__ import annotations

import numpy as np

from .packing import QA, _bias, _block_sums, pack_codes, quantize_act_blocks, unpack_codes
from .scheme import KernelTraits, Scheme, register


def quantize_q8(w: np.ndarray) -> dict[str, np.ndarray]:
    """Symmetric int8 per output row: d = max|w_row| / 127, q = rint(w / d) in -127..127."""
    w = np.asarray(w, np.float32)
    d = (np.abs(w).max(axis=1) / np.float32(127)).astype(np.float32)
    dz = np.where(d > 0, d, np.float32(1))
    q = np.clip(np.rint(w / dz[:, None]), -127, 127).astype(np.int16)
    return {"qweight": pack_codes((q + 128).astype(np.uint8), "q8"), "scales": d}


def dequantize_q8(parts) -> np.ndarray:
    q = unpack_codes(parts["qweight"], "q8").astype(np.float32) - 128
    return q * np.asarray(parts["scales"], np.float32)[:, None]


def linear_q8_ref(x, qweight, scales, bias=None) -> np.ndarray:
    xq, dx = quantize_act_blocks(x)
    q = unpack_codes(qweight, "q8").astype(np.int32) - 128
    acc = (_block_sums(xq, q, QA) * dx.astype(np.float64)[:, None, :]).sum(axis=2)
    return _bias(acc * np.asarray(scales, np.float64)[None, :], bias)


class Q8Scheme(Scheme):
    name = "q8"
    bits_per_weight = 8 + 32 / 4096
    description = ("int8 per output row (symmetric, f32 scale per row), int8 activations per 32-k block, "
                   "integer dot products")
    parts = ("qweight", "scales")
    k_multiple, k_multiple_why = QA, "the int8 activation block of 32"
    default_head = "q8g32"
    stacking = {"qweight": 4, "scales": "rows"}
    linear_ref = staticmethod(linear_q8_ref)
    kernel_ops = {"linear_q8": KernelTraits("linear", "block", "q8", "row", "block", k_multiple=QA),
                  "embed_q8": KernelTraits("embed", "block", "q8", "row", k_multiple=4)}   # D: whole chunks

    def _quantize(self, w):
        return quantize_q8(w)

    def dequantize(self, parts):
        return dequantize_q8(parts)

    def linear_kernel(self, T, N, K, bias, segs=()):
        return "linear_q8", self._params(T, N, K, bias, segs)

    def embed_kernel(self, T, V, D):
        return "embed_q8", {"T": int(T), "V": int(V), "D": int(D)}


Q8 = register(Q8Scheme())
