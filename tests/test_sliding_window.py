"""Sliding-window attention (Mistral; Qwen2/Qwen3 with use_sliding_window): the windowed attention kernel against
the numpy reference, the numpy backend against transformers, and compiled packages against the numpy backend, with
windows shorter than the prompt (so positions past the window really depend on the window)."""
from __future__ import annotations

import dataclasses
import json
import time

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

import edgellm  # noqa: E402
from edgellm.compiler import ops  # noqa: E402
from edgellm.compiler.ops import attention as attention_op  # noqa: E402
from edgellm.models import load_checkpoint  # noqa: E402
from edgellm.models.numpy_backend import NumpyModel  # noqa: E402
from edgellm.models.synthetic import make_checkpoint  # noqa: E402

CPU = ops.host_cpu_info(2)
TARGET = ops.llvm_target(2)
PROMPT = [5, 17, 33, 2, 99, 250, 7, 64, 128, 3, 11, 300, 42, 8, 77, 150, 9, 21, 500, 6, 13, 88, 400, 31]  # 24
N_GEN = 32
CHUNK = 8


def relerr(a, b):
    return float(np.abs(np.asarray(a, np.float64) - b).max() / np.abs(b).max())


# ------------------------------------------------------------------------------------------------ kernel

@pytest.fixture(scope="module")
def kernels():
    cache = {}

    def get(cpu=CPU, simple=False, **p):
        key = (cpu, simple, tuple(sorted(p.items())))
        if key not in cache:
            if simple:
                name = "attention_simple"
                func = attention_op.make(cpu, p["T"], p["NH"], p["KVH"], p["D"], simple=True, W=p["W"])
                func = func.with_attr("global_symbol", name)
            else:
                name, func = ops.make_kernel("attention", cpu, **p)
            cache[key] = tvm.compile(tvm.IRModule({name: func}), target=TARGET).jit()[name]
        return cache[key]

    return get


def run(f, q, k, v):
    out = tvm.runtime.tensor(np.full((q.shape[0], q.shape[1] * q.shape[2]), np.nan, "float32"))
    f(*[tvm.runtime.tensor(np.ascontiguousarray(a)) for a in (q, k, v)], out)
    return out.numpy()


def qkv(r, T, NH, KVH, D, S):
    return (r.standard_normal((T, NH, D)).astype("float32"), r.standard_normal((S, KVH, D)).astype("float32"),
            r.standard_normal((S, KVH, D)).astype("float32"))


def test_kernel_names():
    assert ops.make_kernel("attention", CPU, T=1, NH=4, KVH=2, D=8, W=0)[0] == "attention_t1_nh4_kvh2_d8"
    name, func = ops.make_kernel("attention", CPU, T=1, NH=4, KVH=2, D=8, W=4096)
    assert name == "attention_t1_nh4_kvh2_d8_w4096" and func.attrs["global_symbol"] == name
    with pytest.raises(ValueError):
        ops.make_kernel("attention", CPU, T=1, NH=4, KVH=2, D=8, W=-1)


@pytest.mark.parametrize("T,NH,KVH,D", [(1, 8, 2, 64), (8, 4, 2, 16), (16, 8, 2, 8)])
@pytest.mark.parametrize("W", [5, 16, 40])
def test_windowed_kernel_matches_reference(kernels, T, NH, KVH, D, W):
    """Decode (T=1) and prefill chunks (T=8, 16) at many positions: window smaller than, equal to and larger than
    the prefix, windows starting inside a key chunk, at its start, and covering whole chunks. Keys below the window
    of the chunk's first query hold NaN: they must not be read."""
    p = {"T": T, "NH": NH, "KVH": KVH, "D": D, "W": W}
    f = kernels(**p)
    r = np.random.default_rng(T * 100 + W)
    for S in sorted({T, T + 1, T + W - 1, T + W, T + 15, T + 16, 45, 100, 333}):
        q, k, v = qkv(r, T, NH, KVH, D, S)
        ref = ops.reference("attention", [q, k, v], **p)
        assert relerr(run(f, q, k, v), ref) <= 1e-5, S
        hidden = max(0, S - T + 1 - W)   # rows no query of the chunk sees
        k[:hidden], v[:hidden] = np.nan, np.nan
        out = run(f, q, k, v)
        assert np.all(np.isfinite(out)) and relerr(out, ref) <= 1e-5, S
    if W < 40:   # the window differs from full attention (so the test could fail)
        q, k, v = qkv(r, T, NH, KVH, D, 100)
        assert relerr(ops.reference("attention", [q, k, v], T=T, NH=NH, KVH=KVH, D=D), ops.reference(
            "attention", [q, k, v], **p)) > 1e-2


