"""Quantization quality: held-out perplexity of the demo models compiled with every scheme, through the C runtime.

    python bench/quant_quality.py [--max-tokens N] [--context 256] [--work DIR] [--json]

Rows: demo-llama in f32, f16, q8, q4g32 RTN (also with a q6 and a q4g32 embedding/head), q4g32 GPTQ, q4g64 RTN,
q4g128 RTN, q4g128 GPTQ, t2 post-training, and demo-bitnet's native ternary package (q8, q6 and q4g32
embedding/head). Each
row gives perplexity, its change vs f32, the mean KL divergence of its next-token distribution from the f32
package's (demo-llama rows; on the first --kl-tokens tokens: perplexity alone cannot rank schemes whose loss is
within noise), bits per weight and the weight bytes. Non-overlapping windows of
the models' training context (256) over the shipped held-out text.
"""
from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np

import edgellm
from edgellm.models.demo import HELDOUT
from edgellm.runtime.python.perplexity import perplexity


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return (x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))).astype(np.float32)


def window_logprobs(rt, ids, context: int) -> np.ndarray:
    return np.concatenate([log_softmax(rt.logits(ids[b:b + context])) for b in range(0, len(ids), context)])

ROWS = [  # label, model, compile kwargs
    ("f32", "demo-llama", {"quant": "f32"}),
    ("f16", "demo-llama", {"quant": "f16"}),
    ("q8", "demo-llama", {"quant": "q8"}),
    ("q4g32 RTN", "demo-llama", {"quant": "q4g32"}),
    ("q4g32 RTN, q6 head", "demo-llama", {"quant": "q4g32", "head_quant": "q6"}),
    ("q4g32 RTN, q4g32 head", "demo-llama", {"quant": "q4g32", "head_quant": "q4g32"}),
    ("q4g32 GPTQ", "demo-llama", {"quant": "q4g32", "gptq": True}),
    ("q4g64 RTN", "demo-llama", {"quant": "q4g64"}),
    ("q4g128 RTN", "demo-llama", {"quant": "q4g128"}),
    ("q4g128 GPTQ", "demo-llama", {"quant": "q4g128", "gptq": True}),
    ("t2 post-training", "demo-llama", {"quant": "t2"}),
    ("t2 native (demo-bitnet)", "demo-bitnet", {"quant": "t2"}),
    ("t2 native, q6 head (demo-bitnet)", "demo-bitnet", {"quant": "t2", "head_quant": "q6"}),
    ("t2 native, q4g32 head (demo-bitnet)", "demo-bitnet", {"quant": "t2", "head_quant": "q4g32"}),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-tokens", type=int, default=None, help="score only the first N held-out tokens")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--kl-tokens", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    work = Path(a.work or tempfile.mkdtemp(prefix="edgellm-qq-"))
    text = HELDOUT.read_text()
    res, ref_lp = [], None
    for label, model, kw in ROWS:
        t0 = time.perf_counter()
        pkg = edgellm.compile(model, out=work / label.replace(" ", "_").replace("(", "").replace(")", "").replace(",", ""),
                              max_context=a.context, progress=False, **kw)
        tc = time.perf_counter() - t0
        man = json.loads((pkg / "manifest.json").read_text())
        kl = None
        with edgellm.Runtime.load(pkg, threads=a.threads) as rt:
            r = perplexity(rt, text, a.context, a.context, a.max_tokens)
            if model == "demo-llama":
                lp = window_logprobs(rt, rt.text.encode(text)[:a.kl_tokens], a.context)
                if ref_lp is None:
                    ref_lp = lp
                kl = float((np.exp(ref_lp) * (ref_lp - lp)).sum(-1).mean())
        res.append({"label": label, "model": model, "ppl": r["ppl"], "tokens": r["tokens"], "compile_s": tc, "kl": kl,
                    "bits_per_weight": man["quant"]["bits_per_weight"],
                    "weight_mb": sum(t["nbytes"] for t in man["tensors"]) / 1e6})
        print(f"  {label}: ppl {r['ppl']:.3f} ({tc:.1f} s compile)", flush=True)
    base = next(r["ppl"] for r in res if r["label"] == "f32")
    if a.json:
        print(json.dumps(res))
        return
    print(f"\nheld-out perplexity, {res[0]['tokens']} tokens, windows of {a.context}")
    print("| package | perplexity | vs f32 | KL to f32 (nats/token) | bits/weight (all weights) | weights MB |")
    print("|---|---|---|---|---|---|")
    for r in res:
        rel = f"{100 * (r['ppl'] / base - 1):+.2f}%" if r["model"] == "demo-llama" else "(other model)"
        kl = f"{r['kl']:.2e}" if r["kl"] is not None else "-"
        print(f"| {r['label']} | {r['ppl']:.2f} | {rel} | {kl} | {r['bits_per_weight']:.2f} | {r['weight_mb']:.2f} |")
    assert all(math.isfinite(r["ppl"]) for r in res)


if __name__ == "__main__":
    main()
