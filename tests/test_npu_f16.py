"""android-npu graphs with float16 activations (`--npu-act f16`, the default; compiler/onnx_qnn/float16.py): every
projection a MatMulNBits over block-quantized weights, everything else float16, checked against numpy on the CPU EP
and on the HTP emulator (CPU fallback disabled), and the package's numbers against the 16-bit integer graphs."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgellm
from edgellm.compiler.onnx_qnn import float16
from edgellm.errors import CompileError
from edgellm.compiler.onnx_qnn import qnn_ort

needs_qnn = pytest.mark.skipif(not qnn_ort.qnn_available(), reason="needs onnxruntime-qnn")
CHUNK = 32


def rel(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def projection_graph(tmp_path, w: np.ndarray, rows: int = 8, relu: bool = False):
    """A float graph y = x @ w (x [rows, K] float32, w a weight initializer [K, N]; relu: y = relu(x @ w)), as the
    tracer writes them."""
    K, N = w.shape
    tail = [helper.make_node("Relu", ["y_mm"], ["y_r"], name="Relu_2")] if relu else []
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y_mm"], name="MatMul_1"), *tail,
                           helper.make_node("Identity", ["y_r" if relu else "y_mm"], ["y"], name="out_y")], "p",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, K])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, N])],
                          [numpy_helper.from_array(w.astype(np.float32), "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)])
    m.ir_version = 10
    p = tmp_path / "float.onnx"
    onnx.save(m, str(p))
    return p


def planes_of(path) -> list[tuple[int, int, np.ndarray, np.ndarray]]:
    """(bits, block, codes [in, out], scales [in/B, out] as stored: times 2^k) of every MatMulNBits."""
    m = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    out = []
    for n in m.graph.node:
        if n.op_type != "MatMulNBits":
            continue
        a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
        bits, B, K, N = a["bits"], a["block_size"], a["K"], a["N"]
        u = inits[n.input[1]]                                      # [N, K/B, B*bits/8]
        if bits == 4:
            u = np.stack([u & 0xF, u >> 4], -1).reshape(N, K // B, B)
        q = (u.astype(np.int16) - (1 << (bits - 1))).reshape(N, K).T
        out.append((bits, B, q, inits[n.input[2]].astype(np.float32).reshape(N, K // B).T))
    return out


@pytest.mark.parametrize("backend", ["cpu", pytest.param("qnn", marks=needs_qnn)])
def test_projection_planes(tmp_path, backend):
    """w8a16: int8 codes per block of 32 (round-to-nearest, -127..127) plus the int4 plane of what they miss; the
    stored codes are those of float16.planes_w8, and x @ W on the CPU EP and on the HTP lands within float16's
    rounding of the float product (int8 alone: ~40x further off)."""
    rng = np.random.default_rng(0)
    K, N = 128, 48
    w = rng.standard_normal((K, N)).astype(np.float32) * 0.05
    w[:, 3] *= 40                                                  # one large output column
    x = rng.standard_normal((8, K)).astype(np.float32)
    out = tmp_path / "f16.onnx"
    fmt = float16.lower(projection_graph(tmp_path, w), out, lambda name, a: float16.planes_w8(a, None, True),
                        {"y_mm": float(np.abs(x @ w).max())})
    assert fmt == "int8 block 32 + int4 block 32"
    planes = planes_of(out)
    want = float16.planes_w8(w, None, True)
    assert [(b, B) for b, B, _, _ in planes] == [(8, 32), (4, 32)]
    for (bits, _, q, _), (wbits, wq, _) in zip(planes, want):
        assert bits == wbits and np.array_equal(q, wq)
    y = qnn_ort.session(out, backend=backend, soc="sm8650").run(None, {"x": x})[0]
    err = rel(y, x @ w)
    int8_only = rel(x @ float16.dequantize(*float16.int8_plane(w)), x @ w)
    assert err < 2e-3 and err < int8_only / 10, (err, int8_only)


def test_tiny_scales_are_lifted(tmp_path):
    """A matrix of ~1e-6 weights (block scales ~1e-8: float16 subnormal, most would round to 0): its scales are
    stored x2^k and the output x2^-k, so the product keeps its precision."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((64, 16)).astype(np.float32) * 1e-6
    x = rng.standard_normal((4, 64)).astype(np.float32) * 100
    out = tmp_path / "f16.onnx"
    float16.lower(projection_graph(tmp_path, w, rows=4), out, lambda n, a: float16.planes_w8(a, None, False),
                  {"y_mm": float(np.abs(x @ w).max())})
    (_, _, _, d), = planes_of(out)
    assert d.min() > 2.0 ** -14                                    # normal float16 numbers
    m = onnx.load(str(out))
    assert any(n.op_type == "Mul" and n.name.endswith("_unscale") for n in m.graph.node)
    y = qnn_ort.session(out, backend="cpu").run(None, {"x": x})[0]
    assert rel(y, x @ w) < 2e-2


