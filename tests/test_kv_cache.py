"""f16 K/V caches (`edgellm compile --kv-cache f16`, issue 38): the attention kernel reads a float16 cache and widens
each element as it reads it (against the numpy reference on the same rounded K/V, plain, windowed, token trees); a
package with one gives the logits of the f32-cache package to f16 rounding, half its KV bytes, and everything the
cache takes part in works as with f32: speculation's greedy identity (tree rows are decode rows), window caches,
saved contexts, context shift, bin/edgellm-run. Targets whose kernels or graphs read f32 caches refuse it in one
line. On a real model (opt-in tier): perplexity within 1% of the f32 cache's."""
from __future__ import annotations

import json

import numpy as np
import pytest

import edgellm
from edgellm.errors import EdgeLLMError
from edgellm.models.synthetic import make_checkpoint

from real_checkpoints import enabled, gguf_file

tvm = pytest.importorskip("tvm")

CTX = 128
PROMPT = [int(t) for t in np.random.default_rng(3).integers(3, 400, 40)]


def relerr(a, b):
    return float(np.abs(np.asarray(a, np.float64) - b).max() / np.abs(b).max())


@pytest.mark.parametrize("T_,S,W,tree", [(1, 37, 0, False), (8, 45, 0, False), (1, 70, 9, False), (8, 80, 9, False),
                                        (4, 40, 0, True)])
def test_the_attention_kernel_reads_a_float16_cache(T_, S, W, tree):
    from edgellm.compiler import ops

    cpu, target = ops.host_cpu_info(2), ops.llvm_target(2)
    NH, KVH, D = 4, 2, 16
    r = np.random.default_rng(S)
    q = r.standard_normal((T_, NH, D)).astype(np.float32)
    k16, v16 = (r.standard_normal((S, KVH, D)).astype(np.float16) for _ in range(2))
    outs = {}
    for kv, (k, v) in (("float16", (k16, v16)), ("float32", (k16.astype(np.float32), v16.astype(np.float32)))):
        name, f = ops.make_kernel("attention", cpu, T=T_, NH=NH, KVH=KVH, D=D, W=W, kv=kv, M=tree)
        assert name.endswith("_kvf16") == (kv == "float16")
        fn = tvm.compile(tvm.IRModule({name: f}), target=target).jit()[name]
        args = [q, k, v] + ([np.array([list(range(T_))] + [[0] * T_ if t == 0 else list(range(t + 1)) + [t] *
                                                           (T_ - t - 1) for t in range(T_)], np.int32)] if tree else [])
        out = tvm.runtime.tensor(np.zeros((T_, NH * D), np.float32))
        fn(*[tvm.runtime.tensor(np.ascontiguousarray(a)) for a in args], out)
        outs[kv] = out.numpy()
    # the same K/V values (f16 widened exactly): the f16 kernel's sums are the f32 kernel's
    assert np.array_equal(outs["float16"], outs["float32"])


class _Packages(dict):
    """(model, cache type) -> package, compiled on first use (the fast tier needs only some)."""

    def __init__(self, tiny_models, root):
        super().__init__()
        self.tiny_models, self.root = tiny_models, root

    def __missing__(self, key):
        name, kind = key
        if name == "llama":
            ck, q = self.tiny_models["llama-gqa"], "q8"
        else:
            ck, q = make_checkpoint(self.root / "gemma2", "Gemma2ForCausalLM", seed=43, num_hidden_layers=3,
                                    tie_word_embeddings=True, sliding_window=6), "f32"
        self[key] = edgellm.compile(str(ck), quant=q, out=self.root / f"{name}-{kind}", max_context=CTX,
                                    prefill_chunk=8, tune="off", progress=False, verify_tokens=8, kv_cache=kind)
        return self[key]


@pytest.fixture(scope="module")
def packages(tiny_models, tmp_path_factory):
    return _Packages(tiny_models, tmp_path_factory.mktemp("kvc"))


