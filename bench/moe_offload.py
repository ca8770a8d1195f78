"""MoE expert offload: the "experts" weight store at expert budgets of 100/50/25%, without and with the compiled
next-layer guesses, per eviction policy and storage profile, against llama.cpp under the same memory limit.

    python bench/moe_offload.py [--models demo-moe,mixtral] [--budgets 100,50,25] [--policies freq,lru,lfu]
                                [--storage native,ufs4] [--tokens N] [--overhead-mib 16] [--no-llama] [--json]

Models: demo-moe (the bundled trained Mixtral: real routing, 4 layers, 8 experts top-2, q4g32) and mixtral, the
random-weight Mixtral-shaped benchmark model of `vs_llamacpp.py --moe` (16 layers, dim 1024, 8 experts of FFN 3584
top-2, 1517 M parameters, 460 M active; q4g32 with a q6 head; its GGUF quantized to Q4_0 for llama.cpp), for
bandwidth. Every run is a fresh process in a cgroup-v1 memory sub-group limited to the budget + --overhead-mib (the
process's own memory beyond what the budget counts), the weights file evicted from the page cache first (cold file):

  in RAM     edgellm-run, no budget, no limit, file warm: the reference tokens and speed;
  experts    edgellm-run --weight-policy experts --memory-budget B --storage S --expert-eviction P, with
             without --expert-predict (guesses off) and with it (guesses on). B = the weights that are not experts + pct %
             of the experts + one context + the page cache two expert reads may hold (Runtime.plan);
  llama.cpp  llama-bench -m Q4_0.gguf -p 0 -n N -t 2 -r 1 --repack 0 (every weight served from its file mapping:
             what llama.cpp does with a model bigger than RAM) under the same limit as the 25/50/100% rows.

Storage: native reads this machine's disk (measured); ufs3 / ufs4 are modelled (the file is read into the page
cache from outside the cgroup, and reads are served from it through the profile's bandwidth and latency limiter:
what the store would do on that flash, not this disk). llama.cpp rows always read this disk.

Tokens: 256 greedy tokens from an 8-id prompt for demo-moe (it decodes a token in ~0.05 ms: fewer would measure the
first tokens' cold misses and timer noise), 32 for the Mixtral (--tokens N: both).

Columns: decode tok/s; of the experts decode selected, the share found cached, read ahead because a guess named it,
and served without a stall (the first kernel using it did not wait); the guesses' recall, and of the reads guesses
issued, the share a selection then used; MB read from storage per decoded token; seconds decode waited for reads;
peak memory of the group against its limit. Every edgellm run's greedy tokens must equal the in-RAM run's (exit
status 1 otherwise).

Under the table, per model, the two numbers that bound what guesses can do: one layer's decode compute (the in-RAM
token time / layers: the time a guess made one layer ahead has to land) against the mean wait of a stalled expert
read per storage; and for demo-moe, the share of selections an oracle cache of the same slots would hold (Belady's
rule: evict what is selected furthest in the future, knowing every selection of the run, warm from the start): no
eviction policy can cache more, so what lies between it and a goal can only be served by reads that land before
their layer runs."""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import vs_llamacpp as vs  # noqa: E402
from memlimit import evict, run_limited, warm  # noqa: E402

MiB = 1 << 20
PROMPT = [1, 450, 496, 1735, 1701, 2991, 432, 975]
EXPERTS_RE = re.compile(r"\[experts: (\d+) selected in decode: ([\d.]+)% cached, ([\d.]+)% read ahead on a guess, "
                        r"([\d.]+)% waited for \(([\d.]+) s\); guesses ([\d.]+)% recall, (\d+) reads, (\d+) unused; "
                        r"([\d.]+) MB read per decoded token\]")
SPEED_RE = re.compile(r"decode ([\d.]+) tok/s")
GOALS = "recall >= 80% (demo-moe); without a stall >= 95% at 50%, >= 80% at 25%; guesses >= 1.5x none; >= 3x llama.cpp"


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def package(model: str, work: Path) -> Path:
    """The model's q4g32 package (compiled from the current sources unless one built from them is cached)."""
    import edgellm

    if model == "demo-moe":
        src, extra = "demo-moe", {}
    else:
        src, extra = str(vs.make_model(work.parent, "moe", 0, False)), {"head_quant": "q6"}
    out = work / f"{model}-q4g32"
    stamp = vs.source_stamp(512)
    if (out / "manifest.json").is_file() and (out / "bench-stamp").is_file() and \
            (out / "bench-stamp").read_text() == stamp:
        return out
    log(f"edgellm compile {src} -q q4g32 ...")
    t0 = time.perf_counter()
    edgellm.compile(src, quant="q4g32", out=out, max_context=512, progress=False, **extra)
    (out / "bench-stamp").write_text(stamp)
    log(f"  {time.perf_counter() - t0:.0f} s")
    return out


