"""Build `bin/edgellm-run`, the package's own command-line runner (runtime/cli/edgellm_run.c), for its target.

The binary is libedgellm's C sources compiled straight in (no shared libedgellm to install) with the target's C
compiler (targets/registry.py): dynamically linked against libc for the host and the Raspberry Pi targets (it
dlopens PKG/kernels.so like the Python Runtime does), statically linked for android-cpu so that it runs from
`adb shell` with nothing installed. A static executable cannot dlopen (Android's loader refuses; glibc's static
dlopen needs the very glibc it was built with), so there the package's kernels are linked into the binary: the
kernels object is compiled as a TVM system lib (compiler/kernels_build.py) and registers itself at start-up
(backend_tvm_cpu.c, EL_STATIC_KERNELS). That binary belongs to its package: it holds that package's kernels and
its build id, and refuses any other package's plan.

Object files of the runtime sources are cached per target, flags and source contents under the edgellm cache
directory, so compiling many packages costs one link each."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..errors import CompileError
from ..targets import Target, check_toolchain
from .kernels_build import SHIM, TABLE_SOURCE, uses_barrier

ROOT = Path(__file__).resolve().parent.parent
RUNTIME, OFFLOAD = ROOT / "runtime", ROOT / "offload"
# libedgellm's C sources (also the extension pyproject.toml builds; tests/test_contract.py checks the two lists agree)
LIB_SOURCES = tuple(RUNTIME / "core" / f for f in ("util.c", "plan.c", "loader.c", "steps.c", "context.c", "generate.c",
                                                   "speculate.c", "ngram_pool.c", "constraint.c", "state.c", "sampler.c",
                                                   "digest.c", "threadpool.c", "weight_order.c", "options.c",
                                                   "backend_options.c")) + \
    tuple(RUNTIME / "backends" / f for f in ("backends.c", "backend_tvm_cpu.c", "backend_qnn_ort.c",
                                             "backend_opencl.c")) + \
    (RUNTIME / "tokenizer" / "tokenizer.c",) + \
    tuple(OFFLOAD / f for f in ("policy.c", "resident.c", "window.c", "experts.c", "io.c", "routed_cache.c"))
CLI = RUNTIME / "cli" / "edgellm_run.c"
BIN_DIR, BINARY = "bin", "edgellm-run"
CFLAGS = ("-std=c11", "-O2")


def sources() -> list[Path]:
    return [CLI, *LIB_SOURCES]


def _cache_dir() -> Path:
    from .cache_dir import cache_root

    return cache_root() / "objects"


def _headers_digest() -> bytes:
    """Every header the runtime sources can include, in every folder (core/el_internal.h holds the structs: an
    object compiled against an older one must not be linked with new ones)."""
    h = hashlib.sha256()
    for d in (RUNTIME, OFFLOAD):
        for f in sorted(d.rglob("*.h")):
            h.update(str(f.relative_to(d)).encode() + f.read_bytes())
    return h.digest()


def _tool_id(cc: list[str]) -> str:
    exe = shutil.which(cc[0]) or cc[0]
    try:
        st = os.stat(exe)
        return f"{' '.join(cc)}:{st.st_size}:{int(st.st_mtime)}"
    except OSError:
        return " ".join(cc)


def _compile(cc: list[str], src: Path, flags: list[str], work: Path) -> Path:
    """src -> object file, through the cache (key: compiler, flags, source and header contents)."""
    key = hashlib.sha256(_tool_id(cc).encode() + "\0".join(flags).encode() + _headers_digest()
                         + src.read_bytes()).hexdigest()[:20]
    cached = _cache_dir() / f"{src.stem}-{key}.o"
    if cached.is_file():
        return cached
    obj = work / f"{src.stem}.o"
    r = subprocess.run([*cc, *flags, "-c", str(src), "-o", str(obj)], capture_output=True, text=True)
    if r.returncode != 0:
        raise CompileError(f"compiling {src.name} for edgellm-run with {' '.join(cc)} failed: "
                           f"{(r.stderr.strip().splitlines() or ['?'])[-1]}")
    try:   # publish atomically; a failure to cache is not an error
        cached.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cached.parent, suffix=".o.tmp")
        os.close(fd)
        shutil.copyfile(obj, tmp)
        os.replace(tmp, cached)
    except OSError:
        return obj
    return cached


def build_edgellm_run(target: Target, out_path: Path, kernels_obj: Path | None = None, build_id: str = "") -> Path:
    """Compile and link edgellm-run for target into out_path (its directory is created). Static-binary targets
    need kernels_obj, the package's system-lib kernels object (build_kernels(..., keep_object=True); its kernel
    table source lies beside it), and the package's build id (hex), which the binary then insists on."""
    check_toolchain(target)
    cc = target.cc_cmd
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    android_ndk = any("android" in part for part in cc)
    flags = [*CFLAGS, f"-I{RUNTIME}", f"-I{OFFLOAD}"]
    libs = ["-lm"] if android_ndk else ["-lpthread", "-lm"]   # bionic: pthread is part of libc
    if target.static_binary:
        if kernels_obj is None:
            raise CompileError(f"target {target.name} links its kernels into edgellm-run: build them with "
                               "keep_object=True and pass the object")
        if len(build_id) != 32:
            raise CompileError("a static edgellm-run needs its package's build id")
        flags += ["-DEL_STATIC_KERNELS", f"-DEL_STATIC_BARRIERS={int(uses_barrier(Path(kernels_obj)))}",
                  f'-DEL_BUILD_ID="{build_id}"']
        link_extra = [str(kernels_obj), str(Path(kernels_obj).with_name(TABLE_SOURCE))]
        if target.npu and android_ndk:   # the NPU backend dlopens the phone's libonnxruntime.so: bionic, dynamic
            tail = [*libs, "-ldl"]
        else:                            # a static binary cannot dlopen: the NPU backend says so at load
            flags.append("-DEL_NO_DLOPEN")
            tail = ["-static", *libs]
    else:
        link_extra, tail = [], [*libs] if android_ndk else ["-lpthread", "-ldl", "-lm"]
    with tempfile.TemporaryDirectory(prefix="edgellm-run-") as tmp:
        objs = [str(_compile(cc, src, flags, Path(tmp))) for src in [*sources(), *([SHIM] if target.static_binary else [])]]
        cmd = [*cc, "-s", *objs, *link_extra, "-o", str(out_path), *tail]
        r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise CompileError(f"linking edgellm-run with {target.cc} failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    return out_path
