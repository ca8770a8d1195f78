"""Correctness of the quantized linear kernels (linear_q8 / linear_q4 / linear_q6 / linear_t2 / linear_t2_lut) on the
host CPU.

Each kernel is built with tvm.compile for the host LLVM target and compared with the scheme's exact numpy model
(quant/packing.py: int8 activation quantization emulated bit-exactly, integer block sums exact): the kernels
differ from it only by f32 rounding of the scale products and the float summation order, so the bound is
max |out - ref| <= 1e-5 * max |ref|.
"""
from __future__ import annotations

import functools
import logging

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from edgellm.compiler import ops  # noqa: E402
from edgellm.quant import get_scheme, packing, q4, q6, q8  # noqa: E402

NUM_THREADS = 2
CPU = ops.host_cpu_info(NUM_THREADS)
TARGET = ops.llvm_target(NUM_THREADS)
RTOL = 1e-5
SCHEME_OF = {"linear_q8": "q8", "linear_q6": "q6", "linear_t2": "t2", "linear_t2_lut": "t2"}


@functools.cache
def _build(op: str, cpu: ops.CpuInfo, items: tuple):
    name, func = ops.make_kernel(op, cpu, **dict(items))
    return name, tvm.compile(tvm.IRModule({name: func}), target=TARGET).jit()[name]


def build(op, cpu=CPU, **params):
    return _build(op, cpu, tuple(sorted(params.items())))


def call(f, arrays, T, N):
    out = tvm.runtime.tensor(np.full((T, N), np.nan, "float32"))
    f(*[tvm.runtime.tensor(np.ascontiguousarray(a)) for a in arrays], out)
    return out.numpy()


def check(out, ref, rtol=RTOL):
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert np.all(np.isfinite(out)), "non-finite output"
    err = np.abs(out.astype(np.float64) - ref).max()
    scale = max(np.abs(ref).max(), 1e-30)
    assert err <= rtol * scale, f"max err {err:.3e} > {rtol:.0e} * {scale:.3e} (rel {err / scale:.2e})"


def problem(op, T, N, K, G=32, bias=False, seed=0):
    """(scheme, arrays in kernel order, kernel params)."""
    r = np.random.default_rng(seed + 7 * T + N + K)
    scheme = get_scheme(f"q4g{G}" if op == "linear_q4" else SCHEME_OF[op])
    w = (r.standard_normal((N, K)) * 0.05).astype(np.float32)
    x = r.standard_normal((T, K)).astype(np.float32)
    x[:, ::17] *= 20.0                                  # outlier channels
    if T > 2:
        x[1] = 0.0                                      # an all-zero token (clamped absmax)
    parts = scheme.quantize(w)
    arrays = [x] + [parts[k] for k in scheme.part_order]
    if bias:
        arrays.append(r.standard_normal(N).astype(np.float32))
    p = {"T": T, "N": N, "K": K, "bias": bias}
    if op == "linear_q4":
        p["G"] = G
    return scheme, arrays, p


def run_check(op, T, N, K, G=32, bias=False, cpu=CPU, seed=0):
    scheme, arrays, p = problem(op, T, N, K, G, bias, seed)
    _, f = build(op, cpu, **p)
    out = call(f, arrays, T, N)
    ref = ops.reference(op, arrays, **p)
    check(out, ref)
    # the scheme's own oracle is the same function
    b = arrays[-1] if bias else None
    np.testing.assert_array_equal(ref, scheme.reference_linear(arrays[0], dict(zip(scheme.part_order, arrays[1:3])),
                                                               bias=b))


OPS_Q = ["linear_q8", "linear_q4", "linear_q6", "linear_t2", "linear_t2_lut"]
SHAPES = [  # (T, N, K): decode and prefill; N multiple of 16 or not (tail panel); K = 64, 768, 2048, and 800
    # (t2: 50 chunks per row, not a multiple of the AVX2 int16 flush interval)
    (1, 64, 64), (1, 37, 768), (1, 100, 2048), (16, 48, 768), (32, 53, 2048), (16, 7, 64), (1, 20, 800), (5, 20, 800)]


