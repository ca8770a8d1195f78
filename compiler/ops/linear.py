"""linear: out[t, n] = sum_k x[t, k] * W[n, k] (+ b[n]); W in PyTorch [N, K] layout, f32 or f16.

Both x rows and W rows are contiguous in K, so every schedule vectorizes over K (VL lanes) and needs no
weight packing; f16 weights are widened to f32 in registers (vcvtph2ps / fcvtl); weights stay f16 in memory.

T == 1 (decode GEMV, memory bound): parallel over output rows; per row U*VL lanes in U independent
  accumulator vectors (breaks the FMA latency chain), summed at the end with a shuffle tree; the K % (U*VL)
  tail is a scalar loop. On x86 each U*VL step also issues software prefetches (llvm.prefetch, one per 64-byte
  line) cpu.float_prefetch_bytes ahead in the flat weight stream (8 KiB; AMD Zen 1-3 1 KiB: x86_prefetch).
T > 1 (prefill GEMM, compute bound): parallel over blocks of Nn weight rows; inside, blocks of Tt token
  rows; register block of Tt x Nn accumulator vectors (AVX-512: 4 x 4 = 16 of 32 zmm): per K-vector step
  Tt + Nn loads feed Tt*Nn FMAs. The Tt*Nn horizontal sums are done together by one transpose-reduce tree
  (2 shuffles + 1 add per accumulator instead of a full reduction each). Ragged N / T blocks clamp their
  load rows (recomputing a valid row) and guard the stores, so any shape works with the same code.
segs (fused q/k/v, gate/up): the same schedules, each output row stored to its matrix's own output
(compiler/ops/segments.py).
Scratch is constant-size: stack allocas, except the GEMM accumulator block when it reaches 1 KiB
(AVX-512 4x4x16 floats), which becomes one TVMBackendAllocWorkspace per parallel task (LLVM still keeps
it in registers inside the K loop: x and W are noalias). Tiny problems (< 2^16 weight elements for GEMV,
< 2^18 multiply-adds for GEMM) run single-threaded: the thread-pool launch would cost more.
"""
from __future__ import annotations

from tvm import te, tirx
from tvm.script import tirx as T

from ._util import F32, PARALLEL_MIN_ELEMS, STACK, VIEW_ALIGN, concat_vecs, hsum, let_wrap, prefetch, tree_reduce
from .kslice import check as check_kslice
from .kslice import flat_index
from .segments import offsets, split_output


def _w(v, wdtype):
    return v if wdtype == F32 else v.astype(F32)


def _task_row(nb, r, R: int, N: int):
    """The r-th weight row of GEMV task nb (R rows a task): a ragged last task recomputes row N-1 and does not store it."""
    return T.min(nb * R + r, N - 1) if N % R else nb * R + r


def _wload(W, Wf, n, kv, lane, N: int, KS: int, VL: int):
    """W[n, kv*VL + lane], from the K-sliced layout when KS (kslice.py)."""
    return Wf[flat_index(n, kv, lane, N, KS, VL)] if KS else W[n, kv * VL + lane]


def _store_out(bias: bool):
    """out[t, n] = val (+ b[n]): the store every linear schedule ends with."""
    @T.macro
    def store(O, Bs, t, n, val):
        if bias:
            O[t, n] = val + Bs[n]
        else:
            O[t, n] = val

    return store


