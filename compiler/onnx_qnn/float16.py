"""NPU graphs with float16 activations (`--npu-act f16`, the default): the traced float group graph lowered to float16
end to end, every projection a com.microsoft MatMulNBits over block-quantized weights (the QNN EP runs it on the HTP
as a float16 convolution with block-quantized weights: QAIRT >= 2.47, HTP v73+).

Why not 16-bit integer activations (`--npu-act int16`, quantize.py): on real checkpoints a static per-tensor range
has to cover text calibration never saw; held-out prompts exceeded the calibrated ranges of the FFN and projection
outputs by up to 1.6x (SmolLM2-135M), and whatever margin is added costs the resolution of every ordinary value.
float16 keeps 11 bits of every value whatever its size and needs no ranges: on SmolLM2-135M and Gemma 3 270M the
hidden-state error on the HTP emulator fell from 0.5-4% per prompt (int16) to 0.3-0.8% (toolchain notes).

Weights, graph layout [in, out], blocks of BLOCK inputs of one output column, symmetric, float16 scales:
    w8a16  int8 codes (round-to-nearest, or GPTQ on the int8 grid) + an int4 plane of what they miss (int8 alone:
           1.7% hidden-state error on SmolLM2-135M, with the plane 0.3%, the float16 arithmetic's own floor)
    w4a16  int4 codes with a float offset per block (int4_offset: llama.cpp's Q4_1 grid, 5 bits per weight), rounded
           to nearest, or by GPTQ on that grid (--npu-weights gptq), or the CPU package's symmetric GPTQ codes (its
           group size is the block). Hidden-state error, all projections int4: SmolLM2-135M 26.8% (symmetric absmax
           blocks) -> 22.6% (integer zero points) -> 0.13% (float offsets: its GGUF source is Q4_1, kept exactly);
           Gemma 3 270M (a Q5_0/Q4_K/Q6_K/Q8_0 source) 30.0% -> 21.5%, 14.4% with GPTQ
    w4a16-mixed  w4a16, with the attention V and FFN down projections in int8 blocks (llama.cpp Q4_K_M gives those
           two more bits too: they carry the most error per byte; Gemma 3 270M 21.5% -> 14.5%)
A plane whose scales would be float16 subnormals is held times 2^k (its output times 2^-k, exact), k bounded by the
projection's calibrated output peak so that x @ (W 2^k) stays finite."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ...errors import CompileError
# the weight grids (re-exported: lower()'s planes are theirs)
from .weights import BLOCK, dequantize, int4_offset, int4_plane, int8_plane, planes_w8  # noqa: F401

ONNX_SOC = "sm8550"         # the oldest HTP (v73) that runs these graphs: the ONNX graphs' options where none is known
F16_MAX = 65504.0
F16_HEADROOM = 8            # a tensor's calibrated peak must stay below F16_MAX / F16_HEADROOM (unseen text)
_SCALE_FLOOR = 2.0 ** -14   # float16's smallest normal number


def _pack(bits: int, q: np.ndarray, block: int) -> np.ndarray:
    """codes [in, out] -> MatMulNBits' B [out, in/block, block*bits/8] (unsigned, zero point 2^(bits-1); 4-bit: two
    per byte, the first in the low nibble)."""
    K, N = q.shape
    u = (q.astype(np.int16) + (1 << (bits - 1))).astype(np.uint8).T.reshape(N, K // block, block)
    if bits == 4:
        u = u[..., 0::2] | (u[..., 1::2] << 4)
    return np.ascontiguousarray(u)


def _exponent(d: np.ndarray, peak: float) -> int:
    """k for a plane's scales d held times 2^k: lifts the smallest nonzero scale towards float16's normal range, as
    far as the projection's output peak (times 2^k, with headroom) allows."""
    small = float(np.abs(d[d != 0]).min()) if np.any(d) else 1.0
    want = max(0, int(np.ceil(np.log2(_SCALE_FLOOR / small)))) if small < _SCALE_FLOOR else 0
    room = int(np.floor(np.log2(F16_MAX / F16_HEADROOM / max(peak, 1e-30))))
    return int(np.clip(min(want, room), 0, 14))


