"""Architecture registry: HF `architectures[0]` -> (ModelSpec builder, forward family, weight names).

Every config.json value a builder reads is checked here, where it enters: type, range and consistency, each failure
a one-line ModelLoadError naming the key and the value (never a KeyError/TypeError/ValueError from deeper down)."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from ..errors import ModelLoadError, short_repr
from .spec import ModelSpec

_BUILDERS: dict[str, Callable[[dict], ModelSpec]] = {}

# Sane upper bounds (far above any released model) so that a corrupt value is refused before anything is sized by it.
_MAX = {"vocab_size": 1 << 24, "hidden_size": 1 << 17, "num_hidden_layers": 1 << 10, "num_attention_heads": 1 << 12,
        "num_key_value_heads": 1 << 12, "head_dim": 1 << 12, "intermediate_size": 1 << 20,
        "max_position_embeddings": 1 << 31, "num_local_experts": 1 << 10, "num_experts": 1 << 10, "num_experts_per_tok": 1 << 10,
        "moe_intermediate_size": 1 << 20, "shared_expert_intermediate_size": 1 << 20, "decoder_sparse_step": 1 << 10,
        "sliding_window": 1 << 31, "max_window_layers": 1 << 31, "original_max_position_embeddings": 1 << 31}
_MAX_EXPERT_LAYERS = 1 << 16     # n_layers * n_experts: every expert matrix is a separately named tensor
_ABSENT = object()


def register(*archs: str):
    def deco(fn: Callable[[dict], ModelSpec]):
        for a in archs:
            _BUILDERS[a] = fn
        return fn

    return deco


def supported_architectures() -> list[str]:
    return sorted(_BUILDERS)




def _bad(key: str, what: str, v) -> ModelLoadError:
    return ModelLoadError(f"config.json: {key} must be {what}, got {short_repr(v)}; fix the value or re-export the "
                          "checkpoint with transformers")


def _need(cfg: dict, key: str):
    if key not in cfg:
        raise ModelLoadError(f"config.json has no '{key}': the checkpoint's config is incomplete; re-export it with transformers")
    return cfg[key]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_int(key: str, v, lo: int = 1, hi: int | None = None) -> int:
    hi = _MAX.get(key.rsplit(".", 1)[-1], 1 << 31) if hi is None else hi
    if not _is_int(v):
        raise _bad(key, f"an integer >= {lo}", v)
    if v < lo:
        raise _bad(key, f"an integer >= {lo}", v)
    if v > hi:
        raise ModelLoadError(f"config.json: {key} = {short_repr(v)} is out of range (at most {hi}): the config is corrupt")
    return v


def _int(cfg: dict, key: str, default=_ABSENT, lo: int = 1, null_default: bool = False) -> int:
    """cfg[key] as an integer in [lo, _MAX[key]]; absent -> default (required when there is none); null -> default
    only when null_default (transformers' `None` meaning "derive it")."""
    v = cfg[key] if key in cfg else _ABSENT
    if v is _ABSENT or (v is None and null_default):
        if default is _ABSENT:
            _need(cfg, key)
        return default
    return _check_int(key, v, lo)


def _check_float(key: str, v, lo: float = 0.0, strict: bool = True) -> float:
    what = f"a finite number {'>' if strict else '>='} {lo:g}"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _bad(key, what, v)
    try:
        f = float(v)
    except OverflowError:
        raise _bad(key, what, v) from None
    if not math.isfinite(f) or f < lo or (strict and f == lo):
        raise _bad(key, what, v)
    return f


def _float(cfg: dict, key: str, default: float, lo: float = 0.0, strict: bool = True) -> float:
    return _check_float(key, cfg[key], lo, strict) if key in cfg else default


def _bool(cfg: dict, key: str, default: bool = False) -> bool:
    """A JSON boolean (null: the default, as transformers reads it)."""
    v = cfg.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise _bad(key, "true or false", v)
    return v


def _token_id(key: str, v, vocab: int) -> int:
    if not _is_int(v) or not 0 <= v < vocab:
        raise _bad(key, f"a token id in [0, {vocab}) (vocab_size) or null", v)
    return v


def _eos_ids(cfg: dict, vocab: int) -> tuple[int, ...]:
    eos = cfg.get("eos_token_id")
    if eos is None:
        return ()
    if isinstance(eos, list):
        return tuple(_token_id("eos_token_id", e, vocab) for e in eos)
    return (_token_id("eos_token_id", eos, vocab),)


def _rope(cfg: dict, head_dim: int) -> tuple[float, dict | None]:
    """(rope_theta, llama3 scaling dict or None) from rope_scaling / rope_parameters (transformers 5) / rope_theta."""
    for key in ("rope_scaling", "rope_parameters"):
        if cfg.get(key) is not None and not isinstance(cfg[key], dict):
            raise _bad(key, "an object or null", cfg[key])
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    src = "rope_scaling" if cfg.get("rope_scaling") else "rope_parameters"
    theta = _float(cfg, "rope_theta", 10000.0)
    if not rope:
        return theta, None
    if "rope_theta" in rope:
        theta = _check_float(f"{src}.rope_theta", rope["rope_theta"])
    rtype = rope.get("rope_type", rope.get("type", "default"))
    if rtype is not None and not isinstance(rtype, str):
        raise _bad(f"{src}.rope_type", "a string", rtype)
    if rtype in (None, "default"):
        return theta, None
    if rtype == "linear":
        if "factor" not in rope:
            raise ModelLoadError(f"config.json: {src} of type linear has no 'factor'; re-export the checkpoint with "
                                 "transformers")
        _check_float(f"{src}.factor", rope["factor"])
        return theta, {"rope_type": "linear", "factor": rope["factor"]}
    if rtype == "dynamic":   # NTK-aware scaling that starts past max_position_embeddings: a package never gets there
        _check_float(f"{src}.factor", rope.get("factor"))
        return theta, {"rope_type": "dynamic", "factor": rope["factor"]}
    if rtype == "yarn":
        return theta, _yarn(rope, src)
    if rtype in ("longrope", "su"):
        return theta, _longrope(cfg, rope, src, head_dim)
    if rtype != "llama3":
        raise ModelLoadError(f"rope scaling type {short_repr(rtype)} is not supported yet (supported: default, linear, "
                             "dynamic, yarn, longrope, llama3)")
    if "factor" not in rope:
        raise ModelLoadError(f"config.json: {src} of type llama3 has no 'factor'; re-export the checkpoint with transformers")
    _check_float(f"{src}.factor", rope["factor"])
    lo = _check_float(f"{src}.low_freq_factor", rope["low_freq_factor"]) if "low_freq_factor" in rope else 1.0
    hi = _check_float(f"{src}.high_freq_factor", rope["high_freq_factor"]) if "high_freq_factor" in rope else 4.0
    if hi <= lo:
        raise ModelLoadError(f"config.json: {src}.high_freq_factor ({hi:g}) must be greater than low_freq_factor "
                             f"({lo:g})")
    if "original_max_position_embeddings" in rope:
        _check_int(f"{src}.original_max_position_embeddings", rope["original_max_position_embeddings"])
    return theta, dict(rope)


def _longrope(cfg: dict, rope: dict, src: str, rot_dim: int) -> dict:
    """LongRoPE (Phi-3.5 / Phi-4-mini) as transformers reads it: one short and one long factor per rotated pair, the
    original context (rope_scaling's, else the config's top-level original_max_position_embeddings), and the
    attention factor or the factor it derives from (default: max_position_embeddings / original)."""
    out: dict = {"rope_type": "longrope"}
    for key in ("short_factor", "long_factor"):
        v = rope.get(key)
        if (not isinstance(v, list) or len(v) != rot_dim // 2
                or any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in v)):
            raise _bad(f"{src}.{key}", f"a list of {rot_dim // 2} numbers (one per rotated pair)", v)
        out[key] = [_check_float(f"{src}.{key}", x) for x in v]
    old = rope.get("original_max_position_embeddings", cfg.get("original_max_position_embeddings"))
    if old is None:
        raise ModelLoadError(f"config.json: {src} of type longrope needs original_max_position_embeddings; re-export "
                             "the checkpoint with transformers")
    out["original_max_position_embeddings"] = _check_int("original_max_position_embeddings", old, 2)
    for key in ("factor", "attention_factor"):
        if rope.get(key) is not None:
            out[key] = _check_float(f"{src}.{key}", rope[key])
    return out


