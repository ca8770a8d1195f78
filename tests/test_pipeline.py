"""Compiled packages through the C runtime against the numpy reference backend."""
import json
import subprocess
import sys

import numpy as np
import pytest

import edgellm
from edgellm.models import load_checkpoint
from edgellm.models.numpy_backend import NumpyModel
from edgellm.models.synthetic import make_checkpoint

PROMPT = [5, 17, 33, 2, 99, 250, 7, 64, 128, 3, 11, 300]  # 12 tokens: one full chunk of 8 + a padded one
CHUNK = 8


def relerr(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="session")
def packages(tiny_models, tmp_path_factory):
    """name -> f32 package of every tiny model."""
    root = tmp_path_factory.mktemp("pkg")
    return {n: edgellm.compile(str(d), quant="f32", out=root / n, max_context=96, prefill_chunk=CHUNK, progress=False)
            for n, d in tiny_models.items()}


@pytest.fixture(params=["llama-gqa", "llama-tied-hd8", "llama3-hd64", "qwen2", "qwen3", "gemma3"])
def name(request):
    return request.param


def test_logits_and_greedy_match_numpy(name, packages, tiny_models):
    spec, ck, _ = load_checkpoint(str(tiny_models[name]))
    ref = NumpyModel(spec, ck.get)
    with edgellm.Runtime.load(packages[name], threads=2) as rt:
        got = rt.logits(PROMPT)
        assert got.shape == (len(PROMPT), spec.vocab_size) and got.dtype == np.float32
        assert relerr(got, ref.logits(PROMPT)) < 1e-4
        out = rt.generate(PROMPT, max_new_tokens=32, ignore_eos=True)
    assert out.token_ids == ref.greedy(PROMPT, 32)


def test_yarn_package_matches_numpy(tmp_path):
    """YaRN's tables (interpolated frequencies, cos/sin times its attention factor) reach the package as they reach
    the numpy model, which matches transformers (tests/test_models_vs_transformers.py)."""
    ck_dir = make_checkpoint(tmp_path / "yarn", "LlamaForCausalLM", seed=5, max_position_embeddings=128,
                             rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32})
    spec, ck, _ = load_checkpoint(str(ck_dir))
    ref = NumpyModel(spec, ck.get)
    pkg = edgellm.compile(str(ck_dir), quant="f32", out=tmp_path / "p", max_context=96, prefill_chunk=CHUNK,
                          progress=False)
    with edgellm.Runtime.load(pkg, threads=2) as rt:
        assert relerr(rt.logits(PROMPT), ref.logits(PROMPT)) < 1e-4
        assert rt.generate(PROMPT, max_new_tokens=32, ignore_eos=True).token_ids == ref.greedy(PROMPT, 32)


@pytest.mark.parametrize("quant", ["f32", "q8"])
def test_llama_biases_package_matches_numpy(quant, tmp_path):
    """Llama's attention_bias (q/k/v fused with their biases, o_proj's) and mlp_bias (gate/up fused, down) through
    the compiled package: f32 against the numpy model, q8 against the numpy model of its quantized weights'
    tolerance (the same top token at every position)."""
    ck_dir = make_checkpoint(tmp_path / "b", "LlamaForCausalLM", seed=4, attention_bias=True, mlp_bias=True)
    spec, ck, _ = load_checkpoint(str(ck_dir))
    ref = NumpyModel(spec, ck.get)
    pkg = edgellm.compile(str(ck_dir), quant=quant, out=tmp_path / "p", max_context=96, prefill_chunk=CHUNK,
                          progress=False)
    with edgellm.Runtime.load(pkg, threads=2) as rt:
        got, want = rt.logits(PROMPT), ref.logits(PROMPT)
        if quant == "f32":
            assert relerr(got, want) < 1e-4
            assert rt.generate(PROMPT, max_new_tokens=32, ignore_eos=True).token_ids == ref.greedy(PROMPT, 32)
        else:
            assert relerr(got, want) < 0.05 and (got.argmax(-1) == want.argmax(-1)).mean() >= 0.9
    if quant == "f32":   # the neuron-bundled layout would drop the MLP biases: refused in one line
        with pytest.raises(edgellm.EdgeLLMError, match="--layout bundled does not handle MLP biases"):
            edgellm.compile(str(ck_dir), quant="f16", layout="bundled", out=tmp_path / "bundled", progress=False)
        assert not (tmp_path / "bundled").exists()


