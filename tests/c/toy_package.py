"""A hand-made edgellm package for testing libedgellm without the compiler: TVM kernels + plan.bin + weights.bin.

The toy "model" (D = 16, H x Dh = 2 x 8, vocab 32, 2 layers, chunk 4, max_ctx 11) exercises every arg kind:
    x  = E[ids]                                    embed      (WEIGHT table, int32 ids from the arena)
    y  = x * scale + P[pos + t]                    posadd     (sch.parallel; WEIGHT with EL_FLAG_AT_POS)
    per layer l (weights ab_l = [a, b]):
      K_l[pos + t] = y * a ; V_l[pos + t] = y + b  kvwrite    (KCACHE / VCACHE with EL_FLAG_AT_POS)
      y[t] += 0.1 * sum_{s <= pos + t} (0.5 K_l[s] + 0.25 V_l[s])
                                                   attn       (KCACHE / VCACHE with EL_FLAG_PREFIX, symbolic S;
                                                               the [S, H, Dh] temp goes through AllocWorkspace)
    logits = y @ W.T                               lmhead     (sch.parallel)
`reference()` computes it token by token in numpy (no chunks, no padding): the oracle.

`plan_bytes(routed=True)` adds, before the head, a mixture-of-experts-shaped routed layer (plan v2's ROUTE step):
    ids[2t + j] = (floor(10 |y[t, 0]|) + j) % NE   router     (int32 expert ids, j < 2)
    xd[2t + j] = y[t]                               dispatch
    for each i: yd[i] = xd[i] * Ex[ids[i]]          expert_1   (ROUTE body: EL_FLAG_SLOT rows, EL_FLAG_EXPERT weights)
    y[t] += 0.5 * (yd[2t] + yd[2t + 1])             combine

Run as a script to write a package: python tests/c/toy_package.py OUT_DIR [path/to/kernel_shim.c]
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from edgellm.runtime import contract as K  # the plan.bin layout, shared with the compiler
from edgellm.runtime.contract import ARG, HEADER, KERNEL, PROGRAM, STEP, WEIGHT

V, D, H, DH, C, MAX_CTX, L, NE = 32, 16, 2, 8, 4, 11, 2, 3
KV_ROWS = MAX_CTX + C
ALIGN = K.WEIGHT_ALIGN

ARENA, WEIGHT_ARG, KCACHE, VCACHE = K.ARG_ARENA, K.ARG_WEIGHT, K.ARG_KCACHE, K.ARG_VCACHE
AT_POS, PREFIX, EXPERT, SLOT = K.FLAG_AT_POS, K.FLAG_PREFIX, K.FLAG_EXPERT, K.FLAG_SLOT
F32, I32 = (2, 32), (0, 32)

# arena layout (bytes): every buffer 64-byte aligned (TVM kernels assume it)
IDS, X, A, B, LOGITS = 0, 64, 320, 576, 832
RIDS, XD, YD = 1344, 1408, 1920          # routed layer: 2 ids per token, dispatched rows, expert outputs
ARENA_BYTES = YD + 2 * C * D * 4

BASE_KERNELS = ("embed", "posadd", "kvwrite", "attn", "lmhead")
ROUTED_KERNELS = ("router", "dispatch", "combine")
KERNELS = [f"{k}_{t}" for t in (C, 1) for k in BASE_KERNELS + ROUTED_KERNELS] + ["expert_1"]
# (n_args, written args, flags) of each kernel, as the compiler's kernel table records them
KERNEL_INFO = {"embed": (3, 0b100, 0), "posadd": (4, 0b1000, 0), "kvwrite": (4, 0b1100, K.KERNEL_WRITES_KV),
               "attn": (4, 0b1000, 0), "lmhead": (3, 0b100, 0), "router": (2, 0b10, 0), "dispatch": (2, 0b10, 0),
               "combine": (3, 0b100, 0), "expert": (3, 0b100, 0)}


def kernel_entries(kernels=None) -> list[tuple[str, int, int, int]]:
    """(name, n_args, flags, writes) per kernel: the kernel table of plan.bin and of kernels.so."""
    out = []
    for k in kernels or KERNELS:
        n, writes, flags = KERNEL_INFO.get(k.rsplit("_", 1)[0], (1, 1, 0))
        out.append((k, n, flags, writes))
    return out


def build_kernels(out_o: Path, target: dict | None = None) -> None:
    """Compiles the toy kernels with TVM into an object file (kernels.o); target: a TVM target dict (host llvm)."""
    import tvm
    from tvm import s_tir, te, tirx

    def embed(T):
        ids = te.placeholder((T,), "int32", "ids")
        E = te.placeholder((V, D), "float32", "E")
        # ids are clamped: a gather must stay in bounds whatever the arena holds (a corrupt plan may point the
        # kernel at the wrong bytes; the runtime bounds-checks views, not the values inside them)
        x = te.compute((T, D), lambda t, d: E[tirx.max(tirx.min(ids[t], V - 1), 0), d], name="x")
        return te.create_prim_func([ids, E, x])

    def posadd(T):
        x = te.placeholder((T, D), "float32", "x")
        s = te.placeholder((D,), "float32", "scale")
        P = te.placeholder((T, D), "float32", "P")
        y = te.compute((T, D), lambda t, d: x[t, d] * s[d] + P[t, d], name="y")
        sch = s_tir.Schedule(te.create_prim_func([x, s, P, y]))
        sch.parallel(sch.fuse(*sch.get_loops(sch.get_sblock("y"))))
        return sch.mod["main"]

    def kvwrite(T):
        x = te.placeholder((T, D), "float32", "x")
        ab = te.placeholder((2,), "float32", "ab")
        k = te.compute((T, H, DH), lambda t, h, e: x[t, h * DH + e] * ab[0], name="k")
        v = te.compute((T, H, DH), lambda t, h, e: x[t, h * DH + e] + ab[1], name="v")
        return te.create_prim_func([x, ab, k, v])

    def attn(T):
        S = tirx.Var("S", "int64")
        K = te.placeholder((S, H, DH), "float32", "K")
        Vc = te.placeholder((S, H, DH), "float32", "V")
        x = te.placeholder((T, D), "float32", "x")
        tmp = te.compute((S, H, DH), lambda s, h, e: K[s, h, e] * 0.5 + Vc[s, h, e] * 0.25, name="tmp")
        r = te.reduce_axis((0, S), "r")
        acc = te.compute((T, D), lambda t, d: te.sum(
            tirx.if_then_else(r <= S - T + t, tmp[r, d // DH, d % DH], tirx.const(0.0, "float32")), axis=r),
            name="acc")
        y = te.compute((T, D), lambda t, d: x[t, d] + acc[t, d] * 0.1, name="y")
        return te.create_prim_func([K, Vc, x, y])

    def lmhead(T):
        x = te.placeholder((T, D), "float32", "x")
        W = te.placeholder((V, D), "float32", "W")
        k = te.reduce_axis((0, D), "k")
        y = te.compute((T, V), lambda t, v: te.sum(x[t, k] * W[v, k], axis=k), name="logits")
        sch = s_tir.Schedule(te.create_prim_func([x, W, y]))
        t, v, _ = sch.get_loops(sch.get_sblock("logits"))
        sch.parallel(sch.fuse(t, v))
        return sch.mod["main"]

    def router(T):
        y = te.placeholder((T, D), "float32", "y")
        ids = te.compute((2 * T,), lambda i: (tirx.Cast("int32", tirx.floor(tirx.abs(y[i // 2, 0]) * 10.0)) + i % 2)
                         % NE, name="ids")
        return te.create_prim_func([y, ids])

    def dispatch(T):
        y = te.placeholder((T, D), "float32", "y")
        xd = te.compute((2 * T, D), lambda i, d: y[i // 2, d], name="xd")
        return te.create_prim_func([y, xd])

    def expert():
        x = te.placeholder((1, D), "float32", "x")
        w = te.placeholder((D,), "float32", "w")
        out = te.compute((1, D), lambda t, d: x[t, d] * w[d], name="out")
        return te.create_prim_func([x, w, out])

    def combine(T):
        y = te.placeholder((T, D), "float32", "y")
        yd = te.placeholder((2 * T, D), "float32", "yd")
        out = te.compute((T, D), lambda t, d: y[t, d] + 0.5 * (yd[2 * t, d] + yd[2 * t + 1, d]), name="out")
        return te.create_prim_func([y, yd, out])

    from edgellm.compiler.kernel_table import written_args

    funcs = {}
    for T in (C, 1):
        for name, fn in (("embed", embed), ("posadd", posadd), ("kvwrite", kvwrite), ("attn", attn),
                         ("lmhead", lmhead), ("router", router), ("dispatch", dispatch), ("combine", combine)):
            funcs[f"{name}_{T}"] = fn(T).with_attr("global_symbol", f"{name}_{T}")
    funcs["expert_1"] = expert().with_attr("global_symbol", "expert_1")
    for name, f in funcs.items():   # the hand-written table must say what the kernels really write
        n, writes, _ = KERNEL_INFO[name.rsplit("_", 1)[0]]
        assert (len(f.params), written_args(f, name)) == (n, writes), name
    ex = tvm.compile(tvm.IRModule(funcs), target=tvm.target.Target(target or {"kind": "llvm"}))
    ex.mod.write_to_file(str(out_o))


def link_kernels(obj: Path, shim: Path, out_so: Path, cc: str = "gcc", table: list | None = None) -> None:
    """kernels.so from the kernels object, the error shim and the kernel table (table None: the toy's own)."""
    from edgellm.compiler.kernel_table import write_kernel_table

    src = write_kernel_table(kernel_entries() if table is None else table, out_so.with_name(out_so.stem + "_table.c"))
    subprocess.run([cc, "-shared", "-fPIC", "-O2", str(obj), str(shim), str(src), "-o", str(out_so), "-lm",
                    "-Wl,-Bsymbolic"], check=True)


def make_weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = {"E": rng.standard_normal((V, D)), "scale": rng.uniform(0.5, 1.5, D), "P": rng.standard_normal((KV_ROWS, D)),
         "W": rng.standard_normal((V, D)) * 0.5}
    for layer in range(L):
        w[f"ab{layer}"] = np.array([0.5 + 0.25 * layer, 0.1 * (layer + 1)])
    for e in range(NE):
        w[f"ex{e}"] = rng.uniform(-1.0, 1.0, D)
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in w.items()}


