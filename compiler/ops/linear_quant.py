"""Quantized linear kernels: out[t, n] = sum_k x[t, k] * W[n, k] (+ b[n]) with W in a packed scheme layout.

Ops (args in order; shapes as the scheme's quantize() produces them, see quant/packing.py for the byte layouts):

| op            | params           | args                                                                      |
|---------------|------------------|---------------------------------------------------------------------------|
| linear_q8     | T, N, K, bias    | x f32[T,K], qweight u8[N,K],   scales f32[N],       [b f32[N]], out f32[T,N] |
| linear_q4     | T, N, K, G, bias | x f32[T,K], qweight u8[N,K/2], scales f16[N,K/G],   [b f32[N]], out f32[T,N] |
| linear_t2     | T, N, K, bias    | x f32[T,K], qweight u8[N,K/4], scale f32[1],        [b f32[N]], out f32[T,N] |
| linear_t2_lut | T, N, K, bias    | same as linear_t2 (same packed weights)                                    |

Every op also takes segs (fused q/k/v or gate/up: stacked matrices, one output each; compiler/ops/segments.py):
the outputs become out_s f32[T, N_s], and t2's scale f32[nseg], one per matrix.

Math (bit-exact activation quantization; integer dot products; see quant/packing.py):
  q8/q4: x is quantized to int8 per block of 32 k (absmax) at the start of every call;
         y = sum_blocks dx[t,b] * s[n,b] * isum[t,n,b]   (isum: exact int32 dot product of the block)
  t2:    x is quantized to int8 per token (absmax, BitNet b1.58); y = dx[t] * scale * isum[t,n].
Weights stay packed in memory; nothing is dequantized to f32.

Schedule (all ops): the output rows are processed in panels of 16 (the packing's row panel); a panel is one
16-lane int32 accumulator per token: each 64-byte chunk of packed weights is unpacked in registers (q4: and /
shift+and per nibble; t2: shift+and per bit pair) into u8 codes whose int32 lane r holds 4 consecutive-k codes
of row r, and multiplied with the 4 matching int8 activations broadcast to all lanes:
  AVX-512 (vector_lanes 16, x86): one VNNI vpdpbusd per 16 rows x 4 k (u8 codes x s8 activations); the
     unsigned-code offset is removed once per block: isum = sum(code * xq) - offset * sum(xq).
  AVX2 (vector_lanes 8, x86): vpmaddubsw per 8 rows x 4 k (q4/t2 codes <= 15 never saturate the int16 pairs),
     and the int16 results are added up in int16 as far as they cannot overflow (q4: the block's 8 operands; t2:
     FL chunks, see i16_capacity) before one vpmaddwd widens them to int32; q8 uses the sign trick
     (|x| u8 x sign(w, x) s8, <= 2 * 127 * 127: one result fills an int16 lane) with vpmaddwd per operand.
  aarch64 with dotprod (rpi5, android-cpu): one SDOT per 4 rows x 4 k (each 16-byte quarter of a chunk, the
     activation word broadcast); q4/t2 codes (<= 15) are valid int8 as they are, q8 codes are flipped to signed.
  aarch64 with i8mm (android-cpu), prefill only: SMMLA, 2 rows x 2 tokens x 8 k per instruction; the operands of
     k0..3 and k4..7 are zipped per row pair (zip1/zip2 .4s), tokens go in pairs (Tt = 4), and the 2x2 tiles are
     put back in token order once per block.
  other (NEON without dotprod: rpi4, ...): the same loops in plain integer TIR (LLVM lowers them to smull/smlal).
T == 1 (decode GEMV, memory bound): parallel over panels; each 64-byte chunk load is preceded by a software prefetch
  cpu.prefetch_bytes ahead in the panel stream (x86 targets; the hardware prefetcher alone left 5-12% of the
  bandwidth unused on Zen 3); on VNNI and sdot 2 (q8: alternating chunks; q4: one per nibble) or
  4 (t2: one per bit pair) independent int accumulators per panel, so on VNNI the codes are only masked in
  place (v & 0xF0 = 16 * code) and each accumulator is shifted back exactly once per block (q4) or per row
  (t2): one `and` + one vpdpbusd per 64 bytes of weights (t2 needs K <= 65536 for that; larger K shifts).
T > 1 (prefill GEMM): inside a panel, Tt tokens at a time (AVX-512: 8): a weight chunk is loaded and unpacked
once and feeds Tt dot products (register block of Tt int32 + Tt f32 accumulators); ragged token blocks clamp
their rows and guard the stores.
The tail panel (N % 16 rows, stored compactly) is copied into a zero-padded 16-row scratch panel once per
call and runs the same code; only its stores are guarded.

linear_t2_lut (T-MAC / bitnet.cpp TL1 idea): per token and per pair of activations (k, k+4) a 16-entry table
of t_a*x_a + t_b*x_b for all ternary pairs (index code_a + 4*code_b: the low / high nibble of a packed byte,
9 entries used) is built once per call as int16 split into a low-byte and a high-byte table; the kernel then
permutes each 64-byte chunk to [byte position][row] (so each 128-bit lane serves one activation pair), looks
up 64 rows x pairs per vpshufb (AVX-512BW; AVX2 pshufb on halves; NEON tbl on quarters), re-interleaves low
and high bytes into int16, accumulates int16 for 16 chunks (max 4 * 16 * 2 * 254 = 32512 < 2^15) and then
widens to int32.

Scratch (TVMBackendAllocWorkspace, once per call): quantized activations T*K bytes + per-block scales/sums
(q8/q4: 8*T*K/32 bytes; t2: 8*T bytes); tail panel copy (<= 16*K*bits/8 bytes + q4 scales) when N % 16 != 0;
t2_lut tables 16*T*K bytes. Register-sized accumulators are stack allocas.
"""
from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from ...quant.packing import EPS_BLOCK, EPS_TOKEN, LAYOUTS, NR, Q6_CHUNKS, Q6_GROUP, QA
from ._util import F32, PARALLEL_MIN_ELEMS, STACK, VIEW_ALIGN, concat_vecs, hmax, hsum, prefetch
from .segments import offsets, split_output

