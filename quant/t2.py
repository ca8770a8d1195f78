"""t2: ternary {-1, 0, +1} weights (BitNet b1.58 absmean, ONE f32 scale per tensor), 2 bits packed, int8
activations per token.

t2 uses one absmean scale per tensor, as BitNet b1.58 trains and ships it (microsoft/bitnet-b1.58-2B-4T:
weight_scale [1]), so packed BitNet checkpoints convert losslessly (pack_t2(t, 1 / weight_scale); compiler/lower.py
_ternary_weight). Activations are int8 per token (absmax, BitNet's clamp 1e-5): y = (xq . t) * absmax/127 * scale.
A body scheme only (no embedding kernel); post-training ternarization of other models loses most of their quality
(compile_warning). Parts: qweight u8[N, K/4] (codes t + 1, quant/packing.py panels: bits 2j..2j+1 hold
k = 16c + 4j + b), scale f32[1]. K must be a multiple of the packed chunk of 16.
Kernels: linear_t2 (default) or linear_t2_lut."""
from __future__ import annotations

import numpy as np

from .packing import _bias, pack_codes, quantize_act_token, unpack_codes
from .scheme import KernelTraits, Scheme, register

# t2 kernel choice: linear_t2 (VNNI-style integer dot) beats linear_t2_lut for every shape measured on AVX-512
# VNNI and AVX2 x86 (bench/quant_ops_bench.py); the LUT kernel stays selectable via T2_OP.
T2_OP = "linear_t2"


def quantize_t2(w: np.ndarray) -> dict[str, np.ndarray]:
    """BitNet b1.58 absmean ternary, one scale per tensor: s = mean|w|, t = clip(rint(w / s), -1, 1)."""
    w = np.asarray(w, np.float32)
    s = np.float32(max(float(np.abs(w).astype(np.float64).mean()), 1e-5))
    t = np.clip(np.rint(w / s), -1, 1).astype(np.int8)
    return pack_t2(t, s)


def pack_t2(t: np.ndarray, scale: float) -> dict[str, np.ndarray]:
    """Already-ternary weights (int values -1/0/1, [N, K]) and their per-tensor scale (y = (x . t) * scale;
    for transformers' BitLinear checkpoints scale = 1 / weight_scale) -> t2 parts."""
    t = np.asarray(t)
    return {"qweight": pack_codes((t.astype(np.int16) + 1).astype(np.uint8), "t2"),
            "scale": np.array([scale], np.float32)}


def dequantize_t2(parts) -> np.ndarray:
    t = unpack_codes(parts["qweight"], "t2").astype(np.float32) - 1
    return t * np.float32(parts["scale"][0])


def linear_t2_ref(x, qweight, scale, bias=None, segs=()) -> np.ndarray:
    """segs: stacked matrices with these row counts, scale f32[nseg] (one per matrix)."""
    xq, dx = quantize_act_token(x)
    t = unpack_codes(qweight, "t2").astype(np.float64) - 1
    s = np.asarray(scale, np.float64).reshape(-1)
    rows = np.repeat(s, segs) if segs else s[0]
    y = (xq.astype(np.float64) @ t.T) * dx.astype(np.float64)[:, None] * rows
    return _bias(y, bias)


class T2Scheme(Scheme):
    name = "t2"
    bits_per_weight = 2 + 32 / 4096 ** 2
    description = ("ternary {-1,0,+1} (BitNet b1.58 absmean, one f32 scale per tensor), 2 bits packed, int8 "
                   "activations per token")
    parts = ("qweight", "scale")
    k_multiple, k_multiple_why = 16, "the packed ternary chunk of 16"
    head = False              # no embedding kernel; the head of a t2 package defaults to q8g32
    default_head = "q8g32"
    stacking = {"qweight": 4, "scale": "matrix"}   # fused: one scale per matrix, f32[nseg]
    linear_ref = staticmethod(linear_t2_ref)
    kernel_ops = {"linear_t2": KernelTraits("linear", "t2", "t2", "matrix", "token", k_multiple=16),
                  "linear_t2_lut": KernelTraits("linear", "t2_lut", "t2", "matrix", "token", k_multiple=16)}

    def compile_warning(self, spec):
        if spec.family != "bitnet":
            return ("post-training ternarization (t2) of a model not trained for it loses most of its quality; t2 is "
                    "meant for BitNet b1.58 checkpoints (quantization-aware trained)")
        return None

    def _quantize(self, w):
        return quantize_t2(w)

    def dequantize(self, parts):
        return dequantize_t2(parts)

    def linear_kernel(self, T, N, K, bias, segs=()):
        return T2_OP, self._params(T, N, K, bias, segs)

    def cutter(self, parts):
        return _TernaryCutter(parts)


class _TernaryCutter:
    """Sub-matrices of a t2 matrix keep its codes and its one scale (requantizing would change both)."""

    def __init__(self, parts):
        self.scale = float(parts["scale"][0])
        self.t = unpack_codes(parts["qweight"], "t2").astype(np.int8) - 1

    def parts(self, rows=slice(None), cols=slice(None)) -> dict:
        return pack_t2(np.ascontiguousarray(self.t[rows, cols]), self.scale)


T2 = register(T2Scheme())
