"""GGUF files written by llama.cpp's own tools, one per supported architecture (opt-in slow tier, issue 35):
a tiny random Hugging Face checkpoint of each family goes through llama.cpp's `convert_hf_to_gguf.py` (F32) and
`llama-quantize` (every listed type), exactly as users make the files they hold; then

- the F32 file compiled with `--quant f32` gives transformers' logits on the original checkpoint within 1e-4
  (so every convention the converter applies, Q/K row permutation, Gemma's norm + 1, fused projections, is undone);
- quantized files compiled with `--quant auto` agree with llama.cpp on the same file and text
  (bench/llamacpp_agreement.py): llama-tokenize's ids, top-1 over >= 1,000 positions, perplexity within 0.5%.

Tokenizers: the converter recognises a BPE vocabulary only by the ids it gives (a hash), so the BPE families carry
SmolLM2's real tokenizer (tests/real_checkpoints.py); the SentencePiece families (Gemma 2/3, Phi-3) a SentencePiece
BPE model trained here with byte fallback (Gemma's layout and no dummy prefix; Llama's with it for Phi-3).

    EDGELLM_REAL=1 python -m pytest -q -m real tests/test_gguf_llamacpp.py   # builds llama.cpp's tools once
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import edgellm

from real_checkpoints import enabled, hf_folder

pytestmark = [pytest.mark.real, pytest.mark.slow,
              pytest.mark.skipif(not enabled(), reason="real-checkpoint tier: set EDGELLM_REAL=1 (builds llama.cpp's "
                                                       "tools once, downloads ~100 MB once)")]

BENCH = Path(__file__).resolve().parents[1] / "bench"
WORK = Path.home() / ".cache" / "edgellm" / "bench"
SHAPE = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 64, "num_hidden_layers": 2}   # rows of 256: llama-quantize keeps K-quants on every matrix
MOE = {"moe_intermediate_size": 256, "shared_expert_intermediate_size": 256}
SHORT, LONG = [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 3.5] * 4, [1.5, 2.5, 4.0, 6.0, 9.0, 14.0, 18.0, 22.0] * 4

# name -> (Hugging Face architecture, config overrides, tokenizer: "bpe" (SmolLM2's) | "spm-gemma" | "spm-llama")
ARCHS = {
    "llama": ("LlamaForCausalLM", {}, "bpe"),
    "qwen2": ("Qwen2ForCausalLM", {}, "bpe"),
    "qwen3": ("Qwen3ForCausalLM", {}, "bpe"),
    "mixtral": ("MixtralForCausalLM", {}, "bpe"),
    "qwen2moe": ("Qwen2MoeForCausalLM", MOE, "bpe"),
    "qwen3moe": ("Qwen3MoeForCausalLM", MOE, "bpe"),
    # llama.cpp sizes OLMoE's k-norm by the hidden size: as many KV heads as heads, as OLMoE has
    "olmoe": ("OlmoeForCausalLM", {"num_key_value_heads": 4}, "bpe"),
    "olmo2": ("Olmo2ForCausalLM", {}, "bpe"),
    # llama.cpp fixes SmolLM3's NoPE layers at every 4th, as SmolLM3 has them
    "smollm3": ("SmolLM3ForCausalLM", {"num_hidden_layers": 4, "no_rope_layer_interval": 4,
                                       "tie_word_embeddings": True}, "bpe"),
    "granite": ("GraniteForCausalLM", {"tie_word_embeddings": True}, "bpe"),
    # Phi-3-mini: fused qkv / gate_up; Phi-4-mini's shape: partial rotary, LongRoPE, tied head (its GPT-2 BPE would
    # be read through transformers' GPT2Tokenizer, whose own split the converter does not recognise on SmolLM2's)
    "phi3": ("Phi3ForCausalLM", {}, "spm-llama"),
    "phi4-mini": ("Phi3ForCausalLM", {"partial_rotary_factor": 0.75, "tie_word_embeddings": True,
                                      "original_max_position_embeddings": 64, "max_position_embeddings": 512,
                                      "rope_scaling": {"type": "longrope", "short_factor": SHORT[:24],
                                                       "long_factor": LONG[:24]}}, "spm-llama"),
    # llama.cpp fixes the layer pattern (Gemma 2: alternating, local first; Gemma 3: five local, one global) and
    # reads no layer_types: the checkpoints hold those patterns
    "gemma2": ("Gemma2ForCausalLM", {"tie_word_embeddings": True, "sliding_window": 16,
                                     "query_pre_attn_scalar": 64}, "spm-gemma"),
    "gemma3": ("Gemma3ForCausalLM", {"num_hidden_layers": 6, "tie_word_embeddings": True, "sliding_window": 16,
                                     "query_pre_attn_scalar": 64,
                                     "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
                                     "rope_parameters": {
                                         "full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
               "spm-gemma"),
}
# each family's files, as a Q8_0 file (blocks kept), a Q4_K_M file as llama-quantize mixes it, and for Llama
# every listed type
# every family in each way edgellm stores a file's blocks: Q8_0 (q8g32), Q4_0 (q4g32), Q4_1 (q4m32), Q5_0 (q6), all
# kept exactly, and Q4_K_M's mix (Q4_K codes in q4m32, Q6_K requantized in q6; MoE files: one scheme)
TYPES = {n: ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K_M"] for n in ARCHS}
TYPES["llama"] = ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M",
                  "Q6_K"]
CASES = [(n, t) for n in ARCHS for t in TYPES[n]]
MOE_FAMILIES = ("mixtral", "qwen2moe", "qwen3moe", "olmoe")


def _tools():
    sys.path.insert(0, str(BENCH))
    import vs_llamacpp as vs

    exes = vs.build_llamacpp(WORK, 2, amx=not vs.host_has_amx(),
                             targets=("llama-tokenize", "llama-perplexity", "llama-quantize"))
    return exes, WORK / vs.SDIST / "vendor" / "llama.cpp"


@pytest.fixture(scope="module")
def llamacpp():
    return _tools()


def spm_model(out: Path, style: str) -> None:
    """A SentencePiece BPE model of 1,024 pieces with byte fallback, trained on licence texts other than the GPL-3
    (the agreement text), in Gemma's layout (pad 0, eos 1, bos 2, unk 3, no dummy prefix, whitespace kept) or
    Llama's (unk 0, bos 1, eos 2, a dummy prefix)."""
    spm = pytest.importorskip("sentencepiece", reason="the SentencePiece families need `pip install sentencepiece`")
    texts = [p for p in sorted(Path("/usr/share/common-licenses").glob("*")) if p.is_file() and p.name != "GPL-3"]
    corpus = out / "corpus.txt"
    corpus.write_text("\n".join(p.read_text(errors="replace") for p in texts[:12]) or Path(__file__).read_text())
    ids = dict(pad_id=0, eos_id=1, bos_id=2, unk_id=3) if style == "gemma" else dict(unk_id=0, bos_id=1, eos_id=2,
                                                                                      pad_id=-1)
    # Phi-3's added tokens: llama.cpp looks them up by text in a file named Phi-3
    specials = [] if style == "gemma" else ["<|endoftext|>", "<|end|>", "<|user|>", "<|assistant|>"]
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(out / "tokenizer"), vocab_size=1024, model_type="bpe",
        user_defined_symbols=specials,
        byte_fallback=True, split_digits=True, character_coverage=1.0, add_dummy_prefix=style != "gemma",
        remove_extra_whitespaces=style != "gemma", allow_whitespace_only_pieces=style == "gemma",
        normalization_rule_name="identity", minloglevel=2, **ids)
    corpus.unlink()
    (out / "tokenizer.vocab").unlink()
    bos, eos, cls = ("<bos>", "<eos>", "GemmaTokenizer") if style == "gemma" else ("<s>", "</s>", "LlamaTokenizer")
    (out / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": True, "add_eos_token": False,
                                                           "bos_token": bos, "eos_token": eos,
                                                           "tokenizer_class": cls}))


