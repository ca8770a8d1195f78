"""The OpenCL kernel library: the ops of compiler/ops (same names, params, argument order and packed weight layouts)
as schedule-free TE definitions that TVM's GPU rules (dlight) schedule at build time, plus a hand-scheduled
attention over the runtime KV length.

Each definition computes what the CPU kernel computes, in the same float order where it matters for exactness
(the quantized linears quantize activations to int8 blocks exactly as the CPU kernels do, integer dot products per
block, then f32 accumulation over blocks). Weights stay in the CPU's packed layouts (quant/packing.py), so one
weights.bin serves both backends; half-precision tensors (f16 weights, q4 group scales) are read as their uint16
bits and widened in the kernel, so the kernels need no cl_khr_fp16 (PoCL, many Mali drivers lack it).

make_kernel(op, cpu, **params) -> (name, prim_func), like compiler.ops.make_kernel; `cpu` is ignored."""
from __future__ import annotations

import functools
import math

from tvm import te, tirx
from tvm.script import tirx as T

from ...quant.packing import EPS_BLOCK, EPS_TOKEN, LAYOUTS, Q6_GROUP, Q6_LAYOUT, QA
from ...quant.scheme import KERNEL_OPS
from ..ops import kernel_params
from ..ops import _name as kernel_name
from ..ops.linear_naive import layout_geo, packed_code, weight_scale
from ..ops.segments import offsets

F32, I32, U16 = "float32", "int32", "uint16"

# ops with an OpenCL definition here (everything a dense Llama / Qwen / Mistral / BitNet package uses): these float
# ops, and every packed scheme's ops (quant: KERNEL_OPS), built from their traits over the layouts the CPU's
# reference kernels read (compiler/ops/linear_naive.py)
OPS = ("embed", "rmsnorm", "linear", "rope", "attention", "add", "swiglu", "copy", "relu2_mul", "gelu_mul", "scale",
       "softcap")
ATTENTION_CHUNK_MAX = 128  # keys per chunk of the attention kernel: one work-item per key, then per output lane


class UnsupportedOp(ValueError):
    pass


def half_to_f32(h):
    """f32 value of IEEE half bits h (uint16): exact for every finite half (normals and subnormals)."""
    u = h.astype("uint32")
    sign = (u >> tirx.const(15, "uint32")) & tirx.const(1, "uint32")
    e = (u >> tirx.const(10, "uint32")) & tirx.const(31, "uint32")
    m = u & tirx.const(1023, "uint32")
    normal = tirx.reinterpret(F32, (sign << tirx.const(31, "uint32")) | ((e + tirx.const(112, "uint32"))
                                                                         << tirx.const(23, "uint32"))
                              | (m << tirx.const(13, "uint32")))
    # subnormal: m * 2^-24 = (0.5 + m * 2^-24) - 0.5, exactly (a literal 2^-24 would be printed rounded)
    sub = tirx.reinterpret(F32, m | tirx.const(0x3F000000, "uint32")) - tirx.const(0.5, F32)
    sub = tirx.reinterpret(F32, tirx.reinterpret("uint32", sub) | (sign << tirx.const(31, "uint32")))
    return tirx.Select(e == tirx.const(0, "uint32"), sub, normal)


def _wt(dtype: str, shape, name: str):
    """A weight placeholder: float16 tensors are read as uint16 bits (see half_to_f32)."""
    return te.placeholder(shape, U16 if dtype == "float16" else dtype, name)


def _wval(W, idx, dtype: str):
    v = W[idx]
    return half_to_f32(v) if dtype == "float16" else v


def _row(ids, t, V: int):
    """A looked-up row, clamped (the plan cannot vouch for the ids' values)."""
    return tirx.max(tirx.min(ids[t], V - 1), 0)


def embed(T_: int, V: int, D: int, wdtype: str):
    ids = te.placeholder((T_,), I32, "ids")
    W = _wt(wdtype, (V, D), "W")
    out = te.compute((T_, D), lambda t, d: _wval(W, (_row(ids, t, V), d), wdtype), name="out")
    return te.create_prim_func([ids, W, out])


