"""What the quantized linear kernels of every scheme family share (compiler/ops/linear_quant.py dispatches to the
families): the instruction paths per CPU (VNNI, AVX2, SDOT, I8MM, plain), the dot-product and table-lookup
building blocks, the panel geometry, and the activation quantization prologues (per 32-k block, per token).
The schedule and math they implement are described in linear_quant.py."""
from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from ...quant.packing import EPS_BLOCK, EPS_TOKEN, LAYOUTS, NR, QA
from ._util import F32, PARALLEL_MIN_ELEMS, STACK, concat_vecs, hmax, hsum

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


def _xb32(xq, off):
    """AVX2: xq[off:off+4] broadcast to every 4-byte lane of an int8x32."""
    return T.reinterpret("int8x32", T.Broadcast(_xword(xq, off), 8))


def widen16(p):
    """AVX2: int16x16 -> int32x8, each lane the sum of a pair (vpmaddwd with ones)."""
    return T.call_llvm_pure_intrin("int32x8", "llvm.x86.avx2.pmadd.wd", p, T.Broadcast(T.int16(1), 16))


def dot4(path, acc, w, xq, off):
    """acc (int32x16) + per row r: sum_{b<4} w[4r+b] (u8) * xq[off+b] (s8)."""
    if path == "vnni":
        xb = T.Broadcast(_xword(xq, off), 16)
        return T.call_llvm_pure_intrin("int32x16", "llvm.x86.avx512.vpdpbusd.512", acc,
                                       T.reinterpret("int8x64", w), T.reinterpret("int8x64", xb))
    if path == "avx2":
        xb = _xb32(xq, off)
        parts = []
        for h in _halves(w, 2, 32):
            p = T.call_llvm_pure_intrin("int16x16", "llvm.x86.avx2.pmadd.ub.sw", T.reinterpret("int8x32", h), xb)
            parts.append(widen16(p))
        return acc + T.Shuffle(parts, list(range(16)))
    if path == "sdot":
        return dot4_sdot(acc, T.reinterpret("int8x64", w), xq, off)
    terms = [T.Cast("int32x16", T.Shuffle([w], [4 * r + b for r in range(16)])) *
             T.Broadcast(T.Cast(I32, xq[off + b]), 16) for b in range(4)]
    return acc + ((terms[0] + terms[1]) + (terms[2] + terms[3]))


def madd16_avx2(acc16, w, xq, off):
    """AVX2 with int16 accumulation: acc16 (int16x32: per 8-row half, two k-pair sums per row) + vpmaddubsw of the
    u8 codes w with xq[off:off+4]; widening to int32 (flush16) is paid once per many operands, not per operand."""
    xb = _xb32(xq, off)
    parts = [T.call_llvm_pure_intrin("int16x16", "llvm.x86.avx2.pmadd.ub.sw", T.reinterpret("int8x32", h), xb)
             for h in _halves(w, 2, 32)]
    return acc16 + T.Shuffle(parts, list(range(32)))


def dot8_pair_half_avx2(acc8, u0, u1, xq, off):
    """One 8-row half, 8 k: acc8 (int32x8) + the u8 codes u0 (k off..off+3) and u1 (off+4..off+7) times xq; the two
    vpmaddubsw results add in int16 (callers' codes keep 4 products per lane under 2^15) and widen once."""
    p = [T.call_llvm_pure_intrin("int16x16", "llvm.x86.avx2.pmadd.ub.sw", T.reinterpret("int8x32", u),
                                 _xb32(xq, off + 4 * i))
         for i, u in enumerate((u0, u1))]
    return acc8 + widen16(p[0] + p[1])


def madd16_half_avx2(acc16h, w32, xq, off):
    """madd16_avx2 on one 8-row half: acc16h (int16x16) + vpmaddubsw of the half's u8 codes w32 (uint8x32)."""
    xb = _xb32(xq, off)
    return acc16h + T.call_llvm_pure_intrin("int16x16", "llvm.x86.avx2.pmadd.ub.sw", T.reinterpret("int8x32", w32), xb)


def flush16(acc16):
    """int16x32 of madd16_avx2 -> int32x16 row sums (vpmaddwd with ones adds each row's two pair sums)."""
    parts = [widen16(h) for h in _halves(acc16, 2, 16)]
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
    xb = _xb32(xq, off)
    ax = T.call_llvm_pure_intrin("int8x32", "llvm.x86.avx2.psign.b", xb, xb)  # |x| (x = -128 never occurs)
    parts = []
    for h in _halves(w, 2, 32):
        sw = T.call_llvm_pure_intrin("int8x32", "llvm.x86.avx2.psign.b", h, xb)
        p = T.call_llvm_pure_intrin("int16x16", "llvm.x86.avx2.pmadd.ub.sw", ax, sw)
        parts.append(widen16(p))
    return acc + T.Shuffle(parts, list(range(16)))


