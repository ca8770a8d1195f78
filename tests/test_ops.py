"""Correctness tests for the kernel library (edgellm.compiler.ops) on the host CPU.

Every kernel is built with tvm.compile for the host LLVM target, run on TVM runtime tensors and compared
with the float64 numpy reference: max |out - ref| <= 1e-5 * max |ref| (f16 weights: the reference uses the
same f16-rounded weights, so the bound is as tight).
"""
from __future__ import annotations

import functools
import re
import time

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")


from edgellm.compiler import ops  # noqa: E402


NUM_THREADS = 2
CPU = ops.host_cpu_info(NUM_THREADS)
TARGET = ops.llvm_target(NUM_THREADS)
DEV = tvm.cpu()
RTOL = 1e-5


@functools.cache
def _build(op: str, cpu: ops.CpuInfo, items: tuple):
    name, func = ops.make_kernel(op, cpu, **dict(items))
    ex = tvm.compile(tvm.IRModule({name: func}), target=TARGET)
    return name, ex.jit()[name]


def build(op, cpu=CPU, **params):
    return _build(op, cpu, tuple(sorted(params.items())))


def run(op, inputs, out_shape, cpu=CPU, **params):
    _, f = build(op, cpu, **params)
    targs = [tvm.runtime.tensor(np.ascontiguousarray(a)) for a in inputs]
    out = tvm.runtime.tensor(np.full(out_shape, np.nan, "float32"))
    f(*targs, out)
    return out.numpy()


def check(out, ref, rtol=RTOL):
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert np.all(np.isfinite(out)), "non-finite output"
    err = np.abs(out.astype(np.float64) - ref).max()
    scale = max(np.abs(ref).max(), 1e-30)
    assert err <= rtol * scale, f"max err {err:.3e} > {rtol:.0e} * {scale:.3e} (rel {err / scale:.2e})"


def rng(seed=0):
    return np.random.default_rng(seed)


def randn(r, shape, dtype="float32"):
    return r.standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------------------------------------- names

def test_names_deterministic_and_c_safe():
    n1, f1 = ops.make_kernel("linear", CPU, T=1, N=768, K=768, wdtype="float16", bias=False)
    n2, _ = ops.make_kernel("linear", CPU, N=768, K=768, T=1, wdtype="float16")
    assert n1 == n2 == "linear_t1_n768_k768_f16_b0"
    assert f1.attrs["global_symbol"] == n1
    n3, _ = ops.make_kernel("rmsnorm", CPU, R=1, D=768, eps=1e-6)
    assert n3 == "rmsnorm_r1_d768_eps1em06" and n3.isidentifier()
    names = {ops.make_kernel("rmsnorm", CPU, R=1, D=768, eps=e)[0] for e in (1e-5, 1e-6, 1.5e-5)}
    assert len(names) == 3
    n4, f4 = ops.make_kernel("attention", CPU, T=16, NH=8, KVH=2, D=64)
    assert n4 == "attention_t16_nh8_kvh2_d64" and f4.attrs["global_symbol"] == n4
    for op, p in [("embed", {"T": 1, "V": 10, "D": 8}), ("rope", {"T": 1, "H": 2, "D": 8}), ("add", {"R": 1, "N": 3}),
                  ("swiglu", {"T": 1, "F": 3}), ("copy", {"R": 1, "N": 3})]:
        name, func = ops.make_kernel(op, CPU, **p)
        assert name.isidentifier() and name.startswith(op + "_") and func.attrs["global_symbol"] == name


def test_bad_params():
    with pytest.raises(ValueError):
        ops.make_kernel("nope", CPU, R=1)
    with pytest.raises(ValueError):
        ops.make_kernel("linear", CPU, T=1, N=4)  # missing K
    with pytest.raises(ValueError):
        ops.make_kernel("linear", CPU, T=1, N=4, K=4, wdtype="int8")
    with pytest.raises(ValueError):
        ops.make_kernel("attention", CPU, T=1, NH=6, KVH=4, D=8)
    with pytest.raises(ValueError):
        ops.make_kernel("add", CPU, R=1, N=4, bogus=1)


# ---------------------------------------------------------------------------------------------- linear

LINEAR_SHAPES = [  # (T, N, K)
    (1, 768, 768), (1, 997, 40), (1, 5, 3), (1, 64, 17), (1, 256, 1000),
    (16, 768, 768), (64, 3072, 768), (64, 768, 3072), (32, 997, 40), (7, 33, 17), (2, 3, 5), (5, 130, 64),
    (128, 50, 72), (37, 130, 70),  # x86 prefill: gemm_outer with ragged row blocks / a padded token tile
]


@pytest.mark.parametrize("wdtype", ["float32", "float16"])
@pytest.mark.parametrize("T,N,K", LINEAR_SHAPES)
def test_linear(T, N, K, wdtype):
    r = rng(T * 7 + N + K)
    x, W = randn(r, (T, K)), randn(r, (N, K), wdtype)
    out = run("linear", [x, W], (T, N), T=T, N=N, K=K, wdtype=wdtype)
    check(out, ops.reference("linear", [x, W], T=T, N=N, K=K, wdtype=wdtype))