def test_windowed_kernel_other_widths_and_fallback(kernels):
    for cpu in (ops.CpuInfo(8), ops.CpuInfo(4)):
        for T, NH, KVH, D, W in [(1, 4, 2, 64, 7), (16, 4, 1, 8, 20), (5, 2, 2, 12, 1)]:
            p = {"T": T, "NH": NH, "KVH": KVH, "D": D, "W": W}
            r = np.random.default_rng(cpu.vector_lanes + T)
            for S in (T, T + 29, 200):
                q, k, v = qkv(r, T, NH, KVH, D, S)
                assert relerr(run(kernels(cpu, **p), q, k, v), ops.reference("attention", [q, k, v], **p)) <= 1e-5
    p = {"T": 4, "NH": 4, "KVH": 2, "D": 8, "W": 6}   # the plain fallback kernel (one row per task, no shuffle tree)
    r = np.random.default_rng(3)
    for S in (4, 9, 60):
        q, k, v = qkv(r, 4, 4, 2, 8, S)
        assert relerr(run(kernels(simple=True, **p), q, k, v), ops.reference("attention", [q, k, v], **p)) <= 1e-5


def test_windowed_decode_cost_does_not_grow_with_the_prefix(kernels):
    """Decode at position 60000 with a 256-key window reads O(W) keys, not the whole prefix."""
    T, NH, KVH, D, S = 1, 8, 2, 64, 60000
    r = np.random.default_rng(4)
    q, k, v = (tvm.runtime.tensor(a) for a in qkv(r, T, NH, KVH, D, S))
    out = tvm.runtime.tensor(np.zeros((T, NH * D), "float32"))

    def best(f):
        f(q, k, v, out)
        ts = []
        for _ in range(5):
            t0 = time.perf_counter()
            f(q, k, v, out)
            ts.append(time.perf_counter() - t0)
        return min(ts)

    full, win = best(kernels(T=T, NH=NH, KVH=KVH, D=D)), best(kernels(T=T, NH=NH, KVH=KVH, D=D, W=256))
    assert win * 10 < full, (win, full)


# ------------------------------------------------------------------------------------------------ models

def _mistral(path, window: int, seed: int):
    """make_checkpoint has no Mistral flavour: a Llama checkpoint (the same tensors) relabelled as Mistral."""
    d = make_checkpoint(path, "LlamaForCausalLM", seed=seed)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=window)
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    return d


# name -> (checkpoint maker, per-layer windows the spec must have)
MODELS = {
    "mistral-w6": (lambda p: _mistral(p, 6, seed=31), (6, 6)),
    "mistral-w19": (lambda p: _mistral(p, 19, seed=32), (19, 19)),   # windows holding whole 16-key chunks
    "qwen2-w5": (lambda p: make_checkpoint(p, "Qwen2ForCausalLM", seed=33, use_sliding_window=True, sliding_window=5,
                                           max_window_layers=1), (0, 5)),
    "qwen3-w7": (lambda p: make_checkpoint(p, "Qwen3ForCausalLM", seed=34, num_hidden_layers=3, use_sliding_window=True,
                                           sliding_window=7, layer_types=["sliding_attention", "full_attention",
                                                                          "sliding_attention"]), (7, 0, 7)),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("swa")
    return {name: make(root / name) for name, (make, _) in MODELS.items()}


@pytest.fixture(scope="module")
def packages(checkpoints, tmp_path_factory):
    root = tmp_path_factory.mktemp("swa_pkg")
    return {name: edgellm.compile(str(d), quant="f32", out=root / name, max_context=64, prefill_chunk=CHUNK,
                                  progress=False) for name, d in checkpoints.items()}


def numpy_model(ckpt, full=False, weight=None):
    spec, ck, _ = load_checkpoint(str(ckpt))
    if full:
        spec = dataclasses.replace(spec, layer_windows=())
    return NumpyModel(spec, weight or ck.get), spec


@pytest.mark.parametrize("name", sorted(MODELS))
def test_numpy_matches_transformers(name, checkpoints):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    ref, spec = numpy_model(checkpoints[name])
    assert spec.layer_windows == MODELS[name][1]
    W = min(w for w in spec.layer_windows if w)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(checkpoints[name]), dtype=torch.float32,
                                                           attn_implementation="eager").eval()
    with torch.no_grad():
        want = hf(torch.tensor([PROMPT])).logits[0].numpy().astype(np.float64)
        gen = hf.generate(torch.tensor([PROMPT]), max_new_tokens=N_GEN, min_new_tokens=N_GEN, do_sample=False,
                          pad_token_id=0, eos_token_id=None)[0, len(PROMPT):].tolist()
    assert relerr(ref.logits(PROMPT), want) < 1e-4
    assert ref.greedy(PROMPT, N_GEN) == gen
    # transformers really applies the window: full attention gives other logits past it (and the same before it)
    full = numpy_model(checkpoints[name], full=True)[0].logits(PROMPT)
    assert relerr(full[:W], want[:W]) < 1e-4 and relerr(full[W:], want[W:]) > 1e-2


