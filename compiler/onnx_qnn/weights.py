"""The NPU graphs' int8 weights: symmetric, one scale per output channel (group None) or per block of `group`
inputs, rounded to nearest or by GPTQ (quant/gptq.py with the int8 grid) on the calibration text, so that the
error of 200+ matrices does not pile up along a deep model's residual stream.

Parts: {"q": int8 codes [out, in] in -127..127, "scales": f32 [out, in/group]} (checkpoint layout, W = q * s)."""
from __future__ import annotations

import numpy as np

from ...quant.gptq import INT8_GRID


class NpuInt8:
    """The scheme object quant/calibration.gptq_model drives (name, gptq, group, quantize, dequantize, check_shape,
    and the grid and packing it rounds onto)."""

    name = "npu-int8"
    gptq = True
    gptq_grid = INT8_GRID

    def __init__(self, group: int | None = None):
        self.group = group

    def _g(self, k: int) -> int:
        return self.group or k

    def check_shape(self, name: str, shape) -> None:
        if len(shape) == 2 and shape[1] % self._g(shape[1]):
            from ...errors import CompileError

            raise CompileError(f"{name}: {shape[1]} inputs are not a multiple of the NPU weight block {self.group}")

    @staticmethod
    def gptq_pack(q: np.ndarray, s: np.ndarray) -> dict:
        return {"q": np.asarray(q, np.int8), "scales": np.asarray(s, np.float32)}

    def quantize(self, w: np.ndarray) -> dict:
        """Round to nearest (the rows GPTQ has no calibration input for)."""
        w = np.asarray(w, np.float32)
        n, k = w.shape
        g = self._g(k)
        d = INT8_GRID.scales(w.reshape(n, k // g, g))
        return self.gptq_pack(INT8_GRID.codes(w, np.repeat(d, g, axis=1)), d)

    @staticmethod
    def dequantize(parts: dict) -> np.ndarray:
        q, s = parts["q"], parts["scales"]
        n, k = q.shape
        g = k // s.shape[1]
        return (q.astype(np.float32).reshape(n, k // g, g) * s[..., None]).reshape(n, k)
