"""Row-limited variants of the linear kernels: the grouped expert GEMMs of a prefill chunk (compiler/moe.py) and the
verify program's GEMMs (speculative decoding: a pass carries as many drafts as pay, the program has rows for more).

Some data-dependent n <= T of the [T, K] input's rows are real (rows 0..n-1). limit_rows(func, T) returns the kernel
with one more argument, cnt int32[1, 16] (n at [0, 0]), that skips the work of the rows >= n: every token-block loop
(a loop named `tb` over the T rows in blocks) runs block tb only when it may hold a row < n, and the per-token
activation quantization loops (named `t`, extent T) quantize only rows < n and store zeros for the others (the last
token block still multiplies the rows past n that share its tile: stale scales there, subnormals or NaNs, cost
Intel cores microcode assists: on a Xeon a pass of 7 rows cost 20% more than one of 8). The guard is conservative (block
size floor(T / blocks) <= the real one), so it never skips a needed row, and rows < n are computed by the unchanged
code: bitwise the same values as the unlimited kernel.

Outputs of rows >= n: left undefined (mode ROWS_LIMIT: nothing reads them, as the expert GEMMs' scatter), or set to
zero (ROWS_ZERO: the verify program's elementwise kernels still run every row, and stale arena bytes there could be
NaNs or subnormals, which some CPUs handle by slow microcode; zeros stay finite through every later kernel)."""
from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

CNT_SHAPE = (1, 16)   # one 64-byte row per routed slot (compiler/moe.py); the verify program's: contract.ROWS_BYTES
ROWS_OFF, ROWS_LIMIT, ROWS_ZERO = 0, 1, 2   # the `rows` kernel param
# a loop with this annotation [lo, hi] (extent 1) runs only when lo < n <= hi: a kernel's alternative token tilings of
# a panel, one per range of real rows (quant_common.token_tiles); in an unlimited kernel there is only one
ROWS_TIER = "edgellm_rows_tier"


