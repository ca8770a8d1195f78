"""ModelSpec: the architecture-independent description every backend reads (built from a HF config.json)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class ModelSpec:
    arch: str                     # HF architecture name, e.g. "LlamaForCausalLM"
    family: str                   # forward-pass family in models/ ("llama")
    vocab_size: int
    hidden_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_eps: float
    rope_theta: float
    max_position_embeddings: int
    rope_scaling: dict | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2)
    o_bias: bool = False          # the output projection too (Llama with attention_bias)
    mlp_bias: bool = False        # the dense MLP's gate/up/down projections carry biases (Llama with mlp_bias)
    qk_norm: bool = False         # per-head RMSNorm on q and k before RoPE (Qwen3)
    n_experts: int = 0            # MoE: experts per layer (0 = dense MLP)
    n_experts_per_tok: int = 0    # MoE: top-k experts per token
    norm_topk_prob: bool = True   # MoE: renormalize the top-k router probabilities to sum 1 (Mixtral, Qwen3-MoE)
    moe_intermediate_size: int = 0             # MoE: each expert's FFN width (0: intermediate_size)
    shared_expert_intermediate_size: int = 0   # Qwen2-MoE: an always-on expert of this width, sigmoid-gated (0: none)
    dense_layers: tuple[int, ...] = ()         # MoE models: layers with a dense MLP (intermediate_size) instead
    qk_norm_full: bool = False    # q/k RMSNorm over all heads at once (OLMoE), not per head (Qwen3)
    # Sliding-window attention, per layer: 0 = full causal attention, W > 0 = a query at position p attends keys
    # p-W+1 .. p (transformers' `kv_idx > q_idx - sliding_window`). Empty = every layer full.
    layer_windows: tuple[int, ...] = ()
    rope_local_theta: float = 0.0  # RoPE base of the sliding-window layers (Gemma 3); 0: every layer uses rope_theta
    embed_scale: float = 1.0       # embedding rows are multiplied by this (Gemma: sqrt(hidden_size))
    q_scale: float = 1.0           # extra factor on q before attention's 1/sqrt(head_dim), folded into weights at load
    rotary_dim: int = 0            # dims of each head RoPE rotates (Phi-3/4's partial_rotary_factor); 0: all of them
    nope_layers: tuple[int, ...] = ()   # layers that apply no RoPE at all (SmolLM3's NoPE layers)
    residual_scale: float = 1.0    # each block's output times this before its residual add (Granite), folded at load
    logit_scale: float = 1.0       # logits times this (Granite: 1 / logits_scaling), folded into the final norm
    fused_qkv: bool = False        # the checkpoint stores q/k/v as one qkv_proj (Phi-3), split as it is read
    fused_gate_up: bool = False    # ... and gate/up as one gate_up_proj
    attn_softcap: float = 0.0      # attention scores soft-capped to c * tanh(s / c) (Gemma 2); 0: none
    final_softcap: float = 0.0     # logits soft-capped the same way (Gemma 2); 0: none
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    @property
    def native_quant(self) -> str | None:
        """The scheme the checkpoint's weights already are and must be compiled with (BitNet: ternary, t2)."""
        return "t2" if self.family == "bitnet" else None

    @property
    def lm_head_name(self) -> str:
        return "model.embed_tokens.weight" if self.tie_word_embeddings else "lm_head.weight"

    @property
    def expert_size(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size

    def is_moe_layer(self, layer: int) -> bool:
        return self.n_experts > 0 and layer not in self.dense_layers

    def window(self, layer: int) -> int:
        """Attention window of a layer (0: full causal attention)."""
        return self.layer_windows[layer] if self.layer_windows else 0

    def uses_rope(self, layer: int) -> bool:
        return layer not in self.nope_layers

    def rope_table(self, layer: int) -> str:
        """The RoPE table a layer rotates q/k with (models/rope.py): "rope", or "rope_local" for the sliding-window
        layers of a model with a separate local base."""
        return "rope_local" if self.rope_local_theta and self.window(layer) else "rope"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["eos_token_ids"] = list(self.eos_token_ids)
        d["layer_windows"] = list(self.layer_windows)
        d["dense_layers"] = list(self.dense_layers)
        d["nope_layers"] = list(self.nope_layers)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ModelSpec:
        d = dict(d)
        d["eos_token_ids"] = tuple(d.get("eos_token_ids", ()))
        d["layer_windows"] = tuple(d.get("layer_windows", ()))
        d["dense_layers"] = tuple(d.get("dense_layers", ()))
        d["nope_layers"] = tuple(d.get("nope_layers", ()))
        return cls(**d)