@pytest.mark.parametrize("T,N,K", SHAPES)
@pytest.mark.parametrize("op", OPS_Q)
def test_quant_linear(op, T, N, K):
    run_check(op, T, N, K)


@pytest.mark.parametrize("G", [64, 128])
@pytest.mark.parametrize("T,N,K", [(1, 40, 768), (16, 33, 2048)])
def test_q4_group_sizes(G, T, N, K):
    run_check("linear_q4", T, N, K, G=G)


@pytest.mark.parametrize("op", OPS_Q)
@pytest.mark.parametrize("T,N,K", [(1, 33, 128), (5, 16, 64)])
def test_quant_linear_bias(op, T, N, K):
    run_check(op, T, N, K, bias=True)


@pytest.mark.parametrize("lanes", [8, 4])
def test_other_vector_widths(lanes):
    """AVX2 flavour (8 lanes: vpmaddubsw / pshufb; q8 with the sign trick) and the plain-TIR flavour (4 lanes),
    run on this CPU."""
    cpu = ops.CpuInfo(vector_lanes=lanes, num_threads=2)
    for op in OPS_Q:
        for T, N, K in [(1, 37, 128), (3, 20, 64)]:
            if lanes == 4 and op == "linear_t2_lut" and T > 1:
                continue  # plain LUT lookups are 64 scalar loads each: slow to compile, same code as T = 1
            run_check(op, T, N, K, cpu=cpu)


def test_activation_rounding_ties_match():
    """x * 127 / amax hitting exact .5 values: kernels round half to even like the numpy model."""
    K = 64
    x = np.zeros((2, K), np.float32)
    x[:, 0] = 127.0
    x[:, 1:9] = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 126.5]
    x[:, 32] = 127.0
    x[:, 33:36] = [4.5, -4.5, 5.5]
    for op in OPS_Q:
        scheme, arrays, p = problem(op, 2, 16, K)
        arrays[0] = x
        _, f = build(op, **p)
        check(call(f, arrays, 2, 16), ops.reference(op, arrays, **p))


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("T", [1, 3])
def test_int16_accumulation_at_its_limit(T, sign):
    """Largest codes times full-scale activations everywhere: the AVX2 kernels' int16 partial sums reach their
    bound (t2: 32512 in the 4x-scaled accumulator; q4: 8 * 2 * 15 * 127 = 30480 per block) and must not wrap."""
    N, K = 32, 2048
    x = np.full((T, K), sign, np.float32)
    for op in OPS_Q:
        scheme, arrays, p = problem(op, T, N, K)
        arrays[0] = x
        arrays[1] = scheme.quantize(np.ones((N, K), np.float32))[scheme.part_order[0]]
        arrays[2] = scheme.quantize(np.ones((N, K), np.float32))[scheme.part_order[1]]
        _, f = build(op, **p)
        ref = ops.reference(op, arrays, **p)
        assert np.allclose(np.abs(ref), K, rtol=0.02), ref[0, :4]   # the limit case really is one
        check(call(f, arrays, T, N), ref)


def test_fallback_kernels_are_correct(plain_kernels):
    """A schedule failure returns the plain kernel (same layout, same math) under the same name."""
    cpu = ops.CpuInfo(vector_lanes=16, num_threads=3)  # distinct cache key from the tuned kernels
    for op in OPS_Q:
        for T, N, K, bias in [(1, 37, 64, False), (3, 16, 128, True)]:
            run_check(op, T, N, K, bias=bias, cpu=cpu)
    name, _ = ops.make_kernel("linear_q4", cpu, T=1, N=37, K=64, G=32)
    assert name == "linear_q4_t1_n37_k64_g32_b0"


