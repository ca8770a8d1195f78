"""Rows of each layer's KV cache: a sliding-window layer (Gemma 2/3, Mistral, Qwen sliding layers) keeps only what its
window can still see (a window cache, runtime/contract.h); the others keep kv_rows (max context + one chunk).

A window cache of W has ctx + room rows, room = kv_rows - max_ctx (a run's chunk): the runtime moves its W - 1 newest
rows to its start whenever a run would pass row ctx, so ctx >= 2W - 2 keeps the two ranges apart; ctx = 2W rounded up
to 64 rows makes a move (W - 1 rows) once per ~W tokens: about one row copied per token, per window layer.
"""
from __future__ import annotations


def window_cache_rows(window: int, max_ctx: int, kv_rows: int) -> int | None:
    """Rows of a window cache for a layer of that window, or None where one saves nothing (a window at least as long
    as the context)."""
    ctx = -(-2 * window // 64) * 64   # >= max(W, 2W - 2): the rows kept never overlap the rows they come from
    return ctx + (kv_rows - max_ctx) if 0 < window and ctx < max_ctx else None


def kv_layers(spec, max_ctx: int, kv_rows: int, window_caches: bool = True) -> list[tuple[int, int]]:
    """(rows, window) per layer, as plan.bin's KV table holds them. window is the attention kernel's (0 where the
    window is at least kv_rows, which never cuts); window_caches False: every layer kv_rows rows (NPU packages, whose
    graphs take whole caches; --swa-full)."""
    out = []
    for layer in range(spec.n_layers):
        w = spec.window(layer)
        w = w if w < kv_rows else 0
        rows = window_cache_rows(w, max_ctx, kv_rows) if window_caches else None
        out.append((rows or kv_rows, w))
    return out


# --kv-cache: the attention kernel's kv param, plan kv_dtype_bits. q8 / q4: each row holds every KV head's codes,
# then the scales (compiler/ops/kv_quant.py says the formats; runtime/contract.h)
KV_CACHE_TYPES = {"f32": ("float32", 32), "f16": ("float16", 16), "q8": ("q8", 8), "q4": ("q4", 4)}
QUANTIZED_KV = frozenset(kv for kv, bits in KV_CACHE_TYPES.values() if bits <= 8)   # written by a kv_<kind> kernel
# cache type -> whether a K cache of it holds keys less their calibrated mean (quant/key_mean.py; kv_q4's `mean`):
# 4-bit blocks pay for keys' offset, 8-bit ones do not (q8 keys: +0.03% perplexity on SmolLM2)
KEY_MEAN = {"q8": False, "q4": True}


def parse_kv_cache(text: str) -> tuple[str, str]:
    """--kv-cache KIND (keys and values) or K,V (keys K, values V, as llama.cpp's -ctk / -ctv) -> (K, V) names.
    Keys and values are both float (f32 / f16) or both quantized (q8 / q4): the attention kernel reads the two
    caches through one kind of view. ValueError (one line) otherwise."""
    parts = [p.strip() for p in str(text).split(",")]
    if len(parts) > 2 or any(p not in KV_CACHE_TYPES for p in parts):
        raise ValueError(f"--kv-cache {text!r}: give one of {', '.join(KV_CACHE_TYPES)}, or keys,values "
                         "(for example q8,q4)")
    k, v = parts if len(parts) == 2 else parts * 2
    if (KV_CACHE_TYPES[k][1] <= 8) != (KV_CACHE_TYPES[v][1] <= 8):
        raise ValueError(f"--kv-cache {text}: keys and values must be both float (f32, f16) or both quantized "
                         "(q8, q4)")
    return k, v


def kv_cache_name(k: str, v: str) -> str:
    """The manifest's kv_cache: "q8" where keys and values share a type, else "q8,q4"."""
    return k if k == v else f"{k},{v}"


def kv_bits(text: str) -> tuple[int, int]:
    """(K bits, V bits) of a manifest's or the command line's kv_cache."""
    k, v = parse_kv_cache(text)
    return KV_CACHE_TYPES[k][1], KV_CACHE_TYPES[v][1]


def kv_dtype_bits_field(k_bits: int, v_bits: int) -> int:
    """plan.bin's kv_dtype_bits: K's bits, and V's in bits 8-15 where they differ (0 there: V as K, so packages from
    before split caches read unchanged; runtime/contract.h)."""
    return k_bits if k_bits == v_bits else k_bits | v_bits << 8


def kv_row_bytes(n_kv_heads: int, head_dim: int, bits: int = 32) -> int:
    """Bytes of one K (or V) cache row; the runtime's el_kv_row_bytes."""
    if bits in (8, 4):
        from .ops.kv_quant import row_bytes

        return row_bytes(f"q{bits}", n_kv_heads, head_dim)
    return n_kv_heads * head_dim * bits // 8


def kv_cache_bytes(spec, layers: list[tuple[int, int]], bits: int | tuple[int, int] = 32) -> int:
    """Bytes of one context's K and V caches (each layer's rounded to 64 bytes, as the runtime maps them); bits: one
    type's for both, or (K bits, V bits)."""
    kb, vb = bits if isinstance(bits, tuple) else (bits, bits)
    rk, rv = (kv_row_bytes(spec.n_kv_heads, spec.head_dim, b) for b in (kb, vb))
    return sum(-(-rows * rk // 64) * 64 + -(-rows * rv // 64) * 64 for rows, _ in layers)
