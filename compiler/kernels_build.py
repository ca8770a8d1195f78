"""Build the package's kernel library: every PrimFunc compiled by TVM to its own object file, the objects linked into
kernels.so with runtime/kernel_shim.c and the kernel table (compiler/kernel_table.py) so that it needs nothing from TVM
at run time.

Targets with a static edgellm-run (android-cpu) compile the kernels as a TVM "system lib" instead: the objects are
joined into one relocatable kernels.o that is linked statically into bin/edgellm-run (it registers its kernels at
start-up) and, through the shim's system-lib adapter, into kernels.so (for programs that dlopen it, e.g. an app
built with the NDK).

One object per kernel, because kernels repeat: a package's attention, norm and rope kernels are the same whatever its
weights' scheme, and a model compiled again with other options changes a few of its kernels. The kernels are
compiled in forked children, EDGELLM_BUILD_JOBS of them at once (default: the CPUs this process may use), so a
compile uses every core. A child isolates TVM's code generation too: LLVM reports some failures (a full disk while
writing the object, say) by printing "LLVM ERROR" and exiting the process, which must not take the compiler and its
clean-up with it.

With EDGELLM_KERNEL_CACHE=DIR, each kernel's object is kept in DIR under a hash of everything that goes into it (its
TVMScript, the target, system lib or not, the TVM and edgellm versions) and copied from there when the same kernel
is built again (the test session and benchmark recompiles use it)."""
from __future__ import annotations

import contextlib
import faulthandler
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from ..errors import CompileError
from ..targets import Target, check_toolchain
from .kernel_table import write_kernel_table

SHIM = Path(__file__).resolve().parent.parent / "runtime" / "kernel_shim.c"
KERNELS_OBJECT = "kernels.o"   # the system-lib object a static edgellm-run links (not part of the package)
TABLE_SOURCE = "kernel_table.c"
MAX_DEFAULT_JOBS = 8


def uses_barrier(obj: Path) -> bool:
    """Whether the kernels call TVMBackendParallelBarrier (then every parallel task needs its own thread)."""
    return b"TVMBackendParallelBarrier" in obj.read_bytes()


def _fork_codegen(jobs: list[tuple[object, Path]], tvm_target, err) -> int:
    """Forks a child that compiles each (IRModule, object path) of jobs; returns its pid. The child reports a
    failure (exception, LLVM abort) on err, as one line, and its exit status."""
    import tvm

    sys.stdout.flush(), sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # child: never return into the caller's stack
        code = 1
        try:
            os.dup2(err.fileno(), 2)
            faulthandler.disable()   # an abort here is reported by the parent, not dumped by the child
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            for mod, obj in jobs:
                tvm.compile(mod, target=tvm_target).mod.write_to_file(str(obj))
            code = 0
        except BaseException as e:  # noqa: BLE001 - reported to the parent through stderr
            msg = str(e).strip().splitlines()
            os.write(2, f"{type(e).__name__}: {msg[0] if msg else ''}\n".encode())
        finally:
            os._exit(code)
    return pid


def build_jobs() -> int:
    """How many code generators run at once: EDGELLM_BUILD_JOBS, else the CPUs this process may run on, at most
    MAX_DEFAULT_JOBS (each child holds LLVM and its share of the kernels: a few hundred MB for a big model's)."""
    v = os.environ.get("EDGELLM_BUILD_JOBS", "").strip()
    if v:
        if not v.isdigit() or int(v) < 1:
            raise CompileError(f"EDGELLM_BUILD_JOBS={v!r}: give a whole number of processes, 1 or more")
        return int(v)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(cpus, MAX_DEFAULT_JOBS)


def _codegen_in_children(jobs: list[tuple[object, Path]], target: Target) -> None:
    """tvm.compile + write each (IRModule, object path) of jobs, in up to build_jobs() forked children (the jobs dealt
    round-robin, so that each child gets big and small kernels alike); a child's failure (exception, LLVM abort,
    signal) becomes a one-line CompileError here, and an interrupt kills them all."""
    if not jobs:
        return
    n = min(build_jobs(), len(jobs))
    tvm_target = target.tvm_target()
    with contextlib.ExitStack() as stack:
        errs = [stack.enter_context(tempfile.TemporaryFile()) for _ in range(n)]
        pids, statuses = [], []
        try:
            for i in range(n):
                pids.append(_fork_codegen(jobs[i::n], tvm_target, errs[i]))
            while pids:
                statuses.append(os.waitpid(pids[0], 0)[1])
                pids.pop(0)
        except BaseException:
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
            raise
        if any(os.WIFSIGNALED(st) and os.WTERMSIG(st) == signal.SIGINT for st in statuses):
            raise KeyboardInterrupt
        for st, err in zip(statuses, errs):
            if st == 0:
                continue
            err.seek(0)
            lines = [ln for ln in err.read().decode(errors="replace").splitlines() if ln.strip()]
            died = f"signal {os.WTERMSIG(st)}" if os.WIFSIGNALED(st) else f"exit {os.WEXITSTATUS(st)}"
            why = next((ln for ln in reversed(lines) if "LLVM ERROR" in ln or "Error" in ln),
                       lines[-1] if lines else f"the code generator died ({died})")
            raise CompileError(f"TVM failed to compile the kernels for {target.name}: {why.strip()[:300]}")
    missing = [obj for _, obj in jobs if not obj.is_file()]
    if missing:
        raise CompileError(f"TVM failed to compile the kernels for {target.name}: no object for {missing[0].stem}")


