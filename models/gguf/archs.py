"""GGUF architectures edgellm compiles: llama.cpp's `general.architecture` -> the Hugging Face config it stands for,
the tensor names, and how llama.cpp's converter changed the weights (so they can be changed back).

One row per architecture; a new one is a GGUFArch plus one line in ARCHS."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ...errors import ModelLoadError
from ..chat_families import TURN_ENDS
from .file import GGUFFile
from .tokenizer import control_ids

# llama.cpp's per-layer tensor names -> the Hugging Face names of the Llama layout
LAYER = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate", "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj", "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
}
# stacked expert tensors [n_expert, rows, cols] -> one HF tensor per expert ({e}: its index)
EXPERTS = {"ffn_gate_exps": "mlp.experts.{e}.gate_proj", "ffn_up_exps": "mlp.experts.{e}.up_proj",
           "ffn_down_exps": "mlp.experts.{e}.down_proj"}
GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


@dataclass(frozen=True)
class GGUFArch:
    hf_arch: str                                   # architectures[0] of the config this file stands for
    config: Callable[[GGUFFile, dict], dict] = lambda f, cfg: cfg   # arch-specific config keys on top of the common
    layer: dict = field(default_factory=dict)      # per-layer name overrides on top of LAYER
    experts: dict = field(default_factory=dict)    # expert name overrides on top of EXPERTS
    permuted_qk: bool = False   # llama.cpp's converter interleaved q/k rows for its rotary layout (LLaMA)
    norm_shift: float = 0.0     # llama.cpp's converter stored every norm weight w as w + shift (Gemma: 1)
    ternary: bool = False       # BitLinear weights stored as ternary x scale floats (BitNet: models/gguf/ternary.py)


def _llama(f: GGUFFile, cfg: dict) -> dict:
    if f.number("expert_count", 0):   # Mixtral is a LLaMA with experts to llama.cpp
        cfg = {**cfg, "architectures": ["MixtralForCausalLM"], "num_local_experts": f.number("expert_count"),
               "num_experts_per_tok": f.number("expert_used_count")}
    cfg["attention_bias"] = "blk.0.attn_q.bias" in f.tensors
    if "rope_freqs.weight" in f.tensors:   # Llama 3.1+: llama.cpp stores the llama3 scaling as per-pair divisors
        cfg["rope_scaling"] = llama3_from_freq_factors(f, cfg)
    return cfg


def llama3_from_freq_factors(f: GGUFFile, cfg: dict) -> dict:
    """The llama3 rope_scaling whose frequency divisors are the file's rope_freqs table. Its smooth band is linear
    in 1/wavelength, so the factor (the largest divisor) and two points of that line fix it; low_freq_factor is
    taken as 1 (any other choice with the same line gives the same table). Checked by recomputing the table."""
    import dataclasses
    import math

    import numpy as np

    from ..rope import inv_freq
    from ..spec import ModelSpec

    r = np.asarray(f.tensors["rope_freqs.weight"].data, np.float64).reshape(-1)
    d = cfg["head_dim"]
    probe = ModelSpec(arch="", family="llama", vocab_size=1, hidden_size=d, n_layers=1, n_heads=1, n_kv_heads=1,
                      head_dim=d, intermediate_size=1, rms_eps=1e-6, rope_theta=cfg["rope_theta"],
                      max_position_embeddings=1)
    base = inv_freq(probe)
    if r.shape != base.shape or not np.all(np.isfinite(r)) or r.min() <= 0:
        raise ModelLoadError(f"{f.path.name}: rope_freqs.weight has {r.size} entries, the heads need {base.size}")
    factor = float(r.max())
    wavelen = 2 * math.pi / base
    smooth = (1 / r - 1 / factor) / (1 - 1 / factor) if factor > 1 else np.zeros_like(r)   # 0 at F, 1 at 1
    band = (r > 1 + 1e-6) & (r < factor * (1 - 1e-6))
    if band.sum() >= 2:
        a, b = np.polyfit(1 / wavelen[band], smooth[band], 1)   # smooth = a / wavelen + b
        hi = 1 - 1 / b
        old = a * (hi - 1)
    else:   # a step from 1 to F: put the band's ends at the step
        old = float(wavelen[r >= factor * (1 - 1e-6)].min()) if factor > 1 else 8192.0
        hi = old / float(wavelen[r <= 1 + 1e-6].max()) if (r <= 1 + 1e-6).any() else 4.0
        hi = max(hi, 1.0 + 1e-3)
    rs = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": round(float(hi), 5),
          "original_max_position_embeddings": int(round(old))}
    got = base / inv_freq(dataclasses.replace(probe, rope_scaling=rs))
    if not np.allclose(got, r, rtol=1e-4):
        raise ModelLoadError(f"{f.path.name}: rope_freqs.weight is not a llama3 RoPE scaling (the only kind of "
                             "per-frequency table edgellm reads)")
    return rs


# Mixtral's HF names for llama.cpp's router and stacked experts
MIXTRAL_LAYER = {"ffn_gate_inp": "block_sparse_moe.gate"}
MIXTRAL_EXPERTS = {"ffn_gate_exps": "block_sparse_moe.experts.{e}.w1", "ffn_up_exps": "block_sparse_moe.experts.{e}.w3",
                   "ffn_down_exps": "block_sparse_moe.experts.{e}.w2"}


def _moe(f: GGUFFile, cfg: dict) -> dict:
    cfg.update(num_experts=f.number("expert_count"), num_experts_per_tok=f.number("expert_used_count"),
               moe_intermediate_size=f.number("expert_feed_forward_length", cfg["intermediate_size"]))
    shared = f.number("expert_shared_feed_forward_length", 0)
    if shared:
        cfg["shared_expert_intermediate_size"] = shared
    return cfg


def _qwen2moe(f: GGUFFile, cfg: dict) -> dict:
    cfg = _moe(f, cfg)
    if "shared_expert_intermediate_size" not in cfg and "blk.0.ffn_up_shexp.weight" in f.tensors:
        cfg["shared_expert_intermediate_size"] = int(f.tensors["blk.0.ffn_up_shexp.weight"].shape[1])
    cfg.setdefault("norm_topk_prob", False)
    return cfg


def _qwen3moe(f: GGUFFile, cfg: dict) -> dict:
    return {**_moe(f, cfg), "norm_topk_prob": True}


def _olmoe(f: GGUFFile, cfg: dict) -> dict:
    return {**_moe(f, cfg), "norm_topk_prob": False}


def _gemma2(f: GGUFFile, cfg: dict) -> dict:
    # llama.cpp's Gemma 2: every other layer sliding (the first one), a window of 4096, the attention scale
    # 1/sqrt(key_length) (1/sqrt(hidden/heads) for the 46-layer 27B), soft-capping 50 / 30 where the file is silent
    cfg = _gemma3(f, cfg, pattern_default=2, big_layers=46, default_window=4096)
    cfg.pop("rope_local_base_freq", None)
    cfg.update(attn_logit_softcapping=f.number("attn_logit_softcapping", 50.0, float),
               final_logit_softcapping=f.number("final_logit_softcapping", 30.0, float))
    return cfg


def _gemma3(f: GGUFFile, cfg: dict, pattern_default: int = 6, big_layers: int = 62, default_window: int = 0) -> dict:
    # what llama.cpp assumes where the file is silent: every 6th layer global, a local RoPE base of 10000, and the
    # attention scale 1/sqrt(key_length) (1/sqrt(hidden/heads) for the 62-layer 27B)
    n = cfg["num_hidden_layers"]
    window = f.number("attention.sliding_window", default_window)
    pattern = f.arch_get("attention.sliding_window_pattern", pattern_default)
    if not window:
        types = ["full_attention"] * n
    elif isinstance(pattern, list):   # per layer: true = sliding
        if len(pattern) != n:
            raise ModelLoadError(f"{f.path.name}: attention.sliding_window_pattern lists {len(pattern)} layers, the "
                                 f"model has {n}")
        types = ["sliding_attention" if p else "full_attention" for p in pattern]
    else:
        types = ["full_attention" if pattern and (i + 1) % int(pattern) == 0 else "sliding_attention" for i in range(n)]
    scalar = cfg["hidden_size"] // cfg["num_attention_heads"] if n == big_layers else cfg["head_dim"]
    cfg.update(rope_local_base_freq=f.number("rope.freq_base_swa", 10000.0, float), sliding_window=window or 4096,
               layer_types=types, query_pre_attn_scalar=scalar, hidden_activation="gelu_pytorch_tanh",
               final_logit_softcapping=f.number("final_logit_softcapping", None, float))
    return cfg


def _smollm3(f: GGUFFile, cfg: dict) -> dict:
    # llama.cpp fixes SmolLM3's NoPE layers at every 4th (its n_no_rope_layer_step); the file does not say
    return {**cfg, "no_rope_layer_interval": 4, "attention_bias": "blk.0.attn_q.bias" in f.tensors}


def _granite(f: GGUFFile, cfg: dict) -> dict:
    cfg = {**cfg, "attention_bias": "blk.0.attn_q.bias" in f.tensors}
    for key, hf in (("attention.scale", "attention_multiplier"), ("embedding_scale", "embedding_multiplier"),
                    ("residual_scale", "residual_multiplier"), ("logit_scale", "logits_scaling")):
        v = f.number(key, None, float)
        if v is not None:
            cfg[hf] = v
    cfg.pop("head_dim", None)   # llama.cpp's converter drops Granite's head_dim: hidden / heads
    return cfg


def _phi3(f: GGUFFile, cfg: dict) -> dict:
    """Phi-3/4: the rotated dims (rope.dimension_count), the original context, LongRoPE's factors as the
    rope_factors_long/short tensors with their attention factor, and a sliding window (0: none, Phi-4)."""
    import numpy as np

    rot = f.number("rope.dimension_count", cfg["head_dim"])
    cfg = {**cfg, "partial_rotary_factor": rot / cfg["head_dim"],
           "sliding_window": f.number("attention.sliding_window", 0) or None}
    orig = f.number("rope.scaling.original_context_length", None)
    if orig:
        cfg["original_max_position_embeddings"] = orig
    if "rope_factors_long.weight" in f.tensors:
        def factors(name):
            return [float(x) for x in np.asarray(f.tensors[name].data, np.float32).reshape(-1)]
        cfg["rope_scaling"] = {"rope_type": "longrope", "long_factor": factors("rope_factors_long.weight"),
                               "short_factor": factors("rope_factors_short.weight")}
        attn = f.number("rope.scaling.attn_factor", None, float)
        if attn is not None:
            cfg["rope_scaling"]["attention_factor"] = attn
    return cfg


ARCHS: dict[str, GGUFArch] = {
    "llama": GGUFArch("LlamaForCausalLM", _llama, permuted_qk=True),
    "qwen2": GGUFArch("Qwen2ForCausalLM", lambda f, cfg: {**cfg, "attention_bias": True}),
    "qwen3": GGUFArch("Qwen3ForCausalLM"),
    "qwen2moe": GGUFArch("Qwen2MoeForCausalLM", _qwen2moe),
    "qwen3moe": GGUFArch("Qwen3MoeForCausalLM", _qwen3moe),
    "olmoe": GGUFArch("OlmoeForCausalLM", _olmoe),
    "gemma3": GGUFArch("Gemma3ForCausalLM", _gemma3, norm_shift=1.0,
                       layer={"post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
                              "post_ffw_norm": "post_feedforward_layernorm"}),
    "gemma2": GGUFArch("Gemma2ForCausalLM", _gemma2, norm_shift=1.0,
                       layer={"post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
                              "post_ffw_norm": "post_feedforward_layernorm"}),
    "olmo2": GGUFArch("Olmo2ForCausalLM", layer={"post_attention_norm": "post_attention_layernorm",
                                                 "post_ffw_norm": "post_feedforward_layernorm"}),
    "smollm3": GGUFArch("SmolLM3ForCausalLM", _smollm3, permuted_qk=True),
    "granite": GGUFArch("GraniteForCausalLM", _granite, permuted_qk=True),
    # BitNet b1.58 (BitnetModel in the converter): sub-layer norms, squared-ReLU FFN, offline ternary weights
    "bitnet": GGUFArch("BitNetForCausalLM", lambda f, cfg: {**cfg, "hidden_act": "relu2"}, ternary=True,
                       layer={"attn_sub_norm": "self_attn.attn_sub_norm", "ffn_sub_norm": "mlp.ffn_sub_norm"}),
    "phi3": GGUFArch("Phi3ForCausalLM", _phi3, layer={"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}),
}


def arch_of(f: GGUFFile) -> GGUFArch:
    a = ARCHS.get(f.arch)
    if a is None:
        raise ModelLoadError(f"{f.path.name}: GGUF architecture {f.arch!r} is not supported yet (supported: "
                             f"{', '.join(sorted(ARCHS))})")
    return a


def names(f: GGUFFile, arch: GGUFArch, cfg: dict) -> dict[str, tuple[str, int | None]]:
    """HF weight name -> (GGUF tensor name, expert index or None) for every tensor of the file."""
    layer, experts = {**LAYER, **arch.layer}, {**EXPERTS, **arch.experts}
    if cfg["architectures"][0] == "MixtralForCausalLM":
        layer, experts = {**layer, **MIXTRAL_LAYER}, {**experts, **MIXTRAL_EXPERTS}
    out: dict[str, tuple[str, int | None]] = {}
    for name, t in f.tensors.items():
        base, _, kind = name.rpartition(".")     # kind: weight / bias
        if base in GLOBAL:
            out[f"{GLOBAL[base]}.{kind}"] = (name, None)
            continue
        parts = base.split(".")
        if len(parts) != 3 or parts[0] != "blk" or not parts[1].isdigit():
            continue   # rope_freqs and other tables llama.cpp keeps: not weights of the HF model
        i, short = int(parts[1]), parts[2]
        if short in experts:
            for e in range(int(t.shape[-1])):
                out[f"model.layers.{i}.{experts[short].format(e=e)}.{kind}"] = (name, e)
        elif short in layer:
            out[f"model.layers.{i}.{layer[short]}.{kind}"] = (name, None)
    return out


def config(f: GGUFFile, arch: GGUFArch) -> dict:
    """The Hugging Face config.json this file's metadata stands for."""
    tokens = f.get("tokenizer.ggml.tokens", None)
    embd = f.tensors.get("token_embd.weight")
    vocab = f.number("vocab_size", None) or (len(tokens) if tokens else None) or (int(embd.shape[1]) if embd else None)
    heads = f.number("attention.head_count")
    if isinstance(heads, list):
        raise ModelLoadError(f"{f.path.name}: per-layer head counts are not supported")
    hidden = f.number("embedding_length")
    cfg = {
        "architectures": [arch.hf_arch], "model_type": f.arch, "vocab_size": vocab, "hidden_size": hidden,
        "num_hidden_layers": f.number("block_count"), "num_attention_heads": heads,
        "num_key_value_heads": f.number("attention.head_count_kv", heads),
        "intermediate_size": f.number("feed_forward_length", 0),
        "rms_norm_eps": f.number("attention.layer_norm_rms_epsilon", 1e-6, float),
        "rope_theta": f.number("rope.freq_base", 10000.0, float),
        "max_position_embeddings": f.number("context_length", 4096),
        "head_dim": f.number("attention.key_length", hidden // heads),
        "tie_word_embeddings": "output.weight" not in f.tensors,
        "hidden_act": "silu",
    }
    kind = f.arch_get("rope.scaling.type", None)
    if kind not in (None, "none"):
        cfg["rope_scaling"] = {"rope_type": kind, "factor": f.number("rope.scaling.factor", 1.0, float)}
        orig = f.number("rope.scaling.original_context_length", None)
        if orig:
            cfg["rope_scaling"]["original_max_position_embeddings"] = orig
    bos, eos = f.get("tokenizer.ggml.bos_token_id", None), f.get("tokenizer.ggml.eos_token_id", None)
    ends = [e for e in (eos, f.get("tokenizer.ggml.eot_token_id", None), f.get("tokenizer.ggml.eom_token_id", None))
            if isinstance(e, int)]
    ends += control_ids(f, TURN_ENDS)   # turn ends the file does not name (Gemma's <end_of_turn>), as llama.cpp finds them
    if bos is not None:
        cfg["bos_token_id"] = bos
    if ends:
        cfg["eos_token_id"] = list(dict.fromkeys(ends)) if len(set(ends)) > 1 else ends[0]
    return arch.config(f, cfg)
