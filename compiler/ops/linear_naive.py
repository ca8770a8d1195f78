"""Straightforward TIR of every quantized linear (naive) and the packed-code and scale readers the OpenCL kernels
share: the reference the fast kernels are tested against, and the fallback when a fast path is off."""
from __future__ import annotations

from tvm.script import tirx as T

from ...quant.packing import EPS_BLOCK, EPS_TOKEN, NR, Q6_CHUNKS, Q6_GROUP, Q6_LAYOUT, QA
from ._util import F32, STACK, VIEW_ALIGN
from .segments import offsets
from .quant_common import (
    I32, U8, _Geo, _drop_bias,
)


def packed_code(g: _Geo, q6: bool, Wf, n, k):
    """The signed integer code of weight (n, k) in a packed layout (quant/packing.py: NR-row panels of 4-byte chunks;
    q6: per 32-k block, 4 low-nibble chunks then 2 chunks of high bit pairs), read from the flat bytes Wf."""
    bits, kpc, off, BPR, NBf, R = g.bits, g.kpc, g.off, g.BPR, g.NBf, g.R
    nb = n // NR
    rp = T.if_then_else(nb < NBf, NR, R) if R else NR
    if q6:   # block k // 32: low nibble in chunk kk // 8, high bit pair in chunk 4 + kk // 16
        base = nb * NR * BPR + 4 * (n % NR) + k % 4 + (k // QA) * Q6_CHUNKS * 4 * rp
        kk = k % QA
        lo = (Wf[base + (kk // 8) * 4 * rp] >> T.Cast(U8, 4 * ((kk % 8) // 4))) & T.uint8(15)
        hi = (Wf[base + (4 + kk // 16) * 4 * rp] >> T.Cast(U8, 2 * ((kk % 16) // 4))) & T.uint8(3)
        return T.Cast(I32, lo) + T.Cast(I32, hi) * 16 - off
    w = k % kpc
    byte = Wf[nb * NR * BPR + (k // kpc) * 4 * rp + 4 * (n % NR) + w % 4]
    return T.Cast(I32, (byte >> T.Cast(U8, bits * (w // 4))) & T.uint8((1 << bits) - 1)) - off


def layout_geo(traits, T_: int, N: int, K: int, G: int | None = None) -> _Geo:
    """The packed geometry of an op's layout (traits: its KernelTraits); q6: q4's panels with 6 bits a weight,
    code = q + 32 (read by packed_code's q6 branch)."""
    if traits.layout == Q6_LAYOUT:
        g = _Geo("q4", T_, N, K, Q6_GROUP)
        g.BPR, g.off = K * 6 // 8, 32
        return g
    return _Geo(traits.layout, T_, N, K, traits.group_of(G))


def weight_scale(scale: str, g: _Geo, segs, Sf, n, group, to_f32):
    """The f32 scale of row n (scale "row": q8), of row n's matrix ("matrix": t2) or of row n's group `group`
    ("group": q4 / q6, panel-interleaved f16 scales, converted by to_f32) in the flat scales Sf."""
    if scale == "row":
        return Sf[n]
    if scale == "matrix":   # the segment of row n: the number of segment starts <= n
        return Sf[sum([T.Cast(I32, n >= o) for o in offsets(segs)[1:-1]], T.int32(0))] if segs else Sf[0]
    nb = n // NR
    rp = T.if_then_else(nb < g.NBf, NR, g.R) if g.R else NR
    return to_f32(Sf[nb * NR * g.KG + group * rp + n % NR])


def naive(traits, T_: int, N: int, K: int, G: int | None, bias: bool, segs=()):
    """Serial scalar loops over the same packed layout and the same activation quantization: always valid,
    slow. traits: the op's KernelTraits (linear_t2_lut falls back to this t2 version: same math)."""
    q6 = traits.layout == Q6_LAYOUT
    g = layout_geo(traits, T_, N, K, G)
    BPR, KG = g.BPR, g.KG
    per_token = traits.act == "token"
    QB = K if per_token else QA              # activation block
    NQB = K // QB
    GB = g.G if traits.scale == "group" else K   # weight scale block
    NS = max(1, len(segs))                   # "matrix": one scale per segment (matrix)
    S_shape, S_dt, S_len = {"row": ((N,), F32, N), "group": ((N, KG), "float16", N * KG),
                            "matrix": ((NS,), F32, NS)}[traits.scale]
    B_shape = (N,) if bias else (1,)
    eps = EPS_TOKEN if per_token else EPS_BLOCK

    def code(Wf, n, k):
        return packed_code(g, q6, Wf, n, k)

    def wscale(Sf, n, kb):
        return weight_scale(traits.scale, g, segs, Sf, n, kb * QB // GB, lambda v: T.Cast(F32, v))

    minimum = traits.minimum   # w = s * code + m per group: the block adds m * sum(xq)

    @T.macro
    def body(X, Wf, Sf, Mf, Bs, O):
        xq = T.alloc_buffer((T_ * K,), I32, scope="global")
        dx = T.alloc_buffer((T_ * NQB,), F32, scope="global")
        st = T.alloc_buffer((2,), F32, scope="global", annotations=STACK)
        ist = T.alloc_buffer((2,), I32, scope="global", annotations=STACK)
        for t in range(T_):
            for qb in range(NQB):
                st[0] = T.float32(eps)
                for k in range(QB):
                    st[0] = T.max(st[0], T.abs(X[t, qb * QB + k]))
                dx[t * NQB + qb] = st[0] / T.float32(127)
                st[1] = T.float32(127) / st[0]
                for k in range(QB):
                    xq[t * K + qb * QB + k] = T.Cast(I32, T.nearbyint(X[t, qb * QB + k] * st[1]))
        for t in range(T_):
            for n in range(N):
                st[0] = T.float32(0)
                for qb in range(NQB):
                    ist[0] = 0
                    ist[1] = 0
                    for k in range(QB):
                        ist[0] = ist[0] + code(Wf, n, qb * QB + k) * xq[t * K + qb * QB + k]
                        if minimum:
                            ist[1] = ist[1] + xq[t * K + qb * QB + k]
                    if minimum:
                        st[0] = st[0] + (T.Cast(F32, ist[0]) * wscale(Sf, n, qb)
                                         + T.Cast(F32, ist[1]) * wscale(Mf, n, qb)) * dx[t * NQB + qb]
                    else:
                        st[0] = st[0] + T.Cast(F32, ist[0]) * (wscale(Sf, n, qb) * dx[t * NQB + qb])
                if bias:
                    O[t, n] = st[0] + Bs[n]
                else:
                    O[t, n] = st[0]

    @T.prim_func
    def plain(x: T.handle, w: T.handle, s: T.handle, b: T.handle, o: T.handle):
        T.func_attr({"tirx.noalias": True})
        X = T.match_buffer(x, (T_, K), F32)
        W = T.match_buffer(w, (N, BPR), U8)
        S = T.match_buffer(s, S_shape, S_dt)
        Bs = T.match_buffer(b, B_shape, F32)
        O = T.match_buffer(o, (T_, N), F32, align=VIEW_ALIGN)
        Wf = T.decl_buffer((N * BPR,), U8, data=W.data)
        Sf = T.decl_buffer((S_len,), S_dt, data=S.data)
        body(X, Wf, Sf, Sf, Bs, O)

    @T.prim_func
    def plain_min(x: T.handle, w: T.handle, s: T.handle, m: T.handle, b: T.handle, o: T.handle):
        T.func_attr({"tirx.noalias": True})
        X = T.match_buffer(x, (T_, K), F32)
        W = T.match_buffer(w, (N, BPR), U8)
        S = T.match_buffer(s, S_shape, S_dt)
        M = T.match_buffer(m, S_shape, S_dt)
        Bs = T.match_buffer(b, B_shape, F32)
        O = T.match_buffer(o, (T_, N), F32, align=VIEW_ALIGN)
        Wf = T.decl_buffer((N * BPR,), U8, data=W.data)
        Sf = T.decl_buffer((S_len,), S_dt, data=S.data)
        body(X, Wf, Sf, T.decl_buffer((S_len,), S_dt, data=M.data), Bs, O)

    if minimum:
        return _drop_bias(plain_min, bias, 4)
    return _drop_bias(plain, bias, 3)
