"""Build the package's kernel library: all PrimFuncs in one TVM module -> object file -> kernels.so, linked with
runtime/kernel_shim.c so that it needs nothing from TVM at run time.

Targets with a static edgellm-run (android-cpu) compile the module as a TVM "system lib" instead: the same
object is linked statically into bin/edgellm-run (it registers its kernels at start-up) and, through the shim's
system-lib adapter, into kernels.so (for programs that dlopen it, e.g. an app built with the NDK)."""
from __future__ import annotations

import subprocess
from pathlib import Path

from ..errors import CompileError
from ..targets import Target, check_toolchain

SHIM = Path(__file__).resolve().parent.parent / "runtime" / "kernel_shim.c"
KERNELS_OBJECT = "kernels.o"   # the system-lib object a static edgellm-run links (not part of the package)


def uses_barrier(obj: Path) -> bool:
    """Whether the kernels call TVMBackendParallelBarrier (then every parallel task needs its own thread)."""
    return b"TVMBackendParallelBarrier" in obj.read_bytes()


def build_kernels(funcs: dict, target: Target, out_so: Path, keep_object: bool = False) -> Path | None:
    """Writes kernels.so; with keep_object (static-binary targets) the module is compiled as a system lib and its
    object file is kept beside out_so and returned, for build_edgellm_run to link."""
    import tvm

    check_toolchain(target)
    mod = tvm.IRModule(funcs)
    if keep_object:
        mod = mod.with_attr("system_lib_prefix", "")
    try:
        ex = tvm.compile(mod, target=target.tvm_target())
    except Exception as e:  # TVM raises its own error types; keep the first line
        raise CompileError(f"TVM failed to compile the kernels for {target.name}: {str(e).splitlines()[0]}") from e
    obj = out_so.with_name(KERNELS_OBJECT) if keep_object else out_so.with_suffix(".o")
    ex.mod.write_to_file(str(obj))
    adapter = ["-DEDGELLM_SYSLIB_ADAPTER"] + (["-DEDGELLM_SHIM_BARRIER"] if uses_barrier(obj) else []) if keep_object else []
    cmd = [*target.cc_cmd, "-shared", "-fPIC", "-O2", *adapter, str(obj), str(SHIM), "-o", str(out_so), "-lm",
           "-Wl,-Bsymbolic"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if not keep_object:
        obj.unlink(missing_ok=True)
    if r.returncode != 0:
        raise CompileError(f"linking kernels.so with {target.cc} failed: {r.stderr.strip().splitlines()[-1:]}")
    return obj if keep_object else None
