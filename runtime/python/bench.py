"""`edgellm bench`: prefill and decode speed of a package, llama-bench style.

A seeded random prompt of valid ids (no end-of-sequence ids) is prefilled from an empty context, then `gen_len`
decode steps run greedily with ignore-eos semantics (every step decodes one token, whatever it is). One warm-up
repetition pages the weights in; the medians of `reps` timed repetitions are reported."""
from __future__ import annotations

import os
import platform
import resource
import statistics
import time

import numpy as np

from ...errors import InputError
from .api import Runtime
from ..contract import weights_read_per_token


def prompt_ids(vocab: int, n: int, exclude: set[int], seed: int = 0) -> np.ndarray:
    """n seeded random ids in [0, vocab) avoiding `exclude` (eos ids)."""
    ok = np.setdiff1d(np.arange(vocab), np.fromiter(exclude, dtype=np.int64, count=len(exclude)))
    if ok.size == 0:
        raise InputError("the package's vocabulary has only end-of-sequence tokens")
    return ok[np.random.default_rng(seed).integers(0, ok.size, n)].astype(np.int64)


def _one(rt: Runtime, ids: np.ndarray, gen_len: int) -> tuple[float, float, float, int]:
    """(prefill seconds, ttft seconds, decode seconds, tokens decoded) of one repetition from an empty context."""
    rt.reset()
    t0 = time.perf_counter()
    logits = rt.prefill(ids)
    t1 = time.perf_counter()
    tok = int(np.argmax(logits))
    ttft = time.perf_counter() - t0
    n = 0
    td = time.perf_counter()
    for _ in range(gen_len):
        tok = int(np.argmax(rt.decode_step(tok)))
        n += 1
    return t1 - t0, ttft, time.perf_counter() - td, n


def bench(package: str | os.PathLike, prompt_len: int = 128, gen_len: int = 64, threads: int | None = None,
          reps: int = 3, warmup: int = 1, seed: int = 0, **load) -> dict:
    """Median prefill/decode tokens per second, time to first token and peak RSS of one package; `load`: the
    Runtime.load options (runtime/python/options.py)."""
    if prompt_len < 1:
        raise InputError(f"--prompt-len {prompt_len} is invalid: must be >= 1")
    if gen_len < 1:
        raise InputError(f"--gen-len {gen_len} is invalid: must be >= 1")
    if reps < 1:
        raise InputError(f"--reps {reps} is invalid: must be >= 1")
    t0 = time.perf_counter()
    with Runtime.load(package, threads=threads, **load) as rt:
        load_s = time.perf_counter() - t0
        backend = rt.prefill_backend
        gpu = rt.device
        if prompt_len + gen_len > rt.max_context:
            raise InputError(f"--prompt-len {prompt_len} + --gen-len {gen_len} exceeds the package's context "
                             f"{rt.max_context}: shorten them or recompile with a larger --max-context")
        ids = prompt_ids(rt.vocab, prompt_len, rt.eos_ids, seed)
        for _ in range(warmup):
            _one(rt, ids, gen_len)
        runs = [_one(rt, ids, gen_len) for _ in range(reps)]
        n_threads = rt.threads
        stats = rt.stats()
        huge = stats["weight_bytes_huge"]
        mem = rt.memory()
        m = rt.manifest
    pf = [prompt_len / r[0] for r in runs]
    dc = [r[3] / r[2] for r in runs]
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {
        "package": str(package), "quant": m["quant"]["scheme"], "threads": n_threads, "prefill_backend": backend,
        "device": gpu,
        "npu_emulated": backend == "npu" and platform.machine() != "aarch64",
        "prompt_len": prompt_len, "gen_len": gen_len, "reps": reps, "warmup": warmup,
        "prefill_tok_s": statistics.median(pf), "decode_tok_s": statistics.median(dc),
        "ttft_s": statistics.median(r[1] for r in runs), "peak_rss_mb": peak_kb / 1024, "load_s": load_s,
        "decode_tokens": runs[0][3], "prefill_tok_s_all": pf, "decode_tok_s_all": dc,
        "weights_bytes": m["weights_bytes"], "weights_read_per_token":
            stats["decode_weight_bytes_read"] / stats["decode_tokens"] if stats["decode_tokens"] else
            weights_read_per_token(m),
        "weights_huge_pages_bytes": huge, "weight_policy": mem["policy"], "memory_budget": mem["budget"],
        "streamed_bytes_per_token": mem["streamed_bytes"], "storage": mem["storage"],
        "storage_modelled": bool(mem["storage_modelled"]), "io_bytes_read": stats["io_bytes_read"],
        "io_stall_s": stats["io_stall_seconds"],
        "routed_run_fraction": stats["routed_selected"] / stats["routed_possible"] if stats["routed_possible"] else None,
        **_expert_counters(stats),
    }


def _expert_counters(st: dict) -> dict:
    """The expert cache over every decode run (policy "experts"): shares of the selections, the guesses' recall,
    storage bytes per decoded token and wait time; {} where no expert was selected through it."""
    sel = st["expert_selected"]
    if not sel:
        return {}
    return {"expert_cached": st["expert_cached"] / sel, "expert_read_ahead": st["expert_prefetched"] / sel,
            "expert_no_stall": 1 - st["expert_stalls"] / sel,
            "expert_recall": st["expert_predicted"] / st["expert_predict_checked"] if st["expert_predict_checked"]
            else None,
            "decode_io_bytes_per_token": st["decode_io_bytes_read"] / max(1, st["decode_tokens"]),
            "decode_io_stall_s": st["decode_io_stall_seconds"]}


def format_bench(r: dict) -> str:
    npu = ""
    if r.get("prefill_backend") == "npu":   # on x86 the QNN HTP backend is Qualcomm's simulator
        npu = " on the NPU" + (" EMULATOR: not a speed number" if r.get("npu_emulated") else "")
    where = f"on {r['device']}" if r.get("device") else f"{r['threads']} threads"
    return (f"{r['package']} ({r['quant']}, {where}, median of {r['reps']}): "
            f"prefill {r['prefill_tok_s']:.1f} tok/s ({r['prompt_len']} tokens{npu}), "
            f"decode {r['decode_tok_s']:.1f} tok/s ({r['decode_tokens']} tokens), ttft {r['ttft_s'] * 1e3:.1f} ms, "
            f"peak RSS {r['peak_rss_mb']:.0f} MB, load {r['load_s']:.2f} s"
            f"{' (weights in huge pages)' if r['weights_huge_pages_bytes'] else ''}"
            + (f"; {r['streamed_bytes_per_token'] / 1e6:.1f} MB of weights streamed per token from {r['storage']}"
               f"{' (modelled)' if r['storage_modelled'] else ''}, {r['io_stall_s']:.2f} s waiting for reads"
               if r.get("streamed_bytes_per_token") else "")
            + (f"; experts: {100 * r['expert_cached']:.0f}% cached, {100 * r['expert_read_ahead']:.0f}% read ahead "
               f"on a guess, {100 * r['expert_no_stall']:.0f}% served without a stall"
               + (f", guesses {100 * r['expert_recall']:.0f}% recall" if r["expert_recall"] is not None else "")
               + f", {r['decode_io_bytes_per_token'] / 1e6:.2f} MB read per decoded token, "
               f"{r['decode_io_stall_s']:.2f} s waiting" if "expert_cached" in r else
               (f"; {100 * r['routed_run_fraction']:.0f}% of FFN neuron groups run" if r.get("routed_run_fraction")
                is not None else "")))
