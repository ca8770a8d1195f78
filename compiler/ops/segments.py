"""Fused linear kernels: one kernel computes several matrices stacked row-wise (q/k/v, gate/up) and writes each
matrix's rows to its own output buffer.

A linear kernel is written once, for one output O f32[T, N]; split_output turns it into the fused variant by
rewriting its stores: the output param becomes one param per segment, out_s f32[T, N_s] (in segment order), and
every store O[t, n] = v goes to the segment holding row n, out_s[t, n - off_s]. Nothing else changes, so each
output element is computed by exactly the same code as in the unfused kernel (bitwise equal results); the extra
cost is a compare per scalar store. A store inside a vectorized loop (a 16-row panel) dispatches on the lanes'
first row when the segment bounds are multiples of the vector (one compare per vector store); a vector that may
straddle a bound gets per-lane stores in that branch only.
"""
from __future__ import annotations

import functools
import itertools

import tvm_ffi
from tvm import tirx
from tvm.ir.expr import TensorLoad, Var   # TensorLoad: the class of a tirx.BufferLoad
from tvm.sym import Analyzer


def check_segs(segs, N: int) -> tuple[int, ...]:
    """segs normalized to a tuple of ints: () (unfused) or >= 2 positive row counts summing to N."""
    segs = tuple(segs or ())
    if not segs:
        return ()
    if len(segs) < 2 or any(isinstance(s, bool) or int(s) != s or int(s) < 1 for s in segs):
        raise ValueError(f"segs must be () or at least 2 positive row counts, got {segs!r}")
    segs = tuple(int(s) for s in segs)
    if sum(segs) != N:
        raise ValueError(f"segs {segs} sum to {sum(segs)}, not N={N}")
    return segs


def offsets(segs) -> list[int]:
    """First row of each segment, then N."""
    return [0, *itertools.accumulate(segs)]


def split_output(func, segs, seg_param: int | None = None):
    """The kernel `func` (last param O f32[T, N]) with one output param per segment of rows. seg_param: index of a
    param holding one value per segment (t2's per-matrix scale S f32[nseg]) that the stores read as S[0]; each
    segment's stores read S[s] instead."""
    O = func.params[-1]
    T_, N = (int(d) for d in O.ty.shape)
    off = offsets(check_segs(segs, N))
    outs = [tirx.decl_buffer((T_, n), O.ty.dtype, f"{O.name}{s}", data_alignment=O.ty.data_alignment)
            for s, n in enumerate(segs)]
    S = func.params[seg_param] if seg_param is not None else None
    vec: list[tuple[Var, int]] = []   # enclosing vectorized loops (var, extent)

    def put(store, t, n, s):
        """store's value into segment s's output."""
        value = store.value if S is None else _per_segment(store.value, S, s)
        return tirx.BufferStore(outs[s], value, [t, n - tirx.const(off[s], _dt(n))])

    def on_for(node, m):
        if node.kind != tirx.ForKind.VECTORIZED:
            return m.default_mutate(node)
        vec.append((node.loop_var, int(node.extent)))
        try:
            return m.default_mutate(node)
        finally:
            vec.pop()

    def on_store(node, m):
        if not node.buffer.same_as(O):
            return node
        t, n = node.indices
        to = functools.partial(put, node, t, n)
        lane = [(v, e) for v, e in vec if _uses(n, v)]
        if len(lane) > 1:
            raise ValueError("split_output: a store index over two vectorized loops")
        if not lane:
            return _chain(n, off, to)
        v, E = lane[0]
        ana = Analyzer()
        base = ana.simplify(_subst(n, v, tirx.const(0, _dt(v))))
        if not ana.can_prove_equal(n, base + v):
            return _chain(n, off, to)   # not base + lane: the vectorizer scalarizes the dispatch
        ms = ana.modular_set(base)
        if all(o % E == 0 for o in off) and ms.coeff % E == 0 and ms.base % E == 0:
            return _chain(base, off, to)   # the vector's rows never straddle a segment bound
        return _ranges(base, E, off, to, _chain(n, off, to))

    if S is not None and int(S.ty.shape[0]) != len(segs):
        raise ValueError(f"split_output: {S.name} needs one entry per segment, has shape {list(S.ty.shape)}")
    body = tvm_ffi.structural_mutate(func.body, [(tirx.For, on_for), (tirx.BufferStore, on_store)])
    return tirx.PrimFunc([*func.params[:-1], *outs], body, func.ret_type, func.attrs)


def _chain(n, off, put):
    """if n < off[1]: put(0) elif n < off[2]: put(1) ... else put(last)."""
    stmt = put(len(off) - 2)
    for s in range(len(off) - 3, -1, -1):
        stmt = tirx.IfThenElse(n < tirx.const(off[s + 1], _dt(n)), put(s), stmt)
    return stmt


def _ranges(base, E, off, put, straddle):
    """The segment holding all of rows base .. base+E-1, else the per-lane dispatch `straddle`."""
    stmt = straddle
    for s in range(len(off) - 2, -1, -1):
        lo, hi = tirx.const(off[s], _dt(base)), tirx.const(off[s + 1] - E, _dt(base))
        stmt = tirx.IfThenElse(tirx.And(lo <= base, base <= hi), put(s), stmt)
    return stmt


def _dt(expr) -> str:
    """The dtype of a scalar expression (a scalar Var has no .dtype here)."""
    return str(expr.ty.dtype)


def _uses(expr, var) -> bool:
    found = []
    tvm_ffi.structural_walk(expr, [(Var, lambda x: found.append(x) if x.same_as(var) else None)])
    return bool(found)


def _subst(expr, var, value):
    return tvm_ffi.structural_map(expr, [(Var, lambda x: value if x.same_as(var) else x)])


def _per_segment(expr, S, s: int):
    """expr with its loads S[0] replaced by S[s]."""
    def load(x):
        if x.source.same_as(S):
            return tirx.BufferLoad(S, [tirx.const(s, _dt(x.indices[0]))])
        return x
    return tvm_ffi.structural_map(expr, [(TensorLoad, load)])
