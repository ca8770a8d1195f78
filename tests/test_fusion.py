"""Fused projections: q/k/v and gate/up as one linear kernel (ops param segs, compiler/lower.py fuse_linears).

Kernels: a fused kernel's outputs are bitwise those of the separate kernels (same code per output row, only the
stores dispatch), for every body scheme, decode and prefill (dot-product and outer-product GEMMs, ragged token
blocks), ragged segments (tail panels inside the fused matrix) and biases; on x86 AVX2 and the plain flavour here,
AVX-512 where the host has VNNI (else compiled only), and the aarch64 flavours under qemu.
Packages: fusion on and off give identical logits and the fused decode launches 4 linears per layer instead of 7.
"""
from __future__ import annotations

import functools
import json
import logging
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

import edgellm  # noqa: E402
from edgellm.compiler import ops  # noqa: E402
from edgellm.compiler.kernel_table import written_args  # noqa: E402
from edgellm.compiler.lower import FusedLinear, fuse_linears, fused_name, lower_model  # noqa: E402
from edgellm.compiler.trace import TraceGraph  # noqa: E402
from edgellm.models import family, load_checkpoint  # noqa: E402
from edgellm.quant import get_scheme  # noqa: E402
from edgellm.runtime import contract as K  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RTOL = 1e-5
HOST_FLAGS = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
HOST_VNNI = " avx512_vnni" in HOST_FLAGS
HOST_TARGET = ops.llvm_target(2)
AVX512_TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "icelake-server", "num-cores": 2})
K_ = 128
# (T, segs, bias): decode; the outer-product GEMM (T >= 2 token vectors on AVX2) and the dot-product GEMM with a
# ragged token block; segments that end mid-panel (40, 24: rows 32..39 are a tail panel when separate)
CASES = [(1, (48, 16, 16), False), (1, (40, 24), True), (32, (48, 16, 16), True), (13, (40, 24), False)]
# (scheme, op override): every body scheme, the t2 lookup-table kernel too
SCHEMES = [("f32", None), ("f16", None), ("q8", None), ("q4g32", None), ("q4g64", None), ("q4g128", None),
           ("t2", None), ("t2", "linear_t2_lut")]


def _problem(scheme, T, segs, bias, seed):
    r = np.random.default_rng(seed)
    parts = [scheme.quantize((r.standard_normal((n, K_)) * 0.05).astype(np.float32)) for n in segs]
    x = r.standard_normal((T, K_)).astype(np.float32)
    x[:, ::17] *= 20.0                                  # outlier channels
    if T > 2:
        x[1] = 0.0                                      # an all-zero token (clamped absmax)
    biases = [r.standard_normal(n).astype(np.float32) for n in segs] if bias else None
    return x, parts, biases


def _args(scheme, x, parts, bias):
    return [x] + [parts[k] for k in scheme.parts] + ([bias] if bias is not None else [])


def _call(f, arrays, out_shapes):
    outs = [tvm.runtime.tensor(np.full(s, np.nan, np.float32)) for s in out_shapes]
    f(*[tvm.runtime.tensor(np.ascontiguousarray(a)) for a in arrays], *outs)
    return [o.numpy() for o in outs]


def _kernels(scheme, op_override, cpu, T, segs, bias):
    """(separate kernels, fused kernel): each (name, op, params, func)."""
    def make(N, sg):
        op, p = scheme.linear_kernel(T, N, K_, bias, sg)
        op = op_override or op
        name, func = ops.make_kernel(op, cpu, **p)
        return name, op, p, func

    return [make(n, ()) for n in segs], make(sum(segs), segs)


