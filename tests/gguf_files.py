"""Tiny GGUF files written the way llama.cpp's convert_hf_to_gguf.py writes them (its tensor names, its LLaMA q/k row
permutation, Gemma's norms stored as 1 + w, its metadata keys, the byte-level tokenizer's tokens/merges/types),
from a Hugging Face checkpoint folder, with the gguf package's writer and numpy quantizers (F32, F16, BF16, Q8_0,
Q4_0, Q4_1, Q5_0, Q5_1; Q4_K by the round-to-nearest encoder here: llama-quantize's own K-quant files are the
real-model tier's, tests/test_gguf_llamacpp.py).

Deliberately independent of edgellm's reader (models/gguf/): the tests check the two against transformers' own
GGUF loader."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from edgellm.models.bitnet import unpack_ternary
from edgellm.models.checkpoint import Checkpoint, read_config
from edgellm.models.gguf.ternary import PROJ_SUFFIXES

ARCH = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
        "Gemma3ForCausalLM": "gemma3", "MixtralForCausalLM": "llama", "Qwen3MoeForCausalLM": "qwen3moe",
        "Olmo2ForCausalLM": "olmo2", "SmolLM3ForCausalLM": "smollm3", "GraniteForCausalLM": "granite",
        "Phi3ForCausalLM": "phi3", "Gemma2ForCausalLM": "gemma2", "BitNetForCausalLM": "bitnet"}
PERMUTED = ("llama", "smollm3", "granite")   # convert_hf_to_gguf's LlamaModel and its subclasses
ARCH_LAYER = {   # per-architecture name overrides (tensor_mapping.py)
    "gemma3": {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
               "post_feedforward_layernorm": "post_ffw_norm"},
    "gemma2": {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
               "post_feedforward_layernorm": "post_ffw_norm"},
    "olmo2": {"post_attention_layernorm": "post_attention_norm", "post_feedforward_layernorm": "post_ffw_norm"},
    "phi3": {"self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"},
    "bitnet": {"self_attn.attn_sub_norm": "attn_sub_norm", "mlp.ffn_sub_norm": "ffn_sub_norm"},
}
LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
         "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
         "mlp.down_proj": "ffn_down", "post_attention_layernorm": "ffn_norm", "mlp.gate": "ffn_gate_inp",
         "block_sparse_moe.gate": "ffn_gate_inp"}
TERNARY = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
EXPERT = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps",
          "w1": "ffn_gate_exps", "w3": "ffn_up_exps", "w2": "ffn_down_exps"}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:   # convert_hf_to_gguf.LlamaModel.permute
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _llama3_factors(cfg: dict, rs: dict) -> np.ndarray:
    """convert_hf_to_gguf's LlamaModel rope_freqs: the divisor of each rotary frequency under llama3 scaling."""
    import math

    d, base = cfg["head_dim"], cfg["rope_theta"]
    factor, lo, hi = rs["factor"], rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
    old = rs.get("original_max_position_embeddings", 8192)
    out = []
    for i in range(0, d, 2):
        wavelen = 2 * math.pi * base ** (i / d)
        if wavelen < old / hi:
            out.append(1.0)
        elif wavelen > old / lo:
            out.append(factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, np.float32)


