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


def kv_row_bytes(n_kv_heads: int, head_dim: int, bits: int = 32) -> int:
    """Bytes of one K (or V) cache row; the runtime's el_kv_row_bytes."""
    if bits in (8, 4):
        from .ops.kv_quant import row_bytes

        return row_bytes(f"q{bits}", n_kv_heads, head_dim)
    return n_kv_heads * head_dim * bits // 8


def kv_cache_bytes(spec, layers: list[tuple[int, int]], bits: int = 32) -> int:
    """Bytes of one context's K and V caches (each layer's rounded to 64 bytes, as the runtime maps them)."""
    row = kv_row_bytes(spec.n_kv_heads, spec.head_dim, bits)
    return sum(2 * (-(-rows * row // 64) * 64) for rows, _ in layers)
