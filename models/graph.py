"""The Graph builder API that model definitions are written against, once, for every backend.

A backend implements these ops; values are backend-specific (numpy arrays for the reference backend, traced
nodes for the compiler). Activations are 2-D [T, features]: T tokens of one sequence (batch is 1 on a device).
Weights are referenced by checkpoint name, never passed as arrays: the backend decides where bytes live."""
from __future__ import annotations

from typing import Any, Protocol

from .spec import ModelSpec

Value = Any


class Graph(Protocol):
    spec: ModelSpec

    def embed(self, ids: Value, w: str) -> Value: ...                         # rows of w, times spec.embed_scale
    def rmsnorm(self, x: Value, w: str) -> Value: ...
    def head_rmsnorm(self, x: Value, w: str, n_heads: int) -> Value: ...      # RMSNorm over each head's D values
    def linear(self, x: Value, w: str, b: str | None = None) -> Value: ...    # x @ W.T (+ b); W is [out, in]
    def rope(self, x: Value, n_heads: int, table: str = "rope") -> Value: ...  # positions pos .. pos+T-1 (models/rope.py)
    def kv_store(self, layer: int, k: Value, v: Value) -> None: ...           # rows pos .. pos+T-1 of the KV cache
    def attention(self, q: Value, layer: int) -> Value: ...                   # causal over the cache prefix (its
    #   window spec.window(layer); scores soft-capped to c * tanh(s / c) with c = spec.attn_softcap when > 0)
    def add(self, a: Value, b: Value) -> Value: ...
    def swiglu(self, gate: Value, up: Value) -> Value: ...                    # silu(gate) * up
    def gelu_mul(self, gate: Value, up: Value) -> Value: ...                  # gelu_tanh(gate) * up (GeGLU)
    def softcap(self, x: Value, cap: float) -> Value: ...                     # cap * tanh(x / cap) (Gemma 2's logits)
    # Mixture of experts, two ops so that a backend decides where expert weights live and which it reads:
    # route: softmax(x @ router.T) over the experts, the top_k of them (ties: the lower index), their
    #   probabilities renormalized to sum 1 when `normalize`; a routing value only `experts` reads.
    # experts: per token, sum over its routed experts e of weight_e * down_e(silu(gate_e x) * up_e x), each expert a
    #   SwiGLU MLP given as (gate, up, down) names, indexed by expert id.
    def route(self, x: Value, router: str, top_k: int, normalize: bool) -> Value: ...
    def experts(self, x: Value, routing: Value, experts: list[tuple[str, str, str]]) -> Value: ...
    def sigmoid_gate(self, x: Value, w: str, y: Value) -> Value: ...          # sigmoid(x @ w.T) * y, w [1, in]
    # A hint, no value: the top_k experts of MoE layer `layer` that route(rmsnorm(x, norm), router) selects, x being
    # an earlier point of the residual stream. Only backends with `expert_lookahead` > 0 are asked (models/llama.py
    # calls it at the start of layer L for layer L + expert_lookahead - 1); they read those experts ahead.
    def predict_experts(self, x: Value, norm: str, router: str, top_k: int, experts: list, layer: int) -> None: ...
    # BitNet b1.58: ternary weights `<w>.weight` (packed) with `<w>.weight_scale`, int8 per-token activations
    def bitlinear(self, x: Value, w: str) -> Value: ...
    def relu2_mul(self, gate: Value, up: Value) -> Value: ...                 # relu(gate)^2 * up
