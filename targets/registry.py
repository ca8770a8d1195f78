"""Target registry: what each `--target` name means for TVM (target dict), the C toolchain, the kernel flavour
(vector width, integer dot-product path) and the CPU features the generated code needs at run time.

Cross targets (aarch64): kernels and the `edgellm-run` device binary are built with Debian's
gcc-aarch64-linux-gnu, or zig (PyPI `ziglang`) when that gcc is missing; android-cpu uses the NDK's clang when
ANDROID_NDK_HOME is set. `run_prefix` is how this machine runs the target's binaries (qemu-user for aarch64)."""
from __future__ import annotations

import dataclasses
import os
import platform
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CompileError

# /proc/cpuinfo flag -> the name libedgellm checks with __builtin_cpu_supports: the features whose instructions the
# kernels may contain (LLVM emits AVX512-FP16 conversions for f16 weights where the CPU has them). bf16 is not
# listed: no kernel has bf16 values, so LLVM never emits its instructions. The names, comma-joined, must fit
# plan.bin's 63-character features field (a Sapphire Rapids host with bf16 listed made 73: every compile failed).
_X86_FEATURES = {"avx2": "avx2", "fma": "fma", "f16c": "f16c", "avx512f": "avx512f", "avx512bw": "avx512bw",
                 "avx512vl": "avx512vl", "avx512_vnni": "avx512vnni", "avx512_fp16": "avx512fp16"}


def _body_schemes() -> tuple[str, ...]:
    from ..quant import body_schemes

    return tuple(body_schemes())


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    arch: str                     # "x86_64" | "aarch64"
    tvm: dict                     # TVM target dict (llvm); host: without mcpu, use tvm_dict() for the resolved one
    cc: str                       # C compiler that links kernels.so for this target
    features: tuple[str, ...]     # CPU features the kernels may use (checked by the runtime before dlopen)
    vector_lanes: int             # f32 lanes per SIMD register: picks the schedule flavour
    prefill_chunk: int = 32
    float_prefill_chunk: int | None = None   # for f32/f16 packages, when it differs from prefill_chunk
    prefetch_bytes: int = 0       # decode GEMV software-prefetch distance (0: hardware prefetch only)
    float_prefetch_bytes: int | None = None   # for the f32/f16 GEMV, when it differs from prefetch_bytes
    prefetch_locality: int = 3    # where the quantized GEMVs' prefetches put the stream: 3 L1, 2 L2 (host_prefetch)
    batch_prefetch_locality: int = 3   # the same for the small-batch GEMMs of verify passes
    kv_prefetch_locality: int = 3      # decode attention's K/V rows
    float_slice_bytes: int = 0         # float body matrices with longer f32 activation rows are stored K-sliced
    page_size: int = 4096
    quants: tuple[str, ...] = field(default_factory=lambda: _body_schemes())   # --quant values it accepts
    notes: dict = field(default_factory=dict)
    kernels: str = ""             # kernel flavour: "avx512" | "avx2" | "neon" | "neon-sdot" | "neon-sdot-i8mm"
    static_binary: bool = False   # edgellm-run linked -static, kernels linked into it (no dlopen)
    run_prefix: tuple[str, ...] = ()   # how this machine runs the target's binaries (qemu-user), () natively
    host_cpu: bool = False        # `tvm` lacks mcpu: it is this machine's CPU as LLVM names it (see tvm_dict)
    npu: bool = False             # also prefill graphs for the Hexagon NPU (ONNX Runtime's QNN EP): npu/ in the package
    # the backend its programs run on, whose compile side builds their kernels (compiler/backends/): "tvm_cpu"
    # (kernels.so, or linked into a static edgellm-run), "opencl" (kernels.cl + kernels.cltab), ...
    kernel_backend: str = "tvm_cpu"

    @property
    def gpu(self) -> bool:
        """Every program on the GPU (OpenCL)."""
        return self.kernel_backend == "opencl"

    def tvm_dict(self) -> dict:
        """The TVM target dict with everything resolved: for the host target, `mcpu` is asked of TVM's LLVM here
        (not when the target list is built, so that `edgellm targets` never imports TVM)."""
        if self.host_cpu and "mcpu" not in self.tvm:
            return {**self.tvm, "mcpu": llvm_host_cpu()}
        return dict(self.tvm)

    def tvm_target(self):
        import tvm

        return tvm.target.Target(self.tvm_dict())

    @property
    def cc_cmd(self) -> list[str]:
        """The C compiler as an argv prefix (cc may be a command with arguments, e.g. zig)."""
        return shlex.split(self.cc)


