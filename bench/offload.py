"""Models bigger than their memory budget: the "window" weight store against the I/O bound, plain mmap and llama.cpp,
under a cgroup memory limit, in one interleaved run.

    python bench/offload.py [--size 1b] [--ternary] [--schemes q4g32,t2] [--budgets 100,75,50,25]
                            [--storage native,emmc,sd,ufs3,ufs4] [--profile-budgets 50,25] [--tokens 16]
                            [--slow-tokens 4] [--rounds 1] [--threads 2] [--overhead-mib 32] [--quick] [--json]

Per scheme (the benchmark packages of bench/vs_llamacpp.py: TinyLlama-shaped 1B, --head-quant q6; reused as they are
when present, compiled otherwise) and budget (a percentage of the weights: --memory-budget = pct x weights_bytes +
context_bytes + the page cache its buffered reads may hold (the device's read-ahead), all from Runtime.plan), each run
is a fresh process in a cgroup-v1 memory sub-group limited to the budget + --overhead-mib (the process's own memory
beyond what the budget counts), with the file evicted from the page cache first (`fincore` checks it):

  window     edgellm-run --memory-budget B --storage S: native (this disk; buffered reads with read-ahead, dropped
             from the page cache behind them; O_DIRECT with --direct-io) at every budget; the other
             profiles at --profile-budgets: sd / emmc are real reads throttled to the profile (measured), ufs3 / ufs4
             read the page cache through the limiter (modelled; the file is read into the cache from outside the
             cgroup first, so those pages are not charged to it);
  in-RAM     edgellm-run with no budget and a generous limit (warm file): the reference tokens and speed;
  plain mmap edgellm-run with no budget and --huge-pages off (weights served from a file mapping), same limit;
  no budget, as shipped
             edgellm-run with no budget, huge_pages auto (may copy the weights into anonymous memory), same limit;
  llama.cpp  llama-bench -m GGUF -p 0 -n N -t T -r 1 (Q4_0 for q4g32, TQ2_0 for t2), same limit: as shipped (mmap,
             but Q4_0 is repacked into anonymous memory on AVX2: run only where the limit holds the whole GGUF unless
             --llama-shipped-all) and with --repack 0 (every weight served from the mapping).

Native storage bandwidth is measured right before and after each native window row (sequential cold read of the
weights file, 1 MiB requests, 2 threads, the better of buffered with read-ahead and O_DIRECT); the I/O bound of a row
is that bandwidth (the profile's for sd / emmc / ufs) over the bytes it streams per token. Every edgellm run generates
greedily from the same 8-id prompt with --ignore-eos and its tokens must equal the in-RAM run's (exit status 1
otherwise).

edgellm-run is built from the current sources (compiler/device_binary.sources()) into the work dir: the package's
bin/edgellm-run as the next compile makes it ("plain mmap" is its --huge-pages off).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import vs_llamacpp as vs  # noqa: E402
from memlimit import cgroup_parent, evict, remove_stale_groups, run_limited, warm  # noqa: E402

MiB = 1 << 20
PROMPT = [1, 450, 4996, 17354, 1701, 29916, 432, 975]   # 8 ids (the packages have no tokenizer)
REAL, MODELLED = ("native", "sd", "emmc"), ("ufs3", "ufs4")
PROFILES = REAL + MODELLED
GOAL_BOUND, GOAL_LLAMA = 0.90, 2.0                      # at the GOAL_BUDGETS, printed next to the table
GOAL_BUDGETS = (50, 25)
CG_PREFIX = "edgellm_offload_"
log = vs.log

# ---- edgellm-run -----------------------------------------------------------------------------------------------
def build_runner(work: Path) -> Path:
    """edgellm-run from the current sources (cached by their contents)."""
    from edgellm.compiler.device_binary import sources

    root = HERE.parent
    srcs = sources()
    h = hashlib.sha256()
    for f in [*srcs, *sorted((root / "runtime").glob("*.h")), *sorted((root / "offload").glob("*.h"))]:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    d = work / "offload-bin"
    exe = d / f"edgellm-run-{h.hexdigest()[:12]}"
    if exe.is_file():
        return exe
    d.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=d) as tmp:
        out = Path(tmp) / "edgellm-run"
        cmd = ["gcc", "-std=c11", "-O2", f"-I{root / 'runtime'}", f"-I{root / 'offload'}", "-o", str(out),
               *map(str, srcs), "-lpthread", "-ldl", "-lm"]
        log("building edgellm-run from the current sources ...")
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"gcc failed: {p.stderr.strip()[-2000:]}")
        os.replace(out, exe)
    return exe


def build_diskbw(work: Path) -> Path:
    exe = work / "diskbw"
    src = HERE / "diskbw.c"
    if not exe.is_file() or exe.stat().st_mtime < src.stat().st_mtime:
        subprocess.run(["gcc", "-O2", "-pthread", str(src), "-o", str(exe)], check=True)
    return exe


DISKBW: Path | None = None   # set in main


def disk_gbs(path: Path, threads: int = 2) -> float:
    """The disk's sequential cold read speed, read the ways the window store can (bench/diskbw.c): the better of
    buffered with read-ahead (dropped behind) and O_DIRECT, 1 MiB requests, `threads` readers."""
    out = []
    for mode in ("buffered", "direct"):
        p = subprocess.run([str(DISKBW), str(path), str(threads), mode], capture_output=True, text=True)
        if p.returncode == 0:
            out.append(float(p.stdout))
    if not out:
        raise SystemExit(f"diskbw could not read {path}")
    return max(out)


def failure(res: dict) -> str | None:
    """One line saying why a run has no result, or None."""
    if res["timed_out"]:
        return f"timed out after {res['wall_s']:.0f} s"
    if res["rc"] == 0:
        return None
    if res["oom_kill"] or res["rc"] in (-signal.SIGKILL, 137):
        return f"OOM-killed (rc {res['rc']}, oom_kill {res['oom_kill']}, failcnt {res['failcnt']})"
    tail = [ln for ln in res["stderr"].strip().splitlines() if ln.strip()]
    return f"rc {res['rc']}: {tail[-1][:160] if tail else 'no message'}"


# ---- runs --------------------------------------------------------------------------------------------------------
GEN_RE = re.compile(r"\[(\d+) prompt tokens, (\d+) generated \((\w+)\); prefill ([\d.]+) tok/s(?: \(NPU\))?, "
                    r"decode ([\d.]+) tok/s, (\d+) threads\]")
WEIGHTS_RE = re.compile(r"\[weights: ([\d.]+) MB pinned \+ ([\d.]+) MB window, ([\d.]+) MB streamed per token from "
                        r"(\w+)( \(modelled\))?; read ([\d.]+) MB in (\d+) requests, ([\d.]+) s waiting for reads\]")


def prefill_passes(manifest: dict, n: int) -> int:
    """Prefill program runs for an n-token prompt (context.c: a last piece <= half a chunk runs the short program)."""
    chunk, short = int(manifest.get("prefill_chunk") or n), int(manifest.get("prefill_short_chunk") or 0)
    passes, left = 0, n
    while left > 0:
        if short and left < chunk and math.ceil(left / short) * short <= chunk // 2:
            return passes + 1
        passes += 1
        left -= min(left, chunk)
    return passes


def edgellm_cmd(exe: Path, pkg: Path, tokens: int, threads: int, extra: list[str]) -> list[str]:
    return [str(exe), str(pkg), "--ids", ",".join(map(str, PROMPT)), "-n", str(tokens), "--ignore-eos", "--print-ids",
            "--temperature", "0", "--threads", str(threads), *extra]


def run_edgellm(exe: Path, pkg: Path, tokens: int, a, limit: int, extra: list[str], env: dict | None = None) -> dict:
    res = run_limited(edgellm_cmd(exe, pkg, tokens, a.threads, extra), limit, a.timeout, env, prefix=CG_PREFIX)
    row = {k: res[k] for k in ("rc", "wall_s", "peak_mib", "failcnt", "oom_kill", "limit_mib")}
    why = failure(res)
    if why:
        row["error"] = why
        return row
    g = GEN_RE.search(res["stderr"])
    lines = [ln for ln in res["stdout"].splitlines() if ln.strip()]
    if not g or not lines:
        row["error"] = "no generation stats in the output"
        return row
    row.update(prompt=int(g[1]), generated=int(g[2]), prefill=float(g[4]), decode=float(g[5]))
    row["ids"] = [int(t) for t in lines[-1].split()]
    w = WEIGHTS_RE.search(res["stderr"])
    if w:
        row.update(pinned_mb=float(w[1]), window_mb=float(w[2]), streamed_mb=float(w[3]), storage=w[4],
                   read_mb=float(w[6]), requests=int(w[7]), stall_s=float(w[8]))
    return row


def run_llama(bench: Path, gguf: Path, tokens: int, a, limit: int, extra: list[str]) -> dict:
    cmd = [str(bench), "-m", str(gguf), "-p", "0", "-n", str(tokens), "-t", str(a.threads), "-r", "1", "-o", "json",
           *extra]
    res = run_limited(cmd, limit, a.timeout, prefix=CG_PREFIX)
    row = {k: res[k] for k in ("rc", "wall_s", "peak_mib", "failcnt", "oom_kill", "limit_mib")}
    why = failure(res)
    if why:
        row["error"] = why
        return row
    try:
        tests = [t for t in json.loads(res["stdout"]) if t["n_gen"] > 0 and t["n_prompt"] == 0]
        row["decode"] = statistics.median(tests[0]["samples_ts"])
    except (json.JSONDecodeError, KeyError, IndexError, TypeError) as e:
        row["error"] = f"cannot parse llama-bench JSON ({e})"
    return row


# ---- setup ---------------------------------------------------------------------------------------------------------
def model_name(a) -> str:
    return f"llama-{a.size}-seed{a.seed}{'-ternary' if a.ternary else ''}"


def find_package(work: Path, a, scheme: str) -> tuple[Path | None, str]:
    """The bench package (bench/vs_llamacpp.py's naming), reused as it is when present (its weights do not depend on
    the runtime; edgellm-run is rebuilt here anyway); compiled when missing or with --recompile."""
    head = vs.HEAD_QUANT.get(scheme)
    pkg = work / "packages" / f"{model_name(a)}-{scheme}{f'-head-{head}' if head else ''}-tune-{a.tune}.edgellm"
    if (pkg / "manifest.json").is_file() and not a.recompile:
        stamp = pkg / "bench-stamp"
        note = "" if stamp.is_file() and stamp.read_text() == vs.source_stamp(256) else \
            "package built from older sources (reused; edgellm-run is built from the current ones)"
        return pkg, note
    model = vs.make_model(work, a.size, a.seed, a.ternary)
    pkg, why, _ = vs.compile_package(work, model, scheme, 256, a.tune)
    return pkg, why


def find_gguf(work: Path, a, scheme: str, lquant: Path | None) -> Path | None:
    out = work / "gguf" / f"{model_name(a)}-{vs.GGUF_TYPE[scheme]}.gguf"
    if out.is_file():
        return out
    if lquant is None:
        return None
    model = vs.make_model(work, a.size, a.seed, a.ternary)
    (work / "gguf").mkdir(exist_ok=True)
    f16 = vs.write_gguf(model, work / "gguf" / f"{model.name}-F16.gguf")
    gg, _ = vs.quantize_gguf(lquant, f16, vs.GGUF_TYPE[scheme], a.threads)
    return gg


# ---- one round -------------------------------------------------------------------------------------------------------
def plan_rows(a, info: dict) -> list[dict]:
    """The runs of one scheme's round, in the order they run."""
    rows = [{"kind": "in-RAM", "pct": None, "storage": "native"}]
    for pct in a.budgets:
        for st in a.storage:
            if st == "native" or (pct in a.profile_budgets and pct < 100):
                rows.append({"kind": "window", "pct": pct, "storage": st})
        rows.append({"kind": "plain mmap", "pct": pct, "storage": "native"})
        rows.append({"kind": "no budget, as shipped", "pct": pct, "storage": "native"})
        for mode in a.llama_modes:
            rows.append({"kind": "llama.cpp as shipped" if mode == "default" else "llama.cpp --repack 0", "pct": pct,
                         "storage": "native"})
    return rows