U8 = "uint8"
I32 = "int32"
PREMUL_UNPACK = True   # GEMV on VNNI: mask codes in place (no shifts), rescale the accumulators once


def path_for(cpu) -> str:
    """Which integer dot-product flavour a CpuInfo gets: 'vnni' (x86 with 16 f32 lanes: AVX-512 + VNNI, i.e.
    Cascade Lake / Ice Lake / Zen 4 and later), 'avx2' (x86 with 8 lanes), 'sdot' (aarch64 with the dotprod
    extension: Cortex-A55/A76 and later) or 'generic' (plain TIR; on aarch64 without dotprod LLVM lowers it to
    NEON widening multiplies and adds)."""
    if cpu.arch == "x86_64" and cpu.vector_lanes >= 16:
        return "vnni"
    if cpu.arch == "x86_64" and cpu.vector_lanes == 8:
        return "avx2"
    if cpu.arch == "aarch64" and "dotprod" in getattr(cpu, "features", ()):
        return "sdot"
    return "generic"


# ------------------------------------------------------------------------------------- expression helpers
def _u8(v):
    return T.Broadcast(T.uint8(v), 64)


def _xword(xq, off):
    """4 int8 activations at xq[off:off+4] as one int32 (little-endian bytes)."""
    return T.reinterpret(I32, xq[T.Ramp(off, 1, 4)])


def _halves(v, n, lanes):
    return [T.Shuffle([v], list(range(i * lanes, (i + 1) * lanes))) for i in range(n)]


def dot4(path, acc, w, xq, off):
    """acc (int32x16) + per row r: sum_{b<4} w[4r+b] (u8) * xq[off+b] (s8)."""
    if path == "vnni":
        xb = T.Broadcast(_xword(xq, off), 16)
        return T.call_llvm_pure_intrin("int32x16", "llvm.x86.avx512.vpdpbusd.512", acc,
                                       T.reinterpret("int8x64", w), T.reinterpret("int8x64", xb))
    if path == "avx2":
        xb = T.reinterpret("int8x32", T.Broadcast(_xword(xq, off), 8))
        parts = []
        for h in _halves(w, 2, 32):
            p = T.call_llvm_pure_intrin("int16x16", "llvm.x86.avx2.pmadd.ub.sw", T.reinterpret("int8x32", h), xb)
            parts.append(T.call_llvm_pure_intrin("int32x8", "llvm.x86.avx2.pmadd.wd", p, T.Broadcast(T.int16(1), 16)))
        return acc + T.Shuffle(parts, list(range(16)))
    if path == "sdot":
        return dot4_sdot(acc, T.reinterpret("int8x64", w), xq, off)
    terms = [T.Cast("int32x16", T.Shuffle([w], [4 * r + b for r in range(16)])) *
             T.Broadcast(T.Cast(I32, xq[off + b]), 16) for b in range(4)]
    return acc + ((terms[0] + terms[1]) + (terms[2] + terms[3]))


