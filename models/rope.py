"""Rotary position embedding tables (default, linear and llama3 frequency scaling), computed once in float64.

A model may rotate with more than one table (Gemma 3: a local base on its sliding-window layers); each is named
(ModelSpec.rope_table) and stored as "<table>.cos" / "<table>.sin" weights of [rows, head_dim/2]."""
from __future__ import annotations

import math

import numpy as np

from ..runtime.contract import ROPE_TABLES, rope_table_of as table_of  # noqa: F401 (re-exported)
from .spec import ModelSpec


TABLES = ROPE_TABLES


def inv_freq(spec: ModelSpec, table: str = "rope") -> np.ndarray:
    d = spec.head_dim
    if table == "rope_local":   # the sliding-window layers' own base, never scaled (transformers' Gemma 3)
        return 1.0 / (spec.rope_local_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    f = 1.0 / (spec.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    rs = spec.rope_scaling
    if rs and rs.get("rope_type", rs.get("type")) == "linear":
        f = f / float(rs["factor"])
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


def cos_sin(spec: ModelSpec, positions: np.ndarray, table: str = "rope") -> tuple[np.ndarray, np.ndarray]:
    """cos, sin of shape [len(positions), head_dim/2] in float64."""
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq(spec, table)[None, :]
    return np.cos(ang), np.sin(ang)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [T, H, D] with HF's rotate_half pairing (i, i + D/2)."""
    h = x.shape[-1] // 2
    c, s = cos[:, None, :], sin[:, None, :]
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
