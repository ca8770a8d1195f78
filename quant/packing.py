r"""The packed weight layout the quantized schemes share, and the exact activation quantization of their kernels.

numpy only (no TVM). Each scheme's own quantize / pack / dequantize / `linear_*_ref` (the float64 model of its
kernel, used by compiler/ops/reference.py) lives in its module (quant/q8.py, q4.py, q6.py, t2.py) and builds on
what is here: the row panels (interleave_rows), code packing (pack_codes / unpack_codes, LAYOUTS), group-scale
packing, activation quantization and integer block sums. The compiler's kernels (compiler/ops/linear_quant.py)
read exactly these layouts and import the constants below.

Row panels
----------
All packed weights are stored as arrays with a *nominal* shape [N, K * bits / 8] (and scales [N, ...]), so N
and K can be read back from the shapes, but the bytes are interleaved in panels of NR = 16 output rows (the
last panel holds the R = N % 16 leftover rows when N is not a multiple of 16):

    panel p = rows 16p .. 16p+Rp-1            (Rp = 16, or R for the tail panel)
    panel byte base = 16p * BPR               (BPR = bytes per row = K * bits / 8)
    chunk c of panel p = 4 bytes per row, all Rp rows: base + c * 4*Rp + 4*r + b   (r = row in panel, b = 0..3)

         chunk 0                         chunk 1
       +-------+-------+-----+--------+-------+-------+-----+--------+
       | r0 b0..b3 | r1 b0..b3 | ... | r15 b0..b3 | r0 b0..b3 | ...
       +-------+-------+-----+--------+-------+-------+-----+--------+
        \___________ 64 bytes = one AVX-512 register ___________/

One chunk of a full panel is one 64-byte vector whose int32 lane r holds 4 consecutive-k codes of row r:
exactly the operand of one AVX-512 VNNI `vpdpbusd` (16 rows x 4 k, u8 weights x s8 activations broadcast),
of AVX2 `vpmaddubsw`+`vpmaddwd` (two 32-byte halves = rows 0-7, 8-15) and of ARM `sdot`/`udot` with an
indexed activation (four 16-byte quarters = rows 0-3, 4-7, ...). The outputs of a panel land in 16 f32
lanes: no horizontal reduction, no transposes.

What a chunk byte (row r, byte b) holds, per scheme (codes are unsigned):

    q8  : 1 code per byte            k = 4c + b                       code = q + 128   (q in -127..127)
    q4  : low nibble  k = 8c + b,    high nibble  k = 8c + 4 + b      code = q + 8     (q in -8..7)
    t2  : bits 2j..2j+1 hold k = 16c + 4j + b  (j = 0..3)             code = t + 1     (t in -1, 0, 1)

    q6  : per block of 32 k, 6 chunks: chunks 0-3 hold the low 4 bits of the codes as q4 does (k = 8c + b,
          8c + 4 + b), chunks 4-5 their high 2 bits as t2 does (chunk 4 + e, bits 2j..2j+1: k = 16e + 4j + b)
                                                                      code = q + 32    (q in -32..31)

so unpacking nibble h / bit pair j of a whole chunk (one shift + one and per 64 bytes) gives a VNNI operand
for the 4 consecutive activations k0..k0+3 (q4: k0 = 8c + 4h; t2: k0 = 16c + 4j).

Scales: q8 per row f32 [N] in natural order; q4 per (row, group of G along K) f16 with nominal shape
[N, K/G], interleaved in the same panels (panel base 16p * K/G, then group-major: base + g * Rp + r, so the 16
scales of a panel for one group are one contiguous 32-byte load); q6 the same with G = 32; t2 one f32 scale per
tensor, shape [1].

Activations (inside the kernels, once per call; the numpy functions below are bit-exact models)
------------------------------------------------------------------------------------------------
q8 / q4 / q6: int8 per block of QA = 32 consecutive k of each token (absmax; like llama.cpp's Q8_0 activations):
    amax = max(max|x_blk|, 1e-30);  inv = 127 / amax  (f32);  xq = rint(x * inv)  (f32 multiply, round half
    to even);  dx = amax / 127  (f32)
  y[t, n] = sum_blocks dx[t, b] * s[n, b] * sum_{k in b} q[n, k] * xq[t, k]       (s = row or group scale)
t2: int8 per token (absmax over all K; BitNet b1.58), with BitNet's clamp 1e-5:
    amax = max(max|x_t|, 1e-5); inv = 127 / amax; xq = rint(x * inv); dx = amax / 127
  y[t, n] = dx[t] * scale * sum_k t[n, k] * xq[t, k]
The integer sums are exact (int32 in the kernels), so the kernels equal these references up to the f32
rounding of the scale products and the order of the float summation over blocks.
"""
from __future__ import annotations

