"""OLMo 2 forward pass, written once against models.graph.Graph: Llama's projections with RMSNorm on q and k over
all heads at once, and the norms moved from before each block to after it (post-attention and post-FFN, nothing
before): x + norm(attn(x)), then x + norm(mlp(x))."""
from __future__ import annotations

from . import llama
from .graph import Graph, Value
from .spec import ModelSpec

head = llama.head
weight_transforms = llama.weight_transforms


def body(g: Graph, ids: Value) -> Value:
    """Token ids [T] -> hidden states [T, hidden] (also fills the KV cache rows of these tokens)."""
    s = g.spec
    x = g.embed(ids, "model.embed_tokens.weight")
    for i in range(s.n_layers):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        q = g.head_rmsnorm(g.linear(x, a + "q_proj.weight"), a + "q_norm.weight", 1)
        k = g.head_rmsnorm(g.linear(x, a + "k_proj.weight"), a + "k_norm.weight", 1)
        v = g.linear(x, a + "v_proj.weight")
        if s.uses_rope(i):
            q, k = g.rope(q, s.n_heads), g.rope(k, s.n_kv_heads)
        g.kv_store(i, k, v)
        o = g.linear(g.attention(q, i), a + "o_proj.weight")
        x = g.add(x, g.rmsnorm(o, p + "post_attention_layernorm.weight"))
        gate, up, down = llama.dense_mlp(s, i)
        f = g.linear(g.swiglu(g.linear(x, gate), g.linear(x, up)), down)
        x = g.add(x, g.rmsnorm(f, p + "post_feedforward_layernorm.weight"))
    return x


def weight_shapes(s: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Every checkpoint tensor the forward pass reads, with the shape it must have."""
    w = {n: shape for n, shape in llama.weight_shapes(s).items() if not n.endswith(".input_layernorm.weight")}
    w.update({f"model.layers.{i}.post_feedforward_layernorm.weight": (s.hidden_size,) for i in range(s.n_layers)})
    return w
