"""Kernels of the neuron-bundled FFN (`edgellm compile --layout bundled`; compiler/bundled_ffn.py lowers it).

The FFN's neurons are stored in groups of G: group j's up rows and down columns in one weight (a bundle), so a
token reads only the groups it uses. The gate projection runs in full; then

    ffn_select   picks the groups: decode (T == 1) keeps group j when its estimated output norm
                 sqrt(sum_i (silu(g_i) * c_i)^2) (c_i: the neuron's |up row| * |down column|, scaled at compile time
                 so the layer's average group scores 1) is at least the threshold, writes their ids (then -1) and
                 their silu(gate) values in selection order; prefill keeps every group (exact). It zeroes the
                 accumulator.
    then per selected group (a ROUTE step): up = x @ up_j^T, h = silu(g_j) * up (ffn_mul), y = h @ down_j^T,
                 acc += y (ffn_accumulate).

Threshold 0 keeps every group: the same sums as the dense FFN, in group order.
"""
from __future__ import annotations

from tvm.script import tirx as T

from ._util import F32, fast_exp


def _silu(g):
    return g / (T.float32(1) + fast_exp(T.float32(0) - g))


def ffn_select(cpu, T_: int, F: int, G: int, D: int):
    """g f32[T, F], c f32[F] (weight), default f32[1] (weight), setting f32[1] (run-time setting, < 0: default)
    -> s f32[F/G, T, G] (silu(gate) per selected group, selection order), ids int32[F/G], acc f32[T, D] (zeroed)."""
    NG = F // G

    @T.prim_func
    def kern(g: T.handle, c: T.handle, dflt: T.handle, setting: T.handle, s: T.handle, ids: T.handle, acc: T.handle):
        T.func_attr({"tirx.noalias": True})
        Gb = T.match_buffer(g, (T_, F), F32)
        C = T.match_buffer(c, (F,), F32)
        Df = T.match_buffer(dflt, (1,), F32)
        St = T.match_buffer(setting, (1,), F32)
        S = T.match_buffer(s, (NG, T_, G), F32)
        I = T.match_buffer(ids, (NG,), "int32")
        A = T.match_buffer(acc, (T_, D), F32)
        n = T.alloc_buffer((1,), "int32", scope="global")
        score = T.alloc_buffer((1,), F32, scope="global")
        for t, d in T.grid(T_, D):
            A[t, d] = T.float32(0)
        if T_ == 1:
            thr: T.let = T.if_then_else(St[0] >= T.float32(0), St[0], Df[0])
            n[0] = 0
            for j in range(NG):
                score[0] = T.float32(0)
                for i in range(G):
                    v: T.let = _silu(Gb[0, j * G + i]) * C[j * G + i]
                    score[0] = score[0] + v * v
                if score[0] >= thr * thr:
                    for i in range(G):
                        S[n[0], 0, i] = _silu(Gb[0, j * G + i])
                    I[n[0]] = j
                    n[0] = n[0] + 1
            for j in range(NG):
                if j >= n[0]:
                    I[j] = -1
        else:
            for j in range(NG):
                I[j] = j
                for t, i in T.grid(T_, G):
                    S[j, t, i] = _silu(Gb[t, j * G + i])
    return kern


def ffn_mul(cpu, T_: int, G: int):
    """s f32[1, T, G] (one selected group's silu(gate)), u f32[T, G] -> h f32[T, G] = s * u."""
    VL = cpu.vector_lanes if G % cpu.vector_lanes == 0 else 1

    @T.prim_func
    def kern(s: T.handle, u: T.handle, h: T.handle):
        T.func_attr({"tirx.noalias": True})
        S = T.match_buffer(s, (1, T_, G), F32)
        U = T.match_buffer(u, (T_, G), F32)
        H = T.match_buffer(h, (T_, G), F32)
        for t, i0 in T.grid(T_, G // VL):
            for l in T.vectorized(VL):
                H[t, i0 * VL + l] = S[0, t, i0 * VL + l] * U[t, i0 * VL + l]
    return kern


def ffn_accumulate(cpu, R: int, N: int):
    """acc f32[R, N] (read and written), y f32[R, N]: acc += y."""
    VL = cpu.vector_lanes if N % cpu.vector_lanes == 0 else 1

    @T.prim_func
    def kern(y: T.handle, acc: T.handle):
        T.func_attr({"tirx.noalias": True})
        Y = T.match_buffer(y, (R, N), F32)
        A = T.match_buffer(acc, (R, N), F32)
        for r, n0 in T.grid(R, N // VL):
            for l in T.vectorized(VL):
                A[r, n0 * VL + l] = A[r, n0 * VL + l] + Y[r, n0 * VL + l]
    return kern