def embed_q8(T_: int, V: int, D: int, G: int | None = None):
    """16-row panels of 4-byte chunks, code = q + 128, one f32 scale per row (G None) or f16 scales per row and group,
    panel-interleaved as q4's (compiler/ops/elementwise.embed_q8)."""
    full = V // 16 * 16
    KG = D // G if G else 1
    ids = te.placeholder((T_,), I32, "ids")
    Q = te.placeholder((V * D,), "uint8", "Q")
    S = te.placeholder((V * KG,), U16, "S") if G else te.placeholder((V,), F32, "S")

    def f(t, d):
        row = _row(ids, t, V)
        rp = tirx.Select(row < full, 16, V - full)
        b = Q[row // 16 * 16 * D + row % 16 * 4 + d // 4 * 4 * rp + d % 4]
        scale = half_to_f32(S[row // 16 * 16 * KG + row % 16 + d // G * rp]) if G else S[row]
        return (b.astype(F32) - tirx.const(128, F32)) * scale
    return te.create_prim_func([ids, Q, S, te.compute((T_, D), f, name="out")])


def embed_q4(T_: int, V: int, D: int, G: int):
    """16-row panels of 4-byte chunks (low nibble k = 8c + b, high k = 8c + 4 + b, code = q + 8), f16 scales per row
    and group, panel-interleaved (compiler/ops/elementwise.embed_q4)."""
    full = V // 16 * 16
    KG = D // G
    ids = te.placeholder((T_,), I32, "ids")
    Q = te.placeholder((V * D // 2,), "uint8", "Q")
    S = te.placeholder((V * KG,), U16, "S")

    def f(t, d):
        row = _row(ids, t, V)
        rp = tirx.Select(row < full, 16, V - full)
        b = Q[row // 16 * 16 * (D // 2) + row % 16 * 4 + d // 8 * 4 * rp + d % 4]
        code = ((b >> (d % 8 // 4 * 4).astype("uint8")) & tirx.const(15, "uint8")).astype(I32) - 8
        return code.astype(F32) * half_to_f32(S[row // 16 * 16 * KG + row % 16 + d // G * rp])
    return te.create_prim_func([ids, Q, S, te.compute((T_, D), f, name="out")])


def embed_q6(traits, T_: int, V: int, D: int):
    """Rows of a q6 table: the linear's codes (packed_code) times the f16 scale of their 32-k block."""
    g = layout_geo(traits, 1, V, D)
    ids = te.placeholder((T_,), I32, "ids")
    Q = te.placeholder((V * g.BPR,), "uint8", "Q")
    S = te.placeholder((V * g.KG,), U16, "S")

    def f(t, d):
        row = _row(ids, t, V)
        return packed_code(g, True, Q, row, d).astype(F32) * weight_scale(traits.scale, g, (), S, row, d // Q6_GROUP,
                                                                          half_to_f32)
    return te.create_prim_func([ids, Q, S, te.compute((T_, D), f, name="out")])


def rmsnorm(R: int, D: int, eps: float):
    x = te.placeholder((R, D), F32, "x")
    w = te.placeholder((D,), F32, "w")
    k = te.reduce_axis((0, D), "k")
    ss = te.compute((R,), lambda r: te.sum(x[r, k] * x[r, k], axis=k), name="ss")
    inv = te.compute((R,), lambda r: tirx.const(1, F32) / tirx.sqrt(ss[r] * tirx.const(1.0 / D, F32)
                                                                    + tirx.const(eps, F32)), name="inv")
    out = te.compute((R, D), lambda r, d: x[r, d] * inv[r] * w[d], name="out")
    return te.create_prim_func([x, w, out])


def _outputs(rows_sum, T_: int, N: int, segs, bias):
    """The linear's outputs: rows_sum(n, o, name) is the stage computing rows o .. o+n-1 (y[t, r] for weight row
    r + o); one such reduction per segment of rows (each its own GEMV / GEMM for the schedule rules), plus bias."""
    outs = []
    for s, (ns, o) in enumerate(zip(segs or (N,), offsets(segs or (N,)))):
        name = f"out{s}" if segs else "out"
        if bias is None:
            outs.append(rows_sum(ns, o, name))
        else:
            outs.append(_add_bias(rows_sum(ns, o, f"y{s}"), bias, o, name))
    return outs


def _add_bias(y, bias, o: int, name: str):
    return te.compute(y.shape, lambda t, r: y[t, r] + bias[r + o], name=name)


def linear(T_: int, N: int, K: int, wdtype: str, bias: bool, segs=()):
    x = te.placeholder((T_, K), F32, "x")
    W = _wt(wdtype, (N, K), "W")
    b = te.placeholder((N,), F32, "b") if bias else None

    def rows_sum(n: int, o: int, name: str):
        k = te.reduce_axis((0, K), "k")
        return te.compute((T_, n), lambda t, r: te.sum(x[t, k] * _wval(W, (r + o, k), wdtype), axis=k), name=name)
    return te.create_prim_func([x, W, *([b] if bias else []), *_outputs(rows_sum, T_, N, segs, b)])


def embed_packed(traits, T_: int, V: int, D: int, G: int | None):
    """Rows of a table in a packed scheme's layout (traits: the op's KernelTraits)."""
    if traits.layout == Q6_LAYOUT:
        return embed_q6(traits, T_, V, D)
    if traits.scale == "row":
        return embed_q8(T_, V, D)
    if LAYOUTS[traits.layout][0] == 8:   # q8g32: 8-bit codes with group scales
        return embed_q8(T_, V, D, traits.group_of(G))
    return embed_q4(T_, V, D, traits.group_of(G))


def linear_quant(traits, T_: int, N: int, K: int, G: int | None, bias: bool, segs=()):
    """Any packed layout the CPU's reference reads (q8 / q4 / q6 / t2: compiler/ops/linear_naive.py; traits: the
    op's KernelTraits): activations quantized to int8 per block of 32 (or per token), exact integer dot products
    per block, then f32 sums of block results (linear_naive.naive's math)."""
    q6 = traits.layout == Q6_LAYOUT
    g = layout_geo(traits, T_, N, K, G)
    per_token = traits.act == "token"
    QB = K if per_token else QA
    NQB = K // QB
    GB = g.G if traits.scale == "group" else K
    eps = EPS_TOKEN if per_token else EPS_BLOCK
    x = te.placeholder((T_, K), F32, "x")
    W = te.placeholder((N * g.BPR,), "uint8", "W")
    S = te.placeholder({"row": (N,), "group": (N * g.KG,), "matrix": (max(1, len(segs)),)}[traits.scale],
                       U16 if traits.scale == "group" else F32, "S")
    M = te.placeholder((N * g.KG,), U16, "M") if traits.minimum else None   # per-group minimums, as the scales
    b = te.placeholder((N,), F32, "b") if bias else None
    r = te.reduce_axis((0, QB), "r")
    amax = te.compute((T_, NQB), lambda t, qb: te.max(tirx.abs(x[t, qb * QB + r]), axis=r), name="amax")
    xq = te.compute((T_, K), lambda t, k: tirx.nearbyint(
        x[t, k] * (tirx.const(127, F32) / tirx.max(amax[t, k // QB], tirx.const(eps, F32)))).astype(I32), name="xq")
    r2 = te.reduce_axis((0, QB), "r2")
    isum = te.compute((T_, N, NQB), lambda t, n, qb: te.sum(
        packed_code(g, q6, W, n, qb * QB + r2) * xq[t, qb * QB + r2], axis=r2), name="isum")

    if M is not None:   # w = s * code + m: the block adds m * dx * sum(xq)
        r3 = te.reduce_axis((0, QB), "r3")
        xsum = te.compute((T_, NQB), lambda t, qb: te.sum(xq[t, qb * QB + r3], axis=r3), name="xsum")

    def block(t, rr, qb):
        dx = tirx.max(amax[t, qb], tirx.const(eps, F32)) / tirx.const(127, F32)
        y = isum[t, rr, qb].astype(F32) * (weight_scale(traits.scale, g, segs, S, rr, qb * QB // GB, half_to_f32) * dx)
        if M is not None:
            y = y + xsum[t, qb].astype(F32) * (weight_scale(traits.scale, g, segs, M, rr, qb * QB // GB, half_to_f32) * dx)
        return y

    def rows_sum(n: int, o: int, name: str):
        if NQB == 1:   # t2 (one block per token): no reduction (a 1-long one with a bias stage was scheduled wrong)
            return te.compute((T_, n), lambda t, rr: block(t, rr + o, 0), name=name)
        qbr = te.reduce_axis((0, NQB), "qbr")
        return te.compute((T_, n), lambda t, rr: te.sum(block(t, rr + o, qbr), axis=qbr), name=name)
    return te.create_prim_func([x, W, S, *([M] if M is not None else []), *([b] if bias else []),
                                *_outputs(rows_sum, T_, N, segs, b)])


GELU_C = 0.7978845608028654   # sqrt(2 / pi)


def rope(T_: int, H: int, D: int):
    half = D // 2
    x = te.placeholder((T_, H, D), F32, "x")
    cs = te.placeholder((T_, half), F32, "cs")
    sn = te.placeholder((T_, half), F32, "sn")

    def f(t, h, d):
        i = d % half
        lo, hi = x[t, h, i], x[t, h, half + i]
        return tirx.Select(d < half, lo * cs[t, i] - hi * sn[t, i], hi * cs[t, i] + lo * sn[t, i])
    return te.create_prim_func([x, cs, sn, te.compute((T_, H, D), f, name="out")])


def elementwise(kind: str, R: int, N: int, c: float = 1.0):
    a = te.placeholder((R, N), F32, "a")
    if kind == "copy":
        return te.create_prim_func([a, te.compute((R, N), lambda i, j: a[i, j], name="out")])
    if kind == "scale":
        return te.create_prim_func([a, te.compute((R, N), lambda i, j: a[i, j] * tirx.const(c, F32), name="out")])
    if kind == "softcap":
        return te.create_prim_func([a, te.compute(
            (R, N), lambda i, j: tirx.const(c, F32) * tirx.tanh(a[i, j] * tirx.const(1.0 / c, F32)), name="out")])
    b = te.placeholder((R, N), F32, "b")

    def f(i, j):
        if kind == "add":
            return a[i, j] + b[i, j]
        if kind == "relu2_mul":
            rl = tirx.max(a[i, j], tirx.const(0, F32))
            return rl * rl * b[i, j]
        if kind == "gelu_mul":  # gelu_tanh(g) * u = g * u * sigmoid(2 sqrt(2/pi) (g + 0.044715 g^3)); exp clamped
            g = a[i, j]
            z = g * (tirx.const(-2 * GELU_C, F32) - tirx.const(2 * GELU_C * 0.044715, F32) * g * g)
            return g * b[i, j] / (tirx.const(1, F32) + tirx.exp(tirx.min(z, tirx.const(88, F32))))
        g = a[i, j]  # swiglu: silu(g) * u
        return g * b[i, j] / (tirx.const(1, F32) + tirx.exp(tirx.const(0, F32) - g))
    return te.create_prim_func([a, b, te.compute((R, N), f, name="out")])


def attention(T_: int, NH: int, KVH: int, D: int, W: int = 0, cap: float = 0.0):
    """One work-group per (query, head), C work-items. Keys go in chunks of C: work-item j scores key j of the chunk
    (a dot product over D), then work-item d < D folds the chunk's scores into its output lane d with an online
    softmax (running max and sum kept per work-item; every work-item computes the same ones)."""
    G = NH // KVH
    C = min(ATTENTION_CHUNK_MAX, max(D, 32))
    scale = 1.0 / math.sqrt(D)
    NEG = -3.0e38
    WIN = W if W > 0 else 1 << 30  # keys j >= n - WIN are in the window

    @T.prim_func
    def kern(q: T.handle, k: T.handle, v: T.handle, o: T.handle):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
        S = T.int64()
        Q = T.match_buffer(q, (T_, NH, D), F32)
        Kc = T.match_buffer(k, (S, KVH, D), F32)
        Vc = T.match_buffer(v, (S, KVH, D), F32)
        O = T.match_buffer(o, (T_, NH * D), F32)
        for th in T.thread_binding(T_ * NH, thread="blockIdx.x"):
            for j in T.thread_binding(C, thread="threadIdx.x"):
                qs = T.alloc_buffer((D,), F32, scope="shared")
                sc = T.alloc_buffer((C,), F32, scope="shared")
                st = T.alloc_buffer((4,), F32, scope="local")  # running max, running sum, score, acc
                t: T.let = th // NH
                h: T.let = th % NH
                n: T.let = T.Cast("int32", S) - T_ + t + 1  # keys j < n are causal for this query
                lo: T.let = T.max(n - WIN, 0)
                for dd in range((D + C - 1) // C):
                    if dd * C + j < D:
                        qs[dd * C + j] = Q[t, h, dd * C + j] * T.float32(scale)
                st[0] = T.float32(NEG)
                st[1] = T.float32(0)
                st[3] = T.float32(0)
                for c in range((n - lo + C - 1) // C):
                    T.tvm_storage_sync("shared")
                    st[2] = T.float32(NEG)
                    if lo + c * C + j < n:
                        st[2] = T.float32(0)
                        for d in range(D):
                            st[2] = st[2] + qs[d] * Kc[lo + c * C + j, h // G, d]
                        if cap > 0:   # Gemma 2: cap * tanh(score / cap)
                            st[2] = T.float32(cap) * T.tanh(st[2] * T.float32(1.0 / cap))
                    sc[j] = st[2]
                    T.tvm_storage_sync("shared")
                    if j < D:
                        m_old: T.let = st[0]
                        st[2] = m_old
                        for i in range(C):
                            st[2] = T.max(st[2], sc[i])
                        st[0] = st[2]
                        st[1] = st[1] * T.exp(m_old - st[2])
                        st[3] = st[3] * T.exp(m_old - st[2])
                        for i in range(C):
                            if lo + c * C + i < n:
                                st[1] = st[1] + T.exp(sc[i] - st[0])
                                st[3] = st[3] + T.exp(sc[i] - st[0]) * Vc[lo + c * C + i, h // G, j]
                if j < D:
                    O[t, h * D + j] = st[3] / st[1]
    return kern


# dlight rules per op (compiler/opencl/build.py applies them in order; Fallback: one work-item per output element).
# The quantized linears keep Fallback: the reduction rules fuse their stages into one work-group and got t2 with a
# bias wrong (tests/test_opencl_kernels.py caught it); their integer block sums already give T*N*K/32 work-items.
RULES = {"linear": ("GEMV", "LowBatchGEMV", "Matmul", "Fallback"), "rmsnorm": ("Reduction", "GeneralReduction",
                                                                               "Fallback")}


def _build(op: str, p: dict):
    if p.get("rows"):
        raise UnsupportedOp(f"{op} with routed rows (mixture-of-experts prefill)")
    if op == "embed":
        return embed(p["T"], p["V"], p["D"], p["wdtype"])
    if op in KERNEL_OPS:   # the packed schemes' ops: built from their traits
        traits = KERNEL_OPS[op].traits
        if traits.kind == "embed":
            return embed_packed(traits, p["T"], p["V"], p["D"], p.get("G"))
        return linear_quant(traits, p["T"], p["N"], p["K"], p.get("G"), p["bias"], p["segs"])
    if op == "rmsnorm":
        return rmsnorm(p["R"], p["D"], p["eps"])
    if op == "linear":
        if p["KS"]:   # the CPU's K-sliced layout (compiler/ops/kslice.py): OpenCL packages store weights row-major
            raise UnsupportedOp("linear with a K-sliced weight (KS)")
        return linear(p["T"], p["N"], p["K"], p["wdtype"], p["bias"], p["segs"])
    if op == "rope":
        return rope(p["T"], p["H"], p["D"])
    if op == "attention":
        return attention(p["T"], p["NH"], p["KVH"], p["D"], p["W"], p["cap"])
    if op in ("add", "swiglu", "copy", "relu2_mul", "gelu_mul", "scale", "softcap"):
        R = p["R"] if "R" in p else p["T"]
        return elementwise(op, R, p["N"] if "N" in p else p["F"], p.get("c", 1.0))
    raise UnsupportedOp(op)


def make_kernel(op: str, cpu=None, **params):
    """(name, prim_func) with global_symbol == name; the names are the CPU kernels' (compiler/ops)."""
    if op not in OPS and op not in KERNEL_OPS:
        raise UnsupportedOp(f"the OpenCL backend has no {op} kernel")
    p = kernel_params(op, params)
    return _make_cached(op, tuple(sorted(p.items())))


@functools.lru_cache(maxsize=512)
def _make_cached(op: str, items: tuple):
    p = dict(items)
    name = kernel_name(op, p)
    return name, _build(op, p).with_attrs({"global_symbol": name, "edgellm.rules": list(RULES.get(op, ("Fallback",)))})


__all__ = ["OPS", "UnsupportedOp", "half_to_f32", "make_kernel"]
