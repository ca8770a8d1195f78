"""Benchmark of the edgellm linear kernels (decode GEMV T=1, prefill GEMM T=64) against numpy f32 matmul.

Usage: python bench/ops_bench.py [--threads 2] [--repeat 7] [--shapes 768x768,3072x768] [--T 1,64] [--extra]
Prints a table: us per call, GFLOP/s, GB/s (bytes of W + x + out per call), compile time per kernel.
numpy (OpenBLAS, f32 weights) is measured in the same run with the same thread count, round-robin with the
edgellm kernels of the same shape (min over --repeat rounds), so background load hits all alike.
--extra adds attention / rmsnorm / swiglu / rope rows.
"""
from __future__ import annotations

import argparse
import os


def _args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--shapes", default="768x768,3072x768,768x3072,32000x768", help="NxK list")
    ap.add_argument("--T", default="1,64")
    ap.add_argument("--dtypes", default="float32,float16")
    ap.add_argument("--extra", action="store_true")
    ap.add_argument("--compile-suite", action="store_true",
                    help="only time make_kernel + tvm.compile for the kernels of a small Llama-style model")
    return ap.parse_args()


ARGS = _args()
# thread counts must be fixed before numpy / tvm start their pools
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TVM_NUM_THREADS"):
    os.environ[var] = str(ARGS.threads)

import time

import numpy as np
import tvm


from edgellm.compiler import ops  # noqa: E402

CPU = ops.host_cpu_info(ARGS.threads)
TARGET = ops.llvm_target(ARGS.threads)


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


def interleaved(fns: dict, min_ms=150):
    """Min time per call of each fn, measured round-robin over ARGS.repeat rounds."""
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


def row(label, t, flop, nbytes, extra=""):
    gf = f"{flop / t / 1e9:9.1f}" if flop else f"{'':9s}"
    print(f"{label:38s} {t * 1e6:10.1f} {gf} {nbytes / t / 1e9:8.1f}  {extra}", flush=True)


def main():
    rng = np.random.default_rng(0)
    print(f"# host cpu {tvm.target.codegen.llvm_get_system_cpu()}, {os.cpu_count()} logical cpus, "
          f"threads={ARGS.threads}, {CPU}; load avg {os.getloadavg()[0]:.2f}")
    print(f"# numpy {np.__version__}, tvm {tvm.__version__}; min over {ARGS.repeat} round-robin rounds; "
          "compile = make_kernel + tvm.compile")
    print(f"{'kernel':38s} {'us':>10s} {'GFLOP/s':>9s} {'GB/s':>8s}  compile / check")
    shapes = [tuple(int(v) for v in s.split("x")) for s in ARGS.shapes.split(",")]
    dtypes = ARGS.dtypes.split(",")
    for T in [int(v) for v in ARGS.T.split(",")]:
        for N, K in shapes:
            x = rng.standard_normal((T, K)).astype("float32")
            W32 = rng.standard_normal((N, K)).astype("float32")
            flop = 2.0 * T * N * K
            io = T * K * 4 + T * N * 4
            fns = {"numpy": lambda x=x, W32=W32: x @ W32.T}
            info = {}
            for wd in dtypes:
                W = W32.astype(wd)
                name, kern, tc = build("linear", T=T, N=N, K=K, wdtype=wd)
                out = tvm.runtime.tensor(np.zeros((T, N), "float32"))
                args = [tvm.runtime.tensor(x), tvm.runtime.tensor(W), out]
                kern(*args)
                r = x.astype(np.float64) @ W.astype(np.float64).T
                err = np.abs(out.numpy() - r).max() / np.abs(r).max()
                fns[wd] = lambda kern=kern, args=args: kern(*args)
                info[wd] = (W.itemsize, f"compile {tc * 1e3:4.0f} ms  err {err:.1e}  {name}")
            best = interleaved(fns)
            row(f"numpy f32    T={T:<3d} {N}x{K}", best["numpy"], flop, N * K * 4 + io)
            for wd in dtypes:
                row(f"edgellm {'f32' if wd == 'float32' else 'f16'}  T={T:<3d} {N}x{K}", best[wd], flop,
                    N * K * info[wd][0] + io, info[wd][1])
    if ARGS.extra:
        extra()


