"""Quantized packages through the C runtime against the numpy oracle on the same quantized weights
(quant/reference_model.py: dequantized weights + the kernels' int8 activation quantization, modelled exactly)."""
import json

import numpy as np
import pytest

import edgellm
from edgellm.cli import main
from edgellm.models import load_checkpoint
from edgellm.models.synthetic import make_checkpoint
from edgellm.quant import get_scheme
from edgellm.quant.reference_model import QuantizedModel

PROMPT = [5, 17, 33, 2, 99, 250, 7, 64, 128, 3, 11, 300]
# The oracle runs f32 like the kernels, but sums in another order: an activation that lands within one f32 ulp of
# a rounding boundary of its int8 quantization can flip one step (1/127 of that block's absmax), so logits agree
# to ~1e-3 of their range rather than 1e-5; greedy tokens are asserted identical.
TOL = 2e-3


def relerr(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("qckpt")
    base = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 32, "vocab_size": 997}   # vocab 997: the q8 head has a 5-row tail panel
    return {
        "llama": make_checkpoint(root / "llama", seed=3, **base),
        "qwen2-tied": make_checkpoint(root / "qwen2", "Qwen2ForCausalLM", seed=4, tie_word_embeddings=True, **base),
    }


def compiled(ckpt, tmp_path, quant, **kw):
    return edgellm.compile(str(ckpt), quant=quant, out=tmp_path / f"{quant}-{kw.get('head_quant')}", max_context=96,
                           prefill_chunk=8, progress=False, **kw)


@pytest.mark.parametrize("model,quant", [("llama", "q8"), ("llama", "q4g32"), ("llama", "q4g128"), ("llama", "t2"),
                                         ("qwen2-tied", "q4g64"), ("qwen2-tied", "q8")])
def test_package_matches_quantized_oracle(ckpts, tmp_path, model, quant):
    spec, ck, _ = load_checkpoint(str(ckpts[model]))
    pkg = compiled(ckpts[model], tmp_path, quant)
    ref = QuantizedModel(spec, ck.get, get_scheme(quant), get_scheme("q8g32"))
    with edgellm.Runtime.load(pkg, threads=2) as rt:
        assert relerr(rt.logits(PROMPT), ref.logits(PROMPT)) < TOL
        got = rt.generate(PROMPT, max_new_tokens=32, ignore_eos=True).token_ids
    assert got == ref.greedy(PROMPT, 32)
    q = json.loads((pkg / "manifest.json").read_text())["quant"]
    assert q["scheme"] == quant and q["head"] == "q8g32"
    bits = get_scheme(quant).bits_per_weight
    assert bits < q["bits_per_weight"] < 8.5      # the q8 embedding/head of a tiny model weighs in


def test_head_quant_override(ckpts, tmp_path):
    spec, ck, _ = load_checkpoint(str(ckpts["qwen2-tied"]))
    pkg = compiled(ckpts["qwen2-tied"], tmp_path, "q4g32", head_quant="f16")
    ref = QuantizedModel(spec, ck.get, get_scheme("q4g32"), get_scheme("f16"))
    man = json.loads((pkg / "manifest.json").read_text())
    assert man["quant"]["head"] == "f16" and man["quant"]["embedding"] == "float16"
    # tied: the f16 table is stored once and read by both the embed kernel and the head GEMV
    assert [t["name"] for t in man["tensors"]].count("model.embed_tokens.weight") == 1
    with edgellm.Runtime.load(pkg, threads=2) as rt:
        assert relerr(rt.logits(PROMPT), ref.logits(PROMPT)) < TOL


@pytest.mark.parametrize("model,quant,head", [("llama", "t2", "q4g32"), ("qwen2-tied", "q8", "q4g64"),
                                              ("llama", "q4g32", "q6"), ("qwen2-tied", "t2", "q6")])
def test_smaller_head(ckpts, tmp_path, model, quant, head):
    """A q4 / q6 embedding table + lm_head (embed_q4/q6 gathers, linear_q4/q6 GEMV; stored once when tied) follows
    the oracle and stores less than the default q8 head."""
    spec, ck, _ = load_checkpoint(str(ckpts[model]))
    pkg = compiled(ckpts[model], tmp_path, quant, head_quant=head)
    man = json.loads((pkg / "manifest.json").read_text())
    assert man["quant"]["head"] == head and man["quant"]["embedding"] == head
    ref = QuantizedModel(spec, ck.get, get_scheme(quant), get_scheme(head))
    with edgellm.Runtime.load(pkg, threads=2) as rt:
        assert relerr(rt.logits(PROMPT), ref.logits(PROMPT)) < TOL
        got = rt.generate(PROMPT, max_new_tokens=16, ignore_eos=True).token_ids
    assert got == ref.greedy(PROMPT, 16)
    q8 = json.loads((compiled(ckpts[model], tmp_path, quant) / "manifest.json").read_text())
    assert sum(t["nbytes"] for t in man["tensors"]) < sum(t["nbytes"] for t in q8["tensors"])


def test_quantized_packages_are_smaller(ckpts, tmp_path):
    def stored(q):   # bytes of the tensors themselves (weights.bin also pads each region to 16 KiB)
        man = json.loads((compiled(ckpts["llama"], tmp_path, q) / "manifest.json").read_text())
        return sum(t["nbytes"] for t in man["tensors"])

    sizes = {q: stored(q) for q in ("f16", "q8", "q4g32", "t2")}
    assert sizes["f16"] > sizes["q8"] > sizes["q4g32"] > sizes["t2"]