def dot4_signed_half_avx2(acc8, w32, xq, off):
    """dot4_signed_avx2 on one 8-row half: acc8 (int32x8) + the int8x32 signed codes w32 times xq[off:off+4]."""
    xb = _xb32(xq, off)
    ax = T.call_llvm_pure_intrin("int8x32", "llvm.x86.avx2.psign.b", xb, xb)
    sw = T.call_llvm_pure_intrin("int8x32", "llvm.x86.avx2.psign.b", w32, xb)
    p = T.call_llvm_pure_intrin("int16x16", "llvm.x86.avx2.pmadd.ub.sw", ax, sw)
    return acc8 + widen16(p)


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


def _act_blocks(cpu, g: _Geo, corr_mul: int, scaled_sum: bool = False):
    """Macro: x f32[T, K] -> xq int8 [T*K], dx f32 [T*KB], cr int32 [T*KB] (= corr_mul * block sum of xq; scaled_sum:
    cr f32, the block sum times dx, what a minimum multiplies)."""
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
                if scaled_sum:
                    cr[t * KB + kb] = T.Cast(F32, hsum(si, VL)) * dx[t * KB + kb]
                else:
                    cr[t * KB + kb] = hsum(si, VL) * corr_mul

    return act


def offset_start(Tt: int, NA: int, KB: int, trow):
    """Macro start(iacc, cr, tb, kb): block kb's int sums of token tile tb start at the activation pass's negated offset
    term (cr: -offset * sum xq; a token's first accumulator of NA) and 0, so that the epilogue needs no subtract per
    token and block (the same integers as subtracting after: the same bits). trow(tb, ti): a tile row's token."""
    @T.macro
    def start(iacc, cr, tb, kb):
        for ti in T.unroll(Tt):
            for l in T.vectorized(16):
                iacc[ti * NA * 16 + l] = cr[trow(tb, ti) * KB + kb]
            for a in T.unroll(NA - 1):
                for l in T.vectorized(16):
                    iacc[(ti * NA + 1 + a) * 16 + l] = 0

    return start


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


# Kernels for up to this many tokens (decode, the verify pass of speculative decoding, short prompt tails) stream
# each weight from DRAM once, so they prefetch ahead of their loads as the GEMV does: on a Sapphire Rapids VM the
# 8-token kernels ran 1.4-2x faster with it (the hardware prefetcher alone left DRAM idle during the dot products);
# prefill's larger chunks re-read each panel from cache and are compute bound.
STREAM_TOKENS = 32


def stream_prefetch(cpu, T_: int) -> int:
    """Software-prefetch distance (bytes) of a T_-token quantized linear: cpu.prefetch_bytes, or 0 for prefill."""
    return cpu.prefetch_bytes if T_ <= STREAM_TOKENS else 0


def stream_locality(cpu, T_: int) -> int:
    """Where a T_-token quantized linear's prefetches put the weight stream: the GEMV's and the small-batch GEMM's
    places differ by host (targets.registry.host_prefetch)."""
    return cpu.prefetch_locality if T_ == 1 else cpu.batch_prefetch_locality


def _tt(path, T_, vnni_tt, mm=False, avx2_tt=2):
    """Tokens per register block of the prefill GEMM (AVX-512 and NEON have 32 vector registers; SMMLA works on
    token pairs, a ragged last pair repeats the last token; AVX2: avx2_tt, the kernel family's measured best)."""
    if mm:
        return 4 if T_ >= 3 else 2
    return 1 if T_ == 1 else min(T_, vnni_tt if path == "vnni" else 4 if path == "sdot" else avx2_tt)


def token_tiles(path, T_, vnni_tt, mm=False, avx2_tt=2, tiered=False):
    """[(lo, hi, Tt)]: a panel whose real rows number n (lo < n <= hi) runs in token tiles of Tt. One tile unless
    `tiered` (a row-limited variant, rows.py): a verify pass of 2 tokens in an 8-token program then runs a 2-token
    tile instead of 8 rows' work (the tb guard alone cannot skip rows inside one tile), 3-4 tokens a 4-token tile,
    5-6 a 6-token tile, as far as these are smaller than the family's own tile Tt; more rows run in blocks of Tt,
    each only where it holds a real row."""
    Tt = _tt(path, T_, vnni_tt, mm, avx2_tt)
    sizes = [t for t in TIER_TILES if t < Tt]
    if not tiered or not sizes:
        return [(0, T_, Tt)]
    return [(lo, t, t) for lo, t in zip([0] + sizes, sizes)] + [(sizes[-1], T_, Tt)]


# the smaller token tiles of a tiered kernel (passes of up to 2, 4, 6 real rows). Not above the family's tile: a
# 6-token tile in row-scaled q8's kernel (tile 4) made its other tiles 1.3-1.5x slower (more of LLVM's hoisted
# values live across all of them), though it ran 6 rows faster than two 4-token blocks
TIER_TILES = (2, 4, 6)


def _use_mmla(cpu, path, T_) -> bool:
    """Prefill GEMMs on aarch64 with i8mm use SMMLA (2 tokens x 2 rows x 8 k per instruction); decode keeps SDOT."""
    return path == "sdot" and T_ > 1 and "i8mm" in getattr(cpu, "features", ())


# ---------------------------------------------------------------------------------------- q8 / q4 kernels
