"""Seeded random-weight checkpoints in Hugging Face format (config.json, model.safetensors, tokenizer files).

Used by tests (exactness against transformers and between backends) and by benchmarks; needs no torch."""
from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from . import family
from .registry import spec_from_config

_BASE = {
    "LlamaForCausalLM": {"model_type": "llama"},
    "Qwen2ForCausalLM": {"model_type": "qwen2", "use_sliding_window": False},
    "Qwen3ForCausalLM": {"model_type": "qwen3", "attention_bias": False},
    "MixtralForCausalLM": {"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2,
                           "router_jitter_noise": 0.0},
    "Qwen2MoeForCausalLM": {"model_type": "qwen2_moe", "num_experts": 4, "num_experts_per_tok": 2,
                            "moe_intermediate_size": 64, "shared_expert_intermediate_size": 128, "norm_topk_prob": False,
                            "use_sliding_window": False, "decoder_sparse_step": 1, "mlp_only_layers": []},
    "Qwen3MoeForCausalLM": {"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2,
                            "moe_intermediate_size": 64, "norm_topk_prob": True, "attention_bias": False,
                            "decoder_sparse_step": 1, "mlp_only_layers": []},
    "OlmoeForCausalLM": {"model_type": "olmoe", "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": False,
                         "clip_qkv": None},
    # query_pre_attn_scalar != head_dim and a local RoPE base of its own: both paths of Gemma 3 are exercised
    "Gemma3ForCausalLM": {"model_type": "gemma3_text", "hidden_activation": "gelu_pytorch_tanh",
                          "query_pre_attn_scalar": 24, "sliding_window": 5,
                          "attn_logit_softcapping": None, "final_logit_softcapping": None,
                          "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                              "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}},
    # caps low enough that random weights' scores and logits reach the tanh's bend
    "Gemma2ForCausalLM": {"model_type": "gemma2", "hidden_activation": "gelu_pytorch_tanh",
                          "query_pre_attn_scalar": 24, "sliding_window": 5, "attn_logit_softcapping": 4.0,
                          "final_logit_softcapping": 60.0},
    "Olmo2ForCausalLM": {"model_type": "olmo2", "attention_bias": False},
    "SmolLM3ForCausalLM": {"model_type": "smollm3", "no_rope_layer_interval": 2, "pad_token_id": None,
                           "use_sliding_window": False},
    # every multiplier away from 1, so that each fold is exercised
    "GraniteForCausalLM": {"model_type": "granite", "embedding_multiplier": 3.0, "residual_multiplier": 0.5,
                           "attention_multiplier": 0.1, "logits_scaling": 4.0},
    "Phi3ForCausalLM": {"model_type": "phi3", "pad_token_id": None, "original_max_position_embeddings": 512,
                        "sliding_window": None},
}


@functools.lru_cache(maxsize=8)
def _tokenizer_json(vocab_size: int, specials: tuple[str, ...] = ()) -> str:
    """A byte-level BPE (ids 0/1/2 = <s>, </s>, <pad>) trained on the Python language reference, which ships with
    every CPython (pydoc_data.topics), so random-weight models still produce real words."""
    from pydoc_data.topics import topics
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>", "<pad>", *specials],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(list(topics.values())[:200], trainer)
    return tok.to_str()


def make_config(arch: str = "LlamaForCausalLM", **overrides) -> dict:
    cfg = {
        "architectures": [arch], **_BASE[arch],
        "vocab_size": 997, "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu",
        "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "float32",
    }
    cfg.update(overrides)
    if arch.startswith("Gemma3") and "layer_types" not in cfg:   # every third layer global, as in Gemma 3's 5:1
        cfg["layer_types"] = ["full_attention" if i % 3 == 1 else "sliding_attention"
                              for i in range(cfg["num_hidden_layers"])]
    return cfg


def iter_random_weights(cfg: dict, seed: int = 0, ternary: bool = False) -> Iterator[tuple[str, np.ndarray]]:
    """(name, float32 array) one tensor at a time, in weight_shapes order: the same values as random_weights."""
    spec = spec_from_config(cfg)
    rng = np.random.default_rng(seed)
    for name, shape in family(spec).weight_shapes(spec).items():
        if len(shape) == 1:
            w = (1.0 + 0.1 * rng.standard_normal(shape)) if name.endswith("norm.weight") else 0.1 * rng.standard_normal(shape)
        elif "embed_tokens" in name:
            w = rng.standard_normal(shape)
        else:
            w = rng.standard_normal(shape) / np.sqrt(shape[1])
            if ternary:  # exactly absmean-ternary rows (what a BitNet-style model holds)
                scale = np.abs(w).mean(axis=1, keepdims=True)
                w = np.clip(np.round(w / scale), -1, 1) * scale
        yield name, w.astype(np.float32)


