"""Per-host tuning (compiler/tune): the cache is keyed by the CPU and reused, another CPU's cache is ignored, and no
knob value it sweeps changes a single bit of the results."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import edgellm
from edgellm import CompileError, Runtime
from edgellm.compiler.ops import CpuInfo, host_cpu_info, llvm_target, make_kernel, prefetch_class
from edgellm.compiler.tune import SPACE, resolve_mode
from edgellm.compiler.tune.cache import TuneCache
from edgellm.targets import get_target
from edgellm.targets.cpu_id import cpu_identity, cpu_key, cpu_label

DEMO_IDS = [3, 17, 99, 250, 7, 1024, 42, 5, 600, 11] * 7   # 70 tokens: full chunks plus a tail


@pytest.fixture()
def tune_home(tmp_path, monkeypatch):
    """A private cache dir (the tune cache lives under it), and tuning on. Measurements stream a few MiB over three
    rounds instead of twice the L3 over seven, over half the candidates: these tests check what is cached and reused,
    not which knob wins."""
    import edgellm.compiler.tune as tune
    import edgellm.targets.cpu_id as cpu_id

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("EDGELLM_TUNE", raising=False)
    monkeypatch.setattr(cpu_id, "l3_bytes", lambda *a, **k: 1 << 20)
    monkeypatch.setattr(tune, "MIN_STREAM", 4 << 20)
    # and half of quick's candidates: enough to see a choice made, cached and reused
    q = tune.SPACE["quick"]
    monkeypatch.setitem(tune.SPACE, "quick", {**q, "rounds": 3, "prefetch": q["prefetch"][::2], "chunk": q["chunk"][::2],
                                              "rows": q["rows"][:2]})
    return tmp_path


def _manifest(pkg) -> dict:
    return json.loads((pkg / "manifest.json").read_text())


def test_cpu_identity_is_stable_and_names_the_cpu():
    a, b = cpu_identity(), cpu_identity()
    assert a == b and cpu_key(a) == cpu_key(b) and len(cpu_key(a)) == 16
    assert a["cpus"] >= 1 and isinstance(a["features"], list) and cpu_label(a)
    assert cpu_key({**a, "model": "999"}) != cpu_key(a)


def test_tune_cache_round_trip_and_other_cpu_ignored(tmp_path):
    ident = cpu_identity()
    c = TuneCache(ident, tmp_path)
    c.put("decode|linear|K=64", {0: 1.0, 1024: 2.0})
    c.save()
    again = TuneCache(ident, tmp_path)
    assert again.get("decode|linear|K=64", (0, 1024)) == {"0": 1.0, "1024": 2.0}
    assert again.get("decode|linear|K=64", (0, 1024, 4096)) is None   # a variant never measured with the others
    # the same file name holding another CPU's measurements (copied from another machine): ignored, never used
    data = json.loads(c.path.read_text())
    data["cpu"] = {**ident, "model name": "Some Other CPU"}
    c.path.write_text(json.dumps(data))
    other = TuneCache(ident, tmp_path)
    assert other.entries == {} and other.ignored == "measured on another CPU"
    # measured with other kernels (an upgrade changed a kernel's source): ignored too, so the next compile re-measures
    data["cpu"] = ident
    data["kernels"] = "0" * 16
    c.path.write_text(json.dumps(data))
    stale = TuneCache(ident, tmp_path)
    assert stale.entries == {} and stale.ignored == "measured with other kernels"
    c.path.write_text("{not json")
    assert TuneCache(ident, tmp_path).ignored.startswith("unreadable")
    # another CPU model gets its own file
    assert TuneCache({**ident, "model": "999"}, tmp_path).path != c.path


def test_second_compile_on_the_same_cpu_measures_nothing(tune_home, monkeypatch):
    import edgellm.compiler.tune as tune

    monkeypatch.setattr(tune, "MIN_CHUNK_TUNE_BYTES", 0)   # the demo is too small for quick's chunk sweep
    out1, out2 = tune_home / "a", tune_home / "b"
    edgellm.compile("demo", quant="q4g32", out=out1, max_context=128, progress=False, tune="quick")
    t1 = _manifest(out1)["tuning"]
    assert t1["mode"] == "quick" and t1["measured_variants"] > 0
    assert set(t1["prefetch_bytes"]) == {"linear_q4", "linear_q8g32"}   # the body's GEMVs and the q8g32 lm_head
    assert all(v in SPACE["quick"]["prefetch"] for v in t1["prefetch_bytes"].values())
    assert t1["prefill_chunk"] in SPACE["quick"]["chunk"] and _manifest(out1)["prefill_chunk"] == t1["prefill_chunk"]
    # second compile: nothing measured (the timing code is not even reached), the same knobs
    import edgellm.compiler.tune.measure as measure

    def no_timing(*a, **k):
        raise AssertionError("measured although the cache holds every timing")

    monkeypatch.setattr(measure, "time_variants", no_timing)
    edgellm.compile("demo", quant="q4g32", out=out2, max_context=128, progress=False, tune="quick")
    t2 = _manifest(out2)["tuning"]
    assert t2["measured_variants"] == 0
    assert (t2["prefetch_bytes"], t2["prefill_chunk"]) == (t1["prefetch_bytes"], t1["prefill_chunk"])


def test_a_cache_from_another_cpu_model_is_ignored(tune_home, monkeypatch):
    out1, out2 = tune_home / "a", tune_home / "b"
    edgellm.compile("demo", quant="q8", out=out1, max_context=128, progress=False, tune="quick")
    t1 = _manifest(out1)["tuning"]
    default = get_target("host").prefill_chunk
    assert t1["prefill_chunk"] is None and _manifest(out1)["prefill_chunk"] == default   # small body: the default
    path = TuneCache().path
    assert _manifest(out1)["tuning"]["measured_variants"] > 0 and path.is_file()
    # the same cache file, but recorded on another CPU model: the next compile ignores it and measures
    data = json.loads(path.read_text())
    data["cpu"]["model"] = str(int(data["cpu"].get("model", "0")) + 1)
    path.write_text(json.dumps(data))
    edgellm.compile("demo", quant="q8", out=out2, max_context=128, progress=False, tune="quick")
    assert _manifest(out2)["tuning"]["measured_variants"] > 0
    assert json.loads(path.read_text())["cpu"] == cpu_identity()   # and replaced by this CPU's measurements


def test_a_failed_measurement_keeps_the_defaults(tune_home, monkeypatch):
    """Tuning never fails a compile: a measurement that cannot run (here: no memory for the weight copies) leaves
    the knobs at the target's defaults, says so, and the package is the untuned one."""
    import edgellm.compiler.tune.measure as measure

    def no_memory(*a, **k):
        raise MemoryError("cannot allocate the weight copies (test)")

    monkeypatch.setattr(measure, "fake_args", no_memory)
    out = tune_home / "a"
    edgellm.compile("demo", quant="q8", out=out, max_context=128, progress=False, tune="quick")
    t = _manifest(out)["tuning"]
    assert t["prefetch_bytes"] == {} and t["failed"] and "MemoryError" in t["failed"][0]
    with Runtime.load(out) as rt:
        assert np.isfinite(rt.prefill([1, 2, 3])).all()