def test_chunked_prefill_equals_token_by_token(packages):
    with edgellm.Runtime.load(packages["llama-gqa"], threads=2) as rt:
        chunked = rt.logits(PROMPT)
        rt.reset()
        rows = [rt.decode_step(t) for t in PROMPT]
        # last-row prefill (the generation path: prefill program + head program)
        rt.reset()
        last = rt.prefill(PROMPT)
    assert relerr(np.stack(rows), chunked) < 1e-5
    assert relerr(last, chunked[-1]) < 1e-6


def test_chunk_size_does_not_change_logits(tiny_models, tmp_path, packages):
    other = edgellm.compile(str(tiny_models["qwen3"]), quant="f32", out=tmp_path / "c5", max_context=96,
                            prefill_chunk=5, progress=False)
    with edgellm.Runtime.load(other) as a, edgellm.Runtime.load(packages["qwen3"]) as b:
        assert relerr(a.logits(PROMPT), b.logits(PROMPT)) < 1e-5


@pytest.mark.parametrize("quant", ["f32"])   # f16: tests/test_tune.py (every chunk bit-identical) + test_f16_package
def test_long_chunk_matches_numpy(tiny_models, tmp_path, quant):
    """Prefill chunks of 32 and 128 tokens (x86: the outer-product GEMM, gemm_outer) against the numpy model, with a
    prompt that fills one 32-token chunk and pads the next (and pads most of a 128-token one)."""
    spec, ck, _ = load_checkpoint(str(tiny_models["llama-gqa"]))
    ref = NumpyModel(spec, ck.get)
    prompt = [(7 * i + 3) % spec.vocab_size for i in range(45)]
    want = ref.logits(prompt)
    for chunk in (32, 128):
        pkg = edgellm.compile(str(tiny_models["llama-gqa"]), quant=quant, out=tmp_path / f"c{chunk}", max_context=160,
                              prefill_chunk=chunk, progress=False)
        with edgellm.Runtime.load(pkg, threads=2) as rt:
            got = rt.logits(prompt)
        assert relerr(got, want) < (1e-4 if quant == "f32" else 2e-2), chunk


def test_short_prefill_program(tiny_models, tmp_path, packages):
    """A package with 64-token chunks carries a 16-token prefill program; the last piece of a prompt runs through it
    when it needs at most half a chunk of short chunks (the KV rows it writes serve the decode that follows)."""
    spec, ck, _ = load_checkpoint(str(tiny_models["llama-gqa"]))
    ref = NumpyModel(spec, ck.get)
    pkg = edgellm.compile(str(tiny_models["llama-gqa"]), quant="f32", out=tmp_path / "c64", max_context=160,
                          prefill_chunk=64, progress=False)
    m = json.loads((pkg / "manifest.json").read_text())
    assert m["prefill_short_chunk"] == 16 and m["programs"]["prefill_short"]["tokens"] == 16
    prompt = [(11 * i + 5) % spec.vocab_size for i in range(134)]
    # prompt length -> (64-token runs, 16-token runs): 40 tokens would need 48 > 32 short rows, so one long chunk
    runs = {5: (0, 1), 32: (0, 2), 40: (1, 0), 70: (1, 1), 133: (2, 1)}
    with edgellm.Runtime.load(pkg, threads=2) as rt:
        for n in runs:
            rt.reset()
            last = rt.prefill(prompt[:n])
            nxt = rt.decode_step(prompt[n])
            want = ref.logits(prompt[:n + 1])
            assert relerr(last, want[n - 1]) < 1e-4 and relerr(nxt, want[n]) < 1e-4, n
    # which programs ran: the runtime profile counts runs per program
    code = ("import edgellm, sys\n"
            "with edgellm.Runtime.load(sys.argv[1], threads=2) as rt:\n"
            f"    for n in {list(runs)}:\n"
            f"        rt.reset(); rt.prefill({prompt}[:n])\n")
    p = subprocess.run([sys.executable, "-c", code, str(pkg)], capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "EDGELLM_PROFILE": "1"})
    assert p.returncode == 0, p.stderr
    counts = {ln.split()[2].rstrip(","): int(ln.split()[3]) for ln in p.stderr.splitlines()
              if ln.startswith("edgellm profile:")}
    assert counts["prefill"] == sum(b for b, _ in runs.values()) and counts["prefill_short"] == sum(
        s for _, s in runs.values()), counts
    short_chunks = json.loads((packages["llama-gqa"] / "manifest.json").read_text())   # 8-token chunks: no program
    assert short_chunks["prefill_short_chunk"] is None and "prefill_short" not in short_chunks["programs"]


