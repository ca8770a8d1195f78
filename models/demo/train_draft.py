"""Train demo-draft: a tiny draft model for speculative decoding with the demo family (issue 36), offline.

    python -m edgellm.models.demo.train_draft [--steps N] [--out models/demo] [--seed 0]

It shares demo-llama's tokenizer (copied from the shipped demo-llama, not retrained), so it can draft for
demo-llama and demo-moe: `edgellm run PKG --speculate DRAFT_PKG`. Distilled from the shipped demo-llama on the same
corpus split as the demo models (train.py): the loss is the KL divergence from demo-llama's next-token distribution,
since a draft is worth what it agrees with its target. LlamaForCausalLM, hidden 64, 2 layers, 4 heads / 2 KV heads,
FFN 192, tied embeddings: ~0.36M parameters (most of them the 4096-token embedding). results.json ("draft") records
held-out perplexity and how often its top token is demo-llama's.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import time
from pathlib import Path

from edgellm.quant.corpus import build_corpus, split_corpus

from .train import CTX, THREADS, dir_size, encode_docs, finalize_dir, log, windows

HERE = Path(__file__).resolve().parent
TARGET = "demo-llama"
DIR = "demo-draft"
STEPS, BATCH, LR, WD, WARMUP = 500, 16, 4e-3, 0.05, 30


def make_draft(vocab: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, hidden_act="silu", max_position_embeddings=1024,
                      rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0,
                      initializer_range=0.02, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    return LlamaForCausalLM(cfg)


def agreement(draft, target, ids, batch=16) -> tuple[float, float]:
    """Held-out: the draft's mean NLL (nats/token) and the share of positions where its top token is the target's."""
    import torch
    import torch.nn.functional as F

    x, y = windows(ids)
    nll, same, n = 0.0, 0, 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            xb, yb = x[i:i + batch], y[i:i + batch]
            d = draft(input_ids=xb, use_cache=False).logits.float()
            t = target(input_ids=xb, use_cache=False).logits.float()
            nll += F.cross_entropy(d.reshape(-1, d.shape[-1]), yb.reshape(-1), reduction="sum").item()
            same += int((d.argmax(-1) == t.argmax(-1)).sum())
            n += yb.numel()
    return nll / n, same / n


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--out", default=str(HERE))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)

    import torch
    import torch.nn.functional as F
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(THREADS)
    out = Path(a.out)
    src = HERE / TARGET
    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    train_docs, held_docs = split_corpus(build_corpus())
    train_ids = encode_docs(tok, train_docs)
    held_ids = tok.encode((HERE / "heldout.txt").read_text(encoding="utf-8"), add_special_tokens=False).ids
    target = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    for p in target.parameters():
        p.requires_grad_(False)

    torch.manual_seed(a.seed)
    random.seed(a.seed)
    draft = make_draft(target.config.vocab_size)
    params = sum(p.numel() for p in draft.parameters())
    log(f"[draft] params {params:,}; distilling {TARGET} over {a.steps} steps")
    g = torch.Generator().manual_seed(a.seed + 1)
    data = torch.tensor(train_ids, dtype=torch.long)
    decay = [p for n, p in draft.named_parameters() if p.dim() >= 2 and "embed" not in n]
    rest = [p for n, p in draft.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": rest, "weight_decay": 0.0}], lr=LR,
                            betas=(0.9, 0.95))
    t0 = time.time()
    for step in range(a.steps):
        lr = LR * (step + 1) / WARMUP if step < WARMUP else \
            LR * (0.1 + 0.45 * (1 + math.cos(math.pi * (step - WARMUP) / max(1, a.steps - WARMUP))))
        for grp in opt.param_groups:
            grp["lr"] = lr
        starts = torch.randint(0, len(data) - CTX - 1, (BATCH,), generator=g)
        xb = torch.stack([data[s:s + CTX] for s in starts])
        with torch.no_grad():
            teacher = F.log_softmax(target(input_ids=xb, use_cache=False).logits.float(), -1)
        student = F.log_softmax(draft(input_ids=xb, use_cache=False).logits.float(), -1)
        loss = F.kl_div(student.reshape(-1, student.shape[-1]), teacher.reshape(-1, teacher.shape[-1]),
                        log_target=True, reduction="batchmean")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == a.steps - 1:
            log(f"[draft] step {step + 1}/{a.steps} KL {loss.item():.3f} lr {lr:.2e} {time.time() - t0:.0f}s")
    draft.eval()

    d = out / DIR
    if d.exists():
        shutil.rmtree(d)
    draft.to(torch.bfloat16).save_pretrained(d)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(src / f, d / f)
    shipped = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    nll, agree = agreement(shipped, target, held_ids)
    log(f"[draft] shipped: held-out ppl {math.exp(nll):.1f}, top-1 equal to {TARGET}'s at {agree:.1%} of positions")
    r = {"arch": "LlamaForCausalLM", "params_total": params, "steps": a.steps, "batch": BATCH, "ctx": CTX, "lr": LR,
         "seed": a.seed, "distilled_from": TARGET, "wall_s": time.time() - t0, "heldout_loss": nll,
         "heldout_ppl": math.exp(nll), "top1_agreement_with_target": agree}
    (d / "README.md").write_text(
        f"# {DIR}\n\nA tiny draft model for edgellm's speculative decoding with the bundled demo models "
        f"(`--speculate` with its package). `LlamaForCausalLM`, hidden 64, 2 layers, 4 heads / 2 KV heads, FFN 192, "
        f"tied embeddings, {params:,} parameters, demo-llama's tokenizer. Distilled from demo-llama (KL divergence "
        f"from its next-token distribution, {a.steps} steps of 16 x {CTX} tokens of the demo corpus; see "
        f"`models/demo/train_draft.py`). Held-out perplexity {math.exp(nll):.1f}; its top token is demo-llama's at "
        f"{agree:.1%} of held-out positions. License: apache-2.0 (training data: PSF-2.0).\n")
    r["size_bytes"] = dir_size(d)
    finalize_dir(d)
    results = out / "results.json"
    doc = json.loads(results.read_text()) if results.is_file() else {}
    doc.setdefault("models", {})["draft"] = r
    results.write_text(json.dumps(doc, indent=2) + "\n")
    log(f"[draft] wrote {d} ({r['size_bytes'] / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
