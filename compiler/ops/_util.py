"""Shared helpers for the kernel library: kernel names, fast exp, block-size choice."""
from __future__ import annotations

import re

from tvm import tirx

F32 = "float32"
WDTYPES = {"float32": "f32", "float16": "f16"}

# Elementwise kernels are split over threads only when they touch at least this many elements.
PARALLEL_MIN_ELEMS = 1 << 16

# Scratch buffers: this TVM (0.27) lowers every "local"-scope allocation to a TVMBackendAllocWorkspace
# call (once per iteration of the enclosing loop), while a "global"-scope allocation of constant size
# < 1024 bytes becomes an LLVM alloca (stack; promotable to registers). So kernels allocate scratch with
# scope="global" and keep register-intended buffers under 1 KiB; bigger scratch becomes a workspace
# allocation per parallel task (fine, the runtime provides it). The "disable_lower_builtin" annotation
# would force a stack alloca but is dropped by StorageRewrite in the default pipeline; it is kept for
# pipelines that skip that pass.
STACK = {"disable_lower_builtin": True}

# Buffers the runtime may pass as views at a per-token offset (RoPE table rows, K/V cache rows written at the
# current position) are only guaranteed element alignment; declaring it stops LLVM from emitting aligned vector
# moves (vmovaps faults on a 32-byte aligned address). Unaligned moves on aligned data cost nothing on x86/ARM.
VIEW_ALIGN = 4


def fmt_param(v) -> str:
    """C-identifier-safe, deterministic rendering of a kernel parameter value."""
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        s = repr(v)  # shortest round-trip form, e.g. 1e-06, 0.5
        return s.replace("-", "m").replace("+", "").replace(".", "p")
    if isinstance(v, str):
        s = WDTYPES.get(v, v)
        return re.sub(r"[^0-9A-Za-z]", "_", s)
    raise TypeError(f"unsupported kernel parameter {v!r}")


def kernel_name(op: str, parts: list[tuple[str, object]]) -> str:
    name = op + "".join(f"_{k}{fmt_param(v)}" for k, v in parts)
    assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name), name
    return name


def pow2_divisor(n: int, cap: int) -> int:
    """Largest power of two <= cap dividing n."""
    v = 1
    while v * 2 <= cap and n % (v * 2) == 0:
        v *= 2
    return v


def fast_exp(x):
    """exp(x) for float32 as a vectorizable TIR expression (Cephes expf: range reduction to
    [-ln2/2, ln2/2], degree-6 polynomial, 2^n by exponent-bit construction). Relative error ~2 ulp.
    Inputs are clamped to [-88, 88]; exp(x < -88) returns 0 (denormals are flushed), never NaN/Inf.
    LLVM would otherwise scalarize exp into libm expf calls."""
    def f(v):
        return tirx.const(v, F32)

    x = tirx.max(tirx.min(x, f(88.0)), f(-88.0))
    fx = tirx.floor(x * f(1.4426950408889634) + f(0.5))
    r = x - fx * f(0.693359375) + fx * f(2.12194440e-4)
    p = f(1.9875691500e-4)
    for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        p = p * r + f(c)
    y = p * (r * r) + r + f(1.0)
    bits = tirx.shift_left(fx.astype("int32") + 127, tirx.const(23, "int32"))
    return y * tirx.reinterpret(F32, bits)


def fast_tanh(x):
    """tanh(x) for float32 from fast_exp: sign(x) (1 - e) / (1 + e), e = exp(-2|x|) (absolute error ~1e-7; exactly
    +-1 past |x| = 44). Logit soft-capping (Gemma 2) is cap * tanh(s / cap)."""
    e = fast_exp(tirx.const(-2.0, F32) * tirx.abs(x))
    t = (tirx.const(1.0, F32) - e) / (tirx.const(1.0, F32) + e)
    return tirx.Select(x < tirx.const(0.0, F32), tirx.const(0.0, F32) - t, t)


