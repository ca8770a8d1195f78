"""Architecture registry: HF `architectures[0]` -> (ModelSpec builder, forward family, weight names)."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..errors import ModelLoadError
from .spec import ModelSpec

_BUILDERS: dict[str, Callable[[dict], ModelSpec]] = {}


def register(*archs: str):
    def deco(fn: Callable[[dict], ModelSpec]):
        for a in archs:
            _BUILDERS[a] = fn
        return fn

    return deco


def supported_architectures() -> list[str]:
    return sorted(_BUILDERS)


def _eos_ids(cfg: dict) -> tuple[int, ...]:
    eos = cfg.get("eos_token_id")
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (int(eos),)


def _need(cfg: dict, key: str):
    if key not in cfg:
        raise ModelLoadError(f"config.json has no '{key}': the checkpoint's config is incomplete; re-export it with transformers")
    return cfg[key]


def _llama_like(cfg: dict, arch: str, acts=("silu", "swish"), **extra) -> ModelSpec:
    hidden = int(_need(cfg, "hidden_size"))
    heads = int(_need(cfg, "num_attention_heads"))
    head_dim = cfg.get("head_dim") or hidden // heads
    act = cfg.get("hidden_act", "silu")
    if act not in acts:
        raise ModelLoadError(f"{arch} with hidden_act '{act}' is not supported (only {'/'.join(acts)})")
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    rope_theta = cfg.get("rope_theta")
    if isinstance(rope, dict):
        rope_theta = rope.get("rope_theta", rope_theta)
        rtype = rope.get("rope_type", rope.get("type", "default"))
        if rtype in (None, "default"):
            rope = None
        elif rtype != "llama3":
            raise ModelLoadError(f"rope scaling type '{rtype}' is not supported yet (supported: default, llama3)")
    return ModelSpec(
        arch=arch, family="llama",
        vocab_size=int(_need(cfg, "vocab_size")), hidden_size=hidden,
        n_layers=int(_need(cfg, "num_hidden_layers")), n_heads=heads,
        n_kv_heads=int(cfg.get("num_key_value_heads") or heads), head_dim=int(head_dim),
        intermediate_size=int(_need(cfg, "intermediate_size")),
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6)), rope_theta=float(rope_theta or 10000.0),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        rope_scaling=dict(rope) if rope else None,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        bos_token_id=cfg.get("bos_token_id"), eos_token_ids=_eos_ids(cfg), **extra)


@register("LlamaForCausalLM", "MistralForCausalLM")
def _llama(cfg: dict) -> ModelSpec:
    return _llama_like(cfg, cfg["architectures"][0], attention_bias=bool(cfg.get("attention_bias", False)))


@register("MixtralForCausalLM")
def _mixtral(cfg: dict) -> ModelSpec:
    return _llama_like(cfg, "MixtralForCausalLM", n_experts=int(_need(cfg, "num_local_experts")),
                       n_experts_per_tok=int(_need(cfg, "num_experts_per_tok")))


@register("BitNetForCausalLM")
def _bitnet(cfg: dict) -> ModelSpec:
    qc = cfg.get("quantization_config") or {}
    if qc.get("use_rms_norm") or qc.get("quantization_mode", "offline") != "offline":
        raise ModelLoadError("BitNet checkpoints with online quantization or BitLinear RMSNorm are not supported: "
                             "export packed ternary weights (quantization_mode 'offline')")
    return dataclasses.replace(_llama_like({"hidden_act": "relu2", **cfg}, "BitNetForCausalLM", acts=("relu2",)),
                               family="bitnet")


@register("Qwen2ForCausalLM")
def _qwen2(cfg: dict) -> ModelSpec:
    return _llama_like(cfg, "Qwen2ForCausalLM", attention_bias=True)


@register("Qwen3ForCausalLM")
def _qwen3(cfg: dict) -> ModelSpec:
    return _llama_like(cfg, "Qwen3ForCausalLM", attention_bias=bool(cfg.get("attention_bias", False)), qk_norm=True)


def spec_from_config(cfg: dict) -> ModelSpec:
    archs = cfg.get("architectures") or []
    if not archs:
        raise ModelLoadError("config.json names no 'architectures': cannot tell which model this is")
    arch = archs[0]
    if arch not in _BUILDERS:
        raise ModelLoadError(f"unknown architecture '{arch}': supported are {', '.join(supported_architectures())}")
    return _BUILDERS[arch](cfg)
