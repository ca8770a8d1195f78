"""Every kernel flavour of the ARM targets, op by op, under qemu-aarch64 against the numpy references.

One kernels.so per flavour holds all cases (compiler/kernels_build.py, as for a package); tests/c/kernel_call.c
calls them on tensors from files. Flavours: rpi4 (NEON without dotprod: the generic integer path, run on a
cortex-a72 model so that a dot-product instruction would fault), rpi5 (SDOT, on cortex-a76, which has no i8mm)
and android-cpu (SDOT for decode, i8mm SMMLA for the prefill GEMMs, on qemu's `max` CPU). The cases cover
what packages may not reach: tail panels (N % 16), biases, ragged token blocks (T % 4), q4 group sizes, an
all-zero token, and the T-MAC lookup-table kernel (linear_t2_lut, NEON tbl). Bounds as on x86
(tests/test_ops.py, tests/test_ops_quant.py): max |out - ref| <= 1e-5 * max |ref|; f16 weights 1e-5 too (the
reference uses the same f16 values).
"""
from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tvm")

from edgellm.compiler import ops  # noqa: E402
from edgellm.compiler.kernels_build import build_kernels  # noqa: E402
from edgellm.quant import get_scheme  # noqa: E402
from edgellm.targets import get_target  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
QEMU_CPU = {"rpi4": "cortex-a72", "rpi5": "cortex-a76", "android-cpu": "max"}
RTOL = 1e-5
HAVE_CROSS = shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-gcc") and \
    Path("/usr/aarch64-linux-gnu/lib").is_dir()
pytestmark = pytest.mark.skipif(not HAVE_CROSS, reason="needs qemu-aarch64, gcc-aarch64-linux-gnu and "
                                "libc6-arm64-cross (apt-get install qemu-user gcc-aarch64-linux-gnu libc6-arm64-cross)")
DT = {np.dtype("float32"): (2, 32), np.dtype("float16"): (2, 16), np.dtype("int32"): (0, 32),
      np.dtype("uint8"): (1, 8), np.dtype("int8"): (0, 8)}


def quant_case(op, T, N, K, G=32, bias=False, seed=0):
    r = np.random.default_rng(seed + 7 * T + N + K)
    scheme = get_scheme(f"q4g{G}" if op == "linear_q4" else {"linear_q8": "q8", "linear_q6": "q6",
                                                             "linear_q4m": "q4m32"}.get(op, "t2"))
    x = r.standard_normal((T, K)).astype(np.float32)
    x[:, ::17] *= 20.0                                   # outlier channels
    if T > 2:
        x[1] = 0.0                                       # an all-zero token (clamped absmax)
    parts = scheme.quantize((r.standard_normal((N, K)) * 0.05).astype(np.float32))
    arrays = [x] + [parts[k] for k in scheme.part_order] + ([r.standard_normal(N).astype(np.float32)] if bias else [])
    p = {"T": T, "N": N, "K": K, "bias": bias, **({"G": G} if op == "linear_q4" else {})}
    return op, p, arrays, (T, N)


def float_cases():
    r = np.random.default_rng(1)
    rn = lambda *s: r.standard_normal(s).astype(np.float32)  # noqa: E731
    q8 = get_scheme("q8").quantize((r.standard_normal((37, 64)) * 0.1).astype(np.float32))
    q6 = get_scheme("q6").quantize((r.standard_normal((37, 64)) * 0.1).astype(np.float32))
    return [
        ("linear", {"T": 1, "N": 40, "K": 96}, [rn(1, 96), rn(40, 96)], (1, 40)),
        ("linear", {"T": 6, "N": 72, "K": 64, "bias": True}, [rn(6, 64), rn(72, 64), rn(72)], (6, 72)),
        ("linear", {"T": 5, "N": 48, "K": 64, "wdtype": "float16"}, [rn(5, 64), rn(48, 64).astype(np.float16)], (5, 48)),
        ("rmsnorm", {"R": 6, "D": 100, "eps": 1e-5}, [rn(6, 100), rn(100)], (6, 100)),
        ("rope", {"T": 3, "H": 2, "D": 16}, [rn(3, 2, 16), rn(3, 8), rn(3, 8)], (3, 2, 16)),
        ("attention", {"T": 3, "NH": 4, "KVH": 2, "D": 16}, [rn(3, 4, 16), rn(7, 2, 16), rn(7, 2, 16)], (3, 64)),
        ("attention", {"T": 1, "NH": 2, "KVH": 2, "D": 32}, [rn(1, 2, 32), rn(5, 2, 32), rn(5, 2, 32)], (1, 64)),
        ("swiglu", {"T": 3, "F": 70}, [rn(3, 70), rn(3, 70)], (3, 70)),
        ("relu2_mul", {"T": 2, "F": 33}, [rn(2, 33), rn(2, 33)], (2, 33)),
        ("add", {"R": 3, "N": 21}, [rn(3, 21), rn(3, 21)], (3, 21)),
        ("embed", {"T": 3, "V": 50, "D": 24}, [np.array([0, 49, 7], np.int32), rn(50, 24)], (3, 24)),
        ("embed_q8", {"T": 3, "V": 37, "D": 64}, [np.array([36, 0, 20], np.int32), q8["qweight"], q8["scales"]], (3, 64)),
        ("embed_q6", {"T": 3, "V": 37, "D": 64}, [np.array([36, 0, 20], np.int32), q6["qweight"], q6["scales"]], (3, 64)),
        # sliding-window attention: windows starting inside a key chunk, and (W=20, S=50) one covering a whole chunk
        ("attention", {"T": 3, "NH": 4, "KVH": 2, "D": 16, "W": 4}, [rn(3, 4, 16), rn(40, 2, 16), rn(40, 2, 16)], (3, 64)),
        ("attention", {"T": 1, "NH": 2, "KVH": 2, "D": 32, "W": 20}, [rn(1, 2, 32), rn(50, 2, 32), rn(50, 2, 32)], (1, 64)),
    ]


