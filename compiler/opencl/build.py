"""OpenCL package build: every kernel through TVM's GPU schedule rules to OpenCL C, plus the launch table that
libedgellm's OpenCL backend (runtime/backends/backend_opencl.c) follows instead of TVM's host code.

A plan kernel becomes one or more OpenCL kernels (TVM splits a PrimFunc at each global stage: activation
quantization, integer block sums, the f32 sum, the output rows) with scratch buffers between them. TVM's host
function says which device kernels it launches, in what order, with what grid; the generated source says each
one's parameters. Both are read here and written as kernels.cltab (format below); the source is rewritten so that
every buffer parameter also takes a byte offset, since the runtime passes views into one arena / KV buffer (OpenCL
1.2 has no pointer arguments into the middle of a buffer, and sub-buffers need aligned origins).

kernels.cltab (text, whitespace-separated tokens):
    edgellm-opencl 1 <n_kernels>
    per kernel:  kernel <plan kernel name> <n_args> <writes> <n_launches> <n_scratch>
                 (writes: bit i set when the kernel writes argument i; the runtime checks it against plan.bin's)
                 scratch <bytes>                        (n_scratch times)
                 launch <cl kernel> <gx> <gy> <gz> <lx> <ly> <lz> <n_params>   (global = grid * local)
                 then per parameter one of:
                     arg <i>            argument i of the plan step (buffer + byte offset)
                     scratch <j>        scratch buffer j (+ byte offset 0)
                     dim <i> <d> <b>    dimension d of argument i at run time (a KV prefix length), a b-byte int
"""
from __future__ import annotations

import re
from pathlib import Path

from ...errors import CompileError
from ...runtime import contract as K
from ..kernel_table import written_args

TABLE_MAGIC = K.OPENCL_TABLE_MAGIC   # runtime/contract.h
TABLE_VERSION = K.OPENCL_TABLE_VERSION
SOURCE = "kernels.cl"
TABLE = "kernels.cltab"
MAX_THREADS = 256   # work-group size the schedules use: every OpenCL GPU driver allows 256 (Mali, Adreno, PoCL)
_BYTES = {"float32": 4, "int32": 4, "uint32": 4, "float16": 2, "uint16": 2, "int64": 8, "uint8": 1, "int8": 1}
_SCALAR_BYTES = {"int": 4, "long": 8, "uint": 4, "ulong": 8}


def opencl_target():
    import tvm

    return tvm.target.Target({"kind": "opencl", "max_num_threads": MAX_THREADS, "max_threads_per_block": MAX_THREADS,
                              "host": {"kind": "llvm"}})


RULES = ("GEMV", "LowBatchGEMV", "Matmul", "Reduction", "GeneralReduction", "Fallback")


def schedule(func, target, rules=None):
    """dlight's GPU rules for a function not scheduled by hand (tirx.is_scheduled): `rules`, else the function's
    "edgellm.rules" attribute (compiler/opencl/ops.py), else RULES."""
    import tvm
    from tvm.s_tir import dlight as dl

    if rules is None:
        rules = tuple(func.attrs["edgellm.rules"]) if func.attrs and "edgellm.rules" in func.attrs else RULES
    mod = tvm.IRModule({"main": func})
    with target:
        return dl.ApplyDefaultSchedule(*(getattr(dl.gpu, r)() for r in rules))(mod)["main"]


def schedule_checked(func, target):
    """The scheduled function, built once on its own: where a tuned rule gives code TVM cannot lower (dlight's
    Matmul with several output stages, say), the plain Fallback schedule (one thread per output) instead."""
    import tvm

    sched = schedule(func, target)
    try:
        tvm.compile(tvm.IRModule({"main": sched}), target=target)
        return sched
    except Exception:  # noqa: BLE001 - any lowering failure: take the always-valid schedule
        return schedule(func, target, ("Fallback",))