@pytest.mark.parametrize("wdtype", ["float32", "float16"])
@pytest.mark.parametrize("T,N,K", [(1, 768, 768), (1, 997, 40), (16, 130, 72), (3, 997, 40)])
def test_linear_bias(T, N, K, wdtype):
    r = rng(1)
    x, W, b = randn(r, (T, K)), randn(r, (N, K), wdtype), randn(r, (N,))
    out = run("linear", [x, W, b], (T, N), T=T, N=N, K=K, wdtype=wdtype, bias=True)
    check(out, ops.reference("linear", [x, W, b], T=T, N=N, K=K, wdtype=wdtype, bias=True))


def test_tuned_schedules_do_not_fall_back(caplog):
    """The tuned schedule is generated (no fallback warning) for typical and odd shapes."""
    ops._make_cached.cache_clear()
    with caplog.at_level("WARNING"):
        for cpu in (CPU, ops.CpuInfo(8), ops.CpuInfo(4, 4, "aarch64")):
            for op, p in [("linear", {"T": 1, "N": 997, "K": 40}), ("linear", {"T": 5, "N": 3, "K": 2, "bias": True}),
                          ("attention", {"T": 3, "NH": 2, "KVH": 2, "D": 3}),
                          ("attention", {"T": 64, "NH": 32, "KVH": 8, "D": 128}),
                          ("rmsnorm", {"R": 1, "D": 1, "eps": 1e-5}), ("rope", {"T": 1, "H": 1, "D": 2}),
                          ("embed", {"T": 1, "V": 1, "D": 1}), ("swiglu", {"T": 1, "F": 1}), ("copy", {"R": 1, "N": 1})]:
                ops.make_kernel(op, cpu, **p)
    assert not [r for r in caplog.records if "plain kernel" in r.getMessage()]


def test_attention_other_vector_widths():
    for lanes in (8, 4):
        cpu = ops.CpuInfo(vector_lanes=lanes, num_threads=2)
        for T, NH, KVH, D in [(1, 4, 2, 64), (16, 4, 1, 8), (5, 2, 2, 12)]:
            r = rng(lanes + T)
            for S in (T, T + 29):
                q, k, v = randn(r, (T, NH, D)), randn(r, (S, KVH, D)), randn(r, (S, KVH, D))
                out = run("attention", [q, k, v], (T, NH * D), cpu=cpu, T=T, NH=NH, KVH=KVH, D=D)
                check(out, ops.reference("attention", [q, k, v]))


def test_linear_other_vector_widths():
    """AVX-512-width (16), AVX2-width (8) and NEON-width (4) schedules, run on this CPU (only the lane count
    differs; LLVM splits the wider vectors), with and without GEMV software prefetch (the float GEMV's own
    distance on the 16-lane flavour)."""
    for lanes in (16, 8, 4):
        cpu = ops.CpuInfo(vector_lanes=lanes, num_threads=2, prefetch_bytes=1024 if lanes != 4 else 0,
                          float_prefetch_bytes=8192 if lanes == 16 else None)
        for T, N, K in [(1, 100, 72), (16, 50, 40), (6, 7, 9), (40, 31, 24)]:
            r = rng(lanes + T)
            x, W = randn(r, (T, K)), randn(r, (N, K), "float16")
            out = run("linear", [x, W], (T, N), cpu=cpu, T=T, N=N, K=K, wdtype="float16")
            check(out, ops.reference("linear", [x, W], T=T, N=N, K=K))


# ------------------------------------------------------------------------------------------- attention

ATTN_CONFIGS = [  # (T, NH, KVH, D)
    (1, 12, 12, 64), (1, 8, 2, 64), (1, 4, 1, 128), (1, 4, 4, 8),
    (16, 8, 2, 8), (16, 12, 12, 64), (32, 8, 4, 64), (64, 4, 1, 128), (5, 6, 3, 8), (64, 2, 2, 40),
    (3, 2, 2, 3), (17, 4, 1, 12),
]


@pytest.mark.parametrize("T,NH,KVH,D", ATTN_CONFIGS)
def test_attention(T, NH, KVH, D):
    p = {"T": T, "NH": NH, "KVH": KVH, "D": D}
    r = rng(T + NH + D)
    for S in sorted({T, T + 1, T + 15, T + 16, 100 + T, 333}):  # one compiled kernel, many S
        q, k, v = randn(r, (T, NH, D)), randn(r, (S, KVH, D)), randn(r, (S, KVH, D))
        out = run("attention", [q, k, v], (T, NH * D), **p)
        check(out, ops.reference("attention", [q, k, v], **p))


@pytest.mark.parametrize("T,NH,KVH,D,W", [(1, 8, 4, 64, 0), (16, 8, 2, 16, 0), (5, 4, 1, 8, 0), (16, 4, 2, 16, 7),
                                          (1, 4, 4, 64, 5)])
