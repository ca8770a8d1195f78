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
    qk_norm: bool = False         # per-head RMSNorm on q and k before RoPE (Qwen3)
    n_experts: int = 0            # MoE: experts per layer (0 = dense MLP)
    n_experts_per_tok: int = 0    # MoE: top-k experts per token (weights renormalized over the k, as Mixtral)
    # Sliding-window attention, per layer: 0 = full causal attention, W > 0 = a query at position p attends keys
    # p-W+1 .. p (transformers' `kv_idx > q_idx - sliding_window`). Empty = every layer full.
    layer_windows: tuple[int, ...] = ()
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    @property
    def lm_head_name(self) -> str:
        return "model.embed_tokens.weight" if self.tie_word_embeddings else "lm_head.weight"

    def window(self, layer: int) -> int:
        """Attention window of a layer (0: full causal attention)."""
        return self.layer_windows[layer] if self.layer_windows else 0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["eos_token_ids"] = list(self.eos_token_ids)
        d["layer_windows"] = list(self.layer_windows)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ModelSpec:
        d = dict(d)
        d["eos_token_ids"] = tuple(d.get("eos_token_ids", ()))
        d["layer_windows"] = tuple(d.get("layer_windows", ()))
        return cls(**d)
