"""Compile time and prefill/decode speed of a ~110M-parameter Llama (dim 768, 12 layers, 12 heads, vocab 32000,
tied embeddings) in f32 and f16 on this machine, with the numpy f32 forward pass as the same-run baseline.

    python bench/spine.py [--threads 2] [--prompt-len 128] [--gen-len 64] [--work DIR]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

import edgellm
from edgellm.models import family, load_checkpoint
from edgellm.models.numpy_backend import NumpyModel
from edgellm.models.synthetic import make_checkpoint

CFG = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
           num_key_value_heads=12, head_dim=64, max_position_embeddings=2048, tie_word_embeddings=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", default=None)
    a = ap.parse_args()
    work = Path(a.work or tempfile.mkdtemp(prefix="edgellm-bench-"))
    ck = work / "llama110m"
    if not (ck / "config.json").exists():
        make_checkpoint(ck, seed=0, tokenizer=False, **CFG)
    spec, ckpt, _ = load_checkpoint(str(ck))
    n_params = sum(int(np.prod(s)) for s in family(spec).weight_shapes(spec).values())
    prompt = list(np.random.default_rng(0).integers(3, spec.vocab_size, a.prompt_len))
    rows = []
    for quant in ("f32", "f16"):
        t0 = time.perf_counter()
        pkg = edgellm.compile(str(ck), quant=quant, out=work / f"pkg-{quant}", max_context=1024, progress=False)
        t_compile = time.perf_counter() - t0
        pf, dc = [], []
        with edgellm.Runtime.load(pkg, threads=a.threads) as rt:
            rt.generate(prompt[:8], max_new_tokens=4, ignore_eos=True)  # warm up (page in weights)
            for _ in range(a.rounds):
                r = rt.generate(prompt, max_new_tokens=a.gen_len + 1, ignore_eos=True)
                pf.append(r.prefill_tokens_per_s)
                dc.append(r.decode_tokens_per_s)
        wbytes = (pkg / "weights.bin").stat().st_size
        rows.append((quant, t_compile, max(pf), max(dc), wbytes / 2**20, wbytes * max(dc) / 1e9))
    # same-run baseline: numpy (OpenBLAS) f32 decode of one token with the float32 reference backend
    ref = NumpyModel(spec, ckpt.get, dtype=np.float32)
    ref.forward(prompt[:16])
    t0 = time.perf_counter()
    for t in prompt[16:24]:
        ref.forward([t])
    np_decode = 8 / (time.perf_counter() - t0)
    print(f"\n~{n_params / 1e6:.0f}M-parameter Llama (dim 768, 12 layers, vocab 32000), {a.threads} threads, "
          f"prompt {a.prompt_len}, generate {a.gen_len}, best of {a.rounds}")
    print("| weights | compile s | prefill tok/s | decode tok/s | weights MiB | weight GB/s in decode | decode vs numpy f32 |")
    print("|---|---|---|---|---|---|---|")
    for q, tc, p, d, mb, gbs in rows:
        print(f"| {q} | {tc:.1f} | {p:.1f} | {d:.1f} | {mb:.0f} | {gbs:.1f} | {d / np_decode:.2f}x |")
    print(f"numpy f32 reference decode: {np_decode:.1f} tok/s (the unoptimized float oracle, not a speed baseline)")


if __name__ == "__main__":
    main()