# x86 f32/f16 prefill GEMMs (gemm_outer) reach ~86% of FMA peak at 128 tokens a chunk, ~70% at 32 (the f16 panel
# widening and the token-tile setup amortise over the chunk). Integer schemes keep 32: their int8 activations of a
# 128-token chunk (128 x 5632 bytes for a 1B down-projection) no longer fit L2 (measured on 1B q4g32, Zen 3:
# prefill 87.8 tok/s at 32, 64.5 at 128). A prompt shorter than a chunk still costs a whole chunk.
X86_FLOAT_PREFILL_CHUNK = 128

# Packages with long chunks also carry a SHORT_PREFILL_CHUNK-token prefill program for the last piece of a prompt
# (runtime el_prefill: a piece of at most half a chunk), since a chunk costs the same however few of its rows are
# real: 1B f16 on Zen 5, 128-token chunks, a 5-token prompt took 590 ms, as one 16-token chunk 125 ms.
SHORT_PREFILL_CHUNK = 16


def short_prefill_chunk(chunk: int) -> int | None:
    """The short program's token count for a package of this prefill chunk (None: the chunk is short already)."""
    return SHORT_PREFILL_CHUNK if chunk >= 4 * SHORT_PREFILL_CHUNK else None


def x86_prefetch(small: bool) -> dict:
    """Software-prefetch distances of decode, as Target/CpuInfo fields: prefetch_bytes for the quantized GEMVs,
    float_prefetch_bytes for the f32/f16 GEMV. Measured at 2 threads on noisy shared hosts. 1 KiB for both on the AMD
    cores without AVX-512 (Zen 1-3): the f16 GEMV streams 22.9 -> 25.1 and 26.8 -> 30.5 GB/s with it on Zen 3,
    while 4 KiB costs there (22.7 -> 19.7). Elsewhere 4 KiB and 8 KiB: Cascade Lake f16 19.3 -> 25.5 GB/s at 4 KiB;
    on Zen 5, 1 KiB is the worst distance (1B q4g32 decode 76-81 tok/s against 88-95 at 4 KiB; 4 KiB beats 8 KiB
    there in 5 of 5 interleaved rounds), and the f16 GEMV, whose activation row (22 KiB at K=5632) shares L1 with
    the stream, decodes 1B f16 2-5% faster at 8 KiB than at 4 KiB (7 of 8 rounds)."""
    return {"prefetch_bytes": 1024, "float_prefetch_bytes": 1024} if small else \
        {"prefetch_bytes": 4096, "float_prefetch_bytes": 8192}


