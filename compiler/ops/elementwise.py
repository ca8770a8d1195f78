"""Memory-bound kernels: embed (f32/f16 table, or q8 / q4 panels), rmsnorm, rope, add, swiglu, gelu_mul, relu2_mul,
copy, scale, softcap (hand-written TIR).

All loops are vectorized with cpu.vector_lanes f32 lanes (main part) plus a scalar tail; the outer
loop is parallel only when the kernel touches >= PARALLEL_MIN_ELEMS elements (below that the
thread-pool launch costs more than it saves).
"""
from __future__ import annotations

from tvm.script import tirx as T

from ...quant.packing import LAYOUTS, Q6_LAYOUT
from ._util import F32, PARALLEL_MIN_ELEMS, STACK, VIEW_ALIGN, fast_exp, fast_tanh, hsum, pow2_divisor


def _outer(elems: int):
    return T.parallel if elems >= PARALLEL_MIN_ELEMS else T.serial


GELU_C = 0.7978845608028654   # sqrt(2 / pi)


def _flat(kind: str, cpu, R: int, N: int, c: float = 1.0, odtype: str = F32):
    """add / swiglu / gelu_mul / relu2_mul / copy / scale (by the constant c) over R*N contiguous elements."""
    VL = cpu.vector_lanes
    M = R * N
    B = VL * 4 if M >= VL * 4 else VL  # elements per outer iteration
    Mm = (M // B) * B
    outer = _outer(M)
    nin = 1 if kind in ("copy", "scale", "softcap") else 2

    def body(a, b, i):
        if kind == "add":
            return a[i] + b[i]
        if kind == "copy":   # into a K/V cache of odtype (float16: rounded to nearest)
            return a[i] if odtype == F32 else T.Cast(odtype, a[i])
        if kind == "scale":
            return a[i] * T.float32(c)
        if kind == "softcap":   # Gemma 2's final logits: c * tanh(a / c)
            return T.float32(c) * fast_tanh(a[i] * T.float32(1.0 / c))
        if kind == "gelu_mul":  # gelu_tanh(g) * u = g * u * sigmoid(2 sqrt(2/pi) (g + 0.044715 g^3))
            g = a[i]
            z = g * (T.float32(-2 * GELU_C) - T.float32(2 * GELU_C * 0.044715) * g * g)
            return g * b[i] / (T.float32(1) + fast_exp(z))
        if kind == "relu2_mul":  # BitNet's squared-ReLU gate: relu(g)^2 * u
            r = T.max(a[i], T.float32(0))
            return r * r * b[i]
        g = a[i]  # swiglu: g * sigmoid(g) * u
        return g * b[i] / (T.float32(1) + fast_exp(T.float32(0) - g))

    if nin == 1:
        @T.prim_func
        def kern(a: T.handle, o: T.handle):
            T.func_attr({"tirx.noalias": True})
            A = T.match_buffer(a, (R, N), F32)
            O = T.match_buffer(o, (R, N), odtype, align=VIEW_ALIGN)  # copy writes K/V cache rows
            Af = T.decl_buffer((M,), F32, data=A.data)
            Of = T.decl_buffer((M,), odtype, data=O.data, align=VIEW_ALIGN)
            for i in outer(Mm // B):
                for l in T.vectorized(B):
                    Of[i * B + l] = body(Af, None, i * B + l)
            if Mm < M:
                for i in range(Mm, M):
                    Of[i] = body(Af, None, i)
        return kern

    @T.prim_func
    def kern2(a: T.handle, b: T.handle, o: T.handle):
        T.func_attr({"tirx.noalias": True})
        A = T.match_buffer(a, (R, N), F32)
        Bb = T.match_buffer(b, (R, N), F32)
        O = T.match_buffer(o, (R, N), F32)
        Af = T.decl_buffer((M,), F32, data=A.data)
        Bf = T.decl_buffer((M,), F32, data=Bb.data)
        Of = T.decl_buffer((M,), F32, data=O.data)
        for i in outer(Mm // B):
            for l in T.vectorized(B):
                Of[i * B + l] = body(Af, Bf, i * B + l)
        if Mm < M:
            for i in range(Mm, M):
                Of[i] = body(Af, Bf, i)
    return kern2


def add(cpu, R: int, N: int):
    return _flat("add", cpu, R, N)


def swiglu(cpu, T_: int, F: int):
    return _flat("swiglu", cpu, T_, F)


def relu2_mul(cpu, T_: int, F: int):
    return _flat("relu2_mul", cpu, T_, F)


def gelu_mul(cpu, T_: int, F: int):
    return _flat("gelu_mul", cpu, T_, F)


def copy(cpu, R: int, N: int, dtype: str = F32):
    return _flat("copy", cpu, R, N, odtype=dtype)


def scale(cpu, R: int, N: int, c: float):
    return _flat("scale", cpu, R, N, c)


def softcap(cpu, R: int, N: int, c: float):
    return _flat("softcap", cpu, R, N, c)


def embed(cpu, T_: int, V: int, D: int, wdtype: str = "float32"):
    VL = cpu.vector_lanes
    Dm = (D // VL) * VL
    outer = _outer(T_ * D)

    def w(Wb, row, d):
        # clamp: the plan cannot vouch for the ids' values, and an out-of-range row would read outside the weights
        v = Wb[T.Cast("int64", T.max(T.min(row, V - 1), 0)), d]
        return v if wdtype == F32 else v.astype(F32)

    @T.prim_func
    def kern(ids: T.handle, wt: T.handle, o: T.handle):
        T.func_attr({"tirx.noalias": True})
        I = T.match_buffer(ids, (T_,), "int32")
        Wb = T.match_buffer(wt, (V, D), wdtype)
        O = T.match_buffer(o, (T_, D), F32)
        for t in outer(T_):
            for dc in range(Dm // VL):
                for l in T.vectorized(VL):
                    O[t, dc * VL + l] = w(Wb, I[t], dc * VL + l)
            if Dm < D:
                for d in range(Dm, D):
                    O[t, d] = w(Wb, I[t], d)
    return kern


def embed_packed(cpu, traits, T_: int, V: int, D: int, G: int | None):
    """Rows of a table in a packed scheme's layout (traits: the op's KernelTraits, quant/scheme.py)."""
    if traits.layout == Q6_LAYOUT:
        return embed_q6(cpu, T_, V, D)
    if traits.scale == "row":
        return embed_q8(cpu, T_, V, D)
    if LAYOUTS[traits.layout][0] == 8:   # 8-bit codes with group scales (q8g32: a Q8_0 GGUF's embedding kept)
        return embed_q8(cpu, T_, V, D, traits.group_of(G))
    return embed_q4(cpu, T_, V, D, traits.group_of(G))


def embed_q8(cpu, T_: int, V: int, D: int, G: int | None = None):
    """Gather rows of a table of 8-bit codes (quant/packing.py layout: 16-row panels of 4-byte chunks, code = q + 128)
    with one f32 scale per row (q8; G None) or f16 scales per row and group of G, panel-interleaved as q4's (q8g32:
    a Q8_0 GGUF's embedding kept), so a tied embedding / lm_head is stored once, in the head's scheme."""
    full = (V // 16) * 16
    KG = D // G if G else 1
    S_shape, S_dt = ((V, KG), "float16") if G else ((V,), F32)
    outer = _outer(T_ * D)

    def scale(S, row, rp, c):
        if G:
            return T.Cast(F32, S[(row // 16) * 16 * KG + row % 16 + (c * 4 // G) * rp])
        return S[row]

    @T.prim_func
    def kern(ids: T.handle, qw: T.handle, sc: T.handle, o: T.handle):
        T.func_attr({"tirx.noalias": True})
        I = T.match_buffer(ids, (T_,), "int32")
        Q = T.match_buffer(qw, (V, D), "uint8")
        S = T.match_buffer(sc, S_shape, S_dt)
        O = T.match_buffer(o, (T_, D), F32)
        Qf = T.decl_buffer((V * D,), "uint8", data=Q.data)
        Sf = T.decl_buffer((V * KG,), S_dt, data=S.data)
        for t in outer(T_):
            row: T.let = T.Cast("int64", T.max(T.min(I[t], V - 1), 0))
            rp: T.let = T.if_then_else(row < full, T.int64(16), T.int64(V - full))
            base: T.let = (row // 16) * 16 * D + (row % 16) * 4
            for c in range(D // 4):
                for b in T.vectorized(4):
                    O[t, c * 4 + b] = (T.Cast(F32, Qf[base + c * 4 * rp + b]) - T.float32(128)) * scale(Sf, row, rp, c)
    return kern


def embed_q4(cpu, T_: int, V: int, D: int, G: int):
    """Gather rows of a q4 table (quant/packing.py layout: 16-row panels of 4-byte chunks, low nibble k = 8c + b,
    high nibble k = 8c + 4 + b, code = q + 8; f16 scales per row and group of G, panel-interleaved)."""
    full = (V // 16) * 16
    KG = D // G
    outer = _outer(T_ * D)

    @T.prim_func
    def kern(ids: T.handle, qw: T.handle, sc: T.handle, o: T.handle):
        T.func_attr({"tirx.noalias": True})
        I = T.match_buffer(ids, (T_,), "int32")
        Q = T.match_buffer(qw, (V, D // 2), "uint8")
        S = T.match_buffer(sc, (V, KG), "float16")
        O = T.match_buffer(o, (T_, D), F32)
        Qf = T.decl_buffer((V * D // 2,), "uint8", data=Q.data)
        Sf = T.decl_buffer((V * KG,), "float16", data=S.data)
        for t in outer(T_):
            row: T.let = T.Cast("int64", T.max(T.min(I[t], V - 1), 0))
            rp: T.let = T.if_then_else(row < full, T.int64(16), T.int64(V - full))
            base: T.let = (row // 16) * 16 * (D // 2) + (row % 16) * 4
            sbase: T.let = (row // 16) * 16 * KG + row % 16
            for c in range(D // 8):
                for h in T.unroll(2):
                    for b in T.vectorized(4):
                        O[t, c * 8 + h * 4 + b] = T.Cast(F32, T.Cast("int32", (Qf[base + c * 4 * rp + b] >> T.Cast(
                            "uint8", 4 * h)) & T.uint8(15)) - 8) * T.Cast(F32, Sf[sbase + (c * 8 // G) * rp])
    return kern


def embed_q6(cpu, T_: int, V: int, D: int):
    """Gather rows of a q6 table (quant/packing.py layout: per 32-k block 4 low-nibble chunks as q4's and 2 chunks
    of high bit pairs as t2's, code = q + 32; f16 scales per row and block of 32, panel-interleaved)."""
    full = (V // 16) * 16
    KB = D // 32
    BPR = D * 6 // 8
    outer = _outer(T_ * D)

    @T.prim_func
    def kern(ids: T.handle, qw: T.handle, sc: T.handle, o: T.handle):
        T.func_attr({"tirx.noalias": True})
        I = T.match_buffer(ids, (T_,), "int32")
        Q = T.match_buffer(qw, (V, BPR), "uint8")
        S = T.match_buffer(sc, (V, KB), "float16")
        O = T.match_buffer(o, (T_, D), F32)
        Qf = T.decl_buffer((V * BPR,), "uint8", data=Q.data)
        Sf = T.decl_buffer((V * KB,), "float16", data=S.data)
        for t in outer(T_):
            row: T.let = T.Cast("int64", T.max(T.min(I[t], V - 1), 0))
            rp: T.let = T.if_then_else(row < full, T.int64(16), T.int64(V - full))
            base: T.let = (row // 16) * 16 * BPR + (row % 16) * 4
            sbase: T.let = (row // 16) * 16 * KB + row % 16
            for kb in range(KB):
                for kk in range(32):
                    O[t, kb * 32 + kk] = T.Cast(F32, T.Cast("int32", (Qf[base + (kb * 6 + kk // 8) * 4 * rp + kk % 4] >> T.Cast(
                        "uint8", 4 * ((kk % 8) // 4))) & T.uint8(15)) + T.Cast("int32", (Qf[
                            base + (kb * 6 + 4 + kk // 16) * 4 * rp + kk % 4] >> T.Cast("uint8", 2 * ((kk % 16) // 4))) & T.uint8(
                            3)) * 16 - 32) * T.Cast(F32, Sf[sbase + kb * rp])
    return kern


def rmsnorm(cpu, R: int, D: int, eps: float):
    VL = cpu.vector_lanes
    U = 4 if D >= 4 * VL else 1  # independent accumulators for the sum of squares
    L = VL * U
    Dm = (D // L) * L
    Dv = (D // VL) * VL  # vectorized part of the scaling pass
    outer = _outer(R * D)
    inv_d = 1.0 / D

    @T.prim_func
    def kern(x: T.handle, w: T.handle, o: T.handle):
        T.func_attr({"tirx.noalias": True})
        X = T.match_buffer(x, (R, D), F32)
        Wt = T.match_buffer(w, (D,), F32)
        O = T.match_buffer(o, (R, D), F32)
        for r in outer(R):
            part = T.alloc_buffer((L,), F32, scope="global", annotations=STACK)
            st = T.alloc_buffer((2,), F32, scope="global", annotations=STACK)
            for l in T.vectorized(L):
                part[l] = T.float32(0)
            for dc in range(Dm // L):
                for u in T.unroll(U):
                    for l in T.vectorized(VL):
                        part[u * VL + l] = part[u * VL + l] + X[r, dc * L + u * VL + l] * X[r, dc * L + u * VL + l]
            if U > 1:
                for u in T.unroll(U - 1):
                    for l in T.vectorized(VL):
                        part[l] = part[l] + part[(u + 1) * VL + l]
            st[0] = hsum(part, VL)
            if Dm < D:
                for d in range(Dm, D):
                    st[0] = st[0] + X[r, d] * X[r, d]
            st[1] = T.float32(1) / T.sqrt(st[0] * T.float32(inv_d) + T.float32(eps))
            for dc in range(Dv // VL):
                for l in T.vectorized(VL):
                    O[r, dc * VL + l] = X[r, dc * VL + l] * st[1] * Wt[dc * VL + l]
            if Dv < D:
                for d in range(Dv, D):
                    O[r, d] = X[r, d] * st[1] * Wt[d]
    return kern


def rope(cpu, T_: int, H: int, D: int, P: bool = False):
    """P: each row t takes its rotation from row tree[0, t] (its depth, <= t) of the table view instead of row t: the
    verify program's token trees (tree int32[T + 1, T], attention.py), whose nodes sit at the position of their depth,
    not of their row."""
    if D % 2:
        raise ValueError(f"rope needs an even head_dim, got {D}")
    half = D // 2
    VH = pow2_divisor(half, cpu.vector_lanes)
    outer = _outer(T_ * H * D)

    if P:
        @T.prim_func
        def kern_p(x: T.handle, cs: T.handle, sn: T.handle, tr: T.handle, o: T.handle):
            T.func_attr({"tirx.noalias": True})
            X = T.match_buffer(x, (T_, H, D), F32)
            Cs = T.match_buffer(cs, (T_, half), F32, align=VIEW_ALIGN)
            Sn = T.match_buffer(sn, (T_, half), F32, align=VIEW_ALIGN)
            TR = T.match_buffer(tr, (T_ + 1, T_), "int32")
            O = T.match_buffer(o, (T_, H, D), F32, align=VIEW_ALIGN)
            for th in outer(T_ * H):
                for ic in range(half // VH):
                    for l in T.vectorized(VH):
                        O[th // H, th % H, ic * VH + l] = (
                            X[th // H, th % H, ic * VH + l] * Cs[TR[0, th // H], ic * VH + l]
                            - X[th // H, th % H, half + ic * VH + l] * Sn[TR[0, th // H], ic * VH + l])
                        O[th // H, th % H, half + ic * VH + l] = (
                            X[th // H, th % H, half + ic * VH + l] * Cs[TR[0, th // H], ic * VH + l]
                            + X[th // H, th % H, ic * VH + l] * Sn[TR[0, th // H], ic * VH + l])
        return kern_p

    @T.prim_func
    def kern(x: T.handle, cs: T.handle, sn: T.handle, o: T.handle):
        T.func_attr({"tirx.noalias": True})
        X = T.match_buffer(x, (T_, H, D), F32)
        Cs = T.match_buffer(cs, (T_, half), F32, align=VIEW_ALIGN)
        Sn = T.match_buffer(sn, (T_, half), F32, align=VIEW_ALIGN)
        O = T.match_buffer(o, (T_, H, D), F32, align=VIEW_ALIGN)
        for th in outer(T_ * H):
            for ic in range(half // VH):
                for l in T.vectorized(VH):
                    O[th // H, th % H, ic * VH + l] = (
                        X[th // H, th % H, ic * VH + l] * Cs[th // H, ic * VH + l]
                        - X[th // H, th % H, half + ic * VH + l] * Sn[th // H, ic * VH + l])
                    O[th // H, th % H, half + ic * VH + l] = (
                        X[th // H, th % H, half + ic * VH + l] * Cs[th // H, ic * VH + l]
                        + X[th // H, th % H, ic * VH + l] * Sn[th // H, ic * VH + l])
    return kern
