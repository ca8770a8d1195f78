"""The real GGUF files themselves compiled (opt-in slow tier: EDGELLM_REAL=1 python -m pytest -q -m real tests):
SmolLM2-135M-Instruct as llama.cpp's Q4_1 (+ a Q8_0 embedding) and Gemma 3 270M as Q4_K_M (Q4_K, Q5_0, Q6_K, Q8_0
blocks). Every weight read from the file equals transformers' dequantization of it (the oracle folder of
tests/real_checkpoints.py), the spec equals the one from transformers' config, the rebuilt tokenizer and the
package's C tokenizer give the oracle tokenizer's ids (SmolLM2: llama.cpp's `smollm` pre-tokenizer, which splits
digits as the original SmolLM2 tokenizer does and transformers' GGUF tokenizer does not), a q8 package of the
GGUF generates the tokens a q8 package of the oracle folder generates, and `--quant auto` packages of both files
agree with llama.cpp on the same file and text (token ids, perplexity, top-1; bench/llamacpp_agreement.py)."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from tokenizers import Tokenizer

import edgellm
from edgellm.models import load_checkpoint

from real_checkpoints import CHAT, PLAIN, enabled, gguf_file, hf_folder
from test_c_tokenizer import CORPUS, fuzz_corpus

pytestmark = [pytest.mark.real, pytest.mark.slow,
              pytest.mark.skipif(not enabled(), reason="real-checkpoint tier: set EDGELLM_REAL=1 (downloads ~330 MB once)")]


def _texts(digits: bool) -> list[str]:
    texts = CORPUS + fuzz_corpus(300) + PLAIN + CHAT
    return texts if digits else [t for t in texts if not any(c.isdigit() for c in t)]


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_gguf_reads_as_transformers_reads_it(name):
    g, d = gguf_file(name), hf_folder(name)
    spec, ck, side = load_checkpoint(str(g))
    ref, ref_ck, _ = load_checkpoint(str(d))
    assert spec.rms_eps == pytest.approx(ref.rms_eps, rel=1e-6)
    assert dataclasses.replace(spec, rms_eps=ref.rms_eps, eos_token_ids=ref.eos_token_ids) == ref
    for n in ck.names():
        if n in ref_ck:
            assert np.array_equal(ck.get(n), np.asarray(ref_ck.get(n), np.float32)), n
    ours, oracle = Tokenizer.from_file(str(side / "tokenizer.json")), Tokenizer.from_file(str(d / "tokenizer.json"))
    # transformers' GGUF tokenizer drops SmolLM2's digit split; on text without digits the two must agree
    for t in _texts(digits=name != "smollm2-135m"):
        assert ours.encode(t).ids == oracle.encode(t).ids, t
    if name == "smollm2-135m":
        assert ours.encode("2024").ids == [ours.token_to_id(c) for c in "2024"]


def test_gguf_package_generates_like_the_oracle_package(tmp_path):
    from edgellm.runtime.python.api import Runtime

    g, d = gguf_file("smollm2-135m"), hf_folder("smollm2-135m")
    a = edgellm.compile(str(g), quant="q8", out=tmp_path / "gguf", max_context=512, tune="off", progress=False)
    b = edgellm.compile(str(d), quant="q8", out=tmp_path / "hf", max_context=512, tune="off", progress=False)
    with Runtime.load(a) as ra, Runtime.load(b) as rb:
        for p in PLAIN[:2] + CHAT[:2]:
            ids = rb.encode(p)
            assert ra.encode(p) == Tokenizer.from_file(str(a / "tokenizer.json")).encode(p).ids
            x = ra.generate(ids, max_new_tokens=32, temperature=0)
            y = rb.generate(ids, max_new_tokens=32, temperature=0)
            assert x.token_ids == y.token_ids


@pytest.mark.parametrize("qtype,scheme", [("Q8_0", "q8g32"), ("Q4_0", "q4g32")])
def test_real_q8_0_and_q4_0_blocks_are_kept(qtype, scheme, tmp_path):
    """SmolLM2's real weights written as Q8_0 / Q4_0 blocks (the gguf package's port of llama.cpp's quantizers):
    `--quant auto` picks q8g32 / q4g32, whose quantizers give back every block exactly (codes and f16 scales)."""
    from edgellm.compiler.auto_quant import auto_schemes
    from edgellm.models import family
    from edgellm.quant import get_scheme

    from gguf_files import write_gguf

    g = write_gguf(hf_folder("smollm2-135m"), tmp_path / "m.gguf", qtype)
    spec, ck, _ = load_checkpoint(str(g))
    assert auto_schemes(spec, ck, family)[0] == scheme
    sch, n = get_scheme(scheme), 0
    for name in ck.names():
        if ck.dtype(name) == qtype and len(ck.entry(name)["shape"]) == 2 and name != spec.lm_head_name:
            w = np.asarray(ck.get(name), np.float32)
            assert np.array_equal(sch.dequantize(sch.quantize(w)), w), name
            n += 1
    assert n == 7 * spec.n_layers


def test_a_file_without_a_chat_template_chats_in_its_familys_format(tmp_path):
    """The Gemma 3 file carries no chat template: it chats in Gemma's turn format (what its tests' hand-written
    template renders) and stops at <end_of_turn> as well as <eos>; SmolLM2's own template is kept."""
    from edgellm.runtime.python.text import TextCodec

    from real_checkpoints import REAL

    spec, _, side = load_checkpoint(str(gguf_file("gemma3-270m")))
    codec = TextCodec(side)
    side2 = tmp_path
    (side2 / "tokenizer_config.json").write_text(json.dumps({**codec.config, "chat_template":
                                                              REAL["gemma3-270m"]["chat_template"]}))
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "x"}]
    assert codec.apply_chat_template(msgs) == TextCodec(side2).apply_chat_template(msgs)
    assert set(spec.eos_token_ids) == {codec.tok.token_to_id("<eos>"), codec.tok.token_to_id("<end_of_turn>")}
    spec, _, side = load_checkpoint(str(gguf_file("smollm2-135m")))
    assert "<|im_start|>system" in TextCodec(side).template_source() and 2 in spec.eos_token_ids


