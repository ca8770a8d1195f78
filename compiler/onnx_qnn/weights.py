"""The NPU graphs' weights: the grids float16.lower packs (int8 blocks, the int4 residual plane, int4 blocks with a
float offset) and the scheme objects GPTQ rounds onto them. int8 is symmetric, one scale per output channel (group
None) or per block of `group` inputs, rounded to nearest or by GPTQ (quant/gptq.py with the int8 grid) on the
calibration text, so that the error of 200+ matrices does not pile up along a deep model's residual stream.

Parts: {"q": int8 codes [out, in] in -127..127, "scales": f32 [out, in/group]} (checkpoint layout, W = q * s)."""
from __future__ import annotations

import numpy as np

from ...quant.gptq import INT8_GRID

BLOCK = 32   # inputs per weight scale (MatMulNBits: a power of two >= 16; the HTP: 8-bit x4, 4-bit x8)


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


def int8_plane(w: np.ndarray, parts: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """w f32 [in, out] -> (codes int8 [in, out] in -127..127, scales f32 [in/BLOCK, out]): parts' codes (NpuInt8
    with group BLOCK, e.g. GPTQ's: {"q" [out, in], "scales" [out, in/BLOCK]}) or round-to-nearest per block."""
    p = parts or NpuInt8(BLOCK).quantize(np.ascontiguousarray(w.T))
    return np.ascontiguousarray(p["q"].T), np.ascontiguousarray(p["scales"].T)


def int4_plane(r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """r f32 [in, out] -> symmetric round-to-nearest int4 (-7..7) per block of BLOCK inputs: (codes, scales [in/B, out])."""
    K, N = r.shape
    rb = r.reshape(K // BLOCK, BLOCK, N)
    d = np.abs(rb).max(1) / 7
    d[d == 0] = 1.0
    q = np.clip(np.round(rb / d[:, None, :]), -7, 7).astype(np.int8).reshape(K, N)
    return q, d.astype(np.float32)


_END_TRIM = np.linspace(0.0, 0.15, 7, dtype=np.float32)   # int4_offset's candidates: the span cut off at each end


def _on_grid(wb: np.ndarray, span: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """wb [blocks, out, B] -> the blocks whose values already lie on 16 evenly spaced levels (a checkpoint that was
    itself 4-bit, e.g. a GGUF Q4_0/Q4_1/Q4_K file): (mask [blocks, out], the levels' step). Their step is the
    smallest gap between distinct values, if every gap is a whole multiple of it and the span is at most 15 of them."""
    gaps = np.diff(np.sort(wb, axis=-1), axis=-1)
    tiny = gaps <= span[..., None] * 1e-4
    step = np.where(tiny, np.inf, gaps).min(-1)
    ok = np.isfinite(step) & (step > 0)
    step = np.where(ok, step, 1)
    k = gaps / step[..., None]
    ok &= np.all(tiny | (np.abs(k - np.rint(k)) < 1e-2), axis=-1) & (span / step <= 15.01)
    return ok, step


def int4_offset(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """w f32 [in, out] -> int4 blocks of BLOCK inputs with a float offset each: (codes int8 [in, out] in -8..7,
    scales f32 [in/B, out], offsets f32 [in/B, out]), w ~ codes * scale + offset, both stored in float16 (llama.cpp's
    Q4_1 grid; the HTP takes no float zero point, so lower() adds the offsets as a small MatMul over the inputs'
    block means). A block already on a 16-level grid (a 4-bit source checkpoint) keeps it exactly; any other block
    searches its range (each end cut by up to 15% of the span, 7 x 7 candidates) and refits the step and offset by
    least squares to its codes, keeping whatever has the least squared error."""
    K, N = w.shape
    wb = np.asarray(w, np.float32).reshape(K // BLOCK, BLOCK, N).transpose(0, 2, 1)      # [blocks, out, B]
    lo0, hi0 = wb.min(2), wb.max(2)
    span = hi0 - lo0

    def fit(d, lo):   # stored (float16) step and offset, the codes against them, the error
        d = np.where(d > 0, d, 1).astype(np.float16).astype(np.float32)
        o = (lo + 8 * d).astype(np.float16).astype(np.float32)
        c = np.clip(np.rint((wb - o[..., None]) / d[..., None]), -8, 7)
        return d, o, c, np.square(c * d[..., None] + o[..., None] - wb).sum(2)

    best = None
    for a in _END_TRIM:
        for b in _END_TRIM:
            cand = fit((span * (1 - a - b)) / 15, lo0 + a * span)
            if best is None:
                best = list(cand)
                continue
            k = cand[3] < best[3]
            best = [np.where(k[..., None] if x.ndim == 3 else k, y, x) for x, y in zip(best, cand)]
    for _ in range(2):   # least squares (step, offset) for the codes found, then the codes again
        c = best[2] + 8
        n, sc, scc = BLOCK, c.sum(2), np.square(c).sum(2)
        sw, scw = wb.sum(2), (c * wb).sum(2)
        det = n * scc - sc * sc
        d = np.where(det > 0, (n * scw - sc * sw) / np.where(det > 0, det, 1), best[0])
        lo = np.where(det > 0, (sw - d * sc) / n, best[1] - 8 * best[0])
        cand = fit(d, lo)
        k = cand[3] < best[3]
        best = [np.where(k[..., None] if x.ndim == 3 else k, y, x) for x, y in zip(best, cand)]
    exact, step = _on_grid(wb, span)
    if exact.any():
        cand = fit(step, lo0)
        best = [np.where(exact[..., None] if x.ndim == 3 else exact, y, x) for x, y in zip(best, cand)]
    d, o, c, _ = best
    return (np.ascontiguousarray(c.astype(np.int8).transpose(0, 2, 1).reshape(K, N)), d, o)


def dequantize(q: np.ndarray, d: np.ndarray, o: np.ndarray | None = None) -> np.ndarray:
    """codes [in, out], scales [in/B, out] (, offsets [in/B, out]) -> f32 [in, out]."""
    K, N = q.shape
    w = q.astype(np.float32).reshape(d.shape[0], -1, N) * d[:, None, :]
    return (w if o is None else w + o[:, None, :]).reshape(K, N)


def planes_w8(w: np.ndarray, parts: dict | None, residual: bool) -> list[tuple[int, np.ndarray, np.ndarray]]:
    q, d = int8_plane(w, parts)
    out = [(8, q, d)]
    if residual:
        out.append((4, *int4_plane(w - dequantize(q, d))))
    return out
