"""A/B of two libedgellm builds on the same packages, interleaved: this checkout against a base git revision.

    python bench/ab_runtime.py --base 36d8c5f [--size 1b] [--schemes q8,q4g32] [--rounds 3] [--reps 2]

Only the runtime differs: the packages are compiled once, by the base revision's compiler (newer runtimes read its
plans), and both libraries are built here with the same compiler and flags. Each round runs `edgellm bench --json`
once per side per package, alternating which side goes first, so bandwidth drift on a shared host hits both alike.
Prints per scheme the medians and the ratio new / base of prefill and decode tok/s (1.00: unchanged), with the
spread of the per-round ratios. --size demo uses the bundled demo model (where per-step overhead shows most).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def build_lib(tree: Path, out: Path) -> Path:
    """libedgellm from a source tree's own list (its pyproject.toml), -O2 like setuptools' build."""
    ext = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["setuptools"]["ext-modules"][0]
    cmd = ["gcc", "-std=c11", "-O2", "-fPIC", "-shared", *(f"-I{tree / d}" for d in ext["include-dirs"]),
           *(str(tree / s) for s in ext["sources"]), "-o", str(out), "-lpthread", "-ldl", "-lm"]
    subprocess.run(cmd, check=True)
    return out


def base_tree(work: Path, rev: str) -> Path:
    """A worktree of the base revision at work/ab-<rev>/edgellm (importable as `edgellm` from its parent)."""
    d = work / f"ab-{rev}" / "edgellm"
    if not (d / "pyproject.toml").is_file():
        d.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-f", "--detach", str(d), rev], check=True,
                       capture_output=True)
    return d


def bench(env: dict, pkg: Path, a) -> dict:
    r = subprocess.run([sys.executable, "-m", "edgellm.cli", "bench", str(pkg), "--prompt-len", str(a.prompt_len),
                        "--gen-len", str(a.gen_len), "--threads", str(a.threads), "--reps", str(a.reps), "--json"],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"bench failed: {r.stderr.strip()[-500:]}")
    out = json.loads(r.stdout)
    return {"prefill": out["prefill_tok_s"], "decode": out["decode_tok_s"]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="git revision of the runtime to compare against")
    ap.add_argument("--size", default="1b", help="vs_llamacpp.py model size, or demo")
    ap.add_argument("--schemes", default="q8,q4g32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--work", default=os.path.expanduser("~/.cache/edgellm/bench"))
    a = ap.parse_args(argv)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    base = base_tree(work, a.base)
    libs = work / f"ab-{a.base}" / "libs"
    libs.mkdir(exist_ok=True)
    log("building both libraries ...")
    lib_base, lib_new = build_lib(base, libs / "base.so"), build_lib(ROOT, libs / "new.so")
    env_base = {**os.environ, "PYTHONPATH": str(base.parent), "EDGELLM_LIB": str(lib_base)}
    env_new = {**os.environ, "PYTHONPATH": str(ROOT.parent) if ROOT.name == "edgellm" else "",
               "EDGELLM_LIB": str(lib_new)}
    if a.size == "demo":
        model = base / "models" / "demo" / "demo-llama"
    else:
        sys.path.insert(0, str(HERE))
        import vs_llamacpp

        model = vs_llamacpp.make_model(work, a.size, 0, False)
    pkgs = {}
    for s in a.schemes.split(","):
        out = work / f"ab-{a.base}" / f"{model.name}-{s}.edgellm"
        if not (out / "manifest.json").is_file():
            log(f"compiling {model.name} -q {s} with the base compiler ...")
            subprocess.run([sys.executable, "-m", "edgellm.cli", "compile", str(model), "-q", s, "-o", str(out),
                            "--max-context", "512", "--tune", "off", "--quiet"], check=True, env=env_base)
        pkgs[s] = out
    rows = {s: {"base": [], "new": []} for s in pkgs}
    for r in range(a.rounds):
        for s, pkg in pkgs.items():
            order = [("base", env_base), ("new", env_new)]
            for side, env in (order if r % 2 == 0 else order[::-1]):
                rows[s][side].append(bench(env, pkg, a))
            b, n = rows[s]["base"][-1], rows[s]["new"][-1]
            log(f"round {r + 1} {s}: prefill {n['prefill'] / b['prefill']:.3f}, decode {n['decode'] / b['decode']:.3f}")
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "?")
    print(f"runtime A/B: this checkout / {a.base}; {model.name}; {a.threads} threads, prompt {a.prompt_len}, generate "
          f"{a.gen_len}, {a.rounds} interleaved rounds x {a.reps} reps; CPU {cpu}")
    print("| scheme | prefill tok/s base / new | ratio (min-max) | decode tok/s base / new | ratio (min-max) |")
    print("|---|---|---|---|---|")
    for s, sides in rows.items():
        cells = []
        for k in ("prefill", "decode"):
            b = statistics.median(x[k] for x in sides["base"])
            n = statistics.median(x[k] for x in sides["new"])
            per = [y[k] / x[k] for x, y in zip(sides["base"], sides["new"])]
            cells += [f"{b:.1f} / {n:.1f}", f"{n / b:.3f} ({min(per):.3f}-{max(per):.3f})"]
        print(f"| {s} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