import numpy as np

NR = 16            # rows per panel
QA = 32            # activation quantization block (q8 / q4)
EPS_BLOCK = 1e-30  # absmax clamp of q8/q4 activation blocks (only avoids 127/0)
EPS_TOKEN = 1e-5   # absmax clamp of t2 per-token activations (BitNet / transformers BitLinear)

# code layouts of the chunk-packed schemes, and q6's block layout (its packing is quant/q6.py); the kernels
# (compiler/ops/linear_quant.py) read these constants. scheme: (bits per code, k per chunk, code offset)
LAYOUTS = {"q8": (8, 4, 128), "q4": (4, 8, 8), "q4u": (4, 8, 0), "t2": (2, 16, 1)}   # (bits, k per chunk, code offset)
Q6_LAYOUT = "q6"   # the name of q6's block layout in KernelTraits.layout (quant/q6.py)
Q6_GROUP = 32      # q6: scale group along K = the activation block (one 6-chunk block per group)
Q6_CHUNKS = 6      # q6: chunks per 32-k block (4 low-nibble + 2 high-bit-pair chunks)


# ----------------------------------------------------------------------------------------------- panels
def _panels(n_rows: int):
    """(start row, rows) of each panel."""
    return [(p, min(NR, n_rows - p)) for p in range(0, n_rows, NR)]


