"""The quantized K/V caches (`--kv-cache q8|q4`, compiler/kv_layout.py): kv_q8 / kv_q4 write rows into them, QRows
reads them (attention.py). quant/kv_cache.py is the same in numpy.

A row holds every KV head's codes, then the scales: a head's codes stay one contiguous run the attention kernel widens
lane by lane, and the scales are read through a float view of the same bytes.
- q8: D int8 codes per head, one float32 scale per head: x = code * scale, scale = max|x| / 127 over the head's D
  values (0 for an all-zero head), code = floor(x * 127 / max|x| + 0.5) clamped to +-127.
- q4: blocks of B = the largest power of two <= 32 dividing D; per block B/2 bytes (byte i: element i in the low
  nibble, element i + B/2 in the high one, as llama.cpp's q4_1) and two float16, its step d and its least value m
  (plan version 8; version 7 had a symmetric block, one scale): x = nibble * d + m, m = f16(min x),
  d = f16((max x - m) / 15), nibble = floor((x - m) / d + 0.5) clamped to 0..15 (0 where d is 0). A block's own
  minimum: a key head's values sit off zero (their mean over tokens is large against their spread), which a
  symmetric block pays a level for (SmolLM2, q4 keys: +5.1% perplexity symmetric, +2.5% with the minimum).
  The x a q4 row holds are
  the head's values rotated: y = H x per block of N = the largest power of two <= 256 dividing D, H the normalized
  Sylvester-Hadamard matrix (entry (i, j) = (-1)^popcount(i & j) / sqrt(N)), by the fast transform's log2 N stages
  of butterflies (a + b, a - b; pairs h = 1, 2, 4 ... apart), then times 1/sqrt(N). Keys carry
  outlier channels (a few of D with values many times the others', RoPE spreading them over pairs): unrotated, a
  block's scale follows its outlier and the others get a level or two (SmolLM2: +11% perplexity); rotated, every
  element holds a share of each channel. H is orthogonal and symmetric: attention rotates the query the same way
  (H q . H k = q . k) and its output back (H sum p H v = sum p v), at D * log2 N additions per head and row.
"""
from __future__ import annotations

import math

from tvm.script import tirx as T

from ._util import F32, STACK, VIEW_ALIGN, pow2_divisor

F16 = "float16"
F16_MAX = 65504.0


# kind -> whether its scale covers a head's whole row (q8: one float32 per head) rather than a block of it (q4)
PER_HEAD_SCALE = {"q8": True, "q4": False}
# kind -> whether its rows hold each head Hadamard-rotated (the module's docstring says why)
ROTATED = {"q8": False, "q4": True}


def rotation_block(D: int) -> int:
    return pow2_divisor(D, 256)


