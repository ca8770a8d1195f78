"""Kernels of the mixture-of-experts layer (compiler/moe.py lowers it; models/graph.py `route` and `experts`).

    moe_route    router logits -> the routing table of the call: per token the top-k experts (softmax over all
                 experts, ties to the lower id, weights renormalized when `normalize`), then grouped by expert:
                 ids[S] the experts used (ascending, -1 after the last), and per used expert (a slot) its row count
                 cnt[s, 0], its tokens tok[s, :cnt] (ascending) and their weights wt[s, :cnt].
    per slot (a ROUTE step over ids, weights of expert ids[s]):
    moe_gather   xe[j] = x[tok[s, j]]                  rows j < cnt (the expert's tokens, packed)
    (gate/up GEMM on the packed rows, row-limited: compiler/ops/rows.py)
    moe_swiglu   h = silu(g) * u                        rows j < cnt
    (down GEMM, row-limited)
    moe_scatter  acc[tok[s, j]] += wt[s, j] * y[j]      rows j < cnt (read-modify-write of the layer's output)
    zero         acc = 0 (before the route)
    sigmoid_gate out = sigmoid(x @ w^T) * y, w f32[1, D] (Qwen2-MoE's shared-expert gate)

Slots are the experts, not the tokens, so a prefill chunk reads each used expert's weights once; decode (T = 1)
runs its k experts the same way with one row each.
"""
from __future__ import annotations

from tvm.script import tirx as T

from ..routing import CNT
from ._util import F32, VIEW_ALIGN, fast_exp

I32 = "int32"


def _lanes(cpu, n: int) -> int:
    return cpu.vector_lanes if n % cpu.vector_lanes == 0 else 1


def moe_route(cpu, T_: int, E: int, K_: int, normalize: bool, S: int, TP: int):
    """logits f32[T, E] -> ids int32[S], cnt int32[S, 16], tok int32[S, TP], wt f32[S, TP]."""
    TK = T_ * K_

    @T.prim_func
    def kern(lg: T.handle, ids: T.handle, cnt: T.handle, tok: T.handle, wt: T.handle):
        T.func_attr({"tirx.noalias": True})
        L = T.match_buffer(lg, (T_, E), F32)
        I = T.match_buffer(ids, (S,), I32)
        C = T.match_buffer(cnt, (S, CNT), I32)
        TKn = T.match_buffer(tok, (S, TP), I32)
        W = T.match_buffer(wt, (S, TP), F32)
        sel = T.alloc_buffer((TK,), I32, scope="global")
        sw = T.alloc_buffer((TK,), F32, scope="global")
        used = T.alloc_buffer((E,), I32, scope="global")
        slot = T.alloc_buffer((E,), I32, scope="global")
        sc = T.alloc_buffer((4,), F32, scope="global")      # max, sum of exp, best value, sum of the top-k
        bi = T.alloc_buffer((2,), I32, scope="global")      # best id, slots used
        for t in range(T_):
            sc[0] = L[t, 0]
            for e in range(1, E):
                sc[0] = T.max(sc[0], L[t, e])
            sc[1] = T.float32(0)
            for e in range(E):
                sc[1] = sc[1] + T.exp(L[t, e] - sc[0])
                used[e] = 0
            sc[3] = T.float32(0)
            for j in range(K_):
                bi[0] = -1
                sc[2] = T.float32(0)
                for e in range(E):
                    if used[e] == 0:
                        if bi[0] < 0 or L[t, e] > sc[2]:   # strict: ties keep the lower id (NaN: the first)
                            bi[0] = e
                            sc[2] = L[t, e]
                used[bi[0]] = 1
                sel[t * K_ + j] = bi[0]
                sw[t * K_ + j] = T.exp(L[t, bi[0]] - sc[0]) / sc[1]
                sc[3] = sc[3] + sw[t * K_ + j]
            if normalize:
                for j in range(K_):
                    sw[t * K_ + j] = sw[t * K_ + j] / sc[3]
        for e in range(E):
            used[e] = 0
        for i in range(TK):
            used[sel[i]] = used[sel[i]] + 1
        bi[1] = 0
        for e in range(E):
            slot[e] = -1
            if used[e] > 0:
                slot[e] = bi[1]
                I[bi[1]] = e
                C[bi[1], 0] = 0
                bi[1] = bi[1] + 1
        for i in range(S):
            if i >= bi[1]:
                I[i] = -1
                C[i, 0] = 0
        for t, j in T.grid(T_, K_):
            s: T.let = slot[sel[t * K_ + j]]
            r: T.let = C[s, 0]
            TKn[s, r] = t
            W[s, r] = sw[t * K_ + j]
            C[s, 0] = r + 1
    return kern


