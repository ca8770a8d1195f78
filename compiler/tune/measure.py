"""Timing kernel variants on this machine: build them all in one TVM module, give each shape arguments that stream
from DRAM (copies totalling more than the last-level cache, visited round-robin, as decode visits a model's
weights), and time the variants interleaved, round after round, so that the host's drifting memory bandwidth hits
every variant alike. The result per variant is the median over rounds of the seconds per call."""
from __future__ import annotations

import time

import numpy as np

# never hold more than this in argument copies for one shape: a VM reports its host's whole L3 (480 MiB on a 2-vCPU
# Xeon), of which it gets a share; 2x that made every 1B tune fill and stream a GiB per shape
MAX_COPY_BYTES = 512 << 20


def build(funcs: dict, target):
    """One in-process TVM module holding every function (name -> PrimFunc, global_symbol == name)."""
    import tvm

    return tvm.compile(tvm.IRModule(funcs), target=target.tvm_target())


def _fill(shape, dtype: str, rng) -> np.ndarray:
    """Random codes, and floats in [0.5, 1): finite scales and activations, no denormals (the kernels have no
    data-dependent branches, so the values only matter for the outputs the tests compare)."""
    if dtype == "uint8":
        return rng.integers(0, 256, size=shape, dtype=np.uint8)
    if dtype.startswith("int") or dtype.startswith("uint"):
        return rng.integers(0, 2, size=shape).astype(dtype)
    return (rng.random(size=shape, dtype=np.float32) * 0.5 + 0.5).astype(dtype)


def signature(func) -> tuple:
    return tuple((tuple(int(d) for d in p.shape), str(p.dtype)) for p in func.params)   # params are the buffers


HUGE_PAGE = 2 << 20
ALIGN = 4096


def fake_args(func, stream_bytes: int, seed: int = 0) -> list[list]:
    """Argument sets for `func`: enough copies that one pass over them reads `stream_bytes` or more, so each call
    finds its weights out of cache. Every copy is its own memory holding the same random values (the kernels have
    no data-dependent branches: filling each copy anew took most of a 1B model's tuning time).

    The copies live in one pool that NumPy advises for transparent huge pages (it does so for large arrays), as the
    runtime holds weights (offload/resident.c): the best prefetch distance depends on the page size (1B f16 GEMV on
    a Xeon: 2 KiB ahead streamed 32 GB/s in huge pages and 16 KiB 23; in 4 KiB pages 16 KiB looked best)."""
    import tvm

    rng = np.random.default_rng(seed)
    shapes = signature(func)
    values = [_fill(s, d, rng) for s, d in shapes]
    sizes = [-(-v.nbytes // ALIGN) * ALIGN for v in values]
    per_copy = sum(sizes)
    copies = max(1, min(-(-stream_bytes // per_copy), MAX_COPY_BYTES // per_copy, 256))
    pool = np.empty(copies * per_copy + HUGE_PAGE, np.uint8)
    at = -pool.ctypes.data % HUGE_PAGE
    out = []
    for _ in range(copies):
        args = []
        for v, size in zip(values, sizes):
            view = pool[at:at + v.nbytes].view(v.dtype).reshape(v.shape)
            view[...] = v
            args.append(tvm.runtime.from_dlpack(view))   # shares the pool's memory (and keeps it alive)
            at += size
        out.append(args)
    return out


def time_variants(mod, variants: dict[str, str], argsets: dict[str, list[list]], rounds: int) -> dict[str, float]:
    """{variant: seconds per call} of the functions `variants` names (variant -> function name) on their argument
    copies (`argsets[variant]`); each round runs every variant once over all its copies, in a rotating order.

    A variant's result is the median over rounds of its time relative to that round's mean, times the median
    round mean: a shared host's bandwidth moves 1.5-2x between rounds, and medians of raw times take each variant's
    median from a different round. Simulated (per-round speeds uniform in 1-2, 2% noise per call, 7 rounds), raw
    medians ranked a variant 5% slower first in 3% of 2000 seeds, the paired ratios in none (tests/test_tune.py).
    """
    fns = {v: mod[name] for v, name in variants.items()}
    for v, f in fns.items():   # warm: code paged in, thread pool up
        f(*argsets[v][0])
    samples: dict[str, list[float]] = {v: [] for v in fns}
    order = list(fns)
    for r in range(rounds):
        for v in order[r % len(order):] + order[:r % len(order)]:
            f, sets = fns[v], argsets[v]
            t0 = time.perf_counter()
            for args in sets:
                f(*args)
            samples[v].append((time.perf_counter() - t0) / len(sets))
    means = np.mean([samples[v] for v in order], axis=0)    # per round
    scale = float(np.median(means))
    return {v: scale * float(np.median(np.asarray(s) / means)) for v, s in samples.items()}