def host_prefetch() -> dict:
    """x86_prefetch for this machine's CPU: the short distances for AMD cores without AVX-512; and where each kind of
    kernel's prefetches put their lines (3: L1, 2: L2), measured at 2 threads, data from DRAM, interleaved. Intel (a
    Sapphire Rapids-class Xeon): the quantized GEMVs and small-batch GEMMs into L2 (the 1B's q4g32 GEMVs 29.4 -> 33.5
    GB/s, its 8-token q8 / q4g32 GEMMs 13% / 6% faster: L1's fill buffers cap the lines in flight while the dot products
    run), decode attention's K/V into L1 (L2 measured slower). AMD (a Zen 4, family 25 model 17): the GEMVs into L1 (L2
    3-5% slower: q4g32, q8, t2), the 8-token GEMMs into L2 (the 1B's q4g32 5632-k GEMM 367 -> 336 us, q8 458 -> 402
    us), decode attention's K/V into L2 (SmolLM2's shape at 260 keys: 0.74x the time of L1, which ran 0.93x of none).
    Zen 1-3 take Zen 4's (unmeasured there).
    float_slice_bytes (compiler/ops/kslice.py): on AMD (32 KiB L1) a float GEMV whose f32 activation row is over 12 KiB
    reads its weights K-sliced, one slice's activations staying in L1: the 1B's f16 down projection (K = 5632, 22 KiB)
    streamed 22-25 GB/s against 16-18 for its best row-major kernel (Zen 4, 2 threads, 30 interleaved rounds), 92-94%
    of the same bytes at K = 2048. Intel keeps row-major (unmeasured; a Sapphire Rapids core has a 48 KiB L1)."""
    intel = host_is_intel()
    return {**x86_prefetch(not intel and "avx512f" not in _host_x86_features()), "prefetch_locality": 2 if intel else 3,
            "batch_prefetch_locality": 2, "kv_prefetch_locality": 3 if intel else 2,
            "float_slice_bytes": 0 if intel else 12 << 10}


def host_is_intel() -> bool:
    try:
        with open("/proc/cpuinfo") as fh:
            return "GenuineIntel" in fh.read(4096)
    except OSError:
        return False


def _host_x86_features() -> tuple[str, ...]:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
    except OSError:
        flags = []
    return tuple(v for k, v in _X86_FEATURES.items() if k in flags)


def llvm_host_cpu() -> str:
    """This machine's CPU as LLVM names it (e.g. znver3), for -mcpu: imports TVM."""
    from tvm.target import codegen

    return codegen.llvm_get_system_cpu()


def host_cpu_name() -> str:
    """This machine's CPU model as /proc/cpuinfo names it (no TVM needed), or the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as f:
            for ln in f:
                key, _, val = ln.partition(":")
                if key.strip() in ("model name", "Model", "Hardware") and val.strip():
                    return " ".join(val.split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _host() -> Target:
    arch = platform.machine()
    if arch not in ("x86_64", "AMD64"):
        raise CompileError(f"--target host supports x86_64 machines for now, this one is {arch}")
    feats = _host_x86_features()
    wide = "avx512f" in feats and "avx512vnni" in feats
    return Target("host", f"this machine's CPU ({host_cpu_name()}, {'AVX-512' if 'avx512f' in feats else 'AVX2'})",
                  "x86_64", {"kind": "llvm", "num-cores": os.cpu_count() or 1},   # mcpu: tvm_dict() resolves it
                  # the 16-lane kernels' integer path needs VNNI (an AVX-512 CPU without it gets the AVX2 flavour)
                  "gcc", feats, 16 if wide else 8, float_prefill_chunk=X86_FLOAT_PREFILL_CHUNK,
                  kernels="avx512" if wide else "avx2", host_cpu=True, **host_prefetch())


_STATIC = {
    "x86-avx2": Target("x86-avx2", "any x86-64 CPU with AVX2+FMA (Haswell, Zen 1 and later)", "x86_64",
                       {"kind": "llvm", "mcpu": "haswell"}, "gcc", ("avx2", "fma", "f16c"), 8,
                       # the short distances of the AVX2-only AMD cores (Zen 1-3), where they were measured
                       float_prefill_chunk=X86_FLOAT_PREFILL_CHUNK, kernels="avx2", **x86_prefetch(True)),
    # VNNI is part of the definition: the 16-lane integer kernels are built on vpdpbusd (Skylake-SP lacks it: x86-avx2)
    "x86-avx512": Target("x86-avx512", "x86-64 CPUs with AVX-512 VNNI (Cascade Lake, Ice Lake, Zen 4 and later)",
                         "x86_64", {"kind": "llvm", "mcpu": "cascadelake"}, "gcc",
                         ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512vnni"), 16,
                         float_prefill_chunk=X86_FLOAT_PREFILL_CHUNK, kernels="avx512", **x86_prefetch(False)),
}

A64_GNU = "aarch64-linux-gnu"
QEMU_A64 = ("qemu-aarch64", "-L", "/usr/aarch64-linux-gnu")   # -L: the cross glibc (libc6-arm64-cross)
ANDROID_API = 28


def _a64_cc(static: bool = False) -> str:
    """Debian's cross gcc, else zig from PyPI (`pip install ziglang`; musl for static binaries)."""
    if shutil.which(f"{A64_GNU}-gcc") or not _has_zig():
        return f"{A64_GNU}-gcc"
    return f"{shlex.quote(sys.executable)} -m ziglang cc -target {'aarch64-linux-musl' if static else A64_GNU}"