def test_native_bitnet_demo_matches_numpy(tmp_path):
    """demo-bitnet compiles losslessly to t2 (the checkpoint's ternary codes and weight scales, repacked) and the
    package follows the numpy BitLinear reference token for token."""
    from tokenizers import Tokenizer

    from edgellm.models.demo import DEMO_DIR, HELDOUT

    spec, ck, d = load_checkpoint("demo-bitnet")
    pkg = edgellm.compile("demo-bitnet", out=tmp_path / "bitnet", max_context=128, prefill_chunk=16, progress=False)
    man = json.loads((pkg / "manifest.json").read_text())
    assert man["quant"]["scheme"] == "t2" and man["quant"]["method"] == "native"
    ids = Tokenizer.from_file(str(DEMO_DIR / "demo-bitnet" / "tokenizer.json")).encode(HELDOUT.read_text()[:400]).ids[:40]
    ref = QuantizedModel(spec, ck.get, get_scheme("t2"), get_scheme("q8g32"))
    with edgellm.Runtime.load(pkg, threads=2) as rt:
        # every BitLinear re-quantizes its input per token (6 layers x 7 projections + sub-norms in between), so
        # boundary flips compound more than in the q8/q4 oracle test: 1e-2 of the logit range, argmax everywhere
        got_logits, ref_logits = rt.logits(ids), ref.logits(ids)
        assert relerr(got_logits, ref_logits) < 1e-2
        assert (got_logits.argmax(-1) == ref_logits.argmax(-1)).all()
        got = rt.generate(ids, max_new_tokens=24, ignore_eos=True, temperature=0, repetition_penalty=1.0).token_ids
    # teacher-forced greedy check: the trained model loops between near-tied tokens (margins ~1e-3), where one
    # int8 rounding flip legitimately swaps the argmax; every token must be the oracle's top pick or within 2e-3
    # of it (of the logit range), and such near ties must be rare
    steps = ref.logits(ids + got)[len(ids) - 1:-1]
    gaps = steps.max(-1) - steps[np.arange(len(got)), got]
    assert (gaps <= 2e-3 * np.abs(steps).max()).all(), gaps
    assert (gaps > 0).sum() <= 2, gaps


def _cli_error(capsys, argv) -> str:
    assert main(argv) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_bad_quant_input(ckpts, tmp_path, capsys):
    ck = str(ckpts["llama"])
    out = tmp_path / "never"
    assert "unknown quantization scheme 'q3'" in _cli_error(capsys, ["compile", ck, "-q", "q3", "-o", str(out)])
    assert "--head-quant t2" in _cli_error(capsys, ["compile", ck, "-q", "q8", "--head-quant", "t2", "-o", str(out)])
    assert "--head-quant q4m32 is not supported" in _cli_error(capsys, ["compile", ck, "-q", "q8", "--head-quant",
                                                                       "q4m32", "-o", str(out)])
    assert "--gptq applies to the int4 schemes" in _cli_error(capsys, ["compile", ck, "-q", "q8", "--gptq", "-o", str(out)])
    assert "calibration file" in _cli_error(capsys, ["compile", ck, "-q", "q4g32", "--gptq", "--calib",
                                                     str(tmp_path / "missing.txt"), "-o", str(out)])
    assert "--quant t2" in _cli_error(capsys, ["compile", "demo-bitnet", "-q", "f16", "-o", str(out)])
    odd = make_checkpoint(tmp_path / "odd", hidden_size=48, num_attention_heads=3, num_key_value_heads=3, head_dim=16,
                          intermediate_size=96)
    msg = _cli_error(capsys, ["compile", str(odd), "-q", "q4g32", "-o", str(out)])
    assert "model.layers.0.self_attn.q_proj.weight" in msg and "K=48" in msg
    assert not out.exists() and not list(tmp_path.glob(".never*"))


def test_post_training_ternary_warns(ckpts, tmp_path, capsys):
    assert main(["compile", str(ckpts["llama"]), "-q", "t2", "-o", str(tmp_path / "t2"), "--max-context", "64"]) == 0
    assert "post-training ternarization" in capsys.readouterr().err
    assert main(["info", str(tmp_path / "t2")]) == 0
    assert "t2, embedding/head q8g32" in capsys.readouterr().out


@pytest.mark.parametrize("quant", ["q8", "q4g32", "t2"])
def test_avx2_flavour_matches_oracle(ckpts, tmp_path, quant):
    """The x86-avx2 target's kernels (vpmaddubsw path, 8 lanes) run here too and give the same numbers."""
    spec, ck, _ = load_checkpoint(str(ckpts["llama"]))
    pkg = edgellm.compile(str(ckpts["llama"]), target="x86-avx2", quant=quant, out=tmp_path / quant, max_context=64,
                          prefill_chunk=8, progress=False)
    ref = QuantizedModel(spec, ck.get, get_scheme(quant), get_scheme("q8g32"))
    with edgellm.Runtime.load(pkg, threads=2) as rt:
        assert relerr(rt.logits(PROMPT), ref.logits(PROMPT)) < TOL


def test_eval_ppl_compares_packages(ckpts, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 20)
    pkgs = [str(compiled(ckpts["llama"], tmp_path, q)) for q in ("f32", "q8")]
    assert main(["eval", "ppl", *pkgs, "--text", str(text), "--context", "64", "--quiet", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["scheme"] for r in rows] == ["f32", "q8"] and rows[0]["tokens"] == rows[1]["tokens"] > 100
    # a random model is nearly uniform over its vocab; q8 moves its perplexity by well under 1%
    assert abs(rows[1]["ppl"] / rows[0]["ppl"] - 1) < 0.01
    assert main(["eval", "ppl", *pkgs, "--text", str(text), "--context", "64", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "vs first" in out and "q8" in out
