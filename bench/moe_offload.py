"""MoE expert offload: the "experts" weight store at expert budgets of 100/50/25%, without and with the compiled
next-layer guesses, per eviction policy and storage profile, against llama.cpp under the same memory limit.

    python bench/moe_offload.py [--models demo-moe,mixtral] [--budgets 100,50,25] [--policies freq,lru,lfu]
                                [--storage native,ufs4] [--tokens 32] [--overhead-mib 16] [--no-llama] [--json]

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

Columns: decode tok/s; of the experts decode selected, the share found cached, read ahead because a guess named it,
and served without a stall (the first kernel using it did not wait); the guesses' recall; MB read from storage per
decoded token; seconds decode waited for reads; peak memory of the group against its limit. Every edgellm run's
greedy tokens must equal the in-RAM run's (exit status 1 otherwise)."""
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
    from edgellm.runtime.api import Runtime

    p = Runtime.plan(pkg, weight_policy="experts", storage=storage)
    return p["pinned_bytes"] + p["routed_bytes"] * pct // 100 + p["context_bytes"] + p["cache_bytes"]


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
        out.update(cached=float(m[2]), ahead=float(m[3]), stalls=float(m[4]), stall_s=float(m[5]),
                   recall=float(m[6]), mb_per_token=float(m[9]))
    return out


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
    ap.add_argument("--tokens", type=int, default=32)
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
        ref = run_edgellm(pkg, [], None, a.tokens, "ufs4")
        rows.append({"model": model, "kind": "in RAM", **ref})
        llama = gguf_q4(work, a.jobs) if model == "mixtral" and not a.no_llama else None
        for pct in map(int, a.budgets.split(",")):
            for storage in a.storage.split(","):
                budget = budget_for(pkg, pct, storage)
                for policy in a.policies.split(","):
                    for guesses in (False, True):
                        args = ["--weight-policy", "experts", "--memory-budget", str(budget), "--storage", storage,
                                "--expert-eviction", policy] + (["--expert-predict"] if guesses else [])
                        log(f"{model} {pct}% {storage} {policy} guesses {'on' if guesses else 'off'} ...")
                        r = run_edgellm(pkg, args, budget + a.overhead_mib * MiB, a.tokens, storage)
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
                             **run_llama(llama[0], llama[1], budget + a.overhead_mib * MiB, a.tokens)})
    if a.json:
        print(json.dumps(rows, indent=1))
    else:
        print(table(rows))
    return 1 if bad else 0


def table(rows: list[dict]) -> str:
    out = ["| model | expert budget | storage | eviction | guesses | decode tok/s | x no guesses | x llama.cpp | "
           "cached | read ahead | without a stall | recall | MB read/token | stall s | peak MiB (limit) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    llama = {(r["model"], r["pct"]): r.get("tok_s") for r in rows if r["kind"] == "llama.cpp"}
    base = {(r["model"], r["pct"], r["storage"], r["policy"]): r["tok_s"] for r in rows
            if r["kind"] == "experts" and not r["guesses"]}
    for r in rows:
        if r["kind"] == "in RAM":
            out.append(f"| {r['model']} | in RAM | | | | {r['tok_s']:.1f} | | | | | | | | | {r['peak_mib']:.0f} |")
            continue
        if r["kind"] == "llama.cpp":
            speed = f"{r['tok_s']:.2f}" if "tok_s" in r else r["error"]
            out.append(f"| {r['model']} | {r['pct']}% | native | llama.cpp (mmap, --repack 0) | | {speed} | | | | | | "
                       f"| | | {r['peak_mib']:.0f} ({r['limit_mib']:.0f}) |")
            continue
        b = base.get((r["model"], r["pct"], r["storage"], r["policy"]))
        lc = llama.get((r["model"], r["pct"])) if r["storage"] == "native" else None
        vs_llama = f"{r['tok_s'] / lc:.1f}" if lc else ""
        recall = f"{r['recall']:.0f}%" if r["guesses"] else ""
        modelled = " (modelled)" if r["storage"] in ("ufs3", "ufs4") else ""
        out.append(
            f"| {r['model']} | {r['pct']}% | {r['storage']}{modelled} | {r['policy']} | "
            f"{'on' if r['guesses'] else 'off'} | {r['tok_s']:.2f} | {r['tok_s'] / b:.2f} | {vs_llama} | "
            f"{r['cached']:.0f}% | {r['ahead']:.0f}% | {100 - r['stalls']:.0f}% | {recall} | "
            f"{r['mb_per_token']:.2f} | {r['stall_s']:.2f} | {r['peak_mib']:.0f} ({r['limit_mib']:.0f}) |"
            + ("" if r["same_tokens"] else " **tokens differ**"))
    out.append(f"\nGoals: {GOALS}.")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