def _split_top(s: str) -> list[str]:
    """Comma-separated items at parenthesis depth 0."""
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def _int(expr: str, where: str) -> int:
    m = re.fullmatch(r"(?:T\.u?int(?:32|64)\()?(\d+)\)?", expr.strip())
    if not m:
        raise CompileError(f"OpenCL kernel {where}: launch size {expr!r} depends on a run-time value; edgellm's OpenCL "
                           "backend needs static grids")
    return int(m.group(1))


_CALL = re.compile(r'T\.call_ffi_kernel\("(\w+)", (.*?), launch_params=\[(.*?)\]')
_ALLOC = re.compile(r'(\w+) = T\.alloc_buffer\(\(([^)]*)\)(?:, "(\w+)")?')


def host_launches(script: str, name: str):
    """[(cl kernel, grid xyz, local xyz)] in launch order and {scratch name: bytes}, from TVM's host function."""
    scratch = {}
    for m in _ALLOC.finditer(script):
        dims = [_int(d, name) for d in m.group(2).split(",") if d.strip()]
        n = 1
        for d in dims:
            n *= d
        scratch[m.group(1)] = n * _BYTES[m.group(3) or "float32"]
    launches = []
    for m in _CALL.finditer(script):
        tags = [t.strip().strip('"') for t in m.group(3).split(",") if t.strip()]
        bad = [t for t in tags if not re.fullmatch(r"(blockIdx|threadIdx)\.[xyz]", t)]
        if bad:
            raise CompileError(f"OpenCL kernel {name}: launch parameter {bad[0]} is not supported")
        ext = [_int(e, name) for e in _split_top(m.group(2))[-len(tags):]] if tags else []
        grid, local = [1, 1, 1], [1, 1, 1]
        for t, e in zip(tags, ext):
            (grid if t.startswith("block") else local)["xyz".index(t[-1])] = e
        launches.append((m.group(1), grid, local))
    return launches, scratch


_KERNEL = re.compile(r"__kernel void (\w+)\(([^)]*)\)(\s*[;{])")
_PTR = re.compile(r"__global ((?:const )?\w+)\* restrict (\w+)")


def kernel_params(source: str) -> dict[str, list[tuple[str, str, str]]]:
    """cl kernel -> [(kind "ptr" | "scalar", C type, name)] from its signature."""
    out = {}
    for m in _KERNEL.finditer(source):
        params = []
        for p in _split_top(m.group(2)):
            pm = _PTR.fullmatch(p)
            if pm:
                params.append(("ptr", pm.group(1), pm.group(2)))
            else:
                typ, _, nm = p.rpartition(" ")
                if typ not in _SCALAR_BYTES:
                    raise CompileError(f"OpenCL kernel {m.group(1)}: parameter {p!r} is not a buffer or an integer")
                params.append(("scalar", typ, nm))
        out[m.group(1)] = params
    return out


def add_offsets(source: str) -> str:
    """Every buffer parameter P becomes (P_base, ulong P_off) and P = P_base + P_off bytes at the kernel's start."""
    def fix(m):
        params, setup = [], []
        for p in _split_top(m.group(2)):
            pm = _PTR.fullmatch(p)
            if not pm:
                params.append(p)
                continue
            typ, nm = pm.groups()
            params += [f"__global {typ}* restrict {nm}_base", f"ulong {nm}_off"]
            setup.append(f"  __global {typ}* restrict {nm} = (__global {typ}*)((__global char*){nm}_base + {nm}_off);")
        head = f"__kernel void {m.group(1)}({', '.join(params)})"
        return head + ";" if m.group(3).strip() == ";" else head + " {\n" + "\n".join(setup)
    return _KERNEL.sub(fix, source)


def _param_names(func) -> dict[str, int]:
    """Buffer name -> parameter index of a PrimFunc."""
    return {p.name: i for i, p in enumerate(func.params)}