def sharpen(st: Path, gemma: bool, by: float) -> None:
    """The logits' spread scaled by `by` (the final norm's gain), to a few nats as a trained model's: a random
    untied head's near-flat distributions make most positions near-ties of the top two, where top-1 agreement means
    nothing; a tied head (rows of unit scale) gives logits of tens, past Gemma 2's final soft-cap."""
    from safetensors.numpy import load_file, save_file

    w = load_file(str(st))
    g = w["model.norm.weight"]
    w["model.norm.weight"] = (by * (1 + g) - 1 if gemma else by * g).astype(g.dtype)   # Gemma's norm is (1 + w)
    save_file(w, str(st), metadata={"format": "pt"})


def checkpoint(root: Path, name: str) -> Path:
    from edgellm.models.synthetic import make_checkpoint

    arch, over, tok = ARCHS[name]
    d = root / name
    if (d / "config.json").is_file():
        return d
    tmp = root / f"{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if tok == "bpe":
        src = hf_folder("smollm2-135m")
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(src / f, tmp / f)
        vocab, ids = 49152, {"bos_token_id": 1, "eos_token_id": 2}
    else:
        spm_model(tmp, tok.split("-")[1])
        vocab = 1024
        ids = {"bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0} if tok == "spm-gemma" else \
            {"bos_token_id": 1, "eos_token_id": 2}
    make_checkpoint(tmp, arch, seed=sorted(ARCHS).index(name), tokenizer=False,
                    **{**SHAPE, **over, "vocab_size": vocab, **ids})
    tied = json.loads((tmp / "config.json").read_text()).get("tie_word_embeddings")
    sharpen(tmp / "model.safetensors", gemma=arch.startswith("Gemma"), by=0.2 if tied else 3.0)
    tmp.replace(d)
    return d


def converter_view(ck: Path) -> Path:
    """What the converter reads. A BPE family's config names model_type "llama": transformers 5 builds a tokenizer
    from model_type where it has a class for it (Qwen2Tokenizer for qwen2, ...), which re-splits SmolLM2's
    vocabulary its own family's way, and the converter would not recognise it (a real Qwen file carries Qwen's
    vocabulary, which it does). The converter reads the architecture from "architectures", never model_type."""
    if not (ck / "tokenizer.json").is_file():
        return ck
    view = ck.with_name(ck.name + ".convert")
    if not view.is_dir():
        view.mkdir()
        for f in ck.iterdir():
            (view / f.name).symlink_to(f)
        (view / "config.json").unlink()
        cfg = json.loads((ck / "config.json").read_text())
        (view / "config.json").write_text(json.dumps({**cfg, "model_type": "llama"}))
    return view


def gguf(root: Path, name: str, qtype: str, llamacpp) -> Path:
    """The family's file of that type, made by llama.cpp's converter and quantizer (cached for the module)."""
    (_, _, quantize), tree = llamacpp
    f32 = root / f"tiny-{name}-F32.gguf"
    if not f32.is_file():
        ck = converter_view(checkpoint(root, name))
        p = subprocess.run([sys.executable, str(tree / "convert_hf_to_gguf.py"), str(ck), "--outtype", "f32",
                            "--outfile", str(f32)], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr[-3000:]
    if qtype == "F32":
        return f32
    out = root / f"tiny-{name}-{qtype}.gguf"
    if not out.is_file():
        p = subprocess.run([str(quantize), str(f32), str(out), qtype], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("gguf-llamacpp")


def transformers_logits(ck: Path, ids: list[int]) -> np.ndarray:
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(ck, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        return m(torch.tensor([ids])).logits[0].numpy()


@pytest.mark.parametrize("name", list(ARCHS))
def test_f32_file_is_the_checkpoint(name, root, llamacpp):
    from edgellm.runtime.python.api import Runtime

    f = gguf(root, name, "F32", llamacpp)
    pkg = edgellm.compile(str(f), quant="f32", out=root / f"{name}-f32.edgellm", max_context=256, tune="off",
                          progress=False)
    ck = checkpoint(root, name)
    vocab = json.loads((ck / "config.json").read_text())["vocab_size"]
    ids = [int(i) for i in np.random.default_rng(7).integers(4, vocab, 80)]   # past Phi-4-mini's 64: long factors
    want = transformers_logits(ck, ids)
    with Runtime.load(pkg) as rt:
        got = rt.logits(ids)
    err = float(np.abs(got - want).max() / np.abs(want).max())
    assert err < 1e-4, f"{name}: logits off by {err:.2e} of their range"
    assert np.array_equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.parametrize("name,qtype", CASES)
def test_quantized_file_agrees_with_llamacpp(name, qtype, root, llamacpp, tmp_path):
    sys.path.insert(0, str(BENCH))
    import llamacpp_agreement as ag

    (tokenize, perplexity, _), _ = llamacpp
    f = gguf(root, name, qtype, llamacpp)
    r = ag.measure(f, ag.default_text(), tmp_path, 256, 8, 2, (tokenize, perplexity))
    summary = {k: r[k] for k in ("quant", "source", "positions", "top1_agree", "clear_positions",
                                 "top1_agree_clear", "nll_llamacpp", "nll_edgellm")}
    print(name, qtype, summary)
    assert r["c_tokens_equal"] and r["hf_tokens_equal"], "prompt ids differ from llama-tokenize's"
    assert r["positions"] >= 1000 and r["clear_positions"] >= 0.5 * r["positions"], summary
    # MoE files with K-quants: a random 4-expert router's near-ties (which the final logits' margin cannot show) flip
    # experts on a 6-bit requantization of Q6_K; mixtral's Q4_K_M measured 98.9% (8 of 736; 99.3% all on q8g32)
    assert r["top1_agree_clear"] >= (0.985 if name in MOE_FAMILIES and qtype.endswith("_K_M") else 0.99), summary
    # a random model's mean NLL is far above a trained one's (its perplexity up to 10^7): the NLL within 0.5% here;
    # the real files' perplexity within 0.5% is tests/test_real_gguf.py's
    assert abs(r["nll_edgellm"] / r["nll_llamacpp"] - 1) <= 0.005, summary
