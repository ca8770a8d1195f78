"""android-npu compile cost: wall time and peak RSS of `edgellm compile --target android-npu` per model, with the
NPU graphs' count, sizes and error (the manifest's npu section). Random weights are fine for time and memory; the
real checkpoint shows the error.

    python bench/npu_compile.py [--models demo,smollm2-135m,1b,3b] [--soc none|sm8650] [--max-context 4096]

1b: TinyLlama's shape (22 layers, dim 2048, ffn 5632, GQA 32/4); 3b: Llama 3.2 3B's (28 layers, dim 3072, ffn 8192,
GQA 24/8, head_dim 128), both random f16 with a 32k vocabulary. Peak RSS is the whole compile's (TVM kernels, CPU
weights, NPU calibration, quantization, EPContext), from /usr/bin/time."""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPES = {
    "1b": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
               num_attention_heads=32, num_key_value_heads=4, head_dim=64),
    "3b": dict(vocab_size=32000, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
               num_attention_heads=24, num_key_value_heads=8, head_dim=128),
}


def model_dir(name: str, work: Path, max_pos: int) -> Path:
    if name == "demo":
        return Path("demo")
    if name in SHAPES:
        from edgellm.models.synthetic import make_checkpoint

        d = work / name
        if not (d / "config.json").is_file():
            print(f"generating a random {name}-shaped checkpoint ...", file=sys.stderr, flush=True)
            make_checkpoint(d, seed=0, dtype="float16", streaming=True, max_position_embeddings=max_pos,
                            tie_word_embeddings=False, **SHAPES[name])
        return d
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from real_checkpoints import hf_folder

    return hf_folder(name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="demo,smollm2-135m,1b,3b")
    ap.add_argument("--soc", default="none")
    ap.add_argument("--max-context", type=int, default=4096)
    ap.add_argument("--work", default=None, help="keep generated checkpoints here (default: a temporary folder)")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as td:
        work = Path(a.work) if a.work else Path(td)
        work.mkdir(parents=True, exist_ok=True)
        for name in a.models.split(","):
            model = model_dir(name, work, a.max_context)
            out = Path(td) / f"{name}-npu"
            ctx = [] if name == "demo" else ["--max-context", str(a.max_context)]   # the demo holds 1024 positions
            cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "edgellm.cli", "compile", str(model), "--target",
                   "android-npu", "--soc", a.soc, "--tune", "off", *ctx, "-o", str(out)]
            t = time.perf_counter()
            r = subprocess.run(cmd, capture_output=True, text=True)
            wall = time.perf_counter() - t
            if r.returncode != 0:
                print(r.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"{name}: compile failed")
            rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1)) * 1024
            npu = json.loads((out / "manifest.json").read_text())["npu"]
            e = npu["error_vs_f32"]
            rows.append((name, wall, npu["seconds"], rss, len(npu["groups"]),
                         max(g["bytes"] for g in npu["groups"]), sum(g["bytes"] for g in npu["groups"]),
                         e["hidden_out"], e.get("hidden_out_token_median")))
            print(f"{name}: {wall:.0f} s, peak RSS {rss / 2**30:.2f} GiB", file=sys.stderr, flush=True)
    print(f"`edgellm compile --target android-npu --soc {a.soc} --tune off --max-context {a.max_context}` (demo: its "
          "1024), W8A16\n")
    print("| model | compile s (NPU part) | peak RSS GiB | graphs | largest graph MiB | all graphs MiB | "
          "hidden error vs f32 (whole / median token) |")
    print("|---|---|---|---|---|---|---|")
    for name, wall, npu_s, rss, n, big, tot, h, hm in rows:
        print(f"| {name} | {wall:.0f} ({npu_s:.0f}) | {rss / 2**30:.2f} | {n} | {big / 2**20:.0f} | {tot / 2**20:.0f} | "
              f"{100 * h:.2f}% / {100 * (hm or 0):.2f}% |")


if __name__ == "__main__":
    main()