WEIGHT_ORDER = ["E", "scale", "P", "W"] + [f"ab{layer}" for layer in range(L)] + [f"ex{e}" for e in range(NE)]


def reference(w: dict[str, np.ndarray], ids: list[int], routed: bool = False) -> np.ndarray:
    """Logits [len(ids), V] computed one token at a time in float64."""
    Kc = np.zeros((L, KV_ROWS, D))
    Vc = np.zeros((L, KV_ROWS, D))
    out = []
    for pos, tok in enumerate(ids):
        y = w["E"][tok].astype(np.float64) * w["scale"] + w["P"][pos]
        for layer in range(L):
            a, b = w[f"ab{layer}"]
            Kc[layer, pos], Vc[layer, pos] = y * a, y + b
            y = y + 0.1 * (0.5 * Kc[layer, :pos + 1] + 0.25 * Vc[layer, :pos + 1]).sum(0)
        if routed:
            y32 = y.astype(np.float32)   # the router sees the f32 activations the kernels hold
            e0 = int(np.floor(np.float32(abs(y32[0])) * np.float32(10.0))) % NE
            y = y + 0.5 * (y * w[f"ex{e0}"] + y * w[f"ex{(e0 + 1) % NE}"])
        out.append(w["W"].astype(np.float64) @ y)
    return np.array(out)