def test_names_and_params():
    n, f = ops.make_kernel("linear_q4", CPU, T=1, N=4096, K=4096, G=128)
    assert n == "linear_q4_t1_n4096_k4096_g128_b0" and f.attrs["global_symbol"] == n
    assert ops.make_kernel("linear_q4", CPU, T=1, N=64, K=64)[0] == "linear_q4_t1_n64_k64_g32_b0"  # G defaults to 32
    assert ops.make_kernel("linear_t2_lut", CPU, T=16, N=64, K=64, bias=True)[0] == "linear_t2_lut_t16_n64_k64_b1"
    assert ops.make_kernel("linear_q8", CPU, T=1, N=3, K=32)[0] == "linear_q8_t1_n3_k32_b0"
    for op, p in [("linear_q4", {"T": 1, "N": 8, "K": 40}), ("linear_q4", {"T": 1, "N": 8, "K": 64, "G": 16}),
                  ("linear_q8", {"T": 1, "N": 8, "K": 48}), ("linear_q6", {"T": 1, "N": 8, "K": 48}),
                  ("linear_t2", {"T": 1, "N": 8, "K": 40}),
                  ("linear_t2_lut", {"T": 1, "N": 8, "K": 8})]:
        with pytest.raises(ValueError):
            ops.make_kernel(op, CPU, **p)
    # arg order: x, parts..., [b], out
    _, f = ops.make_kernel("linear_q4", CPU, T=1, N=16, K=64, G=32, bias=True)
    assert [(str(v.ty.dtype), tuple(int(d) for d in v.ty.shape)) for v in f.params] == [
        ("float32", (1, 64)), ("uint8", (16, 32)), ("float16", (16, 2)), ("float32", (16,)), ("float32", (1, 16))]
    assert len(ops.make_kernel("linear_t2", CPU, T=1, N=16, K=64)[1].params) == 4
    _, f = ops.make_kernel("linear_q6", CPU, T=1, N=16, K=64)
    assert [(str(v.ty.dtype), tuple(int(d) for d in v.ty.shape)) for v in f.params] == [
        ("float32", (1, 64)), ("uint8", (16, 48)), ("float16", (16, 2)), ("float32", (1, 16))]


def test_tuned_schedules_do_not_fall_back(caplog):
    ops._make_cached.cache_clear()
    with caplog.at_level(logging.WARNING):
        for cpu in (CPU, ops.CpuInfo(8), ops.CpuInfo(4, 4, "aarch64")):
            for op in OPS_Q:
                for T, N in [(1, 37), (16, 64)]:
                    ops.make_kernel(op, cpu, T=T, N=N, K=128, bias=True)
    assert not [r for r in caplog.records if "plain kernel" in r.getMessage()]


def test_schemes_through_the_lowering_interface():
    """What the lowering does: quantize, linear_kernel -> make_kernel, args in part_order; equals reference_linear
    (f32 / f16 included)."""
    r = np.random.default_rng(11)
    T, N, K = 4, 40, 128
    w = r.standard_normal((N, K)).astype(np.float32)
    x = r.standard_normal((T, K)).astype(np.float32)
    b = r.standard_normal(N).astype(np.float32)
    for name in ("f32", "f16", "q8", "q4g32", "q4g64", "q4g128", "q6", "t2"):
        s = get_scheme(name)
        parts = s.quantize(w)
        op, p = s.linear_kernel(T, N, K, bias=True)
        _, f = build(op, **p)
        out = call(f, [x] + [parts[k] for k in s.part_order] + [b], T, N)
        check(out, s.reference_linear(x, parts, bias=b))


def test_aarch64_build():
    """NEON flavour (plain integer TIR; LUT via tbl) lowers and compiles for aarch64 (not run here)."""
    cpu = ops.CpuInfo(vector_lanes=4, num_threads=4, arch="aarch64")
    target = tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"], "num-cores": 4})
    funcs = dict(ops.make_kernel(op, cpu, T=T, N=37, K=64) for op in OPS_Q for T in (1, 8))
    asm = tvm.compile(tvm.IRModule(funcs), target=target).mod.inspect_source("asm")
    assert "\ttbl\t" in asm


def test_vnni_instructions_emitted():
    if ops.linear_quant.path_for(CPU) != "vnni":
        pytest.skip("host is not AVX-512")
    name, func = ops.make_kernel("linear_q4", CPU, T=1, N=64, K=128)
    asm = tvm.compile(tvm.IRModule({name: func}), target=TARGET).mod.inspect_source("asm")
    assert "vpdpbusd" in asm
    assert packing.NR == 16