def extra():
    rng = np.random.default_rng(1)
    print("# other kernels (attention GFLOP/s counts 4*D flops per visible (query, head, key); GB/s = k+v bytes)")
    for T, NH, KVH, D, S in [(1, 12, 12, 64, 2048), (1, 32, 8, 64, 2048), (64, 12, 12, 64, 2048),
                             (64, 32, 8, 64, 512)]:
        name, kern, tc = build("attention", T=T, NH=NH, KVH=KVH, D=D)
        q = rng.standard_normal((T, NH, D)).astype("float32")
        k = rng.standard_normal((S, KVH, D)).astype("float32")
        v = rng.standard_normal((S, KVH, D)).astype("float32")
        args = [tvm.runtime.tensor(a) for a in (q, k, v)] + [tvm.runtime.tensor(np.zeros((T, NH * D), "float32"))]
        t = interleaved({0: lambda kern=kern, args=args: kern(*args)})[0]
        keys = sum(S - T + t_ + 1 for t_ in range(T))
        row(f"attention T={T} NH={NH}/{KVH} D={D} S={S}", t, 4.0 * NH * D * keys, 2 * S * KVH * D * 4,
            f"compile {tc * 1e3:4.0f} ms  {name}")
    for op, p, shapes in [("rmsnorm", {"R": 64, "D": 4096, "eps": 1e-5}, [(64, 4096), (4096,)]),
                          ("swiglu", {"T": 64, "F": 11008}, [(64, 11008), (64, 11008)]),
                          ("rope", {"T": 64, "H": 32, "D": 128}, [(64, 32, 128), (64, 64), (64, 64)]),
                          ("add", {"R": 1, "N": 4096}, [(1, 4096), (1, 4096)])]:
        name, kern, tc = build(op, **p)
        ins = [rng.standard_normal(s).astype("float32") for s in shapes]
        args = [tvm.runtime.tensor(a) for a in ins] + [tvm.runtime.tensor(np.zeros(shapes[0], "float32"))]
        t = interleaved({0: lambda kern=kern, args=args: kern(*args)})[0]
        nbytes = sum(a.nbytes for a in ins) + ins[0].nbytes
        row(f"{op} {'x'.join(map(str, shapes[0]))}", t, 0, nbytes, f"compile {tc * 1e3:4.0f} ms  {name}")


def compile_suite():
    """make_kernel + tvm.compile time per kernel for a 768-wide, 12-head, vocab-32000 model
    (decode T=1 and prefill chunk T=64), plus the whole set built as one module."""
    specs = []
    for T in (1, 64):
        specs += [("embed", {"T": T, "V": 32000, "D": 768, "wdtype": "float16"}),
                  ("rmsnorm", {"R": T, "D": 768, "eps": 1e-5}),
                  ("linear", {"T": T, "N": 2304, "K": 768, "wdtype": "float16"}),
                  ("linear", {"T": T, "N": 768, "K": 768, "wdtype": "float16"}),
                  ("linear", {"T": T, "N": 6144, "K": 768, "wdtype": "float16"}),
                  ("linear", {"T": T, "N": 768, "K": 3072, "wdtype": "float16"}),
                  ("linear", {"T": T, "N": 32000, "K": 768, "wdtype": "float16"}),
                  ("rope", {"T": T, "H": 12, "D": 64}), ("attention", {"T": T, "NH": 12, "KVH": 12, "D": 64}),
                  ("add", {"R": T, "N": 768}), ("swiglu", {"T": T, "F": 3072}), ("copy", {"R": T, "N": 768})]
    funcs = {}
    total = 0.0
    print(f"{'kernel':40s} {'make ms':>8s} {'compile ms':>10s}")
    for op, p in specs:
        t0 = time.perf_counter()
        name, func = ops.make_kernel(op, CPU, **p)
        t1 = time.perf_counter()
        tvm.compile(tvm.IRModule({name: func}), target=TARGET)
        t2 = time.perf_counter()
        funcs[name] = func
        total += t2 - t0
        print(f"{name:40s} {1e3 * (t1 - t0):8.0f} {1e3 * (t2 - t1):10.0f}", flush=True)
    t0 = time.perf_counter()
    tvm.compile(tvm.IRModule(funcs), target=TARGET)
    print(f"# {len(funcs)} kernels: sum of separate builds {total:.2f} s; "
          f"one module (make_kernel cached) {time.perf_counter() - t0:.2f} s; load avg {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    if ARGS.compile_suite:
        compile_suite()
    else:
        main()