def _kernel_key(mod, target: Target, keep_object: bool) -> str:
    """The hash a kernel's object is cached under: everything that goes into it."""
    import tvm

    from .. import __version__

    h = hashlib.sha256()
    for part in (mod.script(), json.dumps(target.tvm_dict(), sort_keys=True), str(keep_object), tvm.__version__,
                 __version__):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:40]


def _cache_root() -> Path | None:
    root = os.environ.get("EDGELLM_KERNEL_CACHE")
    return Path(root) if root else None


def _from_cache(cache: Path | None, key: str, obj: Path) -> bool:
    if cache is None:
        return False
    try:
        shutil.copyfile(cache / f"{key}.o", obj)
        return True
    except OSError:   # not there, or removed meanwhile: build it
        obj.unlink(missing_ok=True)
        return False


def _to_cache(cache: Path | None, key: str, obj: Path) -> None:
    if cache is None:
        return
    tmp = cache / f"{key}.o.{os.getpid()}.tmp"
    try:
        cache.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(obj, tmp)
        tmp.rename(cache / f"{key}.o")   # atomic; another process may have stored the same entry first
    except OSError:
        tmp.unlink(missing_ok=True)


def _run_cc(cmd: list[str], what: str, target: Target) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise CompileError(f"{what} with {target.cc} failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")


def build_kernels(funcs: dict, target: Target, out_so: Path, keep_object: bool = False,
                  table: list[tuple[str, int, int, int]] | None = None) -> Path | None:
    """Writes kernels.so with its kernel table (`table`: (name, n_args, flags, writes) per kernel, as plan.bin has
    it; None: read off the functions, no KV-writer flags); with keep_object (static-binary targets) the kernels are
    compiled as a system lib and their object (kernels.o) and the table's source are kept beside out_so and the
    object returned, for build_edgellm_run to link."""
    import tvm

    from .kernel_table import written_args

    check_toolchain(target)
    if table is None:
        table = [(name, len(f.params), 0, written_args(f, name)) for name, f in funcs.items()]
    out_so = Path(out_so)
    cache = _cache_root()
    with tempfile.TemporaryDirectory(prefix=".kernels-", dir=out_so.parent) as work:
        objs, missing = [], []   # missing: (module, object, cache key) of the kernels to compile
        for i, (name, f) in enumerate(funcs.items()):
            mod = tvm.IRModule({name: f})
            if keep_object:
                mod = mod.with_attr("system_lib_prefix", "")
            obj = Path(work) / f"k{i}.o"
            objs.append(obj)
            key = _kernel_key(mod, target, keep_object) if cache is not None else ""
            if not _from_cache(cache, key, obj):
                missing.append((mod, obj, key))
        _codegen_in_children([(mod, obj) for mod, obj, _ in missing], target)
        for _, obj, key in missing:
            _to_cache(cache, key, obj)
        table_c = write_kernel_table(table, out_so.with_name(TABLE_SOURCE))
        if keep_object:   # one relocatable object for the static runner (its barrier use read off it)
            kobj = out_so.with_name(KERNELS_OBJECT)
            _run_cc([*target.cc_cmd, "-r", "-nostdlib", *map(str, objs), "-o", str(kobj)], "joining the kernels", target)
            objs = [kobj]
        adapter = (["-DEDGELLM_SYSLIB_ADAPTER"] + (["-DEDGELLM_SHIM_BARRIER"] if uses_barrier(objs[0]) else [])
                   if keep_object else [])
        try:
            _run_cc([*target.cc_cmd, "-shared", "-fPIC", "-O2", *adapter, *map(str, objs), str(SHIM), str(table_c),
                     "-o", str(out_so), "-lm", "-Wl,-Bsymbolic"], "linking kernels.so", target)
        finally:
            if not keep_object:
                table_c.unlink(missing_ok=True)
    return objs[0] if keep_object else None
