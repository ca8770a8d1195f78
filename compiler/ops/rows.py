"""Row-limited variants of the linear kernels, for the grouped expert GEMMs of a prefill chunk (compiler/moe.py).

An expert sees a data-dependent number n <= T of the chunk's tokens, gathered into rows 0..n-1 of a [T, K] buffer.
limit_rows(func, T) returns the kernel with one more argument, cnt int32[1, 16] (n at [0, 0]), that skips the work
of the rows >= n: every token-block loop (a loop named `tb` over the T rows in blocks) runs block tb only when it
may hold a row < n, and the per-token activation quantization loops (named `t`, extent T) only rows < n. Outputs of
rows >= n are left undefined: nothing reads them. The guard is conservative (block size floor(T / blocks) <= the
real one), so it never skips a needed row, and rows < n are computed by the unchanged code: bitwise the same values
as the unlimited kernel."""
from __future__ import annotations

import tvm_ffi
from tvm import tirx

CNT_SHAPE = (1, 16)   # one 64-byte row per routed slot (compiler/moe.py)


def limit_rows(func, T_: int, guard_tokens: bool = True):
    """func with the trailing cnt argument; guard_tokens: also limit the per-token loops named `t` (extent T)."""
    cnt = tirx.decl_buffer(CNT_SHAPE, "int32", "cnt")
    n = tirx.BufferLoad(cnt, [tirx.const(0, "int32"), tirx.const(0, "int32")])
    seen_tb = []

    def on_for(node, m):
        node = m.default_mutate(node)
        name, ext = node.loop_var.name, node.extent
        if not isinstance(ext, tirx.IntImm):
            return node
        ext = int(ext.value)
        v = node.loop_var
        if name == "tb":
            seen_tb.append(ext)
        if name == "tb" and ext > 1:
            cond = v * tirx.const(T_ // ext, v.ty.dtype) < tirx.Cast(v.ty.dtype, n)
        elif name == "t" and ext == T_ and guard_tokens:
            cond = v < tirx.Cast(v.ty.dtype, n)
        else:
            return node
        return tirx.For(v, node.min, node.extent, node.kind, tirx.IfThenElse(cond, node.body, None),
                        node.thread_binding, node.annotations)

    body = tvm_ffi.structural_mutate(func.body, [(tirx.For, on_for)])
    if not seen_tb:
        raise ValueError("limit_rows: the kernel has no token-block loop `tb` to limit")
    return tirx.PrimFunc([*func.params, cnt], body, func.ret_type, func.attrs)
