"""Schemes as kernel traits: a packed scheme declares what its kernels read (quant/scheme.py KernelTraits) and the
compiler builds its op params, checks, references and CPU / OpenCL kernels from that, with no scheme name in
compiler/. Shown by registering, in this test only, a scheme no compiler file knows: llama.cpp's Q8_0 layout (int8
codes in q8's chunks, one f16 scale per group of 32, q4's panel-interleaved scale layout), whose kernels come out
of the existing block family and must match its own numpy model."""
from __future__ import annotations

import logging
import pathlib
import re

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from edgellm.compiler import ops  # noqa: E402
from edgellm.compiler.opencl import ops as cl_ops  # noqa: E402
from edgellm.quant import SCHEMES, scheme as scheme_mod  # noqa: E402
from edgellm.quant.packing import (QA, _bias, _block_sums, pack_codes, pack_group_scales,  # noqa: E402
                                   quantize_act_blocks, unpack_codes, unpack_group_scales)
from edgellm.quant.scheme import KERNEL_OPS, KernelTraits, Scheme, register  # noqa: E402

TARGET = ops.llvm_target(2)


class Q8Group(Scheme):
    name = "q8g32_test"
    bits_per_weight = 8 + 16 / 32
    description = "int8 per group of 32 along K, f16 scale per group (llama.cpp Q8_0)"
    parts = ("qweight", "scales")
    k_multiple, k_multiple_why = QA, "the group size 32"
    stacking = {"qweight": 4, "scales": 1}
    kernel_ops = {"linear_q8g_test": KernelTraits("linear", "block", "q8", "group", "block", k_multiple=QA,
                                                  groups=(32,))}

    def _quantize(self, w):
        N, K = w.shape
        wg = w.reshape(N, K // 32, 32)
        d = (np.abs(wg).max(-1) / 127).astype(np.float16)
        df = d.astype(np.float32)
        q = np.clip(np.rint(wg / np.where(df > 0, df, 1)[..., None]), -127, 127).reshape(N, K).astype(np.int16)
        return {"qweight": pack_codes((q + 128).astype(np.uint8), "q8"), "scales": pack_group_scales(d)}

    def dequantize(self, parts):
        q = unpack_codes(parts["qweight"], "q8").astype(np.float32) - 128
        d = unpack_group_scales(np.asarray(parts["scales"])).astype(np.float32)
        N, K = q.shape
        return (q.reshape(N, K // 32, 32) * d[..., None]).reshape(N, K)

    @staticmethod
    def linear_ref(x, qweight, scales, bias=None):
        xq, dx = quantize_act_blocks(x)
        q = unpack_codes(qweight, "q8").astype(np.int32) - 128
        d = unpack_group_scales(np.asarray(scales)).astype(np.float64)
        return _bias((_block_sums(xq, q, QA) * dx.astype(np.float64)[:, None, :] * d[None]).sum(axis=2), bias)

    def linear_kernel(self, T, N, K, bias, segs=()):
        return "linear_q8g_test", {**self._params(T, N, K, bias, segs), "G": 32}


@pytest.fixture(scope="module")
def q8g():
    s = register(Q8Group())
    yield s
    del SCHEMES[s.name]
    for op in s.kernel_ops:
        del KERNEL_OPS[op]


@pytest.mark.parametrize("lanes", [16, 8, 4])   # AVX-512 VNNI (where the host has it), AVX2, plain TIR
def test_a_new_scheme_gets_its_kernels_from_its_traits(q8g, lanes, caplog):
    cpu = ops.host_cpu_info(2) if lanes == 16 else ops.CpuInfo(vector_lanes=lanes, num_threads=2)
    r = np.random.default_rng(lanes)
    for T, N, K, bias in ((1, 40, 256, False), (5, 64, 128, True), (16, 48, 512, False)):
        w = (r.standard_normal((N, K)) * 0.05).astype(np.float32)
        w[:, 7] *= 30                                   # an outlier column: the per-group scales must hold it
        x = r.standard_normal((T, K)).astype(np.float32)
        parts = q8g.quantize(w)
        op, p = q8g.linear_kernel(T, N, K, bias)
        args = [x, parts["qweight"], parts["scales"]] + ([r.standard_normal(N).astype(np.float32)] if bias else [])
        with caplog.at_level(logging.WARNING, logger="edgellm.ops"):
            name, func = ops.make_kernel(op, cpu, **p)
        assert not caplog.records, "the tuned schedule fell back to the plain kernel"
        assert name.startswith(f"linear_q8g_test_t{T}_n{N}_k{K}_g32")
        f = tvm.compile(tvm.IRModule({name: func}), target=TARGET).jit()[name]
        out = tvm.runtime.tensor(np.full((T, N), np.nan, np.float32))
        f(*[tvm.runtime.tensor(a) for a in args], out)
        ref = ops.reference(op, args, **p)
        np.testing.assert_array_equal(ref, q8g.reference_linear(x, parts, bias=args[3] if bias else None))
        assert np.abs(out.numpy() - ref).max() <= 1e-5 * np.abs(ref).max()
        # and the weights are what the scheme says: Q8_0's error, well under q8's per-row one on the outlier rows
        assert np.abs(q8g.dequantize(parts) - w).max() <= np.abs(w).max() / 127


def test_a_new_schemes_rules_and_opencl_kernel_come_from_its_traits(q8g):
    with pytest.raises(ValueError, match="G must be one of 32"):
        ops.kernel_params("linear_q8g_test", {"T": 1, "N": 16, "K": 128, "G": 64})
    with pytest.raises(ValueError, match="K=48 is not a multiple of the group size G=32"):
        ops.kernel_params("linear_q8g_test", {"T": 1, "N": 16, "K": 48})
    name, func = cl_ops.make_kernel("linear_q8g_test", T=2, N=16, K=64, G=32)
    assert name == "linear_q8g_test_t2_n16_k64_g32_b0" and func.attrs["global_symbol"] == name


def test_no_compiler_file_tests_a_scheme_by_name():
    """Outside quant/, kernels are chosen by traits: no comparison with a scheme's name or a scheme-named op."""
    root = pathlib.Path(scheme_mod.__file__).resolve().parents[1] / "compiler"
    packed = [n for n, sch in SCHEMES.items() if sch.kernel_ops]   # f16 / f32 are also dtype and NPU names
    names = "|".join(re.escape(n) for n in ("q4", *packed, *KERNEL_OPS)) + r"|q4g\d+"
    compare = re.compile(rf"""(==|!=|\bin)\s*\(?["']({names})["']""")
    hits = [f"{f.relative_to(root)}:{i}: {line.strip()}" for f in sorted(root.rglob("*.py"))
            for i, line in enumerate(f.read_text().splitlines(), 1) if compare.search(line)]
    assert not hits, "\n".join(hits)


@pytest.mark.parametrize("T,V", [(3, 37), (1, 48)])   # a tail panel (37 rows), whole panels
def test_q8g32_embedding_rows_are_the_tables(T, V):
    """embed_q8g32 (a Q8_0 GGUF's embedding kept: q8's code panels with group scales, chosen by its traits) gathers
    exactly the rows of the table q8g32 stores, outliers included."""
    from edgellm.quant import get_scheme

    sch = get_scheme("q8g32")
    r = np.random.default_rng(T)
    w = (r.standard_normal((V, 64)) * 0.05).astype(np.float32)
    w[:, 9] *= 40
    parts = sch.quantize(w)
    ids = r.integers(0, V, T).astype(np.int32)
    ids[0] = V - 1
    op, p = sch.embed_kernel(T, V, 64)
    name, func = ops.make_kernel(op, ops.host_cpu_info(2), **p)
    f = tvm.compile(tvm.IRModule({name: func}), target=TARGET).jit()[name]
    out = tvm.runtime.tensor(np.full((T, 64), np.nan, np.float32))
    f(tvm.runtime.tensor(ids), tvm.runtime.tensor(parts["qweight"]), tvm.runtime.tensor(parts["scales"]), out)
    np.testing.assert_array_equal(out.numpy(), sch.dequantize(parts)[ids])
    np.testing.assert_array_equal(ops.reference(op, [ids, parts["qweight"], parts["scales"]], **p),
                                  sch.dequantize(parts)[ids])