# ------------------------------------------------------------------------------- quantized embedding, relu2

EMBED_CASES = [("q8", 1, 997, 64), ("q8", 16, 40, 32), ("q8", 3, 16, 8), ("q8", 5, 1001, 96), ("q4g32", 1, 997, 64),
               ("q4g64", 16, 40, 128), ("q4g128", 3, 16, 256), ("q4g32", 5, 1001, 96), ("q6", 1, 997, 64),
               ("q6", 16, 40, 128), ("q6", 5, 1001, 96)]


@pytest.mark.parametrize("head,T,V,D", EMBED_CASES)
def test_quantized_embed_gathers_the_dequantized_rows(head, T, V, D):
    """embed_q8/q4/q6 read their panel layouts (q4/q6: panel-interleaved f16 group scales; a tail panel when
    V % 16 != 0) and equal the dequantized table exactly."""
    r = np.random.default_rng(V + D)
    scheme, w = get_scheme(head), r.standard_normal((V, D)).astype(np.float32)
    # packing directly: the scheme's shape check wants K % 32 for q8, embed_q8 only D % 4
    parts = q4.quantize_q4(w, scheme.group) if head.startswith("q4") else {"q8": q8.quantize_q8, "q6": q6.quantize_q6}[head](w)
    ids = r.integers(0, V, size=T).astype(np.int32)
    ids[0] = V - 1
    op, params = scheme.embed_kernel(T, V, D)
    args = [ids, parts["qweight"], parts["scales"]]
    out = call(build(op, **params)[1], args, T, D)
    np.testing.assert_array_equal(out, scheme.dequantize(parts)[ids])
    np.testing.assert_array_equal(out, ops.reference(op, args))


def test_relu2_mul():
    r = np.random.default_rng(1)
    g, u = (r.standard_normal((7, 37)) * 3).astype(np.float32), r.standard_normal((7, 37)).astype(np.float32)
    check(call(build("relu2_mul", T=7, F=37)[1], [g, u], 7, 37), ops.reference("relu2_mul", [g, u]))


@pytest.mark.parametrize("scheme_name", ["q4g32", "q4m32", "q8g32", "q8", "q6"])
def test_avx2_half_tiles_are_bitwise_the_full_tiles(scheme_name, monkeypatch):
    """AVX2 GEMM tiles run the 16-row panel as two 8-row halves (linear_block.SPLIT_HALVES): the same integer sums and
    the same f32 epilogue per output, so the same bits as the 16-row tiles, and each token's row the bits of the
    decode GEMV (speculation's verify rows must be decode's rows). Ragged panels (N = 37), a bias, tiles of 2..8."""
    from edgellm.compiler.ops import linear_block

    cpu = ops.CpuInfo(vector_lanes=8, num_threads=2)   # the AVX2 kernels, on any x86 host
    scheme = get_scheme(scheme_name)
    r = np.random.default_rng(5)
    N, K = 37, 256
    w = (r.standard_normal((N, K)) * 0.05).astype(np.float32)
    parts = scheme.quantize(w)
    bias = r.standard_normal(N).astype(np.float32)

    def run(T, x, split):
        monkeypatch.setattr(linear_block, "SPLIT_HALVES", split)
        op, p = scheme.linear_kernel(T, N, K, bias=True)
        ops._make_cached.cache_clear()   # the kernel cache keys on (op, cpu, params), not on the switch
        name, func = ops.make_kernel(op, cpu, **p)
        f = tvm.compile(tvm.IRModule({name: func}), target=TARGET).jit()[name]
        return call(f, [x] + [parts[k] for k in scheme.part_order] + [bias], T, N)

    x = r.standard_normal((8, K)).astype(np.float32)
    x[:, ::13] *= 30.0
    decode = np.concatenate([run(1, x[t:t + 1], True) for t in range(8)])
    for T in (2, 3, 6, 8):
        half, full = run(T, x[:T], True), run(T, x[:T], False)
        np.testing.assert_array_equal(half, full)
        np.testing.assert_array_equal(half, decode[:T])
    ops._make_cached.cache_clear()