def run_row(spec: dict, s: dict, a, exe: Path, lbench: Path | None) -> dict:
    pkg, weights = s["package"], s["package"] / "weights.bin"
    W, C = s["weights_bytes"], s["context_bytes"]
    kind, pct, st = spec["kind"], spec["pct"], spec["storage"]
    r = dict(spec)
    if kind == "in-RAM":
        warm(weights)
        return {**r, **run_edgellm(exe, pkg, s["ref_tokens"], a, 2 * W + 1024 * MiB, [])}
    budget = int(W * pct / 100) + C + s["cache_bytes"]
    limit = budget + a.overhead_mib * MiB
    r.update(budget=budget, limit=limit)
    if kind == "window":
        plan = s["plans"].get((pct, st))
        if isinstance(plan, str):
            return {**r, "error": plan}
        tokens = a.slow_tokens if st in ("sd", "emmc") else a.tokens
        r.update(policy=plan["policy"], modelled=bool(plan["storage_modelled"]), plan_streamed=plan["streamed_bytes"],
                 plan_pinned=plan["pinned_bytes"], storage_bps=plan["storage_bytes_per_s"] or None)
        if st in MODELLED:
            r["cached_before"] = warm(weights)
        else:
            r["cached_before"] = evict(weights)
        if st == "native":
            r["bw_before"] = disk_gbs(weights, a.threads) * 1e9
        extra = ["--memory-budget", str(budget), "--storage", st, "--weight-policy", "window"] + \
            (["--io-threads", str(a.io_threads)] if a.io_threads else []) + (["--direct-io"] if a.direct_io else [])
        r.update(run_edgellm(exe, pkg, tokens, a, limit, extra))
        if st == "native":
            r["bw_after"] = disk_gbs(weights, a.threads) * 1e9
            r["storage_bps"] = (r["bw_before"] + r["bw_after"]) / 2
        if "error" not in r and "streamed_mb" in r:
            passes = prefill_passes(s["manifest"], len(PROMPT)) + r["generated"] - 1
            r["passes"] = passes
            r["read_per_token_mb"] = (r["read_mb"] - r["pinned_mb"]) / passes if passes > 0 else None
            bound = r["storage_bps"] / (r["streamed_mb"] * 1e6) if r.get("storage_bps") and r["streamed_mb"] else None
            r["io_bound"] = bound
            r["vs_bound"] = r["decode"] / bound if bound else None
        return r
    if kind in ("plain mmap", "no budget, as shipped"):
        r["cached_before"] = evict(weights)
        return {**r, **run_edgellm(exe, pkg, a.tokens, a, limit,
                                   ["--huge-pages", "off"] if kind == "plain mmap" else [])}
    # llama.cpp
    if lbench is None or s.get("gguf") is None:
        return {**r, "error": "no llama-bench" if lbench is None else "no GGUF"}
    shipped = kind == "llama.cpp as shipped"
    if shipped and limit < s["gguf"].stat().st_size and not a.llama_shipped_all:
        # as shipped, llama.cpp repacks Q4_0 (AVX2) into anonymous memory: under a limit below the file it thrashes
        # for minutes, then is OOM-killed (206 s at 50% when tried); --repack 0 is its mapping-only configuration
        return {**r, "error": "not run: the limit is below the GGUF size and repacked weights live in anonymous "
                              "memory (--llama-shipped-all runs it)"}
    r["cached_before"] = evict(s["gguf"])
    return {**r, **run_llama(lbench, s["gguf"], a.tokens, a, limit, [] if shipped else ["--repack", "0"])}


