"""`edgellm serve` under load: throughput and latency against the number of concurrent streaming clients.

    python bench/serve.py [--model demo] [--quant q8] [--slots 4] [--concurrency 1,2,4,8] [--requests 16]
                          [--max-tokens 64] [--threads N]

Starts the server on 127.0.0.1 (a free port) with --parallel SLOTS, then for each concurrency level C runs C
clients that each stream REQUESTS/C completions (distinct prompts, greedy, --max-tokens tokens, end-of-sequence
ignored so every request generates the same count). Per level: aggregate generated tok/s, per-request decode tok/s,
time to first token p50/p99, request latency p50, and the aggregate throughput as a ratio to concurrency 1 measured
in the same run. Prefix reuse is off the table here: every prompt differs from its first token."""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
WORDS = ["parse", "sort", "open", "read", "write", "merge", "split", "count", "load", "save", "find", "build",
         "check", "print", "join", "send"]


def start(pkg: str, slots: int, threads: int | None) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "edgellm.cli", "serve", pkg, "--port", "0", "--parallel", str(slots)]
    if threads:
        cmd += ["--threads", str(threads)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    m = re.search(r"on (http://\S+) ", p.stdout.readline())
    if not m:
        p.kill()
        sys.exit("the server did not start")
    return p, m.group(1)


def one(url: str, prompt: str, max_tokens: int) -> dict:
    t0 = time.perf_counter()
    first = None
    n = 0
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            msg = json.loads(line[6:])
            if msg["choices"] and msg["choices"][0]["text"] and first is None:
                first = time.perf_counter() - t0
            if msg.get("usage"):
                n = msg["usage"]["completion_tokens"]
                timings = msg["timings"]
    return {"ttft": first or 0.0, "latency": time.perf_counter() - t0, "tokens": n,
            "decode_tps": timings["predicted_per_second"]}


def level(url: str, c: int, requests: int, max_tokens: int, offset: int) -> dict:
    per_client = max(1, requests // c)
    results: list[dict] = []
    lock = threading.Lock()

    def client(k: int):
        for j in range(per_client):
            i = offset + k * per_client + j
            r = one(url, f"{WORDS[i % len(WORDS)]} {i}: def f{i}(x):", max_tokens)
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=client, args=(k,)) for k in range(c)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    ttft = sorted(r["ttft"] for r in results)
    return {"concurrency": c, "requests": len(results), "tok_s": sum(r["tokens"] for r in results) / wall,
            "req_decode_tps": statistics.median(r["decode_tps"] for r in results),
            "ttft_p50": statistics.median(ttft), "ttft_p99": ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))],
            "latency_p50": statistics.median(r["latency"] for r in results)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--quant", default="q8")
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--requests", type=int, default=16, help="requests per concurrency level")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args(argv)
    from edgellm.compiler.cache import package_or_model

    pkg = str(package_or_model(a.model, quant=a.quant))
    levels = [int(x) for x in a.concurrency.split(",")]
    p, url = start(pkg, a.slots, a.threads)
    try:
        level(url, 1, 2, 8, 10_000)   # warm-up: first-touch of the weights, the server's imports
        rows, offset = [], 0
        for c in levels:
            rows.append(level(url, c, a.requests, a.max_tokens, offset))
            offset += a.requests
    finally:
        p.terminate()
        p.wait(timeout=30)
    base = rows[0]["tok_s"]
    print(f"edgellm serve, {a.model} {a.quant}, {a.slots} slots, {a.requests} requests x {a.max_tokens} tokens per level")
    print(f"{'clients':>7} {'requests':>8} {'tok/s':>9} {'vs 1':>6} {'req dec tok/s':>13} {'TTFT p50':>9} {'TTFT p99':>9} "
          f"{'latency p50':>11}")
    for r in rows:
        print(f"{r['concurrency']:>7} {r['requests']:>8} {r['tok_s']:>9.1f} {r['tok_s'] / base:>5.2f}x "
              f"{r['req_decode_tps']:>13.1f} {1e3 * r['ttft_p50']:>7.1f}ms {1e3 * r['ttft_p99']:>7.1f}ms "
              f"{1e3 * r['latency_p50']:>9.1f}ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