def arg(kind, index=0, offset=0, shape=(), dtype=F32, flags=0, stride=0) -> bytes:
    return ARG.pack(kind=kind, index=index, dtype_code=dtype[0], dtype_bits=dtype[1], dtype_lanes=1, ndim=len(shape),
                    flags=flags, expert_stride=stride, offset=offset, shape=list(shape) + [0] * (4 - len(shape)))


def step(kernel: int, args: list[bytes]) -> bytes:
    return STEP.pack(kind=K.STEP_CALL, kernel=kernel, n_args=len(args), n_body=0, ids_offset=0, n_select=0,
                     n_experts=0) + b"".join(args)


def route(ids_offset: int, n_select: int, n_experts: int, n_body: int) -> bytes:
    return STEP.pack(kind=K.STEP_ROUTE, kernel=0, n_args=0, n_body=n_body, ids_offset=ids_offset, n_select=n_select,
                     n_experts=n_experts)


def program(name: str, T: int, in_off: int, out_off: int, row_bytes: int, steps: list, version: int = K.PLAN_VERSION,
            backend: str = K.BACKEND_TVM_CPU) -> bytes:
    """steps: (kernel, args) calls, or ready-made step bytes (a ROUTE header counts as one step). Plans before
    version 4 number the backend instead of naming it."""
    body = b"".join(s if isinstance(s, bytes) else step(*s) for s in steps)
    common = dict(name=name.encode(), tokens=T, n_steps=len(steps), in_offset=in_off, out_offset=out_off,
                  out_row_bytes=row_bytes, flags=0)
    if version < 4:
        return K.PROGRAM_V3.pack(**common, backend=K.BACKENDS.index(backend)) + body
    return PROGRAM.pack(**common, backend=backend.encode(), reserved=0) + body


