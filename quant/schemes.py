"""Quantization scheme registry. A scheme turns a float weight matrix into the arrays its kernels read, and back
(numpy dequantize = the oracle's view of the weights). Only matrices (linear, embedding) are quantized; norms,
biases and RoPE tables stay f32."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import CompileError


@dataclass(frozen=True)
class Scheme:
    name: str
    bits_per_weight: float
    storage_dtype: str            # numpy/TVM dtype of the stored matrix
    description: str

    def quantize(self, w: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(w, dtype=self.storage_dtype)

    def dequantize(self, q: np.ndarray) -> np.ndarray:
        return q.astype(np.float32)


SCHEMES: dict[str, Scheme] = {
    "f32": Scheme("f32", 32, "float32", "float32 weights (exact)"),
    "f16": Scheme("f16", 16, "float16", "float16 weights, f32 math"),
}


def get_scheme(name: str) -> Scheme:
    if name not in SCHEMES:
        raise CompileError(f"unknown quantization scheme '{name}': choose one of {', '.join(SCHEMES)}")
    return SCHEMES[name]