def cache_warning(r: dict, size: int) -> None:
    """A cold run whose file could not be evicted (pages mapped by some other process) says so."""
    c = r.get("cached_before")
    if c is not None and r["storage"] not in MODELLED and r["kind"] != "in-RAM" and c > 0.01 * size:
        r["warning"] = f"{c / 1e6:.0f} MB of the file stayed in the page cache after eviction"


def check_tokens(r: dict, ref: list[int] | None) -> None:
    if "ids" in r and ref is not None:
        r["tokens_identical"] = r["ids"] == ref[:len(r["ids"])] and len(r["ids"]) > 0


def llama_ratios(rows: list[dict]) -> None:
    """x llama.cpp: decode / the best llama.cpp decode under the same limit in the same round (llama.cpp reads this
    disk: only rows on the native disk get a ratio)."""
    for r in rows:
        if r["kind"].startswith("llama") or r.get("decode") is None or r["pct"] is None or r["storage"] != "native":
            continue
        lc = [x["decode"] for x in rows if x["kind"].startswith("llama") and x["pct"] == r["pct"] and x.get("decode")]
        if lc:
            r["vs_llama"] = r["decode"] / max(lc)


def describe(r: dict) -> str:
    bits = [f"{r['kind']}", f"{r['pct']}%" if r["pct"] is not None else "no budget", r["storage"]]
    if "error" in r:
        return " ".join(bits) + f": n/a ({r['error']})"
    s = " ".join(bits) + f": decode {r['decode']:.2f} tok/s"
    if r.get("streamed_mb"):
        s += f", {r['streamed_mb']:.0f} MB/token, stall {r['stall_s']:.2f} s"
    if r.get("io_bound"):
        s += f", bound {r['io_bound']:.2f} ({100 * r['vs_bound']:.0f}%)"
    if r.get("storage_bps") and r["storage"] == "native":
        s += f", disk {r['storage_bps'] / 1e9:.2f} GB/s"
    if "tokens_identical" in r:
        s += f", tokens {'identical' if r['tokens_identical'] else 'DIFFER'}"
    return s + f", peak {r['peak_mib']:.0f} MiB" + (f" ({r['warning']})" if "warning" in r else "")