def routed_steps(T: int, cur: int, other: int) -> tuple[list, int]:
    """The routed layer on hidden state `cur`; returns (steps, arena offset of its output)."""
    k = {n: i for i, n in enumerate(KERNELS)}
    first_expert = WEIGHT_ORDER.index("ex0")
    steps = [(k[f"router_{T}"], [arg(ARENA, 0, cur, (T, D)), arg(ARENA, 0, RIDS, (2 * T,), I32)]),
             (k[f"dispatch_{T}"], [arg(ARENA, 0, cur, (T, D)), arg(ARENA, 0, XD, (2 * T, D))]),
             route(RIDS, 2 * T, NE, 1),
             (k["expert_1"], [arg(ARENA, 0, XD, (1, D), flags=SLOT),
                              arg(WEIGHT_ARG, first_expert, 0, (D,), flags=EXPERT, stride=1),
                              arg(ARENA, 0, YD, (1, D), flags=SLOT)]),
             (k[f"combine_{T}"], [arg(ARENA, 0, cur, (T, D)), arg(ARENA, 0, YD, (2 * T, D)),
                                  arg(ARENA, 0, other, (T, D))])]
    return steps, other


def body_steps(T: int, with_head: bool, routed: bool = False) -> tuple[list, int]:
    """Steps of the model body for T tokens; returns (steps, arena offset of the final hidden state)."""
    wi = {n: i for i, n in enumerate(WEIGHT_ORDER)}
    k = {n: i for i, n in enumerate(KERNELS)}
    steps = [
        (k[f"embed_{T}"], [arg(ARENA, 0, IDS, (T,), I32), arg(WEIGHT_ARG, wi["E"], 0, (V, D)),
                           arg(ARENA, 0, X, (T, D))]),
        (k[f"posadd_{T}"], [arg(ARENA, 0, X, (T, D)), arg(WEIGHT_ARG, wi["scale"], 0, (D,)),
                            arg(WEIGHT_ARG, wi["P"], 0, (T, D), flags=AT_POS), arg(ARENA, 0, A, (T, D))]),
    ]
    cur, other = A, B
    for layer in range(L):
        steps.append((k[f"kvwrite_{T}"], [arg(ARENA, 0, cur, (T, D)), arg(WEIGHT_ARG, wi[f"ab{layer}"], 0, (2,)),
                                          arg(KCACHE, layer, 0, (T, H, DH), flags=AT_POS),
                                          arg(VCACHE, layer, 0, (T, H, DH), flags=AT_POS)]))
        steps.append((k[f"attn_{T}"], [arg(KCACHE, layer, 0, (T, H, DH), flags=PREFIX),
                                       arg(VCACHE, layer, 0, (T, H, DH), flags=PREFIX),
                                       arg(ARENA, 0, cur, (T, D)), arg(ARENA, 0, other, (T, D))]))
        cur, other = other, cur
    if routed:
        more, cur = routed_steps(T, cur, other)
        steps += more
    if with_head:
        steps.append((k[f"lmhead_{T}"], [arg(ARENA, 0, cur, (T, D)), arg(WEIGHT_ARG, wi["W"], 0, (V, D)),
                                         arg(ARENA, 0, LOGITS, (T, V))]))
    return steps, cur


