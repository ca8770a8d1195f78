"""OpenCL backend speed on this machine's OpenCL device: decode tok/s and each decode GEMV's weight bandwidth as a
share of the device's measured read bandwidth (a streaming-read kernel timed in the same run).

    python bench/opencl.py [--model DIR] [--quants f16,q8,q4g32,t2] [--device 0:0]

On PoCL (a CPU) the numbers describe PoCL, not a GPU: the point of this script is a real GPU (an NVIDIA machine's
OpenCL driver, or a phone with python). Goal on a GPU: decode GEMVs >= 70% of the measured bandwidth."""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemv_profile import decode_profile  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("EDGELLM_BENCH_CACHE", Path.home() / ".cache" / "edgellm" / "bench")) / "opencl"
READ_KERNEL = """
__kernel void read_sum(__global const float4* restrict a, __global float* restrict out, uint n4) {
  float4 s = (float4)(0.0f);
  for (uint i = get_global_id(0); i < n4; i += get_global_size(0)) s += a[i];
  out[get_global_id(0)] = s.x + s.y + s.z + s.w;
}
"""


def device_bandwidth(device: str | None, mb: int = 256, reps: int = 5) -> tuple[str, float]:
    """(device name, best GB/s of a streaming read over `mb` MB) through pyopencl."""
    import pyopencl as cl

    devs = [(p, d) for p in cl.get_platforms() for d in p.get_devices()]
    if device and re.fullmatch(r"\d+:\d+", device):
        pi, di = map(int, device.split(":"))
        dev = cl.get_platforms()[pi].get_devices()[di]
    else:
        match = [d for _, d in devs if device and device in d.name]
        gpus = [d for _, d in devs if d.type & cl.device_type.GPU]
        dev = (match or gpus or [d for _, d in devs])[0]
    ctx = cl.Context([dev])
    q = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    n = mb * 2**20 // 4
    a = cl.Buffer(ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=np.ones(n, np.float32))
    groups = dev.max_compute_units * 64
    out = cl.Buffer(ctx, cl.mem_flags.WRITE_ONLY, groups * 64 * 4)
    k = cl.Program(ctx, READ_KERNEL).build().read_sum
    best = 0.0
    for _ in range(reps + 1):
        ev = k(q, (groups * 64,), (64,), a, out, np.uint32(n // 4))
        ev.wait()
        best = max(best, n * 4 / ((ev.profile.end - ev.profile.start) * 1e-9) / 1e9)
    return dev.name, best


def package(model: Path, quant: str) -> Path:
    out = CACHE / f"{model.name}-{quant}-opencl"
    if not (out / "manifest.json").is_file():
        from edgellm.compiler.driver import compile_model

        compile_model(model, target="opencl", quant=quant, out=out, progress=False)
    return out


def profile(pkg: Path, device: str | None, gen_len: int) -> tuple[float, list[tuple[str, float, float]]]:
    """(decode tok/s, [(kernel, ms per token, weight GB/s)] of decode) from `edgellm bench` with EDGELLM_PROFILE."""
    cmd = [sys.executable, "-m", "edgellm.cli", "bench", str(pkg), "--prompt-len", "32", "--gen-len", str(gen_len),
           "--reps", "1", *(["--device", device] if device else [])]
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "EDGELLM_PROFILE": "1"}, timeout=3600)
    if r.returncode != 0:
        raise SystemExit(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "edgellm bench failed")
    tok_s = float(re.search(r"decode ([\d.]+) tok/s", r.stdout).group(1))
    rows = [(k, ms, gbs) for k, ms, gbs, _ in decode_profile(r.stderr)]
    return tok_s, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "models" / "demo" / "demo-llama"))
    ap.add_argument("--quants", default="f16,q8,q4g32,t2")
    ap.add_argument("--device", default=None)
    ap.add_argument("--gen-len", type=int, default=64)
    a = ap.parse_args()
    name, bw = device_bandwidth(a.device)
    print(f"device: {name}; streaming read {bw:.1f} GB/s (best of 5, {time.strftime('%H:%M:%S')})")
    print("| scheme | decode tok/s | GEMV | ms/token | weight GB/s | % of read bandwidth |")
    print("|---|---|---|---|---|---|")
    for qn in a.quants.split(","):
        tok_s, rows = profile(package(Path(a.model), qn), a.device, a.gen_len)
        gemvs = [r for r in rows if r[0].startswith("linear") and r[2] > 0]
        for i, (k, ms, gbs) in enumerate(gemvs):
            print(f"| {qn if i == 0 else ''} | {f'{tok_s:.1f}' if i == 0 else ''} | {k} | {ms:.3f} | {gbs:.2f} | "
                  f"{100 * gbs / bw:.0f}% |")
    _, bw2 = device_bandwidth(a.device)
    print(f"streaming read after the runs: {bw2:.1f} GB/s")


if __name__ == "__main__":
    main()
