"""Llama-family forward pass (Llama 2/3, TinyLlama, SmolLM, Mistral, Qwen2 with qkv bias, Qwen3 with q/k norm),
written once against models.graph.Graph."""
from __future__ import annotations

from .graph import Graph, Value
from .spec import ModelSpec


def body(g: Graph, ids: Value) -> Value:
    """Token ids [T] -> hidden states [T, hidden] (also fills the KV cache rows of these tokens)."""
    s = g.spec
    x = g.embed(ids, "model.embed_tokens.weight")
    for i in range(s.n_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        h = g.rmsnorm(x, p + "input_layernorm.weight")
        q = g.linear(h, a + "q_proj.weight", a + "q_proj.bias" if s.attention_bias else None)
        k = g.linear(h, a + "k_proj.weight", a + "k_proj.bias" if s.attention_bias else None)
        v = g.linear(h, a + "v_proj.weight", a + "v_proj.bias" if s.attention_bias else None)
        if s.qk_norm:
            q = g.head_rmsnorm(q, a + "q_norm.weight", s.n_heads)
            k = g.head_rmsnorm(k, a + "k_norm.weight", s.n_kv_heads)
        q = g.rope(q, s.n_heads)
        k = g.rope(k, s.n_kv_heads)
        g.kv_store(i, k, v)
        x = g.add(x, g.linear(g.attention(q, i), a + "o_proj.weight"))
        h = g.rmsnorm(x, p + "post_attention_layernorm.weight")
        x = g.add(x, _moe(g, p, h) if s.n_experts else _mlp(g, p + "mlp.", h))
    return x


def _mlp(g: Graph, m: str, h: Value) -> Value:
    return g.linear(g.swiglu(g.linear(h, m + "gate_proj.weight"), g.linear(h, m + "up_proj.weight")), m + "down_proj.weight")


def _expert_names(s: ModelSpec, p: str) -> list[tuple[str, str, str]]:
    e = p + "block_sparse_moe.experts."
    return [(f"{e}{i}.w1.weight", f"{e}{i}.w3.weight", f"{e}{i}.w2.weight") for i in range(s.n_experts)]


def _moe(g: Graph, p: str, h: Value) -> Value:
    return g.moe(h, p + "block_sparse_moe.gate.weight", _expert_names(g.spec, p), g.spec.n_experts_per_tok)


def head(g: Graph, x: Value) -> Value:
    """Hidden states [T, hidden] -> logits [T, vocab]."""
    return g.linear(g.rmsnorm(x, "model.norm.weight"), g.spec.lm_head_name)


def weight_shapes(s: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Every checkpoint tensor the forward pass reads, with the shape it must have."""
    hd, q, kv, f, d = s.head_dim, s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim, s.intermediate_size, s.hidden_size
    w: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (s.vocab_size, d), "model.norm.weight": (d,)}
    if not s.tie_word_embeddings:
        w["lm_head.weight"] = (s.vocab_size, d)
    for i in range(s.n_layers):
        p, a, m = f"model.layers.{i}.", f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        w.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                  a + "q_proj.weight": (q, d), a + "k_proj.weight": (kv, d), a + "v_proj.weight": (kv, d),
                  a + "o_proj.weight": (d, q)})
        if s.n_experts:
            w[p + "block_sparse_moe.gate.weight"] = (s.n_experts, d)
            for gate, up, down in _expert_names(s, p):
                w.update({gate: (f, d), up: (f, d), down: (d, f)})
        else:
            w.update({m + "gate_proj.weight": (f, d), m + "up_proj.weight": (f, d), m + "down_proj.weight": (d, f)})
        if s.attention_bias:
            w.update({a + "q_proj.bias": (q,), a + "k_proj.bias": (kv,), a + "v_proj.bias": (kv,)})
        if s.qk_norm:
            w.update({a + "q_norm.weight": (hd,), a + "k_norm.weight": (hd,)})
    return w