def gguf_q4(work: Path, jobs: int) -> tuple[Path, Path] | None:
    try:
        lbench, lquant = vs.build_llamacpp(work.parent, jobs)
    except Exception as e:   # noqa: BLE001 (no compiler, no network: the edgellm rows still run)
        log(f"llama.cpp: n/a ({e})")
        return None
    model = vs.make_model(work.parent, "moe", 0, False)
    f16 = vs.write_gguf(model, work.parent / "gguf" / f"{model.name}-F16.gguf")
    q4, why = vs.quantize_gguf(lquant, f16, "Q4_0", 2)
    return (lbench, q4) if q4 else None


def budget_for(pkg: Path, pct: int, storage: str) -> int:
    from edgellm.runtime.python.api import Runtime

    p = Runtime.plan(pkg, weight_policy="experts", storage=storage)
    return p["pinned_bytes"] + p["routed_bytes"] * pct // 100 + p["context_bytes"] + p["cache_bytes"]


def layers(pkg: Path) -> int:
    return json.loads((pkg / "manifest.json").read_text())["model"]["config"]["n_layers"]


def cache_slots(pkg: Path, budget: int, storage: str) -> int:
    """Expert slots the store makes of this budget (every demo-moe expert has one size)."""
    from edgellm.runtime.python.api import Runtime

    p = Runtime.plan(pkg, weight_policy="experts", storage=storage, memory_budget=budget)
    moe = json.loads((pkg / "manifest.json").read_text())["moe"]
    return p["routed_cache_bytes"] * moe["moe_layers"] * moe["experts"] // p["routed_bytes"]


def run_edgellm(pkg: Path, args: list[str], limit: int | None, n: int, storage: str) -> dict:
    cmd = [str(pkg / "bin" / "edgellm-run"), str(pkg), "--ids", ",".join(map(str, PROMPT)), "-n", str(n),
           "--ignore-eos", "--print-ids", "--threads", "2", "--temperature", "0", *args]
    if storage in ("ufs3", "ufs4") or limit is None:
        warm(pkg / "weights.bin")   # served from the page cache, read in from outside the group
    else:
        evict(pkg / "weights.bin")
    r = run_limited(cmd, limit or (1 << 40), timeout=900, prefix="edgellm_moe_")
    if r["rc"] != 0:
        raise SystemExit(f"edgellm-run failed ({r['rc']}): {r['stderr'][-400:]}")
    out = {"tokens": [int(t) for t in r["stdout"].split()], "peak_mib": r["peak_mib"],
           "tok_s": float(SPEED_RE.search(r["stderr"]).group(1))}
    m = EXPERTS_RE.search(r["stderr"])
    if m:
        selected = int(m[1])
        out.update(cached=float(m[2]), ahead=float(m[3]), stalls=float(m[4]), stall_s=float(m[5]),
                   recall=float(m[6]), guess_reads=int(m[7]), guess_unused=int(m[8]), mb_per_token=float(m[9]),
                   stalled=round(selected * float(m[4]) / 100))
    return out


def routing_trace(tokens: list[int]) -> list[tuple[int, int]]:
    """demo-moe's decode selections for these tokens, in the order the runtime makes them ((layer, expert), the
    numpy model's routing; a q4g32 package may differ on a rare near-tie, which does not move a share)."""
    import numpy as np

    from edgellm.models import load_checkpoint
    from edgellm.models.numpy_backend import NumpyModel

    spec, ck, _ = load_checkpoint("demo-moe")
    m = NumpyModel(spec, ck.get, np.float32)
    m.forward(PROMPT)
    out = []
    for t in tokens[:-1]:
        m.g.selections.clear()
        m.forward([t])
        out += [(layer, int(e)) for layer, sel in enumerate(m.g.selections) for e in sel[0]]
    return out