def test_attention_softcap(T, NH, KVH, D, W):
    """Gemma 2's soft-capped scores (cap * tanh(s / cap)), full and partial chunks, with and without a window; the
    cap is low enough that the scores reach the tanh's flat part (the q's are scaled up), so it changes the output."""
    p = {"T": T, "NH": NH, "KVH": KVH, "D": D, "W": W, "cap": 2.5}
    r = rng(T + D + W)
    for S in sorted({T, T + 9, T + 16, 70 + T}):
        q, k, v = randn(r, (T, NH, D)) * 3, randn(r, (S, KVH, D)), randn(r, (S, KVH, D))
        out = run("attention", [q, k, v], (T, NH * D), **p)
        want = ops.reference("attention", [q, k, v], **p)
        check(out, want)
        if S > 1:   # (one key: its weight is 1 whatever its score)
            assert np.abs(want - ops.reference("attention", [q, k, v], **{**p, "cap": 0.0})).max() > 0.05


@pytest.mark.parametrize("T,NH,KVH,D", [(1, 8, 2, 64), (16, 8, 2, 64), (64, 12, 12, 64), (32, 4, 1, 8)])
def test_attention_long(T, NH, KVH, D):
    p = {"T": T, "NH": NH, "KVH": KVH, "D": D}
    r = rng(3)
    S = 2048
    q, k, v = randn(r, (T, NH, D)), randn(r, (S, KVH, D)), randn(r, (S, KVH, D))
    out = run("attention", [q, k, v], (T, NH * D), **p)
    check(out, ops.reference("attention", [q, k, v], **p))