CASES = float_cases() + [
    quant_case(op, T, N, K, **kw)
    for op in ("linear_q8", "linear_q4", "linear_t2", "linear_t2_lut")
    for T, N, K, kw in [(1, 40, 128, {}), (6, 48, 64, {"bias": True}), (3, 19, 256, {}), (2, 16, 96, {})]
] + [quant_case("linear_q4", 5, 32, 256, G=128), quant_case("linear_q4", 1, 21, 128, G=64, bias=True),
     quant_case("linear_q4", 8, 33, 128, G=64), quant_case("linear_q6", 1, 40, 128), quant_case("linear_q6", 1, 19, 256),
     quant_case("linear_q6", 3, 16, 64, bias=True), quant_case("linear_q4m", 1, 37, 128, bias=True),
     quant_case("linear_q4m", 6, 32, 96)]


def write_args(path: Path, arrays):
    with open(path, "wb") as f:
        f.write(struct.pack("<I", len(arrays)))
        for a in arrays:
            a = np.ascontiguousarray(a)
            code, bits = DT[a.dtype]
            f.write(struct.pack("<BBBB", code, bits, a.ndim, 0) + struct.pack(f"<{a.ndim}q", *a.shape))
            f.write(struct.pack("<Q", a.nbytes) + a.tobytes())


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    exe = tmp_path_factory.mktemp("harness") / "kernel_call"
    subprocess.run(["aarch64-linux-gnu-gcc", "-std=c11", "-O2", f"-I{ROOT / 'runtime'}", str(ROOT / "tests/c/kernel_call.c"),
                    "-o", str(exe), "-ldl"], check=True, capture_output=True, text=True)
    return exe


@pytest.mark.parametrize("target", ["rpi4", "rpi5", "android-cpu"])
def test_arm_kernels_match_reference(target, harness, tmp_path, caplog):
    t = get_target(target)
    cpu = ops.CpuInfo(t.vector_lanes, 2, t.arch, t.features)
    with caplog.at_level("WARNING", logger="edgellm.compiler.ops"):
        names = [ops.make_kernel(op, cpu, **p) for op, p, _, _ in CASES]
    assert not caplog.records, f"tuned schedules fell back to plain kernels: {caplog.text}"
    build_kernels(dict(names), t, tmp_path / "kernels.so")
    cmd = ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu", "-cpu", QEMU_CPU[target], str(harness), str(tmp_path / "kernels.so")]
    for i, ((name, _), (_, _, arrays, out_shape)) in enumerate(zip(names, CASES)):
        write_args(tmp_path / f"in{i}", [*arrays, np.full(out_shape, np.nan, np.float32)])
        cmd += [name, str(tmp_path / f"in{i}"), str(tmp_path / f"out{i}")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    for i, ((name, _), (op, p, arrays, out_shape)) in enumerate(zip(names, CASES)):
        n_out = int(np.prod(out_shape))
        out = np.frombuffer((tmp_path / f"out{i}").read_bytes()[-4 * n_out:], np.float32).reshape(out_shape)
        ref = ops.reference(op, arrays, **p)
        err = np.abs(out.astype(np.float64) - ref).max() if np.all(np.isfinite(out)) else np.inf
        assert err <= RTOL * np.abs(ref).max(), f"{target} {name}: max err {err:.3e}, max |ref| {np.abs(ref).max():.3e}"
