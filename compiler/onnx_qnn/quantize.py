"""Quantization of the group graphs for the Hexagon HTP (which runs no float32): static QDQ through ONNX Runtime's
QNN quantization tooling, 16-bit activations calibrated on text, per-output-channel symmetric weights.

    w8a16   int8 weights (the default: rel. error ~1% per layer)
    w4a16   int4 weights (half the bytes; RTN error is high, GPTQ-quality weights are what makes it usable)

The calibration ranges of the KV cache and of the residual stream are widened (RANGE_MARGIN): min-max over a few
chunks clips the positions and prompts calibration never saw (toolchain notes)."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx

from ...errors import CompileError

NPU_QUANTS = {"w8a16": "QUInt8", "w4a16": "QInt4"}
RANGE_MARGIN = 1.5


class _Reader:
    """onnxruntime CalibrationDataReader over recorded feeds."""

    def __init__(self, feeds: list[dict]):
        self._it = iter(feeds)

    def get_next(self):
        return next(self._it, None)


def _matmul_weights(m: onnx.ModelProto) -> list[str]:
    inits = {i.name for i in m.graph.initializer}
    return [n.input[1] for n in m.graph.node if n.op_type == "MatMul" and n.input[1] in inits]


def widened_ranges(feeds: list[dict], outputs: list[dict]) -> dict[str, tuple[float, float]]:
    """Symmetric ranges RANGE_MARGIN x the largest magnitude seen, for the residual stream and the K/V tensors."""
    out: dict[str, float] = {}
    for rec in list(feeds) + list(outputs):
        for k, v in rec.items():
            if k in ("x", "y") or k.startswith(("past_", "new_")):
                out[k] = max(out.get(k, 0.0), float(np.abs(v).max()))
    return {k: (-RANGE_MARGIN * a, RANGE_MARGIN * a) for k, a in out.items() if a > 0}


def quantize_group(float_path: Path, out_path: Path, feeds: list[dict], ranges: dict, scheme: str = "w8a16") -> None:
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    if scheme not in NPU_QUANTS:
        raise CompileError(f"--npu-quant {scheme} is not supported (choose one of {', '.join(NPU_QUANTS)})")
    wtype = getattr(QuantType, NPU_QUANTS[scheme])
    m = onnx.load(str(float_path), load_external_data=False)
    over: dict[str, list[dict]] = {w: [{"quant_type": wtype, "symmetric": True, "axis": 1}] for w in _matmul_weights(m)}
    names = {i.name for i in m.graph.input} | {o.name for o in m.graph.output}
    for k, (lo, hi) in ranges.items():
        if k in names:
            over[k] = [{"rmin": np.float32(lo), "rmax": np.float32(hi)}]
    cfg = get_qnn_qdq_config(str(float_path), _Reader(feeds), activation_type=QuantType.QUInt16,
                             weight_type=QuantType.QUInt8, init_overrides=over)
    cfg.use_external_data_format = True
    root = logging.getLogger()
    level, root.level = root.level, logging.ERROR   # the tool logs advice about pre-processing on the root logger
    try:
        quantize(str(float_path), str(out_path), cfg)
    finally:
        root.setLevel(level)