def _yarn(rope: dict, src: str) -> dict:
    """YaRN (arXiv 2309.00071) as transformers reads it: the factor (or max_position_embeddings over
    original_max_position_embeddings), the ramp's beta_fast / beta_slow, the cos/sin attention factor or the
    mscale / mscale_all_dim it is derived from, and truncate."""
    out = {"rope_type": "yarn"}
    for key in ("factor", "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
        if rope.get(key) is not None:
            out[key] = _check_float(f"{src}.{key}", rope[key])
    if rope.get("original_max_position_embeddings") is not None:
        out["original_max_position_embeddings"] = _check_int(f"{src}.original_max_position_embeddings",
                                                             rope["original_max_position_embeddings"], 1, 1 << 24)
    if "factor" not in out and "original_max_position_embeddings" not in out:
        raise ModelLoadError(f"config.json: {src} of type yarn has no 'factor'; re-export the checkpoint with "
                             "transformers")
    if "truncate" in rope:
        if not isinstance(rope["truncate"], bool):
            raise _bad(f"{src}.truncate", "true or false", rope["truncate"])
        out["truncate"] = rope["truncate"]
    return out


def _llama_like(cfg: dict, arch: str, acts=("silu", "swish"), partial_rotary: float = 1.0, **extra) -> ModelSpec:
    vocab = _int(cfg, "vocab_size")
    hidden = _int(cfg, "hidden_size")
    n_layers = _int(cfg, "num_hidden_layers")
    heads = _int(cfg, "num_attention_heads")
    kv_heads = _int(cfg, "num_key_value_heads", heads, null_default=True)
    if heads % kv_heads:
        raise ModelLoadError(f"config.json: num_key_value_heads ({kv_heads}) must divide num_attention_heads ({heads})")
    head_dim = _int(cfg, "head_dim", None, null_default=True)
    if head_dim is None:
        if hidden % heads:
            raise ModelLoadError(f"config.json has no head_dim and hidden_size ({hidden}) is not a multiple of "
                                 f"num_attention_heads ({heads}): the config is inconsistent")
        head_dim = hidden // heads
    if head_dim % 2:
        raise ModelLoadError(f"config.json: head_dim must be even (rotary embeddings rotate pairs), got {head_dim}")
    rot = int(head_dim * partial_rotary)   # transformers' int(head_dim * partial_rotary_factor)
    if not 2 <= rot <= head_dim or rot % 2 or (head_dim - rot) % 2:
        raise ModelLoadError(f"config.json: partial_rotary_factor {partial_rotary:g} of head_dim {head_dim} rotates "
                             f"{rot} dims; it must be an even number of dims, leaving an even number unrotated")
    if rot != head_dim:
        extra["rotary_dim"] = rot
    intermediate = _int(cfg, "intermediate_size")
    max_pos = _int(cfg, "max_position_embeddings", 2048)
    rms_eps = _float(cfg, "rms_norm_eps", 1e-6)
    act = cfg.get("hidden_act", "silu")
    if not isinstance(act, str) or act not in acts:
        raise ModelLoadError(f"{arch} with hidden_act {short_repr(act)} is not supported (only {'/'.join(acts)})")
    rope_theta, rope = _rope(cfg, extra.get("rotary_dim") or head_dim)
    tied = _bool(cfg, "tie_word_embeddings", False)
    bos = cfg.get("bos_token_id")
    if bos is not None:
        _token_id("bos_token_id", bos, vocab)
    if extra.get("n_experts") and n_layers * extra["n_experts"] > _MAX_EXPERT_LAYERS:
        raise ModelLoadError(f"config.json: {n_layers} layers x {extra['n_experts']} experts is out of range (at most "
                             f"{_MAX_EXPERT_LAYERS} expert layers): the config is corrupt")
    return ModelSpec(
        arch=arch, family="llama",
        vocab_size=vocab, hidden_size=hidden, n_layers=n_layers, n_heads=heads, n_kv_heads=kv_heads,
        head_dim=head_dim, intermediate_size=intermediate, rms_eps=rms_eps, rope_theta=rope_theta,
        max_position_embeddings=max_pos, rope_scaling=rope, tie_word_embeddings=tied,
        bos_token_id=bos, eos_token_ids=_eos_ids(cfg, vocab),
        layer_windows=_layer_windows(cfg, arch, n_layers), **extra)


def _layer_windows(cfg: dict, arch: str, n_layers: int) -> tuple[int, ...]:
    """Per-layer sliding-window sizes (0: full attention) as transformers builds them for this architecture:
    Mistral: `sliding_window` on every layer (transformers' default 4096 when the key is absent; null = off);
    Mixtral: the same with default null (off);
    Qwen3-MoE: `sliding_window` (default null) on every layer;
    Qwen2/Qwen3/Qwen2-MoE: only with `use_sliding_window`, on the layers `layer_types` marks "sliding_attention" (by default
    those at index >= `max_window_layers`, default 28). Other Llama-family classes ignore `sliding_window`."""
    if arch in ("MistralForCausalLM", "MixtralForCausalLM"):
        w = cfg.get("sliding_window", 4096 if arch == "MistralForCausalLM" else None)
        types = ["sliding_attention"] * n_layers
    elif arch == "Qwen3MoeForCausalLM":   # transformers' Qwen3-MoE: every layer, whenever sliding_window is set
        w = cfg.get("sliding_window")
        types = ["sliding_attention"] * n_layers
    elif arch == "Phi3ForCausalLM":   # transformers' Phi-3: every layer, whenever sliding_window is set
        w = cfg.get("sliding_window")
        types = ["sliding_attention"] * n_layers
    elif arch == "SmolLM3ForCausalLM":   # by default the NoPE layers, only with use_sliding_window
        w = cfg.get("sliding_window") if _bool(cfg, "use_sliding_window", False) else None
        types = cfg.get("layer_types")
        if types is None:
            nope = _nope_layers(cfg, n_layers)
            types = ["sliding_attention" if w is not None and i in nope else "full_attention" for i in range(n_layers)]
    elif arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen2MoeForCausalLM"):
        w = cfg.get("sliding_window", 4096) if _bool(cfg, "use_sliding_window", False) else None
        types = cfg.get("layer_types")
        if types is None:
            first = _int(cfg, "max_window_layers", 28, lo=0)
            types = ["sliding_attention" if w is not None and i >= first else "full_attention" for i in range(n_layers)]
    else:
        return ()
    if not isinstance(types, list) or len(types) != n_layers or any(
            not isinstance(t, str) or t not in ("sliding_attention", "full_attention") for t in types):
        raise ModelLoadError(f"config.json: layer_types must list 'full_attention' or 'sliding_attention' for each of "
                             f"the {n_layers} layers, got {short_repr(types)}")
    if w is None or "sliding_attention" not in types:
        return ()
    if not _is_int(w) or w < 1 or w > _MAX["sliding_window"]:
        raise ModelLoadError(f"config.json: sliding_window must be a positive integer or null, got {short_repr(w)}")
    return tuple(w if t == "sliding_attention" else 0 for t in types)


@register("LlamaForCausalLM")
def _llama(cfg: dict) -> ModelSpec:
    # transformers' Llama: attention_bias puts biases on q/k/v and o; mlp_bias on gate/up/down
    bias = _bool(cfg, "attention_bias")
    return _llama_like(cfg, "LlamaForCausalLM", attention_bias=bias, o_bias=bias, mlp_bias=_bool(cfg, "mlp_bias"))


def _nope_layers(cfg: dict, n_layers: int) -> tuple[int, ...]:
    """SmolLM3's layers without RoPE: `no_rope_layers` flags each layer 1 (RoPE) or 0 (none); absent, every
    `no_rope_layer_interval`-th layer (default 4) has none."""
    flags = cfg.get("no_rope_layers")
    if flags is None:
        every = _int(cfg, "no_rope_layer_interval", 4)
        flags = [int((i + 1) % every != 0) for i in range(n_layers)]
    if not isinstance(flags, list) or len(flags) != n_layers or any(f not in (0, 1) or isinstance(f, float)
                                                                    for f in flags):
        raise _bad("no_rope_layers", f"a list of {n_layers} flags (1: the layer uses RoPE, 0: it does not)", flags)
    return tuple(i for i, f in enumerate(flags) if not f)


@register("SmolLM3ForCausalLM")
def _smollm3(cfg: dict) -> ModelSpec:
    bias = _bool(cfg, "attention_bias")   # transformers' SmolLM3: on q/k/v and o
    n = _int(cfg, "num_hidden_layers")
    return _llama_like({"tie_word_embeddings": True, **cfg}, "SmolLM3ForCausalLM", attention_bias=bias, o_bias=bias,
                       mlp_bias=_bool(cfg, "mlp_bias"), nope_layers=_nope_layers(cfg, n))


@register("GraniteForCausalLM")
def _granite(cfg: dict) -> ModelSpec:
    """Granite 3.x: Llama with four multipliers, all folded into weights (models/folds.py): the embedding's, the
    residual branches', the attention scale (in place of 1/sqrt(head_dim)) and the logits' divisor."""
    bias = _bool(cfg, "attention_bias")
    spec = _llama_like(cfg, "GraniteForCausalLM", attention_bias=bias, o_bias=bias, mlp_bias=_bool(cfg, "mlp_bias"))
    attn = _float(cfg, "attention_multiplier", 1.0)
    return dataclasses.replace(spec, embed_scale=_float(cfg, "embedding_multiplier", 1.0),
                               residual_scale=_float(cfg, "residual_multiplier", 1.0),
                               q_scale=attn * math.sqrt(spec.head_dim),
                               logit_scale=1.0 / _float(cfg, "logits_scaling", 1.0))


@register("Phi3ForCausalLM")
def _phi3(cfg: dict) -> ModelSpec:
    """Phi-3 / 3.5 / Phi-4-mini: q/k/v and gate/up stored fused (split as they are read), partial rotary
    (Phi-4-mini: 3/4 of each head), LongRoPE; transformers' Phi3Config reads rope types su and yarn as longrope."""
    cfg = dict(cfg)
    rope_key = next((k for k in ("rope_scaling", "rope_parameters") if isinstance(cfg.get(k), dict)), None)
    rope = dict(cfg[rope_key]) if rope_key else {}
    if rope.get("rope_type", rope.get("type")) in ("su", "yarn"):
        rope["rope_type"] = "longrope"
        cfg[rope_key] = rope
    partial = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    partial = _check_float("partial_rotary_factor", partial)
    if partial > 1:
        raise _bad("partial_rotary_factor", "a number in (0, 1]", partial)
    return _llama_like(cfg, "Phi3ForCausalLM", partial_rotary=partial, fused_qkv=True, fused_gate_up=True)


@register("Olmo2ForCausalLM")
def _olmo2(cfg: dict) -> ModelSpec:
    """OLMo 2: norms after attention and after the FFN (none before), q/k RMSNorm over all heads (models/olmo2.py)."""
    if _bool(cfg, "attention_bias"):
        raise ModelLoadError("Olmo2ForCausalLM with attention_bias: true is not supported yet")
    return dataclasses.replace(_llama_like(cfg, "Olmo2ForCausalLM", qk_norm=True, qk_norm_full=True),
                               family="olmo2")


@register("MistralForCausalLM")
def _mistral(cfg: dict) -> ModelSpec:
    return _llama_like(cfg, "MistralForCausalLM")   # transformers' Mistral has no projection biases


def _experts(cfg: dict, n_layers: int, keys=("num_local_experts",), sparse_layers: bool = False,
             norm_default: bool = False) -> dict:
    """The MoE fields of a ModelSpec. keys: the config keys naming the expert count (the first present is used);
    sparse_layers: the Qwen-MoE rule (a layer is sparse unless listed in mlp_only_layers, and only every
    decoder_sparse_step-th); norm_default: norm_topk_prob when the config does not say."""
    key = next((k for k in keys if k in cfg), keys[0])
    n = _int(cfg, key)
    k = _int(cfg, "num_experts_per_tok")
    if k > n:
        raise ModelLoadError(f"config.json: num_experts_per_tok ({k}) must be at most {key} ({n})")
    dense: tuple[int, ...] = ()
    if sparse_layers:
        step = _int(cfg, "decoder_sparse_step", 1)
        only = cfg.get("mlp_only_layers") or []
        if not isinstance(only, list) or any(not _is_int(i) or not 0 <= i < n_layers for i in only):
            raise _bad("mlp_only_layers", f"a list of layer indices in [0, {n_layers})", only)
        dense = tuple(i for i in range(n_layers) if i in only or (i + 1) % step)
    return dict(n_experts=n, n_experts_per_tok=k, norm_topk_prob=_bool(cfg, "norm_topk_prob", norm_default),
                dense_layers=dense)


@register("MixtralForCausalLM")
def _mixtral(cfg: dict) -> ModelSpec:
    moe = _experts(cfg, _int(cfg, "num_hidden_layers"), norm_default=True)
    moe["norm_topk_prob"] = True    # Mixtral always renormalizes its top-k weights (no config key)
    return _llama_like(cfg, "MixtralForCausalLM", **moe)


@register("Qwen2MoeForCausalLM")
def _qwen2_moe(cfg: dict) -> ModelSpec:
    moe = _experts(cfg, _int(cfg, "num_hidden_layers"), ("num_experts", "num_local_experts"), sparse_layers=True)
    return _llama_like(cfg, "Qwen2MoeForCausalLM", attention_bias=_bool(cfg, "qkv_bias", True),
                       moe_intermediate_size=_int(cfg, "moe_intermediate_size"),
                       shared_expert_intermediate_size=_int(cfg, "shared_expert_intermediate_size"), **moe)


@register("Qwen3MoeForCausalLM")
def _qwen3_moe(cfg: dict) -> ModelSpec:
    if _bool(cfg, "attention_bias"):   # transformers' Qwen3 then has an o_proj bias too, which models/llama.py lacks
        raise ModelLoadError("Qwen3MoeForCausalLM with attention_bias: true (biases on the q/k/v/o projections) is "
                             "not supported yet")
    moe = _experts(cfg, _int(cfg, "num_hidden_layers"), ("num_experts", "num_local_experts"), sparse_layers=True)
    return _llama_like(cfg, "Qwen3MoeForCausalLM", qk_norm=True,
                       moe_intermediate_size=_int(cfg, "moe_intermediate_size"), **moe)


@register("OlmoeForCausalLM")
def _olmoe(cfg: dict) -> ModelSpec:
    if _bool(cfg, "attention_bias"):
        raise ModelLoadError("OlmoeForCausalLM with attention_bias: true is not supported yet")
    if cfg.get("clip_qkv") is not None:
        raise ModelLoadError(f"OlmoeForCausalLM with clip_qkv {short_repr(cfg['clip_qkv'])} (clamped q/k/v) is not "
                             "supported yet: only clip_qkv null")
    moe = _experts(cfg, _int(cfg, "num_hidden_layers"), ("num_experts", "num_local_experts"))
    return _llama_like(cfg, "OlmoeForCausalLM", qk_norm=True, qk_norm_full=True, **moe)


@register("BitNetForCausalLM")
def _bitnet(cfg: dict) -> ModelSpec:
    qc = cfg.get("quantization_config")
    if qc is None:
        qc = {}
    if not isinstance(qc, dict):
        raise _bad("quantization_config", "an object", qc)
    mode = qc.get("quantization_mode", "offline")
    if not isinstance(mode, str):
        raise _bad("quantization_config.quantization_mode", "a string", mode)
    if _bool(qc, "use_rms_norm") or mode != "offline":
        raise ModelLoadError("BitNet checkpoints with online quantization or BitLinear RMSNorm are not supported: "
                             "export packed ternary weights (quantization_mode 'offline')")
    return dataclasses.replace(_llama_like({"hidden_act": "relu2", **cfg}, "BitNetForCausalLM", acts=("relu2",)),
                               family="bitnet")


@register("Qwen2ForCausalLM")
def _qwen2(cfg: dict) -> ModelSpec:
    return _llama_like(cfg, "Qwen2ForCausalLM", attention_bias=True)


@register("Qwen3ForCausalLM")
def _qwen3(cfg: dict) -> ModelSpec:
    if _bool(cfg, "attention_bias"):   # transformers' Qwen3 then has an o_proj bias too, which models/llama.py lacks
        raise ModelLoadError("Qwen3ForCausalLM with attention_bias: true (biases on the q/k/v/o projections) is not "
                             "supported yet")
    return _llama_like(cfg, "Qwen3ForCausalLM", qk_norm=True)


def _gemma_windows(cfg: dict, n_layers: int) -> tuple[int, ...]:
    """Gemma 3's sliding-window layers: `layer_types`, or (older configs) every layer but each
    `sliding_window_pattern`-th (default 6)."""
    w = _int(cfg, "sliding_window", 4096)
    types = cfg.get("layer_types")
    if types is None:
        key = "sliding_window_pattern" if "sliding_window_pattern" in cfg else "_sliding_window_pattern"
        pattern = _int(cfg, key, 6)
        types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n_layers)]
    if not isinstance(types, list) or len(types) != n_layers or any(
            not isinstance(t, str) or t not in ("sliding_attention", "full_attention") for t in types):
        raise ModelLoadError(f"config.json: layer_types must list 'full_attention' or 'sliding_attention' for each of "
                             f"the {n_layers} layers, got {short_repr(types)}")
    return tuple(w if t == "sliding_attention" else 0 for t in types)


