"""android-npu on the HTP emulator: does prefill on the NPU change what the model says?

For each NPU weight scheme (w8a16, w4a16) it compiles demo-llama for host-npu (this machine's CPU kernels in f32 plus
the android-npu graphs, so libedgellm's own QNN backend runs them, on the HTP emulator of onnxruntime-qnn), then over
prompts from the held-out text (never seen in training or calibration) compares the same package run two ways,
Runtime.load(prefill_backend="npu") against prefill_backend="cpu" (f32 kernels):
  - agreement: the 32 greedy tokens after an NPU prefill (decode on the CPU) equal the CPU-only run's: the rate and
    the first divergence positions;
  - the logits of the prompt's last token: relative L2 error against the CPU f32 path;
  - perplexity of the held-out text with every token's logits from NPU prefill, against CPU f32;
  - the compile's own error table (K/V per layer against the float graphs), graph and EPContext sizes.
Emulator timings are printed, flagged: the x86 emulator's speed says nothing about a phone's NPU.

w4a16-gptq compiles the CPU side as q4g32 with --gptq and the NPU graphs reuse its codes: its CPU column is those
q4g32 kernels, not f32.

    python bench/npu_prefill.py [--prompts 50] [--gen 32] [--schemes w8a16,w4a16,w4a16-gptq]"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

import edgellm
from edgellm.models.demo import HELDOUT, demo_path
from edgellm.runtime.perplexity import nll_sum


def prompts(tok, n: int, rng) -> list[list[int]]:
    ids = tok.encode(HELDOUT.read_text()).ids
    lens = rng.integers(8, 160, n)
    starts = rng.integers(0, len(ids) - 200, n)
    return [ids[s:s + L] for s, L in zip(starts, lens)]


def agreement(npu, cpu, ps, gen: int):
    same, firsts, errs, secs = 0, [], [], 0.0
    for p in ps:
        t = time.perf_counter()
        last = npu.logits(p)[-1]
        secs += time.perf_counter() - t
        want = cpu.logits(p)[-1]
        errs.append(float(np.linalg.norm(last - want) / np.linalg.norm(want)))
        a = npu.generate(p, max_new_tokens=gen, temperature=0, ignore_eos=True).token_ids
        b = cpu.generate(p, max_new_tokens=gen, temperature=0, ignore_eos=True).token_ids
        if a == b:
            same += 1
        else:
            firsts.append(next(i for i, (x, y) in enumerate(zip(a, b)) if x != y))
    return same / len(ps), firsts, errs, secs


def perplexity(rt, ids, window: int) -> tuple[float, int]:
    """Non-overlapping windows of window + 1 tokens, each scoring its last `window` (edgellm eval's windows)."""
    nll, n = nll_sum(rt.logits, ids, window + 1, window)
    return float(np.exp(nll / n)), n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--schemes", default="w8a16,w4a16,w4a16-gptq")
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--ppl-tokens", type=int, default=1024)
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args()
    from tokenizers import Tokenizer

    model = demo_path("demo")
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    ps = prompts(tok, a.prompts, np.random.default_rng(0))
    heldout = tok.encode(HELDOUT.read_text()).ids[:a.ppl_tokens + 1]
    results = {}
    with tempfile.TemporaryDirectory() as td:
        for scheme in a.schemes.split(","):
            t = time.perf_counter()
            gptq = scheme.endswith("-gptq")   # the CPU package q4g32 with GPTQ, whose codes the NPU graphs reuse
            pkg = edgellm.compile(str(model), target="host-npu", quant="q4g32" if gptq else "f32", gptq=gptq,
                                  out=Path(td) / scheme, max_context=512, npu_chunk=a.chunk,
                                  npu_quant=scheme.removesuffix("-gptq"), progress=False)
            compile_s = time.perf_counter() - t
            with edgellm.Runtime.load(pkg, prefill_backend="npu", npu_soc="sm8650") as npu, \
                    edgellm.Runtime.load(pkg, prefill_backend="cpu") as cpu:
                assert npu.prefill_backend == "npu", npu.prefill_backend_note
                rate, firsts, errs, secs = agreement(npu, cpu, ps, a.gen)
                ppl_npu, n = perplexity(npu, heldout, 256)
                ppl_cpu, _ = perplexity(cpu, heldout, 256)   # -gptq: the q4g32 GPTQ kernels, not f32
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
          "NPU = libedgellm's QNN backend on the HTP emulator, CPU = the same package's f32 kernels (q4g32 GPTQ for "
          "w4a16-gptq)\n")
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
