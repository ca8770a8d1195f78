"""Decode profile per GEMV shape and scheme against this host's streaming read bandwidth (issue 42).

    python bench/gemv_profile.py [--size 1b] [--schemes f16,q8,q4g32,t2] [--rounds 3] [--tune quick]
                                 [--package DIR ...] [--threads 2] [--gen-len 64]

Uses the packages of bench/vs_llamacpp.py (same seeded model, same head types, same work dir: built once, reused
while the sources are unchanged), or the given --package directories. Per round and package, interleaved: the read
bandwidth (bench/membw.c), `edgellm bench` with EDGELLM_PROFILE=1 (the runtime's per-kernel table of the decode
program: ms per token and the rate each kernel reads its weights at), the bandwidth again. Prints, per scheme, each
kernel of decode with its share of the token, ms per token, weight GB/s and that rate as % of the mean of the two
bandwidth readings around its run (medians over rounds; the share over the rounds whose two readings agree within
vs_llamacpp.STEADY, as that bench does), and the whole token the same way (all weight bytes per token / the token's
time). A GEMV below ~90% here is a kernel problem; the whole token also pays for attention,
norms and launches.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import vs_llamacpp as vs  # noqa: E402


def profile(pkg: Path, threads: int, gen_len: int) -> tuple[float, float, list[tuple[str, float, float, int]]]:
    """(decode tok/s, weight MB per token, [(kernel, ms per token, weight GB/s, steps)]) of one bench run."""
    cmd = [sys.executable, "-m", "edgellm.cli", "bench", str(pkg), "--prompt-len", "32", "--gen-len", str(gen_len),
           "--reps", "1", "--threads", str(threads), "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "EDGELLM_PROFILE": "1"}, timeout=3600)
    if r.returncode != 0:
        raise SystemExit(f"{pkg.name}: " + (r.stderr.strip().splitlines() or ["edgellm bench failed"])[-1])
    res = json.loads(r.stdout)
    return res["decode_tok_s"], res["weights_read_per_token"] / 1e6, decode_profile(r.stderr)


def decode_profile(stderr: str) -> list[tuple[str, float, float, int]]:
    """[(kernel, ms per token, weight GB/s, steps)] of the decode program's table in EDGELLM_PROFILE output."""
    block = stderr.split("edgellm profile: decode,", 1)[1].split("edgellm profile:")[0].splitlines()[2:]
    rows = []
    for ln in block:
        parts = ln.split()
        if len(parts) == 5 and re.fullmatch(r"[\d.]+", parts[1]):
            rows.append((parts[4], float(parts[1]), float(parts[3]), int(parts[2])))
    return rows


def shape(kernel: str) -> str:
    n = re.search(r"_n(\d+)", kernel)
    k = re.search(r"_k(\d+)", kernel)
    return f"{n.group(1)}x{k.group(1)}" if n and k else ""


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(vs.SIZES), default="1b")
    ap.add_argument("--schemes", default="f16,q8,q4g32,t2")
    ap.add_argument("--tune", default="quick")
    ap.add_argument("--package", nargs="+", default=None, help="profile these packages instead")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--work", default=os.path.expanduser("~/.cache/edgellm/bench"))
    a = ap.parse_args(argv)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    if a.package:
        pkgs = {Path(p).name: Path(p) for p in a.package}
    else:
        model = vs.make_model(work, a.size, 0, True)   # the --ternary model vs_llamacpp.py benches
        pkgs = {}
        for s in a.schemes.split(","):
            p, why, _ = vs.compile_package(work, model, s, 2048, a.tune)
            if p is None:
                raise SystemExit(f"{s}: {why}")
            pkgs[s] = p
    exe = vs.build_membw(work)
    runs: dict[str, list] = {name: [] for name in pkgs}
    bws = []
    for rnd in range(a.rounds):
        for name, pkg in pkgs.items():
            before = vs.membw(exe, a.threads)
            tok_s, mb, rows = profile(pkg, a.threads, a.gen_len)
            after = vs.membw(exe, a.threads)
            bws += [before, after]
            runs[name].append((tok_s, mb, rows, (before, after)))
            vs.log(f"round {rnd + 1} {name}: {tok_s:.1f} tok/s, bandwidth {before:.1f} / {after:.1f} GB/s")
    print(f"host: {vs._cpu_name()}; {a.threads} threads; read bandwidth {min(bws):.1f}-{max(bws):.1f} GB/s; "
          f"medians of {a.rounds} interleaved rounds; % of bandwidth over the runs whose readings before and after "
          f"agree within {100 * vs.STEADY:.0f}% (how many in brackets), over all where none does")
    print(table(runs))


def table(runs: dict[str, list]) -> str:
    """The markdown table of {package: [(decode tok/s, weight MB per token, kernel rows, (bandwidth before, after))]}:
    speeds are medians over every run, shares of the bandwidth the steady median (vs.steady_median): a run whose
    readings disagree straddles a switch of the host's bandwidth state, and their mean is neither state."""
    out = ["| package | kernel | NxK | steps | % of token | ms/token | weight GB/s | % of bandwidth |",
           "|---|---|---|---|---|---|---|---|"]
    for name, rs in runs.items():
        tok = statistics.median(r[0] for r in rs)
        mb = rs[0][1]

        def pct(gbs: float, bw: tuple[float, float]) -> tuple[float, bool]:
            return 100 * gbs / statistics.mean(bw), vs.steady(*bw)

        tok_pct, n_steady = vs.steady_median([pct(r[1] * r[0] / 1e3, r[3]) for r in rs])
        out.append(f"| {name} | whole token | | | 100 | {1e3 / tok:.2f} | {mb * tok / 1e3:.1f} | "
                   f"{tok_pct:.0f} ({n_steady} of {len(rs)}) |")
        for k in (k for k, *_ in rs[0][2]):
            per = [(next((x for x in r[2] if x[0] == k), None), r[0], r[3]) for r in rs]
            per = [(x, t, bw) for x, t, bw in per if x]
            ms = statistics.median(x[1] for x, _, _ in per)
            gbs = statistics.median(x[2] for x, _, _ in per)
            share = statistics.median(100 * x[1] * t / 1e3 for x, t, _ in per)
            if share < 0.5 and gbs == 0:
                continue
            kpct = f"{vs.steady_median([pct(x[2], bw) for x, _, bw in per])[0]:.0f}" if gbs > 0 else ""
            out.append(f"| | {k} | {shape(k)} | {per[0][0][3]} | {share:.1f} | {ms:.3f} | {gbs:.1f} | {kpct} |")
    return "\n".join(out)

if __name__ == "__main__":
    main()
