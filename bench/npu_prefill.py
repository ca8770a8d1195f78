"""android-npu on the HTP emulator: does prefill on the NPU change what the model says?

For each NPU weight scheme (w8a16, w4a16) it compiles demo-llama with --target android-npu, then over prompts from
the held-out text (never seen in training or calibration):
  - agreement: the 32 greedy tokens after an NPU prefill (then decode on the CPU in float) equal the CPU-only run's
    (prefill and decode in float): the rate and the first divergence positions;
  - logits error of the prompt's last token against the CPU f32 path;
  - perplexity of the held-out text with every token's logits from NPU prefill, against CPU f32;
  - the compile's own error table (K/V per layer against f32) and package sizes per SoC.
The CPU side is the f32 numpy reference, which the compiled CPU kernels match to ~1e-5 (tests/test_pipeline.py).
Emulator timings are printed, flagged: the x86 emulator's speed says nothing about a phone's NPU.

    python bench/npu_prefill.py [--prompts 50] [--gen 32] [--schemes w8a16,w4a16]"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

import edgellm
from edgellm.models import load_checkpoint
from edgellm.models.demo import HELDOUT, demo_path
from edgellm.models.numpy_backend import NumpyModel
from edgellm.runtime.npu_prefill import NpuPrefill


def prompts(tok, n: int, rng) -> list[list[int]]:
    ids = tok.encode(HELDOUT.read_text()).ids
    lens = rng.integers(8, 160, n)
    starts = rng.integers(0, len(ids) - 200, n)
    return [ids[s:s + L] for s, L in zip(starts, lens)]


def agreement(npu: NpuPrefill, ref: NumpyModel, ps, gen: int):
    same, firsts, errs, secs = 0, [], [], 0.0
    for p in ps:
        t = time.perf_counter()
        h, r = npu.prefill(p)
        secs += time.perf_counter() - t
        last = npu.logits(h[-1:])[0]
        cpu_logits = ref.logits(p)[-1]
        errs.append(float(np.linalg.norm(last - cpu_logits) / np.linalg.norm(cpu_logits)))
        a = ref.greedy_from_cache(r.k, r.v, len(p), last, gen)
        b = ref.greedy(p, gen)
        if a == b:
            same += 1
        else:
            firsts.append(next(i for i, (x, y) in enumerate(zip(a, b)) if x != y))
    return same / len(ps), firsts, errs, secs


def perplexity(npu: NpuPrefill, ref: NumpyModel, ids, window: int):
    nll_n, nll_c, n = 0.0, 0.0, 0
    for s in range(0, len(ids) - 1, window):
        w = ids[s:s + window + 1]
        if len(w) < 2:
            break
        h, _ = npu.prefill(w[:-1])
        for lg, acc in ((npu.logits(h), "n"), (ref.logits(w[:-1]), "c")):
            lg = lg - lg.max(-1, keepdims=True)
            lp = lg - np.log(np.exp(lg).sum(-1, keepdims=True))
            v = -float(lp[np.arange(len(w) - 1), w[1:]].sum())
            if acc == "n":
                nll_n += v
            else:
                nll_c += v
        n += len(w) - 1
    return float(np.exp(nll_n / n)), float(np.exp(nll_c / n)), n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--schemes", default="w8a16,w4a16")
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--ppl-tokens", type=int, default=1024)
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args()
    from tokenizers import Tokenizer

    model = demo_path("demo")
    spec, ck, _ = load_checkpoint(model)
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    ref = NumpyModel(spec, lambda n: np.asarray(ck.get(n), np.float32), np.float32)
    ps = prompts(tok, a.prompts, np.random.default_rng(0))
    heldout = tok.encode(HELDOUT.read_text()).ids[:a.ppl_tokens + 1]
    results = {}
    with tempfile.TemporaryDirectory() as td:
        for scheme in a.schemes.split(","):
            t = time.perf_counter()
            pkg = edgellm.compile(str(model), target="android-npu", out=Path(td) / scheme, max_context=512,
                                  npu_chunk=a.chunk, npu_quant=scheme, progress=False)
            compile_s = time.perf_counter() - t
            npu = NpuPrefill(pkg, soc="sm8650")
            rate, firsts, errs, secs = agreement(npu, ref, ps, a.gen)
            ppl_npu, ppl_cpu, n = perplexity(npu, ref, heldout, 256)
            man = npu.manifest["npu"]
            results[scheme] = {"agreement": rate, "first_divergence": sorted(firsts),
                               "last_logits_rel_err_median": float(np.median(errs)),
                               "last_logits_rel_err_max": float(np.max(errs)),
                               "ppl_npu": ppl_npu, "ppl_cpu_f32": ppl_cpu, "ppl_tokens": n,
                               "compile_s": round(compile_s, 1), "emulator_prefill_s": round(secs, 1),
                               "error_vs_f32": man["error_vs_f32"],
                               "graph_bytes": sum(g["bytes"] for g in man["groups"]),
                               "soc_bytes": {s: v["bytes"] for s, v in man["socs"].items()}}
    print(f"demo-llama, {a.prompts} held-out prompts of 8-159 tokens, NPU chunk {a.chunk}, {a.gen} greedy tokens; "
          "CPU = f32 reference\n")
    print("| NPU weights | same 32 tokens | first divergence at | last-token logits rel. err (median / max) | "
          "perplexity NPU | perplexity CPU f32 | graphs MiB | EPContext MiB per SoC |")
    print("|---|---|---|---|---|---|---|---|")
    for s, r in results.items():
        soc = ", ".join(f"{k} {v / 2**20:.1f}" for k, v in r["soc_bytes"].items())
        print(f"| {s} | {100 * r['agreement']:.0f}% | {r['first_divergence'] or '-'} | "
              f"{r['last_logits_rel_err_median']:.4f} / {r['last_logits_rel_err_max']:.4f} | {r['ppl_npu']:.3f} | "
              f"{r['ppl_cpu_f32']:.3f} | {r['graph_bytes'] / 2**20:.1f} | {soc} |")
    print("\nK / V rel. L2 error per layer against the f32 graphs (compile-time table):")
    for s, r in results.items():
        e = r["error_vs_f32"]
        print(f"  {s}: " + "  ".join(f"L{x['layer']} {x['k']:.4f}/{x['v']:.4f}" for x in e["layers"]) +
              f"  | hidden out {e['hidden_out']:.4f}")
    print("\nemulator (x86 HTP simulation; NOT a speed number): " +
          ", ".join(f"{s} {r['emulator_prefill_s']} s for {a.prompts} prompts, compile {r['compile_s']} s"
                    for s, r in results.items()))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