def test_float16_range_refused(tmp_path):
    """A tensor whose calibrated peak leaves float16 no headroom is refused with the way out (--npu-act int16); the
    residual stream leaving as y has its own check (package.py) and is not refused here."""
    w = np.ones((32, 8), np.float32)
    planes = lambda n, a: float16.planes_w8(a, None, False)   # noqa: E731
    with pytest.raises(CompileError, match="--npu-act int16"):
        float16.lower(projection_graph(tmp_path, w, relu=True), tmp_path / "o.onnx", planes, {"y_mm": 3e4})
    float16.lower(projection_graph(tmp_path, w), tmp_path / "o.onnx", planes, {"y_mm": 3e4})


@pytest.fixture(scope="module")
def demo_pkgs(tmp_path_factory):
    root = tmp_path_factory.mktemp("acts")
    return {a: edgellm.compile("demo", target="host-npu", quant="f32", out=root / a, max_context=256, npu_chunk=CHUNK,
                               soc="none", npu_act=a, tune="off", progress=False) for a in ("f16", "int16")}


def test_float16_beats_int16(demo_pkgs):
    """The compile's error table (CPU EP, against the float graphs): float16 activations below the 16-bit integer
    graphs on the hidden state and on every layer's K and V."""
    e = {a: json.loads((p / "manifest.json").read_text())["npu"]["error_vs_f32"] for a, p in demo_pkgs.items()}
    assert e["f16"]["hidden_out"] < 0.5 * e["int16"]["hidden_out"], e
    assert max(max(x["k"], x["v"]) for x in e["f16"]["layers"]) < 0.01
    npu = json.loads((demo_pkgs["f16"] / "manifest.json").read_text())["npu"]
    other = json.loads((demo_pkgs["int16"] / "manifest.json").read_text())["npu"]
    assert npu["act"] == "f16" and npu["precision"]["activations"][0].startswith("float16")
    assert npu["calibration"] == other["calibration"] and npu["calibration"]["source"].startswith("built-in")
    assert "onnx_soc sm8550" in (demo_pkgs["f16"] / "npu" / "npu.txt").read_text().splitlines()


@needs_qnn
def test_runtime_without_a_soc(demo_pkgs):
    """On a machine with no known SoC (this one) libedgellm prepares the ONNX graphs with the HTP options of the
    descriptor's onnx_soc (the x86 emulator would otherwise assume an HTP too old for the block-quantized float16
    MatMul) and its NPU prefill stays within 1% of the CPU f32 path."""
    from edgellm.models.demo import HELDOUT, demo_path
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(demo_path("demo") / "tokenizer.json")).encode(HELDOUT.read_text()).ids[200:260]
    with edgellm.Runtime.load(demo_pkgs["f16"], prefill_backend="npu", threads=2) as n, \
            edgellm.Runtime.load(demo_pkgs["f16"], prefill_backend="cpu", threads=2) as c:
        assert n.prefill_backend == "npu", n.prefill_backend_note
        assert rel(n.logits(ids), c.logits(ids)) < 0.01


def test_outliers_need_int16(tmp_path):
    with pytest.raises(CompileError, match="--npu-outliers applies to --npu-act int16"):
        edgellm.compile("demo", target="host-npu", out=tmp_path / "o", npu_outliers=True, progress=False)
    with pytest.raises(CompileError, match="--npu-act"):
        edgellm.compile("demo", target="host", out=tmp_path / "h", npu_act="f16", progress=False)