def random_weights(cfg: dict, seed: int = 0, ternary: bool = False) -> dict[str, np.ndarray]:
    """Weights scaled so activations stay O(1) through the layers (logits then have a real spread)."""
    return dict(iter_random_weights(cfg, seed, ternary))


_ST_DTYPES = {"float32": ("F32", np.float32), "float16": ("F16", np.float16)}


def save_random_weights_streaming(path, cfg: dict, seed: int = 0, ternary: bool = False, dtype: str = "float16") -> None:
    """Write random_weights(cfg, seed, ternary) as one safetensors file holding one tensor in memory at a time
    (a 1B-parameter f16 checkpoint in ~1 GB of RAM instead of ~7)."""
    tag, np_dtype = _ST_DTYPES[dtype]
    spec = spec_from_config(cfg)
    header: dict = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, shape in family(spec).weight_shapes(spec).items():
        n = int(np.prod(shape)) * np.dtype(np_dtype).itemsize
        header[name] = {"dtype": tag, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h)
        for _, w in iter_random_weights(cfg, seed, ternary):
            f.write(np.ascontiguousarray(w.astype(np_dtype)).tobytes())
    tmp.replace(path)


def fused(spec, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The weights as the architecture's checkpoints store them: parts its family reads out of a fused tensor
    (weight_sources: Phi-3's qkv_proj, gate_up_proj) concatenated back in row order."""
    sources = getattr(family(spec), "weight_sources", lambda s: {})(spec)
    out = {n: w for n, w in weights.items() if n not in sources}
    groups: dict[str, list] = {}
    for name, (stored, lo, _) in sources.items():
        groups.setdefault(stored, []).append((lo, name))
    for stored, parts in groups.items():
        out[stored] = np.concatenate([weights[n] for _, n in sorted(parts)])
    return out


def make_tokenizer(out_dir: Path, vocab_size: int = 1000, chat_template: str | None = None,
                   special_tokens: tuple[str, ...] = ()) -> None:
    """special_tokens: more special tokens after <s>, </s>, <pad> (a chat or tool-call family's markers)."""
    (out_dir / "tokenizer.json").write_text(_tokenizer_json(vocab_size, tuple(special_tokens)))
    tc = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "tokenizer_class": "PreTrainedTokenizerFast",
          "add_bos_token": False}
    if chat_template:
        tc["chat_template"] = chat_template
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tc, indent=2))


def make_checkpoint(out_dir, arch: str = "LlamaForCausalLM", seed: int = 0, dtype: str = "float32",
                    tokenizer: bool = True, ternary: bool = False, streaming: bool = False, **overrides) -> Path:
    """Write a complete random checkpoint; dtype of the stored weights: float32, float16 or bfloat16.
    streaming: generate and write one tensor at a time (float32/float16; for large models)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = make_config(arch, torch_dtype=dtype, **overrides)
    if streaming:
        if getattr(family(spec_from_config(cfg)), "weight_sources", lambda s: {})(spec_from_config(cfg)):
            raise ValueError(f"{arch} stores fused tensors: write it without streaming")
        save_random_weights_streaming(out / "model.safetensors", cfg, seed, ternary, dtype)
        (out / "config.json").write_text(json.dumps(cfg, indent=2))
        if tokenizer:
            make_tokenizer(out, vocab_size=cfg["vocab_size"])
        return out
    w = random_weights(cfg, seed, ternary)
    if dtype == "float16":
        w = {k: v.astype(np.float16) for k, v in w.items()}
    elif dtype == "bfloat16":
        import ml_dtypes

        w = {k: v.astype(ml_dtypes.bfloat16) for k, v in w.items()}
    save_file(fused(spec_from_config(cfg), w), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    if tokenizer:
        make_tokenizer(out, vocab_size=cfg["vocab_size"])
    return out


def with_activation_outliers(src, out_dir, layer: int, channels, factor: float = 50.0) -> Path:
    """A copy of checkpoint `src` whose FFN down-projection input of `layer` has outlier channels: up_proj rows
    `channels` are scaled by `factor` and down_proj columns by 1/factor. In exact arithmetic the model is unchanged;
    quantized activations (the NPU's 16-bit ones) now need a range `factor` times wider (the outliers LLMs grow)."""
    import shutil

    from .checkpoint import Checkpoint

    src, out = Path(src), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ck = Checkpoint(src)
    p = f"model.layers.{layer}.mlp."
    weights = {n: np.array(ck.get(n), np.float32) for n in ck.names()}
    ch = np.asarray(channels)
    weights[p + "up_proj.weight"][ch, :] *= factor
    weights[p + "down_proj.weight"][:, ch] /= factor
    save_file(weights, str(out / "model.safetensors"))
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
            shutil.copyfile(f, out / f.name)
    return out
