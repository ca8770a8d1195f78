"""Build the package's kernel library: all PrimFuncs in one TVM module -> object file -> kernels.so, linked with
runtime/kernel_shim.c and the kernel table (compiler/kernel_table.py) so that it needs nothing from TVM at run time.

Targets with a static edgellm-run (android-cpu) compile the module as a TVM "system lib" instead: the same
object is linked statically into bin/edgellm-run (it registers its kernels at start-up) and, through the shim's
system-lib adapter, into kernels.so (for programs that dlopen it, e.g. an app built with the NDK).

TVM's code generation runs in a forked child: LLVM reports some failures (a full disk while writing the object,
say) by printing "LLVM ERROR" and exiting the process, which must not take the compiler and its clean-up with it.

With EDGELLM_KERNEL_CACHE=DIR, built libraries are kept in DIR under a hash of everything that goes into them (the
module's TVMScript, the target, the C compiler, the kernel table, the shim's source, the TVM and edgellm versions) and
copied from there when the same kernels are built again (the test session and benchmark recompiles use it)."""
from __future__ import annotations

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


def uses_barrier(obj: Path) -> bool:
    """Whether the kernels call TVMBackendParallelBarrier (then every parallel task needs its own thread)."""
    return b"TVMBackendParallelBarrier" in obj.read_bytes()


def _codegen_in_child(mod, target: Target, obj: Path) -> None:
    """tvm.compile + write the object file in a forked child; its failure (exception, LLVM abort, signal) becomes a
    one-line CompileError here, and an interrupt kills it."""
    import tvm

    tvm_target = target.tvm_target()
    with tempfile.TemporaryFile() as err:
        sys.stdout.flush(), sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # child: never return into the caller's stack
            code = 1
            try:
                os.dup2(err.fileno(), 2)
                faulthandler.disable()   # an abort here is reported by the parent, not dumped by the child
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                ex = tvm.compile(mod, target=tvm_target)
                ex.mod.write_to_file(str(obj))
                code = 0
            except BaseException as e:  # noqa: BLE001 - reported to the parent through stderr
                msg = str(e).strip().splitlines()
                os.write(2, f"{type(e).__name__}: {msg[0] if msg else ''}\n".encode())
            finally:
                os._exit(code)
        try:
            _, status = os.waitpid(pid, 0)
        except BaseException:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGINT:
            raise KeyboardInterrupt
        if status != 0 or not obj.is_file():
            err.seek(0)
            lines = [ln for ln in err.read().decode(errors="replace").splitlines() if ln.strip()]
            died = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}"
            why = next((ln for ln in reversed(lines) if "LLVM ERROR" in ln or "Error" in ln),
                       lines[-1] if lines else f"the code generator died ({died})")
            raise CompileError(f"TVM failed to compile the kernels for {target.name}: {why.strip()[:300]}")


def _cache_dir(mod, target: Target, keep_object: bool, table) -> Path | None:
    """Where EDGELLM_KERNEL_CACHE keeps these kernels (None: no cache)."""
    root = os.environ.get("EDGELLM_KERNEL_CACHE")
    if not root:
        return None
    import tvm

    from .. import __version__

    h = hashlib.sha256()
    for part in (mod.script(), json.dumps(target.tvm_dict(), sort_keys=True), target.cc, str(keep_object),
                 json.dumps(table), tvm.__version__, __version__):
        h.update(part.encode())
        h.update(b"\0")
    h.update(SHIM.read_bytes())
    return Path(root) / h.hexdigest()[:40]


def _cached_files(out_so: Path, keep_object: bool) -> list[Path]:
    return [out_so, out_so.with_name(KERNELS_OBJECT), out_so.with_name(TABLE_SOURCE)] if keep_object else [out_so]


def _from_cache(cache: Path | None, out_so: Path, keep_object: bool) -> bool:
    if cache is None or not cache.is_dir():
        return False
    try:
        for f in _cached_files(out_so, keep_object):
            shutil.copyfile(cache / f.name, f)
        return True
    except OSError:   # a partial or removed entry: build instead
        for f in _cached_files(out_so, keep_object):
            f.unlink(missing_ok=True)
        return False


def _to_cache(cache: Path | None, out_so: Path, keep_object: bool) -> None:
    if cache is None:
        return
    tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        for f in _cached_files(out_so, keep_object):
            shutil.copyfile(f, tmp / f.name)
        tmp.rename(cache)   # atomic; another process may have stored the same entry first
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


def build_kernels(funcs: dict, target: Target, out_so: Path, keep_object: bool = False,
                  table: list[tuple[str, int, int, int]] | None = None) -> Path | None:
    """Writes kernels.so with its kernel table (`table`: (name, n_args, flags, writes) per kernel, as plan.bin has
    it; None: read off the functions, no KV-writer flags); with keep_object (static-binary targets) the module is
    compiled as a system lib and its object file, and the table's source, are kept beside out_so and the object
    returned, for build_edgellm_run to link."""
    import tvm

    from .kernel_table import written_args

    check_toolchain(target)
    if table is None:
        table = [(name, len(f.params), 0, written_args(f, name)) for name, f in funcs.items()]
    mod = tvm.IRModule(funcs)
    if keep_object:
        mod = mod.with_attr("system_lib_prefix", "")
    cache = _cache_dir(mod, target, keep_object, table)
    if _from_cache(cache, out_so, keep_object):
        return out_so.with_name(KERNELS_OBJECT) if keep_object else None
    obj = out_so.with_name(KERNELS_OBJECT) if keep_object else out_so.with_suffix(".o")
    table_c = write_kernel_table(table, out_so.with_name(TABLE_SOURCE))
    _codegen_in_child(mod, target, obj)
    adapter = ["-DEDGELLM_SYSLIB_ADAPTER"] + (["-DEDGELLM_SHIM_BARRIER"] if uses_barrier(obj) else []) if keep_object else []
    cmd = [*target.cc_cmd, "-shared", "-fPIC", "-O2", *adapter, str(obj), str(SHIM), str(table_c), "-o", str(out_so),
           "-lm", "-Wl,-Bsymbolic"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if not keep_object:
        obj.unlink(missing_ok=True)
        table_c.unlink(missing_ok=True)
    if r.returncode != 0:
        raise CompileError(f"linking kernels.so with {target.cc} failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    _to_cache(cache, out_so, keep_object)
    return obj if keep_object else None
