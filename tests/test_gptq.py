"""GPTQ for the q4 schemes (quant/gptq.py) and its whole-model driver with calibration data (quant/calibration.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from edgellm.errors import CompileError
from edgellm.models import family, load_checkpoint
from edgellm.models.demo import HELDOUT
from edgellm.models.numpy_backend import NumpyGraph, NumpyModel
from edgellm.quant import calibration as cal
from edgellm.quant import get_scheme, packing, q4
from edgellm.quant.gptq import gptq_quantize


def _sampler(K: int, seed: int = 0):
    """Correlated activations with uneven channel scales (what makes GPTQ's compensation worth something)."""
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((K, K)) / np.sqrt(K)
    scale = np.exp(0.5 * rng.standard_normal(K))

    def draw(n):
        return ((rng.standard_normal((n, K)) @ A + 0.1 * rng.standard_normal((n, K))) * scale).astype(np.float32)
    return draw


def _check_parts_like_rtn(parts, w, G):
    ref = q4.quantize_q4(w, G)
    assert set(parts) == set(ref)
    for k in ref:
        assert parts[k].shape == ref[k].shape and parts[k].dtype == ref[k].dtype, k


@pytest.mark.parametrize("G", [32, 128])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_codes_scales_and_error_vs_rtn(act_order, G):
    N, K = 96, 256
    draw = _sampler(K)
    W = (np.random.default_rng(1).standard_normal((N, K)) * 0.05).astype(np.float32)
    X, X_test = draw(1024), draw(1024)
    H = 2.0 * X.T.astype(np.float64) @ X / len(X)
    q, s = gptq_quantize(W, H, G, act_order=act_order)
    assert q.dtype == np.int8 and q.shape == (N, K) and q.min() >= -8 and q.max() <= 7
    assert s.dtype == np.float32 and s.shape == (N, K // G)
    assert np.array_equal(s.astype(np.float16).astype(np.float32), s)          # exact f16 values
    parts = q4.pack_q4(q, s)
    _check_parts_like_rtn(parts, W, G)
    Wq = q4.dequantize_q4(parts)
    # the dequantized weights are the codes times exactly the stored f16 scales
    assert np.array_equal(packing.unpack_group_scales(parts["scales"]).astype(np.float32), s)
    assert np.array_equal(Wq, (q.astype(np.float32).reshape(N, K // G, G) * s[..., None]).reshape(N, K))
    if act_order:   # static groups: the scales are RTN's, from the original W
        assert np.array_equal(parts["scales"], q4.quantize_q4(W, G)["scales"])
    Wr = q4.dequantize_q4(q4.quantize_q4(W, G))
    for Xe in (X, X_test):   # calibration inputs and fresh inputs of the same distribution
        err_g = np.linalg.norm(Xe @ W.T - Xe @ Wq.T)
        err_r = np.linalg.norm(Xe @ W.T - Xe @ Wr.T)
        assert err_g < 0.8 * err_r, (err_g, err_r)


@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_without_correlation_is_rtn(act_order):
    """H diagonal (identity or not): every compensation term is zero, so GPTQ gives RTN's codes and scales."""
    rng = np.random.default_rng(2)
    W = (rng.standard_normal((40, 128)) * 0.02).astype(np.float32)
    for H in (np.eye(128), np.diag(rng.uniform(0.5, 2.0, 128))):
        for G in (32, 64, 128):
            parts = q4.pack_q4(*gptq_quantize(W, H, G, act_order=act_order))
            ref = q4.quantize_q4(W, G)
            assert np.array_equal(parts["qweight"], ref["qweight"]) and np.array_equal(parts["scales"], ref["scales"])


def test_gptq_dead_inputs():
    draw = _sampler(64, seed=3)
    X = draw(256)
    X[:, 5] = 0.0
    W = (np.random.default_rng(3).standard_normal((16, 64))).astype(np.float32)
    q, s = gptq_quantize(W, X.T.astype(np.float64) @ X, 32)
    assert not q[:, 5].any()


def test_calibration_file_errors(tmp_path):
    tok = load_checkpoint("demo-llama")[2] / "tokenizer.json"
    with pytest.raises(CompileError, match="calibration file not found"):
        cal.calibration_ids(tok, tmp_path / "nope.txt")
    (tmp_path / "short.txt").write_text("hi")
    with pytest.raises(CompileError, match="tokens"):
        cal.calibration_ids(tok, tmp_path / "short.txt")
    (tmp_path / "c.txt").write_text(HELDOUT.read_text()[:20000])
    seqs = cal.calibration_ids(tok, tmp_path / "c.txt", n_tokens=1024, seq_len=128)
    assert len(seqs) == 8 and all(len(s) == 128 for s in seqs)


def test_gptq_model_guards(monkeypatch):
    spec, ck, _ = load_checkpoint("demo-llama")
    with pytest.raises(CompileError, match="q4"):
        cal.gptq_model(spec, ck.get, get_scheme("q8"), [[1, 2, 3]])
    monkeypatch.setattr(cal, "available_memory", lambda: 1 << 20)
    with pytest.raises(CompileError, match="GPTQ needs ~.*drop --gptq"):
        cal.gptq_model(spec, ck.get, get_scheme("q4g32"), [[1, 2, 3]])


@pytest.mark.parametrize("model", ["demo-llama", "demo-moe"])
def test_layer_by_layer_forward_matches_numpy_backend(model):
    """The per-layer evaluation gptq_model runs (earlier layers skipped, hidden state substituted) is the
    numpy backend's forward pass."""
    spec, ck, _ = load_checkpoint(model)
    ids = list(range(1, 40))
    fwd = family(spec)
    x = cal._run(fwd, spec, cal._Weights(ck.get), np.float64, -1, None, ids, None)
    for layer in range(spec.n_layers):
        x = cal._run(fwd, spec, cal._Weights(ck.get), np.float64, layer, x, ids, cal._Capture({}, 0))
    ref = fwd.body(NumpyGraph(spec, ck.get, np.float64), ids)
    np.testing.assert_allclose(x, ref, rtol=1e-9, atol=1e-9)


def _logprobs(spec, getw, ids, ctx=256):
    """Next-token log-probabilities of ids[1:], in windows of ctx tokens (models/demo/train.py's windows)."""
    m, out = NumpyModel(spec, getw, np.float64), []
    for s in range(0, len(ids) - 1, ctx):
        lg = m.logits(ids[s:s + ctx + 1][:-1])
        lg -= lg.max(-1, keepdims=True)
        out.append(lg - np.log(np.exp(lg).sum(-1, keepdims=True)))
    return np.concatenate(out)


def test_gptq_model_demo_llama():
    spec, ck, d = load_checkpoint("demo-llama")
    seqs = cal.calibration_ids(d / "tokenizer.json", n_tokens=512, seq_len=128)   # built-in text
    assert len(seqs) == 4 and all(len(s) == 128 for s in seqs)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    heldout = HELDOUT.read_text(encoding="utf-8")
    assert not any(tok.decode(s) in heldout for s in seqs)      # calibration never sees held-out text
    scheme = get_scheme("q4g32")
    calls = []
    res = cal.gptq_model(spec, ck.get, scheme, seqs, progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (spec.n_layers, spec.n_layers)
    body = {n for n, s in family(spec).weight_shapes(spec).items() if ".layers." in n and len(s) == 2}
    assert set(res) == body and len(body) == 7 * spec.n_layers
    for name, parts in res.items():
        _check_parts_like_rtn(parts, ck.get(name), 32)

    ids = tok.encode(heldout).ids[:1025]
    tgt = np.array(ids[1:])
    ref = _logprobs(spec, ck.get, ids)

    def score(deq):
        lp = _logprobs(spec, lambda n: deq[n] if n in deq else ck.get(n), ids)
        return math.exp(-lp[np.arange(len(tgt)), tgt].mean()), float((np.exp(ref) * (ref - lp)).sum(-1).mean())

    ppl_f32 = math.exp(-ref[np.arange(len(tgt)), tgt].mean())
    ppl_rtn, kl_rtn = score({n: scheme.dequantize(scheme.quantize(ck.get(n))) for n in res})
    ppl_gptq, kl_gptq = score({n: scheme.dequantize(p) for n, p in res.items()})
    # GPTQ's model is much closer to the float model than RTN's (KL(f32 || quantized) per token) ...
    print(f"demo-llama q4g32, {len(tgt)} held-out tokens: ppl f32 {ppl_f32:.3f} RTN {ppl_rtn:.3f} GPTQ {ppl_gptq:.3f}; "
          f"KL RTN {kl_rtn:.2e} GPTQ {kl_gptq:.2e}")
    assert kl_gptq < 0.5 * kl_rtn, (kl_gptq, kl_rtn)
    # ... but q4 barely moves this small model's perplexity: on all 57k held-out tokens RTN q4g32 is +0.07% over
    # f32 and GPTQ +0.06% (q4g128: +0.12% / +0.02%), so on 1024 tokens the ppl difference between RTN and GPTQ is
    # noise (here 180.58 vs 180.54). Check that GPTQ stays at f32's level and is not worse than RTN.
    assert abs(ppl_gptq / ppl_f32 - 1) < 0.005, (ppl_f32, ppl_rtn, ppl_gptq)
    assert ppl_gptq < ppl_rtn * 1.001, (ppl_rtn, ppl_gptq)