def plan_bytes(version: int = K.PLAN_VERSION, features: str = "", programs: list[str] | None = None, kernels=None,
               header_overrides: dict | None = None, routed: bool = False, table: list | None = None,
               kv_layers: list[tuple[int, int]] | None = None) -> bytes:
    """table: the plan's kernel table ((name, n_args, flags, writes) each; None: the true one); kv_layers: the
    version 5 per-layer KV table ((rows, window) each; None: every layer kv_rows rows, window 0)."""
    programs = programs or ["prefill", "prefill_logits", "decode", "head"]
    kernels = kernels or KERNELS
    weights = make_weights()
    offs, off = [], 0
    for n in WEIGHT_ORDER:
        offs.append((off, weights[n].nbytes))
        off += -(-weights[n].nbytes // ALIGN) * ALIGN
    h = dict(magic=b"EDGEPLAN", version=version, arch=1, features=features.encode(), target=b"host",
             build_id=bytes(range(16)), vocab=V, dim=D, n_layers=L, n_kv_heads=H, head_dim=DH, max_ctx=MAX_CTX, chunk=C,
             kv_rows=KV_ROWS, kv_dtype_bits=32, n_weights=len(WEIGHT_ORDER), n_kernels=len(kernels),
             n_programs=len(programs), arena_bytes=ARENA_BYTES, weights_bytes=off, bos_id=1, n_eos=2,
             eos_ids=[2, 3, 0, 0, 0, 0, 0, 0], **{f"sampling.{k}": v for k, v in (
                 ("temperature", 0.0), ("top_k", 0), ("top_p", 1.0), ("min_p", 0.0), ("repetition_penalty", 1.0),
                 ("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("reserved", 0))})
    h.update(header_overrides or {})
    out = HEADER.pack(**h)
    if version >= 5:
        out += b"".join(K.KV_LAYER.pack(rows=r, window=w) for r, w in (kv_layers or [(h["kv_rows"], 0)] * L))
    out += b"".join(WEIGHT.pack(offset=o, nbytes=n) for o, n in offs)
    out += b"".join(KERNEL.pack(name=name.encode(), n_args=n, flags=flags, writes=writes)
                    for name, n, flags, writes in (table or kernel_entries(kernels)))
    for name in programs:
        if name == "prefill":
            steps, cur = body_steps(C, False, routed)
            out += program(name, C, IDS, cur, D * 4, steps, version)
        elif name == "prefill_logits":
            steps, _ = body_steps(C, True, routed)
            out += program(name, C, IDS, LOGITS, V * 4, steps, version)
        elif name == "decode":
            steps, _ = body_steps(1, True, routed)
            out += program(name, 1, IDS, LOGITS, V * 4, steps, version)
        elif name == "head":
            k = KERNELS.index("lmhead_1")
            out += program(name, 1, X, LOGITS, V * 4,
                           [(k, [arg(ARENA, 0, X, (1, D)), arg(WEIGHT_ARG, WEIGHT_ORDER.index("W"), 0, (V, D)),
                                 arg(ARENA, 0, LOGITS, (1, V))])], version)
    return out


def weights_bytes() -> bytes:
    weights = make_weights()
    out = bytearray()
    for n in WEIGHT_ORDER:
        b = weights[n].tobytes()
        out += b + bytes(-len(b) % ALIGN)
    return bytes(out)


def write_package(out: Path, kernels_so: Path, **plan_kw) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.bin").write_bytes(plan_bytes(**plan_kw))
    (out / "weights.bin").write_bytes(weights_bytes())
    if Path(kernels_so).resolve() != (out / "kernels.so").resolve():
        shutil.copy(kernels_so, out / "kernels.so")
    return out


if __name__ == "__main__":
    out = Path(sys.argv[1])
    shim = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(__file__).resolve().parents[2] / "runtime/kernel_shim.c"
    out.mkdir(parents=True, exist_ok=True)
    build_kernels(out / "kernels.o")
    link_kernels(out / "kernels.o", shim, out / "kernels.so")
    write_package(out, out / "kernels.so")
    print(out)