# 4 lanes (the NEON-width code) runs for real under qemu in test_arm_fused_equals_separate
@pytest.mark.parametrize("lanes", [16, 8])
@pytest.mark.parametrize("sname,op_override", SCHEMES)
def test_fused_kernel_equals_separate_kernels(sname, op_override, lanes, caplog):
    scheme = get_scheme(sname)
    cpu = ops.CpuInfo(lanes, 2)
    runs = scheme.float_math or lanes != 16 or HOST_VNNI   # f32/f16 16-lane code is plain LLVM vectors
    with caplog.at_level(logging.WARNING, logger="edgellm.compiler.ops"):
        jobs = [(case, _kernels(scheme, op_override, cpu, *case)) for case in CASES]
    assert not caplog.records, f"fused schedules fell back to plain kernels: {caplog.text}"
    funcs = {name: f for _, (sep, fu) in jobs for name, _, _, f in [*sep, fu]}
    if not runs:   # AVX-512 VNNI flavour on a host without it: it must still lower and compile
        tvm.compile(tvm.IRModule(funcs), target=AVX512_TARGET)
        pytest.skip("host has no AVX-512 VNNI: compiled only")
    mod = tvm.compile(tvm.IRModule(funcs), target=HOST_TARGET)
    for i, ((T, segs, bias), (sep, (fname, fop, fp, _))) in enumerate(jobs):
        x, parts, biases = _problem(scheme, T, segs, bias, seed=i)
        alone = [_call(mod[name], _args(scheme, x, pa, None if biases is None else biases[s]), [(T, n)])[0]
                 for s, ((name, _, _, _), pa, n) in enumerate(zip(sep, parts, segs))]
        args = _args(scheme, x, scheme.concat_parts(parts), None if biases is None else np.concatenate(biases))
        fused = _call(mod[fname], args, [(T, n) for n in segs])
        ref = ops.reference(fop, args, **fp)
        assert len(ref) == len(segs)
        for s, (a, f, rf) in enumerate(zip(alone, fused, ref)):
            np.testing.assert_array_equal(f, a, err_msg=f"{fname} segment {s}")
            assert np.abs(f - rf).max() <= RTOL * np.abs(rf).max(), f"{fname} segment {s} vs reference"


def test_fused_fallback_kernels(plain_kernels):
    """A schedule failure gives the plain kernel with the same fused signature and the same results."""
    cpu = ops.CpuInfo(vector_lanes=8, num_threads=3)   # distinct cache key from the tuned kernels
    for sname in ("f16", "q4g32", "t2"):
        scheme = get_scheme(sname)
        for T, segs, bias in [(1, (40, 24), True), (3, (16, 16, 8), False)]:
            sep, (fname, fop, fp, ffunc) = _kernels(scheme, None, cpu, T, segs, bias)
            mod = tvm.compile(tvm.IRModule({n: f for n, _, _, f in [*sep, (fname, fop, fp, ffunc)]}),
                              target=HOST_TARGET)
            x, parts, biases = _problem(scheme, T, segs, bias, seed=5)
            args = _args(scheme, x, scheme.concat_parts(parts), None if biases is None else np.concatenate(biases))
            fused = _call(mod[fname], args, [(T, n) for n in segs])
            for s, (name, _, _, _) in enumerate(sep):
                alone = _call(mod[name], _args(scheme, x, parts[s], None if biases is None else biases[s]),
                              [(T, segs[s])])[0]
                np.testing.assert_array_equal(fused[s], alone)


def test_names_signatures_and_written_args():
    cpu = ops.CpuInfo(8)
    plain, _ = ops.make_kernel("linear_q4", cpu, T=1, N=96, K=64)
    name, f = ops.make_kernel("linear_q4", cpu, T=1, N=96, K=64, segs=(64, 16, 16))
    assert plain == "linear_q4_t1_n96_k64_g32_b0" and name == plain + "_s64x16x16"
    assert ops.make_kernel("linear_q4", cpu, T=1, N=96, K=64, segs=())[0] == plain   # () is the unfused kernel
    shapes = [tuple(int(d) for d in v.ty.shape) for v in f.params]
    assert shapes == [(1, 64), (96, 32), (96, 2), (1, 64), (1, 16), (1, 16)]
    assert written_args(f, name) == 0b111000
    _, f = ops.make_kernel("linear_t2", cpu, T=4, N=64, K=64, bias=True, segs=(32, 32))
    assert [tuple(int(d) for d in v.ty.shape) for v in f.params][2:] == [(2,), (64,), (4, 32), (4, 32)]
    assert written_args(f) == 0b110000
    name, f = ops.make_kernel("linear", cpu, T=16, N=80, K=64, wdtype="float16", segs=(48, 32))
    assert name == "linear_t16_n80_k64_f16_b0_s48x32" and written_args(f) == 0b1100
    for bad in [(80,), (40, 30), (80, 0), (40.5, 39.5)]:
        with pytest.raises(ValueError):
            ops.make_kernel("linear", cpu, T=1, N=80, K=64, segs=bad)
    # the tuned prefetch class of a decode GEMV does not depend on fusion
    for op, extra in [("linear", {"wdtype": "float16"}), ("linear_q8", {}), ("linear_t2", {})]:
        p = {"T": 1, "N": 80, "K": 64, **extra}
        assert ops.prefetch_class(op, {**p, "segs": (40, 40)}) == ops.prefetch_class(op, p) is not None
    tuned = ops.CpuInfo(8, tuned_prefetch=(("linear_q8", 1536),))
    assert tuned.for_kernel("linear_q8", {"T": 1, "N": 80, "K": 64, "segs": (40, 40)}).prefetch_bytes == 1536


