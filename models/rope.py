"""Rotary position embedding tables (default, linear, dynamic, YaRN, LongRoPE and llama3 frequency scaling, over all
of each head or its first rotary_dim dims), computed once in float64. Dynamic NTK scaling changes the frequencies
only past max_position_embeddings, which no package reaches (--max-context is at most that), so its tables are the
default ones. YaRN and LongRoPE also scale cos and sin by their attention factor, as transformers does.

A model may rotate with more than one table (Gemma 3: a local base on its sliding-window layers); each is named
(ModelSpec.rope_table) and stored as "<table>.cos" / "<table>.sin" weights of [rows, head_dim/2]."""
from __future__ import annotations

import math

import numpy as np

from ..runtime.contract import ROPE_TABLES, rope_table_of as table_of  # noqa: F401 (re-exported)
from .spec import ModelSpec


TABLES = ROPE_TABLES


def inv_freq(spec: ModelSpec, table: str = "rope", n_ctx: int | None = None) -> np.ndarray:
    """head_dim/2 frequencies: those of the rotated dims, then zeros for the dims a partial rotary leaves alone
    (models/folds.py permutes each head so that these pair up). n_ctx: the sequence length LongRoPE picks its
    short or long factors by (None: short, unless the spec's scaling fixed the choice at compile time)."""
    f = _rotated_inv_freq(spec, table, n_ctx)
    return np.concatenate([f, np.zeros(spec.head_dim // 2 - len(f))])


def _rotated_inv_freq(spec: ModelSpec, table: str, n_ctx: int | None) -> np.ndarray:
    d = spec.rotary_dim or spec.head_dim
    if table == "rope_local":   # the sliding-window layers' own base, never scaled (transformers' Gemma 3)
        return 1.0 / (spec.rope_local_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    f = 1.0 / (spec.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    rs = spec.rope_scaling
    if rs and rs.get("rope_type") == "longrope":
        return f / np.asarray(rs["long_factor"] if longrope_is_long(spec, n_ctx) else rs["short_factor"], np.float64)
    if rs and rs.get("rope_type", rs.get("type")) == "linear":
        f = f / float(rs["factor"])
    if rs and rs.get("rope_type", rs.get("type")) == "yarn":
        f = _yarn_inv_freq(spec, rs)
    if rs and rs.get("rope_type", rs.get("type")) == "llama3":
        factor = float(rs["factor"])
        lo, hi = float(rs.get("low_freq_factor", 1.0)), float(rs.get("high_freq_factor", 4.0))
        old = float(rs.get("original_max_position_embeddings", 8192))
        wavelen = 2 * math.pi / f
        scaled = np.where(wavelen > old / lo, f / factor, f)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
        f = np.where(medium, smoothed, scaled)
    return f


def longrope_is_long(spec: ModelSpec, n_ctx: int | None) -> bool:
    """Whether LongRoPE rotates with its long factors: fixed in the spec when a package was compiled (its context
    is past original_max_position_embeddings, as llama.cpp decides by n_ctx), else by n_ctx as transformers
    decides per forward pass (the longest sequence so far past the original context)."""
    rs = spec.rope_scaling
    if "long" in rs:
        return bool(rs["long"])
    return n_ctx is not None and n_ctx > rs["original_max_position_embeddings"]


def resolve_longrope(spec: ModelSpec, n_ctx: int) -> ModelSpec:
    """The spec with LongRoPE's short/long choice fixed for a package of context n_ctx (other specs unchanged)."""
    import dataclasses

    rs = spec.rope_scaling
    if not rs or rs.get("rope_type") != "longrope":
        return spec
    return dataclasses.replace(spec, rope_scaling={**rs, "long": n_ctx > rs["original_max_position_embeddings"]})


def _yarn_factor(spec: ModelSpec, rs: dict) -> float:
    old = rs.get("original_max_position_embeddings", spec.max_position_embeddings)
    return float(rs["factor"]) if rs.get("factor") is not None else spec.max_position_embeddings / old


def _yarn_inv_freq(spec: ModelSpec, rs: dict) -> np.ndarray:
    """Frequencies below the ramp interpolated (divided by the factor), above it kept, blended linearly across the
    dimensions whose wavelengths fall between beta_fast and beta_slow rotations over the original context."""
    d, base = spec.rotary_dim or spec.head_dim, spec.rope_theta
    factor = _yarn_factor(spec, rs)
    old = rs.get("original_max_position_embeddings", spec.max_position_embeddings)
    fast, slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return d * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(base))

    lo, hi = correction_dim(fast), correction_dim(slow)
    if rs.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, d - 1)
    if lo == hi:
        hi += 0.001
    ramp = np.clip((np.arange(d // 2, dtype=np.float64) - lo) / (hi - lo), 0, 1)
    pos = base ** (np.arange(0, d, 2, dtype=np.float64) / d)
    keep = 1 - ramp   # 1: the original frequency (extrapolation), 0: divided by the factor (interpolation)
    return (1 / (factor * pos)) * (1 - keep) + (1 / pos) * keep


def attention_factor(spec: ModelSpec, table: str = "rope") -> float:
    """What cos and sin are multiplied by (YaRN's attention factor; 1 for every other scaling)."""
    rs = spec.rope_scaling
    if table == "rope_local" or not rs or rs.get("rope_type", rs.get("type")) not in ("yarn", "longrope"):
        return 1.0
    if rs.get("attention_factor") is not None:
        return float(rs["attention_factor"])
    if rs["rope_type"] == "longrope":   # sqrt(1 + ln(factor) / ln(original context)), as transformers sets it
        old = rs["original_max_position_embeddings"]
        factor = float(rs["factor"]) if rs.get("factor") is not None else spec.max_position_embeddings / old
        return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(old))
    factor = _yarn_factor(spec, rs)

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if rs.get("mscale") and rs.get("mscale_all_dim"):
        return mscale(factor, rs["mscale"]) / mscale(factor, rs["mscale_all_dim"])
    return mscale(factor)


def cos_sin(spec: ModelSpec, positions: np.ndarray, table: str = "rope",
            n_ctx: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin of shape [len(positions), head_dim/2] in float64 (times YaRN's or LongRoPE's attention factor);
    n_ctx: see inv_freq (default: the last position + 1, transformers' rule for one forward pass)."""
    positions = np.asarray(positions)
    if n_ctx is None and positions.size:
        n_ctx = int(positions.max()) + 1
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq(spec, table, n_ctx)[None, :]
    a = np.ones(spec.head_dim // 2)
    a[:(spec.rotary_dim or spec.head_dim) // 2] = attention_factor(spec, table)   # not on the unrotated dims
    return np.cos(ang) * a, np.sin(ang) * a


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [T, H, D] with HF's rotate_half pairing (i, i + D/2)."""
    h = x.shape[-1] // 2
    c, s = cos[:, None, :], sin[:, None, :]
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
