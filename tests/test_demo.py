"""The bundled demo models: they load, match transformers, beat a unigram baseline, and `edgellm eval ppl` agrees
with a perplexity computed by transformers."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from edgellm.models import load_checkpoint
from edgellm.models.demo import DEMO_DIR, HELDOUT
from edgellm.models.numpy_backend import NumpyModel
from edgellm.runtime.python.perplexity import nll_sum, windows

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tok():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(DEMO_DIR / "demo-llama" / "tokenizer.json"))


@pytest.fixture(scope="module")
def heldout_ids(tok):
    return tok.encode(HELDOUT.read_text()).ids


@pytest.fixture(scope="module")
def unigram_logp(tok):
    """Add-one unigram over the training split, rebuilt from this machine's standard library (the corpus)."""
    from edgellm.models.demo.train import encode_docs
    from edgellm.quant.corpus import build_corpus, split_corpus

    train, _ = split_corpus(build_corpus())
    counts = np.bincount(encode_docs(tok, train), minlength=tok.get_vocab_size()).astype(np.float64) + 1
    return np.log(counts / counts.sum())


def unigram_ppl(logp, ids, context, stride):
    tgt = [t for _, end, first in windows(len(ids), context, stride) for t in ids[first:end]]
    return math.exp(-float(np.mean(logp[tgt])))


@pytest.mark.parametrize("name,arch,lo,hi", [("demo", "LlamaForCausalLM", 5e6, 15e6),
                                              ("demo-moe", "MixtralForCausalLM", 5e6, 15e6),
                                              ("demo-bitnet", "BitNetForCausalLM", 1e6, 15e6)])
def test_demo_models_load(name, arch, lo, hi):
    from edgellm.models import family

    spec, ck, d = load_checkpoint(name)
    assert spec.arch == arch and d.parent == DEMO_DIR
    n = sum(int(np.prod(s)) for s in family(spec).weight_shapes(spec).values())
    assert lo <= n <= hi, n


def test_demo_draft_is_tiny_and_shares_the_tokenizer():
    """demo-draft (speculative decoding's draft for the demo family): under a million parameters, demo-llama's
    tokenizer byte for byte, and its top token is demo-llama's often enough to be worth a guess (results.json)."""
    from edgellm.models import family

    spec, ck, d = load_checkpoint("demo-draft")
    n = sum(int(np.prod(s)) for s in family(spec).weight_shapes(spec).values())
    assert 1e5 <= n <= 1e6, n
    assert (d / "tokenizer.json").read_bytes() == (DEMO_DIR / "demo-llama" / "tokenizer.json").read_bytes()
    r = json.loads((DEMO_DIR / "results.json").read_text())["models"]["draft"]
    assert r["distilled_from"] == "demo-llama" and r["top1_agreement_with_target"] > 0.4


@pytest.mark.parametrize("name", ["demo-llama", "demo-moe"])
def test_demo_numpy_matches_transformers(name, heldout_ids):
    spec, ck, d = load_checkpoint(name)
    ids = heldout_ids[:48]
    hf = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    ours = NumpyModel(spec, ck.get)
    greedy = ours.greedy(ids, 16)
    # Teacher-forced: transformers' argmax after every prefix of our greedy sequence is our next token. (Its
    # KV-cached generate() is not used as the reference: on these trained models it drifts from its own full
    # forward by ~1e-2 in the logits and flips a 0.0099 top-2 margin; its full forward agrees with ours to 1e-6.)
    with torch.no_grad():
        ref = hf(torch.tensor([ids + greedy])).logits[0].numpy()
    assert np.abs(ours.logits(ids) - ref[:len(ids)]).max() / np.abs(ref).max() < 1e-4
    assert ref[len(ids) - 1:-1].argmax(-1).tolist() == greedy


def test_eval_ppl_matches_transformers_and_beats_unigram(tmp_path, heldout_ids, unigram_logp):
    n, ctx, stride = 2000, 256, 128
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "edgellm.cli", "eval", "ppl", "demo", "--max-tokens", str(n),
                        "--context", str(ctx), "--stride", str(stride), "--json", "--quiet"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    ours = json.loads(r.stdout)
    assert str(tmp_path) in ours["package"]  # compiled on first use into XDG_CACHE_HOME
    hf = transformers.AutoModelForCausalLM.from_pretrained(DEMO_DIR / "demo-llama", dtype=torch.float32).eval()

    def logits(ids):
        with torch.no_grad():
            return hf(torch.tensor([ids])).logits[0].numpy()

    total, count = nll_sum(logits, heldout_ids[:n], ctx, stride)
    assert count == ours["tokens"] == n - 1
    ref = math.exp(total / count)
    assert abs(ours["ppl"] - ref) / ref < 0.01, (ours["ppl"], ref)
    uni = unigram_ppl(unigram_logp, heldout_ids[:n], ctx, stride)
    assert ours["ppl"] < uni / 3, (ours["ppl"], uni)


@pytest.mark.parametrize("name", ["demo-moe", "demo-bitnet"])
def test_demo_below_unigram_numpy(name, heldout_ids, unigram_logp):
    spec, ck, _ = load_checkpoint(name)
    m = NumpyModel(spec, ck.get, dtype=np.float32)
    ids, ctx = heldout_ids[:768], 256
    total, count = nll_sum(m.logits, ids, ctx, ctx)
    ppl, uni = math.exp(total / count), unigram_ppl(unigram_logp, ids, ctx, ctx)
    assert ppl < uni / 3, (ppl, uni)


def test_demo_moe_uses_all_experts(heldout_ids):
    """The load-balancing loss worked: on held-out text (8 windows of the 256-token training context) every expert
    of every layer takes >= 3% of the top-k picks (uniform would be 12.5%)."""
    spec, ck, _ = load_checkpoint("demo-moe")
    x = NumpyModel(spec, ck.get, dtype=np.float32)
    g = x.g
    picks = []
    orig = g.route

    def spy(h, router, top_k, normalize):
        top, wts = orig(h, router, top_k, normalize)
        picks.append(top)
        return top, wts

    g.route = spy
    for w in range(8):
        x.forward(heldout_ids[w * 256:(w + 1) * 256])
    L = spec.n_layers
    assert len(picks) == 8 * L
    for layer in range(L):
        sel = np.concatenate([p.reshape(-1) for p in picks[layer::L]])
        share = np.bincount(sel, minlength=spec.n_experts) / sel.size
        assert share.min() >= 0.03, (layer, share)


def test_demo_bitnet_numpy_agrees_with_transformers(heldout_ids):
    """BitNet's int8 activation rounding is discontinuous: float64 vs float32 sums flip an occasional rounding step,
    so logits agree to ~2e-3 (not 1e-4) and the predicted tokens agree everywhere."""
    spec, ck, d = load_checkpoint("demo-bitnet")
    ids = heldout_ids[:64]
    hf = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].numpy()
    got = NumpyModel(spec, ck.get).logits(ids)
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-2
    assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.95


def test_bitnet_unpack_matches_transformers_pack():
    from transformers.integrations.bitnet import pack_weights

    from edgellm.models.bitnet import unpack_ternary

    w = np.random.default_rng(0).integers(-1, 2, size=(12, 5)).astype(np.int8)
    packed = pack_weights(torch.tensor(w, dtype=torch.int8).clone()).numpy()
    assert packed.shape == (3, 5) and (unpack_ternary(packed) == w).all()