def quantize_q4_k(a: np.ndarray) -> np.ndarray:
    """Q4_K blocks of a [..., K] array (K % 256 == 0), round to nearest (not llama.cpp's search): per sub-block of 32
    a scale (max - min) / 15 and a minimum min(0, min), as 6-bit multiples of the super-block's f16 d and dmin."""
    lead, K = a.shape[:-1], a.shape[-1]
    x = np.asarray(a, np.float32).reshape(-1, K // 256, 8, 32)
    lo = np.minimum(x.min(-1), 0)
    scale, mn = (x.max(-1) - lo) / 15, -lo
    d16, dmin16 = (scale.max(-1) / 63).astype(np.float16), (mn.max(-1) / 63).astype(np.float16)
    d, dmin = d16.astype(np.float32)[..., None], dmin16.astype(np.float32)[..., None]
    sc = np.where(d > 0, np.clip(np.rint(scale / np.where(d > 0, d, 1)), 0, 63), 0).astype(np.uint8)
    m = np.where(dmin > 0, np.clip(np.rint(mn / np.where(dmin > 0, dmin, 1)), 0, 63), 0).astype(np.uint8)
    es, em = (d * sc)[..., None], (dmin * m)[..., None]
    q = np.where(es > 0, np.clip(np.rint((x + em) / np.where(es > 0, es, 1)), 0, 15), 0).astype(np.uint8)
    scales = np.concatenate([sc[..., :4] | ((sc[..., 4:] >> 4) << 6), m[..., :4] | ((m[..., 4:] >> 4) << 6),
                             (sc[..., 4:] & 15) | ((m[..., 4:] & 15) << 4)], axis=-1)
    qs = (q[..., 0::2, :] | (q[..., 1::2, :] << 4)).reshape(*q.shape[:2], 128)
    blocks = np.concatenate([d16[..., None].view(np.uint8), dmin16[..., None].view(np.uint8), scales, qs], axis=-1)
    return blocks.reshape(*lead, K // 256 * 144)


def write_gguf(hf_dir: Path, out: Path, qtype: str = "F32", pre: str = "gpt-2", control: dict | None = None) -> Path:
    """control: {token id: name} tokens renamed to control tokens (a family's turn markers; merges that made them are
    dropped)."""
    import gguf
    from gguf import GGMLQuantizationType as T

    hf_dir = Path(hf_dir)
    cfg = read_config(hf_dir)
    hf_arch = cfg["architectures"][0]
    arch = ARCH[hf_arch]
    gemma = arch in ("gemma2", "gemma3")
    ck = Checkpoint(hf_dir)
    w = gguf.GGUFWriter(str(out), arch)
    n_layers, heads, kv = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w.add_block_count(n_layers)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    rp = cfg.get("rope_parameters") or {}
    w.add_rope_freq_base(float(rp.get("full_attention", {}).get("rope_theta", cfg.get("rope_theta", 10000.0))))
    w.add_vocab_size(cfg["vocab_size"])
    if "num_local_experts" in cfg or "num_experts" in cfg:
        w.add_expert_count(cfg.get("num_local_experts", cfg.get("num_experts")))
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        if "moe_intermediate_size" in cfg:
            w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if arch == "gemma2":   # Gemma2Model.set_gguf_parameters: the pattern is llama.cpp's (every other layer)
        w.add_sliding_window(cfg["sliding_window"])
        w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    if arch == "gemma3":
        w.add_sliding_window(cfg["sliding_window"])
        types = cfg["layer_types"]
        w.add_array(f"{arch}.attention.sliding_window_pattern", [t == "sliding_attention" for t in types])
        w.add_float32(f"{arch}.rope.freq_base_swa", float(rp.get("sliding_attention", {}).get("rope_theta", 10000.0)))
    if arch == "granite":   # GraniteModel.set_gguf_parameters
        w.add_attention_scale(cfg["attention_multiplier"])
        w.add_embedding_scale(cfg["embedding_multiplier"])
        w.add_residual_scale(cfg["residual_multiplier"])
        w.add_logit_scale(cfg["logits_scaling"])
    if arch == "phi3":      # Phi3MiniModel.set_gguf_parameters / generate_extra_tensors
        rope = cfg.get("rope_scaling") or {}
        orig = cfg["original_max_position_embeddings"]
        rot = int(cfg.get("partial_rotary_factor", 1.0) * cfg["hidden_size"]) // heads
        w.add_rope_dimension_count(rot)
        w.add_rope_scaling_orig_ctx_len(orig)
        w.add_sliding_window(cfg.get("sliding_window") or 0)
        if rope.get("long_factor"):
            scale = cfg["max_position_embeddings"] / orig
            w.add_rope_scaling_attn_factors(np.sqrt(1 + np.log(scale) / np.log(orig)) if scale > 1 else 1.0)
            w.add_tensor("rope_factors_long.weight", np.asarray(rope["long_factor"], np.float32))
            w.add_tensor("rope_factors_short.weight", np.asarray(rope["short_factor"], np.float32))
    _tokenizer(w, hf_dir, pre, control or {})
    rs = cfg.get("rope_scaling") or {}
    if arch == "llama" and rs.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", _llama3_factors(cfg, rs))

    qt = T[qtype]
    experts: dict[tuple[int, str], dict[int, np.ndarray]] = {}

    def put(name: str, a: np.ndarray, quantize: bool):
        a = np.ascontiguousarray(a, np.float32)
        if qt in (T.TQ1_0, T.TQ2_0):   # llama-quantize's ternary types: the BitLinear weights only
            quantize = quantize and name.split(".")[-2] in TERNARY
        if quantize and qt == T.Q4_K:   # llama-quantize's fallback where a row is no whole super-block: Q5_0
            if a.shape[-1] % 256 == 0:
                w.add_tensor(name, quantize_q4_k(a), raw_dtype=T.Q4_K)
            else:
                w.add_tensor(name, gguf.quants.quantize(a, T.Q5_0), raw_dtype=T.Q5_0)
        elif quantize and qt not in (T.F32,) and a.shape[-1] % 32 == 0:
            data = gguf.quants.quantize(a, qt)
            w.add_tensor(name, data, raw_dtype=qt)
        else:
            w.add_tensor(name, a)

    for name in ck.names():
        if name.endswith(".weight_scale"):
            continue
        if arch == "bitnet" and name.endswith(PROJ_SUFFIXES):   # BitnetModel.weight_quant: ternary x absmean, floats
            ws = float(np.asarray(ck.get(name.removesuffix(".weight") + ".weight_scale"), np.float32)[0])
            a = unpack_ternary(np.asarray(ck.get(name))).astype(np.float32) * np.float32(1.0 / ws)
        else:
            a = np.asarray(ck.get(name), np.float32)
        if gemma and name.endswith("norm.weight"):
            a = a + 1.0
        if name == "model.embed_tokens.weight":
            put("token_embd.weight", a, True)
            continue
        if name == "model.norm.weight":
            put("output_norm.weight", a, False)
            continue
        if name == "lm_head.weight":
            put("output.weight", a, True)
            continue
        parts = name.split(".")
        i, rest, kind = int(parts[2]), ".".join(parts[3:-1]), parts[-1]
        if ".experts." in name:
            e = int(parts[parts.index("experts") + 1])
            experts.setdefault((i, EXPERT[parts[-2]]), {})[e] = a
            continue
        if arch in PERMUTED and rest in ("self_attn.q_proj", "self_attn.k_proj"):
            a = _permute(a, heads if rest == "self_attn.q_proj" else kv)
        short = ARCH_LAYER.get(arch, {}).get(rest) or LAYER[rest]
        if short == "ffn_gate_inp_shexp":   # Qwen2MoeModel squeezes the shared expert's gate (1, hidden) to a vector
            a = a.reshape(-1)
        put(f"blk.{i}.{short}.{kind}", a, a.ndim == 2 and short not in ("ffn_gate_inp", "ffn_gate_inp_shexp"))
    for (i, short), by_e in sorted(experts.items()):
        put(f"blk.{i}.{short}.weight", np.stack([by_e[e] for e in sorted(by_e)]), True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _tokenizer(w, hf_dir: Path, pre: str, control: dict) -> None:
    """A byte-level tokenizer.json as llama.cpp's _set_vocab_gpt2 writes it."""
    tj = json.loads((hf_dir / "tokenizer.json").read_text())
    tc = json.loads((hf_dir / "tokenizer_config.json").read_text())
    vocab = {**tj["model"]["vocab"], **{a["content"]: a["id"] for a in tj["added_tokens"]}}
    n = max(vocab.values()) + 1
    tokens = [f"[PAD{i}]" for i in range(n)]
    for t, i in vocab.items():
        tokens[i] = t
    special = {a["id"] for a in tj["added_tokens"] if a.get("special")}
    types = [3 if i in special else 1 for i in range(n)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    gone = {tokens[i] for i in control}
    merges = [m for m in merges if m.replace(" ", "") not in gone]
    for i, name in control.items():
        tokens[i], types[i] = name, 3
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    ids = {t: i for i, t in enumerate(tokens)}
    if tc.get("bos_token") in ids:
        w.add_bos_token_id(ids[tc["bos_token"]])
    if tc.get("eos_token") in ids:
        w.add_eos_token_id(ids[tc["eos_token"]])
    w.add_add_bos_token(bool(tc.get("add_bos_token", False)))
    if tc.get("chat_template"):
        w.add_chat_template(tc["chat_template"])
