"""attention: causal GQA attention over a KV prefix of symbolic length S (int64 var "S").

q f32[T, NH, D], k f32[S, KVH, D], v f32[S, KVH, D] -> out f32[T, NH*D].
Query t sits at absolute position n_t - 1 = S - T + t and attends keys j < n_t; k/v rows past that are
never read (they may hold padding or garbage). Head h uses kv head h // (NH // KVH); scale 1/sqrt(D).
Sliding window W > 0 (Mistral, Qwen2/3 sliding layers): query t attends only keys max(0, n_t - W) <= j < n_t.
Soft-capping cap > 0 (Gemma 2): each scaled score s becomes cap * tanh(s / cap) before the softmax.

Schedule (hand-written TIR):
- One parallel task per block of R = Gb heads (of one GQA group) x Tq consecutive queries; tasks are
  ordered kv-head-major, so each thread gets a balanced mix of short and long causal rows. Decode's head blocks
  are the largest divisor of the group that spreads evenly over the threads (decode_blocking); where none does,
  each row's keys run in P segments (below).
- Online (flash-decoding style) softmax over chunks of C = max(16, VL) keys. For each chunk the task loops over its
  R rows, so the chunk's k/v rows are loaded from memory once and reused from L1 by all rows of the
  block (GQA heads and prefill queries share them).
- Per row and full chunk: C partial-sum vectors of q.k (VD lanes over D), reduced together by one
  transpose-reduce shuffle tree into a C-lane score vector (~2 shuffles per key instead of a full
  horizontal sum each; half a chunk at a time where the halves' trees are apart). The row's last, partial chunk
  uses per-key dot products; invisible keys keep
  the score -3e38 (exp -> exactly 0) and are never loaded.
- Then running max m, rescale alpha = exp(m_old - m_new), p = exp(s - m_new) vectorized over the chunk
  (polynomial exp, no libm), acc += p * v[j] with the row's D-lane accumulator held in a stack buffer.
- Window (W > 0, a separate code path; W = 0 generates exactly the full-causal kernel): the chunk loop starts
  at the chunk holding the lowest key the block's first query sees, so a task costs O(W + Tq) keys whatever S
  is; a chunk that a row's window starts inside takes the partial-chunk path, its keys below the window keep
  the score -3e38 and are never loaded.
- Key segments (P > 0, W = 0): a row that sees n keys splits them into segments of whole chunks, a function of n
  alone; decode runs each (head block, segment) as a task writing its softmax state (max, sum, weighted values) to a
  workspace, then one task per head block folds them in order. Prefill and verify rows close the same segments
  inside their chunk loops and fold alike, so every row keeps decode's rounding.
- Scratch is constant-size per task (nothing depends on S): stack allocas when < 1 KiB, otherwise one
  TVMBackendAllocWorkspace per task (q/acc rows when R*D >= 256).
"""
from __future__ import annotations

import math

from tvm.script import tirx as T

from ._util import (
    F32, STACK, VIEW_ALIGN, concat_vecs, fast_exp, fast_tanh, hsum, let_wrap, pow2_divisor, prefetch, tree_reduce, vhmax,
    vhsum,
)
from .kv_quant import PER_HEAD_SCALE, ROTATED, ROW_WRITERS, QRows, hadamard_in_place, rotation_block, row_bytes, scale_view

NEG = -3.0e38


def kv_load(buf, j, kh, d):
    """A K or V element as float32 (a float16 cache's widened exactly: vcvtph2ps / fcvtl when vectorized; a q8
    cache's code widened and multiplied by its head's scale)."""
    if isinstance(buf, QRows):
        return buf.load(j, kh, d)
    return buf[j, kh, d] if buf.dtype == F32 else T.Cast(F32, buf[j, kh, d])


def kv_elem(buf, j, kh, d):
    """What the dot products multiply: kv_load, but a q8 cache's bare code (its row's scale applies once per key:
    row_scaled)."""
    if isinstance(buf, QRows) and buf.per_head:
        return buf.code(j, kh, d)
    return kv_load(buf, j, kh, d)


def row_scaled(buf, v, j, kh):
    """v times key j's scale where kv_elem left it out (q8: one multiply per key instead of one per element)."""
    if isinstance(buf, QRows) and buf.per_head:
        return v * buf.scale(j, kh)
    return v


def dot_part(Kc, qs, qoff, j, kh, l, VD, ND):
    """Lane l (< VD) of the partial sums of q . k[j]: sum over d = l, l + VD, ... (used inside a loop
    vectorized over l)."""
    p = None
    for dc in range(ND):
        term = qs[qoff + dc * VD + l] * kv_elem(Kc, j, kh, dc * VD + l)
        p = term if p is None else p + term
    return p


def chunk_scores(pv0, pv1, C, VD):
    """C-lane vector of full sums of the partial-sum vectors of C keys (keys < C/2 in pv0, rest in pv1;
    two buffers so each stays under the 1 KiB stack-allocation limit)."""
    h = C // 2
    vecs = [pv0[T.Ramp(jj * VD, 1, VD)] for jj in range(h)] + [pv1[T.Ramp(jj * VD, 1, VD)] for jj in range(h)]
    outs, binds = tree_reduce(vecs, VD)
    return let_wrap(concat_vecs(outs, VD), binds)