def gemv(cpu, N: int, K: int, wdtype: str, bias: bool, R: int | None = None, T_: int = 1, KS: int = 0):
    """R: weight rows per task, computed together so that each activation vector load serves R rows (default:
    cpu.gemv_rows_for). The down projection's activation row (22 KiB at K=5632) shares L1 with the weight stream;
    one row at a time re-read it from L2 per row and streamed at 18 GB/s where the other GEMVs made 31 (1B f16,
    Zen 4); 6-8 rows per task stream it at 25 there (the row's misses to L2 no longer crowd out the weight
    stream's), while at K=2048 (rows 4 KiB apart) every R > 1 is 1.4-2x slower: compiler/tune measures R per K.
    Every row keeps its own accumulators, reduced in the same order, so R never changes a result.
    T_ > 1 (`rowwise`): each token in turn through the same code, so its outputs are bitwise the decode GEMV's
    (MoE routers in a verify pass: the experts a draft picks must be the ones its decode step would pick).
    KS: W is stored K-sliced (kslice.py): gemv_sliced, R unused."""
    if KS:
        return gemv_sliced(cpu, N, K, wdtype, bias, KS, T_)
    VL = cpu.vector_lanes
    R = max(1, min(R or cpu.gemv_rows_for(wdtype, K), N))
    U = max(1, min(4 if VL >= 8 else 8, K // VL))  # independent FMA chains (NEON: more, narrower)
    L = U * VL if K >= VL else 0
    Km = (K // L) * L if L else 0
    LA = max(L, VL)
    PB = 2 if wdtype == "float16" else 4  # bytes per weight
    pf_bytes = cpu.prefetch_bytes if cpu.float_prefetch_bytes is None else cpu.float_prefetch_bytes
    pf = pf_bytes // PB  # prefetch distance in weights
    NPF = max(1, L * PB // 64) if pf > 0 and L > 0 else 0  # prefetches (64-byte lines) per U*VL step
    B_shape = (N,) if bias else (1,)
    NB = (N + R - 1) // R
    outer = T.parallel if N * K >= PARALLEL_MIN_ELEMS else T.serial

    def row(nb, r):
        return _task_row(nb, r, R, N)

    @T.prim_func
    def linear(x: T.handle, w: T.handle, b: T.handle, o: T.handle):
        T.func_attr({"tirx.noalias": True})
        X = T.match_buffer(x, (T_, K), F32)
        W = T.match_buffer(w, (N, K), wdtype)
        Bs = T.match_buffer(b, B_shape, F32)
        O = T.match_buffer(o, (T_, N), F32, align=VIEW_ALIGN)
        Wf = T.decl_buffer((N * K,), wdtype, data=W.data)
        for nb in outer(NB):
            acc = T.alloc_buffer((R * LA,), F32, scope="global", annotations=STACK)
            st = T.alloc_buffer((R,), F32, scope="global", annotations=STACK)
            for t in range(T_):
                for r in T.unroll(R):
                    st[r] = T.float32(0)
                if Km > 0:
                    for l in T.vectorized(R * L):
                        acc[l] = T.float32(0)
                    for ko in range(Km // L):
                        if NPF > 0:
                            for r in T.unroll(R):
                                for pi in T.unroll(NPF):
                                    prefetch(Wf, T.min(row(nb, r) * K + ko * L + pf + pi * (64 // PB), N * K - 1))
                        for r in T.unroll(R):
                            for u in T.unroll(U):
                                for l in T.vectorized(VL):
                                    acc[r * LA + u * VL + l] = acc[r * LA + u * VL + l] + X[t, ko * L + u * VL + l] * _w(
                                        W[row(nb, r), ko * L + u * VL + l], wdtype)
                    for r in T.unroll(R):
                        if U > 1:
                            for u in T.unroll(U - 1):
                                for l in T.vectorized(VL):
                                    acc[r * LA + l] = acc[r * LA + l] + acc[r * LA + (u + 1) * VL + l]
                        st[r] = hsum(acc, VL, r * LA)
                for r in T.unroll(R):
                    if Km < K:
                        for k in range(Km, K):
                            st[r] = st[r] + X[t, k] * _w(W[row(nb, r), k], wdtype)
                    if nb * R + r < N:
                        if bias:
                            O[t, nb * R + r] = st[r] + Bs[nb * R + r]
                        else:
                            O[t, nb * R + r] = st[r]

    return _drop_bias(linear, bias)

SLICED_ROWS = 256   # weight rows per task of gemv_sliced (64 KiB of accumulators; 64 rows streamed 6-11% slower)


def gemv_sliced(cpu, N: int, K: int, wdtype: str, bias: bool, KS: int, T_: int = 1):
    """The decode GEMV over a K-sliced W (kslice.py): per task a block of RB rows, slice after slice, each row's U
    accumulator vectors carried between slices in a scratch row: the FMA chain over k of gemv's R = 1 kernel, so the
    outputs are bitwise gemv's. One activation slice (KS*4 bytes) stays in L1 for the whole block, and the block's
    slice is one contiguous run of RB*KS weights. No software prefetch (on the Zen 4 where this was measured, the
    hardware streamer alone was best for every float GEMV)."""
    VL = cpu.vector_lanes
    U = max(1, min(4 if VL >= 8 else 8, KS // VL))
    L = U * VL
    if KS % L:
        raise ValueError(f"linear: K slice {KS} is not a multiple of the GEMV step {L}")
    NS, SC = K // KS, KS // L
    RB = min(SLICED_ROWS, -(-N // max(1, cpu.num_threads)))
    NB = (N + RB - 1) // RB
    B_shape = (N,) if bias else (1,)
    outer = T.parallel if N * K >= PARALLEL_MIN_ELEMS else T.serial

    def row(nb, r):
        return _task_row(nb, r, RB, N)

    @T.prim_func
    def linear(x: T.handle, w: T.handle, b: T.handle, o: T.handle):
        T.func_attr({"tirx.noalias": True})
        X = T.match_buffer(x, (T_, K), F32)
        W = T.match_buffer(w, (N, K), wdtype)
        Bs = T.match_buffer(b, B_shape, F32)
        O = T.match_buffer(o, (T_, N), F32, align=VIEW_ALIGN)
        Wf = T.decl_buffer((N * K,), wdtype, data=W.data)
        for nb in outer(NB):
            accs = T.alloc_buffer((RB * L,), F32, scope="global")
            acc = T.alloc_buffer((L,), F32, scope="global", annotations=STACK)
            for t in range(T_):
                for r in range(RB):
                    for l in T.vectorized(L):
                        accs[r * L + l] = T.float32(0)
                for s in range(NS):
                    for r in range(RB):
                        for l in T.vectorized(L):
                            acc[l] = accs[r * L + l]
                        for kc in range(SC):
                            for u in T.unroll(U):
                                for l in T.vectorized(VL):
                                    acc[u * VL + l] = acc[u * VL + l] + X[t, s * KS + kc * L + u * VL + l] * _w(
                                        Wf[s * (N * KS) + row(nb, r) * KS + kc * L + u * VL + l], wdtype)
                        for l in T.vectorized(L):
                            accs[r * L + l] = acc[l]
                for r in range(RB):
                    if nb * RB + r < N:
                        if U > 1:
                            for u in T.unroll(U - 1):
                                for l in T.vectorized(VL):
                                    accs[r * L + l] = accs[r * L + l] + accs[r * L + (u + 1) * VL + l]
                        if bias:
                            O[t, nb * RB + r] = hsum(accs, VL, r * L) + Bs[nb * RB + r]
                        else:
                            O[t, nb * RB + r] = hsum(accs, VL, r * L)

    return _drop_bias(linear, bias)


def gemm_blocking(cpu, T_: int, N: int):
    nreg = 32 if (cpu.vector_lanes >= 16 or cpu.arch == "aarch64") else 16
    Tt = min(4, T_)
    Nn = 4 if nreg >= 32 else 2
    Nn = min(Nn, N)
    return Tt, Nn


def gemm(cpu, T_: int, N: int, K: int, wdtype: str, bias: bool, blocking=None, KS: int = 0):
    VL = cpu.vector_lanes
    Tt, Nn = blocking or gemm_blocking(cpu, T_, N)
    TN = Tt * Nn
    Km = (K // VL) * VL
    NTB = (T_ + Tt - 1) // Tt
    NNB = (N + Nn - 1) // Nn
    rag_t = T_ % Tt != 0
    rag_n = N % Nn != 0
    use_tree = TN % VL == 0 and (TN // VL) & (TN // VL - 1) == 0
    B_shape = (N,) if bias else (1,)
    outer = T.parallel if T_ * N * K >= 4 * PARALLEL_MIN_ELEMS else T.serial

    def trow(tb, ti):
        return T.min(tb * Tt + ti, T_ - 1) if rag_t else tb * Tt + ti

    def nrow(nb, ni):
        return T.min(nb * Nn + ni, N - 1) if rag_n else nb * Nn + ni

    def finish(acc):
        outs, binds = tree_reduce([acc[T.Ramp(i * VL, 1, VL)] for i in range(TN)], VL)
        return let_wrap(concat_vecs(outs, VL), binds)

    store = _store_out(bias)

    @T.prim_func
    def linear(x: T.handle, w: T.handle, b: T.handle, o: T.handle):
        T.func_attr({"tirx.noalias": True})
        X = T.match_buffer(x, (T_, K), F32)
        W = T.match_buffer(w, (N, K), wdtype)
        Bs = T.match_buffer(b, B_shape, F32)
        O = T.match_buffer(o, (T_, N), F32, align=VIEW_ALIGN)
        Wf = T.decl_buffer((N * K,), wdtype, data=W.data)
        for nb in outer(NNB):
            acc = T.alloc_buffer((TN * VL,), F32, scope="global", annotations=STACK)
            res = T.alloc_buffer((TN,), F32, scope="global", annotations=STACK)
            for tb in range(NTB):
                for i in T.unroll(TN):
                    for l in T.vectorized(VL):
                        acc[i * VL + l] = T.float32(0)
                for ko in range(Km // VL):
                    for ti in T.unroll(Tt):
                        for ni in T.unroll(Nn):
                            for l in T.vectorized(VL):
                                acc[(ti * Nn + ni) * VL + l] = acc[(ti * Nn + ni) * VL + l] + X[
                                    trow(tb, ti), ko * VL + l] * _w(_wload(W, Wf, nrow(nb, ni), ko, l, N, KS, VL), wdtype)
                if use_tree:
                    res[T.Ramp(0, 1, TN)] = finish(acc)
                else:
                    for i in T.unroll(TN):
                        res[i] = hsum(acc, VL, i * VL)
                for ti in T.unroll(Tt):
                    for ni in T.unroll(Nn):
                        if Km < K:
                            for k in range(Km, K):
                                res[ti * Nn + ni] = res[ti * Nn + ni] + X[trow(tb, ti), k] * _w(
                                    W[nrow(nb, ni), k], wdtype)
                        if rag_t or rag_n:
                            if tb * Tt + ti < T_ and nb * Nn + ni < N:
                                store(O, Bs, tb * Tt + ti, nb * Nn + ni, res[ti * Nn + ni])
                        else:
                            store(O, Bs, tb * Tt + ti, nb * Nn + ni, res[ti * Nn + ni])

    return _drop_bias(linear, bias)


def outer_blocking(cpu, T_: int | None = None) -> tuple[int, int]:
    """(Nn weight rows, NV token vectors) per register block of gemm_outer: Nn*NV accumulators + NV token
    vectors + 1 broadcast fit the register file (AVX2: 6 x 2 = 12 of 16 ymm; AVX-512: 14 x 2 = 28 of 32 zmm).
    Chunks of at most one vector of tokens (the 16-token prompt-tail program) take one token vector, so that no
    lane is padding (twice the rows instead made the f16 panel too big for L2: 105 against 154 GFLOP/s at
    2048x5632, Zen 4). compiler/tune measures the blocking per chunk on the host."""
    Nn, NV = (14, 2) if cpu.vector_lanes >= 16 else (6, 2)
    return (Nn, 1) if T_ is not None and T_ <= cpu.vector_lanes else (Nn, NV)


def gemm_outer(cpu, T_: int, N: int, K: int, wdtype: str, bias: bool, blocking=None, KS: int = 0):
    """Prefill GEMM as register-blocked outer products (BLIS-style, tokens in the vector lanes).

    The activations are transposed once per call into token tiles xt[tile][k][TV] (TV = NV*VL tokens; pad
    tokens zero), so a tile's k steps read one contiguous stream. Per block of Nn weight rows and per token tile,
    each k step does NV vector loads of xt, Nn scalar broadcasts of W[n, k] and Nn*NV FMAs into register
    accumulators: 12 FMAs per 8 loads on AVX2 (the dot-product gemm needs 6 loads + 2 widenings per 8 FMAs and a
    horizontal reduction per output). f16 weights are widened into an f32 scratch panel (no conversions in the
    inner loop) by the block's first tile, VL k at a time right before its FMAs use them: the conversions and the
    weight loads from DRAM overlap the FMAs instead of stalling them in a pass of their own (a separate pass cost
    11% on Zen 5). Outputs are written once, as scalars, token-major (each token row's Nn values together: in
    n-major order the TV rows N*4 bytes apart conflict in the L1 sets and every store missed; 2048x2048 ran 22%
    slower); ragged N clamps its rows and guards the stores.
    The transpose reads X row by row (down a column, its K*4-byte row stride thrashes the L1 sets).
    Measured, f16, 2 threads, GFLOP/s: Zen 3 (FMA peak ~204) 5632x2048 T=32 143 vs 136 for the dot-product gemm,
    T=64 154 vs 125, T=128 175 vs 125. Zen 5 (AVX-512, peak ~500), T=128: 5632x2048 435, 2048x5632 424,
    2048x2048 460, 256x2048 344 (396, 383, 318, 225 with a separate widening pass, n-major stores and a
    column-wise transpose)."""
    VL = cpu.vector_lanes
    Nn, NV = blocking or outer_blocking(cpu, T_)
    Nn = min(Nn, N)
    TV = NV * VL
    NTB = (T_ + TV - 1) // TV
    TP = NTB * TV
    NNB = (N + Nn - 1) // Nn
    rag_n = N % Nn != 0
    pack = wdtype != F32
    KV = K // VL
    PS = K + 16  # row stride of the f32 panel: not a multiple of 4 KiB, so the Nn rows do not alias in L1 sets
    WP = Nn * PS if pack else 1
    B_shape = (N,) if bias else (1,)
    outer = T.parallel if T_ * N * K >= 4 * PARALLEL_MIN_ELEMS else T.serial
    KC = 64  # k rows per transpose task
    NKC = (K + KC - 1) // KC
    tpar = T.parallel if TP * K >= PARALLEL_MIN_ELEMS else T.serial

    def nrow(nb, ni):
        return T.min(nb * Nn + ni, N - 1) if rag_n else nb * Nn + ni

    NSL, PER = (K // KS, KS // VL) if KS else (1, KV)

    def _wslice(W, Wf, n, ks, kvi, lane):   # W[n, (ks*PER + kvi)*VL + lane]
        return Wf[ks * (N * KS) + n * KS + kvi * VL + lane] if KS else W[n, kvi * VL + lane]

    def wval(W, Wf, wf, nb, ni, k):
        return wf[ni * PS + k] if pack else _wload(W, Wf, nrow(nb, ni), k // VL, k % VL, N, KS, VL)

    store = _store_out(bias)

    @T.macro
    def fma_step(W, Wf, wf, xt, acc, nb, tb, k):
        for ni in T.unroll(Nn):
            for v in T.unroll(NV):
                for l in T.vectorized(VL):
                    acc[(ni * NV + v) * VL + l] = acc[(ni * NV + v) * VL + l] + wval(
                        W, Wf, wf, nb, ni, k) * xt[(tb * K + k) * TV + v * VL + l]

    @T.prim_func
    def linear(x: T.handle, w: T.handle, b: T.handle, o: T.handle):
        T.func_attr({"tirx.noalias": True})
        X = T.match_buffer(x, (T_, K), F32)
        W = T.match_buffer(w, (N, K), wdtype)
        Bs = T.match_buffer(b, B_shape, F32)
        O = T.match_buffer(o, (T_, N), F32, align=VIEW_ALIGN)
        Wf = T.decl_buffer((N * K,), wdtype, data=W.data)
        xt = T.alloc_buffer((K * TP,), F32, scope="global")
        for kc in tpar(NKC):
            for t in range(TP):
                for kk in range(KC):
                    if kc * KC + kk < K:
                        xt[((t // TV) * K + kc * KC + kk) * TV + t % TV] = T.if_then_else(
                            t < T_, X[T.min(t, T_ - 1), kc * KC + kk], T.float32(0))
        for nb in outer(NNB):
            wf = T.alloc_buffer((WP,), F32, scope="global")
            for tb in range(NTB):
                acc = T.alloc_buffer((Nn * TV,), F32, scope="global", annotations=STACK)
                for i in T.unroll(Nn * NV):
                    for l in T.vectorized(VL):
                        acc[i * VL + l] = T.float32(0)
                for ks in range(NSL):   # K slices (one unless W is stored K-sliced): no division in the addresses
                    for kvi in range(PER):
                        if pack:
                            if tb == 0:   # the first tile widens the panel, VL k at a time just before it uses them
                                for ni in T.unroll(Nn):
                                    for l in T.vectorized(VL):
                                        wf[ni * PS + (ks * PER + kvi) * VL + l] = _wslice(
                                            W, Wf, nrow(nb, ni), ks, kvi, l).astype(F32)
                        for ki in range(VL):
                            fma_step(W, Wf, wf, xt, acc, nb, tb, (ks * PER + kvi) * VL + ki)
                for k in range(KV * VL, K):
                    if pack:
                        if tb == 0:
                            for ni in range(Nn):
                                wf[ni * PS + k] = W[nrow(nb, ni), k].astype(F32)
                    fma_step(W, Wf, wf, xt, acc, nb, tb, k)
                for j in T.unroll(TV):   # token-major: each row's Nn outputs are stored together
                    for ni in T.unroll(Nn):
                        if tb * TV + j < T_:
                            if rag_n:
                                if nb * Nn + ni < N:
                                    store(O, Bs, tb * TV + j, nb * Nn + ni, acc[ni * TV + j])
                            else:
                                store(O, Bs, tb * TV + j, nb * Nn + ni, acc[ni * TV + j])

    return _drop_bias(linear, bias)


def _drop_bias(func, bias: bool):
    """The kernels are written with a bias parameter (unused when bias=False); without bias, remove it
    so the signature is (x, W, out)."""
    if bias:
        return func
    params = list(func.params)
    params.pop(2)
    return tirx.PrimFunc(params, func.body, func.ret_type, func.attrs)


def naive(T_: int, N: int, K: int, wdtype: str, bias: bool, segs=(), KS: int = 0):
    """Unscheduled TE definition: always builds (serial loops); fallback for shapes a schedule rejects.
    segs: one output per segment of rows (see make); KS: W stored K-sliced (kslice.py)."""
    x = te.placeholder((T_, K), F32, "x")
    W = te.placeholder((N, K), wdtype, "W")
    k = te.reduce_axis((0, K), "k")

    def wat(n, k):
        if not KS:
            return W[n, k]
        f = (k // KS) * (N * KS) + n * KS + k % KS
        return W[f // K, f % K]

    y = te.compute((T_, N), lambda t, n: te.sum(x[t, k] * _w(wat(n, k), wdtype), axis=k), name="y")
    args = [x, W]
    if bias:
        b = te.placeholder((N,), F32, "b")
        y = te.compute((T_, N), lambda t, n: y[t, n] + b[n], name="out")
        args.append(b)
    if segs:
        args += [_rows(y, T_, ns, o, f"out{s}") for s, (ns, o) in enumerate(zip(segs, offsets(segs)))]
    else:
        args.append(y)
    return te.create_prim_func(args)


def _rows(y, T_: int, n: int, off: int, name: str):
    """Rows off .. off+n-1 of y as a TE stage (one output of a fused naive kernel)."""
    return te.compute((T_, n), lambda t, r: y[t, r + off], name=name)


def make(cpu, T: int, N: int, K: int, wdtype: str = "float32", bias: bool = False, segs=(), rowwise: bool = False,
         KS: int = 0):
    """segs (row counts summing to N): W stacks several matrices (q/k/v, gate/up) and each one's rows go to its
    own output, out_s f32[T, N_s] (the last args, in order); () keeps the single output. rowwise: every token
    through the decode GEMV (gemv's T_), bitwise the outputs decode gives. KS: W (the whole stack) is stored
    K-sliced, KS columns a slice (kslice.py)."""
    check_kslice(K, KS)
    if T == 1 or rowwise:
        func = gemv(cpu, N, K, wdtype, bias, T_=T, KS=KS)
    elif use_outer(cpu, T):
        func = gemm_outer(cpu, T, N, K, wdtype, bias, cpu.blocking_for(T), KS=KS)
    else:
        func = gemm(cpu, T, N, K, wdtype, bias, KS=KS)
    return split_output(func, segs) if segs else func


def use_outer(cpu, T_: int) -> bool:
    """Every x86 prefill chunk takes gemm_outer: each output is then one FMA chain over k in order, whatever the
    chunk, so a prompt token's logits do not depend on the chunk it ran in (the prefill chunk is a tuning knob,
    compiler/tune, and a prompt's tail runs in the short program). NEON (no cheap scalar broadcast-FMA in LLVM's
    lowering here) keeps the dot-product gemm."""
    return cpu.arch == "x86_64" and T_ > 1