def limit_rows(func, T_: int, guard_tokens: bool = True, zero_rest: bool = False):
    """func with the trailing cnt argument; guard_tokens: also limit the per-token loops named `t` (extent T);
    zero_rest: store zeros in the output rows >= n."""
    cnt = tirx.decl_buffer(CNT_SHAPE, "int32", "cnt")
    n = tirx.BufferLoad(cnt, [tirx.const(0, "int32"), tirx.const(0, "int32")])
    seen_tb = []
    stored = []
    zero_copies = []

    def on_for(node, m):
        node = m.default_mutate(node)
        name, ext = node.loop_var.name, node.extent
        if not isinstance(ext, tirx.IntImm):
            return node
        ext = int(ext.value)
        v = node.loop_var
        tier = node.annotations.get(ROWS_TIER) if node.annotations else None
        if tier is not None:
            lo, hi = (int(b) for b in tier)
            nn = tirx.Cast(v.ty.dtype, n)
            cond = tirx.And(tirx.const(lo, v.ty.dtype) < nn, nn <= tirx.const(hi, v.ty.dtype))
            return tirx.For(v, node.min, node.extent, node.kind, tirx.IfThenElse(cond, node.body, None),
                            node.thread_binding, {k: a for k, a in node.annotations.items() if k != ROWS_TIER})
        if name == "tb":
            seen_tb.append(ext)
        if name == "tb" and ext > 1:
            cond = v * tirx.const(T_ // ext, v.ty.dtype) < tirx.Cast(v.ty.dtype, n)
        elif name == "t" and ext == T_ and guard_tokens:
            zero_copies.append(v)
            return tirx.For(v, node.min, node.extent, node.kind,
                            tirx.IfThenElse(v < tirx.Cast(v.ty.dtype, n), node.body, _stores_of_zero(node.body)),
                            node.thread_binding, node.annotations)
        else:
            return node
        return tirx.For(v, node.min, node.extent, node.kind, tirx.IfThenElse(cond, node.body, None),
                        node.thread_binding, node.annotations)

    def on_store(node, m):
        stored.append(node.buffer)
        return node

    body = tvm_ffi.structural_mutate(func.body, [(tirx.For, on_for), (tirx.BufferStore, on_store)])
    if not seen_tb:
        raise ValueError("limit_rows: the kernel has no token-block loop `tb` to limit")
    if zero_rest:
        outs = [p for p in func.params if any(p.same_as(b) for b in stored)]
        body = tirx.SeqStmt([body, *(_zero_rows(o, T_, n) for o in outs)])   # after: some kernels store whole tiles
    func = tirx.PrimFunc([*func.params, cnt], body, func.ret_type, func.attrs)
    if not zero_copies:
        return func
    # the zero-storing copies of `t` bodies define their buffers and lets a second time: give them their own
    return tirx.transform.ConvertSSA()(tvm.IRModule({"f": func}))["f"]


def limit_tasks(func, T_: int, out, R: int, query):
    """The attention kernel's variant of limit_rows: inside its parallel loop `task`, each loop `r` over the R rows a
    task computes (query(task, r): the query row of row r) runs a row only when its query row is < n; the output
    rows >= n (out: the [T, N] output's param) are then set to zero (the verify program's o-projection reads none of
    them, but its stale rows would flow on)."""
    cnt = tirx.decl_buffer(CNT_SHAPE, "int32", "cnt")
    n = tirx.BufferLoad(cnt, [tirx.const(0, "int32"), tirx.const(0, "int32")])
    task = []
    limited = []

    def on_for(node, m):
        name = node.loop_var.name
        if name == "task":
            task.append(node.loop_var)
        try:
            node = m.default_mutate(node)
        finally:
            if name == "task":
                task.pop()
        if name != "r" or not task or not isinstance(node.extent, tirx.IntImm) or int(node.extent.value) != R:
            return node
        v = node.loop_var
        limited.append(v)
        cond = query(task[-1], v) < tirx.Cast(v.ty.dtype, n)
        return tirx.For(v, node.min, node.extent, node.kind, tirx.IfThenElse(cond, node.body, None),
                        node.thread_binding, node.annotations)

    body = tvm_ffi.structural_mutate(func.body, [(tirx.For, on_for)])
    if not limited:
        raise ValueError("limit_tasks: the kernel has no row loop `r` inside a loop `task`")
    body = tirx.SeqStmt([body, _zero_rows(out, T_, n)])
    return tirx.PrimFunc([*func.params, cnt], body, func.ret_type, func.attrs)


def _stores_of_zero(stmt):
    """stmt with every store's value replaced by zero of its type: the same buffers and elements written, no input
    read for them (what is left computes on its own zeroed scratch, which LLVM folds away)."""
    def on_store(node, m):
        return tirx.BufferStore(node.buffer, tirx.const(0, node.value.ty.dtype), node.indices)

    return tvm_ffi.structural_mutate(stmt, [(tirx.BufferStore, on_store)])


def _zero_rows(out, T_: int, n):
    """out[t, :] = 0 for t in n..T-1 (out: a [T, N] float output), 16 lanes at a time where N allows."""
    if len(out.ty.shape) != 2 or int(out.ty.shape[0]) != T_:
        raise ValueError(f"limit_rows: output {out.name} is not [T={T_}, N]")
    N, dt = int(out.ty.shape[1]), out.ty.dtype
    L = 16 if N % 16 == 0 else 1
    t, j, lane = (tirx.Var(name, "int32") for name in ("t_zero", "j_zero", "l_zero"))
    store = tirx.BufferStore(out, tirx.const(0, dt), [t, j * L + lane])
    zero, loop = tirx.const(0, "int32"), tirx.ForKind
    inner = tirx.For(j, zero, tirx.const(N // L, "int32"), loop.SERIAL,
                     tirx.For(lane, zero, tirx.const(L, "int32"), loop.VECTORIZED if L > 1 else loop.SERIAL, store))
    return tirx.For(t, zero, tirx.const(T_, "int32"), loop.SERIAL, tirx.IfThenElse(t >= n, inner, None))