@pytest.mark.parametrize("name", sorted(MODELS))
def test_package_matches_numpy(name, checkpoints, packages):
    """Chunked prefill (8-token chunks straddle the window's start) and decode against the numpy backend: logits at
    every position of prompt + generation, and 32 greedy tokens."""
    ref, spec = numpy_model(checkpoints[name])
    manifest = (packages[name] / "manifest.json").read_text()
    for w in set(spec.layer_windows) - {0}:
        assert f"_w{w}" in manifest   # the windowed kernels are in the package
    want_tokens = ref.greedy(PROMPT, N_GEN)
    seq = PROMPT + want_tokens
    want = ref.logits(seq)
    with edgellm.Runtime.load(packages[name], threads=2) as rt:
        assert relerr(rt.logits(seq), want) < 1e-4
        rt.reset()
        rows, tokens = [rt.prefill(PROMPT)], []
        for _ in range(N_GEN):
            tokens.append(int(np.argmax(rows[-1])))
            rows.append(rt.decode_step(tokens[-1]))
    assert tokens == want_tokens
    assert relerr(np.stack(rows[:-1]), want[len(PROMPT) - 1:-1]) < 1e-4
    full = numpy_model(checkpoints[name], full=True)[0].logits(seq)
    assert relerr(full, want) > 1e-2   # the window matters for this sequence


def test_f16_package_matches_numpy(checkpoints, tmp_path):
    """An f16 package against the numpy backend on the same f16-rounded matrices."""
    _, ck, _ = load_checkpoint(str(checkpoints["mistral-w6"]))

    def f16(name):
        w = np.asarray(ck.get(name))
        return w.astype(np.float16).astype(np.float64) if w.ndim == 2 else w

    ref, _ = numpy_model(checkpoints["mistral-w6"], weight=f16)
    seq = PROMPT + ref.greedy(PROMPT, N_GEN)
    pkg = edgellm.compile(str(checkpoints["mistral-w6"]), quant="f16", out=tmp_path / "f16", max_context=64,
                          prefill_chunk=CHUNK, progress=False)
    with edgellm.Runtime.load(pkg, threads=2) as rt:
        got = rt.logits(seq)
    assert relerr(got, ref.logits(seq)) < 1e-4


def test_window_covering_the_kv_cache_uses_the_full_attention_kernels(tmp_path):
    """A window at least as long as the package's KV rows (max_context + chunk) never cuts: the plain kernels."""
    ckpt = _mistral(tmp_path / "w72", 72, seed=35)
    pkg = edgellm.compile(str(ckpt), quant="f32", out=tmp_path / "pkg", max_context=64, prefill_chunk=CHUNK,
                          progress=False)
    manifest = (pkg / "manifest.json").read_text()
    assert "attention_t1_" in manifest and "attention_t8_" in manifest and "_w72" not in manifest
    ref, _ = numpy_model(ckpt)
    with edgellm.Runtime.load(pkg, threads=2) as rt:
        assert relerr(rt.logits(PROMPT), ref.logits(PROMPT)) < 1e-4