def test_profile_report(packages):
    """EDGELLM_PROFILE=1: per-program kernel tables on stderr when the model is freed; every plan step counted."""
    code = ("import edgellm, sys\n"
            "with edgellm.Runtime.load(sys.argv[1], threads=2) as rt:\n"
            "    rt.generate([5, 17, 33], max_new_tokens=4, ignore_eos=True)\n")
    env = {**__import__("os").environ, "EDGELLM_PROFILE": "1"}
    p = subprocess.run([sys.executable, "-c", code, str(packages["llama-gqa"])], capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    plan = json.loads((packages["llama-gqa"] / "manifest.json").read_text())["programs"]
    for prog in ("prefill", "decode"):
        head = next(ln for ln in p.stderr.splitlines() if ln.startswith(f"edgellm profile: {prog},"))
        rows = p.stderr.split(head, 1)[1].split("edgellm profile:")[0].strip().splitlines()[1:]
        steps = sum(int(r.split()[2]) for r in rows)
        shares = sum(float(r.split()[0]) for r in rows)
        assert steps == plan[prog]["steps"] and abs(shares - 100) < 0.1, (prog, rows)
    off = subprocess.run([sys.executable, "-c", code, str(packages["llama-gqa"])], capture_output=True, text=True,
                         env={**env, "EDGELLM_PROFILE": "0"}, timeout=120)
    assert "edgellm profile" not in off.stderr


def test_threads_do_not_change_results(packages):
    outs = []
    for t in (1, 2, 3):
        with edgellm.Runtime.load(packages["llama-gqa"], threads=t) as rt:
            assert rt.threads == t
            outs.append(rt.logits(PROMPT))
    assert relerr(outs[0], outs[1]) < 1e-5 and relerr(outs[0], outs[2]) < 1e-5


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_f16_package(tmp_path, dtype):
    """f16 storage: the package must equal the oracle on the same f16-rounded weights (the kernels do f32 math, so only
    summation order differs: 1e-4), and stay within 2e-2 of the f32 model (f16 rounding of weights is ~5e-4
    relative per weight; through 2 layers and a 997-way head the logit error measured here is ~3e-3)."""
    ck_dir = make_checkpoint(tmp_path / "ck", seed=7, dtype=dtype)
    pkg = edgellm.compile(str(ck_dir), quant="f16", out=tmp_path / "pkg", max_context=64, prefill_chunk=CHUNK,
                          progress=False)
    spec, ck, _ = load_checkpoint(str(ck_dir))

    def f16(name):
        w = ck.get(name)
        return w.astype(np.float16).astype(np.float32) if w.ndim == 2 else w

    with edgellm.Runtime.load(pkg) as rt:
        got = rt.logits(PROMPT)
        toks = rt.generate(PROMPT, max_new_tokens=32, ignore_eos=True).token_ids
    ref16 = NumpyModel(spec, f16)
    assert relerr(got, ref16.logits(PROMPT)) < 1e-4
    assert toks == ref16.greedy(PROMPT, 32)
    assert relerr(got, NumpyModel(spec, ck.get).logits(PROMPT)) < 2e-2
    m = json.loads((pkg / "manifest.json").read_text())
    assert {t["dtype"] for t in m["tensors"] if len(t["shape"]) == 2 and not t["name"].startswith("rope")} == {"float16"}


def test_eos_and_ignore_eos(tmp_path):
    ck0 = make_checkpoint(tmp_path / "a", seed=3)
    spec, ck, _ = load_checkpoint(str(ck0))
    greedy = NumpyModel(spec, ck.get).greedy(PROMPT, 12)
    eos = greedy[4]
    first = greedy.index(eos)
    ck1 = make_checkpoint(tmp_path / "b", seed=3, eos_token_id=eos)
    pkg = edgellm.compile(str(ck1), quant="f32", out=tmp_path / "p", max_context=64, prefill_chunk=CHUNK, progress=False)
    with edgellm.Runtime.load(pkg) as rt:
        r = rt.generate(PROMPT, max_new_tokens=12)
        assert r.finish_reason == "eos" and r.token_ids == greedy[:first]
        r = rt.generate(PROMPT, max_new_tokens=12, ignore_eos=True)
        assert r.finish_reason == "length" and r.token_ids == greedy


def test_max_new_tokens_stop_and_seed(packages):
    with edgellm.Runtime.load(packages["llama-gqa"]) as rt:
        full = rt.generate(PROMPT, max_new_tokens=20, ignore_eos=True)
        assert len(full.token_ids) == 20 and full.finish_reason == "length"
        assert len(rt.generate(PROMPT, max_new_tokens=3, ignore_eos=True).token_ids) == 3
        assert rt.generate(PROMPT, max_new_tokens=0).token_ids == []
        # a stop string taken from the middle of the greedy text cuts the text right before it
        text = full.text
        assert len(text) > 20
        i = len(text) // 2
        while "\ufffd" in text[i:i + 3]:
            i += 1
        stop = text[i:i + 3]
        r = rt.generate(PROMPT, max_new_tokens=20, ignore_eos=True, stop=[stop])
        assert r.finish_reason == "stop" and r.text == text[:text.index(stop)]
        assert "".join(rt.stream(PROMPT, max_new_tokens=20, ignore_eos=True, stop=stop)) == r.text
        # sampling: same seed -> same tokens; other seeds differ
        kw = dict(max_new_tokens=24, temperature=1.0, top_p=0.95, ignore_eos=True)
        a = rt.generate(PROMPT, seed=42, **kw).token_ids
        assert a == rt.generate(PROMPT, seed=42, **kw).token_ids
        assert any(rt.generate(PROMPT, seed=s, **kw).token_ids != a for s in (1, 2, 3))
        # top_k=1 sampling is greedy whatever the temperature
        assert rt.generate(PROMPT, max_new_tokens=10, temperature=2.0, top_k=1, seed=5,
                           ignore_eos=True).token_ids == full.token_ids[:10]


def test_text_prompt_and_chat(packages):
    with edgellm.Runtime.load(packages["llama-gqa"]) as rt:
        r = rt.generate("The quick brown fox", max_new_tokens=8, ignore_eos=True)
        ids = rt.text.encode("The quick brown fox")
        assert r.token_ids == rt.generate(ids, max_new_tokens=8, ignore_eos=True).token_ids
        assert r.prompt_tokens == len(ids) and r.prefill_tokens_per_s > 0 and r.decode_tokens_per_s > 0
        c = rt.chat([{"role": "user", "content": "hello"}], max_new_tokens=4, ignore_eos=True)
        assert len(c.token_ids) == 4


NO_TVM = """
import sys
{body}
bad = sorted(m for m in sys.modules if m == "tvm" or m.startswith("tvm.") or m.startswith("tvm_ffi"))
assert not bad, bad
print("OK")
"""


def test_runtime_path_never_imports_tvm(packages):
    for body in ("import edgellm.runtime\nimport edgellm",
                 f"from edgellm.cli import main\nassert main(['run', {str(packages['qwen2'])!r}, '-p', 'fox', '-n', '4']) == 0"):
        r = subprocess.run([sys.executable, "-c", NO_TVM.format(body=body)], capture_output=True, text=True)
        assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stderr