@register("Gemma2ForCausalLM")
def _gemma2(cfg: dict) -> ModelSpec:
    """Gemma 2: Gemma 3's block without q/k norms, every other layer sliding (the first one), one RoPE base, and
    logit soft-capping of the attention scores (default 50) and of the final logits (default 30)."""
    arch = "Gemma2ForCausalLM"
    if _bool(cfg, "attention_bias"):
        raise ModelLoadError(f"{arch} with attention_bias: true is not supported yet")
    act = cfg.get("hidden_activation", cfg.get("hidden_act", "gelu_pytorch_tanh"))
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ModelLoadError(f"{arch} with hidden_activation {short_repr(act)} is not supported (only gelu_pytorch_tanh)")
    base = {k: v for k, v in cfg.items() if k != "hidden_act"}
    base.setdefault("head_dim", 256)
    spec = _llama_like(base, arch)
    n = spec.n_layers
    if cfg.get("layer_types") is None:
        cfg = {**cfg, "layer_types": ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]}
    caps = {}
    for key, default in (("attn_logit_softcapping", 50.0), ("final_logit_softcapping", 30.0)):
        v = cfg.get(key, default)
        caps[key] = 0.0 if v is None else _check_float(key, v)
    qpas = _float(cfg, "query_pre_attn_scalar", 256.0)
    return dataclasses.replace(spec, family="gemma", embed_scale=math.sqrt(spec.hidden_size),
                               q_scale=math.sqrt(spec.head_dim / qpas), layer_windows=_gemma_windows(cfg, n),
                               attn_softcap=caps["attn_logit_softcapping"],
                               final_softcap=caps["final_logit_softcapping"])