def madd16_avx2(acc16, w, xq, off):
    """AVX2 with int16 accumulation: acc16 (int16x32: per 8-row half, two k-pair sums per row) + vpmaddubsw of the
    u8 codes w with xq[off:off+4]; widening to int32 (flush16) is paid once per many operands, not per operand."""
    xb = T.reinterpret("int8x32", T.Broadcast(_xword(xq, off), 8))
    parts = [T.call_llvm_pure_intrin("int16x16", "llvm.x86.avx2.pmadd.ub.sw", T.reinterpret("int8x32", h), xb)
             for h in _halves(w, 2, 32)]
    return acc16 + T.Shuffle(parts, list(range(32)))


def flush16(acc16):
    """int16x32 of madd16_avx2 -> int32x16 row sums (vpmaddwd with ones adds each row's two pair sums)."""
    parts = [T.call_llvm_pure_intrin("int32x8", "llvm.x86.avx2.pmadd.wd", h, T.Broadcast(T.int16(1), 16))
             for h in _halves(acc16, 2, 16)]
    return T.Shuffle(parts, list(range(16)))


def i16_capacity(max_code: int) -> int:
    """vpmaddubsw results (each <= 2 * max_code * 127) one int16 lane holds without overflow."""
    return 32767 // (2 * max_code * 127)


def dot4_sdot(acc, w, xq, off):
    """aarch64 SDOT: w int8x64 (4 quarters of rows 0-3, 4-7, 8-11, 12-15), each lane += 4-way int8 dot product
    with the 4 activations xq[off:off+4] broadcast (sdot's indexed form). Signed x signed: q4/t2 codes (<= 15)
    are valid int8 as they are; q8 codes are flipped to signed first (code ^ 128 = q)."""
    xb = T.reinterpret("int8x16", T.Broadcast(_xword(xq, off), 4))
    accs = _halves(acc, 4, 4)
    res = [T.call_llvm_pure_intrin("int32x4", "llvm.aarch64.neon.sdot", accs[q],
                                   T.Shuffle([w], list(range(16 * q, 16 * q + 16))), xb) for q in range(4)]
    return concat_vecs(res, 4)


def mmla8(acc, ua, ub, xq, off0, off1):
    """aarch64 i8mm SMMLA for 16 rows x 2 tokens x 8 k. acc int32x32: 8 row pairs, each [r0 t0, r0 t1, r1 t0,
    r1 t1] (smmla's 2x2 tile); ua / ub: the int8x64 operands of k0..k3 / k4..k7 (row r in bytes 4r..4r+3), zipped
    per row pair into smmla's 2x8 A; xq[off0:off0+8], xq[off1:off1+8]: the two tokens' activations (its B)."""
    wa, wb = T.reinterpret("int8x64", ua), T.reinterpret("int8x64", ub)
    xb = T.Shuffle([xq[T.Ramp(off0, 1, 8)], xq[T.Ramp(off1, 1, 8)]], list(range(16)))
    res = []
    for q, a in enumerate(_halves(acc, 8, 4)):
        idx = [*range(8 * q, 8 * q + 4), *range(64 + 8 * q, 68 + 8 * q), *range(8 * q + 4, 8 * q + 8),
               *range(68 + 8 * q, 72 + 8 * q)]
        res.append(T.call_llvm_pure_intrin("int32x4", "llvm.aarch64.neon.smmla", a, T.Shuffle([wa, wb], idx), xb))
    return concat_vecs(res, 4)


