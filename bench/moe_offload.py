"""MoE expert offload: the "experts" weight store at expert budgets of 100/50/25%, with and without the compiled
next-layer guesses, per eviction policy and storage profile, each run a fresh edgellm-run in a cgroup-v1 memory
group limited to its budget (+ --overhead-mib for the process itself), the weights file evicted from the page cache
first (cold file).

    python bench/moe_offload.py [--models demo-moe] [--quant q4g32] [--budgets 100,50,25] [--policies freq,lru,lfu]
                                [--storage native,ufs4] [--tokens 64] [--overhead-mib 16] [--json]

Per row: decode tok/s; of the experts decode selected, the share found cached, read ahead on a guess, and waited
for (stalls; "served without a stall" = 1 - stalls); the guesses' recall (guessed and selected / selected); MB read
from storage per decoded token; seconds decode waited for reads. Every run's greedy tokens must equal the in-RAM
run's (exit status 1 otherwise). Rows on ufs3/ufs4 are modelled (reads served from the page cache through the
profile's limiter; the file is read into the cache from outside the cgroup first); native rows read this disk.

Not here yet (issue 20): the Mixtral-shaped benchmark model of `vs_llamacpp.py --moe` and llama.cpp under the same
limit.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from memlimit import evict, run_limited, warm  # noqa: E402

MiB = 1 << 20
PROMPT = [1, 450, 496, 1735, 1701, 2991, 432, 975]
EXPERTS_LINE = re.compile(r"\[experts: (\d+) selected in decode: ([\d.]+)% cached, ([\d.]+)% read ahead on a guess, "
                          r"([\d.]+)% waited for \(([\d.]+) s\); guesses ([\d.]+)% recall, (\d+) reads, (\d+) unused; "
                          r"([\d.]+) MB read per decoded token\]")
SPEED_LINE = re.compile(r"decode ([\d.]+) tok/s")


def package(model: str, quant: str, work: Path) -> Path:
    import edgellm

    out = work / f"{model}-{quant}"
    if not (out / "manifest.json").is_file():
        edgellm.compile(model, quant=quant, out=out, max_context=512, progress=False)
    return out


def budget_for(pkg: Path, pct: int, storage: str) -> int:
    from edgellm.runtime.api import Runtime

    p = Runtime.plan(pkg, weight_policy="experts", storage=storage)
    return p["pinned_bytes"] + p["routed_bytes"] * pct // 100 + p["context_bytes"] + p["cache_bytes"]


def run(pkg: Path, args: list[str], limit: int, n: int, storage: str) -> dict:
    cmd = [str(pkg / "bin" / "edgellm-run"), str(pkg), "--ids", ",".join(map(str, PROMPT)), "-n", str(n),
           "--ignore-eos", "--print-ids", "--threads", "2", "--temperature", "0", *args]
    if storage in ("ufs3", "ufs4"):
        warm(pkg / "weights.bin")   # modelled: served from the page cache, read in from outside the group
    else:
        evict(pkg / "weights.bin")
    r = run_limited(cmd, limit, timeout=600, prefix="edgellm_moe_")
    if r["rc"] != 0:
        raise SystemExit(f"edgellm-run failed ({r['rc']}): {r['stderr'][-400:]}")
    out = {"tokens": [int(t) for t in r["stdout"].split()], "peak_mib": r["peak_mib"],
           "tok_s": float(SPEED_LINE.search(r["stderr"]).group(1))}
    m = EXPERTS_LINE.search(r["stderr"])
    if m:
        out.update(selected=int(m[1]), cached=float(m[2]), ahead=float(m[3]), stalls=float(m[4]), stall_s=float(m[5]),
                   recall=float(m[6]), guess_reads=int(m[7]), unused=int(m[8]), mb_per_token=float(m[9]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="demo-moe")
    ap.add_argument("--quant", default="q4g32")
    ap.add_argument("--budgets", default="100,50,25")
    ap.add_argument("--policies", default="freq,lru,lfu")
    ap.add_argument("--storage", default="native,ufs4")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--overhead-mib", type=int, default=16)
    ap.add_argument("--work", default=str(Path.home() / ".cache" / "edgellm" / "bench" / "moe_offload"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    rows, bad = [], 0
    for model in a.models.split(","):
        pkg = package(model, a.quant, work)
        ref = run(pkg, [], 1 << 34, a.tokens, "ufs4")   # in RAM: reference tokens and speed
        rows.append({"model": model, "storage": "-", "budget": "in RAM", "policy": "resident", "guesses": "-", **ref})
        for storage in a.storage.split(","):
            for pct in map(int, a.budgets.split(",")):
                budget = budget_for(pkg, pct, storage)
                for policy in a.policies.split(","):
                    for guesses in (False, True):
                        args = ["--weight-policy", "experts", "--memory-budget", str(budget), "--storage", storage,
                                "--expert-eviction", policy] + ([] if guesses else ["--no-expert-predict"])
                        r = run(pkg, args, budget + a.overhead_mib * MiB, a.tokens, storage)
                        ok = r["tokens"] == ref["tokens"]
                        bad += not ok
                        rows.append({"model": model, "storage": storage, "budget": f"{pct}%", "policy": policy,
                                     "guesses": "on" if guesses else "off", "same_tokens": ok,
                                     "budget_mib": budget / MiB, **r})
    if a.json:
        print(json.dumps(rows, indent=1))
        return 1 if bad else 0
    print("| model | storage | expert budget | eviction | guesses | decode tok/s | cached | read ahead | served "
          "without a stall | recall | MB read/token | stall s | peak MiB (limit) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["policy"] == "resident":
            print(f"| {r['model']} | - | in RAM | - | - | {r['tok_s']:.1f} | | | | | | | {r['peak_mib']:.0f} |")
            continue
        print(f"| {r['model']} | {r['storage']}{' (modelled)' if r['storage'] in ('ufs3', 'ufs4') else ''} | "
              f"{r['budget']} | {r['policy']} | {r['guesses']} | {r['tok_s']:.1f} | {r['cached']:.0f}% | "
              f"{r['ahead']:.0f}% | {100 - r['stalls']:.0f}% | {r['recall']:.0f}% | {r['mb_per_token']:.2f} | "
              f"{r['stall_s']:.3f} | {r['peak_mib']:.0f} ({r['budget_mib'] + a.overhead_mib:.0f}) |"
              + ("" if r["same_tokens"] else " **tokens differ**"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