# ---- report --------------------------------------------------------------------------------------------------------
def med(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def summarize(rounds: list[list[dict]]) -> list[dict]:
    """Per row (same position in every round): medians over the rounds that produced a result."""
    out = []
    for i, first in enumerate(rounds[0]):
        rs = [rd[i] for rd in rounds if i < len(rd)]
        ok = [r for r in rs if "error" not in r]
        s = {k: first.get(k) for k in ("kind", "pct", "storage", "budget", "limit", "policy", "modelled")}
        s["rounds_ok"], s["rounds"] = len(ok), len(rs)
        s["errors"] = sorted({r["error"] for r in rs if "error" in r})
        s["warnings"] = sorted({r["warning"] for r in rs if "warning" in r})
        for k in ("decode", "prefill", "streamed_mb", "read_per_token_mb", "stall_s", "storage_bps", "io_bound",
                  "vs_bound", "vs_llama", "peak_mib", "wall_s"):
            s[k] = med(r.get(k) for r in ok)
        ti = [r["tokens_identical"] for r in ok if "tokens_identical" in r]
        s["tokens_identical"] = all(ti) if ti else None
        s["failcnt"] = max((r.get("failcnt") or 0 for r in rs), default=0)
        out.append(s)
    return out


def fmt(v, spec: str = ".2f", scale: float = 1.0) -> str:
    return "—" if v is None else format(v * scale, spec)


def table(result: dict) -> str:
    m = result["meta"]
    lines = [f"Offload benchmark, {m['model']}: {m['date']}; CPU {m['cpu']}; {m['threads']} threads; "
             f"{m['rounds']} round(s), medians",
             "", "| scheme | --memory-budget (% of weights) | cgroup limit MiB | storage | run | measured / modelled | "
             "decode tok/s | MB read/token (plan / from read total) | stall s | storage MB/s | I/O bound tok/s | "
             "decode / bound | x llama.cpp | tokens identical | peak MiB |", "|" + "---|" * 15]
    for scheme, sres in result["schemes"].items():
        if "summary" not in sres:
            lines.append(f"| {scheme} | n/a | | | | | | | | | | | | | {sres.get('error', '')} |")
            continue
        for r in sres["summary"]:
            pct = "none" if r["pct"] is None else f"{r['budget'] / 1e6:.0f} MB ({r['pct']}%)"
            lim = "generous" if r["pct"] is None else f"{r['limit'] / MiB:.0f}"
            run = r["kind"] + (f" ({r['policy']})" if r["kind"] == "window" and r.get("policy") else "")
            how = "modelled" if r.get("modelled") else "measured"
            if r["rounds_ok"] == 0:
                lines.append(f"| {scheme} | {pct} | {lim} | {r['storage']} | {run} | {how} | n/a | | | | | | | | "
                             f"{'; '.join(r['errors'])} |")
                continue
            ti = {None: "—", True: "yes", False: "**NO**"}[r["tokens_identical"]]
            note = f" ({r['rounds'] - r['rounds_ok']} round(s) failed: {'; '.join(r['errors'])})" if r["errors"] else ""
            note += "".join(f" ({w})" for w in r["warnings"])
            mb = "—" if r["streamed_mb"] is None else f"{r['streamed_mb']:.0f} / {fmt(r['read_per_token_mb'], '.0f')}"
            lines.append(f"| {scheme} | {pct} | {lim} | {r['storage']} | {run} | {how} | {fmt(r['decode'])} | {mb} | "
                         f"{fmt(r['stall_s'])} | {fmt(r['storage_bps'], '.0f', 1e-6)} | {fmt(r['io_bound'])} | "
                         f"{fmt(r['vs_bound'], '.0%')} | {fmt(r['vs_llama'])} | {ti} | {fmt(r['peak_mib'], '.0f')}{note} |")
    lines.append("")
    lines.append(
        f"cgroup limit = --memory-budget + {m['overhead_mib']} MiB (a stated constant for the process's own memory "
        f"beyond what the budget counts; calibration, edgellm-run --weight-policy window at the 100% budget under no "
        f"tight limit, cold: peak - budget = {', '.join(f'{k} {v:+.0f} MiB' for k, v in m['calibration'].items())}). "
        f"--memory-budget = pct x weights + one context's KV cache and arena + read-ahead (Runtime.plan). Files "
        f"evicted from the "
        f"page cache before every run (ufs3/ufs4: read into it from outside the cgroup instead). "
        f"MB read/token: 'streamed per token' / (read total - pinned) / (prefill passes + generated - 1). "
        f"I/O bound = storage bandwidth / streamed bytes per token (native: the better of buffered and O_DIRECT "
        f"1 MiB x {m['threads']} threads "
        f"sequential read of weights.bin, mean of the readings right before and after the row; sd/emmc/ufs: the "
        f"profile's rate, per-request latency not included). x llama.cpp = decode / the faster of llama-bench as "
        f"shipped and with --repack 0, same limit, same round; native-disk rows only. In-RAM / native / mmap runs "
        f"generate {m['tokens']} tokens, sd/emmc {m['slow_tokens']}; llama-bench -n {m['tokens']}.")
    lines.append(f"Goals (not asserted), at {' and '.join(f'{p}%' for p in GOAL_BUDGETS)} budgets: decode >= "
                 f"{GOAL_BOUND:.0%} of the I/O bound and >= {GOAL_LLAMA:g}x llama.cpp under the same limit.")
    for scheme, sres in result["schemes"].items():
        for r in sres.get("summary", ()):
            if r["kind"] != "window" or r["pct"] not in GOAL_BUDGETS:
                continue
            if r["decode"] is None:
                lines.append(f"  {scheme} {r['pct']}% {r['storage']}: n/a")
                continue
            g1 = "—" if r["vs_bound"] is None else ("met" if r["vs_bound"] >= GOAL_BOUND else "NOT met")
            g2 = "—" if r["vs_llama"] is None else ("met" if r["vs_llama"] >= GOAL_LLAMA else "NOT met")
            vl = ("no llama.cpp on this storage" if r["storage"] != "native" else "no llama.cpp result"
                  if r["vs_llama"] is None else f"{fmt(r['vs_llama'])}x llama.cpp ({g2})")
            lines.append(f"  {scheme} {r['pct']}% {r['storage']}: {fmt(r['vs_bound'], '.0%')} of the I/O bound "
                         f"({g1}); {vl}")
    for scheme, sres in result["schemes"].items():
        for n in sres.get("notes", ()):
            lines.append(f"note ({scheme}): {n}")
    return "\n".join(lines)


# ---- main ----------------------------------------------------------------------------------------------------------
def int_list(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(vs.SIZES), default="1b")
    ap.add_argument("--ternary", action=argparse.BooleanOptionalAction, default=True,
                    help="the absmean-ternary model of bench/vs_llamacpp.py --ternary (default: on)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--schemes", default="q4g32,t2", help="comma list of q4g32, t2 (default q4g32,t2)")
    ap.add_argument("--budgets", default="100,75,50,25", help="%% of the weights, comma list (default 100,75,50,25)")
    ap.add_argument("--storage", default="native,emmc,sd,ufs3,ufs4",
                    help=f"comma list of {','.join(PROFILES)} (default: all); native runs at every budget")
    ap.add_argument("--profile-budgets", default="50,25",
                    help="budgets (%%) at which the storage profiles other than native run (default 50,25)")
    ap.add_argument("--tokens", type=int, default=16,
                    help="tokens generated by in-RAM/native/ufs/mmap/llama.cpp runs (default 16)")
    ap.add_argument("--slow-tokens", type=int, default=4, help="tokens generated by sd and emmc runs (default 4)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--io-threads", type=int, default=None, help="edgellm-run --io-threads (default: its own, 2)")
    ap.add_argument("--direct-io", action="store_true", help="window rows read with O_DIRECT (default: buffered)")
    ap.add_argument("--overhead-mib", type=int, default=32,
                    help="cgroup limit = budget + this (the process's memory the budget does not count; default 32)")
    ap.add_argument("--llama-modes", default="default,norepack",
                    help="llama-bench configurations: default (as shipped), norepack (--repack 0); comma list")
    ap.add_argument("--llama-shipped-all", action="store_true",
                    help="run llama.cpp as shipped also under limits below the GGUF size (where it repacks Q4_0 into "
                         "anonymous memory, thrashes for minutes and is OOM-killed)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per run before it is killed (default 300)")
    ap.add_argument("--tune", default="quick", choices=("off", "quick", "full"), help="the packages' --tune mode")
    ap.add_argument("--recompile", action="store_true",
                    help="rebuild packages built from older sources (bench/vs_llamacpp.py compile_package)")
    ap.add_argument("--work", default=os.path.expanduser("~/.cache/edgellm/bench"))
    ap.add_argument("--llama-bench", default=None, help="llama-bench to use [default: WORK/llama-build/bin, built if "
                                                        "missing]")
    ap.add_argument("--no-llama", action="store_true", help="skip the llama.cpp rows")
    ap.add_argument("--quick", action="store_true", help="smoke run: first scheme, 50%% budget, native only, 4 tokens, 1 round")
    ap.add_argument("--json", action="store_true", help="print the whole result as JSON (the table goes to stderr)")
    a = ap.parse_args(argv)

    a.schemes = [s.strip() for s in a.schemes.split(",") if s.strip()]
    a.storage = [s.strip() for s in a.storage.split(",") if s.strip()]
    a.llama_modes = [] if a.no_llama else [m.strip() for m in a.llama_modes.split(",") if m.strip()]
    try:
        a.budgets, a.profile_budgets = int_list(a.budgets), int_list(a.profile_budgets)
    except ValueError:
        ap.error("--budgets / --profile-budgets: comma lists of integers")
    if a.quick:
        a.schemes, a.budgets, a.storage, a.tokens, a.slow_tokens, a.rounds = a.schemes[:1], [50], ["native"], 4, 4, 1
    bad = [s for s in a.schemes if s not in vs.GGUF_TYPE]
    if bad or not a.schemes:
        ap.error(f"--schemes: choose from {','.join(vs.GGUF_TYPE)}")
    if not a.storage or [s for s in a.storage if s not in PROFILES]:
        ap.error(f"--storage: choose from {','.join(PROFILES)}")
    if any(not 0 < p <= 100 for p in a.budgets + a.profile_budgets) or not a.budgets:
        ap.error("--budgets: percentages in (0, 100]")
    if [m for m in a.llama_modes if m not in ("default", "norepack")]:
        ap.error("--llama-modes: default, norepack")
    if a.rounds < 1 or a.tokens < 2 or a.slow_tokens < 2:
        ap.error("--rounds >= 1, --tokens and --slow-tokens >= 2")

    from edgellm.errors import EdgeLLMError
    from edgellm.runtime.python.api import Runtime

    parent = cgroup_parent()
    if parent is None:
        raise SystemExit("no cgroup-v1 memory controller in /proc/self/cgroup: this benchmark needs one")
    if not os.access(parent, os.W_OK):
        raise SystemExit(f"cannot create memory sub-groups in {parent}: this benchmark needs the cgroup-v1 memory "
                         f"controller writable")
    remove_stale_groups(parent, CG_PREFIX)
    work = Path(a.work).expanduser()
    work.mkdir(parents=True, exist_ok=True)
    exe = build_runner(work)
    global DISKBW
    DISKBW = build_diskbw(work)

    lbench = lquant = None
    if a.llama_modes:
        if a.llama_bench:
            lbench = Path(a.llama_bench)
            if not lbench.is_file():
                ap.error(f"--llama-bench {lbench} does not exist")
            lquant = lbench.with_name("llama-quantize")
        else:
            cand = work / "llama-build" / "bin"
            if (cand / "llama-bench").is_file():
                lbench, lquant = cand / "llama-bench", cand / "llama-quantize"
            else:
                lbench, lquant = vs.build_llamacpp(work, a.threads)
        if not (lquant and lquant.is_file()):
            lquant = None

    result = {"meta": {"model": model_name(a), "cpu": vs._cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M"),
                       "threads": a.threads, "rounds": a.rounds, "tokens": a.tokens, "slow_tokens": a.slow_tokens,
                       "overhead_mib": a.overhead_mib, "budgets": a.budgets, "storage": a.storage,
                       "profile_budgets": a.profile_budgets, "prompt": PROMPT, "edgellm_run": str(exe),
                       "llama_bench": str(lbench) if lbench else None, "llama_modes": a.llama_modes,
                       "io_threads": a.io_threads, "calibration": {}},
              "schemes": {}}
    setups = {}
    for scheme in a.schemes:
        pkg, note = find_package(work, a, scheme)
        sres = result["schemes"].setdefault(scheme, {"notes": [note] if note and pkg else []})
        if pkg is None:
            sres["error"] = f"no package: {note}"
            continue
        full = Runtime.plan(pkg, memory_budget=1 << 40, weight_policy="window", direct_io=a.direct_io)
        s = {"package": pkg, "manifest": json.loads((pkg / "manifest.json").read_text()),
             "weights_bytes": full["weights_bytes"], "context_bytes": full["context_bytes"],
             "cache_bytes": full["cache_bytes"],
             "ref_tokens": max(a.tokens, a.slow_tokens), "plans": {}}
        s["gguf"] = find_gguf(work, a, scheme, lquant) if a.llama_modes else None
        for pct in a.budgets:
            for st in a.storage:
                budget = int(s["weights_bytes"] * pct / 100) + s["context_bytes"] + s["cache_bytes"]
                try:
                    s["plans"][(pct, st)] = Runtime.plan(pkg, memory_budget=budget, storage=st, weight_policy="window",
                                                         direct_io=a.direct_io)
                except EdgeLLMError as e:
                    s["plans"][(pct, st)] = f"refused: {str(e).splitlines()[0][:200]}"
        sres.update(package=str(pkg), gguf=str(s["gguf"]) if s["gguf"] else None,
                    weights_bytes=s["weights_bytes"], context_bytes=s["context_bytes"],
                    plans={f"{p}% {st}": v for (p, st), v in s["plans"].items()})
        for v in s["plans"].values():
            if isinstance(v, dict):
                v.pop("pinned", None)
        # calibration: the process's own memory beyond the budget (the window policy holds everything at 100%)
        budget = s["weights_bytes"] + s["context_bytes"] + s["cache_bytes"]
        evict(pkg / "weights.bin")
        cal = run_edgellm(exe, pkg, 2, a, 2 * budget + 1024 * MiB,
                          ["--memory-budget", str(budget), "--weight-policy", "window"])
        if "error" in cal:
            sres["notes"].append(f"calibration run failed: {cal['error']}")
        else:
            over = cal["peak_mib"] - budget / MiB
            result["meta"]["calibration"][scheme] = over
            if over > a.overhead_mib:
                sres["notes"].append(f"calibration peak is {over:.0f} MiB over the budget, more than --overhead-mib "
                                     f"{a.overhead_mib}")
        setups[scheme] = s

    t_start = time.perf_counter()
    all_rounds = {scheme: [] for scheme in setups}
    failed_tokens = []
    try:
        for i in range(a.rounds):
            for scheme, s in setups.items():   # interleaved: every scheme and configuration once per round
                rows = []
                for spec in plan_rows(a, s):
                    r = run_row(spec, s, a, exe, lbench)
                    cache_warning(r, (s["gguf"] if r["kind"].startswith("llama") else s["package"] / "weights.bin")
                                  .stat().st_size)
                    if r["kind"] == "in-RAM" and "ids" in r and "ref_ids" not in s:
                        s["ref_ids"] = r["ids"]
                    check_tokens(r, s.get("ref_ids"))
                    if r.get("tokens_identical") is False:
                        failed_tokens.append(f"{scheme} round {i + 1}: {describe(r)}")
                        log(f"ERROR: tokens differ from the in-RAM run: {r['ids']} vs {s['ref_ids'][:len(r['ids'])]}")
                    rows.append(r)
                    log(f"[{time.perf_counter() - t_start:5.0f} s] {scheme} round {i + 1}/{a.rounds}: {describe(r)}")
                llama_ratios(rows)
                all_rounds[scheme].append(rows)
    except KeyboardInterrupt:
        log("interrupted: reporting the rounds that finished")
    for scheme, rounds in all_rounds.items():
        sres = result["schemes"][scheme]
        if not rounds:
            sres["error"] = "no round finished"
            continue
        sres["reference_ids"] = setups[scheme].get("ref_ids")
        sres["rounds"] = [[{k: v for k, v in r.items() if k != "ids"} | {"ids": r.get("ids")} for r in rd]
                          for rd in rounds]
        sres["summary"] = summarize(rounds)
    result["meta"]["seconds"] = time.perf_counter() - t_start
    out = work / f"offload-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=1, default=str))
    t = table(result)
    if a.json:
        log(t)
        print(json.dumps(result, indent=1, default=str))
    else:
        print(t)
    log(f"(result saved to {out}; {result['meta']['seconds']:.0f} s)")
    if failed_tokens:
        log("FAILED: budgeted runs generated other tokens than the in-RAM run:\n  " + "\n  ".join(failed_tokens))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