def _block_means(nodes: list, inits: list, a3: str, K: int, block: int) -> str:
    """Appends the nodes of a3 [1, T, K]'s means over blocks of `block` inputs ([1, T, K/block]); returns its name.
    Scaled by 1/block (exact: a power of two) before the sum, so that no partial sum exceeds a3's own peak."""
    pre = a3 + "_bm"
    inits += [numpy_helper.from_array(np.array(1.0 / block, np.float16), pre + "_inv"),
              numpy_helper.from_array(np.array([0, 0, K // block, block], np.int64), pre + "_shape"),
              numpy_helper.from_array(np.array([-1], np.int64), pre + "_axis")]
    nodes += [helper.make_node("Mul", [a3, pre + "_inv"], [pre + "_s"], name=pre + "_scale"),
              helper.make_node("Reshape", [pre + "_s", pre + "_shape"], [pre + "_r"], name=pre + "_reshape"),
              helper.make_node("ReduceSum", [pre + "_r", pre + "_axis"], [pre], name=pre + "_sum", keepdims=0)]
    return pre


def lower(float_path: Path, out_path: Path, planes, peaks: dict[str, float]) -> str:
    """Writes out_path (+ .data): the float graph at float_path in float16 (graph inputs and outputs stay float32, cast
    at the edges) with every MatMul over a weight a sum of MatMulNBits, one per plane of planes(name, w) = [(bits,
    codes int8 [in, out], scales f32 [in/B, out][, float offsets f32 [in/B, out]])], w = codes * scales
    (+ offsets). peaks: every float tensor's
    calibrated |max| (calibrate.Ranges):
    a tensor past F16_MAX / F16_HEADROOM is refused (say why and how to go on). Returns the weight format."""
    m = onnx.load(str(float_path), load_external_data=False)
    g, base = m.graph, str(float_path.parent)
    # inputs (the KV cache, RoPE, masks, x) and the stream leaving as y have their own checks (package.py)
    fed = {i.name for i in g.input} | {i for n in g.node if "y" in n.output for i in n.input}
    for name, p in peaks.items():
        if p > F16_MAX / F16_HEADROOM and name not in fed and name != "y" and not name.startswith("new_"):
            raise CompileError(f"NPU float16 graphs: the tensor {name} reaches {p:.3g} on the calibration text, too "
                               f"close to float16's {F16_MAX:.0f}; compile with --npu-act int16")
    mm = {n.name: n for n in g.node if n.op_type == "MatMul"}
    inits = {t.name: t for t in g.initializer}
    weights = {n.input[1] for n in mm.values() if n.input[1] in inits}
    new_inits, formats = [], set()
    for t in g.initializer:
        if t.name in weights:
            continue
        a = numpy_helper.to_array(t, base_dir=base)
        new_inits.append(numpy_helper.from_array(a.astype(np.float16) if a.dtype == np.float32 else a, t.name))
    axes = "f16_axes0"
    new_inits.append(numpy_helper.from_array(np.array([0], np.int64), axes))
    nodes, block_means = [], {}
    for i in g.input:   # float32 in: cast once
        if i.type.tensor_type.elem_type == TensorProto.FLOAT:
            nodes.append(helper.make_node("Cast", [i.name], [i.name + "_f16"], to=TensorProto.FLOAT16,
                                          name="f16_in_" + i.name))
    renamed = {i.name: i.name + "_f16" for i in g.input if i.type.tensor_type.elem_type == TensorProto.FLOAT}
    outs = {o.name for o in g.output}
    renamed.update({o: o + "_f16" for o in outs})   # outputs read inside the graph too (new_k/new_v by attention)
    for n in g.node:
        n.input[:] = [renamed.get(x, x) for x in n.input]
        n.output[:] = [x + "_f16" if x in outs else x for x in n.output]
        if n.op_type == "Cast":
            for a in n.attribute:
                if a.name == "to" and a.i == TensorProto.FLOAT:
                    a.i = TensorProto.FLOAT16
        if n.op_type != "MatMul" or n.input[1] not in weights:
            nodes.append(n)
            continue
        w = n.input[1]
        arr = numpy_helper.to_array(inits[w], base_dir=base)           # [in, out]
        K, N = arr.shape
        if K % BLOCK:
            raise CompileError(f"NPU float16 graphs: {w} has {K} inputs, not a multiple of the weight block {BLOCK}")
        a3, terms = n.name + "_a3", []
        nodes.append(helper.make_node("Unsqueeze", [n.input[0], axes], [a3], name=n.name + "_unsqueeze"))
        for j, plane in enumerate(planes(w, arr)):
            bits, q, d, offset = (*plane, None)[:4]
            block = K // d.shape[0]
            k = _exponent(d, peaks.get(n.output[0], 0.0))
            b = f"{w}_p{j}"
            new_inits += [numpy_helper.from_array(_pack(bits, q, block), b + "_B"),
                          numpy_helper.from_array((d.T * np.float32(2.0 ** k)).reshape(-1).astype(np.float16), b + "_S")]
            ins = [a3, b + "_B", b + "_S"]
            if offset is not None:   # sum_k x_k o_block(k) = (x's block means) @ (B o): one small float16 MatMul
                if n.input[0] not in block_means:
                    block_means[n.input[0]] = _block_means(nodes, new_inits, a3, K, block)
                new_inits.append(numpy_helper.from_array((offset * block).astype(np.float16), b + "_O"))
                nodes.append(helper.make_node("MatMul", [block_means[n.input[0]], b + "_O"], [b + "_yo"],
                                              name=b + "_offsets"))
                terms.append(b + "_yo")
            y = b + "_y"
            nodes.append(helper.make_node("MatMulNBits", ins, [y], name=b + "_matmul",
                                          domain="com.microsoft", K=K, N=N, bits=bits, block_size=block))
            if k:
                c = b + "_unscale"
                new_inits.append(numpy_helper.from_array(np.array(2.0 ** -k, np.float16), c))
                nodes.append(helper.make_node("Mul", [y, c], [y + "_u"], name=b + "_unscale"))
                y += "_u"
            terms.append(y)
            formats.add(f"int{bits} block {block}" + (" + float offsets" if offset is not None else ""))
        y = terms[0]
        for j, t in enumerate(terms[1:]):
            nodes.append(helper.make_node("Add", [y, t], [f"{n.name}_sum{j}"], name=f"{n.name}_sum{j}"))
            y = f"{n.name}_sum{j}"
        nodes.append(helper.make_node("Squeeze", [y, axes], [n.output[0]], name=n.name + "_squeeze"))
    for o in g.output:
        nodes.append(helper.make_node("Cast", [o.name + "_f16"], [o.name], to=TensorProto.FLOAT,
                                      name="f16_out_" + o.name))
    for v in g.value_info:
        if v.type.tensor_type.elem_type == TensorProto.FLOAT:
            v.type.tensor_type.elem_type = TensorProto.FLOAT16
    del g.node[:]
    g.node.extend(nodes)
    del g.initializer[:]
    g.initializer.extend(new_inits)
    if not any(o.domain == "com.microsoft" for o in m.opset_import):
        m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    for f in out_path.parent.glob(out_path.name + "*"):
        f.unlink()
    onnx.save(m, str(out_path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=out_path.name + ".data", size_threshold=1024)
    if not formats:
        raise CompileError(f"NPU weights: no MatMul weight found in {float_path.name}")
    return " + ".join(sorted(formats, reverse=True))
