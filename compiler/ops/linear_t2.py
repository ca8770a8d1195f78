"""The ternary linear kernels (BitNet b1.58, scheme t2): t2_kernel (integer dot products of 2-bit codes with int8
activations per token) and t2_lut_kernel (table lookups, T-MAC / bitnet.cpp TL1; the schedule: linear_quant.py)."""
from __future__ import annotations

from tvm.script import tirx as T

from ...quant.packing import NR
from ._util import F32, PARALLEL_MIN_ELEMS, STACK, VIEW_ALIGN, concat_vecs, prefetch
from .quant_common import (
    I32, PREMUL_UNPACK, U8, _Geo, _act_token, _drop_bias, _outer, _tail_copy, _tt, _u8, _use_mmla, dot4, flush16,
    i16_capacity, lookup16, lookup16_neon, madd16_avx2, mmla8, mmla_tokens, path_for, stream_locality, stream_prefetch,
)


def t2_kernel(cpu, T_: int, N: int, K: int, bias: bool, nscale: int = 1):
    path = path_for(cpu)
    g = _Geo("t2", T_, N, K)
    BPR, NCH, NBf, R = g.BPR, g.NCH, g.NBf, g.R
    mm = _use_mmla(cpu, path, T_)
    Tt = _tt(path, T_, 8, mm)
    # AVX2: vpmaddubsw results add up in int16 and are widened once per FL chunks. GEMV: one 16-bit shift per
    # vector serves two bit pairs, (v & 3, v & 12) and ((v >> 4) & 3, (v >> 4) & 12); the `& 12` operands are
    # 4 * code and go to their own accumulator (index 1), shifted back by 2 when widened (exact). The prefill GEMM
    # (2 tokens) keeps one accumulator per token and a shift per bit pair (two more accumulators would spill)
    i16 = path == "avx2"
    pair4 = i16 and Tt == 1
    NA16 = 2 if pair4 else 1
    FL = (i16_capacity(4 * 2 * g.off) // 2 if pair4 else i16_capacity(2 * g.off) // 4) if i16 else NCH
    NF = (NCH + FL - 1) // FL
    NA = 4 if Tt == 1 and not i16 else 1
    PF = stream_prefetch(cpu, T_)   # decode and verify stream the weights once: prefetch ahead of the loads
    PL = stream_locality(cpu, T_)
    NTB = (T_ + Tt - 1) // Tt
    rag_t = T_ % Tt != 0
    B_shape = (N,) if bias else (1,)
    act = _act_token(cpu, g, g.off)
    tail_copy = _tail_copy(g)
    par = (N * K >= PARALLEL_MIN_ELEMS) if T_ == 1 else (T_ * N * K >= 4 * PARALLEL_MIN_ELEMS)
    outer = _outer(par)

    def trow(tb, ti):
        return T.min(tb * Tt + ti, T_ - 1) if rag_t else tb * Tt + ti

    # GEMV on VNNI: one accumulator per bit pair j, so the codes need no shift: (v & (3 << 2j)) gives 4^j * code
    # and accumulator j is shifted back (exactly) at the end; the unpack is one and per operand
    premul = PREMUL_UNPACK and path == "vnni" and NA == 4 and K <= 65536   # 64 * 254 * K < 2^31

    def isum(iacc, ti, l):
        if NA == 1:
            return iacc[ti * 16 + l]
        if premul:
            return (iacc[l] + T.shift_right(iacc[16 + l], 2)) + (
                T.shift_right(iacc[32 + l], 4) + T.shift_right(iacc[48 + l], 6))
        return (iacc[l] + iacc[16 + l]) + (iacc[32 + l] + iacc[48 + l])

    def operand(v, j):
        if pair4:
            return (v >> T.Broadcast(T.Cast(U8, 4 * (j // 2)), 64)) & T.Broadcast(
                T.Cast(U8, T.shift_left(3, 2 * (j % 2))), 64)
        if premul:
            return v & T.Broadcast(T.Cast(U8, T.shift_left(3, 2 * j)), 64)
        return (v >> T.Broadcast(T.Cast(U8, 2 * j), 64)) & _u8(3)

    @T.macro
    def panel(Wsrc, wbase, wlen, Sc, Bs, O, xq, dx, cr, nb, full):
        iacc = T.alloc_buffer((Tt * NA * 16,), I32, scope="global", annotations=STACK)
        acc16 = T.alloc_buffer((Tt * NA16 * 32,), "int16", scope="global", annotations=STACK)
        for tb in range(NTB):
            for l in T.vectorized(Tt * NA * 16):
                iacc[l] = 0
            if i16:
                for f in range(NF):
                    for l in T.vectorized(Tt * NA16 * 32):
                        acc16[l] = T.int16(0)
                    for cc in range(T.min(FL, NCH - f * FL)):
                        if PF > 0:
                            prefetch(Wsrc, T.min(wbase + (f * FL + cc) * 64 + PF, wlen - 1), PL)
                        v: T.let[T.uint8x64] = Wsrc[T.Ramp(wbase + (f * FL + cc) * 64, 1, 64)]
                        for j in T.unroll(4):
                            u: T.let[T.uint8x64] = operand(v, j)
                            for ti in T.unroll(Tt):
                                acc16[T.Ramp((ti * NA16 + j % NA16) * 32, 1, 32)] = madd16_avx2(
                                    acc16[T.Ramp((ti * NA16 + j % NA16) * 32, 1, 32)], u, xq,
                                    trow(tb, ti) * K + (f * FL + cc) * 16 + 4 * j)
                    for ti in T.unroll(Tt):
                        if pair4:
                            iacc[T.Ramp(0, 1, 16)] = iacc[T.Ramp(0, 1, 16)] + (flush16(acc16[T.Ramp(0, 1, 32)]) + (
                                T.shift_right(flush16(acc16[T.Ramp(32, 1, 32)]), T.Broadcast(2, 16))))
                        else:
                            iacc[T.Ramp(ti * 16, 1, 16)] = iacc[T.Ramp(ti * 16, 1, 16)] + flush16(
                                acc16[T.Ramp(ti * 32, 1, 32)])
            for ch in range(0 if i16 else NCH):
                if PF > 0:
                    prefetch(Wsrc, T.min(wbase + ch * 64 + PF, wlen - 1), PL)
                v: T.let[T.uint8x64] = Wsrc[T.Ramp(wbase + ch * 64, 1, 64)]
                if mm:
                    for m in T.unroll(2):   # bit pairs 2m, 2m+1: k 16ch + 8m .. +7
                        ua: T.let[T.uint8x64] = operand(v, 2 * m)
                        ub: T.let[T.uint8x64] = operand(v, 2 * m + 1)
                        for tp in T.unroll(Tt // 2):
                            iacc[T.Ramp(tp * 32, 1, 32)] = mmla8(iacc[T.Ramp(tp * 32, 1, 32)], ua, ub, xq,
                                                                 trow(tb, 2 * tp) * K + ch * 16 + 8 * m,
                                                                 trow(tb, 2 * tp + 1) * K + ch * 16 + 8 * m)
                else:
                    for j in T.unroll(4):
                        u: T.let[T.uint8x64] = operand(v, j)
                        for ti in T.unroll(Tt):
                            iacc[T.Ramp((ti * NA + j % NA) * 16, 1, 16)] = dot4(
                                path, iacc[T.Ramp((ti * NA + j % NA) * 16, 1, 16)], u, xq,
                                trow(tb, ti) * K + ch * 16 + 4 * j)
            if mm:
                for tp in T.unroll(Tt // 2):
                    iacc[T.Ramp(tp * 32, 1, 32)] = mmla_tokens(iacc[T.Ramp(tp * 32, 1, 32)])
            for ti in T.unroll(Tt):
                if tb * Tt + ti < T_:
                    if full:
                        for l in T.vectorized(16):
                            if bias:
                                O[tb * Tt + ti, nb * NR + l] = T.Cast(F32, isum(iacc, ti, l) - cr[tb * Tt + ti]) * (
                                    dx[tb * Tt + ti] * Sc[0]) + Bs[nb * NR + l]
                            else:
                                O[tb * Tt + ti, nb * NR + l] = T.Cast(F32, isum(iacc, ti, l) - cr[tb * Tt + ti]) * (
                                    dx[tb * Tt + ti] * Sc[0])
                    else:
                        for l in range(R):
                            if bias:
                                O[tb * Tt + ti, nb * NR + l] = T.Cast(F32, isum(iacc, ti, l) - cr[tb * Tt + ti]) * (
                                    dx[tb * Tt + ti] * Sc[0]) + Bs[nb * NR + l]
                            else:
                                O[tb * Tt + ti, nb * NR + l] = T.Cast(F32, isum(iacc, ti, l) - cr[tb * Tt + ti]) * (
                                    dx[tb * Tt + ti] * Sc[0])

    WS_len = NCH * 64 if R else 1

    @T.prim_func
    def linear_t2(x: T.handle, w: T.handle, s: T.handle, b: T.handle, o: T.handle):
        T.func_attr({"tirx.noalias": True})
        X = T.match_buffer(x, (T_, K), F32)
        W = T.match_buffer(w, (N, BPR), U8)
        Sc = T.match_buffer(s, (nscale,), F32)
        Bs = T.match_buffer(b, B_shape, F32)
        O = T.match_buffer(o, (T_, N), F32, align=VIEW_ALIGN)
        Wf = T.decl_buffer((N * BPR,), U8, data=W.data)
        xq = T.alloc_buffer((T_ * K,), "int8", scope="global")
        dx = T.alloc_buffer((T_,), F32, scope="global")
        cr = T.alloc_buffer((T_,), I32, scope="global")
        act(X, xq, dx, cr)
        for nb in outer(NBf):
            panel(Wf, nb * NR * BPR, N * BPR, Sc, Bs, O, xq, dx, cr, nb, True)
        if R > 0:
            Ws = T.alloc_buffer((WS_len,), U8, scope="global")
            tail_copy(Wf, Ws)
            panel(Ws, 0, WS_len, Sc, Bs, O, xq, dx, cr, NBf, False)

    return _drop_bias(linear_t2, bias, 3)


# ------------------------------------------------------------------------------------------ t2 LUT kernel
LUT_FLUSH = 16   # chunks accumulated in int16 before widening (4 lanes * 16 chunks * 2 lookups * 254 < 2^15)


def t2_lut_kernel(cpu, T_: int, N: int, K: int, bias: bool, nscale: int = 1):
    path = path_for(cpu)
    lpath = "neon" if cpu.arch == "aarch64" else path
    g = _Geo("t2", T_, N, K)
    BPR, NCH, NBf, R = g.BPR, g.NCH, g.NBf, g.R
    Tt = _tt(path, T_, 4)
    NTB = (T_ + Tt - 1) // Tt
    rag_t = T_ % Tt != 0
    NF = (NCH + LUT_FLUSH - 1) // LUT_FLUSH
    B_shape = (N,) if bias else (1,)
    act = _act_token(cpu, g, 0)
    tail_copy = _tail_copy(g)
    par = (N * K >= PARALLEL_MIN_ELEMS) if T_ == 1 else (T_ * N * K >= 4 * PARALLEL_MIN_ELEMS)
    outer = _outer(par)
    outer_t = _outer(T_ * K * 16 >= PARALLEL_MIN_ELEMS * 16 and T_ > 1)
    TAB = NCH * 256                       # table bytes per token: per chunk, nibble h, lo/hi byte: 64 entries
    perm = [4 * (i % 16) + i // 16 for i in range(64)]           # [row][b] -> [b][row]
    unpack_lo = [x for q in range(4) for r in range(8) for x in (16 * q + r, 64 + 16 * q + r)]
    unpack_hi = [x for q in range(4) for r in range(8, 16) for x in (16 * q + r, 64 + 16 * q + r)]

    def trow(tb, ti):
        return T.min(tb * Tt + ti, T_ - 1) if rag_t else tb * Tt + ti

    def lookup(tab, base, idx):
        if lpath == "neon":
            return lookup16_neon(tab, base, idx)
        return lookup16(lpath, tab, base, idx)

    def table_entries(xq, off):
        """int16x64: lane 16q + i = (i%4 - 1) * xq[off+q] + (i//4 - 1) * xq[off+4+q]; 0 where a code is 3."""
        xa = concat_vecs([T.Broadcast(T.Cast("int16", xq[off + q]), 16) for q in range(4)], 16)
        xb = concat_vecs([T.Broadcast(T.Cast("int16", xq[off + 4 + q]), 16) for q in range(4)], 16)
        i = T.Ramp(0, 1, 64) % 16
        ca, cb = i % 4, i // 4
        val = T.Cast("int16x64", ca - 1) * xa + T.Cast("int16x64", cb - 1) * xb
        return T.Select(T.Or(ca == 3, cb == 3), T.Broadcast(T.int16(0), 64), val)

    def lane_sum(acc16, ti):
        lo = acc16[T.Ramp(ti * 64, 1, 32)]
        hi = acc16[T.Ramp(ti * 64 + 32, 1, 32)]
        parts = [T.Shuffle([lo, hi], [q * 8 + r for r in range(8)] + [32 + q * 8 + r for r in range(8)])
                 for q in range(4)]
        return T.Cast("int32x16", (parts[0] + parts[1]) + (parts[2] + parts[3]))

    @T.macro
    def build_tables(xq, tab):
        for t in outer_t(T_):
            for ch in range(NCH):
                for h in T.unroll(2):
                    e: T.let[T.int16x64] = table_entries(xq, t * K + ch * 16 + 8 * h)
                    tab[T.Ramp(t * TAB + ch * 256 + h * 128, 1, 64)] = T.Cast("uint8x64", e)
                    tab[T.Ramp(t * TAB + ch * 256 + h * 128 + 64, 1, 64)] = T.Cast(
                        "uint8x64", e >> T.Broadcast(T.int16(8), 64))

    @T.macro
    def panel(Wsrc, wbase, Sc, Bs, O, tab, dx, nb, full):
        acc16 = T.alloc_buffer((Tt * 64,), "int16", scope="global", annotations=STACK)
        acc32 = T.alloc_buffer((Tt * 16,), I32, scope="global", annotations=STACK)
        for tb in range(NTB):
            for l in T.vectorized(Tt * 16):
                acc32[l] = 0
            for f in range(NF):
                for l in T.vectorized(Tt * 64):
                    acc16[l] = T.int16(0)
                for cc in range(T.min(LUT_FLUSH, NCH - f * LUT_FLUSH)):
                    v: T.let[T.uint8x64] = Wsrc[T.Ramp(wbase + (f * LUT_FLUSH + cc) * 64, 1, 64)]
                    pv: T.let[T.uint8x64] = T.Shuffle([v], perm)
                    for h in T.unroll(2):
                        idx: T.let[T.uint8x64] = (pv >> T.Broadcast(T.Cast(U8, 4 * h), 64)) & _u8(15)
                        for ti in T.unroll(Tt):
                            lo: T.let[T.uint8x64] = lookup(
                                tab, trow(tb, ti) * TAB + (f * LUT_FLUSH + cc) * 256 + h * 128, idx)
                            hi: T.let[T.uint8x64] = lookup(
                                tab, trow(tb, ti) * TAB + (f * LUT_FLUSH + cc) * 256 + h * 128 + 64, idx)
                            acc16[T.Ramp(ti * 64, 1, 32)] = acc16[T.Ramp(ti * 64, 1, 32)] + T.reinterpret(
                                "int16x32", T.Shuffle([lo, hi], unpack_lo))
                            acc16[T.Ramp(ti * 64 + 32, 1, 32)] = acc16[T.Ramp(ti * 64 + 32, 1, 32)] + T.reinterpret(
                                "int16x32", T.Shuffle([lo, hi], unpack_hi))
                for ti in T.unroll(Tt):
                    acc32[T.Ramp(ti * 16, 1, 16)] = acc32[T.Ramp(ti * 16, 1, 16)] + lane_sum(acc16, ti)
            for ti in T.unroll(Tt):
                if tb * Tt + ti < T_:
                    if full:
                        for l in T.vectorized(16):
                            if bias:
                                O[tb * Tt + ti, nb * NR + l] = T.Cast(F32, acc32[ti * 16 + l]) * (
                                    dx[tb * Tt + ti] * Sc[0]) + Bs[nb * NR + l]
                            else:
                                O[tb * Tt + ti, nb * NR + l] = T.Cast(F32, acc32[ti * 16 + l]) * (dx[tb * Tt + ti] * Sc[0])
                    else:
                        for l in range(R):
                            if bias:
                                O[tb * Tt + ti, nb * NR + l] = T.Cast(F32, acc32[ti * 16 + l]) * (
                                    dx[tb * Tt + ti] * Sc[0]) + Bs[nb * NR + l]
                            else:
                                O[tb * Tt + ti, nb * NR + l] = T.Cast(F32, acc32[ti * 16 + l]) * (dx[tb * Tt + ti] * Sc[0])

    WS_len = NCH * 64 if R else 1

    @T.prim_func
    def linear_t2_lut(x: T.handle, w: T.handle, s: T.handle, b: T.handle, o: T.handle):
        T.func_attr({"tirx.noalias": True})
        X = T.match_buffer(x, (T_, K), F32)
        W = T.match_buffer(w, (N, BPR), U8)
        Sc = T.match_buffer(s, (nscale,), F32)
        Bs = T.match_buffer(b, B_shape, F32)
        O = T.match_buffer(o, (T_, N), F32, align=VIEW_ALIGN)
        Wf = T.decl_buffer((N * BPR,), U8, data=W.data)
        xq = T.alloc_buffer((T_ * K,), "int8", scope="global")
        dx = T.alloc_buffer((T_,), F32, scope="global")
        cr = T.alloc_buffer((T_,), I32, scope="global")
        tab = T.alloc_buffer((T_ * TAB,), U8, scope="global")
        act(X, xq, dx, cr)
        build_tables(xq, tab)
        for nb in outer(NBf):
            panel(Wf, nb * NR * BPR, Sc, Bs, O, tab, dx, nb, True)
        if R > 0:
            Ws = T.alloc_buffer((WS_len,), U8, scope="global")
            tail_copy(Wf, Ws)
            panel(Ws, 0, Sc, Bs, O, tab, dx, NBf, False)

    return _drop_bias(linear_t2_lut, bias, 3)


# ------------------------------------------------------------------------------------- plain (fallback)
