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
T > 1 (prefill GEMM): inside a panel, Tt tokens at a time (AVX-512: 8; AVX2: 8 for q4 and group-scaled q8, 4 for
row-scaled q8 up to 8 tokens, else 2; NEON: 4): a weight chunk is loaded and unpacked once and feeds Tt dot
products (register block of Tt int32 + Tt f32 accumulators); ragged token blocks clamp their rows and guard the
stores. Row-limited variants (speculation's verify pass, rows.py) hold one panel code per range of real rows, in
tiles of 2, 4, 6 and then Tt tokens (quant_common.token_tiles), so a pass of 2 tokens in an 8-token program
computes 2 rows, not a tile of 8. Up to STREAM_TOKENS tokens (speculation's verify pass, prompt tails) the weights
still stream from DRAM once per call, so those kernels prefetch as decode does (the 1B q8 verify pass: 1.9 -> 1.55
decode steps for 8 tokens); what is left is compute: 8 tokens are 8 vpdpbusd per 64 weight bytes, about what
32 GB/s delivers, so their cost can overlap the stream but not vanish.
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

from .linear_block import block_kernel, q6_kernel
from .linear_naive import naive
from .linear_t2 import t2_kernel, t2_lut_kernel
from .quant_common import _Geo, path_for  # noqa: F401 (compiler/opencl, tests, bench)
from .segments import split_output

# The kernel makers by family: a scheme names its ops and their traits (quant/: Scheme.kernel_ops, KernelTraits),
# the traits name the family whose kernels read that layout; each family's kernels live in their own module
# (linear_block.py: the q8/q4 chunk layouts and q6, linear_t2.py: t2, linear_naive.py: the reference TIR of all).
# A new layout: its module and its row here. maker(cpu, traits, T, N, K, G, bias, n_scales, tiered) -> prim_func
# (tiered: the row-limited variant, which may hold one panel code per range of real rows: rows.py ROWS_TIER)
FAMILIES = {
    "block": lambda cpu, tr, T_, N, K, G, bias, ns, tiered: block_kernel(cpu, tr, T_, N, K, tr.group_of(G), bias, tiered),
    "q6": lambda cpu, tr, T_, N, K, G, bias, ns, tiered: q6_kernel(cpu, T_, N, K, bias),
    "t2": lambda cpu, tr, T_, N, K, G, bias, ns, tiered: t2_kernel(cpu, T_, N, K, bias, ns),
    "t2_lut": lambda cpu, tr, T_, N, K, G, bias, ns, tiered: t2_lut_kernel(cpu, T_, N, K, bias, ns),
}


def make(traits, cpu, T_: int, N: int, K: int, G: int | None = None, bias: bool = False, segs=(), tiered=False):
    """traits: the op's KernelTraits. segs (row counts summing to N): the packed W stacks several matrices (q/k/v,
    gate/up) and each one's rows go to its own output, out_s f32[T, N_s] (the last args, in order); a per-matrix
    scale (t2) is then f32[nseg], one per matrix. () keeps the single output. tiered: for limit_rows (rows.py)."""
    if traits.family not in FAMILIES:
        raise ValueError(f"no CPU kernels for the {traits.family!r} family")
    func = FAMILIES[traits.family](cpu, traits, T_, N, K, G, bias, max(1, len(segs)), tiered)
    if not segs:
        return func
    return split_output(func, segs, seg_param=2 if traits.scale == "matrix" else None)


def make_naive(traits, T_: int, N: int, K: int, G: int | None = None, bias: bool = False, segs=()):
    func = naive(traits, T_, N, K, traits.group_of(G), bias, segs)
    return split_output(func, segs) if segs else func