def _has_zig() -> bool:
    import importlib.util

    return importlib.util.find_spec("ziglang") is not None


def _ndk_clang() -> str | None:
    """The NDK's aarch64 clang for API level ANDROID_API when ANDROID_NDK_HOME is set (and holds it)."""
    ndk = os.environ.get("ANDROID_NDK_HOME")
    if not ndk:
        return None
    host = "darwin-x86_64" if sys.platform == "darwin" else "linux-x86_64"
    cc = Path(ndk) / "toolchains" / "llvm" / "prebuilt" / host / "bin" / f"aarch64-linux-android{ANDROID_API}-clang"
    return str(cc) if cc.is_file() else None


def _arm_targets() -> dict[str, Target]:
    a64 = {"kind": "llvm", "mtriple": A64_GNU}
    ndk = _ndk_clang()
    android_cc = shlex.quote(ndk) if ndk else _a64_cc(static=True)
    return {
        "rpi4": Target("rpi4", "Raspberry Pi 4 (Cortex-A72, NEON, no dot product; 64-bit Raspberry Pi OS)", "aarch64",
                       {**a64, "mcpu": "cortex-a72", "mattr": ["+neon"], "num-cores": 4}, _a64_cc(), ("neon",), 4,
                       page_size=4096, kernels="neon", run_prefix=QEMU_A64,
                       notes={"binary": "dynamic (glibc)", "runs": "64-bit Raspberry Pi OS / Debian / Ubuntu on a Pi 4 "
                              "or any ARMv8.0-A Linux with NEON"}),
        "rpi5": Target("rpi5", "Raspberry Pi 5 (Cortex-A76, NEON + SDOT dot product; 64-bit Raspberry Pi OS)", "aarch64",
                       {**a64, "mcpu": "cortex-a76", "mattr": ["+neon", "+dotprod", "+fullfp16"], "num-cores": 4},
                       _a64_cc(), ("neon", "dotprod"), 4, page_size=16384, kernels="neon-sdot", run_prefix=QEMU_A64,
                       notes={"binary": "dynamic (glibc)", "runs": "a Pi 5 (its 16 KiB-page kernel included) or any "
                              "ARMv8.2-A Linux with dotprod (Cortex-A55/A76 and later, Graviton 2+)"}),
        "android-cpu": Target(
            "android-cpu", "Android phones, CPU (ARMv8.2-A + dotprod + i8mm: Snapdragon 8 Gen 2/3 class); static "
            f"edgellm-run for adb shell{'' if ndk else ' (no ANDROID_NDK_HOME: built with the glibc -static stand-in)'}",
            "aarch64",
            {"kind": "llvm", "mtriple": f"aarch64-linux-android{ANDROID_API}", "mcpu": "cortex-a76",
             "mattr": ["+neon", "+dotprod", "+fullfp16", "+i8mm"], "num-cores": 8},
            android_cc, ("neon", "dotprod", "i8mm"), 4, page_size=16384, kernels="neon-sdot-i8mm",
            static_binary=True, run_prefix=("qemu-aarch64",),
            notes={"binary": "static, kernels linked in (Android's loader cannot dlopen from a static binary)",
                   "toolchain": "NDK clang" if ndk else "aarch64-linux-gnu-gcc -static (stand-in: glibc instead of "
                   "bionic; same instructions and syscalls, runs from adb shell too; set ANDROID_NDK_HOME for the NDK)",
                   "runs": "64-bit Android 9+ phones whose CPUs have dotprod and i8mm (Cortex-A510/A710/X2 and "
                   "later: Snapdragon 8 Gen 1+, Dimensity 9000+); decode GEMVs use SDOT, prefill GEMMs i8mm SMMLA"}),
    }