def sym_absmax_int4(w: np.ndarray) -> np.ndarray:
    """Symmetric absmax int4 per block of 32 (-7..7), dequantized: the baseline int4_offset must beat."""
    K, N = w.shape
    wb = w.reshape(K // 32, 32, N)
    d = np.abs(wb).max(1, keepdims=True) / 7
    return (np.clip(np.rint(wb / d), -7, 7) * d).reshape(K, N)


@pytest.mark.parametrize("backend", ["cpu", pytest.param("qnn", marks=needs_qnn)])
def test_int4_offset_blocks(tmp_path, backend):
    """w4a16 RTN: int4 blocks with a float offset each, the offsets a float16 MatMul over the inputs' block means (the
    HTP runs it: CPU fallback is disabled). On skewed, heavy-tailed weights the fitted grid beats symmetric absmax
    blocks by a clear margin, and the graph's product equals numpy's over the dequantized codes within float16
    rounding."""
    rng = np.random.default_rng(3)
    K, N = 96, 40
    w = (rng.standard_t(4, (K, N)) * 0.02 + 0.01).astype(np.float32)
    q, d, o = float16.int4_offset(w)
    assert q.min() >= -8 and q.max() <= 7 and d.shape == o.shape == (K // 32, N)
    wq = float16.dequantize(q, d, o)
    assert rel(wq, w) < 0.8 * rel(sym_absmax_int4(w), w)
    x = rng.standard_normal((8, K)).astype(np.float32) * 4
    out = tmp_path / "a.onnx"
    fmt = float16.lower(projection_graph(tmp_path, w), out, lambda n, a: [(4, *float16.int4_offset(a))],
                        {"y_mm": float(np.abs(x @ w).max())})
    assert fmt == "int4 block 32 + float offsets"
    y = qnn_ort.session(out, backend=backend, soc="sm8650").run(None, {"x": x})[0]
    assert rel(y, x @ wq) < 3e-3


def test_int4_offset_keeps_a_4bit_source_grid():
    """A checkpoint that was itself 4-bit (a GGUF Q4_1/Q4_K file dequantized): every block's 16 levels are found
    and kept, also where its codes do not reach both ends (the range fit alone would miss them); only the float16
    storage of step and offset remains. Fresh weights are not mistaken for a grid."""
    rng = np.random.default_rng(4)
    K, N = 128, 64
    lo = rng.normal(-0.05, 0.01, (K // 32, 1, N)).astype(np.float32)
    step = rng.uniform(0.002, 0.01, (K // 32, 1, N)).astype(np.float32)
    codes = rng.integers(0, 16, (K // 32, 32, N))
    codes[:, :, : N // 2] = np.clip(codes[:, :, : N // 2], 2, 12)             # half the blocks span codes 2..12
    src = (codes * step + lo).astype(np.float32).reshape(K, N)
    q, d, o = float16.int4_offset(src)
    assert rel(float16.dequantize(q, d, o), src) < 2e-3
    fresh = rng.standard_normal((K, N)).astype(np.float32)
    assert rel(float16.dequantize(*float16.int4_offset(fresh)), fresh) > 0.05


def test_gptq_on_the_offset_grid():
    """GPTQ on the NPU's offset blocks (weights.NpuInt4Offset): with H = I it returns the round-to-nearest codes; on
    correlated inputs its output error is below round-to-nearest's."""
    from edgellm.compiler.onnx_qnn.weights import NpuInt4Offset
    from edgellm.quant.gptq import prepare_hessian

    rng = np.random.default_rng(1)
    s = NpuInt4Offset(32)
    w = rng.standard_normal((48, 128)).astype(np.float32)
    rtn = s.quantize(w)
    assert np.array_equal(rtn["q"], s.gptq_quantize(w, prepare_hessian(np.eye(128), percdamp=0.0), 128)["q"])
    X = rng.standard_normal((2048, 128)).astype(np.float32) @ rng.standard_normal((128, 128)).astype(np.float32)
    g = s.gptq_quantize(w, prepare_hessian(2 * X.T @ X / len(X)), 128)
    err = {k: rel(X @ s.dequantize(p).T, X @ w.T) for k, p in (("rtn", rtn), ("gptq", g))}
    assert err["gptq"] < 0.9 * err["rtn"], err


def test_w4a16_mixed_keeps_v_and_down_int8(tmp_path):
    """w4a16-mixed: the V and FFN down projections as int8 blocks, every other projection int4 offset blocks; the
    compile's hidden-state error below all-int4's, and GPTQ's (--npu-weights gptq) below round-to-nearest's; int16
    activations refused."""
    e, fmt = {}, {}
    for q in ("w4a16", "w4a16-mixed", "w4a16-mixed-gptq"):
        p = edgellm.compile("demo", target="host-npu", quant="f32", out=tmp_path / q, max_context=256,
                            npu_chunk=CHUNK, soc="none", npu_quant=q.removesuffix("-gptq"), tune="off",
                            npu_weights="gptq" if q.endswith("gptq") else "rtn", progress=False)
        npu = json.loads((p / "manifest.json").read_text())["npu"]
        e[q], fmt[q] = npu["error_vs_f32"]["hidden_out"], npu["weights"]
        m = onnx.load(str(next((p / "npu").glob("*.onnx"))), load_external_data=False)
        bits = {n.name: helper.get_attribute_value(next(a for a in n.attribute if a.name == "bits"))
                for n in m.graph.node if n.op_type == "MatMulNBits"}
        eight = {k for k, b in bits.items() if b == 8}
        assert eight == ({k for k in bits if "v_proj" in k or "down_proj" in k} if "mixed" in q else set())
    assert fmt["w4a16"].startswith("int4 block 32 + float offsets, rtn") and "int8 block 32" in fmt["w4a16-mixed"]
    assert ", gptq," in fmt["w4a16-mixed-gptq"]
    assert e["w4a16-mixed"] < 0.8 * e["w4a16"], e
    assert e["w4a16-mixed-gptq"] < 0.8 * e["w4a16-mixed"], e
    with pytest.raises(CompileError, match="w4a16-mixed applies to --npu-act f16"):
        edgellm.compile("demo", target="host-npu", out=tmp_path / "x", npu_quant="w4a16-mixed", npu_act="int16",
                        progress=False)
