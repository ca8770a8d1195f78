"""Train edgellm's three bundled demo models on the Python standard library's own source, offline.

    python -m edgellm.models.demo.train [--model llama|moe|bitnet|all] [--steps N] [--out models/demo] [--seed 0]

Corpus: every ``*.py`` under ``sysconfig.get_paths()["stdlib"]`` (no tests, idlelib, encodings tables, build
data, site-packages) plus the language reference text held in ``pydoc_data/topics.py`` (one document per
topic). PSF-2.0. A deterministic ~2% of the documents (by SHA-256 of their name) is held out and written to
``heldout.txt`` as ``<|endoftext|>doc<|endoftext|>doc...``; ``tokenizer.encode(heldout.txt)`` is exactly the
evaluation token stream.

Tokenizer: byte-level BPE (``tokenizers``), vocab 4096, specials ``<|endoftext|>`` (id 0: bos/eos/pad),
``<|system|>``, ``<|user|>``, ``<|assistant|>``; trained on the training split only.

Models (Hugging Face format, bf16 safetensors):
  demo-llama   LlamaForCausalLM, dim 256, 6 layers, 8 heads / 4 kv heads, ffn 768, tied embeddings
  demo-moe     MixtralForCausalLM, dim 192, 4 layers, 8 experts top-2 (expert ffn 256), router aux loss 0.02
  demo-bitnet  BitNetForCausalLM trained with BitNet b1.58 QAT (absmean ternary weights, per-token absmax
               int8 activations, straight-through estimator), exported as transformers' offline "bitlinear"
               checkpoint: packed 2-bit uint8 weights [out/4, in] + a per-matrix weight_scale
               (= 1/mean|W|; BitLinear computes y = (x_q @ W_t) / (x_scale * weight_scale)).

Everything is seeded; the run is reproducible for a given Python (the corpus is that Python's stdlib: its
version and the corpus hash are recorded in results.json) on the same torch build and thread count.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import random
import time
from pathlib import Path

from edgellm.quant.corpus import EOT, build_corpus, split_corpus

HERE = Path(__file__).resolve().parent
CTX = 256                      # training context
VOCAB = 4096
SPECIALS = [EOT, "<|system|>", "<|user|>", "<|assistant|>"]
THREADS = 2

# Works with trim_blocks/lstrip_blocks on or off (edgellm's runtime renders with both on).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('roles are system, user and assistant') }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|endoftext|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


# No trailing space: byte-level BPE attaches a space to the word after it, so "def " would end in a lone "Ġ"
# token that the model almost never saw.
PROMPTS = ["def", "import", "The"]

# name -> defaults. Steps were picked from measured throughput on 2 idle cores (llama ~2900, moe ~5400,
# bitnet ~2500 tokens/s with batch 16 x 256): about 9-10 minutes each; other load on the machine stretches that.
MODELS = {
    "llama": dict(dir="demo-llama", steps=400, batch=16, lr=2.5e-3, wd=0.1, warmup=30),
    "moe": dict(dir="demo-moe", steps=700, batch=16, lr=2.5e-3, wd=0.1, warmup=30),
    "bitnet": dict(dir="demo-bitnet", steps=360, batch=16, lr=4e-3, wd=0.05, warmup=30),
}


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


# -------------------------------------------------------------------------------------------------- tokenizer
def train_tokenizer(train_docs):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator((t for _, t in train_docs), trainer, length=len(train_docs))
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    assert tok.token_to_id(EOT) == 0
    return tok


def tokenizer_config() -> dict:
    added = {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                      "special": True} for i, s in enumerate(SPECIALS)}
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOT, "eos_token": EOT, "pad_token": EOT, "unk_token": None,
        "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "model_max_length": 1024,
        "added_tokens_decoder": added,
        "additional_special_tokens": SPECIALS[1:],
        "chat_template": CHAT_TEMPLATE,
    }


def encode_docs(tok, docs):
    """[eot] + ids(doc) for each document, concatenated (== tok.encode(''.join(EOT + doc)))."""
    out = []
    enc = tok.encode_batch([t for _, t in docs], add_special_tokens=False)
    for e in enc:
        out.append(0)
        out.extend(e.ids)
    return out


# ------------------------------------------------------------------------------------------------------ models
def make_model(kind: str):
    import torch
    from transformers import BitNetConfig, BitNetForCausalLM, LlamaConfig, LlamaForCausalLM, MixtralConfig
    from transformers import MixtralForCausalLM

    common = dict(vocab_size=VOCAB, max_position_embeddings=1024, rms_norm_eps=1e-5, tie_word_embeddings=True,
                  bos_token_id=0, eos_token_id=0, initializer_range=0.02,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    # pad_token_id stays unset in the model config: nn.Embedding(padding_idx=0) would freeze the eos row.
    if kind == "llama":
        cfg = LlamaConfig(hidden_size=256, intermediate_size=768, num_hidden_layers=6, num_attention_heads=8,
                          num_key_value_heads=4, hidden_act="silu", **common)
        model = LlamaForCausalLM(cfg)
    elif kind == "moe":
        cfg = MixtralConfig(hidden_size=192, intermediate_size=256, num_hidden_layers=4, num_attention_heads=6,
                            num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2,
                            output_router_logits=True, router_aux_loss_coef=0.02, router_jitter_noise=0.0,
                            sliding_window=None, hidden_act="silu", **common)
        model = MixtralForCausalLM(cfg)
    elif kind == "bitnet":
        cfg = BitNetConfig(hidden_size=256, intermediate_size=768, num_hidden_layers=6, num_attention_heads=8,
                           num_key_value_heads=4, hidden_act="relu2", **common)
        model = BitNetForCausalLM(cfg)
        to_qat(model)
    else:
        raise ValueError(kind)
    model.to(torch.float32)
    return model


def count_params(model, kind):
    total = sum(p.numel() for p in model.parameters())  # tied embeddings counted once
    if kind != "moe":
        return total, total
    cfg = model.config
    expert_params = 0
    for n, p in model.named_parameters():
        if ".experts." in n:
            expert_params += p.numel()
    active = total - expert_params + expert_params * cfg.num_experts_per_tok // cfg.num_local_experts
    return total, active


# ------------------------------------------------------------------------------- BitNet b1.58 QAT and export
def bitnet_weight_scale(w):
    """1/mean|W| rounded to bf16, the dtype weight_scale ships in, so training, export and the loaded model
    use the very same scale."""
    import torch

    s = 1.0 / w.detach().float().abs().mean().clamp(min=1e-5)
    return s.to(torch.bfloat16).float()


def to_qat(model):
    import torch.nn as nn
    import torch.nn.functional as F

    class QATLinear(nn.Linear):
        """BitNet b1.58 linear: absmean ternary weights, per-token absmax int8 activations, STE for both."""

        def forward(self, x):
            w = self.weight
            s = bitnet_weight_scale(w)
            wq = w + ((w * s).round().clamp(-1, 1) / s - w).detach()
            xs = 127.0 / x.detach().abs().amax(dim=-1, keepdim=True).clamp(min=1e-5)
            xq = x + ((x * xs).round().clamp(-128, 127) / xs - x).detach()
            return F.linear(xq, wq, self.bias)

    for name, mod in list(model.model.layers.named_modules()):
        if isinstance(mod, nn.Linear):
            q = QATLinear(mod.in_features, mod.out_features, bias=mod.bias is not None)
            q.weight = mod.weight
            if mod.bias is not None:
                q.bias = mod.bias
            model.model.layers.set_submodule(name, q)


def export_bitnet(model, out_dir: Path):
    """Write transformers' offline BitLinear layout (as microsoft/bitnet-b1.58-2B-4T ships it)."""
    import torch
    import torch.nn as nn
    from safetensors.torch import save_file
    from transformers.integrations.bitnet import pack_weights

    qat = {n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n.startswith("model.layers.")}
    sd = {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight":  # tied to model.embed_tokens.weight
            continue
        mod = name.rsplit(".", 1)[0]
        if mod in qat and name.endswith(".weight"):
            s = bitnet_weight_scale(t)
            tern = (t.float() * s).round().clamp(-1, 1).to(torch.int8)
            assert tern.shape[0] % 4 == 0
            sd[name] = pack_weights(tern.clone()).contiguous()            # uint8 [out/4, in]
            sd[mod + ".weight_scale"] = s.reshape(1).to(torch.bfloat16)    # [1]
        else:
            sd[name] = t.detach().to(torch.bfloat16).contiguous()
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads(model.config.to_json_string(use_diff=True))
    cfg["architectures"] = ["BitNetForCausalLM"]
    cfg["dtype"] = "bfloat16"
    cfg["quantization_config"] = {"quant_method": "bitnet", "linear_class": "bitlinear",
                                  "quantization_mode": "offline", "modules_to_not_convert": None,
                                  "use_rms_norm": False, "rms_norm_eps": 1e-6}
    for k in ("_name_or_path", "transformers_version"):
        cfg.pop(k, None)
    import transformers

    cfg["transformers_version"] = transformers.__version__
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


# ------------------------------------------------------------------------------------------------ train / eval
def windows(ids, ctx=CTX):
    """Non-overlapping evaluation windows: inputs ids[i:i+ctx], targets ids[i+1:i+ctx+1]."""
    import torch

    t = torch.tensor(ids, dtype=torch.long)
    n = (len(ids) - 1) // ctx
    x = t[: n * ctx].view(n, ctx)
    y = t[1: n * ctx + 1].view(n, ctx)
    return x, y


def evaluate(model, ids, kind, batch=16):
    """Mean held-out NLL (nats/token) and, for MoE, per-layer top-k expert counts."""
    import torch
    import torch.nn.functional as F

    x, y = windows(ids)
    model.eval()
    nll, n = 0.0, 0
    counts = None
    with torch.no_grad():
        for i in range(0, len(x), batch):
            xb, yb = x[i:i + batch], y[i:i + batch]
            kw = {"output_router_logits": True} if kind == "moe" else {}
            out = model(input_ids=xb, use_cache=False, **kw)
            logits = out.logits.float()
            nll += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), yb.reshape(-1), reduction="sum").item()
            n += yb.numel()
            if kind == "moe":
                cfg = model.config
                layers = []
                for rl in out.router_logits:
                    top = rl.float().topk(cfg.num_experts_per_tok, dim=-1).indices.reshape(-1)
                    layers.append(torch.bincount(top, minlength=cfg.num_local_experts))
                c = torch.stack(layers)
                counts = c if counts is None else counts + c
    model.train()
    return nll / n, (counts.tolist() if counts is not None else None), n


