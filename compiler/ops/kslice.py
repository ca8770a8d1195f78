"""The K-sliced layout of a float weight matrix: W[N, K] stored as K/KS slices one after another, each slice the
[N, KS] block of every row's columns s*KS .. (s+1)*KS-1 (the array keeps its [N, K] shape; only the byte order
changes).

Why: the f16/f32 decode GEMV reads its f32 activation row once per weight row. When that row outgrows what L1 keeps
next to the weight stream (22 KiB at K = 5632, a 32 KiB L1), it is re-read from L2 for every weight row and the
stream slows (1B f16 down projection on a Zen 4: 16-18 GB/s against 22-25 for the same bytes at K = 2048). Reading
each row in slices of the K axis keeps one activation slice (<= 11 KiB) in L1, but in the row-major layout a slice
of every row is a strided read that the hardware prefetchers double (8-9 GB/s measured); stored sliced, each slice
of a block of rows is one contiguous stream again (20-22 GB/s). linear.gemv then walks slice by slice over a block
of rows, keeping each row's accumulators in a scratch row between slices, so every output is the same FMA chain over
k as the unsliced kernel's: bitwise the same values. The prefill GEMMs and the naive kernel read the same layout
through flat_index."""
from __future__ import annotations

import numpy as np

SLICE_ALIGN = 64   # slices are whole steps of the GEMV (AVX-512: 4 accumulators x 16 lanes), so no slice has a tail


def slice_width(K: int, max_elems: int) -> int:
    """The widest KS <= max_elems that divides K into equal slices of whole SLICE_ALIGN steps; 0 (no slicing) when
    K already fits or no such width exists."""
    if max_elems <= 0 or K <= max_elems or K % SLICE_ALIGN:
        return 0
    return next((K // ns for ns in range(2, K // SLICE_ALIGN + 1)
                 if K % ns == 0 and (K // ns) % SLICE_ALIGN == 0 and K // ns <= max_elems), 0)


def check(K: int, KS: int) -> None:
    if KS and (KS % SLICE_ALIGN or K % KS or KS >= K):
        raise ValueError(f"linear: KS={KS} must be a multiple of {SLICE_ALIGN} that divides K={K} into 2 or more slices")


def to_sliced(w: np.ndarray, KS: int) -> np.ndarray:
    """w [N, K] in row-major order -> the same shape holding the sliced byte order."""
    if not KS:
        return w
    N, K = w.shape
    return np.ascontiguousarray(np.asarray(w).reshape(N, K // KS, KS).transpose(1, 0, 2)).reshape(N, K)


def from_sliced(w: np.ndarray, KS: int) -> np.ndarray:
    """The inverse of to_sliced."""
    if not KS:
        return w
    N, K = w.shape
    return np.ascontiguousarray(np.asarray(w).reshape(K // KS, N, KS).transpose(1, 0, 2)).reshape(N, K)


def flat_index(n, kv, lane, N: int, KS: int, VL: int):
    """Flat element index of W[n, kv*VL + lane] in the sliced layout (KS a multiple of VL): written with the slice
    and the step inside it apart, so that a vector of lanes stays one contiguous ramp for the vectorizer."""
    per = KS // VL
    return (kv // per) * (N * KS) + n * KS + (kv % per) * VL + lane
