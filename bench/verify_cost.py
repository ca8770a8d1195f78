"""The cost curve of speculative decoding's verify pass: time(K tokens) / time(1 token) per scheme (issue 36).

    python bench/verify_cost.py [--model 1b|smollm2-135m] [--schemes q8 q4g32 t2 f16] [--widths 8 16] [--budget 0.35]
                                [--rounds 5] [--counts 2 3 5]

A pass that verifies K tokens pays off when it costs less than the plain decode steps its accepted tokens replace,
so this ratio is what speculation's speed rests on. Model: the 1B-shaped Llama of bench/vs_llamacpp.py (random
ternary-valued weights; only shapes matter here), or with --model a real GGUF (its own weights, --quant auto). Per
scheme and verify width K, a package compiled with that width (EDGELLM_VERIFY_TOKENS=K); per round and package,
decode steps and verify passes alternate at the same position (the context is rewound after each), in RAM and, with
--budget, under a memory budget of that fraction of the weights (window store: the pass reads the streamed layers
once for all K tokens). Rounds interleave the packages; the ratio is the median of per-round ratios (bandwidth on
shared hosts drifts within minutes). --counts also times passes of fewer tokens (m) on each K-wide program: its GEMMs
compute a pass's real rows only (PROGRAM_ROWS), which is what lets auto size each pass to its drafts."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from vs_llamacpp import HEAD_QUANT, _cpu_name, log, make_model, source_stamp  # noqa: E402

CONTEXT = 96   # tokens in the context when the passes run
REPS = 6       # decode / verify alternations per round


def compile_package(work: Path, model: Path, scheme: str, width: int, tune: str) -> Path:
    head = HEAD_QUANT.get(scheme)
    out = work / "packages" / f"{model.name}-{scheme}-verify{width}-tune-{tune}.edgellm"
    stamp = source_stamp(256) + f"-verify{width}"
    if (out / "bench-stamp").is_file() and (out / "bench-stamp").read_text() == stamp:
        return out
    if out.exists():
        import shutil
        shutil.rmtree(out)
    log(f"edgellm compile {model.name} -q {scheme} (verify {width}) ...")
    cmd = [sys.executable, "-m", "edgellm.cli", "compile", str(model), "-q", scheme, "-o", str(out),
           "--max-context", "256", "--tune", tune, "--quiet"] + (["--head-quant", head] if head else [])
    subprocess.run(cmd, check=True, env={**os.environ, "EDGELLM_VERIFY_TOKENS": str(width)})
    (out / "bench-stamp").write_text(stamp)
    return out


def measure(pkg: Path, budget: float | None, threads: int, counts=()) -> dict:
    """Median seconds of a decode step and of a verify pass of each count (the full width and `counts`) at CONTEXT
    tokens, alternating."""
    import numpy as np

    from edgellm.runtime import Runtime

    from speculative import budget_bytes

    kw = {"memory_budget": budget_bytes(pkg, budget), "weight_policy": "window"} if budget else {}
    rt = Runtime.load(pkg, threads=threads, **kw)
    ctx = rt.context
    rng = np.random.default_rng(0)
    ids = rng.integers(3, rt.vocab, size=CONTEXT + rt.verify_width).tolist()
    ctx.logits(ids[:CONTEXT])
    ms = sorted({rt.verify_width, *(m for m in counts if m < rt.verify_width)})
    dec, ver = [], {m: [] for m in ms}
    for _ in range(REPS):
        t0 = time.perf_counter()
        ctx.decode_step(ids[CONTEXT])
        dec.append(time.perf_counter() - t0)
        ctx.rewind(CONTEXT)
        for m in ms:
            t0 = time.perf_counter()
            ctx.verify(ids[CONTEXT:CONTEXT + m])
            ver[m].append(time.perf_counter() - t0)
            ctx.rewind(CONTEXT)
    io = rt.stats().get("io_bytes_read", 0)
    rt.close()
    return {"decode_s": statistics.median(dec[1:]), "verify_s": {m: statistics.median(v[1:]) for m, v in ver.items()},
            "io_bytes": io}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="1b", help="1b (the 1B-shaped Llama) or a real GGUF of tests/real_checkpoints.py "
                    "(e.g. smollm2-135m: compiled with --quant auto; --schemes is then ignored)")
    ap.add_argument("--schemes", nargs="+", default=["q8", "q4g32", "t2", "f16"])
    ap.add_argument("--widths", nargs="+", type=int, default=[8, 16])
    ap.add_argument("--budget", type=float, default=None, help="also run under this fraction of the weights")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--counts", nargs="*", type=int, default=[], help="also passes of these many tokens (< K)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tune", default="off")
    ap.add_argument("--work", default=os.path.expanduser("~/.cache/edgellm/bench"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    work = Path(a.work)
    if a.model == "1b":
        model = make_model(work, "1b", 0, True)
    else:
        sys.path.insert(0, str(HERE.parent / "tests"))
        from real_checkpoints import gguf_file

        model, a.schemes = gguf_file(a.model), ["auto"]
    pkgs = {(s, w): compile_package(work, model, s, w, a.tune) for s in a.schemes for w in a.widths}
    settings = [None] + ([a.budget] if a.budget else [])
    rows: dict = {}
    for r in range(a.rounds):
        for key in pkgs:
            for b in settings:
                m = measure(pkgs[key], b, a.threads, a.counts)
                rows.setdefault((*key, b), []).append(m)
        log(f"round {r + 1}/{a.rounds} done")
    out = []
    for (s, w, b), ms in rows.items():
        for n in sorted(ms[0]["verify_s"]):
            ratios = [m["verify_s"][n] / m["decode_s"] for m in ms]
            out.append({"scheme": s, "K": w, "m": n, "budget": b,
                        "decode_ms": 1e3 * statistics.median(m["decode_s"] for m in ms),
                        "verify_ms": 1e3 * statistics.median(m["verify_s"][n] for m in ms),
                        "ratio": statistics.median(ratios), "lo": min(ratios), "hi": max(ratios)})
    if a.json:
        print(json.dumps({"cpu": _cpu_name(), "rows": out}, indent=1))
        return 0
    print(f"verify cost on {_cpu_name()}, {a.threads} threads, {'1B-shaped Llama' if a.model == '1b' else a.model}, "
          f"context {CONTEXT}, "
          f"median of {a.rounds} interleaved rounds")
    print("| scheme | memory | K (program) | m (pass) | decode step ms | verify pass ms | time(m) / time(1) |")
    print("|---|---|---|---|---|---|---|")
    for r in out:
        mem = "RAM" if not r["budget"] else f"{r['budget']:.0%} budget"
        print(f"| {r['scheme']} | {mem} | {r['K']} | {r['m']} | {r['decode_ms']:.1f} | {r['verify_ms']:.1f} | "
              f"{r['ratio']:.2f} ({r['lo']:.2f}-{r['hi']:.2f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
