"""Benchmark of the quantized linear kernels (decode GEMV T=1, prefill GEMM T=64) against numpy f32 and the f16
kernel, all measured in the same run.

Usage: python bench/quant_ops_bench.py [--threads 1,2] [--repeat 5] [--shapes 4096x4096,5632x2048,2048x5632]
                                       [--T 1,64] [--kinds f16,q8,q4g32,t2,t2_lut]
Shapes are NxK (out x in). Prints per row: us per call, GB/s of weights (packed bytes incl. scales read per call /
time), GFLOP/s (2*T*N*K / time), max error vs the scheme's exact numpy reference (relative to max |ref|; f16 and
numpy vs the f32 product) and the kernel name. Each thread count runs in its own process (numpy's and TVM's
pools are sized at start-up); within a process the kinds of one shape are timed round-robin (min over --repeat
rounds), so background load hits all alike. Run under `nice` on a shared machine.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys


def _args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--shapes", default="4096x4096,5632x2048,2048x5632")
    ap.add_argument("--T", default="1,64")
    ap.add_argument("--kinds", default="f16,q8,q4g32,t2,t2_lut")
    ap.add_argument("--min-ms", type=float, default=100.0, help="minimum time per measurement round")
    ap.add_argument("--lanes", type=int, default=0, help="override vector_lanes (8: AVX2 kernels on an AVX-512 host)")
    return ap.parse_args()


ARGS = _args()
THREADS = [int(v) for v in ARGS.threads.split(",")]
if len(THREADS) > 1:  # one process per thread count
    for nt in THREADS:
        argv = [a for a in sys.argv[1:]]
        if "--threads" in argv:
            i = argv.index("--threads")
            argv[i + 1] = str(nt)
        else:
            argv += ["--threads", str(nt)]
        subprocess.run([sys.executable, __file__] + argv, check=True)
    sys.exit(0)

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TVM_NUM_THREADS"):
    os.environ[var] = str(THREADS[0])

import time  # noqa: E402

import numpy as np  # noqa: E402
import tvm  # noqa: E402

from edgellm.compiler import ops  # noqa: E402
from edgellm.compiler.ops.linear_quant import path_for  # noqa: E402
from edgellm.quant import get_scheme  # noqa: E402

NT = THREADS[0]
CPU = ops.host_cpu_info(NT)
if ARGS.lanes:
    CPU = ops.CpuInfo(vector_lanes=ARGS.lanes, num_threads=NT, arch=CPU.arch)
TARGET = ops.llvm_target(NT)


def build(op, **p):
    t0 = time.perf_counter()
    name, func = ops.make_kernel(op, CPU, **p)
    f = tvm.compile(tvm.IRModule({name: func}), target=TARGET).jit()
    return name, f[name], time.perf_counter() - t0


def _calib(fn, min_ms):
    fn()
    t0 = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t0, 1e-6)
    return max(1, int(min_ms / 1e3 / once / ARGS.repeat))


def interleaved(fns: dict, min_ms):
    numbers = {k: _calib(fn, min_ms) for k, fn in fns.items()}
    best = {k: float("inf") for k in fns}
    for _ in range(ARGS.repeat):
        for k, fn in fns.items():
            n = numbers[k]
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best[k] = min(best[k], (time.perf_counter() - t0) / n)
    return best


def kind_setup(kind, T, N, K, W32, x):
    """-> (callable, weight bytes, error, kernel name)."""
    scheme = get_scheme("t2" if kind == "t2_lut" else kind)
    parts = scheme.quantize(W32)
    op, p = scheme.linear_kernel(T, N, K, bias=False)
    if kind == "t2_lut":
        op = "linear_t2_lut"
    elif kind == "t2":
        op = "linear_t2"
    name, kern, tc = build(op, **p)
    arrs = [parts[k] for k in scheme.part_order]
    out = tvm.runtime.tensor(np.zeros((T, N), "float32"))
    args = [tvm.runtime.tensor(x)] + [tvm.runtime.tensor(a) for a in arrs] + [out]
    kern(*args)
    if kind == "f16":
        ref = x.astype(np.float64) @ W32.astype(np.float64).T
    else:
        ref = scheme.reference_linear(x, parts)
    err = np.abs(out.numpy() - ref).max() / np.abs(ref).max()
    wbytes = sum(a.nbytes for a in arrs)
    return (lambda: kern(*args)), wbytes, err, f"{name} (compile {tc * 1e3:.0f} ms)"


def main():
    rng = np.random.default_rng(0)
    kinds = ARGS.kinds.split(",")
    print(f"# host cpu {tvm.target.codegen.llvm_get_system_cpu()}, threads={NT}, {CPU}, "
          f"integer path={path_for(CPU)}; "
          f"load avg {os.getloadavg()[0]:.2f}; min over {ARGS.repeat} round-robin rounds", flush=True)
    print(f"{'kernel':10s} {'thr':>3s} {'T':>3s} {'N x K':>11s} {'us':>10s} {'GB/s(W)':>8s} {'GFLOP/s':>8s} "
          f"{'err':>8s}  name")
    for T in [int(v) for v in ARGS.T.split(",")]:
        for shape in ARGS.shapes.split(","):
            N, K = (int(v) for v in shape.split("x"))
            x = rng.standard_normal((T, K)).astype("float32")
            W32 = (rng.standard_normal((N, K)) * 0.02).astype("float32")
            fns = {"numpy f32": lambda x=x, W32=W32: x @ W32.T}
            info = {"numpy f32": (W32.nbytes, 0.0, "OpenBLAS sgemm/sgemv, f32 weights")}
            for kind in kinds:
                fn, wbytes, err, name = kind_setup(kind, T, N, K, W32, x)
                fns[kind] = fn
                info[kind] = (wbytes, err, name)
            best = interleaved(fns, ARGS.min_ms)
            for k, t in best.items():
                wbytes, err, name = info[k]
                print(f"{k:10s} {NT:3d} {T:3d} {N:5d}x{K:<5d} {t * 1e6:10.1f} {wbytes / t / 1e9:8.2f} "
                      f"{2.0 * T * N * K / t / 1e9:8.1f} {err:8.1e}  {name}", flush=True)


if __name__ == "__main__":
    main()
