"""The K-sliced float weight layout (compiler/ops/kslice.py): its geometry, the kernels that read it (bitwise the
row-major kernels' outputs), and a package compiled with it (the same logits and tokens as one without)."""
import json

import numpy as np
import pytest

import edgellm
from edgellm.compiler import ops
from edgellm.compiler.ops import kslice
from edgellm.models.synthetic import make_checkpoint
from edgellm.targets import registry

CPU = ops.host_cpu_info()


def test_slice_width_divides_k_into_whole_steps():
    assert kslice.slice_width(5632, 3072) == 2816          # the 1B's down projection: 2 slices
    assert kslice.slice_width(8192, 3072) == 2048          # Llama 3.2 1B: 4
    assert kslice.slice_width(11008, 3072) == 2752         # Llama 2 7B: 4 slices of 43 steps
    assert kslice.slice_width(14336, 3072) == 2048         # 7
    assert kslice.slice_width(2048, 3072) == 0             # fits: row-major
    assert kslice.slice_width(5600, 3072) == 0             # not whole steps of 64
    assert kslice.slice_width(5632, 0) == 0                # the target slices nothing
    for K, cap in ((5632, 3072), (4864, 3072), (8960, 2048), (384, 64)):
        ks = kslice.slice_width(K, cap)
        assert ks and K % ks == 0 and ks % kslice.SLICE_ALIGN == 0 and ks <= cap


def test_layout_round_trips_and_puts_each_slice_together():
    w = np.arange(6 * 256, dtype=np.float32).reshape(6, 256)
    s = kslice.to_sliced(w, 64)
    assert s.shape == w.shape and np.array_equal(kslice.from_sliced(s, 64), w)
    flat = s.reshape(-1)
    assert np.array_equal(flat[:6 * 64].reshape(6, 64), w[:, :64])          # slice 0 of every row first
    assert np.array_equal(flat[6 * 64:12 * 64].reshape(6, 64), w[:, 64:128])
    assert kslice.to_sliced(w, 0) is w


@pytest.mark.parametrize("bad", [32, 100, 256, 512])
def test_bad_slice_widths_are_refused(bad):
    with pytest.raises(ValueError, match="KS"):
        ops.make_kernel("linear", CPU, T=1, N=8, K=256, KS=bad)


def _run(name, func, arrays, out_shape):
    import tvm

    mod = tvm.compile(tvm.IRModule({name: func}), target=ops.llvm_target())
    out = tvm.runtime.tensor(np.zeros(out_shape, np.float32))
    mod[name](*[tvm.runtime.tensor(a) for a in arrays], out)
    return out.numpy()


@pytest.mark.parametrize("T, N, K, KS, wdtype, bias, rowwise", [
    (1, 300, 1024, 256, "float16", False, False),   # decode, a ragged last block of rows
    (1, 64, 384, 128, "float32", True, False),
    (3, 70, 512, 128, "float16", False, True),      # verify's rowwise GEMV
    (5, 48, 512, 256, "float16", True, False),      # prefill GEMMs
    (40, 33, 256, 64, "float32", False, False),
])
def test_sliced_kernels_give_the_row_major_kernels_outputs(T, N, K, KS, wdtype, bias, rowwise):
    rng = np.random.default_rng(K + N)
    x = rng.standard_normal((T, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(wdtype)
    b = [rng.standard_normal(N).astype(np.float32)] if bias else []
    p = dict(T=T, N=N, K=K, wdtype=wdtype, bias=bias, rowwise=rowwise)
    name0, f0 = ops.make_kernel("linear", CPU, **p)
    name1, f1 = ops.make_kernel("linear", CPU, **p, KS=KS)
    assert name1 == f"{name0}_ks{KS}"
    plain = _run(name0, f0, [x, w, *b], (T, N))
    sliced = _run(name1, f1, [x, kslice.to_sliced(w, KS), *b], (T, N))
    assert np.array_equal(plain, sliced)   # the same FMA chain over k per output
    ref = ops.reference("linear", [x, kslice.to_sliced(w, KS), *b], **p, KS=KS)
    assert np.allclose(sliced, ref, rtol=1e-4, atol=1e-3)
    naive = ops._build("linear", CPU, ops.kernel_params("linear", {**p, "KS": KS}), fast=False)
    assert np.allclose(_run(name1, naive.with_attr("global_symbol", name1), [x, kslice.to_sliced(w, KS), *b], (T, N)),
                       ref, rtol=1e-4, atol=1e-3)


def test_opencl_refuses_a_sliced_weight():
    from edgellm.compiler.opencl import ops as cl

    with pytest.raises(cl.UnsupportedOp):
        cl.make_kernel("linear", None, T=1, N=8, K=256, KS=128)


def test_host_slices_on_amd_only(monkeypatch):
    monkeypatch.setattr(registry, "_host_x86_features", lambda: ("avx2", "fma", "f16c", "avx512f", "avx512vnni"))
    monkeypatch.setattr(registry, "host_is_intel", lambda: False)
    assert registry.host_prefetch()["float_slice_bytes"] == 12 << 10
    monkeypatch.setattr(registry, "host_is_intel", lambda: True)
    assert registry.host_prefetch()["float_slice_bytes"] == 0
    assert registry.get_target("x86-avx512").float_slice_bytes == 0   # portable targets: row-major


@pytest.mark.skipif(registry.platform.machine() not in ("x86_64", "AMD64"), reason="the host target is x86")
@pytest.mark.parametrize("quant", ["f16", "f32"])
def test_a_sliced_package_gives_the_row_major_packages_logits(tmp_path, monkeypatch, quant):
    """Every float body matrix stored sliced (the fused q/k/v and gate/up included, the head not): prefill, decode
    and their tokens are bitwise those of the row-major package (tuning off: the decode GEMV's R = 1 chain)."""
    ck = make_checkpoint(tmp_path / "ck", seed=5, hidden_size=128, intermediate_size=256, num_attention_heads=4,
                         num_key_value_heads=2, dtype="float16" if quant == "f16" else "float32")
    prompt = [5, 17, 33, 2, 99, 250, 7, 64, 128, 3, 11, 300]
    runs = {}
    host = registry.host_prefetch
    for cap in (0, 256):   # 256 bytes: slices of 64 of both K = 128 and K = 256
        monkeypatch.setattr(registry, "host_prefetch", lambda cap=cap: {**host(), "float_slice_bytes": cap})
        pkg = edgellm.compile(str(ck), quant=quant, out=tmp_path / f"p{cap}", max_context=64, prefill_chunk=8,
                              tune="off", progress=False)
        monkeypatch.setattr(registry, "host_prefetch", host)
        kernels = " ".join(json.loads((pkg / "manifest.json").read_text()).get("kernels", [])) or \
            (pkg / "plan.bin").read_bytes().decode("latin-1")
        with edgellm.Runtime.load(pkg) as rt:
            runs[cap] = (rt.logits(prompt), rt.generate(prompt, max_new_tokens=16, ignore_eos=True).token_ids, kernels)
    assert "_ks64" in runs[256][2] and "_ks64" not in runs[0][2]
    assert np.array_equal(runs[0][0], runs[256][0])
    assert runs[0][1] == runs[256][1]