@pytest.mark.parametrize("name,want", [
    ("smollm2-135m", ("q4m32", {"q4m32": {"Q4_1"}})),
    ("gemma3-270m", ("q6", {"q6": {"Q5_0", "Q6_K"}, "q4m32": {"Q4_K"}, "q8g32": {"Q8_0"}}))])
def test_the_shipped_files_blocks_are_kept(name, want):
    """`--quant auto` on the files as shipped: each body matrix in the scheme of its own block type, from the stored
    blocks: SmolLM2's Q4_1 and Gemma 3's Q5_0 / Q8_0 blocks exactly, its Q4_K codes with each sub-block's scale and
    minimum rounded once to f16 (and its 9 Q6_K matrices requantized on q6's 6-bit grid)."""
    from edgellm.compiler.auto_quant import OWN, auto_schemes
    from edgellm.models import family
    from edgellm.quant import get_scheme

    spec, ck, _ = load_checkpoint(str(gguf_file(name)))
    body, _, _, own = auto_schemes(spec, ck, family, mixed=True)
    assert body == want[0]
    seen: dict = {}
    for n in ck.names():
        t = ck.dtype(n)
        if len(ck.entry(n)["shape"]) != 2 or n in (spec.lm_head_name, "model.embed_tokens.weight"):
            continue
        sch = get_scheme(own.get(n, body))
        assert sch.name == OWN[t]
        seen.setdefault(sch.name, set()).add(t)
        if t == "Q6_K":
            assert sch.from_blocks(ck.blocks(n)) is None
            continue
        parts = sch.quantize(np.asarray(ck.get(n), np.float32)) if t == "Q8_0" else sch.from_blocks(ck.blocks(n))
        held, values = sch.dequantize(parts), np.asarray(ck.get(n), np.float32)
        if t == "Q4_K":
            assert np.abs(held - values).max() <= 2 ** -10 * np.abs(values).max(), n
        else:
            assert np.array_equal(held, values), n
    assert seen == want[1]


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_agrees_with_llamacpp_on_the_file_as_shipped(name, tmp_path):
    """Against llama.cpp on the same real GGUF (SmolLM2's Q4_1, Gemma 3's Q4_K_M: their blocks kept in q4m32 / q6 /
    q8g32) and 4 chunks of 512 tokens of English prose (bench/llamacpp_agreement.py): the text's token ids equal
    llama-tokenize's (C tokenizer and tokenizer.json), perplexity within 0.5% of llama-perplexity's (measured 0.9966
    and 1.0010), and edgellm's top-1 token equal to llama.cpp's at
    >= 99% of the >= 800 scored positions where llama.cpp's own two best log-probabilities are >= 0.25 nats apart
    (below that, llama.cpp's Q8_0 activations move its logits as much: on all positions the two agree 94-96%, and
    llama.cpp agrees with the exact f32 model 96%). Needs llama.cpp's tools, built once by that script."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import llamacpp_agreement as ag
    import vs_llamacpp as vs

    work = Path.home() / ".cache" / "edgellm" / "bench"
    build = work / ("llama-build-noamx" if vs.host_has_amx() else "llama-build") / "bin"
    tools = tuple(build / t for t in ag.TOOLS)
    if not all(t.is_file() for t in tools):
        pytest.skip(f"needs {', '.join(ag.TOOLS)} in {build}: run bench/llamacpp_agreement.py once to build them")
    r = ag.measure(gguf_file(name), ag.default_text(), tmp_path, 512, 4, 2, tools)
    assert r["c_tokens_equal"] and r["hf_tokens_equal"] and r["text_tokens"] > 4 * 512
    assert 0.995 < r["ppl_ratio"] < 1.005, r
    assert r["positions"] == 4 * 255 and r["clear_positions"] >= 800 and r["top1_agree_clear"] >= 0.99, r


LIGHTHOUSE = ("The lighthouse stood at the northern tip of the island, a white tower with a red lantern room that "
              "sailors could see from twenty miles out. Its keeper, a retired engineer named Tomas, kept a logbook of "
              "every ship that passed, the weather at dawn and dusk, and the small repairs the old machinery needed. ")


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_speculation_gives_plain_tokens_on_the_real_model(name, tmp_path):
    """Speculative decoding on real models (issue 36): SmolLM2's 49k-token vocabulary, tied head and chat template;
    Gemma 3's 262k vocabulary, head_dim 256 and 512-token sliding windows (the long copy prompt's passes run past
    the window, whose rows must see its keys as a decode step would). With the `--quant auto` package of the shipped
    file, greedy tokens of every draft source equal plain decoding's on tasks that copy their prompt and on free
    text, passes of every size included (rows past a pass's drafts are computed by none of its GEMMs), and a pass's
    rows equal a full pass's bitwise."""
    from edgellm.runtime.python.api import Runtime

    pkg = edgellm.compile(str(gguf_file(name)), quant="auto", out=tmp_path / "p", max_context=1024,
                          tune="off", progress=False, verify_tokens=8)
    func = "def area(w, h):\n    return w * h\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n"
    copy_long = f"Repeat the following text exactly, word for word:\n\n{LIGHTHOUSE * 9}"
    tasks = [(f"Rename area to rect_area and change nothing else:\n\n{func}", True), (CHAT[0], False),
             (copy_long, True)]   # (prompt, whether the reply copies it)
    with Runtime.load(pkg) as rt:
        for msg, copies in tasks:
            ids = rt.encode(rt.text.apply_chat_template([{"role": "user", "content": msg}]), add_special_tokens=False)
            if msg is copy_long:
                assert len(ids) > 512, len(ids)   # every pass past the first sliding window
            plain = rt.generate(ids, max_new_tokens=64, temperature=0, speculate="off", ignore_eos=True).token_ids
            for mode in ("ngram", "recycle", "auto"):
                with rt.new_context() as ctx:
                    got = ctx.generate(ids, max_new_tokens=64, temperature=0, speculate=mode, ignore_eos=True).token_ids
                    passes = ctx.stats()["spec_passes"]
                assert got == plain, (mode, msg[:20])
                if mode == "recycle" or (mode == "ngram" and copies):   # (auto runs passes only where they pay)
                    assert passes > 0, (mode, msg[:20])
        ctx = rt.context
        ids = rt.encode(func)
        ctx.rewind(0)   # the generations' conversation
        ctx.prefill(ids[:-8])
        full = ctx.verify(ids[-8:])
        for n in (2, 5):
            ctx.rewind(len(ids) - 8)
            assert np.array_equal(ctx.verify(ids[-8:][:n]), full[:n]), n