def _npu_targets(arm: dict[str, Target]) -> dict[str, Target]:
    cpu = arm["android-cpu"]
    return {"android-npu": dataclasses.replace(
        cpu, name="android-npu", npu=True,
        description="Android phones with a Qualcomm Hexagon NPU (Snapdragon 8 Gen 2/3/Elite: sm8550/sm8650/sm8750): "
                    "prompt prefill in fixed chunks on the NPU through ONNX Runtime's QNN EP, decode on the "
                    "android-cpu kernels, one KV cache",
        notes={**cpu.notes, "npu": "npu/: W8A16 (or W4A16) QDQ graphs per group of layers + EPContext binaries per "
                                   "SoC; the phone needs libonnxruntime.so with the QNN EP and the HTP libraries"})}


def _gpu_targets() -> dict[str, Target]:
    """OpenCL GPUs. The kernels are OpenCL C built by the device's driver at first load, so one package serves every
    OpenCL 1.2 device; the target picks the architecture of bin/edgellm-run (dynamic: it dlopens libOpenCL.so)."""
    ndk = _ndk_clang()
    host = platform.machine() in ("x86_64", "AMD64")
    out = {"android-gpu": Target(
        "android-gpu", "Android phones' GPUs through OpenCL (Adreno 6xx-8xx, Mali-G7x/G6xx/Immortalis): every op as "
        "TVM-generated OpenCL C, run by libedgellm's OpenCL backend on the phone's libOpenCL.so", "aarch64",
        {"kind": "opencl"}, shlex.quote(ndk) if ndk else _a64_cc(), (), 4, page_size=16384, kernels="opencl",
        run_prefix=QEMU_A64, kernel_backend="opencl",
        notes={"binary": "dynamic (it dlopens the phone's libOpenCL.so)",
               "toolchain": "NDK clang" if ndk else "aarch64-linux-gnu-gcc (glibc: runs on ARM Linux boards with an "
               "OpenCL driver; set ANDROID_NDK_HOME for a bionic binary that runs from adb shell)",
               "runs": "any OpenCL 1.2 GPU; fp32 arithmetic, weights read in their stored format"})}
    if host:
        out["opencl"] = Target("opencl", "any OpenCL 1.2 device on this machine (a GPU's driver, or PoCL on the CPU)",
                               "x86_64", {"kind": "opencl"}, "gcc", (), 8, kernels="opencl", kernel_backend="opencl",
                               notes={"binary": "dynamic (it dlopens libOpenCL.so)"})
    return out


def _all_static() -> dict[str, Target]:
    arm = _arm_targets()
    return {**_STATIC, **arm, **_npu_targets(arm), **_gpu_targets()}


def list_targets() -> list[Target]:
    out = []
    try:
        out += [_host(), _host_npu()]
    except CompileError:
        pass
    return out + list(_all_static().values())


def _host_npu() -> Target:
    return dataclasses.replace(_host(), name="host-npu", npu=True,
                               description="this machine's CPU + the android-npu NPU graphs, for checking the NPU "
                                           "path on the HTP emulator of the onnxruntime-qnn wheel (x86-64 Linux)")


def get_target(name: str) -> Target:
    if name == "host":
        return _host()
    if name == "host-npu":
        return _host_npu()
    static = _all_static()
    if name in static:
        return static[name]
    names = ", ".join(["host", "host-npu", *static])
    raise CompileError(f"unknown target '{name}': choose one of {names} (see `edgellm targets`)")


def check_toolchain(t: Target) -> None:
    cmd = t.cc_cmd
    if not cmd or shutil.which(cmd[0]) is None:
        hint = ("apt-get install gcc-aarch64-linux-gnu libc6-arm64-cross (or pip install ziglang)"
                if t.arch == "aarch64" else "e.g. apt-get install gcc")
        raise CompileError(f"target {t.name} needs the C compiler '{t.cc}', which is not on PATH: install it ({hint})")
