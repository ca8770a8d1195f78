"""Quantization of the group graphs for the Hexagon HTP (which runs no float32): static QDQ through ONNX Runtime's
QNN quantization tooling, 16-bit activations calibrated on text, symmetric weights.

    w8a16   int8 weights per output channel (the default: rel. error ~1% per layer)
    w4a16   int4 weights per block of W4_BLOCK inputs x one output column (half the bytes). The graph is quantized
            as w8a16, then each MatMul weight's DequantizeLinear becomes an int4 block-wise one (opset 21
            `block_size` on axis 0, which the HTP runs). Codes: round-to-nearest, or the GPTQ codes and scales of
            the CPU package (`--gptq`), whose group size becomes the block size.

The calibration ranges of the KV cache and of the residual stream are widened (RANGE_MARGIN): min-max over a few
chunks clips the positions and prompts calibration never saw (toolchain notes)."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ...errors import CompileError
from ...quant.packing import unpack_codes, unpack_group_scales
from ...quant.q4 import q4_codes, q4_scales
from .graph import FP16_PREFIX

NPU_QUANTS = {"w8a16": "int8 per channel", "w4a16": "int4 block-wise",
              "w4a16-mixed": "int4 blocks, V and FFN down projections int8 (float16 activations only)"}
W4_BLOCK = 32       # w4a16 RTN: inputs per scale (the toolchain probes' block; GPTQ codes keep their own group size)
RANGE_MARGIN = 1.5
# Headroom on every other activation range, off: held-out prompts exceed the calibrated ranges of the FFN and
# projection outputs by up to 1.6x (SmolLM2-135M), and in the CPU EP's simulation 2x ranges cut the hidden-state
# error 3x (1.22% -> 0.46%; Gemma 3 270M 1.97% -> 1.16%), but on the HTP emulator SmolLM2 got worse (greedy
# agreement 80% -> 50% with the float16 stream too; A/B of the margin alone on four prompts: last-token logits
# 2.9/0.9/2.9/3.6% without, 6.3/2.2/2.7/4.6% with it): the HTP loses
# precision in proportion to some ranges that the simulation does not model. Kept as a knob until that is found.
ACT_MARGIN = 1.0
# ... and never past this magnitude: with the 2x margin a SwiGLU product's range of -58k (a model with x5000 outlier
# channels) made the HTP's logits 42-51% off the CPU while the simulation said 2.5%.
ACT_MARGIN_CAP = 16384.0


def _matmul_weights(m: onnx.ModelProto) -> dict[str, str]:
    """{MatMul node name: its weight initializer's name} (the checkpoint name, graph.py)."""
    inits = {i.name for i in m.graph.initializer}
    return {n.name: n.input[1] for n in m.graph.node if n.op_type == "MatMul" and n.input[1] in inits}


def widened(ranges: dict[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
    """The calibrated ranges, with the residual stream and the K/V tensors made symmetric and RANGE_MARGIN x the
    largest magnitude seen, every other activation ACT_MARGIN x its calibrated range (positions and prompts
    calibration never saw); every range holds 0."""
    out = {}
    for k, (lo, hi) in ranges.items():
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        if k in ("x", "y") or k.startswith(("past_", "new_")):
            a = RANGE_MARGIN * max(-lo, hi)
            lo, hi = -a, a
        else:   # the margin, but not past ACT_MARGIN_CAP (a range it already exceeds stays as calibrated)
            m = max(1.0, min(ACT_MARGIN, ACT_MARGIN_CAP / max(-lo, hi, 1e-30)))
            lo, hi = lo * m, hi * m
        out[k] = (lo, hi)
    return out


def _write_ranges(path: Path, ranges: dict[str, tuple[float, float]]) -> None:
    """The ranges as ONNX Runtime's calibration cache (quantize_static then runs no calibration of its own)."""
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData, save_tensors_data

    data = {k: TensorData(lowest=np.float32(lo), highest=np.float32(hi)) for k, (lo, hi) in ranges.items()}
    save_tensors_data(TensorsData(CalibrationMethod.MinMax, data), path)


def quantize_group(float_path: Path, out_path: Path, ranges: dict[str, tuple[float, float]], scheme: str = "w8a16",
                   gptq: dict | None = None, int8: dict | None = None, planes: bool = False) -> str:
    """Quantizes one float group graph to out_path (+ its external data); returns the weight format (manifest).
    ranges: every float tensor's calibrated (min, max) (calibrate.py; widened here). gptq: the CPU package's GPTQ q4
    parts by checkpoint name (w4a16 takes its codes; None: RTN; w8a16 ignores them: its int8 grid is finer than
    GPTQ's int4 one). int8: w8a16's own codes by checkpoint name (weights.NpuInt8 parts, GPTQ on the NPU's int8
    grid; None: round-to-nearest per channel). planes (w8a16 only): each projection also gets an int4
    plane of what its int8 codes (int8's, else round-to-nearest) miss (weight_planes)."""
    import inspect

    from onnxruntime.quantization import CalibrationMethod, QuantType, quantize_static
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    if scheme not in NPU_QUANTS:
        raise CompileError(f"--npu-quant {scheme} is not supported (choose one of {', '.join(NPU_QUANTS)})")
    if "calibration_cache_path" not in inspect.signature(quantize_static).parameters:
        raise CompileError("--target android-npu needs a newer onnxruntime (its quantizer must take precomputed ranges, "
                           "quantize_static(calibration_cache_path=...); 1.32 does): pip install -U onnxruntime "
                           "onnxruntime-qnn")
    lean, weights, fp16 = _weights_as_inputs(float_path)
    cfg = get_qnn_qdq_config(str(lean), None, activation_type=QuantType.QUInt16, weight_type=QuantType.QUInt8)
    cache = out_path.with_name(out_path.name + ".ranges.json")
    _write_ranges(cache, {**widened(ranges), **{w: (-1.0, 1.0) for w in weights}})   # placeholders: replaced below
    root = logging.getLogger()
    level, root.level = root.level, logging.ERROR   # the tool logs advice about pre-processing on the root logger
    try:
        quantize_static(str(lean), str(out_path), calibration_data_reader=None, calibration_cache_path=str(cache),
                        calibrate_method=CalibrationMethod.MinMax, quant_format=cfg.quant_format,
                        activation_type=cfg.activation_type, weight_type=cfg.weight_type,
                        op_types_to_quantize=cfg.op_types_to_quantize,
                        nodes_to_exclude=list(cfg.nodes_to_exclude or []) + fp16,
                        per_channel=cfg.per_channel, use_external_data_format=True, extra_options=cfg.extra_options)
    finally:
        root.setLevel(level)
        cache.unlink(missing_ok=True)
        lean.unlink(missing_ok=True)
    if scheme == "w8a16" and planes:
        return weight_planes(out_path, float_path, int8)
    if scheme == "w8a16":
        return int8_weights(out_path, float_path, int8)
    return int4_blocks(out_path, float_path, gptq)


def _weights_as_inputs(float_path: Path) -> tuple[Path, set[str], list[str]]:
    """The float graph with every MatMul weight turned into a graph input of its shape (no data), for ONNX Runtime's
    quantizer: it then inserts only the activations' Q/DQ and never holds the group's float weights (its copies of
    a 1B model's 1 GB group were the compile's peak memory); rewrite_weights puts each weight in as int8/int4 codes.
    Returns (its path, the weight names, the float16 attention's node names: graph.py, not to be quantized)."""
    m = onnx.load(str(float_path), load_external_data=False)
    weights = set(_matmul_weights(m).values())
    keep = [i for i in m.graph.initializer if i.name not in weights]
    gone = [i for i in m.graph.initializer if i.name in weights]
    m.graph.input.extend(helper.make_tensor_value_info(i.name, TensorProto.FLOAT, list(i.dims)) for i in gone)
    del m.graph.initializer[:]
    m.graph.initializer.extend(keep)
    p = float_path.with_name(float_path.name + ".lean.onnx")   # beside it: what stays reads its data file
    onnx.save(m, str(p))
    return p, weights, [n.name for n in m.graph.node if n.name.startswith(FP16_PREFIX)]


def rtn_int4(w: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """w f32 [in, out] -> (codes int8 [in, out] in -8..7, scales f32 [in/block, out]): the q4 rule of the CPU
    package (quant/q4.py: d = f16(m / -8), m the signed absmax of the block; the CPU's q4g32 RTN codes are these).
    A scale is negative where m > 0 (m lands on code -8, using all 16 levels); the HTP takes negative scales (its
    output matches the CPU EP's on the same graph as closely as with per-channel int8), so GPTQ's scales need no
    conversion either."""
    K, N = w.shape
    if K % block:
        raise CompileError(f"--npu-quant w4a16: a weight with {K} inputs is not a multiple of the block size {block}")
    wb = np.asarray(w, np.float32).reshape(K // block, block, N).transpose(0, 2, 1)   # [K/B, N, B]
    d = q4_scales(wb).astype(np.float32)
    return q4_codes(wb, d[..., None]).transpose(0, 2, 1).reshape(K, N), d


def gptq_int4(parts: dict) -> tuple[np.ndarray, np.ndarray]:
    """The CPU package's GPTQ q4 parts (quant/q4.py: codes +8 packed in row panels [out, in], f16 scales [out, in/G]
    panel-interleaved) -> (codes int8 [in, out], scales f32 [in/G, out]): the same numbers, unpacked and transposed to
    the graph's [in, out] layout; no requantization (a CPU group of G consecutive inputs of one output row is an NPU
    block of G along axis 0 of one output column; the HTP runs blocks of 32, 64 and 128, i.e. every q4gG)."""
    q = unpack_codes(parts["qweight"], "q4").astype(np.int8) - np.int8(8)
    d = unpack_group_scales(np.asarray(parts["scales"])).astype(np.float32)
    return np.ascontiguousarray(q.T), np.ascontiguousarray(d.T)


def _int4_tensor(name: str, q: np.ndarray) -> onnx.TensorProto:
    """An INT4 initializer from int8 codes (-8..7): two per byte, the first in the low nibble (ONNX's packing)."""
    u = np.append(q.reshape(-1) & 0xF, [0] * (q.size % 2)).astype(np.uint8)
    return helper.make_tensor(name, TensorProto.INT4, q.shape, (u[0::2] | (u[1::2] << 4)).tobytes(), raw=True)


def int4_blocks(path: Path, float_path: Path, gptq: dict | None = None) -> str:
    """Rewrites the quantized graph at path: each MatMul weight's int8 per-channel DequantizeLinear becomes an int4
    block-wise one (axis 0, block_size B, scales [in/B, out], int4 zero points 0: symmetric). The codes are the GPTQ
    ones when gptq holds the weight (B = its group size), else RTN of the float weight of float_path (B = W4_BLOCK).
    Returns the weight format for the manifest. The zero points are explicit although 0 is the default: the QNN EP
    mis-converts an int4 DequantizeLinear without them in the per-channel case (the HTP's output was garbage while the
    CPU EP's was right); block-wise it gave the same results either way, so we keep the form that is right for both."""
    def pick(name, float_weight):
        if gptq is not None and name in gptq:
            return (*gptq_int4(gptq[name]), "gptq", 4)
        return (*rtn_int4(float_weight(), W4_BLOCK), "rtn", 4)

    return rewrite_weights(path, float_path, pick)


def int8_weights(path: Path, float_path: Path, parts: dict | None = None) -> str:
    """Rewrites the quantized graph at path: each MatMul weight becomes int8 codes and scales: parts' (weights.NpuInt8:
    {"q" [out, in], "scales" [out, in/G]} by checkpoint name, e.g. GPTQ's: one scale per output channel when G = in,
    else blocks of G inputs), else round-to-nearest per output channel."""
    from .weights import NpuInt8

    def pick(name, float_weight):
        p = (parts or {}).get(name) or dict(NpuInt8().quantize(float_weight().T), source="rtn")
        return np.ascontiguousarray(p["q"].T), np.ascontiguousarray(p["scales"].T), p.get("source", "gptq"), 8

    return rewrite_weights(path, float_path, pick)


RESIDUAL_RANGE = 4   # a residual plane's output gets 1/4 of its projection's output step (its values are ~1/100)


def int4_channels(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """w f32 [in, out] -> (codes int8 [in, out] in -7..7, scales f32 [1, out]): symmetric round-to-nearest, one f32
    scale per output column (a residual's values are ~1/254 of the weight's: an f16 scale would be subnormal)."""
    d = np.abs(np.asarray(w, np.float32)).max(0, keepdims=True) / 7
    d[d == 0] = 1.0
    return np.clip(np.round(w / d), -7, 7).astype(np.int8), d.astype(np.float32)


def weight_planes(path: Path, float_path: Path, int8: dict | None = None) -> str:
    """Rewrites the quantized graph at path: every projection y = x @ W becomes x @ main + x @ residual, main W's
    int8 codes per output channel (int8's, e.g. GPTQ's, else round-to-nearest) and residual the int4 codes (per
    output channel) of what main misses, so the weights carry ~11 bits for 1.5x the bytes. Per-channel int8 alone
    cost a real 135M model 3.1% hidden-state error where 16-bit activations cost 1.3% (the inputs' outlier channels
    multiply the rounding error); with the residual plane, 1.3%. The HTP runs neither int16 weights nor int8 blocks
    (its MatMul takes int8/int4 per channel and int4 blocks: toolchain probes), hence two MatMuls on the same
    quantized input and an Add; the residual's output range is RESIDUAL_RANGE x finer than the projection's (it
    needs no calibration of its own: its values are ~1% of the output's)."""
    from .weights import NpuInt8

    residual: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def pick(name, float_weight):
        w = float_weight()                       # [K, N]
        p = (int8 or {}).get(name) or dict(NpuInt8().quantize(w.T), source="rtn")
        residual[name] = int4_channels(w - NpuInt8.dequantize(p).T)
        return np.ascontiguousarray(p["q"].T), np.ascontiguousarray(p["scales"].T), p.get("source", "gptq"), 8

    fmt = rewrite_weights(path, float_path, pick, edit=lambda m, weight_of: _add_residuals(
        m, {node: residual[w] for node, w in weight_of.items() if w in residual}))
    return fmt + " + int4 residual plane per channel"


def _add_residuals(m: onnx.ModelProto, residual: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    """For each MatMul named in residual: its output y becomes Add(QDQ(MatMul(x, main)), QDQ(MatMul(x, DQ(r)))),
    the first rounded on y's own grid, the second on a RESIDUAL_RANGE x finer one (zero point mid-range)."""
    inits = {i.name: i for i in m.graph.initializer}
    readers: dict[str, list] = {}
    for n in m.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    after: dict[str, list] = {}
    for node in m.graph.node:
        if node.op_type != "MatMul" or node.name not in residual:
            continue
        y = node.output[0]
        q = next((c for c in readers.get(y, []) if c.op_type == "QuantizeLinear"), None)
        if q is None or len(q.input) < 3 or q.input[1] not in inits or q.input[2] not in inits:
            raise CompileError(f"NPU weight planes: the output of {node.name} is not quantized")
        codes, d = residual[node.name]
        b = node.name + "_residual"
        s_y = float(numpy_helper.to_array(inits[q.input[1]]))
        zero = numpy_helper.to_array(inits[q.input[2]])
        mid = (int(np.iinfo(zero.dtype).max) + 1) // 2 if zero.dtype.kind == "u" else 0
        m.graph.initializer.extend([
            _int4_tensor(b + "_w", codes), numpy_helper.from_array(d[0].astype(np.float32), b + "_w_scale"),
            _int4_tensor(b + "_w_zero_point", np.zeros(d.shape[1], np.int8)),
            numpy_helper.from_array(np.array(s_y / RESIDUAL_RANGE, np.float32), b + "_scale"),
            numpy_helper.from_array(np.array(mid, zero.dtype), b + "_zero_point")])
        ys, yq = [b + "_scale", b + "_zero_point"], list(q.input[1:3])
        node.output[0] = y + "_main"
        after[node.name] = [
            helper.make_node("QuantizeLinear", [y + "_main", *yq], [y + "_main_q"], name=y + "_main_q"),
            helper.make_node("DequantizeLinear", [y + "_main_q", *yq], [y + "_main_dq"], name=y + "_main_dq"),
            helper.make_node("DequantizeLinear", [b + "_w", b + "_w_scale", b + "_w_zero_point"], [b + "_wdq"],
                             name=b + "_wdq", axis=1),
            helper.make_node("MatMul", [node.input[0], b + "_wdq"], [b + "_y"], name=b),
            helper.make_node("QuantizeLinear", [b + "_y", *ys], [b + "_y_q"], name=b + "_y_q"),
            helper.make_node("DequantizeLinear", [b + "_y_q", *ys], [b + "_y_dq"], name=b + "_y_dq"),
            helper.make_node("Add", [y + "_main_dq", b + "_y_dq"], [y], name=b + "_add")]
    order = []
    for n in m.graph.node:
        order.append(n)
        order.extend(after.get(n.name, []))
    del m.graph.node[:]
    m.graph.node.extend(order)


def rewrite_weights(path: Path, float_path: Path, pick, edit=None) -> str:
    """Replaces the weight DequantizeLinear of every MatMul with
    pick(name, float_weight) = (codes int8 [in, out], scales f32 [in/B, out], source, bits): int4 or int8 codes,
    symmetric (explicit zero points 0); one scale row: per output channel (axis 1), else blocks of B inputs (axis 0).
    edit(model, {MatMul node name: weight name}), when given, edits the graph before it is saved. Returns the weight
    formats for the manifest."""
    fm = onnx.load(str(float_path), load_external_data=False)
    finits = {i.name: i for i in fm.graph.initializer}
    weight_of = _matmul_weights(fm)
    m = onnx.load(str(path))
    inits = {i.name: i for i in m.graph.initializer}
    prod = {o: n for n in m.graph.node for o in n.output}
    inputs = {i.name: i for i in m.graph.input}
    formats = set()
    int8_tensor = lambda name, q: numpy_helper.from_array(np.asarray(q, np.int8), name)   # noqa: E731
    for node in list(m.graph.node):   # a copy: Q nodes of weight inputs are removed on the way
        name = weight_of.get(node.name) if node.op_type == "MatMul" else None
        dq = prod.get(node.input[1]) if name else None
        if dq is None or dq.op_type != "DequantizeLinear":
            continue
        qn = prod.get(dq.input[0])
        if qn is not None and qn.op_type == "QuantizeLinear" and qn.input[0] == name and name in inputs:
            # the weight came in as a graph input (_weights_as_inputs): drop it and its Q node, name its codes
            m.graph.input.remove(inputs.pop(name))
            m.graph.node.remove(qn)
            for x in qn.input[1:]:   # its activation scale and zero point (read by the Q and this DQ only)
                if x in inits:
                    m.graph.initializer.remove(inits.pop(x))
            dq.input[0], dq.input[1] = name + "_quantized", name + "_scale"
            dq.input[2:] = [name + "_zero_point"]
        elif dq.input[0] not in inits:
            continue
        q, d, src, bits = pick(name, lambda name=name: numpy_helper.to_array(finits[name],
                                                                             base_dir=str(float_path.parent)))
        tensor = _int4_tensor if bits == 4 else int8_tensor
        block = q.shape[0] // d.shape[0]
        per_channel = d.shape[0] == 1
        formats.add(f"int{bits} " + ("per channel" if per_channel else f"block {block}") + f", {src}")
        for x in dq.input:
            if x in inits:
                m.graph.initializer.remove(inits.pop(x))
        zp = dq.input[2] if len(dq.input) > 2 else dq.input[0] + "_zero_point"
        scales = d[0] if per_channel else d
        m.graph.initializer.extend([tensor(dq.input[0], q), numpy_helper.from_array(scales.astype(np.float32), dq.input[1]),
                                    tensor(zp, np.zeros(scales.shape, np.int8))])
        dq.input[2:] = [zp]
        del dq.attribute[:]
        dq.attribute.extend([helper.make_attribute("axis", 1)] if per_channel else
                            [helper.make_attribute("axis", 0), helper.make_attribute("block_size", block)])
    if not formats:
        raise CompileError(f"NPU weights: no MatMul weight found to quantize in {path.name}")
    if edit is not None:
        edit(m, weight_of)
    for f in path.parent.glob(path.name + ".*"):
        f.unlink()   # the int8 weights' external data (onnx.save would append to it)
    onnx.save(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=path.name + ".data",
              size_threshold=1024)
    return "; ".join(sorted(formats))