@register("Gemma3ForCausalLM")
def _gemma3(cfg: dict) -> ModelSpec:
    arch = "Gemma3ForCausalLM"
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):   # Gemma 3 configs carry them null
        if cfg.get(key) is not None:
            raise ModelLoadError(f"{arch} with {key} {short_repr(cfg[key])} is not supported yet (only null)")
    if _bool(cfg, "attention_bias"):
        raise ModelLoadError(f"{arch} with attention_bias: true is not supported yet")
    if _bool(cfg, "use_bidirectional_attention"):
        raise ModelLoadError(f"{arch} with use_bidirectional_attention: true (an encoder) cannot generate text")
    act = cfg.get("hidden_activation", cfg.get("hidden_act", "gelu_pytorch_tanh"))
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ModelLoadError(f"{arch} with hidden_activation {short_repr(act)} is not supported (only gelu_pytorch_tanh)")
    # RoPE: transformers 5 nests one parameter set per layer type; older configs give rope_theta (+ rope_scaling)
    # for the global layers and rope_local_base_freq for the sliding ones
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict) and "full_attention" in rp:
        glob, loc = rp.get("full_attention"), rp.get("sliding_attention") or {}
        if not isinstance(glob, dict) or not isinstance(loc, dict):
            raise _bad("rope_parameters", "an object per layer type", rp)
        theta, scaling = _rope({"rope_parameters": glob}, 0)
        if loc.get("rope_type", "default") not in ("default", None):
            raise ModelLoadError(f"{arch}: rope_parameters.sliding_attention of type {short_repr(loc['rope_type'])} "
                                 "is not supported (only default)")
        local = _check_float("rope_parameters.sliding_attention.rope_theta", loc.get("rope_theta", 10000.0))
    else:
        theta, scaling = _rope(cfg, 0)
        local = _float(cfg, "rope_local_base_freq", 10000.0)
    base = {k: v for k, v in cfg.items() if k not in ("rope_scaling", "rope_parameters", "hidden_act")}
    base.setdefault("head_dim", 256)
    spec = _llama_like(base, arch, qk_norm=True)
    qpas = _float(cfg, "query_pre_attn_scalar", 256.0)
    return dataclasses.replace(spec, family="gemma", rope_theta=theta, rope_scaling=scaling, rope_local_theta=local,
                               embed_scale=math.sqrt(spec.hidden_size), q_scale=math.sqrt(spec.head_dim / qpas),
                               layer_windows=_gemma_windows(cfg, spec.n_layers))


def spec_from_config(cfg: dict) -> ModelSpec:
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"config.json must be a JSON object, got {type(cfg).__name__}")
    archs = cfg.get("architectures")
    if not archs:
        raise ModelLoadError("config.json names no 'architectures': cannot tell which model this is")
    if not isinstance(archs, list) or not isinstance(archs[0], str):
        raise _bad("architectures", "a list of class names such as [\"LlamaForCausalLM\"]", archs)
    arch = archs[0]
    if arch not in _BUILDERS:
        raise ModelLoadError(f"unknown architecture {short_repr(arch)}: supported are {', '.join(supported_architectures())}")
    return _BUILDERS[arch](cfg)