def _tree(vals, op):
    while len(vals) > 1:
        nxt = [op(vals[i], vals[i + 1]) for i in range(0, len(vals) - 1, 2)]
        if len(vals) % 2:
            nxt.append(vals[-1])
        vals = nxt
    return vals[0]


def hsum(buf, n, off=0):
    return _tree([buf[off + i] for i in range(n)], lambda a, b: a + b)


def hmax(buf, n, off=0):
    return _tree([buf[off + i] for i in range(n)], lambda a, b: tirx.max(a, b))


def _vtree(buf, n, off, op):
    """_tree's reduction of buf[off:off + n] (n a power of two) as vector shuffles: each level combines the even lanes
    with the odd ones, the pairs _tree combines, so the result is bitwise its (LLVM lowered _tree's scalar loads of a
    vector just stored into ~20 dependent scalar instructions for 16 lanes)."""
    if n & (n - 1) or n < 2:
        return _tree([buf[off + i] for i in range(n)], op)
    v, binds = buf[tirx.Ramp(off, 1, n)], []
    while n > 1:
        var = tirx.Var(f"vt{len(binds)}", f"float32x{n}")
        binds.append((var, v))
        v = op(tirx.Shuffle([var], list(range(0, n, 2))), tirx.Shuffle([var], list(range(1, n, 2))))
        n //= 2
    return let_wrap(v, binds)


def vhsum(buf, n, off=0):
    """hsum, bitwise, as vector shuffles (n a power of two)."""
    return _vtree(buf, n, off, lambda a, b: a + b)


def vhmax(buf, n, off=0):
    """hmax, bitwise, as vector shuffles (n a power of two)."""
    return _vtree(buf, n, off, lambda a, b: tirx.max(a, b))


def tree_reduce(vecs, W):
    """Transpose-reduce: vecs[i] is a W-lane vector of partial sums for item i (len(vecs) a multiple of
    W, W a power of two); returns len(vecs)//W vectors of W lanes whose lane k holds the full sum of
    item k (of its group of W items). Each pairwise step halves the partial lanes with two shuffles and
    one add: ~2 shuffles per item instead of a full horizontal reduction each.
    Intermediate vectors are returned through let-bound variables (see let_wrap) so every value is
    referenced once: a plain expression tree would duplicate each level twice (4^levels nodes) and make
    the TIR passes slow."""
    binds = []
    P = W
    while P > 1:
        K = W // P  # items per vector so far, each with P partial lanes
        nxt = []
        for i in range(0, len(vecs), 2):
            a, b = vecs[i], vecs[i + 1]
            lo, hi = [], []
            for src in (0, 1):
                for kk in range(K):
                    base = src * W + kk * P
                    lo += range(base, base + P // 2)
                    hi += range(base + P // 2, base + P)
            v = tirx.Var(f"tr{len(binds)}", f"float32x{W}")
            binds.append((v, tirx.Shuffle([a, b], lo) + tirx.Shuffle([a, b], hi)))
            nxt.append(v)
        vecs = nxt
        P //= 2
    return vecs, binds


def let_wrap(expr, binds):
    for v, value in reversed(binds):
        expr = tirx.Let(v, value, expr)
    return expr


def concat_vecs(vecs, w):
    """Concatenate a power-of-two count of w-lane vectors into one vector."""
    while len(vecs) > 1:
        vecs = [tirx.Shuffle([vecs[i], vecs[i + 1]], list(range(2 * w))) for i in range(0, len(vecs), 2)]
        w *= 2
    return vecs[0]


def prefetch(buf, idx, locality: int = 3):
    """Software prefetch of the cache line holding buf[idx] (read; locality 3: into L1, 2: into L2)."""
    from tvm.script import tirx as T

    return T.evaluate(T.call_llvm_intrin("void", "llvm.prefetch.p0", T.address_of(buf[idx]), 0, locality, 1))