def interleave_rows(a: np.ndarray, unit: int) -> np.ndarray:
    """[N, M] row-major -> same shape, panel-interleaved: in each panel of NR rows (Rp in the tail), the
    elements are ordered [M / unit][Rp][unit]."""
    N, M = a.shape
    assert M % unit == 0
    out = np.empty(a.size, a.dtype)
    for p, rp in _panels(N):
        blk = a[p:p + rp].reshape(rp, M // unit, unit).transpose(1, 0, 2)
        out[p * M:(p + rp) * M] = blk.reshape(-1)
    return out.reshape(N, M)


def deinterleave_rows(a: np.ndarray, unit: int) -> np.ndarray:
    """Inverse of interleave_rows."""
    N, M = a.shape
    flat = a.reshape(-1)
    out = np.empty((N, M), a.dtype)
    for p, rp in _panels(N):
        out[p:p + rp] = flat[p * M:(p + rp) * M].reshape(M // unit, rp, unit).transpose(1, 0, 2).reshape(rp, M)
    return out


# ------------------------------------------------------------------------------------------ code packing
def _check_codes(codes: np.ndarray, scheme: str):
    bits, kpc, _ = LAYOUTS[scheme]
    if codes.ndim != 2 or codes.shape[1] % kpc:
        raise ValueError(f"{scheme}: codes must be [N, K] with K % {kpc} == 0, got {codes.shape}")
    if codes.min(initial=0) < 0 or codes.max(initial=0) >= (3 if scheme == "t2" else 1 << bits):
        raise ValueError(f"{scheme}: codes out of range")


def pack_codes(codes: np.ndarray, scheme: str) -> np.ndarray:
    """Unsigned codes [N, K] (q8: 0..255, q4: 0..15, t2: 0..2) -> packed uint8 [N, K * bits / 8]."""
    _check_codes(codes, scheme)
    bits, kpc, _ = LAYOUTS[scheme]
    N, K = codes.shape
    c = codes.astype(np.uint8).reshape(N, K // kpc, kpc // 4, 4)   # [n, chunk, sub (nibble / bit pair), b]
    shifts = (np.arange(kpc // 4, dtype=np.uint8) * bits)[None, None, :, None]
    rowbytes = np.bitwise_or.reduce(c << shifts, axis=2).reshape(N, K * bits // 8)   # [n, chunk * 4 + b]
    return interleave_rows(rowbytes.astype(np.uint8), 4)


def unpack_codes(packed: np.ndarray, scheme: str) -> np.ndarray:
    """Packed uint8 [N, K * bits / 8] -> unsigned codes uint8 [N, K]."""
    bits, kpc, _ = LAYOUTS[scheme]
    N, BPR = packed.shape
    K = BPR * 8 // bits
    rowbytes = deinterleave_rows(np.asarray(packed, np.uint8), 4).reshape(N, K // kpc, 1, 4)
    shifts = (np.arange(kpc // 4, dtype=np.uint8) * bits)[None, None, :, None]
    return ((rowbytes >> shifts) & np.uint8((1 << bits) - 1)).reshape(N, K)


def stack_rows(arrays, unit: int) -> np.ndarray:
    """Row-wise concatenation of panel-interleaved arrays (interleave_rows with `unit`), i.e. the packing of the
    stacked matrices: a plain concatenation while every array but the last fills whole panels, else re-interleaved
    (a matrix of N % NR rows ends in a compact tail panel)."""
    if all(a.shape[0] % NR == 0 for a in arrays[:-1]):
        return np.concatenate(arrays)
    return interleave_rows(np.concatenate([deinterleave_rows(a, unit) for a in arrays]), unit)


def pack_group_scales(s: np.ndarray) -> np.ndarray:
    """Group scales [N, K/G] (row-major) -> panel-interleaved [N, K/G] (same dtype)."""
    return interleave_rows(s, 1)


def unpack_group_scales(s: np.ndarray) -> np.ndarray:
    return deinterleave_rows(s, 1)


# --------------------------------------------------------------------- activations (shared by the references)
def quantize_act_blocks(x: np.ndarray, qa: int = QA):
    """x f32 [T, K] -> (xq int8-valued int32 [T, K], dx f32 [T, K/qa]); bit-exact model of the kernels."""
    x = np.asarray(x, np.float32)
    Tn, K = x.shape
    xb = x.reshape(Tn, K // qa, qa)
    amax = np.maximum(np.abs(xb).max(axis=2), np.float32(EPS_BLOCK))
    inv = np.float32(127) / amax
    xq = np.rint(xb * inv[..., None]).astype(np.int32).reshape(Tn, K)
    return xq, amax / np.float32(127)


def quantize_act_token(x: np.ndarray):
    """x f32 [T, K] -> (xq [T, K], dx f32 [T]); per-token absmax (t2)."""
    x = np.asarray(x, np.float32)
    amax = np.maximum(np.abs(x).max(axis=1), np.float32(EPS_TOKEN))
    inv = np.float32(127) / amax
    return np.rint(x * inv[:, None]).astype(np.int32), amax / np.float32(127)


def _block_sums(xq: np.ndarray, q: np.ndarray, qa: int):
    """Exact integer block dot products as float64 [T, N, K/qa] (float64 matmul of small ints is exact)."""
    Tn, K = xq.shape
    N = q.shape[0]
    xb = xq.reshape(Tn, K // qa, qa).transpose(1, 0, 2).astype(np.float64)   # [b, T, qa]
    qb = q.reshape(N, K // qa, qa).transpose(1, 2, 0).astype(np.float64)      # [b, qa, N]
    return np.matmul(xb, qb).transpose(1, 2, 0)


def _bias(y, bias):
    return y if bias is None else y + np.asarray(bias, np.float64)
