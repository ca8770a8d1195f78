"""Target registry: what each `--target` name means for TVM (target dict), the C toolchain, the kernel flavour
(vector width) and the CPU features the generated code needs at run time."""
from __future__ import annotations

import os
import platform
import shutil
from dataclasses import dataclass, field

from ..errors import CompileError

# /proc/cpuinfo flag -> the name libedgellm checks with __builtin_cpu_supports
_X86_FEATURES = {"avx2": "avx2", "fma": "fma", "f16c": "f16c", "avx512f": "avx512f", "avx512bw": "avx512bw",
                 "avx512vl": "avx512vl", "avx512_vnni": "avx512vnni", "avx512_bf16": "avx512bf16",
                 "avx512_fp16": "avx512fp16"}


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    arch: str                     # "x86_64" | "aarch64"
    tvm: dict                     # TVM target dict (llvm)
    cc: str                       # C compiler that links kernels.so for this target
    features: tuple[str, ...]     # CPU features the kernels may use (checked by the runtime before dlopen)
    vector_lanes: int             # f32 lanes per SIMD register: picks the schedule flavour
    prefill_chunk: int = 32
    page_size: int = 4096
    quants: tuple[str, ...] = ("f32", "f16")
    notes: dict = field(default_factory=dict)

    def tvm_target(self):
        import tvm

        return tvm.target.Target(self.tvm)


def _host_x86_features() -> tuple[str, ...]:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
    except OSError:
        flags = []
    return tuple(v for k, v in _X86_FEATURES.items() if k in flags)


def _host() -> Target:
    arch = platform.machine()
    if arch not in ("x86_64", "AMD64"):
        raise CompileError(f"--target host supports x86_64 machines for now, this one is {arch}")
    from tvm.target import codegen

    feats = _host_x86_features()
    return Target("host", f"this machine's CPU ({codegen.llvm_get_system_cpu()}, "
                  f"{'AVX-512' if 'avx512f' in feats else 'AVX2'})", "x86_64",
                  {"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu(), "num-cores": os.cpu_count() or 1},
                  "gcc", feats, 16 if "avx512f" in feats else 8)


_STATIC = {
    "x86-avx2": Target("x86-avx2", "any x86-64 CPU with AVX2+FMA (Haswell, Zen 1 and later)", "x86_64",
                       {"kind": "llvm", "mcpu": "haswell"}, "gcc", ("avx2", "fma", "f16c"), 8),
    "x86-avx512": Target("x86-avx512", "x86-64 CPUs with AVX-512 (Skylake-SP, Ice Lake, Zen 4 and later)", "x86_64",
                         {"kind": "llvm", "mcpu": "skylake-avx512"}, "gcc",
                         ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl"), 16),
}


def list_targets() -> list[Target]:
    out = []
    try:
        out.append(_host())
    except CompileError:
        pass
    return out + list(_STATIC.values())


def get_target(name: str) -> Target:
    if name == "host":
        return _host()
    if name in _STATIC:
        return _STATIC[name]
    names = ", ".join(["host", *_STATIC])
    raise CompileError(f"unknown target '{name}': choose one of {names} (see `edgellm targets`)")


def check_toolchain(t: Target) -> None:
    if shutil.which(t.cc) is None:
        raise CompileError(f"target {t.name} needs the C compiler '{t.cc}', which is not on PATH: install it "
                           "(e.g. apt-get install gcc)")