def moe_gather(cpu, T_: int, D: int, TP: int):
    """x f32[T, D], tok int32[1, TP], cnt int32[1, 16] -> xe f32[T, D] (rows < cnt)."""
    VL = _lanes(cpu, D)

    @T.prim_func
    def kern(x: T.handle, tok: T.handle, cnt: T.handle, xe: T.handle):
        T.func_attr({"tirx.noalias": True})
        X = T.match_buffer(x, (T_, D), F32)
        TKn = T.match_buffer(tok, (1, TP), I32)
        C = T.match_buffer(cnt, (1, CNT), I32)
        XE = T.match_buffer(xe, (T_, D), F32)
        for j in range(T_):
            if j < C[0, 0]:
                src: T.let = T.max(T.min(TKn[0, j], T_ - 1), 0)   # a routing-table bug must not read outside x
                for d0 in range(D // VL):
                    for l in T.vectorized(VL):
                        XE[j, d0 * VL + l] = X[src, d0 * VL + l]
    return kern


def moe_swiglu(cpu, T_: int, F: int):
    """g, u f32[T, F], cnt int32[1, 16] -> h f32[T, F] = silu(g) * u (rows < cnt)."""
    VL = _lanes(cpu, F)

    @T.prim_func
    def kern(g: T.handle, u: T.handle, cnt: T.handle, h: T.handle):
        T.func_attr({"tirx.noalias": True})
        G = T.match_buffer(g, (T_, F), F32)
        U = T.match_buffer(u, (T_, F), F32)
        C = T.match_buffer(cnt, (1, CNT), I32)
        H = T.match_buffer(h, (T_, F), F32)
        for t in range(T_):
            if t < C[0, 0]:
                for f0 in range(F // VL):
                    for l in T.vectorized(VL):
                        H[t, f0 * VL + l] = G[t, f0 * VL + l] * U[t, f0 * VL + l] / (
                            T.float32(1) + fast_exp(T.float32(0) - G[t, f0 * VL + l]))
    return kern


def moe_scatter(cpu, T_: int, D: int, TP: int):
    """y f32[T, D], tok int32[1, TP], wt f32[1, TP], cnt int32[1, 16], acc f32[T, D] (read and written):
    acc[tok[j]] += wt[j] * y[j] for rows j < cnt."""
    VL = _lanes(cpu, D)

    @T.prim_func
    def kern(y: T.handle, tok: T.handle, wt: T.handle, cnt: T.handle, acc: T.handle):
        T.func_attr({"tirx.noalias": True})
        Y = T.match_buffer(y, (T_, D), F32)
        TKn = T.match_buffer(tok, (1, TP), I32)
        W = T.match_buffer(wt, (1, TP), F32)
        C = T.match_buffer(cnt, (1, CNT), I32)
        A = T.match_buffer(acc, (T_, D), F32)
        for j in range(T_):
            if j < C[0, 0]:
                dst: T.let = T.max(T.min(TKn[0, j], T_ - 1), 0)
                for d0 in range(D // VL):
                    for l in T.vectorized(VL):
                        A[dst, d0 * VL + l] = A[dst, d0 * VL + l] + W[0, j] * Y[j, d0 * VL + l]
    return kern


def zero(cpu, R: int, N: int):
    """-> out f32[R, N] = 0."""
    VL = _lanes(cpu, N)

    @T.prim_func
    def kern(o: T.handle):
        T.func_attr({"tirx.noalias": True})
        O = T.match_buffer(o, (R, N), F32)
        for r, n0 in T.grid(R, N // VL):
            for l in T.vectorized(VL):
                O[r, n0 * VL + l] = T.float32(0)
    return kern


def sigmoid_gate(cpu, T_: int, D: int):
    """x f32[T, D], w f32[1, D], y f32[T, D] -> out f32[T, D] = sigmoid(x @ w^T) * y."""
    VL = _lanes(cpu, D)

    @T.prim_func
    def kern(x: T.handle, w: T.handle, y: T.handle, o: T.handle):
        T.func_attr({"tirx.noalias": True})
        X = T.match_buffer(x, (T_, D), F32)
        Wg = T.match_buffer(w, (1, D), F32)
        Y = T.match_buffer(y, (T_, D), F32)
        O = T.match_buffer(o, (T_, D), F32, align=VIEW_ALIGN)
        acc = T.alloc_buffer((VL,), F32, scope="global")
        gate = T.alloc_buffer((1,), F32, scope="global")
        for t in range(T_):
            for l in T.vectorized(VL):
                acc[l] = T.float32(0)
            for d0 in range(D // VL):
                for l in T.vectorized(VL):
                    acc[l] = acc[l] + X[t, d0 * VL + l] * Wg[0, d0 * VL + l]
            gate[0] = T.float32(0)
            for l in range(VL):
                gate[0] = gate[0] + acc[l]
            gate[0] = T.float32(1) / (T.float32(1) + T.exp(T.float32(0) - gate[0]))
            for d0 in range(D // VL):
                for l in T.vectorized(VL):
                    O[t, d0 * VL + l] = gate[0] * Y[t, d0 * VL + l]
    return kern