def unigram_nll(train_ids, heldout_ids):
    """Add-one smoothed unigram over the training split, on the same held-out targets as `evaluate`."""
    import torch

    counts = torch.bincount(torch.tensor(train_ids), minlength=VOCAB).double() + 1.0
    logp = torch.log(counts / counts.sum())
    _, y = windows(heldout_ids)
    return float(-logp[y.reshape(-1)].mean())


def train(kind, model, train_ids, steps, batch, lr, wd, warmup, seed):
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    data = torch.tensor(train_ids, dtype=torch.long)
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if p.dim() >= 2 and "embed" not in n else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)

    def lr_at(step):
        if step < warmup:
            return lr * (step + 1) / warmup
        p = (step - warmup) / max(1, steps - warmup)
        return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))

    model.train()
    hist = []
    t0 = time.time()
    coef = getattr(model.config, "router_aux_loss_coef", 0.0) if kind == "moe" else 0.0
    for step in range(steps):
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step)
        starts = torch.randint(0, len(data) - CTX - 1, (batch,), generator=g)
        xb = torch.stack([data[s:s + CTX] for s in starts])
        yb = torch.stack([data[s + 1:s + CTX + 1] for s in starts])
        out = model(input_ids=xb, labels=None, use_cache=False,
                    **({"output_router_logits": True} if kind == "moe" else {}))
        logits = out.logits
        lm = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), yb.reshape(-1))
        loss = lm
        aux = None
        if kind == "moe":
            # Switch/Mixtral load-balancing loss, per layer then averaged. (transformers' own `aux_loss`
            # concatenates all layers first, which only balances the experts summed over layers and let a
            # layer keep near-dead experts.)
            from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

            cfg = model.config
            aux = sum(load_balancing_loss_func((rl,), cfg.num_local_experts, cfg.num_experts_per_tok, None)
                      for rl in out.router_logits) / len(out.router_logits)
            loss = lm + coef * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        hist.append(lm.item())
        if step % 25 == 0 or step == steps - 1:
            el = time.time() - t0
            tps = (step + 1) * batch * CTX / el
            extra = f" aux {aux.item():.3f}" if aux is not None else ""
            log(f"[{kind}] step {step + 1}/{steps} loss {lm.item():.3f}{extra} lr {lr_at(step):.2e} "
                f"{tps:.0f} tok/s {el:.0f}s")
    wall = time.time() - t0
    tail = hist[-min(50, len(hist)):]
    return {"train_loss": sum(tail) / len(tail), "wall_s": wall, "tokens_seen": steps * batch * CTX}


