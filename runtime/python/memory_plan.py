"""`edgellm plan`: how a package would use memory under a budget, and the decode speed its storage allows.

The layout itself is decided by the C weight store (offload/window.c) that will run the package: Runtime.plan asks it
without reading any weights, so what is printed here is what a run does. This module adds names (which layers stay
resident) and the storage-bound prediction."""
from __future__ import annotations

import mmap
import os
import re
import time
from pathlib import Path

from .api import Runtime
from .package import read_manifest

LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def measure_read_bandwidth(path: Path, direct: bool = False, nbytes: int = 256 << 20,
                           request: int = 1 << 20) -> float | None:
    """Bytes/s of a cold sequential read of the file's middle, the way the window store reads: buffered with the
    kernel's read-ahead and dropped from the page cache behind the reads, or O_DIRECT. None where it cannot."""
    try:
        fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECT", 0) if direct else 0))
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        n = min(nbytes, size // request * request)
        if n <= 0:
            return None
        start = (size - n) // 2 // request * request
        if not direct:
            os.posix_fadvise(fd, start, n, os.POSIX_FADV_DONTNEED)   # cold, as a streamed weight is
        buf = mmap.mmap(-1, request)   # page aligned, as O_DIRECT wants
        t0 = time.perf_counter()
        for off in range(start, start + n, request):
            os.preadv(fd, [buf], off)
        secs = time.perf_counter() - t0
        if not direct:
            os.posix_fadvise(fd, start, n, os.POSIX_FADV_DONTNEED)
        return n / secs
    except OSError:
        return None
    finally:
        os.close(fd)


def plan(package, memory_budget=None, weight_policy: str | None = None, storage: str | None = None,
         direct_io: bool = False, measure: bool = True) -> dict:
    """Runtime.plan plus: layers fully resident / streamed, the storage bandwidth used for the prediction (the
    profile's, or measured on this disk for "native") and the storage-bound decode tok/s."""
    pkg = Path(package)
    p = Runtime.plan(pkg, memory_budget=memory_budget, weight_policy=weight_policy, storage=storage,
                     direct_io=direct_io)
    tensors = read_manifest(pkg).get("tensors", [])
    pinned = p.pop("pinned")
    layers: dict[int, list[bool]] = {}
    other_streamed = []
    if len(tensors) == len(pinned):
        for t, held in zip(tensors, pinned):
            m = LAYER.search(t["name"])
            if m:
                layers.setdefault(int(m.group(1)), []).append(held)
            elif not held:
                other_streamed.append(t["name"])
    p["layers_resident"] = sorted(k for k, v in layers.items() if all(v))
    p["layers_streamed"] = sorted(k for k, v in layers.items() if not all(v))
    p["other_streamed"] = other_streamed
    bw, measured = p["storage_bytes_per_s"], False
    if not bw and p["streamed_bytes"] and measure:
        bw, measured = measure_read_bandwidth(pkg / "weights.bin", direct=bool(p["direct_io"])) or 0.0, True
    p["bandwidth_bytes_per_s"], p["bandwidth_measured"] = bw, measured
    io_s = (p["streamed_bytes"] / bw if bw else 0.0) + p["requests_per_token"] * p["storage_latency_s"] / 2
    p["storage_bound_tok_s"] = 1.0 / io_s if p["streamed_bytes"] and io_s > 0 else None
    return p


def _ranges(xs: list[int]) -> str:
    out, i = [], 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(f"{xs[i]}" if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ", ".join(out) or "none"


def _format_experts(p: dict, lines: list[str]) -> str:
    """The expert cache's layout (policy "experts")."""
    mb = lambda b: f"{b / 1e6:.1f} MB"   # noqa: E731
    share = p["routed_cache_bytes"] / p["routed_bytes"] if p["routed_bytes"] else 1.0
    cache = f" + {mb(p['cache_bytes'])} of page cache (two expert reads, embedding rows)" if p["cache_bytes"] else ""
    lines += [f"  held: {mb(p['pinned_bytes'])} of weights that are not experts ({p['pinned_weights']} tensors){cache}",
              f"  experts: {mb(p['routed_bytes'])} on storage, a {mb(p['routed_cache_bytes'])} cache ({100 * share:.0f}%"
              f" of them) read whole when selected or guessed; "
              f"{mb(p['pinned_bytes'] + p['routed_cache_bytes'] + p['cache_bytes'] + p['context_bytes'])} with a "
              f"context",
              f"storage: {p['storage']} — {p['storage_what']}"]
    if p["mapped_bytes"]:
        lines.insert(-1, f"  read by row from the file: {mb(p['mapped_bytes'])} of embedding tables (a page per token)")
    return "\n".join(lines)


def format_plan(p: dict) -> str:
    mb = lambda b: f"{b / 1e6:.1f} MB"   # noqa: E731
    held = p["pinned_bytes"] + p["window_bytes"] + p["routed_cache_bytes"]
    routed = ([f"  FFN neuron bundles (--layout bundled): {mb(p['routed_bytes'])}, each read when a token first runs "
               f"its group; {mb(p['routed_cache_bytes'])} of them cached (the most used groups stay)"]
              if p["routed_bytes"] else [])
    lines = [
        f"weights {mb(p['weights_bytes'])}; one context's KV cache + activations {mb(p['context_bytes'])}",
        f"memory budget: {mb(p['budget']) if p['budget'] else 'none'} (minimum for this package: "
        f"{mb(p['minimum_budget'])})",
        f"policy: {p['policy']}",
    ]
    if p["policy"] == "experts":
        return _format_experts(p, lines)
    if not p["streamed_bytes"] and p["routed_cache_bytes"] >= p["routed_bytes"]:
        lines.append(f"  all weights resident: {mb(held)} + {mb(p['context_bytes'])} for a context")
        return "\n".join(lines)
    cache = (f" + {mb(p['cache_bytes'])} of page cache (read-ahead, embedding rows)" if p["cache_bytes"] else "")
    lines += [
        f"  resident: {mb(p['pinned_bytes'])} ({p['pinned_weights']} tensors) + a {mb(p['window_bytes'])} window "
        f"= {mb(held)} of weights{cache}; {mb(held + p['cache_bytes'] + p['context_bytes'])} with a context",
        f"  streamed every token: {mb(p['streamed_bytes'])} ({p['streamed_weights']} tensors, "
        f"{p['requests_per_token']} reads of up to 1 MiB)",
        f"  layers fully resident: {_ranges(p['layers_resident'])}; streamed (in part or whole): "
        f"{_ranges(p['layers_streamed'])}" + (f"; also streamed: {', '.join(p['other_streamed'])}"
                                             if p["other_streamed"] else ""),
        *routed,
        f"storage: {p['storage']} — {p['storage_what']}",
    ]
    if p["mapped_bytes"]:
        lines.insert(-1, f"  read by row from the file: {mb(p['mapped_bytes'])} of embedding tables (a page per token)")
    bw = p["bandwidth_bytes_per_s"]
    if p["storage_bound_tok_s"]:
        how = (f"measured here, {'O_DIRECT' if p['direct_io'] else 'buffered'} reads" if p["bandwidth_measured"]
               else "the profile's")
        lines.append(f"predicted decode: at most {p['storage_bound_tok_s']:.2f} tok/s, storage-bound "
                     f"({mb(p['streamed_bytes'])} per token at {bw / 1e9:.2f} GB/s, {how}"
                     f"{'; modelled storage' if p['storage_modelled'] else ''}); compute on this CPU overlaps it"
                     + ("; plus the bundles of the neuron groups a token runs and the cache lacks" if routed else ""))
    else:
        lines.append("predicted decode: unknown (this disk's read speed could not be measured)")
    return "\n".join(lines)