@pytest.mark.parametrize("sname", ["f16", "q8", "q4g32", "q4g128", "q4m32", "q6", "t2"])
@pytest.mark.parametrize("segs", [(48, 16, 16), (40, 24), (5, 16, 3)])
def test_stacked_parts(sname, segs):
    """concat_parts: per-row / per-group schemes give exactly the bytes of quantizing the stacked matrix (tail
    panels re-interleaved); t2 keeps one scale per matrix; the reference splits per segment."""
    s = get_scheme(sname)
    r = np.random.default_rng(len(segs))
    ws = [r.standard_normal((n, 128)).astype(np.float32) for n in segs]
    stacked = s.concat_parts([s.quantize(w) for w in ws])
    if sname == "t2":
        assert stacked["scale"].shape == (len(segs),)
        np.testing.assert_array_equal(s.dequantize({**stacked, "scale": stacked["scale"][:1]})[:segs[0]],
                                      s.dequantize(s.quantize(ws[0])))
    else:
        whole = s.quantize(np.concatenate(ws))
        for p in s.parts:
            np.testing.assert_array_equal(stacked[p], whole[p])
    x = r.standard_normal((3, 128)).astype(np.float32)
    ref = s.reference_linear(x, stacked, segs=segs)
    for y, w in zip(ref, ws):
        np.testing.assert_array_equal(y, s.reference_linear(x, s.quantize(w)))


