"""The block-quantized linear kernels: q8 and q4gG (block_kernel), q6 (q6_kernel): int8 activations per block of
32 k, integer dot products per block, f32 sums of block results (the schedule: linear_quant.py)."""
from __future__ import annotations

from tvm.script import tirx as T

from ...quant.packing import NR, Q6_CHUNKS, Q6_GROUP, QA
from ._util import F32, PARALLEL_MIN_ELEMS, STACK, VIEW_ALIGN, prefetch
from .quant_common import (
    I32, PREMUL_UNPACK, U8, _Geo, _act_blocks, _drop_bias, _outer, _tail_copy, _tt, _u8, _use_mmla, dot4,
    dot4_sdot, dot4_signed_avx2, dot4_signed_half_avx2, dot8_pair_half_avx2, flush16, i16_capacity, madd16_avx2,
    madd16_half_avx2, mmla8, mmla_tokens, offset_start, path_for, stream_locality, stream_prefetch, token_tiles, widen16,
)
from .rows import ROWS_TIER


# AVX2 GEMM tiles as two 8-row halves (make_panel: panel_split); False builds the 16-row tiles (tests compare the two)
SPLIT_HALVES = True


def block_kernel(cpu, traits, T_: int, N: int, K: int, G: int | None, bias: bool, tiered: bool = False):
    """The chunk layouts with one scale per row (linear_q8; G None) or per group of G (linear_q4), and a minimum per
    group after the scales (traits.minimum: linear_q4m, w = s * code + m: the block adds m * dx * sum(xq)); traits:
    the op's KernelTraits (quant/scheme.py); tiered: a row-limited variant's token tiles (quant_common.token_tiles)."""
    path = path_for(cpu)
    g = _Geo(traits.layout, T_, N, K, G)
    group = traits.scale == "group"
    # 8-bit codes (0..255) are no valid signed operand: AVX2 / SDOT multiply |x| by sign-moved weights instead
    signed_w = g.bits == 8 and path in ("avx2", "sdot")
    minimum = traits.minimum
    # cr: the block's sum of xq times this, which removes the code offset (or, with a minimum, is sum(xq) itself)
    corr_mul = 1 if minimum else (0 if signed_w else g.off)
    BPR, NCH, SUB, NBf, R, KB, KG = g.BPR, g.NCH, g.SUB, g.NBf, g.R, g.KB, g.KG
    CPB = QA // g.kpc                       # chunks per activation block
    BPG = (G // QA) if group else 1         # activation blocks per scale group
    mm = _use_mmla(cpu, path, T_)
    NPAIR = CPB * SUB // 2                  # SMMLA: 8-k operand pairs per block
    # AVX2 q4: the block's 8 vpmaddubsw results per token add up in int16 (8 * 2 * 15 * 127 < 2^15) and are widened
    # once per block; q8's signed products (<= 2 * 127^2) fill an int16 lane alone
    i16 = path == "avx2" and not signed_w and CPB * g.SUB <= i16_capacity((1 << g.bits) - 1)
    # AVX2 token tile, measured on Zen 3 (kernels alone, interleaved): q4 and q8 with group scales run 1.1-1.35x
    # faster in tiles of 8 tokens than of 2 (LLVM spills some of the 16 accumulators, but each unpacked operand serves
    # 8 tokens); q8 with row scales gains only up to 4 tokens. In SmolLM2's verify program: passes of 4 / 6 / 8
    # tokens 1.76 / 2.44 / 3.19 -> 1.67 / 2.27 / 2.84 decode steps, a 96-token prefill 191 -> 177 ms
    avx2_tt = 8 if (i16 or group) else (4 if T_ <= 8 else 2)
    PF = stream_prefetch(cpu, T_)   # decode and verify stream the weights once: prefetch ahead of the loads
    PL = stream_locality(cpu, T_)
    S_shape, S_dt = ((N, KG), "float16") if group else ((N,), F32)
    B_shape = (N,) if bias else (1,)
    # the offset correction (codes stored + offset) taken out of the int sums from the start: the activation pass
    # stores it negated and each token's accumulator starts there, a broadcast load instead of a vector subtract per
    # token and block in the epilogue (the same integers: the same bits)
    pre_offset = not minimum and corr_mul != 0 and not mm and not i16
    act = _act_blocks(cpu, g, -corr_mul if pre_offset else corr_mul, scaled_sum=minimum)
    tail_copy = _tail_copy(g)
    par = (N * K >= PARALLEL_MIN_ELEMS) if T_ == 1 else (T_ * N * K >= 4 * PARALLEL_MIN_ELEMS)
    outer = _outer(par)
    bits = g.bits

    def make_panel(Tt, rows):
        """The panel macro for token tiles of Tt tokens (register block: Tt int32 + Tt f32 accumulators) over the first
        `rows` rows (the tier's most real rows; T_ outside row-limited variants)."""
        NA = 2 if Tt == 1 and not i16 else 1    # independent int accumulators per token (latency of the dot chain)
        NTB = (rows + Tt - 1) // Tt
        rag_t = NTB * Tt > T_

        def trow(tb, ti):
            return T.min(tb * Tt + ti, T_ - 1) if rag_t else tb * Tt + ti

        start_sums = offset_start(Tt, NA, KB, trow)

        # GEMV on VNNI: each nibble has its own accumulator, so the high nibble needs no shift: (v & 0xF0) gives
        # 16 * code and the accumulator is shifted back (exactly) once per block; saves a shift per operand
        premul = PREMUL_UNPACK and path == "vnni" and NA == SUB and SUB > 1

        def operand(v, h):
            if signed_w:
                return v ^ _u8(128)   # signed code q as int8 bits
            if SUB == 1:
                return v
            if premul:
                return v & T.Broadcast(T.Cast(U8, ((1 << bits) - 1) << (h * bits)), 64)
            return (v >> T.Broadcast(T.Cast(U8, h * bits), 64)) & _u8((1 << bits) - 1)

        # q4's int16 sums: every tile (2-token tiles too: 1.5-2.5x); q8's int32 sums with sign moves: only where the
        # 16-row tile spills (Tt > 4; q8 with row scales stays at 4 tokens and lost 10% split)
        split = SPLIT_HALVES and path == "avx2" and Tt > 1 and (i16 or (signed_w and Tt > 4))

        def operand32(v, h):
            if signed_w:
                return v ^ T.Broadcast(T.uint8(128), 32)   # signed code q as int8 bits
            if SUB == 1:
                return v
            return (v >> T.Broadcast(T.Cast(U8, h * bits), 32)) & T.Broadcast(T.Cast(U8, (1 << bits) - 1), 32)

        def xoff(tb, ti, kb, c, h):
            """Where the 4 activations of operand (chunk c, sub h) of block kb start, for tile row ti."""
            return trow(tb, ti) * K + kb * QA + c * g.kpc + h * 4

        def block_isum(iacc, ti, l):
            if NA == 1:
                return iacc[ti * 16 + l]
            hi = iacc[(ti * NA + 1) * 16 + l]
            return iacc[ti * NA * 16 + l] + (T.shift_right(hi, bits) if premul else hi)

        def dot(acc, w, xq, off):
            if signed_w and path == "sdot":
                return dot4_sdot(acc, T.reinterpret("int8x64", w), xq, off)
            if signed_w:
                return dot4_signed_avx2(acc, T.reinterpret("int8x64", w), xq, off)
            return dot4(path, acc, w, xq, off)

        def scale_vec(Ssrc, sbase, kb, l):
            if group:
                return T.Cast(F32, Ssrc[sbase + (kb // BPG) * NR + l])
            return T.float32(1)

        def block_result(iacc, ti, l, Ssrc, Msrc, sbase, kb, c, d):
            """The f32 sum of a block: (isum - offset * sum xq) * s * dx; isum * s * dx where the int sums started at
            -offset * sum xq (pre_offset) or the codes have a minimum (m * sum xq * dx is added after it)."""
            if minimum or pre_offset:
                return T.Cast(F32, block_isum(iacc, ti, l)) * (scale_vec(Ssrc, sbase, kb, l) * d)
            return T.Cast(F32, block_isum(iacc, ti, l) - c) * (scale_vec(Ssrc, sbase, kb, l) * d)

        @T.macro
        def panel(Wsrc, wbase, wlen, Ssrc, Msrc, sbase, X, Sr, Bs, O, xq, dx, cr, nb, full):
            facc = T.alloc_buffer((Tt * 16,), F32, scope="global", annotations=STACK)
            iacc = T.alloc_buffer((Tt * NA * 16,), I32, scope="global", annotations=STACK)
            acc16 = T.alloc_buffer((Tt * 32,), "int16", scope="global", annotations=STACK)
            for tb in range(NTB):
                for l in T.vectorized(Tt * 16):
                    facc[l] = T.float32(0)
                for kb in range(KB):
                    if pre_offset:
                        start_sums(iacc, cr, tb, kb)
                    else:
                        for l in T.vectorized(Tt * NA * 16):
                            iacc[l] = 0
                    if mm:
                        for m in T.unroll(NPAIR):   # operands 2m, 2m+1 (chunk c = i // SUB, sub h = i % SUB): k 8m..8m+7
                            ua: T.let[T.uint8x64] = operand(Wsrc[T.Ramp(wbase + (kb * CPB + (2 * m) // SUB) * 64, 1, 64)],
                                                            (2 * m) % SUB)
                            ub: T.let[T.uint8x64] = operand(Wsrc[T.Ramp(wbase + (kb * CPB + (2 * m + 1) // SUB) * 64, 1, 64)],
                                                            (2 * m + 1) % SUB)
                            for tp in T.unroll(Tt // 2):
                                iacc[T.Ramp(tp * 32, 1, 32)] = mmla8(iacc[T.Ramp(tp * 32, 1, 32)], ua, ub, xq,
                                                                     trow(tb, 2 * tp) * K + kb * QA + 8 * m,
                                                                     trow(tb, 2 * tp + 1) * K + kb * QA + 8 * m)
                        for tp in T.unroll(Tt // 2):
                            iacc[T.Ramp(tp * 32, 1, 32)] = mmla_tokens(iacc[T.Ramp(tp * 32, 1, 32)])
                    else:
                        if i16:
                            for l in T.vectorized(Tt * 32):
                                acc16[l] = T.int16(0)
                        for c in T.unroll(CPB):
                            if PF > 0:
                                prefetch(Wsrc, T.min(wbase + (kb * CPB + c) * 64 + PF, wlen - 1), PL)
                            v: T.let[T.uint8x64] = Wsrc[T.Ramp(wbase + (kb * CPB + c) * 64, 1, 64)]
                            for h in T.unroll(SUB):
                                u: T.let[T.uint8x64] = operand(v, h)
                                for ti in T.unroll(Tt):
                                    if i16:
                                        acc16[T.Ramp(ti * 32, 1, 32)] = madd16_avx2(
                                            acc16[T.Ramp(ti * 32, 1, 32)], u, xq,
                                            xoff(tb, ti, kb, c, h))
                                    else:
                                        iacc[T.Ramp((ti * NA + (c * SUB + h) % NA) * 16, 1, 16)] = dot(
                                            iacc[T.Ramp((ti * NA + (c * SUB + h) % NA) * 16, 1, 16)], u, xq,
                                            xoff(tb, ti, kb, c, h))
                        if i16:
                            for ti in T.unroll(Tt):
                                iacc[T.Ramp(ti * 16, 1, 16)] = flush16(acc16[T.Ramp(ti * 32, 1, 32)])
                    for ti in T.unroll(Tt):
                        for l in T.vectorized(16):
                            facc[ti * 16 + l] = facc[ti * 16 + l] + block_result(
                                iacc, ti, l, Ssrc, Msrc, sbase, kb, cr[trow(tb, ti) * KB + kb], dx[trow(tb, ti) * KB + kb])
                        if minimum:   # + m * (sum xq * dx): two FMAs a token, the scaled sum broadcast from memory
                            for l in T.vectorized(16):
                                facc[ti * 16 + l] = facc[ti * 16 + l] + T.Cast(
                                    F32, Msrc[sbase + (kb // BPG) * NR + l]) * cr[trow(tb, ti) * KB + kb]
                for ti in T.unroll(Tt):
                    if full:
                        if tb * Tt + ti < T_:
                            for l in T.vectorized(16):
                                if group:
                                    if bias:
                                        O[tb * Tt + ti, nb * NR + l] = facc[ti * 16 + l] + Bs[nb * NR + l]
                                    else:
                                        O[tb * Tt + ti, nb * NR + l] = facc[ti * 16 + l]
                                else:
                                    if bias:
                                        O[tb * Tt + ti, nb * NR + l] = facc[ti * 16 + l] * Sr[nb * NR + l] + Bs[nb * NR + l]
                                    else:
                                        O[tb * Tt + ti, nb * NR + l] = facc[ti * 16 + l] * Sr[nb * NR + l]
                    else:
                        if tb * Tt + ti < T_:
                            for l in range(R):
                                if group:
                                    if bias:
                                        O[tb * Tt + ti, nb * NR + l] = facc[ti * 16 + l] + Bs[nb * NR + l]
                                    else:
                                        O[tb * Tt + ti, nb * NR + l] = facc[ti * 16 + l]
                                else:
                                    if bias:
                                        O[tb * Tt + ti, nb * NR + l] = facc[ti * 16 + l] * Sr[nb * NR + l] + Bs[nb * NR + l]
                                    else:
                                        O[tb * Tt + ti, nb * NR + l] = facc[ti * 16 + l] * Sr[nb * NR + l]

        def half_result(isum, Ssrc, sbase, kb, lane, c, d):
            """block_result's f32 expression for one lane (row) of a half, from its int32 sum."""
            if minimum:
                return T.Cast(F32, isum) * (scale_vec(Ssrc, sbase, kb, lane) * d)
            return T.Cast(F32, isum - c) * (scale_vec(Ssrc, sbase, kb, lane) * d)

        def out_value(f, Sr, Bs, n):
            v = f if group else f * Sr[n]
            return v + Bs[n] if bias else v

        # AVX2 GEMM tiles: the panel's 16 rows as two 8-row halves, each a pass over all blocks. A 16-row q4 tile
        # of Tt tokens needs 2 * Tt int16 accumulators + 2 operands, which spill at Tt = 8 (16 ymm registers); a half
        # needs Tt + 1 and a broadcast, and re-reads its 32-byte halves of the panel's chunks from L1/L2 (q8: int32
        # sums, 1 instead of 2 per token). The same integer sums and the same f32 epilogue per output, so the same
        # bits as the 16-row tile and the GEMV. Measured on Zen 3, one core: q4 tiles of 2-64 tokens 1.1-2.5x
        # (8 tokens of SmolLM2's gate/up 63 -> 85 GMAC/s, of the 1B's down 75 -> 91), q8g32 tiles of 5-8 1.1-1.5x
        @T.macro
        def panel_split(Wsrc, wbase, wlen, Ssrc, Msrc, sbase, X, Sr, Bs, O, xq, dx, cr, nb, full):
            facc = T.alloc_buffer((Tt * 8,), F32, scope="global", annotations=STACK)
            acc16 = T.alloc_buffer((Tt * 16,), "int16", scope="global", annotations=STACK)
            isum8 = T.alloc_buffer((Tt * 8,), I32, scope="global", annotations=STACK)
            for tb in range(NTB):
                for hf in range(2):
                    for ti in T.unroll(Tt):   # per token: a 6-token tile's 96-lane vectors legalize into lane extracts
                        for l in T.vectorized(8):
                            facc[ti * 8 + l] = T.float32(0)
                    for kb in range(KB):
                        for ti in T.unroll(Tt):
                            if i16:
                                for l in T.vectorized(16):
                                    acc16[ti * 16 + l] = T.int16(0)
                            else:
                                for l in T.vectorized(8):
                                    isum8[ti * 8 + l] = 0
                        for c in range(CPB):   # a loop: unrolled, LLVM hoists the broadcasts of every chunk and spills
                            if PF > 0:
                                if hf == 0:
                                    prefetch(Wsrc, T.min(wbase + (kb * CPB + c) * 64 + PF, wlen - 1), PL)
                            v: T.let[T.uint8x32] = Wsrc[T.Ramp(wbase + (kb * CPB + c) * 64 + hf * 32, 1, 32)]
                            for h in T.unroll(SUB):
                                u: T.let[T.uint8x32] = operand32(v, h)
                                for ti in T.unroll(Tt):
                                    if i16:
                                        acc16[T.Ramp(ti * 16, 1, 16)] = madd16_half_avx2(
                                            acc16[T.Ramp(ti * 16, 1, 16)], u, xq,
                                            xoff(tb, ti, kb, c, h))
                                    else:
                                        isum8[T.Ramp(ti * 8, 1, 8)] = dot4_signed_half_avx2(
                                            isum8[T.Ramp(ti * 8, 1, 8)], T.reinterpret("int8x32", u), xq,
                                            xoff(tb, ti, kb, c, h))
                        for ti in T.unroll(Tt):
                            if i16:
                                isum8[T.Ramp(ti * 8, 1, 8)] = widen16(acc16[T.Ramp(ti * 16, 1, 16)])
                            for l in T.vectorized(8):
                                facc[ti * 8 + l] = facc[ti * 8 + l] + half_result(
                                    isum8[ti * 8 + l], Ssrc, sbase, kb, hf * 8 + l, cr[trow(tb, ti) * KB + kb],
                                    dx[trow(tb, ti) * KB + kb])
                            if minimum:
                                for l in T.vectorized(8):
                                    facc[ti * 8 + l] = facc[ti * 8 + l] + T.Cast(
                                        F32, Msrc[sbase + (kb // BPG) * NR + hf * 8 + l]) * cr[trow(tb, ti) * KB + kb]
                    for ti in T.unroll(Tt):
                        if tb * Tt + ti < T_:
                            if full:
                                for l in T.vectorized(8):
                                    O[tb * Tt + ti, nb * NR + hf * 8 + l] = out_value(
                                        facc[ti * 8 + l], Sr, Bs, nb * NR + hf * 8 + l)
                            else:
                                for l in range(8):
                                    if hf * 8 + l < R:
                                        O[tb * Tt + ti, nb * NR + hf * 8 + l] = out_value(
                                            facc[ti * 8 + l], Sr, Bs, nb * NR + hf * 8 + l)

        if split:
            return panel_split
        return panel

    tiles = token_tiles(path, T_, 8, mm, avx2_tt=avx2_tt, tiered=tiered)
    P = [make_panel(tt, min(hi, T_)) for _, hi, tt in tiles]
    P0, P1, P2, P3 = (P * 4)[:4]
    ann = [{ROWS_TIER: [lo, hi]} for lo, hi, _ in tiles] + [{}] * 4

    @T.macro
    def panels(Wsrc, wbase, wlen, Ssrc, Msrc, sbase, X, Sr, Bs, O, xq, dx, cr, nb, full):
        """One panel, in the token tile its rows' count calls for (row-limited variants; rows.py: ROWS_TIER)."""
        if len(tiles) == 1:
            P0(Wsrc, wbase, wlen, Ssrc, Msrc, sbase, X, Sr, Bs, O, xq, dx, cr, nb, full)
        else:
            for _tier0 in T.serial(1, annotations=ann[0]):
                P0(Wsrc, wbase, wlen, Ssrc, Msrc, sbase, X, Sr, Bs, O, xq, dx, cr, nb, full)
            for _tier1 in T.serial(1, annotations=ann[1]):
                P1(Wsrc, wbase, wlen, Ssrc, Msrc, sbase, X, Sr, Bs, O, xq, dx, cr, nb, full)
            if len(tiles) > 2:
                for _tier2 in T.serial(1, annotations=ann[2]):
                    P2(Wsrc, wbase, wlen, Ssrc, Msrc, sbase, X, Sr, Bs, O, xq, dx, cr, nb, full)
            if len(tiles) > 3:
                for _tier3 in T.serial(1, annotations=ann[3]):
                    P3(Wsrc, wbase, wlen, Ssrc, Msrc, sbase, X, Sr, Bs, O, xq, dx, cr, nb, full)

    @T.macro
    def tail_scales(Sf, Ss):
        for kg in range(KG):
            for l in range(16):
                Ss[kg * 16 + l] = T.if_then_else(l < R, Sf[NBf * NR * KG + kg * R + T.min(l, R - 1)], T.float16(0))

    SS_len = KG * 16 if (group and R) else 1
    WS_len = NCH * 64 if R else 1

    MS_len = SS_len if minimum else 1

    @T.macro
    def body(X, Wf, Sf, Mf, Bs, O):
        xq = T.alloc_buffer((T_ * K,), "int8", scope="global")
        dx = T.alloc_buffer((T_ * KB,), F32, scope="global")
        cr = T.alloc_buffer((T_ * KB,), F32 if minimum else I32, scope="global")
        act(X, xq, dx, cr)
        for nb in outer(NBf):
            panels(Wf, nb * NR * BPR, N * BPR, Sf, Mf, nb * NR * KG, X, Sf, Bs, O, xq, dx, cr, nb, True)
        if R > 0:
            Ws = T.alloc_buffer((WS_len,), U8, scope="global")
            Ss = T.alloc_buffer((SS_len,), S_dt, scope="global")
            Ms = T.alloc_buffer((MS_len,), S_dt, scope="global")
            tail_copy(Wf, Ws)
            if group:
                tail_scales(Sf, Ss)
            if minimum:
                tail_scales(Mf, Ms)
            panels(Ws, 0, WS_len, Ss, Ms, 0, X, Sf, Bs, O, xq, dx, cr, NBf, False)

    @T.prim_func
    def linear_q(x: T.handle, w: T.handle, s: T.handle, b: T.handle, o: T.handle):
        T.func_attr({"tirx.noalias": True})
        X = T.match_buffer(x, (T_, K), F32)
        W = T.match_buffer(w, (N, BPR), U8)
        S = T.match_buffer(s, S_shape, S_dt)
        Bs = T.match_buffer(b, B_shape, F32)
        O = T.match_buffer(o, (T_, N), F32, align=VIEW_ALIGN)
        Sf = T.decl_buffer((N * KG,), S_dt, data=S.data)
        body(X, T.decl_buffer((N * BPR,), U8, data=W.data), Sf, Sf, Bs, O)

    @T.prim_func
    def linear_qm(x: T.handle, w: T.handle, s: T.handle, m: T.handle, b: T.handle, o: T.handle):
        T.func_attr({"tirx.noalias": True})
        X = T.match_buffer(x, (T_, K), F32)
        W = T.match_buffer(w, (N, BPR), U8)
        S = T.match_buffer(s, S_shape, S_dt)
        M = T.match_buffer(m, S_shape, S_dt)
        Bs = T.match_buffer(b, B_shape, F32)
        O = T.match_buffer(o, (T_, N), F32, align=VIEW_ALIGN)
        Sf = T.decl_buffer((N * KG,), S_dt, data=S.data)
        body(X, T.decl_buffer((N * BPR,), U8, data=W.data), Sf, T.decl_buffer((N * KG,), S_dt, data=M.data), Bs, O)

    if minimum:
        return _drop_bias(linear_qm, bias, 4)
    return _drop_bias(linear_q, bias, 3)


# --------------------------------------------------------------------------------------------- q6 kernel
def q6_kernel(cpu, T_: int, N: int, K: int, bias: bool):
    """linear_q6 (the embedding / lm_head scheme of --head-quant q6). Per panel and 32-k block: 6 chunks, 4 of low
    nibbles (unpacked as q4's) and 2 of high bit pairs (as t2's); operand = low | high << 4 (u8 codes 0..63, so
    vpmaddubsw pairs stay below 2^15), dot products as q4's, one f16 scale per block. No SMMLA variant. q6 is also
    the body scheme of Q4_K_M / Q5_x GGUF files (compiler/auto_quant.py), so prefill and verify passes run it too."""
    path = path_for(cpu)
    g = _Geo("q4", T_, N, K, Q6_GROUP)
    g.bits, g.off, g.BPR, g.NCH = 6, 32, K * 6 // 8, K // QA * Q6_CHUNKS
    BPR, NBf, R, KB = g.BPR, g.NBf, g.R, g.KB
    BB = Q6_CHUNKS * 64                      # panel bytes per block
    # AVX2: tiles of 8 tokens as two 8-row halves (panel_split) unpack each operand once per 8 tokens, not per 2
    split = SPLIT_HALVES and path == "avx2" and T_ > 1
    Tt = _tt(path, T_, 8, avx2_tt=8 if split else 2)
    NA = 2 if Tt == 1 else 1
    PF, PL = stream_prefetch(cpu, T_), stream_locality(cpu, T_)
    NTB = (T_ + Tt - 1) // Tt
    rag_t = T_ % Tt != 0
    B_shape = (N,) if bias else (1,)
    act = _act_blocks(cpu, g, -g.off)   # negated: each token's int sums start there (as block_kernel's pre_offset)
    tail_copy = _tail_copy(g)
    outer = _outer((N * K >= PARALLEL_MIN_ELEMS) if T_ == 1 else (T_ * N * K >= 4 * PARALLEL_MIN_ELEMS))

    def trow(tb, ti):
        return T.min(tb * Tt + ti, T_ - 1) if rag_t else tb * Tt + ti

    start_sums = offset_start(Tt, NA, KB, trow)

    def isum(iacc, ti, l):
        return iacc[ti * 16 + l] if NA == 1 else iacc[l] + iacc[16 + l]

    def operand(v, hv, h, j):
        lo = (v >> T.Broadcast(T.Cast(U8, 4 * h), 64)) & _u8(15)
        hi = ((hv >> T.Broadcast(T.Cast(U8, 2 * j), 64)) & _u8(3)) << T.Broadcast(T.uint8(4), 64)
        return lo | hi

    @T.macro
    def panel(Wsrc, wbase, wlen, Ssrc, sbase, Bs, O, xq, dx, cr, nb, full):
        facc = T.alloc_buffer((Tt * 16,), F32, scope="global", annotations=STACK)
        iacc = T.alloc_buffer((Tt * NA * 16,), I32, scope="global", annotations=STACK)
        for tb in range(NTB):
            for l in T.vectorized(Tt * 16):
                facc[l] = T.float32(0)
            for kb in range(KB):
                start_sums(iacc, cr, tb, kb)
                if PF > 0:
                    for c in T.unroll(Q6_CHUNKS):
                        prefetch(Wsrc, T.min(wbase + kb * BB + c * 64 + PF, wlen - 1), PL)
                for c in T.unroll(4):
                    v: T.let[T.uint8x64] = Wsrc[T.Ramp(wbase + kb * BB + c * 64, 1, 64)]
                    hv: T.let[T.uint8x64] = Wsrc[T.Ramp(wbase + kb * BB + (4 + c // 2) * 64, 1, 64)]
                    for h in T.unroll(2):
                        u: T.let[T.uint8x64] = operand(v, hv, h, 2 * (c % 2) + h)
                        for ti in T.unroll(Tt):
                            iacc[T.Ramp((ti * NA + (2 * c + h) % NA) * 16, 1, 16)] = dot4(
                                path, iacc[T.Ramp((ti * NA + (2 * c + h) % NA) * 16, 1, 16)], u, xq,
                                trow(tb, ti) * K + kb * QA + 8 * c + 4 * h)
                for ti in T.unroll(Tt):
                    for l in T.vectorized(16):
                        facc[ti * 16 + l] = facc[ti * 16 + l] + T.Cast(F32, isum(iacc, ti, l)) * (
                            T.Cast(F32, Ssrc[sbase + kb * NR + l]) * dx[trow(tb, ti) * KB + kb])
            for ti in T.unroll(Tt):
                if tb * Tt + ti < T_:
                    if full:
                        for l in T.vectorized(16):
                            O[tb * Tt + ti, nb * NR + l] = facc[ti * 16 + l] + (Bs[nb * NR + l] if bias else T.float32(0))
                    else:
                        for l in range(R):
                            O[tb * Tt + ti, nb * NR + l] = facc[ti * 16 + l] + (Bs[nb * NR + l] if bias else T.float32(0))

    def operand32(v, hv, h, j):
        lo = (v >> T.Broadcast(T.Cast(U8, 4 * h), 32)) & T.Broadcast(T.uint8(15), 32)
        hi = ((hv >> T.Broadcast(T.Cast(U8, 2 * j), 32)) & T.Broadcast(T.uint8(3), 32)) << T.Broadcast(T.uint8(4), 32)
        return lo | hi

    # the 16-row panel as two 8-row halves (block_kernel's panel_split): a chunk's two operands (k 8c..8c+7) add up in
    # int16 (2 * 2 * 63 * 127 < 2^15) and widen once; the same integer sums and f32 epilogue per output: the same bits
    @T.macro
    def panel_split(Wsrc, wbase, wlen, Ssrc, sbase, Bs, O, xq, dx, cr, nb, full):
        facc = T.alloc_buffer((Tt * 8,), F32, scope="global", annotations=STACK)
        isum8 = T.alloc_buffer((Tt * 8,), I32, scope="global", annotations=STACK)
        for tb in range(NTB):
            for hf in range(2):
                for ti in T.unroll(Tt):
                    for l in T.vectorized(8):
                        facc[ti * 8 + l] = T.float32(0)
                for kb in range(KB):
                    for ti in T.unroll(Tt):
                        for l in T.vectorized(8):
                            isum8[ti * 8 + l] = cr[trow(tb, ti) * KB + kb]
                    if PF > 0:
                        if hf == 0:
                            for c in T.unroll(Q6_CHUNKS):
                                prefetch(Wsrc, T.min(wbase + kb * BB + c * 64 + PF, wlen - 1), PL)
                    for c in range(4):   # a loop, as block_kernel's (unrolled, LLVM spills)
                        v: T.let[T.uint8x32] = Wsrc[T.Ramp(wbase + kb * BB + c * 64 + hf * 32, 1, 32)]
                        hv: T.let[T.uint8x32] = Wsrc[T.Ramp(wbase + kb * BB + (4 + c // 2) * 64 + hf * 32, 1, 32)]
                        u0: T.let[T.uint8x32] = operand32(v, hv, 0, 2 * (c % 2))
                        u1: T.let[T.uint8x32] = operand32(v, hv, 1, 2 * (c % 2) + 1)
                        for ti in T.unroll(Tt):
                            isum8[T.Ramp(ti * 8, 1, 8)] = dot8_pair_half_avx2(
                                isum8[T.Ramp(ti * 8, 1, 8)], u0, u1, xq, trow(tb, ti) * K + kb * QA + 8 * c)
                    for ti in T.unroll(Tt):
                        for l in T.vectorized(8):
                            facc[ti * 8 + l] = facc[ti * 8 + l] + T.Cast(F32, isum8[ti * 8 + l]) * (
                                T.Cast(F32, Ssrc[sbase + kb * NR + hf * 8 + l]) * dx[trow(tb, ti) * KB + kb])
                for ti in T.unroll(Tt):
                    if tb * Tt + ti < T_:
                        if full:
                            for l in T.vectorized(8):
                                O[tb * Tt + ti, nb * NR + hf * 8 + l] = facc[ti * 8 + l] + (
                                    Bs[nb * NR + hf * 8 + l] if bias else T.float32(0))
                        else:
                            for l in range(8):
                                if hf * 8 + l < R:
                                    O[tb * Tt + ti, nb * NR + hf * 8 + l] = facc[ti * 8 + l] + (
                                        Bs[nb * NR + hf * 8 + l] if bias else T.float32(0))

    tile_panel = panel_split if split else panel

    @T.macro
    def tail_scales(Sf, Ss):
        for kb in range(KB):
            for l in range(16):
                Ss[kb * 16 + l] = T.if_then_else(l < R, Sf[NBf * NR * KB + kb * R + T.min(l, R - 1)], T.float16(0))

    SS_len = KB * 16 if R else 1
    WS_len = g.NCH * 64 if R else 1

    @T.prim_func
    def linear_q6(x: T.handle, w: T.handle, s: T.handle, b: T.handle, o: T.handle):
        T.func_attr({"tirx.noalias": True})
        X = T.match_buffer(x, (T_, K), F32)
        W = T.match_buffer(w, (N, BPR), U8)
        S = T.match_buffer(s, (N, KB), "float16")
        Bs = T.match_buffer(b, B_shape, F32)
        O = T.match_buffer(o, (T_, N), F32, align=VIEW_ALIGN)
        Wf = T.decl_buffer((N * BPR,), U8, data=W.data)
        Sf = T.decl_buffer((N * KB,), "float16", data=S.data)
        xq = T.alloc_buffer((T_ * K,), "int8", scope="global")
        dx = T.alloc_buffer((T_ * KB,), F32, scope="global")
        cr = T.alloc_buffer((T_ * KB,), I32, scope="global")
        act(X, xq, dx, cr)
        for nb in outer(NBf):
            tile_panel(Wf, nb * NR * BPR, N * BPR, Sf, nb * NR * KB, Bs, O, xq, dx, cr, nb, True)
        if R > 0:
            Ws = T.alloc_buffer((WS_len,), U8, scope="global")
            Ss = T.alloc_buffer((SS_len,), "float16", scope="global")
            tail_copy(Wf, Ws)
            tail_scales(Sf, Ss)
            tile_panel(Ws, 0, WS_len, Ss, 0, Bs, O, xq, dx, cr, NBf, False)

    return _drop_bias(linear_q6, bias, 3)


# --------------------------------------------------------------------------------------------- t2 kernel
