"""What an output constraint costs (issue 37): the grammar engine's mask per token, and decode with and without one.

    python bench/structured.py [--rounds 3] [--tokens 96]

1. Mask cost: llguidance's fill_next_token_bitmask per token while a JSON-schema matcher walks a valid instance,
   over each tokenizer at hand (the demo's 4k, SmolLM2's 49k, Gemma 3's 262k vocabulary), in microseconds.
2. Decode: the same package and prompt, unconstrained and with `response_format` json_schema, in interleaved rounds
   (bandwidth on shared hosts drifts within minutes: only same-run ratios mean anything); tokens per second after
   the first by the wall clock (the mask included) of each, and the ratio. Packages: the demo (q8) and the real SmolLM2-135M-Instruct and Gemma-3-270M GGUFs from PyPI (--quant auto),
   compiled once into --work (bench/speculative.py's packages).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40},
    "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 5},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                "required": ["city"], "additionalProperties": False}},
    "required": ["name", "year", "tags", "address"], "additionalProperties": False}
INSTANCE = {"name": "The runtime maps weights from flash", "year": 2026, "tags": ["edge", "llm", "json"],
            "address": {"city": "Zurich", "zip": "8001"}}
PROMPT = ("Extract the record as JSON (name, year, tags, address with city and zip): The runtime maps weights from "
          "flash, written in 2026, tagged edge, llm and json, from Zurich 8001.")


def packages(work: Path) -> dict[str, Path]:
    import speculative as S

    out = {"demo (4k)": S.package("demo", work), "SmolLM2-135M (49k)": S.package("smollm2-135m", work)}
    try:
        out["Gemma-3-270M (262k)"] = gemma_package(work)
    except Exception as e:  # noqa: BLE001 - a model that cannot be fetched is left out, said so
        print(f"gemma3-270m left out: {e}", file=sys.stderr)
    return out


def gemma_package(work: Path) -> Path:
    import edgellm
    import vs_llamacpp as vs
    from real_checkpoints import gguf_file

    out = work / "structured-gemma3-270m-auto.edgellm"
    stamp = vs.source_stamp(1024)
    if not ((out / "bench-stamp").is_file() and (out / "bench-stamp").read_text() == stamp):
        import shutil

        if out.exists():
            shutil.rmtree(out)
        edgellm.compile(str(gguf_file("gemma3-270m")), quant="auto", out=out, max_context=1024, progress=False,
                        verify_tokens=0)
        (out / "bench-stamp").write_text(stamp)
    return out


def mask_cost(rt) -> tuple[float, float, int]:
    """Median and 90th-percentile microseconds of one mask, over the tokens of INSTANCE."""
    from edgellm.runtime.python.constrain import Constraint, grammar_for

    c = Constraint(rt, grammar_for({"type": "json_schema", "json_schema": {"schema": SCHEMA}}))
    ids = rt.encode(json.dumps(INSTANCE, separators=(",", ":")), add_special_tokens=False)
    c.mask()   # the first mask compiles the grammar's lexer: a one-off, reported by the decode rows
    ts = []
    for t in ids:
        c.accept(t)
        t0 = time.perf_counter()
        c.mask()
        ts.append((time.perf_counter() - t0) * 1e6)
    ts.sort()
    return statistics.median(ts), ts[int(0.9 * (len(ts) - 1))], len(ts)


def timed(rt, ids, n, **kw):
    """A greedy generation and its tokens per second after the first, by the wall clock (the mask's Python side
    included: it runs between the C loop's steps, outside their timers)."""
    t0 = time.perf_counter()
    r = rt.generate(ids, max_new_tokens=n, temperature=0, ignore_eos=not kw, **kw)
    wall = time.perf_counter() - t0
    return r, (len(r.token_ids) - 1) / max(wall - r.ttft_s, 1e-9)


def prompt_ids(rt) -> list[int]:
    if rt.text.config.get("chat_template"):
        return rt.encode(rt.text.apply_chat_template([{"role": "user", "content": PROMPT}]), add_special_tokens=False)
    return rt.encode(PROMPT + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--work", default=os.path.expanduser("~/.cache/edgellm/bench"))
    a = ap.parse_args(argv)
    from edgellm.runtime.python.api import Runtime

    import vs_llamacpp as vs

    print(f"host: {vs._cpu_name()}; greedy, {a.tokens} tokens, median of {a.rounds} interleaved rounds")
    rows = []
    rf = {"type": "json_schema", "json_schema": {"schema": SCHEMA}}
    for name, pkg in packages(Path(a.work)).items():
        with Runtime.load(pkg) as rt:
            med, p90, n = mask_cost(rt)
            ids = prompt_ids(rt)
            speeds = {"off": [], "schema": []}
            valid = True
            for _ in range(a.rounds):
                plain, t_plain = timed(rt, ids, a.tokens)
                con, t_con = timed(rt, ids, a.tokens, response_format=rf)
                speeds["off"].append(t_plain)
                speeds["schema"].append(t_con)
                if con.finish_reason == "eos":
                    try:
                        json.loads(con.text)
                    except ValueError:
                        valid = False
            step_us = 1e6 / statistics.median(speeds["off"])
            rows.append((name, rt.vocab, med, p90, n, med / step_us, statistics.median(speeds["off"]),
                         statistics.median(speeds["schema"]),
                         statistics.median(c / p for c, p in zip(speeds["schema"], speeds["off"])), con.text, valid))
    print("| model (vocabulary) | mask us per token: median, p90 | % of a decode step | decode tok/s plain | "
          "with a JSON schema | ratio |")
    print("|---|---|---|---|---|---|")
    for name, _vocab, med, p90, n, share, off, sch, ratio, _, _ in rows:
        print(f"| {name} | {med:.0f}, {p90:.0f} ({n} tokens) | {100 * share:.1f}% | {off:.1f} | {sch:.1f} | "
              f"{ratio:.2f} |")
    for name, *_, text, valid in rows:
        print(f"{name}: {text[:160]!r}{'' if valid else ' (did not parse)'}")


if __name__ == "__main__":
    main()