@pytest.mark.parametrize("T,NH,KVH,D", [(16, 8, 2, 64), (32, 4, 4, 8), (64, 4, 1, 128)])
def test_attention_padded_chunk(T, NH, KVH, D):
    """A padded prefill chunk: only the first `real` of T queries are real tokens; the k/v rows of the
    padded positions hold huge values and must not influence the real queries."""
    p = {"T": T, "NH": NH, "KVH": KVH, "D": D}
    r = rng(5)
    for real, S in [(1, T), (T // 2, T + 37), (T - 3, 500)]:
        q, k, v = randn(r, (T, NH, D)), randn(r, (S, KVH, D)), randn(r, (S, KVH, D))
        pad = slice(S - T + real, S)
        k[pad] = (r.choice([-1.0, 1.0], size=k[pad].shape) * 3e30).astype("float32")
        v[pad] = (r.choice([-1.0, 1.0], size=v[pad].shape) * 3e30).astype("float32")
        out = run("attention", [q, k, v], (T, NH * D), **p)
        # reference for the real queries: the same problem with the padding cut away
        S_real = S - T + real
        ref = ops.reference("attention", [q[:real], k[:S_real], v[:S_real]], T=real, NH=NH, KVH=KVH, D=D)
        check(out[:real], ref)


def test_attention_rows_past_causal_limit_are_not_read():
    """Keys after a query's position (future tokens of the chunk) get garbage; each query must match the
    reference computed on its own causal prefix."""
    T, NH, KVH, D = 8, 4, 2, 64
    r = rng(9)
    S = 40
    q, k, v = randn(r, (T, NH, D)), randn(r, (S, KVH, D)), randn(r, (S, KVH, D))
    base = run("attention", [q, k, v], (T, NH * D), T=T, NH=NH, KVH=KVH, D=D)
    for t in range(T):
        k2, v2 = k.copy(), v.copy()
        k2[S - T + t + 1:] = 1e30
        v2[S - T + t + 1:] = -1e30
        out = run("attention", [q, k2, v2], (T, NH * D), T=T, NH=NH, KVH=KVH, D=D)
        np.testing.assert_array_equal(out[: t + 1], base[: t + 1])


def test_attention_large_logits_stable():
    T, NH, KVH, D = 4, 2, 1, 64
    r = rng(11)
    S = 300
    q, k, v = randn(r, (T, NH, D)) * 30, randn(r, (S, KVH, D)) * 30, randn(r, (S, KVH, D))
    out = run("attention", [q, k, v], (T, NH * D), T=T, NH=NH, KVH=KVH, D=D)
    check(out, ops.reference("attention", [q, k, v], T=T, NH=NH, KVH=KVH, D=D))


# ------------------------------------------------------------------------------------ memory-bound ops

@pytest.mark.parametrize("wdtype", ["float32", "float16"])
@pytest.mark.parametrize("T,V,D", [(1, 997, 768), (16, 997, 40), (64, 32000, 256), (3, 50, 8)])
def test_embed(T, V, D, wdtype):
    r = rng(T + V)
    ids = r.integers(0, V, size=T).astype("int32")
    ids[0] = V - 1
    W = randn(r, (V, D), wdtype)
    out = run("embed", [ids, W], (T, D), T=T, V=V, D=D, wdtype=wdtype)
    check(out, ops.reference("embed", [ids, W], T=T, V=V, D=D, wdtype=wdtype), rtol=0)


@pytest.mark.parametrize("R,D", [(1, 768), (16, 768), (64, 4096), (3, 40), (5, 8), (2, 997), (1, 1)])
def test_rmsnorm(R, D):
    r = rng(R + D)
    x, w = randn(r, (R, D)) * 3, randn(r, (D,))
    for eps in (1e-6, 1e-5):
        out = run("rmsnorm", [x, w], (R, D), R=R, D=D, eps=eps)
        check(out, ops.reference("rmsnorm", [x, w], R=R, D=D, eps=eps))


@pytest.mark.parametrize("T,H,D", [(1, 12, 64), (16, 8, 8), (64, 32, 128), (3, 2, 40), (2, 3, 6)])
def test_rope(T, H, D):
    r = rng(T + H + D)
    x = randn(r, (T, H, D))
    ang = r.uniform(0, 100, size=(T, D // 2))
    c, s = np.cos(ang).astype("float32"), np.sin(ang).astype("float32")
    out = run("rope", [x, c, s], (T, H, D), T=T, H=H, D=D)
    check(out, ops.reference("rope", [x, c, s], T=T, H=H, D=D))


@pytest.mark.parametrize("R,N", [(1, 768), (1, 997), (64, 3072), (7, 5), (1, 1), (64, 768)])
def test_add_copy_swiglu(R, N):
    r = rng(R + N)
    a, b = randn(r, (R, N)) * 4, randn(r, (R, N))
    check(run("add", [a, b], (R, N), R=R, N=N), ops.reference("add", [a, b], R=R, N=N))
    check(run("copy", [a], (R, N), R=R, N=N), ops.reference("copy", [a], R=R, N=N), rtol=0)
    check(run("swiglu", [a, b], (R, N), T=R, F=N), ops.reference("swiglu", [a, b], T=R, F=N))


def test_swiglu_extremes():
    g = np.array([[-200.0, -88.5, -30.0, -1e-3, 0.0, 1e-3, 30.0, 88.5, 200.0, 1e4]], "float32")
    u = np.linspace(-2, 2, g.shape[1]).astype("float32")[None]
    out = run("swiglu", [g, u], g.shape, T=1, F=g.shape[1])
    check(out, ops.reference("swiglu", [g, u], T=1, F=g.shape[1]))


@pytest.mark.parametrize("R,N", [(1, 2048), (7, 5), (64, 640)])
def test_gelu_mul_and_scale(R, N):
    """Gemma's GeGLU (gelu_tanh(g) * u, as g * u * sigmoid(2 sqrt(2/pi) (g + 0.044715 g^3))) and the embedding
    scale, against numpy; the gate's extremes (exp clamped, g^3 overflowing to inf) give finite, exact limits."""
    r = rng(R + N)
    a, b = randn(r, (R, N)) * 4, randn(r, (R, N))
    a.flat[:6] = [-1e4, -200.0, -9.0, 0.0, 9.0, 1e4][:min(6, a.size)]
    out = run("gelu_mul", [a, b], (R, N), T=R, F=N)
    assert np.isfinite(out).all()
    check(out, ops.reference("gelu_mul", [a, b], T=R, F=N))
    check(run("scale", [a], (R, N), R=R, N=N, c=25.298221), ops.reference("scale", [a], R=R, N=N, c=25.298221))
    a.flat[:4] = [-1e30, -40.0, 40.0, 1e30][:min(4, a.size)]   # Gemma 2's final logit soft-capping, saturated too
    out = run("softcap", [a], (R, N), R=R, N=N, c=3.0)
    assert np.isfinite(out).all()
    check(out, ops.reference("softcap", [a], R=R, N=N, c=3.0))


# ------------------------------------------------------------------------------------------- fallbacks

def test_fallback_kernels_are_correct(plain_kernels):
    """If a tuned schedule raises, make_kernel returns the plain version under the same name."""
    cpu = ops.CpuInfo(vector_lanes=16, num_threads=3)  # distinct cache key from the tuned kernels
    r = rng(13)
    x, W, b = randn(r, (3, 40)), randn(r, (33, 40), "float16"), randn(r, (33,))
    out = run("linear", [x, W, b], (3, 33), cpu=cpu, T=3, N=33, K=40, wdtype="float16", bias=True)
    check(out, ops.reference("linear", [x, W, b], bias=True))
    q, k, v = randn(r, (4, 4, 8)), randn(r, (20, 2, 8)), randn(r, (20, 2, 8))
    check(run("attention", [q, k, v], (4, 32), cpu=cpu, T=4, NH=4, KVH=2, D=8),
          ops.reference("attention", [q, k, v]))
    x, w = randn(r, (2, 37)), randn(r, (37,))
    check(run("rmsnorm", [x, w], (2, 37), cpu=cpu, R=2, D=37, eps=1e-5),
          ops.reference("rmsnorm", [x, w], eps=1e-5))
    xr = randn(r, (2, 3, 10))
    c, s = randn(r, (2, 5)), randn(r, (2, 5))
    check(run("rope", [xr, c, s], (2, 3, 10), cpu=cpu, T=2, H=3, D=10), ops.reference("rope", [xr, c, s]))
    ids = np.array([3, 0], "int32")
    We = randn(r, (5, 7), "float16")
    check(run("embed", [ids, We], (2, 7), cpu=cpu, T=2, V=5, D=7, wdtype="float16"),
          ops.reference("embed", [ids, We]))
    for op in ("add", "swiglu"):
        a, bb = randn(r, (2, 9)), randn(r, (2, 9))
        p = {"R": 2, "N": 9} if op == "add" else {"T": 2, "F": 9}
        check(run(op, [a, bb], (2, 9), cpu=cpu, **p), ops.reference(op, [a, bb]))
    ops._make_cached.cache_clear()


def test_no_workspace_for_elementwise_and_gemv():
    """Small kernels keep their scratch on the stack (no TVMBackendAllocWorkspace calls)."""
    for op, p in [("linear", {"T": 1, "N": 64, "K": 768}), ("rmsnorm", {"R": 4, "D": 768, "eps": 1e-5}),
                  ("attention", {"T": 1, "NH": 4, "KVH": 4, "D": 64}), ("swiglu", {"T": 4, "F": 100})]:
        name, func = ops.make_kernel(op, CPU, **p)
        ll = tvm.compile(tvm.IRModule({name: func}), target=TARGET).mod.inspect_source("ll")
        assert "@__TVMBackendAllocWorkspace, align" not in ll, name


def test_compile_time():
    """Each kernel should build in well under a second (checked loosely: shared CI machines are noisy)."""
    for op, p in [("linear", {"T": 64, "N": 768, "K": 768, "wdtype": "float16"}),
                  ("attention", {"T": 32, "NH": 32, "KVH": 8, "D": 128}), ("rmsnorm", {"R": 64, "D": 4096, "eps": 1e-5})]:
        name, func = ops.make_kernel(op, CPU, **p)
        t0 = time.perf_counter()
        tvm.compile(tvm.IRModule({name: func}), target=TARGET)
        assert time.perf_counter() - t0 < 2.0, name


@pytest.mark.parametrize("N,K,bias", [(8, 64, False), (60, 2048, False), (64, 200, True)])
def test_rowwise_linear_is_the_decode_gemv_per_token(N, K, bias):
    """The MoE router's GEMM at T > 1 (rowwise): each token's outputs bitwise the T = 1 GEMV's, so a verify pass
    routes a draft to the experts its decode step would pick; the plain GEMM sums in another order (K = 2048 and
    its parallel row blocks included)."""
    r = rng(5)
    x, W, b = randn(r, (8, K)), randn(r, (N, K)), randn(r, (N,))
    args = [x, W, b] if bias else [x, W]
    got = run("linear", args, (8, N), T=8, N=N, K=K, bias=bias, rowwise=True)
    for t in range(8):
        one = run("linear", [x[t:t + 1], *args[1:]], (1, N), T=1, N=N, K=K, bias=bias)
        assert np.array_equal(got[t], one[0]), t
    check(got, ops.reference("linear", args, bias=bias))
    assert build("linear", T=8, N=N, K=K, bias=bias, rowwise=True)[0].endswith("_rowwise1")


def test_attention_kv_length_is_symbolic_int64():
    _, func = ops.make_kernel("attention", CPU, T=4, NH=4, KVH=2, D=8)
    S = func.params[1].ty.shape[0]
    assert str(S) == "S" and str(S.ty) == "int64"
    assert func.params[2].ty.shape[0].same_as(S)


def test_many_kernels_in_one_module():
    """The lowering code compiles all kernels of a package into one module."""
    specs = [("linear", {"T": 1, "N": 64, "K": 48, "wdtype": "float16"}), ("linear", {"T": 16, "N": 64, "K": 48}),
             ("rmsnorm", {"R": 16, "D": 48, "eps": 1e-5}), ("attention", {"T": 16, "NH": 4, "KVH": 2, "D": 8}),
             ("attention", {"T": 1, "NH": 4, "KVH": 2, "D": 8}), ("swiglu", {"T": 16, "F": 40}), ("add", {"R": 16, "N": 48})]
    funcs = dict(ops.make_kernel(op, CPU, **p) for op, p in specs)
    assert len(funcs) == len(specs)
    mod = tvm.compile(tvm.IRModule(funcs), target=TARGET).jit()
    r = rng(21)
    x, W = randn(r, (16, 48)), randn(r, (64, 48))
    out = tvm.runtime.tensor(np.zeros((16, 64), "float32"))
    mod["linear_t16_n64_k48_f32_b0"](tvm.runtime.tensor(x), tvm.runtime.tensor(W), out)
    check(out.numpy(), ops.reference("linear", [x, W]))
    q, k, v = randn(r, (1, 4, 8)), randn(r, (30, 2, 8)), randn(r, (30, 2, 8))
    out = tvm.runtime.tensor(np.zeros((1, 32), "float32"))
    mod["attention_t1_nh4_kvh2_d8"](*[tvm.runtime.tensor(a) for a in (q, k, v)], out)
    check(out.numpy(), ops.reference("attention", [q, k, v]))


def test_aarch64_neon_kernels_build():
    """The NEON flavour (4 lanes) lowers and compiles for aarch64 (not run here)."""
    cpu = ops.CpuInfo(vector_lanes=4, num_threads=4, arch="aarch64")
    target = tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"], "num-cores": 4})
    funcs = dict(ops.make_kernel(op, cpu, **p) for op, p in [
        ("linear", {"T": 1, "N": 96, "K": 72, "wdtype": "float16"}), ("linear", {"T": 16, "N": 97, "K": 40, "bias": True}),
        ("attention", {"T": 16, "NH": 8, "KVH": 2, "D": 64}), ("rmsnorm", {"R": 4, "D": 72, "eps": 1e-5}),
        ("rope", {"T": 4, "H": 2, "D": 64}), ("embed", {"T": 4, "V": 100, "D": 64, "wdtype": "float16"}),
        ("swiglu", {"T": 4, "F": 300}), ("copy", {"R": 3, "N": 5})])
    asm = tvm.compile(tvm.IRModule(funcs), target=target).mod.inspect_source("asm")
    assert "fmla" in asm and "fcvtl" in asm


# ------------------------------------------------------------------------------------------- key segments
@pytest.mark.parametrize("nt,NH,KVH,want", [(2, 9, 3, (3, 2)), (2, 15, 5, (3, 2)), (2, 32, 4, (8, 0)), (2, 14, 2, (7, 0)),
                                            (2, 4, 1, (2, 0)), (4, 4, 1, (1, 0)), (4, 14, 2, (7, 2)), (8, 9, 3, (3, 8)),
                                            (2, 32, 32, (1, 0))])
def test_decode_blocking(nt, NH, KVH, want):
    """Decode's head blocks are divisors of the GQA group (7 heads of Qwen2.5-0.5B's read each K/V chunk once, not
    seven times) that spread evenly over the threads; where none does (SmolLM2's 3 kv heads on 2 threads), the
    largest block and the fewest key segments that even the tasks out."""
    from edgellm.compiler.ops.attention import decode_blocking
    assert decode_blocking(nt, NH, KVH) == want


SEGMENT_CASES = [(NH, KVH, D, P, kind) for NH, KVH, D, P in [(9, 3, 64, 2), (4, 1, 32, 4), (14, 2, 16, 3), (6, 3, 16, 8),
                                                             (14, 2, 16, 0)]
                 for kind in ("float32", "float16", "q8", "q4")]


@pytest.mark.parametrize("NH,KVH,D,P,kind", [c if c[4] == "float32" or c[:4] == (9, 3, 64, 2) else
                                             pytest.param(*c, marks=pytest.mark.slow) for c in SEGMENT_CASES])
def test_attention_key_segments(NH, KVH, D, P, kind):
    """P key segments: decode runs them as tasks and folds them in order; a prefill chunk's and a verify tree's rows
    close the same segments inside their chunk loops, so each row is bitwise the decode step's at its position (short
    rows, one segment, included); all within float tolerance of the reference; P = 0 names the kernel as before (and
    14 heads on 2 kv heads decode in blocks of 7)."""
    from edgellm.quant.kv_cache import KV_ROUND, cache_rows
    r = rng(NH * 100 + P)
    T, parents = 8, [-1, 0, 0, 1, 1, 2, 3, 6]
    tr = tree_rows(parents)
    quantized = kind in ("q8", "q4")
    kv = {} if kind == "float32" else {"kv": kind}

    def cache(x):   # what the kernel reads, and the f32 values it stands for
        return (cache_rows(kind, x), KV_ROUND[kind](x)) if quantized else (x.astype(kind), x.astype(kind).astype("float32"))

    for prefix in (3, 70, 130, 300):
        S = prefix + T
        q = randn(r, (T, NH, D))
        (k, kf), (v, vf) = cache(randn(r, (S, KVH, D))), cache(randn(r, (S, KVH, D)))
        got = run("attention", [q, k, v, tr], (T, NH * D), T=T, NH=NH, KVH=KVH, D=D, M=True, P=P, **kv)
        check(got, ops.reference("attention", [q, kf, vf, tr], T=T, NH=NH, KVH=KVH, D=D, M=True), rtol=2e-5)
        for t in range(T):
            path = prefix + np.array(tr[1 + t][:tr[0, t] + 1])
            kk, vv = (np.concatenate([a[:prefix], a[path]]) for a in (k, v))
            one = run("attention", [q[t:t + 1], kk, vv], (1, NH * D), T=1, NH=NH, KVH=KVH, D=D, P=P, **kv)
            assert np.array_equal(one[0], got[t]), (prefix, t)
        chunk = run("attention", [q, k, v], (T, NH * D), T=T, NH=NH, KVH=KVH, D=D, P=P, **kv)
        for t in (0, T - 1):
            one = run("attention", [q[t:t + 1], k[:prefix + t + 1], v[:prefix + t + 1]], (1, NH * D), T=1, NH=NH,
                      KVH=KVH, D=D, P=P, **kv)
            assert np.array_equal(one[0], chunk[t]), (prefix, t)
    assert ops.make_kernel("attention", CPU, T=1, NH=NH, KVH=KVH, D=D, P=P)[0].endswith(f"_split{P}" if P else "_d16")
    assert ops.make_kernel("attention", CPU, T=1, NH=NH, KVH=KVH, D=D, P=0)[0] == f"attention_t1_nh{NH}_kvh{KVH}_d{D}"


@pytest.mark.parametrize("kind", ("float32", "float16"))
def test_decode_attention_prefetches_the_next_chunk(kind):
    """Decode and a verify pass's tree read the cache from memory: on targets that prefetch the weight stream their
    chunk loops prefetch the next chunk's K/V rows (a hint: the same bits without it); prefill kernels (compute-bound,
    each chunk shared by up to a chunk of rows) do not."""
    from dataclasses import replace
    off = replace(CPU, prefetch_bytes=0)
    r = rng(5)
    for NH, KVH, P in ((9, 3, 2), (8, 2, 0)):   # key segments as tasks (SmolLM2 on 2 threads), and head blocks
        S = 300
        q, k, v = randn(r, (1, NH, 64)), randn(r, (S, KVH, 64)).astype(kind), randn(r, (S, KVH, 64)).astype(kind)
        p = dict(T=1, NH=NH, KVH=KVH, D=64, P=P, **({} if kind == "float32" else {"kv": kind}))
        assert "llvm.prefetch" in ops.make_kernel("attention", CPU, **p)[1].script()
        assert "llvm.prefetch" not in ops.make_kernel("attention", off, **p)[1].script()
        for loc in (3, 2):   # into the cache level the target names (AMD hosts: L2)
            s = ops.make_kernel("attention", replace(CPU, kv_prefetch_locality=loc), **p)[1].script()
            assert set(re.findall(r'"llvm.prefetch", T.address_of\(.*\), 0, (\d), 1\)', s)) == {str(loc)}, loc
        got = run("attention", [q, k, v], (1, NH * 64), **p)
        assert np.array_equal(got, run("attention", [q, k, v], (1, NH * 64), cpu=off, **p))
        check(got, ops.reference("attention", [q, k.astype("float32"), v.astype("float32")], T=1, NH=NH, KVH=KVH, D=64))
    assert "llvm.prefetch" not in ops.make_kernel("attention", CPU, T=8, NH=9, KVH=3, D=64, P=2)[1].script()
    p = dict(T=8, NH=9, KVH=3, D=64, P=2, M=True, **({} if kind == "float32" else {"kv": kind}))
    assert "llvm.prefetch" in ops.make_kernel("attention", CPU, **p)[1].script()
    tr = tree_rows([-1, 0, 0, 1, 1, 2, 3, 6])
    q, k, v = randn(r, (8, 9, 64)), randn(r, (300, 3, 64)).astype(kind), randn(r, (300, 3, 64)).astype(kind)
    got = run("attention", [q, k, v, tr], (8, 9 * 64), **p)
    assert np.array_equal(got, run("attention", [q, k, v, tr], (8, 9 * 64), cpu=off, **p))


@pytest.mark.parametrize("op,extra", [("linear_q4", {"G": 32}), ("linear_q8", {}), ("linear_t2", {})])
def test_quantized_stream_prefetch_locality(op, extra):
    """The quantized GEMVs and small-batch GEMMs prefetch their weight stream where the target says, each kind its own
    level (targets.registry.host_prefetch: Intel hosts both into L2; AMD the GEMVs into L1, the GEMMs into L2)."""
    from dataclasses import replace
    for T in (1, 8):
        p = dict(T=T, N=256, K=512, bias=False, **extra)
        for loc in (3, 2):
            cpu = replace(CPU, prefetch_locality=loc, batch_prefetch_locality=5 - loc)
            s = ops.make_kernel(op, cpu, **p)[1].script()
            want = loc if T == 1 else 5 - loc
            assert set(re.findall(r'"llvm.prefetch", T.address_of\(.*\), 0, (\d), 1\)', s)) == {str(want)}, (T, loc)
    from edgellm.targets.registry import host_is_intel, host_prefetch
    pf = host_prefetch()
    assert (pf["prefetch_locality"], pf["batch_prefetch_locality"], pf["kv_prefetch_locality"]) == \
        ((2, 2, 3) if host_is_intel() else (3, 2, 2))


def test_vector_reductions_are_the_scalar_trees_bitwise():
    """vhsum / vhmax (attention's softmax sums and maxima as vector shuffles) combine the pairs _tree combines, level by
    level: the same bits as hsum / hmax, and as a float32 pairwise tree in numpy (values spread over 12 decades, so
    any other association rounds differently); n not a power of two falls back to the scalar tree."""
    from tvm.script import tirx as T

    from edgellm.compiler.ops._util import hmax, hsum, vhmax, vhsum

    def pairwise(v, op):
        v = list(v)
        while len(v) > 1:
            v = [op(v[i], v[i + 1]) for i in range(0, len(v) - 1, 2)] + ([v[-1]] if len(v) % 2 else [])
        return v[0]

    def kernel(n):
        @T.prim_func
        def red(a: T.Buffer((n,), "float32"), o: T.Buffer((4,), "float32")):
            T.func_attr({"global_symbol": "red", "tir.noalias": True})
            o[0] = hsum(a, n)
            o[1] = vhsum(a, n)
            o[2] = hmax(a, n)
            o[3] = vhmax(a, n)
        return red

    for n in (16, 8, 6):
        red = kernel(n)
        f = tvm.compile(tvm.IRModule({"red": red}), target=TARGET).jit()["red"]
        r = rng(n)
        for _ in range(20):
            a = (r.standard_normal(n) * 10.0 ** r.integers(-6, 6, n)).astype(np.float32)
            out = tvm.runtime.tensor(np.zeros(4, np.float32))
            f(tvm.runtime.tensor(a), out)
            got = out.numpy()
            want = pairwise([np.float32(x) for x in a], lambda x, y: np.float32(x + y))
            assert got[0].tobytes() == got[1].tobytes() == np.float32(want).tobytes(), (n, got, want)
            assert got[2] == got[3] == a.max()


# ------------------------------------------------------------------------------------------- token trees (verify)
def tree_rows(parents):
    """int32 [T + 1, T] of a token tree (parents[i] < i; node 0 the root): depths, then each node's ancestors by
    depth (runtime/contract.h EL_PROGRAM_TREE)."""
    T = len(parents)
    tab = np.zeros((T + 1, T), np.int32)
    anc = []
    for i, p in enumerate(parents):
        anc.append((anc[p] if p >= 0 else []) + [i])
        tab[0, i] = len(anc[i]) - 1
        tab[1 + i, :len(anc[i])] = anc[i]
    return tab


TREES = [(8, 4, 2, 16, 0, 37, [-1, 0, 0, 1, 1, 2, 3, 6]),
         (8, 8, 2, 64, 0, 100, [-1, 0, 1, 2, 3, 4, 5, 6]),
         (16, 4, 4, 32, 0, 5, [-1, 0, 0, 0, 1, 1, 2, 3, 4, 4, 5, 6, 7, 8, 9, 10]),
         (8, 4, 2, 16, 20, 60, [-1, 0, 0, 1, 1, 2, 3, 6]),   # a sliding window follows each row's depth
         (32, 4, 2, 16, 0, 3, [-1] + [(i - 1) // 2 for i in range(1, 32)]),
         (8, 9, 3, 64, 0, 40, [-1, 0, 0, 0, 0, 0, 0, 0]),   # full chunks hold the batch's rows
         (8, 4, 2, 16, 5, 30, [-1, 0, 1, 2, 2, 2, 3, 4]),   # a window shorter than the tree
         (8, 4, 2, 16, 0, 0, [-1, 0, 0, 1, 1, 2, 3, 6])]


@pytest.mark.parametrize("T,NH,KVH,D,W,prefix,parents", TREES)
def test_attention_and_rope_over_a_token_tree(T, NH, KVH, D, W, prefix, parents):
    """The verify program's tree variants: a row sees the keys before the batch and its ancestors' in it, at the
    position of its depth; a chain is exactly causal attention."""
    r = rng(11)
    S = prefix + T
    q, k, v = randn(r, (T, NH, D)), randn(r, (S, KVH, D)), randn(r, (S, KVH, D))
    tr = tree_rows(parents)
    p = dict(T=T, NH=NH, KVH=KVH, D=D, W=W, M=True)
    got = run("attention", [q, k, v, tr], (T, NH * D), **p)
    check(got, ops.reference("attention", [q, k, v, tr], **p))
    for t in range(T):   # bitwise what the decode kernel computes at the row's position over its path's keys
        path, n0 = list(tr[1 + t][:tr[0, t] + 1]), prefix
        kk, vv = (np.concatenate([a[:n0], a[n0 + np.array(path)]]) for a in (k, v))
        one = run("attention", [q[t:t + 1], kk, vv], (1, NH * D), T=1, NH=NH, KVH=KVH, D=D, W=W)
        assert np.array_equal(one[0], got[t]), t
    chain = tree_rows([-1] + list(range(T - 1)))
    check(run("attention", [q, k, v, chain], (T, NH * D), **p),
          ops.reference("attention", [q, k, v], T=T, NH=NH, KVH=KVH, D=D, W=W))
    x, c, s = randn(r, (T, NH, D)), randn(r, (T, D // 2)), randn(r, (T, D // 2))
    rot = run("rope", [x, c, s, tr], (T, NH, D), T=T, H=NH, D=D, P=True)
    check(rot, ops.reference("rope", [x, c, s, tr], T=T, H=NH, D=D, P=True))
    if any(p != i - 1 for i, p in enumerate(parents)):   # a branch: some row rotates by another row than its own
        assert np.abs(rot - ops.reference("rope", [x, c, s], T=T, H=NH, D=D)).max() > 0.1
    assert ops.make_kernel("attention", CPU, **p)[0].endswith("_tree1")
    assert ops.make_kernel("rope", CPU, T=T, H=NH, D=D)[0] == f"rope_t{T}_h{NH}_d{D}"
    # the verify program's variant (rows): a pass of n real rows computes those bitwise, and zeros past them
    _, f = build("attention", CPU, **p, rows=True)
    for n in sorted({1, 3, T - 1, T}):
        out = tvm.runtime.tensor(np.full((T, NH * D), np.nan, "float32"))
        cnt = np.zeros((1, 16), np.int32)
        cnt[0, 0] = n
        f(*(tvm.runtime.tensor(np.ascontiguousarray(a)) for a in (q, k, v, tr)), out, tvm.runtime.tensor(cnt))
        assert np.array_equal(out.numpy()[:n], got[:n]) and (out.numpy()[n:] == 0).all(), n
