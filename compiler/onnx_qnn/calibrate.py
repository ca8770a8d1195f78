"""Activation ranges of the NPU group graphs, streamed: every float tensor's (min, max) over the calibration text,
kept as two numbers per tensor while the text runs chunk by chunk, instead of ONNX Runtime's calibrator, which holds
every intermediate tensor of every calibration feed at once (a 135M model at 4k context needed 12.5 GB).

A probe graph is the float graph with every node output exposed (sharing its weight file); package.py runs it group
by group over the text. Position 0 is never observed: the runtime runs it on the CPU (compiler/onnx_qnn/npu_chunks.py), so the
attention sink's massive activations never set a range."""
from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from .graph import FP16_PREFIX


# Outputs whose range follows from their inputs' (derive()), so the probe need not hold them: the attention's
# [heads, C, kv_rows + C] tensors are most of a probe's memory (one of five is kept, the scores).
_MOVES = {"Reshape", "Transpose", "Identity", "Squeeze", "Unsqueeze"}


def _derived(n: onnx.NodeProto, graph_inputs: set[str]) -> bool:
    return (n.op_type in _MOVES or n.op_type == "Softmax" or
            (n.op_type == "Add" and any(i.startswith("mask") and i in graph_inputs for i in n.input)))


def _float16(n: onnx.NodeProto) -> bool:
    """An op of the float16 attention (graph.py FP16_PREFIX): no range, no quantization."""
    return n.name.startswith(FP16_PREFIX) and not n.name.startswith(FP16_PREFIX + "Cast_out")


def probe_graph(float_path: Path) -> Path:
    """float_path's graph with every node output also a graph output, but those derive() computes, saved beside it
    (its external weights are the float graph's file: the probe adds outputs, no data)."""
    m = onnx.load(str(float_path), load_external_data=False)
    have = {o.name for o in m.graph.output}
    inputs = {i.name for i in m.graph.input}
    for n in m.graph.node:
        if _derived(n, inputs) or _float16(n):
            continue
        for o in n.output:
            if o and o not in have:
                m.graph.output.append(helper.make_tensor_value_info(o, TensorProto.FLOAT, None))
                have.add(o)
    p = float_path.with_name(float_path.name + ".probe.onnx")   # package.py's _drop(float_path) removes it too
    onnx.save(m, str(p))
    return p


class Ranges:
    """Running (min, max) per tensor name; see(group_index, {name: array}) is a ChunkRunner observer."""

    def __init__(self):
        self._r: dict[str, list[float]] = {}

    def see(self, _gi: int, tensors: dict) -> None:
        for k, v in tensors.items():
            if v.size == 0 or v.dtype.kind != "f":
                continue
            lo, hi = float(v.min()), float(v.max())
            r = self._r.get(k)
            if r is None:
                self._r[k] = [lo, hi]
            else:
                r[0], r[1] = min(r[0], lo), max(r[1], hi)

    def ranges(self) -> dict[str, tuple[float, float]]:
        return {k: (lo, hi) for k, (lo, hi) in self._r.items()}


def derive(ranges: dict[str, tuple[float, float]], float_path: Path) -> dict[str, tuple[float, float]]:
    """The ranges of the outputs the probe left out, from their inputs', in graph order: data movement keeps its
    input's range, a softmax is [0, 1], adding the mask adds the intervals (the mask holds 0 and its hidden value)."""
    m = onnx.load(str(float_path), load_external_data=False)
    inputs = {i.name for i in m.graph.input}
    out = dict(ranges)
    for n in m.graph.node:
        if not _derived(n, inputs) or _float16(n) or n.output[0] in out:
            continue
        if n.op_type == "Softmax":
            out[n.output[0]] = (0.0, 1.0)
        elif n.op_type == "Add":
            a, b = (out.get(i) for i in n.input[:2])
            if a is not None and b is not None:
                out[n.output[0]] = (a[0] + b[0], a[1] + b[1])
        elif n.input[0] in out:
            out[n.output[0]] = out[n.input[0]]
    return out
