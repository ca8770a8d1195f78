"""Every OpenCL kernel (compiler/opencl/ops.py, built by compiler/opencl/build.py) against its numpy reference, run
on the machine's OpenCL driver (PoCL in CI: `pocl-opencl-icd`) through the same launch table the C backend reads.

The float kernels differ from the float64 references by f32 rounding only; the quantized linears compute the CPU
kernels' exact integer block sums (int8 activations included), so they meet the CPU kernels' bound too."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tvm")
cl = pytest.importorskip("pyopencl")

from edgellm.compiler.ops import reference  # noqa: E402
from edgellm.compiler.opencl import build, ops  # noqa: E402
from edgellm.quant import get_scheme  # noqa: E402

from opencl_kernels import Kernels  # noqa: E402


def _has_device() -> bool:
    try:
        return any(p.get_devices() for p in cl.get_platforms())
    except cl.Error:
        return False


pytestmark = pytest.mark.skipif(not _has_device(), reason="no OpenCL platform (apt-get install pocl-opencl-icd)")
RTOL = 1e-5

# (op, params): decode and prefill shapes, a tail panel (N not a multiple of 16), fused outputs, biases
CASES = [
    ("embed", dict(T=3, V=50, D=24)), ("embed", dict(T=1, V=50, D=24, wdtype="float16")),
    ("embed_q8", dict(T=3, V=37, D=64)), ("embed_q4", dict(T=2, V=37, D=64, G=32)), ("embed_q6", dict(T=2, V=37, D=64)),
    ("embed_q8g32", dict(T=2, V=37, D=64, G=32)),
    ("rmsnorm", dict(R=3, D=96, eps=1e-5)), ("rmsnorm", dict(R=1, D=2048, eps=1e-6)),
    ("rope", dict(T=4, H=3, D=16)),
    ("add", dict(R=3, N=40)), ("copy", dict(R=2, N=33)), ("swiglu", dict(T=3, F=70)), ("relu2_mul", dict(T=2, F=64)),
    ("gelu_mul", dict(T=3, F=70)), ("scale", dict(R=2, N=33, c=25.298)),
    ("linear", dict(T=1, N=64, K=128)), ("linear", dict(T=1, N=37, K=96, wdtype="float16", bias=True)),
    ("linear", dict(T=5, N=48, K=64, bias=True, segs=(16, 32))),
    ("linear", dict(T=16, N=40, K=64, wdtype="float16", segs=(24, 16))),
    ("linear_q8", dict(T=1, N=37, K=128)), ("linear_q8", dict(T=16, N=48, K=96, bias=True, segs=(32, 16))),
    ("linear_q4", dict(T=1, N=40, K=128, G=32, bias=True)), ("linear_q4", dict(T=5, N=33, K=256, G=64)),
    ("linear_q4", dict(T=16, N=48, K=128, G=32, segs=(16, 32))),
    ("linear_q6", dict(T=1, N=37, K=128)), ("linear_q6", dict(T=5, N=20, K=64, bias=True)),
    ("linear_q4m", dict(T=1, N=37, K=128, bias=True)), ("linear_q4m", dict(T=5, N=48, K=96, segs=(32, 16))),
    ("linear_t2", dict(T=1, N=37, K=64)), ("linear_t2", dict(T=8, N=48, K=128, segs=(16, 16, 16))),
    ("linear_t2_lut", dict(T=3, N=20, K=64, bias=True)),
    ("attention", dict(T=1, NH=4, KVH=2, D=16)), ("attention", dict(T=4, NH=4, KVH=4, D=16)),
    ("attention", dict(T=3, NH=6, KVH=2, D=64)), ("attention", dict(T=2, NH=2, KVH=1, D=16, W=5)),
    ("attention", dict(T=3, NH=4, KVH=2, D=16, cap=2.5)), ("softcap", dict(R=3, N=40, c=3.0)),
]


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    funcs = dict(ops.make_kernel(op, **p) for op, p in CASES)
    out = tmp_path_factory.mktemp("opencl")
    build.build_opencl(funcs, out)
    return Kernels(out)


def _inputs(op, p, r):
    """Inputs in kernel order (packed weights as stored; f16 tensors as their uint16 bits), output shapes."""
    def randn(*shape):
        return r.standard_normal(shape).astype(np.float32)

    if op.startswith("embed"):
        T_, V, D = p["T"], p["V"], p["D"]
        ids = r.integers(0, V, T_).astype(np.int32)
        w = randn(V, D)
        if op == "embed":
            return [ids, w.astype(p.get("wdtype", "float32"))], [(T_, D)]
        sch = get_scheme({"embed_q8": "q8", "embed_q6": "q6", "embed_q8g32": "q8g32"}.get(op) or f"q4g{p['G']}")
        parts = sch.quantize(w)
        return [ids] + [parts[k] for k in sch.part_order], [(T_, D)]
    if op == "rmsnorm":
        return [randn(p["R"], p["D"]), randn(p["D"])], [(p["R"], p["D"])]
    if op == "rope":
        T_, H, D = p["T"], p["H"], p["D"]
        return [randn(T_, H, D), randn(T_, D // 2), randn(T_, D // 2)], [(T_, H, D)]
    if op in ("add", "copy", "swiglu", "relu2_mul", "gelu_mul", "scale", "softcap"):
        shape = (p.get("R", p.get("T")), p.get("N", p.get("F")))
        return [randn(*shape) * (4 if op == "softcap" else 1)
                for _ in range(1 if op in ("copy", "scale", "softcap") else 2)], [shape]
    if op == "attention":
        T_, NH, KVH, D = p["T"], p["NH"], p["KVH"], p["D"]
        S = 300 if T_ == 1 else 37   # longer than a key chunk: several chunks and a partial one
        return [randn(T_, NH, D) * (3 if p.get("cap") else 1), randn(S, KVH, D), randn(S, KVH, D)], [(T_, NH * D)]
    T_, N, K = p["T"], p["N"], p["K"]
    x = randn(T_, K)
    x[:, ::17] *= 20.0   # outlier channels
    w = randn(N, K) * 0.05
    if op == "linear":
        args = [x, w.astype(p.get("wdtype", "float32"))]
    else:
        sch = get_scheme({"linear_q8": "q8", "linear_q4": f"q4g{p.get('G')}", "linear_q6": "q6",
                          "linear_q4m": "q4m32"}.get(op, "t2"))
        segs = p.get("segs") or (N,)   # stacked matrices as the lowering fuses them (t2: a scale per matrix)
        parts = sch.concat_parts([sch.quantize(m) for m in np.split(w, np.cumsum(segs)[:-1])])
        args = [x] + [parts[k] for k in sch.part_order]
    if p.get("bias"):
        args.append(randn(N))
    segs = p.get("segs") or (N,)
    return args, [(T_, n) for n in segs]


@pytest.mark.parametrize("op,p", CASES, ids=[ops.make_kernel(op, **p)[0] for op, p in CASES])
def test_kernel_matches_reference(kernels, op, p):
    r = np.random.default_rng(len(str(p)))
    args, outs = _inputs(op, p, r)
    dev_args = [a.view(np.uint16) if a.dtype == np.float16 else a for a in args]
    got = kernels.run(ops.make_kernel(op, **p)[0], dev_args + [np.full(s, np.nan, np.float32) for s in outs],
                      list(range(len(args), len(args) + len(outs))))
    ref = reference(op, args, **p)
    refs = ref if isinstance(ref, list) else [ref]
    for g, want in zip(got, refs):
        assert np.all(np.isfinite(g))
        err = np.abs(g.astype(np.float64) - want).max()
        assert err <= RTOL * max(np.abs(want).max(), 1e-30), f"max err {err:.3e} (ref max {np.abs(want).max():.3e})"


def test_unsupported_op_is_a_clear_error():
    with pytest.raises(ops.UnsupportedOp, match="no moe_route kernel"):
        ops.make_kernel("moe_route", T=1, E=4, K=2, normalize=True, S=4, TP=1)


def test_half_bits_widen_exactly():
    """half_to_f32 over every finite half (normals, subnormals, zeros, both signs), through OpenCL."""
    from tvm import te

    h = te.placeholder((65536,), "uint16", "h")
    out = te.compute((65536,), lambda i: ops.half_to_f32(h[i]), name="out")
    f = te.create_prim_func([h, out]).with_attr("global_symbol", "widen")
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        build.build_opencl({"widen": f}, d)
        k = Kernels(d)
        bits = np.arange(65536, dtype=np.uint16)
        got, = k.run("widen", [bits, np.zeros(65536, np.float32)], [1])
    want = bits.view(np.float16).astype(np.float32)
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[finite].view(np.uint32), want[finite].view(np.uint32))