def oracle_hit_rate(trace: list[tuple[int, int]], slots: int) -> float:
    """Belady's bound for this store: the share of selections a cache of `slots` experts holds when it knows every
    future selection. It starts holding the first `slots` experts the trace selects; a miss is read into a slot (the
    kernel runs from one) taken from the expert selected furthest in the future."""
    nxt, seen = [0] * len(trace), {}
    for i in range(len(trace) - 1, -1, -1):
        nxt[i], seen[trace[i]] = seen.get(trace[i], 1 << 60), i
    cache: dict = {}   # expert -> its next selection
    for x in trace:   # the best warm start: the first experts selected
        if len(cache) < slots and x not in cache:
            cache[x] = None
    hits = 0
    for i, x in enumerate(trace):
        if x in cache:
            hits += 1
        elif len(cache) >= slots:
            del cache[max(cache, key=cache.get)]
        cache[x] = nxt[i]
    return hits / len(trace) if trace else 0.0


def run_llama(lbench: Path, gguf: Path, limit: int, n: int) -> dict:
    evict(gguf)
    cmd = [str(lbench), "-m", str(gguf), "-p", "0", "-n", str(n), "-t", "2", "-r", "1", "-o", "json", "--repack", "0"]
    r = run_limited(cmd, limit, timeout=1800, prefix="edgellm_moe_")
    if r["rc"] != 0:
        return {"error": f"rc {r['rc']}{' (OOM-killed)' if r['oom_kill'] else ''}", "peak_mib": r["peak_mib"]}
    tests = [t for t in json.loads(r["stdout"]) if t["n_gen"] > 0 and t["n_prompt"] == 0]
    return {"tok_s": float(tests[0]["avg_ts"]), "peak_mib": r["peak_mib"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="demo-moe,mixtral")
    ap.add_argument("--budgets", default="100,50,25")
    ap.add_argument("--policies", default="freq,lru,lfu")
    ap.add_argument("--storage", default="native,ufs4")
    ap.add_argument("--tokens", type=int, default=None, help="greedy tokens (default: demo-moe 256, mixtral 32)")
    ap.add_argument("--overhead-mib", type=int, default=16)
    ap.add_argument("--no-llama", action="store_true", help="skip the llama.cpp rows")
    ap.add_argument("--jobs", type=int, default=2, help="build jobs for llama.cpp (first run only)")
    ap.add_argument("--work", default=str(Path.home() / ".cache" / "edgellm" / "bench" / "moe_offload"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    rows, bad = [], 0
    for model in a.models.split(","):
        if model not in ("demo-moe", "mixtral"):
            ap.error(f"--models: demo-moe or mixtral, not {model}")
        pkg = package(model, work)
        n_tok = a.tokens or (256 if model == "demo-moe" else 32)
        ref = run_edgellm(pkg, [], None, n_tok, "ufs4")
        rows.append({"model": model, "kind": "in RAM", "layers": layers(pkg), **ref})
        trace = routing_trace(ref["tokens"]) if model == "demo-moe" else None
        llama = gguf_q4(work, a.jobs) if model == "mixtral" and not a.no_llama else None
        for pct in map(int, a.budgets.split(",")):
            for storage in a.storage.split(","):
                budget = budget_for(pkg, pct, storage)
                if trace is not None and storage == a.storage.split(",")[0]:
                    rows.append({"model": model, "kind": "oracle", "pct": pct,
                                 "hit": oracle_hit_rate(trace, cache_slots(pkg, budget, storage))})
                for policy in a.policies.split(","):
                    for guesses in (False, True):
                        args = ["--weight-policy", "experts", "--memory-budget", str(budget), "--storage", storage,
                                "--expert-eviction", policy] + (["--expert-predict"] if guesses else [])
                        log(f"{model} {pct}% {storage} {policy} guesses {'on' if guesses else 'off'} ...")
                        r = run_edgellm(pkg, args, budget + a.overhead_mib * MiB, n_tok, storage)
                        ok = r["tokens"] == ref["tokens"]
                        bad += not ok
                        rows.append({"model": model, "kind": "experts", "storage": storage, "pct": pct,
                                     "policy": policy, "guesses": guesses, "same_tokens": ok,
                                     "limit_mib": budget / MiB + a.overhead_mib, **r})
            if llama:
                budget = budget_for(pkg, pct, "native")
                log(f"{model} {pct}% llama.cpp --repack 0 ...")
                rows.append({"model": model, "kind": "llama.cpp", "storage": "native", "pct": pct,
                             "limit_mib": budget / MiB + a.overhead_mib,
                             **run_llama(llama[0], llama[1], budget + a.overhead_mib * MiB, n_tok)})
    if a.json:
        print(json.dumps(rows, indent=1))
    else:
        print(table(rows))
    return 1 if bad else 0


def table(rows: list[dict]) -> str:
    out = ["| model | expert budget | storage | eviction | guesses | decode tok/s | x no guesses | x llama.cpp | "
           "cached | read ahead | without a stall | recall | guess reads used | MB read/token | stall s | "
           "peak MiB (limit) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    llama = {(r["model"], r["pct"]): r.get("tok_s") for r in rows if r["kind"] == "llama.cpp"}
    base = {(r["model"], r["pct"], r["storage"], r["policy"]): r["tok_s"] for r in rows
            if r["kind"] == "experts" and not r["guesses"]}
    for r in rows:
        if r["kind"] == "oracle":
            continue
        if r["kind"] == "in RAM":
            out.append(f"| {r['model']} | in RAM | | | | {r['tok_s']:.1f} | | | | | | | | | | {r['peak_mib']:.0f} |")
            continue
        if r["kind"] == "llama.cpp":
            speed = f"{r['tok_s']:.2f}" if "tok_s" in r else r["error"]
            out.append(f"| {r['model']} | {r['pct']}% | native | llama.cpp (mmap, --repack 0) | | {speed} | | | | | | "
                       f"| | | | {r['peak_mib']:.0f} ({r['limit_mib']:.0f}) |")
            continue
        b = base.get((r["model"], r["pct"], r["storage"], r["policy"]))
        lc = llama.get((r["model"], r["pct"])) if r["storage"] == "native" else None
        vs_llama = f"{r['tok_s'] / lc:.1f}" if lc else ""
        recall = f"{r['recall']:.0f}%" if r["guesses"] else ""
        used = f"{100 * (1 - r['guess_unused'] / r['guess_reads']):.0f}% of {r['guess_reads']}" \
            if r["guesses"] and r["guess_reads"] else ""
        modelled = " (modelled)" if r["storage"] in ("ufs3", "ufs4") else ""
        out.append(
            f"| {r['model']} | {r['pct']}% | {r['storage']}{modelled} | {r['policy']} | "
            f"{'on' if r['guesses'] else 'off'} | {r['tok_s']:.2f} | {r['tok_s'] / b:.2f} | {vs_llama} | "
            f"{r['cached']:.0f}% | {r['ahead']:.0f}% | {100 - r['stalls']:.0f}% | {recall} | {used} | "
            f"{r['mb_per_token']:.2f} | {r['stall_s']:.2f} | {r['peak_mib']:.0f} ({r['limit_mib']:.0f}) |"
            + ("" if r["same_tokens"] else " **tokens differ**"))
    out.append(f"\nGoals: {GOALS}.\n")
    out += bounds(rows)
    return "\n".join(out)


def bounds(rows: list[dict]) -> list[str]:
    """Per model: one layer's compute against a stalled read's mean wait; demo-moe's oracle cache."""
    out = []
    for ref in (r for r in rows if r["kind"] == "in RAM"):
        model = ref["model"]
        layer_us = 1e6 / ref["tok_s"] / ref["layers"]
        waits = []
        for storage in dict.fromkeys(r["storage"] for r in rows if r["kind"] == "experts" and r["model"] == model):
            rs = [r for r in rows if r["kind"] == "experts" and r["model"] == model and r["storage"] == storage]
            n = sum(r.get("stalled", 0) for r in rs)
            if n:
                waits.append(f"{storage} {1e6 * sum(r['stall_s'] for r in rs) / n:.0f} us")
        line = f"- {model}: one layer's decode compute {layer_us:.0f} us (in RAM); a stalled expert read waits " \
               f"{', '.join(waits) or 'n/a'} on average"
        oracle = [r for r in rows if r["kind"] == "oracle" and r["model"] == model]
        if oracle:
            line += "; an oracle cache of the same slots holds " + ", ".join(
                f"{100 * r['hit']:.0f}% at {r['pct']}%" for r in oracle) + " of the selections"
        out.append(line + ".")
    return out


if __name__ == "__main__":
    sys.exit(main())
