"""What the C runtime's own constraint costs (issue 37, the phone path): `bin/edgellm-run --constraint FILE` (an
automaton compiled by `edgellm schema`, runtime/core/constraint.c) against the same run without it.

    python bench/constraint_c.py [--rounds 3] [--tokens 96] [--no-1b]

The packages and the schema are bench/structured.py's (demo 4k, SmolLM2-135M 49k, Gemma-3-270M 262k, the 1B model
with Llama 2's 32k tokenizer), run by an edgellm-run built from this checkout for the host (a package's own binary
may predate the option). Greedy, the same prompt ids; plain and constrained runs interleaved (bandwidth on shared
hosts drifts within minutes: only same-run ratios mean anything); decode tok/s as edgellm-run reports it (the mask
is computed inside the C loop's step, so it counts), the median of the rounds. The constrained output is checked
against the schema. Also: the automaton's size and compile time, and the mask's cost per token derived from the two
speeds (1/constrained - 1/plain).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))


def runner(work: Path) -> Path:
    from edgellm.compiler.device_binary import build_edgellm_run
    from edgellm.targets import get_target

    return build_edgellm_run(get_target("host"), work / "constraint-bench" / "edgellm-run")


def decode_rate(exe: Path, pkg: Path, ids: list[int], n: int, extra: list[str]) -> tuple[float, str, str]:
    r = subprocess.run([str(exe), str(pkg), "--ids", ",".join(map(str, ids)), "-n", str(n), "--temperature", "0",
                        *extra], capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip().splitlines()[-1])
    m = re.search(r"generated \((\w+)\).*decode ([0-9.]+) tok/s", r.stderr)
    return float(m.group(2)), m.group(1), r.stdout


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--work", default=os.path.expanduser("~/.cache/edgellm/bench"))
    ap.add_argument("--no-1b", action="store_true", help="leave out the 1B package (its first compile takes minutes)")
    a = ap.parse_args(argv)
    import jsonschema

    import structured as S
    import vs_llamacpp as vs
    from edgellm.runtime.python import automaton
    from edgellm.runtime.python.api import Runtime

    work = Path(a.work)
    print(f"host: {vs._cpu_name()}")
    t0 = time.perf_counter()
    data = automaton.compile_schema(S.SCHEMA)
    compile_s = time.perf_counter() - t0
    auto = automaton.Automaton(data)
    print(f"automaton of bench/structured.py's schema: {auto.n} nodes, {auto.nc} byte classes, {len(data) / 1024:.1f} "
          f"KiB, compiled in {compile_s * 1000:.0f} ms (edgellm schema)\n")
    exe = runner(work)
    with tempfile.TemporaryDirectory() as tmp:
        path = automaton.write(data, Path(tmp) / "schema.eldfa")
        print("| package (vocabulary) | decode tok/s plain | with the automaton | ratio | mask per token (derived) | "
              "output validates |")
        print("|---|---|---|---|---|---|")
        for label, pkg in S.packages(work, with_1b=not a.no_1b).items():
            with Runtime.load(pkg) as rt:
                ids = S.prompt_ids(rt)
            plain, constrained, checks = [], [], set()
            for _ in range(a.rounds):
                plain.append(decode_rate(exe, pkg, ids, a.tokens, ["--ignore-eos"])[0])
                rate, finish, out = decode_rate(exe, pkg, ids, a.tokens, ["--constraint", str(path)])
                constrained.append(rate)
                if finish == "length":   # cut by --tokens (inside a string, say): not a whole instance
                    checks.add("cut at --tokens")
                    continue
                try:
                    jsonschema.validate(json.loads(out), S.SCHEMA)
                    checks.add("yes")
                except (ValueError, jsonschema.ValidationError):
                    checks.add("NO")
            ok = ", ".join(sorted(checks))
            p, c = statistics.median(plain), statistics.median(constrained)
            print(f"| {label} | {p:.1f} | {c:.1f} | {c / p:.2f} | {(1 / c - 1 / p) * 1e6:.0f} us | {ok} |",
                  flush=True)


if __name__ == "__main__":
    main()