def hadamard_in_place(D: int):
    """A macro: buf[off : off + D] through the unnormalized Sylvester-Hadamard transform per block of N =
    rotation_block(D), in place (the fast transform: stage s adds and subtracts the pairs 2^s apart within blocks of
    2^(s+1); quant/kv_cache.py's hadamard does the same operations in the same order)."""
    N = rotation_block(D)
    stages = N.bit_length() - 1

    @T.macro
    def fwht(buf, off):
        for s in T.unroll(stages):
            for p in range(D // 2):
                lo: T.let = p // T.shift_left(1, s) * T.shift_left(2, s) + p % T.shift_left(1, s)
                a: T.let = buf[off + lo]
                b: T.let = buf[off + lo + T.shift_left(1, s)]
                buf[off + lo] = a + b
                buf[off + lo + T.shift_left(1, s)] = a - b
    return fwht


def q4_block(D: int) -> int:
    return pow2_divisor(D, 32)


def row_bytes(kind: str, H: int, D: int) -> int:
    """Bytes of one cache row of H heads of D (kv_layout.kv_row_bytes; the runtime's el_kv_row_bytes)."""
    if PER_HEAD_SCALE[kind]:
        return H * D + 4 * H
    return H * D // 2 + 4 * H * (D // q4_block(D))   # nibbles, then (d, m) float16 per block


def check_head_dim(kind: str, D: int) -> None:
    if D % 4:
        raise ValueError(f"--kv-cache {kind}: head_dim {D} is not a multiple of 4 (its scales follow the codes)")


class QRows:
    """A quantized cache as the attention kernel reads it: codes q int8[S, row bytes], scales s (the same bytes as
    float32 for q8, float16 for q4: each block's d, then its m)."""

    def __init__(self, kind: str, q, s, H: int, D: int):
        self.kind, self.q, self.s, self.H, self.D = kind, q, s, H, D
        self.per_head = PER_HEAD_SCALE[kind]   # q8: codes times one scale per head (code / scale below)

    def code(self, j, kh, d):
        """q8: element d of head kh of row j's code as float32 (times scale(j, kh): the element)."""
        return T.Cast(F32, self.q[j, kh * self.D + d])

    def scale(self, j, kh):
        """q8: the scale of head kh of row j."""
        return self.s[j * (row_bytes("q8", self.H, self.D) // 4) + self.H * self.D // 4 + kh]

    def load(self, j, kh, d):
        """Element d of head kh of row j as float32."""
        H, D, q, s = self.H, self.D, self.q, self.s
        if self.per_head:
            return self.code(j, kh, d) * self.scale(j, kh)
        B = q4_block(D)
        half, blk, w = B // 2, d // B, d % B
        code = T.shift_right(T.Cast("int32", q[j, kh * (D // 2) + blk * half + w % half]), (w // half) * 4) & 15
        at = j * (row_bytes("q4", H, D) // 2) + H * D // 4 + 2 * (kh * (D // B) + blk)
        return T.Cast(F32, code) * T.Cast(F32, s[at]) + T.Cast(F32, s[at + 1])


def scale_view(kind: str, codes, S, H: int, D: int):
    """The scales' buffer over the codes' bytes (declared inside the prim_func, after its match_buffers)."""
    rb = row_bytes(kind, H, D)
    if PER_HEAD_SCALE[kind]:
        return T.decl_buffer((S * (rb // 4),), F32, data=codes.data, align=VIEW_ALIGN)
    return T.decl_buffer((S * (rb // 2),), F16, data=codes.data, align=VIEW_ALIGN)


def q8_rows(cpu, R: int, H: int, D: int):
    """kv_q8: x f32[R, H*D] -> out int8[R, H*D + 4H] (cache rows, at a per-position offset: element-aligned)."""
    check_head_dim("q8", D)
    RB = row_bytes("q8", H, D)
    VL = pow2_divisor(D, cpu.vector_lanes)

    @T.prim_func
    def kv_q8(a: T.handle, o: T.handle):
        T.func_attr({"tirx.noalias": True})
        A = T.match_buffer(a, (R, H * D), F32)
        O = T.match_buffer(o, (R, RB), "int8", align=VIEW_ALIGN)
        Os = T.decl_buffer((R * RB // 4,), F32, data=O.data, align=VIEW_ALIGN)
        for r in range(R):
            for h in range(H):
                m = T.alloc_buffer((VL,), F32, scope="global", annotations=STACK)
                for l in T.vectorized(VL):
                    m[l] = T.float32(0)
                for dc in range(D // VL):
                    for l in T.vectorized(VL):
                        m[l] = T.max(m[l], T.abs(A[r, h * D + dc * VL + l]))
                for l in range(1, VL):
                    m[0] = T.max(m[0], m[l])
                inv: T.let = T.if_then_else(m[0] > T.float32(0), T.float32(127) / m[0], T.float32(0))
                for dc in range(D // VL):
                    for l in T.vectorized(VL):
                        O[r, h * D + dc * VL + l] = T.Cast("int8", T.max(T.min(
                            T.floor(A[r, h * D + dc * VL + l] * inv + T.float32(0.5)), T.float32(127)), T.float32(-127)))
                Os[r * (RB // 4) + H * D // 4 + h] = m[0] / T.float32(127)
    return kv_q8


def q4_rows(cpu, R: int, H: int, D: int, mean: bool = False):
    """kv_q4: x f32[R, H*D] -> out int8[R, row_bytes("q4")] (cache rows, at a per-position offset). mean: x less
    mu f32[H*D] (an extra argument before out), the layer's calibrated key mean (quant/key_mean.py)."""
    check_head_dim("q4", D)
    RB, B = row_bytes("q4", H, D), q4_block(D)
    half, NB = B // 2, D // B
    rotated, norm = ROTATED["q4"], 1.0 / math.sqrt(rotation_block(D))
    fwht = hadamard_in_place(D)

    def code(x, lo, inv):
        """The block's nibble of x (0..15), as int32."""
        return T.Cast("int32", T.max(T.min(T.floor((x - lo) * inv + T.float32(0.5)), T.float32(15)), T.float32(0)))

    @T.macro
    def write(A, Mu, O):
        Os = T.decl_buffer((R * RB // 2,), F16, data=O.data, align=VIEW_ALIGN)
        y = T.alloc_buffer((D,), F32, scope="global", annotations=STACK)   # the head as the row holds it
        for r in range(R):
            for h in range(H):
                for d in range(D):
                    y[d] = A[r, h * D + d]
                if mean:   # a Python bool: the parser keeps the taken branch
                    for d in range(D):
                        y[d] = y[d] - Mu[0, h * D + d]
                if rotated:
                    fwht(y, 0)
                    for d in range(D):
                        y[d] = y[d] * T.float32(norm)
                for b in range(NB):
                    m = T.alloc_buffer((2,), F32, scope="global", annotations=STACK)   # min, max
                    m[0] = y[b * B]
                    m[1] = y[b * B]
                    for i in range(1, B):
                        m[0] = T.min(m[0], y[b * B + i])
                        m[1] = T.max(m[1], y[b * B + i])
                    # m and d as float16 hold them (a minimum past float16's range clamped to it), the codes
                    # computed against those
                    lo: T.let = T.Cast(F32, T.Cast(F16, T.max(T.min(m[0], T.float32(F16_MAX)), T.float32(-F16_MAX))))
                    step: T.let = T.Cast(F32, T.Cast(F16, (m[1] - lo) / T.float32(15)))
                    inv: T.let = T.if_then_else(step > T.float32(0), T.float32(1) / step, T.float32(0))
                    for i in T.vectorized(half):
                        O[r, h * (D // 2) + b * half + i] = T.Cast("int8", code(y[b * B + i], lo, inv) | T.shift_left(
                            code(y[b * B + half + i], lo, inv), 4))
                    Os[r * (RB // 2) + H * D // 4 + 2 * (h * NB + b)] = T.Cast(F16, step)
                    Os[r * (RB // 2) + H * D // 4 + 2 * (h * NB + b) + 1] = T.Cast(F16, lo)

    @T.prim_func
    def kv_q4(a: T.handle, o: T.handle):
        T.func_attr({"tirx.noalias": True})
        A = T.match_buffer(a, (R, H * D), F32)
        O = T.match_buffer(o, (R, RB), "int8", align=VIEW_ALIGN)
        write(A, A, O)

    @T.prim_func
    def kv_q4_mean(a: T.handle, mu: T.handle, o: T.handle):
        T.func_attr({"tirx.noalias": True})
        A = T.match_buffer(a, (R, H * D), F32)
        Mu = T.match_buffer(mu, (1, H * D), F32)
        O = T.match_buffer(o, (R, RB), "int8", align=VIEW_ALIGN)
        write(A, Mu, O)

    if mean:
        return kv_q4_mean
    return kv_q4


ROW_WRITERS = {"q8": q8_rows, "q4": q4_rows}   # --kv-cache kind -> its kv_<kind> kernel
