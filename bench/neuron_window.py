"""The neuron window (`edgellm compile --layout bundled`): what a threshold costs in perplexity and saves in FFN bytes,
and decode under a memory budget against the layer window, in one run.

    python bench/neuron_window.py [--models demo,1b] [--scheme q4g32] [--thresholds 0,0.25,0.5,0.75,1,1.5]
                                  [--tokens 1024] [--tokens-1b 256] [--budgets 50,25] [--decode-tokens 12] [--json]

1. Threshold table, per model (demo-llama, and the TinyLlama-shaped 1B benchmark model of bench/offload.py, with
   synthetic weights): the bundled package (compiled here, cached) scores models/demo/heldout.txt (the 1B model has
   no tokenizer: the same ids) token by token through decode, the program the threshold applies to, in windows of
   256 tokens. Per threshold: perplexity and its change against threshold 0 (exact), how often the greedy token
   is the exact run's, the share of neuron groups run, the FFN bytes a token needs (the gate in full + the
   bundles of the groups it runs) against the dense FFN's, and the bytes a decode token reads from storage (all
   weights: 64 teacher-forced tokens) at the package's minimum budget, where it streams the most. For the 1B model
   the perplexity is of synthetic weights: only the change and the agreement mean anything.
2. Decode under a budget (1B): Runtime.load(memory_budget = pct x weights + context + page cache, as
   bench/offload.py), the weights file evicted from the page cache before each load; the layer window on the dense
   package (bench/vs_llamacpp.py's) against the neuron window at threshold 0 and at the default; per row decode
   tok/s, MB read from storage per decode token, time waiting for reads, and the I/O bound (MB per token over the
   disk's cold sequential bandwidth, bench/diskbw.c, measured in the same run).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import offload as ob  # noqa: E402
import vs_llamacpp as vs  # noqa: E402
from memlimit import evict  # noqa: E402

ROOT = HERE.parent
WINDOW = 256
log = vs.log


def compile_bundled(work: Path, model: Path | str, name: str, scheme: str, max_context: int,
                    recompile: bool) -> Path:
    """The bundled package, compiled when missing (or with --recompile); one built from older sources is reused with
    a note, as bench/offload.py does (the runtime runs from the current sources either way)."""
    out = work / "packages" / f"{name}-{scheme}-bundled.edgellm"
    stamp = vs.source_stamp(max_context)
    if (out / "manifest.json").is_file() and not recompile:
        if not (out / "bench-stamp").is_file() or (out / "bench-stamp").read_text() != stamp:
            log(f"{out.name}: built from older sources (reused; --recompile rebuilds it)")
        return out
    import shutil
    import subprocess

    shutil.rmtree(out, ignore_errors=True)
    log(f"edgellm compile {name} -q {scheme} --layout bundled ...")
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "edgellm.cli", "compile", str(model), "-q", scheme, "--layout", "bundled", "-o",
           str(out), "--max-context", str(max_context), "--tune", "off", "--quiet"]
    head = vs.HEAD_QUANT.get(scheme)
    if head and name != "demo-llama":
        cmd += ["--head-quant", head]
    subprocess.run(cmd, check=True)
    (out / "bench-stamp").write_text(stamp)
    log(f"  {time.perf_counter() - t0:.0f} s")
    return out


def ffn_bytes(manifest: dict) -> tuple[int, int]:
    """(gate bytes, bundle bytes) of all FFNs."""
    gate = sum(t["nbytes"] for t in manifest["tensors"] if ".mlp.gate_proj." in t["name"])
    bundles = sum(t["nbytes"] for t in manifest["tensors"] if ".mlp.bundle." in t["name"])
    return gate, bundles


def score(rt, ids: list[int]) -> dict:
    """Decode-mode scoring: nll of each next token, greedy argmaxes, groups run."""
    nll, n, top, sel, poss = 0.0, 0, [], 0, 0
    for b in range(0, len(ids) - 1, WINDOW):
        w = ids[b:b + WINDOW + 1]
        with rt.new_context() as ctx:
            for i in range(len(w) - 1):
                lg = ctx.decode_step(w[i]).astype(np.float64)
                m = lg.max()
                nll += m + np.log(np.exp(lg - m).sum()) - lg[w[i + 1]]
                n += 1
                top.append(int(lg.argmax()))
            st = ctx.stats()
            sel, poss = sel + st["routed_selected"], poss + st["routed_possible"]
    return {"nll": nll / n, "ppl": float(np.exp(nll / n)), "tokens": n, "top": top, "run": sel / poss}


def reads_at_minimum(pkg: Path, ids: list[int], t: float, n: int = 64) -> float:
    """MB read from storage per decode token at the package's minimum budget (the most it streams), teacher-forced
    over ids[:n]."""
    from edgellm.runtime.python.api import Runtime

    b = Runtime.plan(pkg, memory_budget=1 << 40, weight_policy="window")["minimum_budget"]
    with Runtime.load(pkg, memory_budget=b, weight_policy="window", threads=2, ffn_threshold=t) as rt:
        rt.prefill(ids[:1])
        before = rt.stats()["io_bytes_read"]
        for x in ids[1:n + 1]:
            rt.decode_step(x)
        return (rt.stats()["io_bytes_read"] - before) / n / 1e6


def threshold_table(pkg: Path, ids: list[int], thresholds: list[float]) -> list[dict]:
    from edgellm.runtime.python.api import Runtime

    m = json.loads((pkg / "manifest.json").read_text())
    gate, bundles = ffn_bytes(m)
    rows, exact = [], None
    for t in thresholds:
        with Runtime.load(pkg, threads=2, ffn_threshold=t) as rt:
            r = score(rt, ids)
        exact = exact or r
        read = reads_at_minimum(pkg, ids, t)
        rows.append({"threshold": t, "ppl": r["ppl"], "ppl_change": r["ppl"] / exact["ppl"] - 1,
                     "agree": float(np.mean(np.array(r["top"]) == np.array(exact["top"]))), "run": r["run"],
                     "ffn_mb": (gate + r["run"] * bundles) / 1e6, "dense_ffn_mb": (gate + bundles) / 1e6,
                     "tokens": r["tokens"], "read_mb_min_budget": read})
        log(f"  threshold {t}: ppl {r['ppl']:.3f}, {100 * r['run']:.0f}% of groups")
    return rows


def budget_runs(pkgs: dict, budgets: list[int], tokens: int, thresholds: list[float]) -> list[dict]:
    from edgellm.runtime.python.api import Runtime

    rows = []
    for pct in budgets:
        for label, pkg, thr in [("layer window (dense)", pkgs["dense"], None)] + \
                [(f"neuron window, threshold {t:g}", pkgs["bundled"], t) for t in thresholds]:
            p = Runtime.plan(pkg, memory_budget=1 << 40, weight_policy="window")
            budget = p["weights_bytes"] * pct // 100 + p["context_bytes"] + p["cache_bytes"]
            gbs = ob.disk_gbs(pkg / "weights.bin")
            evict(pkg / "weights.bin")
            kw = {} if thr is None else {"ffn_threshold": thr}
            with Runtime.load(pkg, memory_budget=budget, weight_policy="window", threads=2, **kw) as rt:
                rt.prefill(ob.PROMPT)
                before = rt.stats()
                tok, t0 = 3, time.perf_counter()
                for _ in range(tokens):
                    tok = int(np.argmax(rt.decode_step(tok)))
                dt = time.perf_counter() - t0
                after = rt.stats()
            mb = (after["io_bytes_read"] - before["io_bytes_read"]) / tokens / 1e6
            run = (after["routed_selected"] - before["routed_selected"]) / max(
                1, after["routed_possible"] - before["routed_possible"])
            rows.append({"budget": pct, "row": label, "tok_s": tokens / dt, "mb_per_token": mb,
                         "stall_s": (after["io_stall_seconds"] - before["io_stall_seconds"]) / tokens,
                         "bound_tok_s": gbs * 1e3 / mb if mb else None, "disk_gbs": gbs,
                         "run": run if after["routed_possible"] else None})
            r = rows[-1]
            log(f"  {pct}% {label}: {r['tok_s']:.2f} tok/s, {mb:.1f} MB/token")
    return rows


def fmt_threshold(name: str, rows: list[dict]) -> str:
    out = [f"{name}: decode-mode perplexity over {rows[0]['tokens']} tokens of heldout.txt",
           "| threshold | groups run | FFN MB a token needs (dense) | MB read / token at the minimum budget | "
           "perplexity | change | greedy = exact |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['threshold']:g} | {100 * r['run']:.0f}% | {r['ffn_mb']:.2f} ({r['dense_ffn_mb']:.2f}) | "
                   f"{r['read_mb_min_budget']:.2f} | {r['ppl']:.3f} | {100 * r['ppl_change']:+.2f}% | "
                   f"{100 * r['agree']:.1f}% |")
    return "\n".join(out)


def fmt_budget(rows: list[dict]) -> str:
    out = ["| budget | store | decode tok/s | MB read / token | groups run | stall s / token | I/O bound tok/s | "
           "% of bound |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b = r["bound_tok_s"]
        run = "" if r["run"] is None else f"{100 * r['run']:.0f}%"
        bound, pct = ("", "") if b is None else (f"{b:.2f}", f"{100 * r['tok_s'] / b:.0f}%")
        out.append(f"| {r['budget']}% | {r['row']} | {r['tok_s']:.2f} | {r['mb_per_token']:.1f} | {run} | "
                   f"{r['stall_s']:.3f} | {bound} | {pct} |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="demo,1b")
    ap.add_argument("--scheme", default="q4g32")
    ap.add_argument("--thresholds", default="0,0.25,0.5,0.75,1,1.5")
    ap.add_argument("--tokens", type=int, default=1024, help="tokens scored on demo-llama")
    ap.add_argument("--tokens-1b", type=int, default=256, help="tokens scored on the 1B model")
    ap.add_argument("--budgets", default="50,25")
    ap.add_argument("--decode-tokens", type=int, default=12)
    ap.add_argument("--budget-thresholds", default=None,
                    help="thresholds of the budget rows (default: 0 and the package's default)")
    ap.add_argument("--recompile", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    work = Path.home() / ".cache" / "edgellm" / "bench"
    (work / "packages").mkdir(parents=True, exist_ok=True)
    ob.DISKBW = ob.build_diskbw(work)
    thresholds = [float(x) for x in a.thresholds.split(",")]
    from tokenizers import Tokenizer

    text = (ROOT / "models" / "demo" / "heldout.txt").read_text()
    ids = Tokenizer.from_file(str(ROOT / "models" / "demo" / "demo-llama" / "tokenizer.json")).encode(text).ids
    result = {"cpu": vs._cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M"), "tables": {}}
    models = a.models.split(",")
    if "demo" in models:
        pkg = compile_bundled(work, ROOT / "models" / "demo" / "demo-llama", "demo-llama", a.scheme, 1024, a.recompile)
        log("demo-llama: threshold table")
        result["tables"]["demo-llama"] = threshold_table(pkg, ids[:a.tokens + 1], thresholds)
    if "1b" in models:
        model = vs.make_model(work, "1b", 0, True)
        bundled = compile_bundled(work, model, model.name, a.scheme, 256, a.recompile)
        log("1B: threshold table")
        result["tables"]["1b"] = threshold_table(bundled, ids[:a.tokens_1b + 1], thresholds)
        dense, _ = ob.find_package(work, argparse.Namespace(size="1b", seed=0, ternary=True, tune="quick",
                                                             recompile=False), a.scheme)
        default = json.loads((bundled / "manifest.json").read_text())["ffn"]["default_threshold"]
        bts = [float(x) for x in a.budget_thresholds.split(",")] if a.budget_thresholds else [0.0, default]
        log("1B: decode under a budget")
        result["budget"] = budget_runs({"dense": dense, "bundled": bundled}, [int(x) for x in a.budgets.split(",")],
                                       a.decode_tokens, bts)
    out = work / f"neurons-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=1))
    if a.json:
        print(json.dumps(result))
        return
    print(f"\n{result['cpu']}, {result['date']} ({out})")
    for name, rows in result["tables"].items():
        print("\n" + fmt_threshold(name, rows))
    if "budget" in result:
        print(f"\n1B {a.scheme} under a memory budget (disk {result['budget'][0]['disk_gbs']:.2f} GB/s cold, "
              "measured per row)\n" + fmt_budget(result["budget"]))


if __name__ == "__main__":
    main()
