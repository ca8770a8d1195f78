"""Timing kernel variants on this machine: build them all in one TVM module, give each shape arguments that stream
from DRAM (copies totalling more than the last-level cache, visited round-robin, as decode visits a model's
weights), and time the variants interleaved, round after round, so that the host's drifting memory bandwidth hits
every variant alike. The result per variant is the median over rounds of the seconds per call."""
from __future__ import annotations

import time

import numpy as np

MAX_COPY_BYTES = 1 << 30   # never hold more than this in argument copies for one shape


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


def fake_args(func, stream_bytes: int, seed: int = 0) -> list[list]:
    """Argument sets for `func` (every buffer a fresh random array): enough copies that one pass over them reads
    `stream_bytes` or more, so each call finds its weights out of cache."""
    import tvm

    rng = np.random.default_rng(seed)
    shapes = signature(func)
    per_copy = sum(int(np.prod(s)) * np.dtype(d).itemsize for s, d in shapes)
    copies = max(1, min(-(-stream_bytes // per_copy), MAX_COPY_BYTES // per_copy, 256))
    return [[tvm.runtime.tensor(_fill(s, d, rng)) for s, d in shapes] for _ in range(copies)]


def time_variants(mod, variants: dict[str, str], argsets: dict[str, list[list]], rounds: int) -> dict[str, float]:
    """{variant: median seconds per call} of the functions `variants` names (variant -> function name) on their
    argument copies (`argsets[variant]`); each round runs every variant once over all its copies, in a rotating
    order."""
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
    return {v: float(np.median(s)) for v, s in samples.items()}