def test_time_variants_ranks_by_per_round_ratios(monkeypatch):
    """The host's speed moves 2x between rounds (uniform 1-2 here) and each call has 2% noise of its own: b costs
    1.05x a and c 1.1x. Medians of raw times take each variant's median from a different round and rank b first
    for this seed (3% of seeds do so, the paired ratios none of 2000); time_variants, which takes each round's times
    relative to the round's mean, ranks a first, with the ratios within the noise. A fake clock: each call advances
    it by its variant's cost in that round."""
    import edgellm.compiler.tune.measure as measure

    rng = np.random.default_rng(60)
    rounds = 7
    speed = rng.uniform(1, 2, rounds)
    noise = rng.lognormal(0, 0.02, (3, rounds))
    cost = {"a": 1.0, "b": 1.05, "c": 1.1}
    raw = {v: np.median(c * speed * noise[i]) for i, (v, c) in enumerate(cost.items())}
    assert min(raw, key=raw.get) == "b"        # the seed is one that misleads raw medians
    clock, calls = [0.0], dict.fromkeys(cost, 0)

    def fn(name, i):
        def call(*_):
            r = calls[name] - 1              # call 0 warms up, then one call per round (one argument set)
            calls[name] += 1
            clock[0] += 1e-3 * (cost[name] * speed[r] * noise[i, r] if r >= 0 else 1)
        return call

    monkeypatch.setattr(measure.time, "perf_counter", lambda: clock[0])
    mod = {v: fn(v, i) for i, v in enumerate(cost)}
    t = measure.time_variants(mod, {v: v for v in cost}, {v: [[]] for v in cost}, rounds)
    assert min(t, key=t.get) == "a"
    assert t["b"] / t["a"] == pytest.approx(1.05, abs=0.03) and t["c"] / t["a"] == pytest.approx(1.1, abs=0.03)
    assert 1e-3 < t["a"] < 2.2e-3