def _shape_var(func, name: str):
    """(argument index, dimension) holding the symbolic shape variable `name`."""
    for i, p in enumerate(func.params):
        for d, e in enumerate(p.shape):
            if hasattr(e, "name") and e.name == name:
                return i, d
    return None


def build_opencl(funcs: dict, out_dir: Path) -> tuple[Path, Path]:
    """Writes kernels.cl and kernels.cltab for the plan's kernels (funcs: name -> PrimFunc, in plan order)."""
    import tvm
    from tvm import tirx
    from tvm.tirx.build import split_host_device_mods

    target = opencl_target()
    mod = tvm.IRModule({n: schedule_checked(f, target).with_attr("global_symbol", n) for n, f in funcs.items()})
    try:   # tvm.compile's steps, lowered once: the host half is read here, only the device half is generated
        bound = tirx.transform.BindTarget(target.with_host(target.host))(mod)
        pipeline, _, finalize_device = tirx.get_default_tir_pipeline(target)
        host, devices = split_host_device_mods(pipeline(bound))
        (dev_target, dev_mod), = devices.items()
        source = tvm.get_global_func("target.build.opencl")(finalize_device()(dev_mod), dev_target).inspect_source()
    except Exception as e:  # noqa: BLE001 - TVM's errors are multi-line C++ traces
        msg = (str(e).strip().splitlines() or [type(e).__name__])[-1]
        raise CompileError(f"TVM failed to compile the OpenCL kernels: {msg[:300]}") from None
    params = kernel_params(source)
    hosts = {gv.name_hint: f for gv, f in host.functions.items()}
    lines = [f"{TABLE_MAGIC} {TABLE_VERSION} {len(funcs)}"]
    marks = []   # each launch's geometry, also in the source: a table edited alone no longer matches it
    for name, func in funcs.items():
        hf = hosts.get(name) or hosts.get(f"__tvm_ffi_{name}")
        if hf is None:
            raise CompileError(f"TVM produced no host code for the OpenCL kernel {name}")
        launches, scratch = host_launches(hf.script(), name)
        if not launches:
            raise CompileError(f"the OpenCL kernel {name} launches nothing (TVM kept it on the host)")
        args, names = _param_names(func), list(scratch)
        lines.append(f"kernel {name} {len(func.params)} {written_args(func, name)} {len(launches)} {len(scratch)}")
        lines += [f"scratch {scratch[s]}" for s in names]
        for cl, grid, local in launches:
            ps = params.get(cl)
            if ps is None:
                raise CompileError(f"the OpenCL source has no kernel {cl} (of {name})")
            geometry = f"{' '.join(str(g * lo) for g, lo in zip(grid, local))} {' '.join(map(str, local))}"
            lines.append(f"launch {cl} {geometry} {len(ps)}")
            marks.append(f"// edgellm-launch {cl} {geometry}")
            for kind, typ, pname in ps:
                base = pname[:-4] if pname.endswith("_ptr") else pname
                if kind == "ptr" and base in args:
                    lines.append(f"arg {args[base]}")
                elif kind == "ptr" and base in scratch:
                    lines.append(f"scratch {names.index(base)}")
                elif kind == "scalar" and _shape_var(func, pname):
                    i, d = _shape_var(func, pname)
                    lines.append(f"dim {i} {d} {_SCALAR_BYTES[typ]}")
                else:
                    raise CompileError(f"OpenCL kernel {cl} (of {name}): cannot bind its parameter {pname}")
    out_dir = Path(out_dir)
    src, tab = out_dir / SOURCE, out_dir / TABLE
    src.write_text("// edgellm: TVM-generated OpenCL C (buffer parameters take byte offsets: compiler/opencl/build.py)\n"
                   "// the launch geometry kernels.cltab must give (runtime/backends/backend_opencl.c checks it)\n"
                   + "".join(m + "\n" for m in marks) + add_offsets(source))
    tab.write_text("\n".join(lines) + "\n")
    return src, tab
