"""The numpy oracle of a quantized package: the reference backend (models/numpy_backend.py) with every matrix
stored in its scheme and every linear computed by the scheme's exact kernel model (dequantized weights, int8
activation quantization included). Compiled packages are tested against it."""
from __future__ import annotations

import numpy as np

from ..models.numpy_backend import NumpyGraph, NumpyModel
from .kv_cache import KV_ROUND
from .scheme import Scheme


class QuantizedGraph(NumpyGraph):
    def __init__(self, spec, weight, scheme: Scheme, head_scheme: Scheme, parts: dict, dtype=np.float32,
                 matrix_schemes=None):
        super().__init__(spec, weight, dtype)
        self.scheme, self.head_scheme, self._parts = scheme, head_scheme, parts
        self.matrix_schemes = matrix_schemes or {}

    def _stored(self, name: str, scheme: Scheme) -> dict:
        key = (name, scheme.name)
        if key not in self._parts:
            self._parts[key] = scheme.quantize(np.asarray(self._weight(name), np.float32))
        return self._parts[key]

    def embed(self, ids, w):
        self._T = len(ids)
        key = (w, "dequantized:" + self.head_scheme.name)
        if key not in self._parts:
            self._parts[key] = self.head_scheme.dequantize(self._stored(w, self.head_scheme)).astype(self.dtype)
        rows = self._parts[key][np.asarray(ids)]
        return rows * self.dtype(self.spec.embed_scale) if self.spec.embed_scale != 1.0 else rows

    def linear(self, x, w, b=None):
        head = w in (self.spec.lm_head_name, "lm_head.weight")
        scheme = self.head_scheme if head else self.matrix_schemes.get(w, self.scheme)
        y = scheme.reference_linear(np.asarray(x, np.float32), self._stored(w, scheme),
                                    None if b is None else self.w(b))
        return y.astype(self.dtype)


class QuantizedModel(NumpyModel):
    """NumpyModel whose graph stores matrices in `scheme` (the lm_head and embedding in `head_scheme`); parts:
    matrices stored ahead, {(name, scheme name): parts} (a file's own blocks), the others quantized from `weight`;
    matrix_schemes: body matrices stored in another scheme than `scheme` (name -> Scheme)."""

    def __init__(self, spec, weight, scheme: Scheme, head_scheme: Scheme, dtype=np.float32, parts=None,
                 matrix_schemes=None, kv_cache: str = "f32", key_mean=None):
        self.scheme, self.head_scheme, self._parts = scheme, head_scheme, dict(parts or {})
        self.matrix_schemes = dict(matrix_schemes or {})
        self.kv_cache = kv_cache   # the package's --kv-cache: K/V rows are rounded as its cache stores them
        self.key_mean = key_mean   # layer -> the mean its K cache takes off the keys (quant/key_mean.py), or None
        super().__init__(spec, weight, dtype)

    def reset(self):
        self.g = QuantizedGraph(self.spec, self._weight, self.scheme, self.head_scheme, self._parts, self.dtype,
                                self.matrix_schemes)
        if self.kv_cache != "f32":   # "K,V": keys and values each rounded as their own cache stores them
            k, _, v = self.kv_cache.partition(",")
            self.g.kv_round = KV_ROUND[k], KV_ROUND[v or k]
        self.g.key_mean = self.key_mean
