"""Llama-family forward pass (Llama 2/3 with or without attention / MLP biases, TinyLlama, SmolLM, Mistral, Qwen2
with qkv bias, Qwen3 with q/k norm, SmolLM3 with its NoPE layers, Granite with its multipliers folded into the
weights (models/folds.py), Phi-3/4 with fused projections split as they are read and partial rotary) and
its mixture-of-experts relatives (Mixtral, Qwen2-MoE with a sigmoid-gated shared expert, Qwen3-MoE, OLMoE with
q/k norm over all heads), written once against models.graph.Graph."""
from __future__ import annotations

from .folds import llama_folds
from .graph import Graph, Value
from .spec import ModelSpec


def body(g: Graph, ids: Value) -> Value:
    """Token ids [T] -> hidden states [T, hidden] (also fills the KV cache rows of these tokens)."""
    s = g.spec
    ahead = getattr(g, "expert_lookahead", 0)   # backends that read experts ahead set it (compiler/trace.py)
    x = g.embed(ids, "model.embed_tokens.weight")
    for i in range(s.n_layers):
        p = f"model.layers.{i}."
        if ahead and i + ahead - 1 < s.n_layers and s.is_moe_layer(i + ahead - 1):
            _predict(g, i + ahead - 1, x)
        a = p + "self_attn."
        h = g.rmsnorm(x, p + "input_layernorm.weight")
        q = g.linear(h, a + "q_proj.weight", a + "q_proj.bias" if s.attention_bias else None)
        k = g.linear(h, a + "k_proj.weight", a + "k_proj.bias" if s.attention_bias else None)
        v = g.linear(h, a + "v_proj.weight", a + "v_proj.bias" if s.attention_bias else None)
        if s.qk_norm:
            q = g.head_rmsnorm(q, a + "q_norm.weight", 1 if s.qk_norm_full else s.n_heads)
            k = g.head_rmsnorm(k, a + "k_norm.weight", 1 if s.qk_norm_full else s.n_kv_heads)
        if s.uses_rope(i):
            q, k = g.rope(q, s.n_heads), g.rope(k, s.n_kv_heads)
        g.kv_store(i, k, v)
        x = g.add(x, g.linear(g.attention(q, i), a + "o_proj.weight", a + "o_proj.bias" if s.o_bias else None))
        h = g.rmsnorm(x, p + "post_attention_layernorm.weight")
        x = g.add(x, _moe(g, i, h) if s.is_moe_layer(i) else _mlp(g, dense_mlp(s, i), h, s.mlp_bias))
    return x


def _mlp(g: Graph, names: tuple[str, str, str], h: Value, bias: bool = False) -> Value:
    gate, up, down = names
    b = (lambda w: w.removesuffix(".weight") + ".bias") if bias else (lambda w: None)
    return g.linear(g.swiglu(g.linear(h, gate, b(gate)), g.linear(h, up, b(up))), down, b(down))


def dense_mlp(s: ModelSpec, i: int) -> tuple[str, str, str]:
    m = f"model.layers.{i}.mlp."
    return m + "gate_proj.weight", m + "up_proj.weight", m + "down_proj.weight"


def moe_names(s: ModelSpec, i: int) -> dict:
    """Weight names of layer i's MoE block: router, experts [(gate, up, down)] by id, and the shared expert and
    its gate (Qwen2-MoE) or None."""
    if s.arch == "MixtralForCausalLM":
        m = f"model.layers.{i}.block_sparse_moe."
        experts = [(f"{m}experts.{e}.w1.weight", f"{m}experts.{e}.w3.weight", f"{m}experts.{e}.w2.weight")
                   for e in range(s.n_experts)]
    else:   # Qwen2-MoE, Qwen3-MoE, OLMoE
        m = f"model.layers.{i}.mlp."
        experts = [tuple(f"{m}experts.{e}.{p}_proj.weight" for p in ("gate", "up", "down")) for e in range(s.n_experts)]
    shared = (tuple(f"{m}shared_expert.{p}_proj.weight" for p in ("gate", "up", "down"))
              if s.shared_expert_intermediate_size else None)
    return {"router": m + "gate.weight", "experts": experts, "shared": shared,
            "shared_gate": m + "shared_expert_gate.weight" if shared else None}


