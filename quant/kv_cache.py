"""The quantized K/V caches in numpy (compiler/ops/kv_quant.py is the kernel and says the formats): the oracle's K/V
rows go through them, and the tests build cache rows with them."""
from __future__ import annotations

import numpy as np

F16_MAX = np.float32(65504)


def q4_block(D: int) -> int:
    b = 1
    while b < 32 and D % (2 * b) == 0:
        b *= 2
    return b


def rotation_block(D: int) -> int:
    n = 1
    while n < 256 and D % (2 * n) == 0:
        n *= 2
    return n


def hadamard(x: np.ndarray) -> np.ndarray:
    """x f32[..., D] rotated per block of N (rotation_block) by the normalized Sylvester-Hadamard matrix, with the
    kernel's operations in its order (the fast transform's stages of a + b, a - b, then times 1/sqrt(N)): bitwise
    the kernel's rows. Its own inverse."""
    x = np.asarray(x, np.float32)
    D = x.shape[-1]
    N = rotation_block(D)
    y = x.reshape(-1, D).copy()
    h = 1
    while h < N:
        v = y.reshape(y.shape[0], D // (2 * h), 2, h)
        a, b = v[:, :, 0, :].copy(), v[:, :, 1, :].copy()
        v[:, :, 0, :], v[:, :, 1, :] = a + b, a - b
        h *= 2
    return (y * np.float32(1.0 / np.sqrt(N))).reshape(x.shape)


def q8_codes(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x f32[..., D] -> (codes int8[..., D], scales f32[...]) per row of D (one head of one position)."""
    x = np.asarray(x, np.float32)
    amax = np.abs(x).max(-1)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.clip(np.floor(x * inv[..., None] + np.float32(0.5)), -127, 127).astype(np.int8)
    return q, (amax / np.float32(127)).astype(np.float32)


def q4_codes(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x f32[..., D] -> (nibbles uint8[..., D] in 0..15, steps f16[..., D / B], minima f16[..., D / B]) per block of
    B, with the kernel's operations in its order."""
    x = np.asarray(x, np.float32)
    D = x.shape[-1]
    B = q4_block(D)
    xb = x.reshape(*x.shape[:-1], D // B, B)
    lo = np.clip(xb.min(-1), -F16_MAX, F16_MAX).astype(np.float16).astype(np.float32)
    step = ((xb.max(-1) - lo) / np.float32(15)).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(step > 0, np.float32(1) / step, np.float32(0)).astype(np.float32)
    q = np.clip(np.floor((xb - lo[..., None]) * inv[..., None] + np.float32(0.5)), 0, 15).astype(np.uint8)
    return q.reshape(x.shape), step.astype(np.float16), lo.astype(np.float16)


def q8_round(x: np.ndarray) -> np.ndarray:
    """x f32[..., D] as the q8 cache gives it back: code * scale."""
    q, s = q8_codes(x)
    return q.astype(np.float32) * s[..., None]


def q4_round(x: np.ndarray) -> np.ndarray:
    """x f32[..., D] as the q4 cache gives it back: code * its block's (f16) scale, of the rotated head, rotated
    back (what attention's sums amount to)."""
    q, d, m = q4_codes(hadamard(x))
    B = q4_block(x.shape[-1])
    qb = q.reshape(*q.shape[:-1], -1, B).astype(np.float32)
    y = (qb * d.astype(np.float32)[..., None] + m.astype(np.float32)[..., None]).reshape(q.shape)
    return hadamard(y)


def cache_rows(kind: str, x: np.ndarray) -> np.ndarray:
    """x f32[S, H, D] -> the cache's rows int8[S, row bytes], as the kv_<kind> kernel writes them."""
    S, H, D = x.shape
    if kind == "q8":
        q, s = q8_codes(x)
        return np.concatenate([q.reshape(S, -1), s.view(np.int8).reshape(S, -1)], axis=1)
    q, d, m = q4_codes(hadamard(x))
    B = q4_block(D)
    n = q.reshape(S, H, D // B, 2, B // 2).astype(np.int32)
    packed = (n[..., 0, :] | (n[..., 1, :] << 4)).astype(np.uint8).view(np.int8)
    dm = np.stack([d, m], -1)   # per block: its step, then its minimum
    return np.concatenate([packed.reshape(S, -1), dm.view(np.int8).reshape(S, -1)], axis=1)


KV_ROUND = {"f32": lambda x: np.asarray(x, np.float32), "f16": lambda x: np.asarray(x, np.float16).astype(np.float32),
            "q8": q8_round, "q4": q4_round}