def test_tune_modes_and_targets():
    host = get_target("host")
    assert resolve_mode(None, host) in ("quick", "off")   # off when $EDGELLM_TUNE says so (the test session does)
    assert resolve_mode("full", host) == "full" and resolve_mode("off", host) == "off"
    assert resolve_mode(None, get_target("rpi5")) == "off"
    with pytest.raises(CompileError, match="applies to --target host only"):
        resolve_mode("quick", get_target("rpi5"))
    with pytest.raises(CompileError, match="--tune fast"):
        resolve_mode("fast", host)


def test_cli_tune_show_and_bad_flag(tune_home):
    env = {**os.environ, "XDG_CACHE_HOME": str(tune_home / "cache")}
    r = subprocess.run([sys.executable, "-m", "edgellm.cli", "tune", "--show"], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "CPU:" in r.stdout and "nothing measured yet" in r.stdout
    r = subprocess.run([sys.executable, "-m", "edgellm.cli", "compile", "demo", "--tune", "fast"], capture_output=True,
                       text=True, env=env)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


# ---- tuning never changes results -------------------------------------------------------------------------------
GEMV_CASES = [  # (op, params): one decode GEMV of every prefetch class
    ("linear", {"T": 1, "N": 80, "K": 512, "wdtype": "float32"}),
    ("linear", {"T": 1, "N": 80, "K": 512, "wdtype": "float16"}),
    ("linear_q8", {"T": 1, "N": 80, "K": 512}),
    ("linear_q4", {"T": 1, "N": 80, "K": 512, "G": 32}),
    ("linear_q6", {"T": 1, "N": 80, "K": 512}),
    ("linear_t2", {"T": 1, "N": 80, "K": 512}),
    ("linear_t2_lut", {"T": 1, "N": 80, "K": 512}),
]


@pytest.mark.parametrize("lanes", [16, 8])
def test_prefetch_distances_give_identical_outputs(lanes):
    """A decode GEMV built at the distances `--tune full` sweeps computes the same bits (random inputs, every class,
    both x86 flavours). A prefetch is a hint that cannot change arithmetic, so the sweep's ends and its middle stand
    for the rest: none, the shortest, the median and the longest."""
    import tvm

    from edgellm.compiler.tune.measure import fake_args

    base = host_cpu_info()
    if base.vector_lanes < lanes:
        pytest.skip("this CPU lacks AVX-512")
    funcs, names = {}, {}
    for op, params in GEMV_CASES:
        cls = prefetch_class(op, params)
        full = SPACE["full"]["prefetch"]
        for d in sorted({full[0], full[1], full[len(full) // 2], full[-1]}):
            cpu = CpuInfo(lanes, 2, "x86_64", (), 4096, 8192, ((cls, d),))
            name, f = make_kernel(op, cpu, **params)
            sym = f"{name}__pf{d}"
            funcs[sym] = f.with_attr("global_symbol", sym)
            names.setdefault((op, cls), []).append(sym)
    mod = tvm.compile(tvm.IRModule(funcs), target=llvm_target())
    for (op, cls), syms in names.items():
        args = fake_args(funcs[syms[0]], 0, seed=1)[0]
        outs = []
        for s in syms:
            args[-1] = tvm.runtime.tensor(np.zeros(args[-1].shape, args[-1].dtype))
            mod[s](*args)
            outs.append(args[-1].numpy())
        assert all(np.array_equal(o, outs[0]) for o in outs[1:]), (op, cls)
        assert np.isfinite(outs[0]).all() and np.abs(outs[0]).max() > 0


@pytest.mark.parametrize("wdtype", ["float16", "float32"])
def test_every_gemv_row_count_gives_identical_outputs(wdtype):
    """The float decode GEMV with every rows-per-task count `--tune full` sweeps (ragged last task included) computes
    the same bits, at 16 and 8 lanes."""
    import tvm

    from edgellm.compiler.tune.measure import fake_args

    for lanes in (16, 8):
        if host_cpu_info().vector_lanes < lanes:
            continue
        funcs = {}
        for r in SPACE["full"]["rows"]:
            c = CpuInfo(lanes, 2, "x86_64", tuned_gemv_rows=((300, r),))
            name, f = make_kernel("linear", c, T=1, N=77, K=300, wdtype=wdtype, bias=True)
            funcs[f"{name}__r{r}"] = f.with_attr("global_symbol", f"{name}__r{r}")
        mod = tvm.compile(tvm.IRModule(funcs), target=llvm_target())
        args = fake_args(next(iter(funcs.values())), 0, seed=3)[0]
        outs = []
        for sym in funcs:
            args[-1] = tvm.runtime.tensor(np.zeros(args[-1].shape, args[-1].dtype))
            mod[sym](*args)
            outs.append(args[-1].numpy())
        assert all(np.array_equal(o, outs[0]) for o in outs[1:]), lanes


@pytest.mark.parametrize("T", [16, 40, 128])
def test_every_prefill_blocking_gives_identical_outputs(T):
    """The f16/f32 prefill GEMM at every register blocking `--tune full` sweeps computes the same bits."""
    import tvm

    from edgellm.compiler.tune import outer_blockings
    from edgellm.compiler.tune.measure import fake_args

    cpu = host_cpu_info()
    for wdtype in ("float16", "float32"):
        funcs = {}
        for b in outer_blockings(cpu, T):
            nn, nv = (int(x) for x in b.split("x"))
            c = CpuInfo(cpu.vector_lanes, 2, "x86_64", tuned_blocking=((T, nn, nv),))
            name, f = make_kernel("linear", c, T=T, N=70, K=200, wdtype=wdtype, segs=(40, 30))
            funcs[f"{name}__{b}"] = f.with_attr("global_symbol", f"{name}__{b}")
        mod = tvm.compile(tvm.IRModule(funcs), target=llvm_target())
        args = fake_args(next(iter(funcs.values())), 0, seed=2)[0]
        outs = []
        for sym in funcs:
            for i in (-2, -1):
                args[i] = tvm.runtime.tensor(np.zeros(args[i].shape, args[i].dtype))
            mod[sym](*args)
            outs.append(np.concatenate([args[-2].numpy().ravel(), args[-1].numpy().ravel()]))
        assert len(outs) >= 3 and all(np.array_equal(o, outs[0]) for o in outs[1:]), wdtype


@pytest.mark.parametrize("quant", ["f16", "q4g32"])   # the float GEMM and the integer block kernels (t2's alike)
def test_every_prefill_chunk_gives_identical_logits(tmp_path, quant):
    """Packages compiled at the prefill chunks `--tune full` sweeps give the same logits, bit for bit, for a prompt
    that spans several chunks plus a tail (the short tail program included) and for the decode step after it. Every
    other chunk of the sweep (16, 64, 256: each blocking regime, the shortest and the longest; the whole sweep
    compiles five packages per scheme)."""
    ref = None
    for c in SPACE["full"]["chunk"][::2]:
        pkg = edgellm.compile("demo", quant=quant, out=tmp_path / f"c{c}", max_context=128, prefill_chunk=c,
                              progress=False, tune="off")
        with Runtime.load(pkg) as rt:
            got = np.concatenate([np.asarray(rt.prefill(DEMO_IDS)).ravel(), np.asarray(rt.decode_step(7)).ravel()])
        if ref is None:
            ref = got
        assert np.array_equal(got, ref), f"chunk {c}: max diff {np.abs(got - ref).max()}"