def _moe(g: Graph, i: int, h: Value) -> Value:
    s, n = g.spec, moe_names(g.spec, i)
    y = g.experts(h, g.route(h, n["router"], s.n_experts_per_tok, s.norm_topk_prob), n["experts"])
    if n["shared"]:
        y = g.add(y, g.sigmoid_gate(h, n["shared_gate"], _mlp(g, n["shared"], h)))
    return y


def _predict(g: Graph, j: int, x: Value) -> None:
    """Layer j's router applied early to the residual stream x (normed with layer j's own MoE norm): a guess at
    the experts layer j will select, for a backend to read them ahead. It changes no value."""
    s = g.spec
    g.predict_experts(x, f"model.layers.{j}.post_attention_layernorm.weight", moe_names(s, j)["router"],
                      s.n_experts_per_tok, moe_names(s, j)["experts"], j)


def weight_transforms(s: ModelSpec) -> dict:
    """Checkpoint name -> what the stored tensor becomes as it is read (models/folds.py)."""
    return llama_folds(s, dense_mlp)


def weight_sources(s: ModelSpec) -> dict[str, tuple[str, int, int]]:
    """Weights the checkpoint stores inside a fused tensor: name -> (stored name, first row, end row). Phi-3 keeps
    q, k, v as one qkv_proj (in that order) and gate, up as one gate_up_proj."""
    out: dict[str, tuple[str, int, int]] = {}
    q, kv, f = s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim, s.intermediate_size
    for i in range(s.n_layers):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        if s.fused_qkv:
            for n, lo, hi in (("q", 0, q), ("k", q, q + kv), ("v", q + kv, q + 2 * kv)):
                out[a + f"{n}_proj.weight"] = (a + "qkv_proj.weight", lo, hi)
        if s.fused_gate_up and not s.is_moe_layer(i):
            out[m + "gate_proj.weight"] = (m + "gate_up_proj.weight", 0, f)
            out[m + "up_proj.weight"] = (m + "gate_up_proj.weight", f, 2 * f)
    return out


def head(g: Graph, x: Value) -> Value:
    """Hidden states [T, hidden] -> logits [T, vocab]."""
    return g.linear(g.rmsnorm(x, "model.norm.weight"), g.spec.lm_head_name)


def weight_shapes(s: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Every checkpoint tensor the forward pass reads, with the shape it must have."""
    hd, q, kv, f, d = s.head_dim, s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim, s.intermediate_size, s.hidden_size
    w: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (s.vocab_size, d), "model.norm.weight": (d,)}
    if not s.tie_word_embeddings:
        w["lm_head.weight"] = (s.vocab_size, d)

    def ffn(names, width):
        gate, up, down = names
        w.update({gate: (width, d), up: (width, d), down: (d, width)})

    for i in range(s.n_layers):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        w.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                  a + "q_proj.weight": (q, d), a + "k_proj.weight": (kv, d), a + "v_proj.weight": (kv, d),
                  a + "o_proj.weight": (d, q)})
        if s.is_moe_layer(i):
            n = moe_names(s, i)
            w[n["router"]] = (s.n_experts, d)
            for e in n["experts"]:
                ffn(e, s.expert_size)
            if n["shared"]:
                ffn(n["shared"], s.shared_expert_intermediate_size)
                w[n["shared_gate"]] = (1, d)
        else:
            ffn(dense_mlp(s, i), f)
            if s.mlp_bias:
                gate, up, down = (n.removesuffix(".weight") + ".bias" for n in dense_mlp(s, i))
                w.update({gate: (f,), up: (f,), down: (d,)})
        if s.attention_bias:
            w.update({a + "q_proj.bias": (q,), a + "k_proj.bias": (kv,), a + "v_proj.bias": (kv,)})
        if s.o_bias:
            w[a + "o_proj.bias"] = (d,)
        if s.qk_norm:
            w.update({a + "q_norm.weight": (q if s.qk_norm_full else hd,), a + "k_norm.weight": (kv if s.qk_norm_full else hd,)})
    return w