def half_scores(pv, C, VD):
    """The C/2-lane vector of full sums of half a chunk's keys' partial-sum vectors: chunk_scores' lanes of that half,
    the same shuffles and adds (its tree pairs no vector of one half with one of the other where VD divides C/2)."""
    outs, binds = tree_reduce([pv[T.Ramp(jj * VD, 1, VD)] for jj in range(C // 2)], VD)
    return let_wrap(concat_vecs(outs, VD), binds)


def blocking(cpu, T_: int, NH: int, KVH: int, P: int = 0):
    """(Gb, Tq): heads and queries per task."""
    G = NH // KVH
    nt = max(1, cpu.num_threads)
    if T_ == 1:
        gb, p = decode_blocking(nt, NH, KVH)
        if not p or P:   # balanced by head blocks, or split into key segments (P)
            return gb, 1
    Tq = next(c for c in (8, 4, 2, 1) if T_ % c == 0)
    Gb = next(c for c in (8, 4, 2, 1) if G % c == 0)
    # keep enough tasks for the threads: prefill's causal rows have unequal cost, so aim for >= 4 per thread; in
    # decode all rows cost the same and one task per kv head is best: each task streams its head's K/V rows
    # (evicted from the caches by the weight stream between layers) once, instead of once per head block
    min_tasks = nt if T_ == 1 else 4 * nt
    while Gb * Tq > 1 and KVH * (G // Gb) * (T_ // Tq) < min_tasks:
        if Tq >= Gb and Tq > 1:
            Tq //= 2
        else:
            Gb //= 2
    while Gb * Tq > 8:
        if Tq > 1:
            Tq //= 2
        else:
            Gb //= 2
    return Gb, Tq


# Key segments (P > 0, full causal attention only): a decode step whose head blocks cannot keep every thread busy
# (3 kv heads on 2 threads, say) splits each row's keys into up to P segments run as tasks of their own, each with
# its own online softmax, then folds them in order. Segments are a function of the row's key count n alone:
# nseg = clamp(n_chunks // SEG_MIN_CHUNKS, 1, P) segments of ceil(n_chunks / nseg) chunks, so a prefill or verify
# row at that position (run in one task) closes its segments at the same chunks and folds them alike: its sums
# round as the decode step's do (the verify program's rows stay bitwise decode's).
SEG_MIN_CHUNKS = 4
# decode reads the cache from memory (the weight stream evicts it between layers): its chunk loops prefetch the K/V rows
# of the chunk after the one they compute (SmolLM2 on a Sapphire Rapids-class Xeon, 900 keys: attention 1.77 -> 1.41 ms
# a step; 2 or 4 chunks ahead, or into L2 only, measured slower), into the cache level the target names
# (cpu.kv_prefetch_locality: L1 on Intel, L2 on AMD, targets.registry.host_prefetch)
PF_CHUNKS = 1
SPLIT_MAX = 8


def decode_blocking(nt: int, NH: int, KVH: int) -> tuple[int, int]:
    """(Gb, P) of a decode step on nt threads: the largest head block (a divisor of the GQA group, <= 8: its rows
    share each K/V chunk from L1) whose tasks spread evenly over the threads, P = 0; if none does, the largest block
    and the fewest key segments P that even them out (or SPLIT_MAX)."""
    G = NH // KVH
    divs = [d for d in range(min(G, 8), 0, -1) if G % d == 0]
    for gb in divs:
        if KVH * (G // gb) % nt == 0:
            return gb, 0
    tasks = KVH * (G // divs[0])
    return divs[0], next((p for p in range(2, SPLIT_MAX + 1) if tasks * p % nt == 0), SPLIT_MAX)


def split_for(cpu, NH: int, KVH: int) -> int:
    """The key segments (P, 0: none) of a package's full-causal attention kernels on this target."""
    return decode_blocking(max(1, cpu.num_threads), NH, KVH)[1]


def make(cpu, T_: int, NH: int, KVH: int, D: int, simple: bool = False, W: int = 0, cap: float = 0.0,
         M: bool = False, KV: str = F32, VKV: str = "", rows: bool = False, P: int = 0):
    """simple=True: one row per task, per-key dot products only (fallback).
    W > 0: sliding window, query t attends keys max(0, n_t - W) <= j < n_t; W = 0: full causal attention.
    cap > 0: scores soft-capped to cap * tanh(s / cap) (cap = 0 generates exactly the kernel without it).
    M: a token tree (the verify program of speculative decoding): an extra int32 arg tree[T + 1, T] before the output.
    tree[0, t] is query t's depth d (its position is n0 + d, n0 = S - T the keys before the batch) and tree[1 + t, i]
    (i <= d) the batch row of its ancestor at depth i (tree[1 + t, d] = t). The row attends the keys a decode step at
    its position would see, in the same order and the same chunks (key n0 + i of that sequence is batch row
    tree[1 + t, i]), so that its sums round exactly as decode's do: a tree's rows are then bitwise those of decoding
    their paths wherever the kernels of one token are. M = False generates exactly the kernel without it.
    KV: the K/V caches' element type (float32, or float16: each element widened as it is read; the sums stay f32; or
    q8 / q4: codes and scales, each element dequantized as it is read, kv_quant.py: k/v int8[S, row bytes]); VKV: the
    V cache's where it differs from the K cache's (both float or both quantized; "": KV's).
    rows (with M): an extra int32 arg cnt[1, 16] after the output; only the query blocks holding a row < cnt[0, 0]
    run, and the output rows past it are zeros (the verify program's passes of fewer drafts: rows.limit_tasks).
    P > 0 (full causal attention, W = 0): each row's keys in up to P segments (SEG_MIN_CHUNKS above): a decode kernel
    runs them as tasks of their own, the others fold them inside their rows' chunk loops (P = 0: exactly the kernel
    without segments)."""
    if NH % KVH != 0:
        raise ValueError(f"NH={NH} not a multiple of KVH={KVH}")
    VL = cpu.vector_lanes
    G = NH // KVH
    C = max(16, VL)  # keys per chunk (amortizes the per-chunk softmax bookkeeping)
    VD = pow2_divisor(D, VL)  # lanes of the q.k partial sums
    ND = D // VD
    scale = 1.0 / math.sqrt(D)
    if not 0 <= P <= SPLIT_MAX:
        raise ValueError(f"key segments P={P} must be in 0..{SPLIT_MAX}")
    segmented = P > 0 and W == 0
    split = segmented and T_ == 1 and not M and not simple   # decode: segments run as tasks (body_split)
    Gb, Tq = (1, 1) if simple else blocking(cpu, T_, NH, KVH, P if segmented else 0)
    tree = not simple and VD >= 2  # the shuffle tree needs vectors
    R = Gb * Tq
    NHB = G // Gb  # head blocks per kv head
    NTB = T_ // Tq  # query blocks
    if rows and not M:
        raise ValueError("attention: rows takes a token tree (the verify program's)")

    def limited(func):
        from .rows import limit_tasks
        # a task's row r is query t0 + r % Tq of head h0 + r // Tq
        return limit_tasks(func, T_, func.params[-1], R, lambda task, r: task % NTB * Tq + r % Tq) if rows else func
    ntask = KVH * NHB * NTB
    if W < 0:
        raise ValueError(f"window W={W} must be >= 0")
    windowed = W > 0  # a Python bool: the parser keeps only the taken branch, W = 0 gives the unwindowed kernel
    # chunk scores times each key's row scale (kv_elem gave the bare codes' sums): a per-head scale (q8)
    scaled_keys = PER_HEAD_SCALE.get(KV, False)
    # a cache of Hadamard-rotated heads (q4, kv_quant.py): queries rotated alike, the output rotated back
    VK = VKV or KV
    rotated, norm = ROTATED.get(KV, False), 1.0 / math.sqrt(rotation_block(D))   # the queries (K's rows)
    rotated_v = ROTATED.get(VK, False)   # the output (V's rows)
    fwht = hadamard_in_place(D)

    def capped(v):
        """A computed score, soft-capped (the -3e38 of an invisible key is never passed here)."""
        return T.float32(cap) * fast_tanh(v * T.float32(1.0 / cap)) if cap > 0 else v

    # decode and a verify pass's tree prefetch the K/V rows PF_CHUNKS chunks ahead (float caches, on targets that
    # prefetch the weight stream): both read the cache from memory once, a tree's rows sharing each chunk
    eb = 2 if KV == "float16" else 4
    pf_lines = max(1, D * eb // 64) if ((T_ == 1 or M) and cpu.prefetch_bytes > 0 and KV in (F32, "float16")
                                        and VKV in ("", KV)) else 0

    @T.macro
    def prefetch_chunk(Kc, Vc, c, kh, n):
        """The cache lines of the rows of chunk c + PF_CHUNKS (clamped to the last of the n keys) of kv head kh."""
        if pf_lines > 0:
            for jj in range(C):
                for ln in T.unroll(pf_lines):
                    prefetch(Kc, (T.min((c + PF_CHUNKS) * C + jj, n - 1), kh, ln * (64 // eb)), cpu.kv_prefetch_locality)
                    prefetch(Vc, (T.min((c + PF_CHUNKS) * C + jj, n - 1), kh, ln * (64 // eb)), cpu.kv_prefetch_locality)

    def key(TR, t0, r, v, n0, direct=False):
        """The cache row of key v of the sequence of block row r (query t0 + r % Tq; M: past the prefix, its
        ancestor's batch row). direct: v is known to lie before the batch (its own row: no lookup)."""
        if not M or direct:
            return v
        t = t0 + r % Tq
        return T.if_then_else(v < n0, v, n0 + TR[1 + t, T.min(T.max(v - n0, 0), T_ - 1)])

    def n_seen(TR, t, n_slot, n0):
        """The keys row t sees: n_slot (causal by its row) or, in a tree, those up to its depth's position."""
        return n0 + TR[0, t] + 1 if M else n_slot

    def n_chunks(n):
        return (n + (C - 1)) // C

    def seg_chunks(n):
        """Chunks per key segment of a row that sees n keys (all of them when it has one segment)."""
        nseg = T.max(T.min(n_chunks(n) // SEG_MIN_CHUNKS, P), 1)
        return (n_chunks(n) + nseg - 1) // nseg

    def next_end(TR, t0, r, nmax, n0, c, cps):
        """The chunk where row r's next key segment starts after chunk c's (a sentinel past its last)."""
        return T.if_then_else(c + cps < n_chunks(n_seen(TR, t0 + r % Tq, nmax - Tq + 1 + r % Tq, n0)), c + cps,
                              T.int32(0x7FFFFFFF))

    @T.macro
    def init_rows(Q, h0, t0, qs, acc, st):
        """The block's queries, scaled (and rotated for a rotated cache), and fresh softmax states."""
        for r in range(R):
            if rotated:
                for d in range(D):
                    qs[r * D + d] = Q[t0 + r % Tq, h0 + r // Tq, d]
                    acc[r * D + d] = T.float32(0)
                fwht(qs, r * D)
                for d in range(D):
                    qs[r * D + d] = qs[r * D + d] * T.float32(scale * norm)
            else:
                for dc in T.unroll(ND):
                    for l in T.vectorized(VD):
                        qs[r * D + dc * VD + l] = Q[t0 + r % Tq, h0 + r // Tq, dc * VD + l] * T.float32(scale)
                        acc[r * D + dc * VD + l] = T.float32(0)
            st[r * 4] = T.float32(NEG)
            st[r * 4 + 3] = T.float32(0)

    def whole(nv, j0):
        """Every key of the chunk visible (a window's start, j0 > 0, cuts it only in windowed kernels)."""
        return T.And(j0 == 0, nv == C) if windowed else nv == C

    def visible(jj, j0):
        """Key jj of a chunk past the window's start (always, in a kernel without a window: a Python True)."""
        return jj >= j0 if windowed else True

    # a chunk's scores half by half where the halves' shuffle trees are apart (VD divides C/2: AVX2, NEON): 8 partial
    # sums live at a time instead of 16, which with the query's vectors spilled accumulators on AVX2 (a verify pass's
    # tree attention, SmolLM2: 1.3x faster); the same sums, so the same bits
    halves = (C // 2) % VD == 0

    @T.macro
    def qk_scores(Kc, TR, t0, r, c, n0, kh, qs, pv0, pv1, dst, doff, direct):
        """Row r's scores of the C keys of chunk c, into dst[doff:doff + C] (direct: key's)."""
        if halves:
            for jj in range(C // 2):
                for l in T.vectorized(VD):
                    pv0[jj * VD + l] = dot_part(Kc, qs, r * D, key(TR, t0, r, c * C + jj, n0, direct), kh, l, VD, ND)
            dst[T.Ramp(doff, 1, C // 2)] = half_scores(pv0, C, VD)
            for jj in range(C // 2):
                for l in T.vectorized(VD):
                    pv1[jj * VD + l] = dot_part(Kc, qs, r * D, key(TR, t0, r, c * C + C // 2 + jj, n0, direct), kh, l,
                                                VD, ND)
            dst[T.Ramp(doff + C // 2, 1, C // 2)] = half_scores(pv1, C, VD)
        else:
            for jj in range(C // 2):
                for l in T.vectorized(VD):
                    pv0[jj * VD + l] = dot_part(Kc, qs, r * D, key(TR, t0, r, c * C + jj, n0, direct), kh, l, VD, ND)
                    pv1[jj * VD + l] = dot_part(Kc, qs, r * D, key(TR, t0, r, c * C + C // 2 + jj, n0, direct), kh, l,
                                                VD, ND)
            dst[T.Ramp(doff, 1, C)] = chunk_scores(pv0, pv1, C, VD)

    @T.macro
    def row_chunk(Kc, Vc, TR, t0, r, c, nv, j0, n0, kh, qs, acc, st, sc, part, ar, pv0, pv1):
        """Row r's online softmax over chunk c: its keys j0 <= jj < nv visible (j0 = 0 without a window)."""
        if tree and whole(nv, j0):  # full chunk: shuffle-tree scores
            qk_scores(Kc, TR, t0, r, c, n0, kh, qs, pv0, pv1, sc, 0, False)
            if scaled_keys:
                for jj in T.vectorized(C):
                    sc[jj] = row_scaled(Kc, sc[jj], key(TR, t0, r, c * C + jj, n0), kh)
            if cap > 0:
                for jj in T.vectorized(C):
                    sc[jj] = capped(sc[jj])
        else:  # a chunk cut by the causal end (or the window's start): per-key dot products, invisible keys stay -3e38
            for jj in T.vectorized(C):
                sc[jj] = T.float32(NEG)
            for jj in range(nv):  # not range(j0, nv): TVM 0.27 CompactBufferAllocation overflows int32 on it
                if visible(jj, j0):
                    for l in T.vectorized(VD):
                        part[l] = T.float32(0)
                    for dc in T.unroll(ND):
                        for l in T.vectorized(VD):
                            part[l] = part[l] + qs[r * D + dc * VD + l] * kv_elem(
                                Kc, key(TR, t0, r, c * C + jj, n0), kh, dc * VD + l)
                    sc[jj] = capped(row_scaled(Kc, hsum(part, VD), key(TR, t0, r, c * C + jj, n0), kh))
        st[r * 4 + 1] = T.max(st[r * 4], vhmax(sc, C))
        st[r * 4 + 2] = fast_exp(st[r * 4] - st[r * 4 + 1])
        for jj in T.vectorized(C):
            sc[jj] = fast_exp(sc[jj] - st[r * 4 + 1])
        st[r * 4 + 3] = st[r * 4 + 3] * st[r * 4 + 2] + vhsum(sc, C)
        st[r * 4] = st[r * 4 + 1]
        for dc in T.unroll(ND):
            for l in T.vectorized(VD):
                ar[dc * VD + l] = acc[r * D + dc * VD + l] * st[r * 4 + 2]
        for jj in range(nv):
            if visible(jj, j0):
                for dc in T.unroll(ND):
                    for l in T.vectorized(VD):
                        ar[dc * VD + l] = ar[dc * VD + l] + row_scaled(
                            Vc, sc[jj], key(TR, t0, r, c * C + jj, n0), kh) * kv_elem(
                            Vc, key(TR, t0, r, c * C + jj, n0), kh, dc * VD + l)
        for dc in T.unroll(ND):
            for l in T.vectorized(VD):
                acc[r * D + dc * VD + l] = ar[dc * VD + l]

    def block_macro(direct):
        """All R rows' online softmax over chunk c, every key of which each row sees: row_chunk's arithmetic for each
        row, run in phases over the rows (scores, then the softmax's max, exps and sum, then the weighted values) so
        that the rows' serial reductions (a chunk's max and sum, the scalar exp) overlap in the core instead of running
        one after another. The same operations in the same order per row: the same bits. direct: as row_chunk's."""
        @T.macro
        def block_chunk(Kc, Vc, TR, t0, c, n0, kh, qs, acc, st, scb, ar, pv0, pv1):
            for r in range(R):
                qk_scores(Kc, TR, t0, r, c, n0, kh, qs, pv0, pv1, scb, r * C, direct)
                if scaled_keys:
                    for jj in T.vectorized(C):
                        scb[r * C + jj] = row_scaled(Kc, scb[r * C + jj], key(TR, t0, r, c * C + jj, n0, direct), kh)
                if cap > 0:
                    for jj in T.vectorized(C):
                        scb[r * C + jj] = capped(scb[r * C + jj])
            for r in range(R):
                st[r * 4 + 1] = T.max(st[r * 4], vhmax(scb, C, r * C))
                st[r * 4 + 2] = fast_exp(st[r * 4] - st[r * 4 + 1])
                for jj in T.vectorized(C):
                    scb[r * C + jj] = fast_exp(scb[r * C + jj] - st[r * 4 + 1])
                st[r * 4 + 3] = st[r * 4 + 3] * st[r * 4 + 2] + vhsum(scb, C, r * C)
                st[r * 4] = st[r * 4 + 1]
            for r in range(R):
                for dc in T.unroll(ND):
                    for l in T.vectorized(VD):
                        ar[dc * VD + l] = acc[r * D + dc * VD + l] * st[r * 4 + 2]
                for jj in range(C):
                    for dc in T.unroll(ND):
                        for l in T.vectorized(VD):
                            ar[dc * VD + l] = ar[dc * VD + l] + row_scaled(
                                Vc, scb[r * C + jj], key(TR, t0, r, c * C + jj, n0, direct), kh) * kv_elem(
                                Vc, key(TR, t0, r, c * C + jj, n0, direct), kh, dc * VD + l)
                for dc in T.unroll(ND):
                    for l in T.vectorized(VD):
                        acc[r * D + dc * VD + l] = ar[dc * VD + l]
        return block_chunk

    block_chunk = block_macro(False)
    block_chunk_prefix = block_macro(True) if M else block_chunk

    @T.macro
    def fold(r, m, ls, A, aoff, cst, cacc):
        """Fold a closed key segment's softmax state (max m, sum ls, weighted values A[aoff:aoff + D]) into row r's
        running one (cst[r * 4]: max, cst[r * 4 + 1]: sum, cacc: values): the same arithmetic wherever a segment
        closes, in a task of its own (decode) or inside a row's chunk loop (prefill, verify)."""
        cst[r * 4 + 2] = T.max(cst[r * 4], m)
        cst[r * 4 + 3] = fast_exp(m - cst[r * 4 + 2])
        cst[r * 4] = fast_exp(cst[r * 4] - cst[r * 4 + 2])
        cst[r * 4 + 1] = cst[r * 4 + 1] * cst[r * 4] + ls * cst[r * 4 + 3]
        for dc in T.unroll(ND):
            for l in T.vectorized(VD):
                cacc[r * D + dc * VD + l] = cacc[r * D + dc * VD + l] * cst[r * 4] + A[aoff + dc * VD + l] * cst[r * 4 + 3]
        cst[r * 4] = cst[r * 4 + 2]

    @T.macro
    def finish(O, t0, h0, r, A, L, li, ar):
        """Row r's output: its weighted values A[r * D:] over their sum L[li] (left holding its reciprocal)."""
        L[li] = T.float32(1) / L[li]
        if rotated_v:   # the weighted sum of rotated values, rotated back
            for d in range(D):
                ar[d] = A[r * D + d]
            fwht(ar, 0)
            for d in range(D):
                O[t0 + r % Tq, (h0 + r // Tq) * D + d] = ar[d] * (L[li] * T.float32(norm))
        else:
            for dc in T.unroll(ND):
                for l in T.vectorized(VD):
                    O[t0 + r % Tq, (h0 + r // Tq) * D + dc * VD + l] = A[r * D + dc * VD + l] * L[li]

    @T.macro
    def zero_state(r, st, acc, slot):
        """Row r's softmax state empty (max -3e38, the sum in st[r * 4 + slot] 0, values 0): slot 1 for the running
        state before a row's first segment folds in, slot 3 for a new key segment's own state."""
        st[r * 4] = T.float32(NEG)
        st[r * 4 + slot] = T.float32(0)
        for dc in T.unroll(ND):
            for l in T.vectorized(VD):
                acc[r * D + dc * VD + l] = T.float32(0)

    @T.macro
    def body(Q, Kc, Vc, TR, O, S):
        for task in T.parallel(ntask):
            qs = T.alloc_buffer((R * D,), F32, scope="global", annotations=STACK)
            acc = T.alloc_buffer((R * D,), F32, scope="global", annotations=STACK)
            st = T.alloc_buffer((R * 4,), F32, scope="global", annotations=STACK)  # m, m_new, alpha, l
            sc = T.alloc_buffer((C,), F32, scope="global", annotations=STACK)
            scb = T.alloc_buffer((R * C if tree else 1,), F32, scope="global", annotations=STACK)
            part = T.alloc_buffer((VD,), F32, scope="global", annotations=STACK)
            ar = T.alloc_buffer((D,), F32, scope="global", annotations=STACK)
            pv0 = T.alloc_buffer((C // 2 * VD,), F32, scope="global", annotations=STACK)
            pv1 = T.alloc_buffer((C // 2 * VD,), F32, scope="global", annotations=STACK)
            cst = T.alloc_buffer((R * 4 if segmented else 1,), F32, scope="global", annotations=STACK)
            cacc = T.alloc_buffer((R * D if segmented else 1,), F32, scope="global", annotations=STACK)
            nb = T.alloc_buffer((R * 2 if segmented else 1,), "int32", scope="global", annotations=STACK)  # next end, step
            kh: T.let = task // (NHB * NTB)
            h0: T.let = kh * G + (task % (NHB * NTB)) // NTB * Gb
            t0: T.let = task % NTB * Tq
            nmax: T.let = T.Cast("int32", S) - T_ + t0 + Tq  # keys visible to the block's last query
            n0: T.let = T.Cast("int32", S) - T_  # keys before the batch
            init_rows(Q, h0, t0, qs, acc, st)
            if segmented:
                for r in range(R):
                    zero_state(r, cst, cacc, 1)
                    nb[r * 2 + 1] = seg_chunks(n_seen(TR, t0 + r % Tq, nmax - Tq + 1 + r % Tq, n0))
                    nb[r * 2] = next_end(TR, t0, r, nmax, n0, 0, nb[r * 2 + 1])
            if windowed:  # from the first chunk holding a key the block's first query sees
                # the lowest key any row of the block sees (a tree's rows sit at their depth, >= 0)
                c_lo: T.let = T.max((n_seen(TR, 0, nmax - Tq + 1, n0) - W) // C, 0)
                for c in range(c_lo, (nmax + (C - 1)) // C):
                    prefetch_chunk(Kc, Vc, c, kh, nmax)
                    for r in range(R):
                        # row r sees keys j0 + c * C <= j < nv + c * C of this chunk (0 <= j0, nv <= C)
                        n_r: T.let = n_seen(TR, t0 + r % Tq, nmax - Tq + 1 + r % Tq, n0)  # keys j < n_r are causal for row r
                        nv: T.let = T.min(C, n_r - c * C)
                        j0: T.let = T.max(n_r - W - c * C, 0)
                        if nv > j0:
                            row_chunk(Kc, Vc, TR, t0, r, c, nv, j0, n0, kh, qs, acc, st, sc, part, ar, pv0, pv1)
            else:  # full causal attention (W = 0: exactly the kernel without window support)
                for c in range((nmax + (C - 1)) // C):
                    if segmented:
                        for r in range(R):
                            if c == nb[r * 2]:   # row r's key segment ends: fold it, start the next
                                fold(r, st[r * 4], st[r * 4 + 3], acc, r * D, cst, cacc)
                                zero_state(r, st, acc, 3)
                                nb[r * 2] = next_end(TR, t0, r, nmax, n0, c, nb[r * 2 + 1])
                    prefetch_chunk(Kc, Vc, c, kh, nmax)
                    # a chunk every row of the block sees whole (of the keys before a tree's batch, whose rows are
                    # read in order; below the block's first query otherwise): its rows in phases
                    if tree and c * C + C <= (n0 if M else nmax - Tq + 1):
                        block_chunk_prefix(Kc, Vc, TR, t0, c, n0, kh, qs, acc, st, scb, ar, pv0, pv1)
                    else:
                        for r in range(R):
                            # keys of this chunk visible to row r (row r sees keys j < nmax - Tq + 1 + r % Tq)
                            nv: T.let = T.min(C, n_seen(TR, t0 + r % Tq, nmax - Tq + 1 + r % Tq, n0) - c * C)
                            if nv > 0:
                                row_chunk(Kc, Vc, TR, t0, r, c, nv, 0, n0, kh, qs, acc, st, sc, part, ar, pv0, pv1)
            for r in range(R):
                if segmented:
                    if nb[r * 2 + 1] < n_chunks(n_seen(TR, t0 + r % Tq, nmax - Tq + 1 + r % Tq, n0)):
                        # more than one segment: fold the last, the output from all
                        fold(r, st[r * 4], st[r * 4 + 3], acc, r * D, cst, cacc)
                        finish(O, t0, h0, r, cacc, cst, r * 4 + 1, ar)
                    else:
                        finish(O, t0, h0, r, acc, st, r * 4 + 3, ar)
                else:
                    finish(O, t0, h0, r, acc, st, r * 4 + 3, ar)

    # decode's tasks: one per key segment, each running every head block over its segment in turn, where the segments
    # alone spread evenly over the threads; else one per (head block, segment). A segment's rows of all kv heads lie
    # together in the cache (rows [S, KVH, D]), and one core reads them all: SmolLM2's decode steps 6% faster at 900
    # keys (3 kv heads on 2 threads: 2 tasks, not 6). Keys too few for P segments spread their head blocks instead
    # (one segment on one thread made steps at 100 keys 4% slower). Each row's chunks and folds are the same: the
    # same bits.
    BY_SEGMENT = P > 0 and P % max(1, cpu.num_threads) == 0

    @T.macro
    def body_split(Q, Kc, Vc, O, S):
        """Decode (T = 1) in key segments: each (head block, segment) its segment's softmax state into wml / wacc (in
        tasks by segment, or by both: BY_SEGMENT), then one task per head block folds them in order (one segment: the
        output directly)."""
        wml = T.alloc_buffer((KVH * NHB * P * R * 2,), F32, scope="global")
        wacc = T.alloc_buffer((KVH * NHB * P * R * D,), F32, scope="global")
        n: T.let = T.Cast("int32", S)
        cps: T.let = seg_chunks(n)
        for sp in T.parallel(P if BY_SEGMENT else KVH * NHB * P):
            qs = T.alloc_buffer((R * D,), F32, scope="global", annotations=STACK)
            acc = T.alloc_buffer((R * D,), F32, scope="global", annotations=STACK)
            st = T.alloc_buffer((R * 4,), F32, scope="global", annotations=STACK)  # m, m_new, alpha, l
            sc = T.alloc_buffer((C,), F32, scope="global", annotations=STACK)
            part = T.alloc_buffer((VD,), F32, scope="global", annotations=STACK)
            ar = T.alloc_buffer((D,), F32, scope="global", annotations=STACK)
            pv0 = T.alloc_buffer((C // 2 * VD,), F32, scope="global", annotations=STACK)
            pv1 = T.alloc_buffer((C // 2 * VD,), F32, scope="global", annotations=STACK)
            scb = T.alloc_buffer((R * C if tree else 1,), F32, scope="global", annotations=STACK)
            for gi in range(KVH * NHB if BY_SEGMENT else 1):
                # BY_SEGMENT: worker sp takes the (head block, segment) pairs k = gi * P + sp, numbered head block
                # major over the row's nseg segments: its own segment of every head block where nseg = P, every P-th
                # head block's where the keys make fewer segments (a short context's one segment stays spread)
                k: T.let = gi * P + sp
                nseg: T.let = (n_chunks(n) + cps - 1) // cps if BY_SEGMENT else P
                g: T.let = k // nseg   # head block
                seg: T.let = k % nseg
                task: T.let = g * P + seg   # its softmax state's slot in wml / wacc
                kh: T.let = g // NHB
                h0: T.let = kh * G + g % NHB * Gb
                if k < KVH * NHB * nseg and seg * cps < n_chunks(n):
                    init_rows(Q, h0, 0, qs, acc, st)
                    for c in range(seg * cps, T.min(seg * cps + cps, n_chunks(n))):
                        prefetch_chunk(Kc, Vc, c, kh, n)
                        if tree and c * C + C <= n:
                            block_chunk(Kc, Vc, Q, 0, c, 0, kh, qs, acc, st, scb, ar, pv0, pv1)
                        else:
                            for r in range(R):
                                row_chunk(Kc, Vc, Q, 0, r, c, T.min(C, n - c * C), 0, 0, kh, qs, acc, st, sc, part, ar, pv0,
                                          pv1)
                    if cps < n_chunks(n):
                        for r in range(R):
                            wml[(task * R + r) * 2] = st[r * 4]
                            wml[(task * R + r) * 2 + 1] = st[r * 4 + 3]
                            for dc in T.unroll(ND):
                                for l in T.vectorized(VD):
                                    wacc[(task * R + r) * D + dc * VD + l] = acc[r * D + dc * VD + l]
                    else:
                        for r in range(R):
                            finish(O, 0, h0, r, acc, st, r * 4 + 3, ar)
        if cps < n_chunks(n):
            for g in T.parallel(KVH * NHB):
                cst = T.alloc_buffer((R * 4,), F32, scope="global", annotations=STACK)
                cacc = T.alloc_buffer((R * D,), F32, scope="global", annotations=STACK)
                ar = T.alloc_buffer((D,), F32, scope="global", annotations=STACK)
                for r in range(R):
                    zero_state(r, cst, cacc, 1)
                    for seg in range((n_chunks(n) + cps - 1) // cps):
                        fold(r, wml[((g * P + seg) * R + r) * 2], wml[((g * P + seg) * R + r) * 2 + 1], wacc,
                             ((g * P + seg) * R + r) * D, cst, cacc)
                    finish(O, 0, g // NHB * G + g % NHB * Gb, r, cacc, cst, r * 4 + 1, ar)

    if KV in ROW_WRITERS:   # quantized caches (kv_quant.py): int8 rows of codes, then scales
        RB, RBV = row_bytes(KV, KVH, D), row_bytes(VK, KVH, D)

        if M:
            @T.prim_func
            def attention_tree_q(q: T.handle, k: T.handle, v: T.handle, tr: T.handle, o: T.handle):
                T.func_attr({"tirx.noalias": True})
                S = T.int64()
                Q = T.match_buffer(q, (T_, NH, D), F32)
                Kq = T.match_buffer(k, (S, RB), "int8", align=VIEW_ALIGN)
                Vq = T.match_buffer(v, (S, RBV), "int8", align=VIEW_ALIGN)
                TR = T.match_buffer(tr, (T_ + 1, T_), "int32")
                O = T.match_buffer(o, (T_, NH * D), F32)
                Ks = scale_view(KV, Kq, S, KVH, D)
                Vs = scale_view(VK, Vq, S, KVH, D)
                body(Q, QRows(KV, Kq, Ks, KVH, D), QRows(VK, Vq, Vs, KVH, D), TR, O, S)
            return limited(attention_tree_q)

        @T.prim_func
        def attention_q(q: T.handle, k: T.handle, v: T.handle, o: T.handle):
            T.func_attr({"tirx.noalias": True})
            S = T.int64()
            Q = T.match_buffer(q, (T_, NH, D), F32)
            Kq = T.match_buffer(k, (S, RB), "int8", align=VIEW_ALIGN)
            Vq = T.match_buffer(v, (S, RBV), "int8", align=VIEW_ALIGN)
            O = T.match_buffer(o, (T_, NH * D), F32)
            Ks = scale_view(KV, Kq, S, KVH, D)
            Vs = scale_view(VK, Vq, S, KVH, D)
            if split:
                body_split(Q, QRows(KV, Kq, Ks, KVH, D), QRows(VK, Vq, Vs, KVH, D), O, S)
            else:
                body(Q, QRows(KV, Kq, Ks, KVH, D), QRows(VK, Vq, Vs, KVH, D), Q, O, S)
        return limited(attention_q)

    if M:
        @T.prim_func
        def attention_tree(q: T.handle, k: T.handle, v: T.handle, tr: T.handle, o: T.handle):
            T.func_attr({"tirx.noalias": True})
            S = T.int64()
            Q = T.match_buffer(q, (T_, NH, D), F32)
            Kc = T.match_buffer(k, (S, KVH, D), KV)
            Vc = T.match_buffer(v, (S, KVH, D), VK)
            TR = T.match_buffer(tr, (T_ + 1, T_), "int32")
            O = T.match_buffer(o, (T_, NH * D), F32)
            body(Q, Kc, Vc, TR, O, S)
        return limited(attention_tree)

    @T.prim_func
    def attention(q: T.handle, k: T.handle, v: T.handle, o: T.handle):
        T.func_attr({"tirx.noalias": True})
        S = T.int64()
        Q = T.match_buffer(q, (T_, NH, D), F32)
        Kc = T.match_buffer(k, (S, KVH, D), KV)
        Vc = T.match_buffer(v, (S, KVH, D), VK)
        O = T.match_buffer(o, (T_, NH * D), F32)
        if split:
            body_split(Q, Kc, Vc, O, S)
        else:
            body(Q, Kc, Vc, Q, O, S)   # no tree: its argument is never read
    return limited(attention)