@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_an_f16_cache_gives_the_f32_caches_logits_in_half_the_bytes(packages, name):
    with edgellm.Runtime.load(packages[name, "f32"], threads=2) as a, \
            edgellm.Runtime.load(packages[name, "f16"], threads=2) as b:
        assert json.loads((packages[name, "f16"] / "manifest.json").read_text())["kv_cache"] == "f16"
        assert b.stats()["kv_bytes"] * 2 == a.stats()["kv_bytes"]
        long = PROMPT * 2   # past the window caches' moves (gemma2)
        # f16 rounding of K/V (~5e-4); a q8 body's int8 activations amplify it on a random model (flipped roundings)
        bound = 3e-2 if name == "llama" else 5e-3
        assert relerr(b.logits(long), a.logits(long)) < bound
        ca, cb = a.new_context(), b.new_context()
        ca.prefill(PROMPT)
        cb.prefill(PROMPT)
        for t in PROMPT[:20]:   # decode steps read rows written by prefill and by decode
            assert relerr(cb.decode_step(t), ca.decode_step(t)) < bound


def test_speculation_state_and_shift_with_an_f16_cache(packages, tmp_path):
    with edgellm.Runtime.load(packages["llama", "f16"], threads=2) as rt:
        copy = PROMPT + PROMPT[:20]
        plain = rt.generate(copy, max_new_tokens=48, temperature=0, ignore_eos=True).token_ids
        for mode in ("ngram", "recycle"):
            ctx = rt.new_context()
            assert ctx.generate(copy, max_new_tokens=48, temperature=0, ignore_eos=True,
                                speculate=mode).token_ids == plain, mode
            assert ctx.stats()["spec_accepted"] > 0
        ctx = rt.new_context()
        r = ctx.generate(copy, max_new_tokens=16, temperature=0, ignore_eos=True)
        ctx.save(tmp_path / "c.state")
        other = rt.new_context()
        other.load(tmp_path / "c.state")
        assert np.array_equal(ctx.decode_step(r.token_ids[-1]), other.decode_step(r.token_ids[-1]))
        long = rt.generate(PROMPT, max_new_tokens=2 * CTX, temperature=0, ignore_eos=True, context_shift=True)
        assert long.finish_reason == "length" and rt.context.stats()["context_shifts"] >= 1


def test_targets_that_read_f32_caches_refuse_it(tiny_models, tmp_path):
    from edgellm.errors import CompileError

    for target in ("opencl", "host-npu"):
        with pytest.raises(CompileError, match="--kv-cache f16") as e:
            edgellm.compile(str(tiny_models["llama-gqa"]), target=target, quant="f16", out=tmp_path / target,
                            kv_cache="f16", progress=False)
        assert "\n" not in str(e.value) and not (tmp_path / target).exists()
    with pytest.raises(EdgeLLMError, match="--kv-cache"):
        edgellm.compile(str(tiny_models["llama-gqa"]), quant="f16", out=tmp_path / "x", kv_cache="q3", progress=False)


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.skipif(not enabled(), reason="real-checkpoint tier: set EDGELLM_REAL=1")
def test_a_real_models_perplexity_with_an_f16_cache(tmp_path):
    """SmolLM2-135M-Instruct (its GGUF, --quant auto): perplexity over a real text with the f16 cache within 1% of
    the f32 cache's, and greedy replies to real chat prompts mostly the same."""
    from edgellm.runtime.python.perplexity import perplexity

    from real_checkpoints import CHAT

    g = gguf_file("smollm2-135m")
    pk = {k: edgellm.compile(str(g), quant="auto", out=tmp_path / k, max_context=1024, tune="off", progress=False,
                             kv_cache=k) for k in ("f32", "f16")}
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")[:12000]
    ppl = {}
    for k, p in pk.items():
        with edgellm.Runtime.load(p, threads=2) as rt:
            ppl[k] = perplexity(rt, text, context=512, max_tokens=1500)["ppl"]
    assert abs(ppl["f16"] / ppl["f32"] - 1) < 1e-2, ppl   # measured +0.57% (58.89 vs 58.56)
    with edgellm.Runtime.load(pk["f32"], threads=2) as a, edgellm.Runtime.load(pk["f16"], threads=2) as b:
        same = 0
        for c in CHAT[:3]:
            ids = a.encode(a.text.apply_chat_template([{"role": "user", "content": c}], add_generation_prompt=True),
                           add_special_tokens=False)
            x, y = a.generate(ids, max_new_tokens=32, temperature=0), b.generate(ids, max_new_tokens=32, temperature=0)
            same += next((i for i, (u, v) in enumerate(zip(x.token_ids, y.token_ids)) if u != v), len(x.token_ids))
        assert same >= 48, same   # of 96 greedy tokens, the first divergence (f16 rounding at a near-tie) comes late
