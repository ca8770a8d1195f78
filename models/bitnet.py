"""BitNet b1.58 forward pass (transformers' BitNetForCausalLM, e.g. microsoft/bitnet-b1.58-2B-4T): Llama layout with
ternary BitLinear projections (int8 per-token absmax activations), sub-layer norms before o_proj and down_proj,
and a squared-ReLU gated FFN."""
from __future__ import annotations

import numpy as np

from .graph import Graph, Value
from .spec import ModelSpec

FLOAT_LINEARS = False   # ternary checkpoints: GPTQ (quant/calibration.py) does not apply
PROJ = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
        "mlp.down_proj")


def body(g: Graph, ids: Value) -> Value:
    s = g.spec
    x = g.embed(ids, "model.embed_tokens.weight")
    for i in range(s.n_layers):
        p = f"model.layers.{i}."
        a, m = p + "self_attn.", p + "mlp."
        h = g.rmsnorm(x, p + "input_layernorm.weight")
        q = g.rope(g.bitlinear(h, a + "q_proj"), s.n_heads)
        k = g.rope(g.bitlinear(h, a + "k_proj"), s.n_kv_heads)
        g.kv_store(i, k, g.bitlinear(h, a + "v_proj"))
        att = g.rmsnorm(g.attention(q, i), a + "attn_sub_norm.weight")
        x = g.add(x, g.bitlinear(att, a + "o_proj"))
        h = g.rmsnorm(x, p + "post_attention_layernorm.weight")
        f = g.rmsnorm(g.relu2_mul(g.bitlinear(h, m + "gate_proj"), g.bitlinear(h, m + "up_proj")), m + "ffn_sub_norm.weight")
        x = g.add(x, g.bitlinear(f, m + "down_proj"))
    return x


def head(g: Graph, x: Value) -> Value:
    return g.linear(g.rmsnorm(x, "model.norm.weight"), g.spec.lm_head_name)


def weight_shapes(s: ModelSpec) -> dict[str, tuple[int, ...]]:
    d, f, q, kv = s.hidden_size, s.intermediate_size, s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim
    out_in = {"self_attn.q_proj": (q, d), "self_attn.k_proj": (kv, d), "self_attn.v_proj": (kv, d),
              "self_attn.o_proj": (d, q), "mlp.gate_proj": (f, d), "mlp.up_proj": (f, d), "mlp.down_proj": (d, f)}
    w: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (s.vocab_size, d), "model.norm.weight": (d,)}
    if not s.tie_word_embeddings:
        w["lm_head.weight"] = (s.vocab_size, d)
    for i in range(s.n_layers):
        p = f"model.layers.{i}."
        w.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                  p + "self_attn.attn_sub_norm.weight": (d,), p + "mlp.ffn_sub_norm.weight": (f,)})
        for name, (o, k) in out_in.items():
            w[p + name + ".weight"] = (o // 4, k)        # 2-bit codes, 4 output rows per byte
            w[p + name + ".weight_scale"] = (1,)
    return w


def unpack_ternary(packed: np.ndarray) -> np.ndarray:
    """transformers' layout: byte row i holds output rows i + j*R (R = packed rows) in bits 2j..2j+1, code-1."""
    R = packed.shape[0]
    codes = np.concatenate([(packed >> (2 * j)) & 3 for j in range(4)], axis=0)
    assert codes.shape[0] == 4 * R
    return codes.astype(np.int8) - 1


def bitlinear_ref(x: np.ndarray, packed: np.ndarray, weight_scale: float) -> np.ndarray:
    """int8 absmax per-token activations x ternary weights, rescaled (transformers' BitLinear, offline mode)."""
    s = 127.0 / np.maximum(np.abs(x).max(-1, keepdims=True), 1e-5)
    xq = np.clip(np.round(x * s), -128, 127)
    return (xq @ unpack_ternary(packed).T.astype(x.dtype)) / (s * weight_scale)