def samples(model, tok, seed, max_new=48):
    import torch

    out = []
    model.eval()
    for prompt in PROMPTS:
        ids = torch.tensor([tok.encode(prompt, add_special_tokens=False).ids])
        for mode in ("greedy", "t=0.8"):
            torch.manual_seed(seed)
            kw = dict(do_sample=False) if mode == "greedy" else dict(do_sample=True, temperature=0.8, top_k=0,
                                                                      top_p=1.0)
            g = model.generate(ids, max_new_tokens=max_new, max_length=None, pad_token_id=0, eos_token_id=0, **kw)
            out.append({"prompt": prompt, "mode": mode, "text": tok.decode(g[0].tolist(), skip_special_tokens=False)})
    return out


# ---------------------------------------------------------------------------------------------------- outputs
def write_tokenizer(tok, d: Path):
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2) + "\n")
    # `edgellm run` (like transformers' generate) samples with these when the command line gives no setting:
    # greedy decoding loops on models this small
    gen = {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0, "do_sample": True, "temperature": 0.8,
           "top_k": 40, "top_p": 0.95, "repetition_penalty": 1.1}
    (d / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")


def finalize_dir(d: Path):
    for p in d.iterdir():
        if p.is_file():
            p.chmod(0o644)


def dir_size(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


ARCH_TEXT = {
    "llama": "`LlamaForCausalLM`: hidden 256, 6 layers, 8 attention heads / 4 KV heads (head dim 32), SwiGLU FFN 768, "
             "RoPE theta 10000, RMSNorm, tied input/output embeddings, max_position_embeddings 1024.",
    "moe": "`MixtralForCausalLM`: hidden 192, 4 layers, 6 attention heads / 2 KV heads (head dim 32), 8 SwiGLU experts "
           "of FFN 256 per layer with top-2 routing, router load-balancing loss (coefficient 0.02, computed per layer "
           "and averaged) during training, "
           "tied embeddings, max_position_embeddings 1024.",
    "bitnet": "`BitNetForCausalLM` (BitNet b1.58): hidden 256, 6 layers, 8 attention heads / 4 KV heads, squared-ReLU "
              "gated FFN 768 with sub-layer norms, tied embeddings, max_position_embeddings 1024. Trained with "
              "quantization-aware training: every linear layer inside the blocks uses absmean ternary weights "
              "{-1, 0, +1} (scale 1/mean|W|, rounded to bf16) and per-token absmax 8-bit activations, with the "
              "straight-through estimator. Shipped in transformers' offline `bitlinear` layout (as "
              "microsoft/bitnet-b1.58-2B-4T): each projection's `weight` is uint8 `[out/4, in]` with four 2-bit "
              "values (ternary + 1) per byte, row block i in bits 2i..2i+1, plus a bf16 `weight_scale` `[1]`; "
              "`y = (x_q @ W_t) / (x_scale * weight_scale)`. Embeddings and norms are bf16; `config.json` carries "
              "`quantization_config = {quant_method: bitnet, linear_class: bitlinear, quantization_mode: offline}`.",
}


def write_card(d: Path, kind: str, r: dict):
    lines = [
        "---", "license: apache-2.0", "library_name: transformers", "pipeline_tag: text-generation",
        "tags: [edgellm, demo, tiny]", "---", "",
        f"# {d.name}", "",
        "A tiny demo model bundled with edgellm for tests, examples and benchmarks. It writes Python-ish code "
        "and reference-manual English; it is not useful for anything else.", "",
        "## Architecture", "", ARCH_TEXT[kind], "",
        f"Parameters: {r['params_total']:,} total" + (f", {r['params_active']:,} active per token" if kind == "moe"
                                                       else "") + " (tied embeddings counted once).", "",
        "## Training data", "",
        f"The Python {r['python']} standard library's own source: every `*.py` under "
        "`sysconfig.get_paths()['stdlib']` except `test/`, `tests/`, `idlelib/`, `encodings/`, `turtledemo/`, "
        "`ensurepip/`, `site-packages/` and build data, plus the language reference text of `pydoc_data/topics.py` "
        f"(one document per topic): {r['corpus']['documents']:,} documents, {r['corpus']['bytes']:,} bytes, "
        f"sha256 `{r['corpus']['sha256'][:16]}`. Held out by document (SHA-256 of the name order, ~2%): "
        f"{r['corpus']['heldout_documents']} documents, {r['corpus']['heldout_bytes']:,} bytes, shipped as "
        "`models/demo/heldout.txt`. Corpus license: PSF-2.0.", "",
        "## Tokenizer", "",
        "Byte-level BPE (`tokenizers`), vocabulary 4096, trained on the training split. Special tokens: "
        "`<|endoftext|>` (id 0; bos, eos and pad), `<|system|>`, `<|user|>`, `<|assistant|>`. Chat template: "
        "`<|role|>\\ncontent<|endoftext|>\\n` per message, then `<|assistant|>\\n` (the model never saw chat data; "
        "the template exists to exercise the chat code path).", "",
        "## Training", "",
        f"- steps: {r['steps']}, batch {r['batch']} x {CTX} tokens, tokens seen: {r['tokens_seen']:,}",
        f"- AdamW (betas 0.9/0.95, weight decay {r['wd']}), peak lr {r['lr']}, {r['warmup']} warmup steps, "
        "cosine to 10%, grad clip 1.0, fp32 on CPU, seed " + str(r["seed"]),
        f"- wall time: {r['wall_s'] / 60:.1f} min on {THREADS} CPU threads",
        f"- command: `python -m edgellm.models.demo.train --model {kind} --steps {r['steps']} --seed {r['seed']}`", "",
        "## Results (held-out split)", "",
        "| | loss (nats/token) | perplexity |", "|---|---|---|",
        f"| train (mean of last 50 steps) | {r['train_loss']:.4f} | {math.exp(r['train_loss']):.2f} |",
        f"| held-out, trained model (fp32) | {r['heldout_loss']:.4f} | {r['heldout_ppl']:.2f} |",
        f"| held-out, shipped checkpoint via transformers | {r['shipped_heldout_loss']:.4f} | "
        f"{r['shipped_heldout_ppl']:.2f} |",
        f"| unigram baseline (add-one, training split) | {r['unigram_loss']:.4f} | {r['unigram_ppl']:.2f} |", "",
        f"Evaluated on {r['heldout_tokens']:,} held-out tokens (non-overlapping {CTX}-token windows).", "",
    ]
    if kind == "bitnet":
        lines += [f"The QAT model and the loaded checkpoint (`AutoModelForCausalLM.from_pretrained`, float32) agree: "
                  f"{r['heldout_ppl']:.3f} vs {r['shipped_heldout_ppl']:.3f} perplexity; loaded in bf16 (the config's "
                  f"dtype): {r.get('shipped_bf16_heldout_ppl', float('nan')):.3f}.", ""]
    if kind == "moe":
        lines += ["## Expert usage (held-out text)", "",
                  "Fraction of top-2 routing slots taken by each expert, per layer:", "",
                  "| layer | " + " | ".join(f"e{i}" for i in range(8)) + " |",
                  "|---" * 9 + "|"]
        for li, row in enumerate(r["expert_usage"]):
            tot = sum(row)
            lines.append(f"| {li} | " + " | ".join(f"{c / tot:.3f}" for c in row) + " |")
        lines.append("")
    lines += ["## Samples (shipped checkpoint, 48 new tokens)", ""]
    for s in r["samples"]:
        lines += [f"`{s['mode']}`, prompt `{s['prompt']!r}`:", "", "```", s["text"].replace("```", "'''"), "```", ""]
    lines += ["## License", "",
              "Weights: Apache-2.0. They are derived from the Python standard library source and documentation, "
              "which is under the PSF License Agreement (PSF-2.0), Copyright (c) 2001 Python Software Foundation; "
              "all rights reserved.", ""]
    (d / "README.md").write_text("\n".join(lines))


# -------------------------------------------------------------------------------------------------------- main
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="all", choices=["llama", "moe", "bitnet", "all"])
    ap.add_argument("--steps", type=int, default=None, help="override the per-model default step count")
    ap.add_argument("--out", default=str(HERE))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-samples", action="store_true", help="skip sample generation (quick runs)")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(THREADS)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    docs = build_corpus()
    train_docs, held_docs = split_corpus(docs)
    corpus_hash = hashlib.sha256()
    for name, text in docs:
        corpus_hash.update(name.encode() + b"\0" + text.encode() + b"\0")
    heldout_text = "".join(EOT + t for _, t in held_docs)
    (out / "heldout.txt").write_text(heldout_text, encoding="utf-8")
    log(f"corpus: {len(docs)} docs, {sum(len(t.encode()) for _, t in docs):,} bytes; held out {len(held_docs)} docs "
        f"{len(heldout_text.encode()):,} bytes")

    random.seed(args.seed)
    tok = train_tokenizer(train_docs)
    train_ids = encode_docs(tok, train_docs)
    held_ids = tok.encode(heldout_text, add_special_tokens=False).ids
    assert held_ids == encode_docs(tok, held_docs), "heldout.txt does not round-trip to the evaluation stream"
    uni = unigram_nll(train_ids, held_ids)
    log(f"tokens: train {len(train_ids):,} held-out {len(held_ids):,}; unigram ppl {math.exp(uni):.1f}")
    tok_json = json.dumps(json.loads(tok.to_str()), sort_keys=True).encode()

    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    results.setdefault("models", {})
    results.update({
        "python": platform.python_version(), "torch": torch.__version__,
        "corpus": {"documents": len(docs), "bytes": sum(len(t.encode()) for _, t in docs),
                   "sha256": corpus_hash.hexdigest(), "heldout_documents": len(held_docs),
                   "heldout_bytes": len(heldout_text.encode()), "heldout_names": [n for n, _ in held_docs]},
        "tokenizer": {"vocab_size": VOCAB, "sha256": hashlib.sha256(tok_json).hexdigest(),
                      "train_tokens": len(train_ids), "heldout_tokens": len(held_ids)},
        "unigram_loss": uni, "unigram_ppl": math.exp(uni),
    })

    kinds = ["llama", "moe", "bitnet"] if args.model == "all" else [args.model]
    for kind in kinds:
        spec = MODELS[kind]
        steps = args.steps or spec["steps"]
        torch.manual_seed(args.seed)
        random.seed(args.seed)
        model = make_model(kind)
        total, active = count_params(model, kind)
        log(f"[{kind}] params {total:,} (active {active:,}); {steps} steps")
        tr = train(kind, model, train_ids, steps, spec["batch"], spec["lr"], spec["wd"], spec["warmup"], args.seed)
        loss, usage, ntok = evaluate(model, held_ids, kind)
        log(f"[{kind}] held-out loss {loss:.4f} ppl {math.exp(loss):.2f} (unigram {math.exp(uni):.2f}) "
            f"train {tr['train_loss']:.4f} wall {tr['wall_s']:.0f}s")

        d = out / spec["dir"]
        if d.exists():
            for p in d.iterdir():
                if p.is_file():
                    p.unlink()
        d.mkdir(parents=True, exist_ok=True)
        if kind == "bitnet":
            export_bitnet(model, d)
        else:
            model.to(torch.bfloat16).save_pretrained(d)
        write_tokenizer(tok, d)
        del model

        # the shipped checkpoint, loaded the ordinary way
        from transformers import AutoModelForCausalLM

        shipped = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
        s_loss, s_usage, _ = evaluate(shipped, held_ids, kind)
        log(f"[{kind}] shipped checkpoint ({type(shipped).__name__}) held-out ppl {math.exp(s_loss):.3f}")
        r = {"arch": type(shipped).__name__, "params_total": total, "params_active": active, "steps": steps,
             "batch": spec["batch"], "ctx": CTX, "lr": spec["lr"], "wd": spec["wd"], "warmup": spec["warmup"],
             "seed": args.seed, **tr, "heldout_loss": loss, "heldout_ppl": math.exp(loss),
             "shipped_heldout_loss": s_loss, "shipped_heldout_ppl": math.exp(s_loss), "heldout_tokens": ntok,
             "unigram_loss": uni, "unigram_ppl": math.exp(uni), "python": platform.python_version(),
             "corpus": results["corpus"]}
        if kind == "moe":
            r["expert_usage"] = s_usage
            r["expert_usage_trained"] = usage
        if kind == "bitnet":
            bf = AutoModelForCausalLM.from_pretrained(d)
            b_loss, _, _ = evaluate(bf, held_ids, kind)
            r["shipped_bf16_heldout_loss"] = b_loss
            r["shipped_bf16_heldout_ppl"] = math.exp(b_loss)
            r["shipped_default_dtype"] = str(next(bf.model.embed_tokens.parameters()).dtype)
            log(f"[bitnet] default-dtype load ({r['shipped_default_dtype']}) held-out ppl {math.exp(b_loss):.3f}")
            del bf
        r["samples"] = [] if args.no_samples else samples(shipped, tok, args.seed)
        for s in r["samples"]:
            log(f"[{kind}] {s['mode']} {s['prompt']!r}: {s['text'][:160]!r}")
        r["size_bytes"] = dir_size(d)
        write_card(d, kind, r)
        finalize_dir(d)
        r["size_bytes"] = dir_size(d)
        results["models"][kind] = {k: v for k, v in r.items() if k not in ("corpus", "python")}
        results_path.write_text(json.dumps(results, indent=2) + "\n")
        del shipped
    sizes = {k: results["models"][k]["size_bytes"] for k in results["models"]}
    log(f"sizes: {sizes} total {sum(sizes.values()) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