def mmla_tokens(acc):
    """The int32x32 of mmla8 in token-major order: token 0's 16 rows, then token 1's."""
    return T.Shuffle([acc], [(r // 2) * 4 + (r % 2) * 2 + t for t in range(2) for r in range(16)])


def dot4_signed_avx2(acc, w, xq, off):
    """AVX2 q8: w int8x64 signed codes; pmaddubsw(|x|, sign(w, x)) never saturates (|x|, |w| <= 127)."""
    xb = T.reinterpret("int8x32", T.Broadcast(_xword(xq, off), 8))
    ax = T.call_llvm_pure_intrin("int8x32", "llvm.x86.avx2.psign.b", xb, xb)  # |x| (x = -128 never occurs)
    parts = []
    for h in _halves(w, 2, 32):
        sw = T.call_llvm_pure_intrin("int8x32", "llvm.x86.avx2.psign.b", h, xb)
        p = T.call_llvm_pure_intrin("int16x16", "llvm.x86.avx2.pmadd.ub.sw", ax, sw)
        parts.append(T.call_llvm_pure_intrin("int32x8", "llvm.x86.avx2.pmadd.wd", p, T.Broadcast(T.int16(1), 16)))
    return acc + T.Shuffle(parts, list(range(16)))


def lookup16(path, tab, base, idx):
    """64 byte lookups: result byte 16q + i = tab[base + 16q + idx[16q + i]] (idx bytes in 0..15)."""
    if path == "vnni":
        t = T.reinterpret("int8x64", tab[T.Ramp(base, 1, 64)])
        return T.reinterpret("uint8x64", T.call_llvm_pure_intrin("int8x64", "llvm.x86.avx512.pshuf.b.512", t,
                                                                  T.reinterpret("int8x64", idx)))
    if path == "avx2":
        res = []
        for h in range(2):
            t = T.reinterpret("int8x32", tab[T.Ramp(base + 32 * h, 1, 32)])
            i = T.reinterpret("int8x32", T.Shuffle([idx], list(range(32 * h, 32 * h + 32))))
            res.append(T.call_llvm_pure_intrin("int8x32", "llvm.x86.avx2.pshuf.b", t, i))
        return T.reinterpret("uint8x64", T.Shuffle(res, list(range(64))))
    # plain: 64 scalar loads (only for targets without a byte shuffle intrinsic here)
    return T.Shuffle([tab[base + (i // 16) * 16 + T.Cast(I32, T.Shuffle([idx], [i]))] for i in range(64)],
                     list(range(64)))


def lookup16_neon(tab, base, idx):
    res = []
    for q in range(4):
        t = T.reinterpret("int8x16", tab[T.Ramp(base + 16 * q, 1, 16)])
        i = T.reinterpret("int8x16", T.Shuffle([idx], list(range(16 * q, 16 * q + 16))))
        res.append(T.call_llvm_pure_intrin("int8x16", "llvm.aarch64.neon.tbl1", t, i))
    return T.reinterpret("uint8x64", concat_vecs(res, 16))


def _outer(parallel: bool):
    return T.parallel if parallel else T.serial


# ------------------------------------------------------------------------------------------------ common
class _Geo:
    """Shapes shared by the builders."""

    def __init__(self, scheme, T_, N, K, G=None):
        self.bits, self.kpc, self.off = LAYOUTS[scheme]
        self.T, self.N, self.K = T_, N, K
        self.BPR = K * self.bits // 8        # packed bytes per row
        self.NCH = K // self.kpc             # chunks per row
        self.SUB = self.kpc // 4             # unpacked 4-k operands per chunk
        self.NBf, self.R = divmod(N, NR)
        self.KB = K // QA
        self.G = G
        self.KG = K // G if G else 1


def _act_blocks(cpu, g: _Geo, corr_mul: int):
    """Macro: x f32[T, K] -> xq int8 [T*K], dx f32 [T*KB], cr int32 [T*KB] (= corr_mul * block sum of xq)."""
    VL = min(cpu.vector_lanes, QA)
    T_, K, KB = g.T, g.K, g.KB
    outer = _outer(T_ * K >= PARALLEL_MIN_ELEMS)

    @T.macro
    def act(X, xq, dx, cr):
        for t in outer(T_):
            m = T.alloc_buffer((VL,), F32, scope="global", annotations=STACK)
            si = T.alloc_buffer((VL,), I32, scope="global", annotations=STACK)
            for kb in range(KB):
                for l in T.vectorized(VL):
                    m[l] = T.abs(X[t, kb * QA + l])
                for j in range(1, QA // VL):
                    for l in T.vectorized(VL):
                        m[l] = T.max(m[l], T.abs(X[t, kb * QA + j * VL + l]))
                amax: T.let[T.float32] = T.max(hmax(m, VL), T.float32(EPS_BLOCK))
                inv: T.let[T.float32] = T.float32(127) / amax
                dx[t * KB + kb] = amax / T.float32(127)
                for l in T.vectorized(QA):
                    xq[t * K + kb * QA + l] = T.Cast("int8", T.nearbyint(X[t, kb * QA + l] * inv))
                for l in T.vectorized(VL):
                    si[l] = T.Cast(I32, xq[t * K + kb * QA + l])
                for j in range(1, QA // VL):
                    for l in T.vectorized(VL):
                        si[l] = si[l] + T.Cast(I32, xq[t * K + kb * QA + j * VL + l])
                cr[t * KB + kb] = hsum(si, VL) * corr_mul

    return act


def _act_token(cpu, g: _Geo, corr_mul: int):
    """Macro: x f32[T, K] -> xq int8 [T*K], dx f32 [T], cr int32 [T] (= corr_mul * sum of xq), per token."""
    VL = cpu.vector_lanes
    T_, K = g.T, g.K
    KV = K // VL
    outer = _outer(T_ * K >= PARALLEL_MIN_ELEMS)

    @T.macro
    def act(X, xq, dx, cr):
        for t in outer(T_):
            m = T.alloc_buffer((VL,), F32, scope="global", annotations=STACK)
            si = T.alloc_buffer((VL,), I32, scope="global", annotations=STACK)
            for l in T.vectorized(VL):
                m[l] = T.abs(X[t, l])
            for j in range(1, KV):
                for l in T.vectorized(VL):
                    m[l] = T.max(m[l], T.abs(X[t, j * VL + l]))
            amax: T.let[T.float32] = T.max(hmax(m, VL), T.float32(EPS_TOKEN))
            inv: T.let[T.float32] = T.float32(127) / amax
            dx[t] = amax / T.float32(127)
            for l in T.vectorized(VL):
                si[l] = 0
            for j in range(KV):
                for l in T.vectorized(VL):
                    xq[t * K + j * VL + l] = T.Cast("int8", T.nearbyint(X[t, j * VL + l] * inv))
                for l in T.vectorized(VL):
                    si[l] = si[l] + T.Cast(I32, xq[t * K + j * VL + l])
            cr[t] = hsum(si, VL) * corr_mul

    return act


def _tail_copy(g: _Geo):
    """Macro: copy the compact tail panel (R rows) of Wf into a zero-padded 16-row panel Ws [NCH*64]."""
    R, NCH, base = g.R, g.NCH, g.NBf * NR * g.BPR

    @T.macro
    def copy(Wf, Ws):
        for ch in range(NCH):
            for j in T.vectorized(64):
                Ws[ch * 64 + j] = T.if_then_else(j < 4 * R, Wf[base + ch * 4 * R + T.min(j, 4 * R - 1)], T.uint8(0))

    return copy


def _drop_bias(func, bias: bool, index: int):
    if bias:
        return func
    params = list(func.params)
    params.pop(index)
    return tirx.PrimFunc(params, func.body, func.ret_type, func.attrs)


def _tt(path, T_, vnni_tt, mm=False):
    """Tokens per register block of the prefill GEMM (AVX-512 and NEON have 32 vector registers; SMMLA works on
    token pairs, a ragged last pair repeats the last token)."""
    if mm:
        return 4 if T_ >= 3 else 2
    return 1 if T_ == 1 else min(T_, vnni_tt if path == "vnni" else 4 if path == "sdot" else 2)


def _use_mmla(cpu, path, T_) -> bool:
    """Prefill GEMMs on aarch64 with i8mm use SMMLA (2 tokens x 2 rows x 8 k per instruction); decode keeps SDOT."""
    return path == "sdot" and T_ > 1 and "i8mm" in getattr(cpu, "features", ())


# ---------------------------------------------------------------------------------------- q8 / q4 kernels
def block_kernel(cpu, scheme: str, T_: int, N: int, K: int, G: int | None, bias: bool):
    """linear_q8 (G None) / linear_q4 (group G)."""
    path = path_for(cpu)
    g = _Geo(scheme, T_, N, K, G)
    group = scheme == "q4"
    signed_w = scheme == "q8" and path in ("avx2", "sdot")
    corr_mul = 0 if signed_w else g.off
    BPR, NCH, SUB, NBf, R, KB, KG = g.BPR, g.NCH, g.SUB, g.NBf, g.R, g.KB, g.KG
    CPB = QA // g.kpc                       # chunks per activation block
    BPG = (G // QA) if group else 1         # activation blocks per scale group
    mm = _use_mmla(cpu, path, T_)
    NPAIR = CPB * SUB // 2                  # SMMLA: 8-k operand pairs per block
    Tt = _tt(path, T_, 8, mm)
    # AVX2 q4: the block's 8 vpmaddubsw results per token add up in int16 (8 * 2 * 15 * 127 < 2^15) and are widened
    # once per block; q8's signed products (<= 2 * 127^2) fill an int16 lane alone
    i16 = path == "avx2" and not signed_w and CPB * g.SUB <= i16_capacity((1 << g.bits) - 1)
    NA = 2 if Tt == 1 and not i16 else 1    # independent int accumulators per token (latency of the dot chain)
    PF = cpu.prefetch_bytes if T_ == 1 else 0   # decode streams the weights once: prefetch ahead of the loads
    NTB = (T_ + Tt - 1) // Tt
    rag_t = T_ % Tt != 0
    S_shape, S_dt = ((N, KG), "float16") if group else ((N,), F32)
    B_shape = (N,) if bias else (1,)
    act = _act_blocks(cpu, g, corr_mul)
    tail_copy = _tail_copy(g)
    par = (N * K >= PARALLEL_MIN_ELEMS) if T_ == 1 else (T_ * N * K >= 4 * PARALLEL_MIN_ELEMS)
    outer = _outer(par)
    bits = g.bits

    def trow(tb, ti):
        return T.min(tb * Tt + ti, T_ - 1) if rag_t else tb * Tt + ti

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

    @T.macro
    def panel(Wsrc, wbase, wlen, Ssrc, sbase, X, Sr, Bs, O, xq, dx, cr, nb, full):
        facc = T.alloc_buffer((Tt * 16,), F32, scope="global", annotations=STACK)
        iacc = T.alloc_buffer((Tt * NA * 16,), I32, scope="global", annotations=STACK)
        acc16 = T.alloc_buffer((Tt * 32,), "int16", scope="global", annotations=STACK)
        for tb in range(NTB):
            for l in T.vectorized(Tt * 16):
                facc[l] = T.float32(0)
            for kb in range(KB):
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
                            prefetch(Wsrc, T.min(wbase + (kb * CPB + c) * 64 + PF, wlen - 1))
                        v: T.let[T.uint8x64] = Wsrc[T.Ramp(wbase + (kb * CPB + c) * 64, 1, 64)]
                        for h in T.unroll(SUB):
                            u: T.let[T.uint8x64] = operand(v, h)
                            for ti in T.unroll(Tt):
                                if i16:
                                    acc16[T.Ramp(ti * 32, 1, 32)] = madd16_avx2(
                                        acc16[T.Ramp(ti * 32, 1, 32)], u, xq,
                                        trow(tb, ti) * K + kb * QA + c * g.kpc + h * 4)
                                else:
                                    iacc[T.Ramp((ti * NA + (c * SUB + h) % NA) * 16, 1, 16)] = dot(
                                        iacc[T.Ramp((ti * NA + (c * SUB + h) % NA) * 16, 1, 16)], u, xq,
                                        trow(tb, ti) * K + kb * QA + c * g.kpc + h * 4)
                    if i16:
                        for ti in T.unroll(Tt):
                            iacc[T.Ramp(ti * 16, 1, 16)] = flush16(acc16[T.Ramp(ti * 32, 1, 32)])
                for ti in T.unroll(Tt):
                    for l in T.vectorized(16):
                        facc[ti * 16 + l] = facc[ti * 16 + l] + T.Cast(
                            F32, block_isum(iacc, ti, l) - cr[trow(tb, ti) * KB + kb]) * (
                            scale_vec(Ssrc, sbase, kb, l) * dx[trow(tb, ti) * KB + kb])
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

    @T.macro
    def tail_scales(Sf, Ss):
        for kg in range(KG):
            for l in range(16):
                Ss[kg * 16 + l] = T.if_then_else(l < R, Sf[NBf * NR * KG + kg * R + T.min(l, R - 1)], T.float16(0))

    SS_len = KG * 16 if (group and R) else 1
    WS_len = NCH * 64 if R else 1

    @T.prim_func
    def linear_q(x: T.handle, w: T.handle, s: T.handle, b: T.handle, o: T.handle):
        T.func_attr({"tirx.noalias": True})
        X = T.match_buffer(x, (T_, K), F32)
        W = T.match_buffer(w, (N, BPR), U8)
        S = T.match_buffer(s, S_shape, S_dt)
        Bs = T.match_buffer(b, B_shape, F32)
        O = T.match_buffer(o, (T_, N), F32, align=VIEW_ALIGN)
        Wf = T.decl_buffer((N * BPR,), U8, data=W.data)
        Sf = T.decl_buffer((N * KG,), S_dt, data=S.data)
        xq = T.alloc_buffer((T_ * K,), "int8", scope="global")
        dx = T.alloc_buffer((T_ * KB,), F32, scope="global")
        cr = T.alloc_buffer((T_ * KB,), I32, scope="global")
        act(X, xq, dx, cr)
        for nb in outer(NBf):
            panel(Wf, nb * NR * BPR, N * BPR, Sf, nb * NR * KG, X, Sf, Bs, O, xq, dx, cr, nb, True)
        if R > 0:
            Ws = T.alloc_buffer((WS_len,), U8, scope="global")
            Ss = T.alloc_buffer((SS_len,), S_dt, scope="global")
            tail_copy(Wf, Ws)
            if group:
                tail_scales(Sf, Ss)
            panel(Ws, 0, WS_len, Ss, 0, X, Sf, Bs, O, xq, dx, cr, NBf, False)

    return _drop_bias(linear_q, bias, 3)


# --------------------------------------------------------------------------------------------- q6 kernel
def q6_kernel(cpu, T_: int, N: int, K: int, bias: bool):
    """linear_q6 (the embedding / lm_head scheme of --head-quant q6). Per panel and 32-k block: 6 chunks, 4 of low
    nibbles (unpacked as q4's) and 2 of high bit pairs (as t2's); operand = low | high << 4 (u8 codes 0..63, so
    vpmaddubsw pairs stay below 2^15), dot products as q4's, one f16 scale per block. No SMMLA / int16 variants:
    the head runs one token at a time."""
    path = path_for(cpu)
    g = _Geo("q4", T_, N, K, Q6_GROUP)
    g.bits, g.off, g.BPR, g.NCH = 6, 32, K * 6 // 8, K // QA * Q6_CHUNKS
    BPR, NBf, R, KB = g.BPR, g.NBf, g.R, g.KB
    BB = Q6_CHUNKS * 64                      # panel bytes per block
    Tt = _tt(path, T_, 8)
    NA = 2 if Tt == 1 else 1
    PF = cpu.prefetch_bytes if T_ == 1 else 0
    NTB = (T_ + Tt - 1) // Tt
    rag_t = T_ % Tt != 0
    B_shape = (N,) if bias else (1,)
    act = _act_blocks(cpu, g, g.off)
    tail_copy = _tail_copy(g)
    outer = _outer((N * K >= PARALLEL_MIN_ELEMS) if T_ == 1 else (T_ * N * K >= 4 * PARALLEL_MIN_ELEMS))

    def trow(tb, ti):
        return T.min(tb * Tt + ti, T_ - 1) if rag_t else tb * Tt + ti

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
                for l in T.vectorized(Tt * NA * 16):
                    iacc[l] = 0
                if PF > 0:
                    for c in T.unroll(Q6_CHUNKS):
                        prefetch(Wsrc, T.min(wbase + kb * BB + c * 64 + PF, wlen - 1))
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
                        facc[ti * 16 + l] = facc[ti * 16 + l] + T.Cast(
                            F32, isum(iacc, ti, l) - cr[trow(tb, ti) * KB + kb]) * (
                            T.Cast(F32, Ssrc[sbase + kb * NR + l]) * dx[trow(tb, ti) * KB + kb])
            for ti in T.unroll(Tt):
                if tb * Tt + ti < T_:
                    if full:
                        for l in T.vectorized(16):
                            O[tb * Tt + ti, nb * NR + l] = facc[ti * 16 + l] + (Bs[nb * NR + l] if bias else T.float32(0))
                    else:
                        for l in range(R):
                            O[tb * Tt + ti, nb * NR + l] = facc[ti * 16 + l] + (Bs[nb * NR + l] if bias else T.float32(0))

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
            panel(Wf, nb * NR * BPR, N * BPR, Sf, nb * NR * KB, Bs, O, xq, dx, cr, nb, True)
        if R > 0:
            Ws = T.alloc_buffer((WS_len,), U8, scope="global")
            Ss = T.alloc_buffer((SS_len,), "float16", scope="global")
            tail_copy(Wf, Ws)
            tail_scales(Sf, Ss)
            panel(Ws, 0, WS_len, Ss, 0, Bs, O, xq, dx, cr, NBf, False)

    return _drop_bias(linear_q6, bias, 3)


# --------------------------------------------------------------------------------------------- t2 kernel
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
    PF = cpu.prefetch_bytes if T_ == 1 else 0   # decode streams the weights once: prefetch ahead of the loads
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
                            prefetch(Wsrc, T.min(wbase + (f * FL + cc) * 64 + PF, wlen - 1))
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
                    prefetch(Wsrc, T.min(wbase + ch * 64 + PF, wlen - 1))
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


def weight_scale(scheme: str, g: _Geo, segs, Sf, n, group, to_f32):
    """The f32 scale of row n (q8), of row n's segment (t2) or of row n's group `group` (q4 / q6: panel-interleaved
    f16 scales, converted by to_f32) in the flat scales Sf."""
    if scheme == "q8":
        return Sf[n]
    if scheme == "t2":   # the segment of row n: the number of segment starts <= n
        return Sf[sum([T.Cast(I32, n >= o) for o in offsets(segs)[1:-1]], T.int32(0))] if segs else Sf[0]
    nb = n // NR
    rp = T.if_then_else(nb < g.NBf, NR, g.R) if g.R else NR
    return to_f32(Sf[nb * NR * g.KG + group * rp + n % NR])


def naive(scheme: str, T_: int, N: int, K: int, G: int | None, bias: bool, segs=()):
    """Serial scalar loops over the same packed layout and the same activation quantization: always valid,
    slow. scheme: 'q8', 'q4', 't2' (linear_t2_lut falls back to this t2 version: same math)."""
    q6 = scheme == "q6"
    g = _Geo("q4" if q6 else scheme, T_, N, K, Q6_GROUP if q6 else G)
    if q6:
        g.BPR, g.off = K * 6 // 8, 32
    BPR, KG = g.BPR, g.KG
    per_token = scheme == "t2"
    QB = K if per_token else QA              # activation block
    NQB = K // QB
    GB = g.G if scheme in ("q4", "q6") else K   # weight scale block
    NS = max(1, len(segs))                   # t2: one scale per segment (matrix)
    S_shape, S_dt = {"q8": ((N,), F32), "q4": ((N, KG), "float16"), "q6": ((N, KG), "float16"),
                     "t2": ((NS,), F32)}[scheme]
    S_len = {"q8": N, "q4": N * KG, "q6": N * KG, "t2": NS}[scheme]
    B_shape = (N,) if bias else (1,)
    eps = EPS_TOKEN if per_token else EPS_BLOCK

    def code(Wf, n, k):
        return packed_code(g, q6, Wf, n, k)

    def wscale(Sf, n, kb):
        return weight_scale(scheme, g, segs, Sf, n, kb * QB // GB, lambda v: T.Cast(F32, v))

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
        xq = T.alloc_buffer((T_ * K,), I32, scope="global")
        dx = T.alloc_buffer((T_ * NQB,), F32, scope="global")
        st = T.alloc_buffer((2,), F32, scope="global", annotations=STACK)
        ist = T.alloc_buffer((1,), I32, scope="global", annotations=STACK)
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
                    for k in range(QB):
                        ist[0] = ist[0] + code(Wf, n, qb * QB + k) * xq[t * K + qb * QB + k]
                    st[0] = st[0] + T.Cast(F32, ist[0]) * (wscale(Sf, n, qb) * dx[t * NQB + qb])
                if bias:
                    O[t, n] = st[0] + Bs[n]
                else:
                    O[t, n] = st[0]

    return _drop_bias(plain, bias, 3)


def make(op: str, cpu, T_: int, N: int, K: int, G: int | None = None, bias: bool = False, segs=()):
    """segs (row counts summing to N): the packed W stacks several matrices (q/k/v, gate/up) and each one's rows
    go to its own output, out_s f32[T, N_s] (the last args, in order); t2's scale is then f32[nseg], one per
    matrix. () keeps the single output."""
    NS = max(1, len(segs))
    if op == "linear_q8":
        func = block_kernel(cpu, "q8", T_, N, K, None, bias)
    elif op == "linear_q4":
        func = block_kernel(cpu, "q4", T_, N, K, G, bias)
    elif op == "linear_q6":
        func = q6_kernel(cpu, T_, N, K, bias)
    elif op == "linear_t2":
        func = t2_kernel(cpu, T_, N, K, bias, NS)
    elif op == "linear_t2_lut":
        func = t2_lut_kernel(cpu, T_, N, K, bias, NS)
    else:
        raise ValueError(op)
    if not segs:
        return func
    return split_output(func, segs, seg_param=2 if op in T2_OPS else None)


T2_OPS = ("linear_t2", "linear_t2_lut")


def make_naive(op: str, T_: int, N: int, K: int, G: int | None = None, bias: bool = False, segs=()):
    scheme = {"linear_q8": "q8", "linear_q4": "q4", "linear_q6": "q6", "linear_t2": "t2", "linear_t2_lut": "t2"}[op]
    func = naive(scheme, T_, N, K, G, bias, segs)
    return split_output(func, segs) if segs else func
