"""edgellm vs llama.cpp on the same GGUF file and text: token ids, top-1 agreement and perplexity (issue 35).

    python bench/llamacpp_agreement.py --gguf FILE [FILE ...] [--text FILE] [--ctx 512] [--chunks 4] [--json]

Per file:
1. compiles it with `edgellm compile FILE --quant auto` (the file's Q8_0 / Q4_0 / Q4_1 / Q4_K blocks kept, other
   types requantized: `edgellm info` lists which; `--quant` compares another scheme) into work/packages/, as the
   speed bench does;
2. tokens: llama.cpp's `llama-tokenize` of the text against the package's tokenizer, both the C tokenizer
   (tokenizer.bin, what bin/edgellm-run uses) and tokenizer.json through Hugging Face `tokenizers`;
3. perplexity, llama.cpp's way (`llama-perplexity -c CTX`): the text's tokens cut into chunks of CTX, each chunk's
   first token replaced by BOS where the model adds one, and the negative log-likelihood of the tokens the second
   half of each chunk predicts (CTX/2 - 1 per chunk); llama.cpp's own figures from `llama-perplexity
   --kl-divergence-base`, which also saves its log-probabilities per position: edgellm's top-1 token is compared with
   llama.cpp's at every one of those positions (near-ties, where llama.cpp's two best log-probabilities are within
   its 16-bit storage step, are counted and reported, not failed);
4. prints a table: tokens identical, positions, top-1 agreement, both perplexities and their ratio.

llama.cpp's tools are built once from PyPI's llama-cpp-python sdist (bench/vs_llamacpp.py, cached in --work;
without AMX where the host has it: that code crashes on Q8_0 / Q4_0 files).
The default text is Debian's /usr/share/common-licenses/GPL-3 (English prose, ~8k tokens), else this README.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import vs_llamacpp as vs  # noqa: E402

TOOLS = ("llama-tokenize", "llama-perplexity")


def default_text() -> Path:
    gpl = Path("/usr/share/common-licenses/GPL-3")
    return gpl if gpl.is_file() else HERE.parent / "README.md"


def compile_auto(gguf: Path, work: Path, max_context: int, quant: str = "auto") -> Path:
    """The file compiled with --quant auto, or `quant` (cached in work/packages like the speed bench's packages)."""
    pkg, why, _ = vs.compile_package(work, gguf, quant, max_context, "off")
    if pkg is None:
        raise RuntimeError(f"edgellm compile {gguf.name} --quant {quant} failed: {why}")
    return pkg


def llama_tokens(tokenize: Path, gguf: Path, text: Path) -> list[int]:
    p = subprocess.run([str(tokenize), "-m", str(gguf), "-f", str(text), "--ids", "--log-disable"],
                       capture_output=True, text=True, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def llama_perplexity(perplexity: Path, gguf: Path, text: Path, ctx: int, chunks: int, threads: int,
                     base: Path) -> float:
    """llama.cpp's perplexity estimate; its per-position log-probabilities land in `base`. Its log goes through a
    thread that now and then drops its last lines at exit (seen: exit 0 and neither the running estimates nor the
    final one printed: 1 run in 15 idle, 3 in 20 with both cores busy, on these tiny files; llama.cpp leaks its logger
    by design, so nothing flushes it): run again, up to 6 times."""
    for _ in range(6):
        p = subprocess.run([str(perplexity), "-m", str(gguf), "-f", str(text), "-c", str(ctx), "-b", str(ctx),
                            "--chunks", str(chunks), "-t", str(threads), "--kl-divergence-base", str(base)],
                           capture_output=True, text=True)
        for line in (p.stdout + p.stderr).splitlines():
            if "Final estimate: PPL =" in line:
                return float(line.split("=")[1].split()[0])
        running = re.findall(r"\[(\d+)\]([0-9.eE+-]+|inf|nan),", p.stdout + p.stderr)
        if p.returncode == 0 and running and int(running[-1][0]) == chunks:
            return float(running[-1][1])   # the running estimate after the last chunk: the same number
        if p.returncode != 0:
            break
    raise RuntimeError(f"llama-perplexity printed no estimate (exit {p.returncode}):\n{p.stderr[-2000:]}")


NEAR_TIE = 0.25   # nats between llama.cpp's two best log-probabilities


def read_base(base: Path) -> tuple[int, int, np.ndarray, np.ndarray, np.ndarray]:
    """llama.cpp's --kl-divergence-base file: n_ctx, n_chunk, the tokens, and per scored position its top-1 token
    and whether that is a near-tie (its two best log-probabilities within NEAR_TIE: llama.cpp's own arithmetic, Q8_0
    activations and all, moves logits by up to ~0.35 from the exact model's, so below that either may come first)."""
    b = base.read_bytes()
    assert b[:8] == b"_logits_", base
    n_ctx, n_vocab, n_chunk = np.frombuffer(b, np.int32, 3, 8)
    at = 20
    tokens = np.frombuffer(b, np.int32, n_ctx * n_chunk, at)
    at += 4 * n_ctx * n_chunk
    nv = 2 * ((n_vocab + 1) // 2) + 4
    per_chunk = n_ctx - 1 - n_ctx // 2
    rows = np.frombuffer(b, np.uint16, n_chunk * per_chunk * nv, at).reshape(-1, nv)
    codes = rows[:, 4:4 + n_vocab]
    top = codes.argmax(axis=1)
    two = np.partition(codes, -2, axis=1)[:, -2:].astype(np.float64)
    scale = rows[:, :2].copy().view(np.float32)[:, 0]            # the row's log-prob per code step
    tie = (two[:, 1] - two[:, 0]) * scale < NEAR_TIE
    return int(n_ctx), int(n_chunk), tokens, top, tie


def edgellm_side(pkg: Path, tokens: np.ndarray, n_ctx: int, n_chunk: int, bos: int | None, threads: int):
    """Mean negative log-likelihood (the log of the perplexity) and top-1 tokens of the package over llama.cpp's
    chunks (same positions)."""
    from edgellm.runtime.python.api import Runtime

    first, nll, tops = n_ctx // 2, [], []
    with Runtime.load(pkg, threads=threads) as rt:
        for i in range(n_chunk):
            chunk = tokens[i * n_ctx:(i + 1) * n_ctx].copy()
            if bos is not None:
                chunk[0] = bos
            lg = rt.logits(chunk.tolist())[first:n_ctx - 1].astype(np.float64)
            m = lg.max(axis=1, keepdims=True)
            logz = (m[:, 0] + np.log(np.exp(lg - m).sum(axis=1)))
            nll += list(logz - lg[np.arange(len(lg)), chunk[first + 1:n_ctx]])
            tops += list(lg.argmax(axis=1))
    return float(np.mean(nll)), np.array(tops)


def package_tokens(pkg: Path, text: str) -> tuple[list[int], list[int]]:
    """The C tokenizer's ids and tokenizers' ids of tokenizer.json (both with the model's special tokens)."""
    from tokenizers import Tokenizer

    from edgellm.runtime.python.api import Runtime

    with Runtime.load(pkg) as rt:
        assert rt.c_text, f"{pkg}: no C tokenizer"
        c_ids = rt.encode(text)
    return c_ids, Tokenizer.from_file(str(pkg / "tokenizer.json")).encode(text).ids


def measure(gguf: Path, text: Path, work: Path, ctx: int, chunks: int, threads: int, tools, quant: str = "auto") -> dict:
    tokenize, perplexity = tools
    pkg = compile_auto(gguf, work, ctx, quant)
    manifest = json.loads((pkg / "manifest.json").read_text())
    want = llama_tokens(tokenize, gguf, text)
    c_ids, hf_ids = package_tokens(pkg, text.read_text())
    base = work / "agreement" / f"{gguf.stem}-{ctx}x{chunks}.kld"
    base.parent.mkdir(parents=True, exist_ok=True)
    vs.log(f"llama-perplexity {gguf.name} -c {ctx} --chunks {chunks} ...")
    ppl_llama = llama_perplexity(perplexity, gguf, text, ctx, chunks, threads, base)
    n_ctx, n_chunk, tokens, top_llama, tie = read_base(base)
    bos = manifest["model"]["config"].get("bos_token_id") if want and want[0] == tokens[0] and \
        want[0] == manifest["model"]["config"].get("bos_token_id") else None
    vs.log(f"edgellm over the same {n_chunk} chunks ...")
    nll_ours, top_ours = edgellm_side(pkg, tokens, n_ctx, n_chunk, bos, threads)
    nll_llama = math.log(ppl_llama)
    same = top_ours == top_llama
    return {"file": gguf.name, "quant": manifest["quant"]["scheme"],
            "source": manifest["quant"].get("source_types"), "text_tokens": len(want),
            "c_tokens_equal": c_ids == want, "hf_tokens_equal": hf_ids == want,
            "positions": int(same.size), "top1_agree": float(same.mean()),
            "clear_positions": int((~tie).sum()), "top1_agree_clear": float(same[~tie].mean()),
            "disagree_near_ties": int((~same & tie).sum()), "disagree_other": int((~same & ~tie).sum()),
            "ppl_llamacpp": ppl_llama, "ppl_edgellm": math.exp(min(nll_ours, 709.0)),   # a random model's may overflow
            "ppl_ratio": math.exp(nll_ours - nll_llama), "nll_llamacpp": nll_llama, "nll_edgellm": nll_ours}


def table(rows: list[dict]) -> str:
    out = ["| file | edgellm scheme | ids = llama-tokenize (C / HF) | top-1 agreement, all positions | "
           f"outside near-ties (< {NEAR_TIE} nats) | ppl llama.cpp | ppl edgellm | ratio |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['file']} | {r['quant']} | {'yes' if r['c_tokens_equal'] else 'NO'} / "
                   f"{'yes' if r['hf_tokens_equal'] else 'NO'} ({r['text_tokens']} tokens) | "
                   f"{100 * r['top1_agree']:.2f}% of {r['positions']} | {100 * r['top1_agree_clear']:.2f}% of "
                   f"{r['clear_positions']} | {r['ppl_llamacpp']:.4f} | {r['ppl_edgellm']:.4f} | {r['ppl_ratio']:.4f} |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", nargs="+", required=True, metavar="FILE")
    ap.add_argument("--text", default=None, help="[default: /usr/share/common-licenses/GPL-3, else README.md]")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--quant", default="auto", help="the scheme edgellm compiles each file with [default: auto]")
    ap.add_argument("--work", default=os.path.expanduser("~/.cache/edgellm/bench"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    work = Path(a.work)
    # its AMX code crashes on Q8_0 / Q4_0 files (bench/vs_llamacpp.py, NO_AMX): a build without it where the host has it
    tools = vs.build_llamacpp(work, a.jobs, amx=not vs.host_has_amx(), targets=TOOLS)
    text = Path(a.text) if a.text else default_text()
    rows = [measure(Path(g), text, work, a.ctx, a.chunks, a.threads, tools, a.quant) for g in a.gguf]
    return vs.report(f"text: {text} ({a.chunks} chunks of {a.ctx})", table(rows), rows, a.json)


if __name__ == "__main__":
    main()
