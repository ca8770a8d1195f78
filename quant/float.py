"""Float schemes f32 and f16: the weights stored as they are (f16 rounded), f32 math.

Kernels: linear (wdtype float32 / float16; f16 widened to f32 in registers, compiler/ops/linear.py) and embed.
Any 2-D shape; they may store the body and the head, and a float body keeps its own float head by default."""
from __future__ import annotations

import numpy as np

from .packing import _bias
from .scheme import Scheme, register


def linear_float_ref(x, w, bias=None) -> np.ndarray:
    """x @ w.T in float64 (the f16 weights exactly as stored)."""
    return _bias(np.asarray(x).astype(np.float64) @ np.asarray(w).astype(np.float64).T, bias)


class FloatScheme(Scheme):
    parts = ("w",)
    float_math = True
    stacking = {"w": "rows"}
    linear_ref = staticmethod(linear_float_ref)

    def __init__(self, name: str, dtype: str, bits_per_weight: float, description: str):
        self.name, self.dtype, self.bits_per_weight, self.description = name, dtype, bits_per_weight, description

    @property
    def embedding(self) -> str:
        return self.dtype

    def _quantize(self, w):
        return {"w": np.ascontiguousarray(w, dtype=self.dtype)}

    def dequantize(self, parts):
        return np.asarray(parts["w"]).astype(np.float32)

    def linear_kernel(self, T, N, K, bias, segs=()):
        return "linear", {**self._params(T, N, K, bias, segs), "wdtype": self.dtype}

    def embed_kernel(self, T, V, D):
        return "embed", {"T": int(T), "V": int(V), "D": int(D), "wdtype": self.dtype}


F32 = register(FloatScheme("f32", "float32", 32, "float32 weights (exact)"))
F16 = register(FloatScheme("f16", "float16", 16, "float16 weights, f32 math"))