# --------------------------------------------------------------------------------------------------- lowering
def test_fused_names():
    a = "model.layers.3.self_attn."
    assert fused_name([a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"]) == a + "qkv_proj.weight"
    assert fused_name([a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"]) == a + "qkv_proj.bias"
    m = "model.layers.0.mlp."
    assert fused_name([m + "gate_proj.weight", m + "up_proj.weight"]) == m + "gate_up_proj.weight"


@pytest.mark.parametrize("model", ["demo", "demo-bitnet"])
def test_groups(model):
    """Llama: q/k/v consecutive; BitNet: q, rope, k, rope, v (the members move up to q); gate/up; never the head."""
    spec = load_checkpoint(model)[0]
    fam = family(spec)
    g = TraceGraph(spec, 1)
    fam.head(g, fam.body(g, g.input_ids()))
    nodes = fuse_linears(g.nodes, lambda n: n.weights[0] != spec.lm_head_name)
    groups = [[m.weights[0].split(".")[-2] for m in n.members] for n in nodes if isinstance(n, FusedLinear)]
    assert groups == [["q_proj", "k_proj", "v_proj"], ["gate_proj", "up_proj"]] * spec.n_layers
    assert sum(n.op == "linear" for n in nodes) == 2 * spec.n_layers + 1
    # every value is produced before it is read
    ready = {g.nodes[0].inputs[0].id}
    for n in nodes:
        assert all(v.id in ready for v in n.inputs)
        ready |= {o.id for o in (n.outs if isinstance(n, FusedLinear) else [n.out] if n.out else [])}


def test_matrices_in_another_scheme_fuse_only_with_their_own():
    """Per-matrix schemes (a GGUF file's mixed block types: compiler/auto_quant OWN): v_proj and down_proj in q6, the
    rest in q4m32; q/k fuse, v and down run alone in q6, gate/up fuse in q4m32; each matrix is stored in its scheme."""
    spec, ck, _ = load_checkpoint("demo")
    q4m, q6 = get_scheme("q4m32"), get_scheme("q6")
    own = {f"model.layers.{i}.{m}": q6 for i in range(spec.n_layers) for m in ("self_attn.v_proj.weight",
                                                                            "mlp.down_proj.weight")}
    low, progs = lower_model(spec, ops.CpuInfo(8), _raw(spec, ck, 80), q4m, get_scheme("q8"), 16, 80,
                             matrix_schemes=own)
    a = "model.layers.0."
    names = set(low.weights.names)
    assert {a + "self_attn.qk_proj.weight.mins", a + "mlp.gate_up_proj.weight.mins"} <= names
    assert {a + "self_attn.v_proj.weight.qweight", a + "self_attn.v_proj.weight.scales"} <= names
    assert a + "self_attn.v_proj.weight.mins" not in names and a + "mlp.down_proj.weight.mins" not in names
    kernels = set(low.kernels.names)
    assert any(k.startswith("linear_q6_t1_") for k in kernels) and any(k.startswith("linear_q4m_t1_") for k in kernels)


def test_prequantized_parts_are_stacked():
    """GPTQ parts (self.quantized) are stacked as they are, not re-quantized; a fused matrix is stored once."""
    spec, ck, _ = load_checkpoint("demo")
    q4 = get_scheme("q4g32")
    r = np.random.default_rng(0)
    a = "model.layers.0.self_attn."
    pre = {a + p: q4.quantize(np.asarray(ck.get(a + p), np.float32) + r.standard_normal((1,)).astype(np.float32))
           for p in ("q_proj.weight", "k_proj.weight", "v_proj.weight")}
    low, _ = lower_model(spec, ops.CpuInfo(8), _raw(spec, ck, 80), q4, get_scheme("q8"), 16, 80, quantized=pre)
    want = q4.concat_parts([pre[a + p] for p in ("q_proj.weight", "k_proj.weight", "v_proj.weight")])
    for p in q4.parts:
        got = low.weights.arrays[low.weights.index[f"{a}qkv_proj.weight.{p}"]]
        np.testing.assert_array_equal(got, want[p])
    assert not [n for n in low.weights.names if "q_proj" in n or "gate_proj" in n]


def _raw(spec, ck, kv_rows):
    from edgellm.models.rope import cos_sin

    c, s = cos_sin(spec, np.arange(kv_rows))
    rope = {"rope.cos": c.astype(np.float32), "rope.sin": s.astype(np.float32)}
    return lambda name: rope[name] if name in rope else ck.get(name)


# --------------------------------------------------------------------------------------------------- packages
def _plan_steps(pkg: Path) -> dict[str, list[tuple[str, list[dict]]]]:
    """program -> [(kernel name, args)] read back from plan.bin."""
    plan = (pkg / "plan.bin").read_bytes()
    h = K.HEADER.unpack(plan)
    kern_at = K.weights_table_at(h) + h["n_weights"] * K.WEIGHT.size
    kernels = [K.KERNEL.unpack(plan, kern_at + i * K.KERNEL.size)["name"].rstrip(b"\0").decode()
               for i in range(h["n_kernels"])]
    at, out = kern_at + h["n_kernels"] * K.KERNEL.size, {}
    for _ in range(h["n_programs"]):
        p = K.PROGRAM.unpack(plan, at)
        at += K.PROGRAM.size
        steps = out.setdefault(p["name"].rstrip(b"\0").decode(), [])
        for _ in range(p["n_steps"]):
            s = K.STEP.unpack(plan, at)
            at += K.STEP.size
            steps.append((kernels[s["kernel"]], [K.ARG.unpack(plan, at + i * K.ARG.size) for i in range(s["n_args"])]))
            at += s["n_args"] * K.ARG.size
    return out


@functools.cache
def _package(model: str, quant: str | None, fuse: bool, root: Path) -> Path:
    return edgellm.compile(model, quant=quant, out=root / f"{model}-{quant}-{int(fuse)}", max_context=64,
                           prefill_chunk=16, progress=False, fuse=fuse)


@pytest.fixture(scope="module")
def pkg_root(tmp_path_factory):
    return tmp_path_factory.mktemp("fusion")


def _linears(steps):
    return [k for k, _ in steps if k.startswith("linear")]


@pytest.mark.parametrize("model,quant", [("demo", "f16"), ("demo", "q8"), ("demo", "q4g32"), ("demo", "t2"),
                                         ("demo-bitnet", None)])
def test_package_fused_equals_unfused(model, quant, pkg_root):
    on, off = _package(model, quant, True, pkg_root), _package(model, quant, False, pkg_root)
    spec = load_checkpoint(model)[0]
    plan_on, plan_off = _plan_steps(on), _plan_steps(off)
    L = spec.n_layers
    for prog in ("decode", "prefill", "prefill_logits"):
        head = 1 if prog != "prefill" else 0
        assert len(_linears(plan_off[prog])) == 7 * L + head
        assert len(_linears(plan_on[prog])) == 4 * L + head
        assert len(plan_on[prog]) == len(plan_off[prog]) - 3 * L
    # V goes straight into the KV cache from the fused kernel (its last output), as from v_proj before
    qkv = [args for k, args in plan_on["decode"] if "_s" in k and len(args) and args[-1]["kind"] == K.ARG_VCACHE]
    assert len(qkv) == L and all(a[-1]["flags"] == K.FLAG_AT_POS for a in qkv)
    man_on, man_off = (json.loads((p / "manifest.json").read_text()) for p in (on, off))
    assert sum(t["nbytes"] for t in man_on["tensors"]) == sum(t["nbytes"] for t in man_off["tensors"])
    names = [t["name"] for t in man_on["tensors"]]
    assert "model.layers.0.self_attn.qkv_proj.weight" in {n.removesuffix(".qweight").removesuffix(".scale")
                                                          .removesuffix(".scales") for n in names}
    assert not [n for n in names if ".q_proj." in n or ".up_proj." in n]
    ids = [5, 17, 33, 2, 99, 250, 7, 64, 128, 3, 11, 300, 1, 2, 3, 4, 5, 6, 7]   # one chunk of 16 + a padded one
    got = {}
    for fuse, pkg in ((True, on), (False, off)):
        with edgellm.Runtime.load(pkg, threads=2) as rt:
            prefill = rt.logits(ids)
            rt.reset()
            decode = np.stack([rt.decode_step(t) for t in ids[:6]])
        got[fuse] = prefill, decode
    np.testing.assert_array_equal(got[True][0], got[False][0])
    np.testing.assert_array_equal(got[True][1], got[False][1])


def test_qkv_bias_and_qk_norm_models(tiny_models, tmp_path):
    """Qwen2 (q/k/v biases, stacked into one bias tensor) and Qwen3 (q/k norms after the fused projection)."""
    for name in ("qwen2", "qwen3"):
        pkgs = {}
        for fuse in (True, False):
            pkgs[fuse] = edgellm.compile(str(tiny_models[name]), quant="f32", out=tmp_path / f"{name}{fuse}",
                                         max_context=64, prefill_chunk=8, progress=False, fuse=fuse)
        names = [t["name"] for t in json.loads((pkgs[True] / "manifest.json").read_text())["tensors"]]
        assert ("model.layers.0.self_attn.qkv_proj.bias" in names) == (name == "qwen2")
        out = []
        for fuse in (True, False):
            with edgellm.Runtime.load(pkgs[fuse], threads=2) as rt:
                out.append(rt.logits([5, 17, 33, 2, 99, 250, 7, 64, 128, 3, 11]))
        np.testing.assert_array_equal(out[0], out[1])


# ------------------------------------------------------------------------------------------------- aarch64
HAVE_CROSS = shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-gcc") and \
    Path("/usr/aarch64-linux-gnu/lib").is_dir()
QEMU_CPU = {"rpi4": "cortex-a72", "rpi5": "cortex-a76", "android-cpu": "max"}   # as tests/test_ops_arm.py


def _write_args(path: Path, arrays):
    """tests/c/kernel_call.c's input file."""
    dt = {np.dtype("float32"): (2, 32), np.dtype("float16"): (2, 16), np.dtype("uint8"): (1, 8)}
    with open(path, "wb") as f:
        f.write(struct.pack("<I", len(arrays)))
        for a in arrays:
            a = np.ascontiguousarray(a)
            f.write(struct.pack("<BBBB", *dt[a.dtype], a.ndim, 0) + struct.pack(f"<{a.ndim}q", *a.shape))
            f.write(struct.pack("<Q", a.nbytes) + a.tobytes())


def _read_outs(path: Path, shapes):
    """The output buffers: the last bytes kernel_call.c writes back."""
    sizes = [int(np.prod(s)) for s in shapes]
    flat = np.frombuffer(path.read_bytes()[-4 * sum(sizes):], np.float32)
    return [o.reshape(s) for o, s in zip(np.split(flat, np.cumsum(sizes)[:-1]), shapes)]


@pytest.mark.skipif(not HAVE_CROSS, reason="needs qemu-aarch64 and gcc-aarch64-linux-gnu (see tests/test_ops_arm.py)")
@pytest.mark.parametrize("target", ["rpi4", "rpi5", "android-cpu"])
def test_arm_fused_equals_separate(target, tmp_path):
    """The aarch64 flavours (rpi4: plain integer NEON; rpi5: SDOT; android-cpu: SDOT decode, SMMLA prefill), qemu."""
    from edgellm.compiler.kernels_build import build_kernels
    from edgellm.targets import get_target

    t = get_target(target)
    cpu = ops.CpuInfo(t.vector_lanes, 2, t.arch, t.features)
    exe = tmp_path / "kernel_call"
    subprocess.run(["aarch64-linux-gnu-gcc", "-std=c11", "-O2", f"-I{ROOT / 'runtime'}", str(ROOT / "tests/c/kernel_call.c"),
                    "-o", str(exe), "-ldl"], check=True, capture_output=True, text=True)
    calls, cases, funcs = [], [], {}   # calls: (kernel, arrays, output shapes); cases: (separate calls, fused call)
    for sname, op in [("f16", None), ("q8", None), ("q4g32", None), ("q4m32", None), ("q6", None), ("t2", None),
                      ("t2", "linear_t2_lut")]:
        scheme = get_scheme(sname)
        for i, (T, segs, bias) in enumerate([(1, (40, 24), True), (6, (48, 16, 16), False)]):
            sep, (fname, _, _, ffunc) = _kernels(scheme, op, cpu, T, segs, bias)
            x, parts, biases = _problem(scheme, T, segs, bias, seed=i)
            first = len(calls)
            for s, (name, _, _, f) in enumerate(sep):
                funcs[name] = f
                calls.append((name, _args(scheme, x, parts[s], None if biases is None else biases[s]), [(T, segs[s])]))
            funcs[fname] = ffunc
            calls.append((fname, _args(scheme, x, scheme.concat_parts(parts),
                                       None if biases is None else np.concatenate(biases)), [(T, n) for n in segs]))
            cases.append((range(first, len(calls) - 1), len(calls) - 1))
    build_kernels(funcs, t, tmp_path / "kernels.so")
    cmd = ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu", "-cpu", QEMU_CPU[target], str(exe), str(tmp_path / "kernels.so")]
    for i, (name, arrays, shapes) in enumerate(calls):
        _write_args(tmp_path / f"in{i}", [*arrays, *[np.full(s, np.nan, np.float32) for s in shapes]])
        cmd += [name, str(tmp_path / f"in{i}"), str(tmp_path / f"out{i}")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    for sep, fi in cases:
        fused = _read_outs(tmp_path / f"out{fi}", calls[fi][2])
        assert all(np.isfinite(o).all() for o in fused), calls[fi][0]
        for s, j in enumerate(sep):
            np.testing.assert_array_equal(fused[s], _read_outs(tmp_path / f"out{j}", calls[j][2])[0],
                                          err_msg=f"{target} {calls[fi][0]} segment {s}")
