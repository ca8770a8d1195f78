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


class NpuInt4Offset:
    """The NPU graphs' int4 blocks with a float offset each (float16.int4_offset) as a scheme quant/calibration's
    gptq_model drives. GPTQ keeps each block's step and offset as fitted on the original weights (static groups)
    and rounds w - offset onto the int4 grid (-8..7) column by column, spreading each column's error over the
    columns not yet quantized. Parts: {"q" int8 [out, in], "scales", "offsets" f32 [out, in/BLOCK]}."""

    name = "npu-int4-offset"
    gptq = True

    def __init__(self, group: int):
        self.group = group

    def check_shape(self, name: str, shape) -> None:
        if len(shape) == 2 and shape[1] % self.group:
            from ...errors import CompileError

            raise CompileError(f"{name}: {shape[1]} inputs are not a multiple of the NPU weight block {self.group}")

    def _fit(self, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        from .float16 import int4_offset

        q, d, o = int4_offset(np.ascontiguousarray(np.asarray(w, np.float32).T))
        return np.ascontiguousarray(q.T), np.ascontiguousarray(d.T), np.ascontiguousarray(o.T)

    def quantize(self, w: np.ndarray) -> dict:
        """Round to nearest on the fitted grid (the rows GPTQ has no calibration input for)."""
        q, d, o = self._fit(w)
        return {"q": q, "scales": d, "offsets": o}

    def gptq_quantize(self, w: np.ndarray, hessian, block: int) -> dict:
        from ...quant.gptq import gptq_quantize

        _, d, o = self._fit(w)
        q, _ = gptq_quantize(np.asarray(w, np.float32) - np.repeat(o, self.group, axis=1), hessian, self.group,
                             block=block, scales=d)
        return {"q": q, "scales": d, "offsets": o}

    def dequantize(self, parts: dict) -> np.ndarray:
        q, s, o = parts["q"], parts["scales"], parts["offsets"]
        n, k = q.shape
        g = k // s.shape[1]
        return (q.astype(np.float32).reshape(n, k // g, g) * s[..., None] + o[..., None]).reshape(n, k)
