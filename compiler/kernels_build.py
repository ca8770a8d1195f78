"""Build the package's kernel library: all PrimFuncs in one TVM module -> object file -> kernels.so, linked with
runtime/kernel_shim.c so that it needs nothing from TVM at run time."""
from __future__ import annotations

import subprocess
from pathlib import Path

from ..errors import CompileError
from ..targets import Target, check_toolchain

SHIM = Path(__file__).resolve().parent.parent / "runtime" / "kernel_shim.c"


def build_kernels(funcs: dict, target: Target, out_so: Path) -> None:
    import tvm

    check_toolchain(target)
    mod = tvm.IRModule(funcs)
    try:
        ex = tvm.compile(mod, target=target.tvm_target())
    except Exception as e:  # TVM raises its own error types; keep the first line
        raise CompileError(f"TVM failed to compile the kernels for {target.name}: {str(e).splitlines()[0]}") from e
    obj = out_so.with_suffix(".o")
    ex.mod.write_to_file(str(obj))
    cmd = [target.cc, "-shared", "-fPIC", "-O2", str(obj), str(SHIM), "-o", str(out_so), "-lm", "-Wl,-Bsymbolic"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    obj.unlink(missing_ok=True)
    if r.returncode != 0:
        raise CompileError(f"linking kernels.so with {target.cc} failed: {r.stderr.strip().splitlines()[-1:]}")
