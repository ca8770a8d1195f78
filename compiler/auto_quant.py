"""`--quant auto`: the schemes a checkpoint's own storage asks for. A GGUF file's matrices are in llama.cpp block
types. Q8_0 and Q4_0 blocks land in q8g32 / q4g32 exactly (the same codes and f16 scales: their quantizers
reproduce a dequantized block, tests/test_gguf.py), so those files are kept bit for bit. The other block types have
no edgellm scheme that holds them (a per-block minimum, K-quant sub-block scales): they are dequantized and
requantized onto q8g32's grid, whose rounding (1/254 of a block's range) is far below theirs. A second 4-bit
rounding on a grid that does not line up with theirs would add a 4-bit error to a 4-bit error: measured against
llama.cpp on the same file (bench/llamacpp_agreement.py), SmolLM2's Q4_1 file requantized to q4g32 had 24% higher
perplexity and Gemma 3's Q4_K_M file 50%; on q8g32 both are within 0.5% of the exact model's (an f32 package of
the file), where llama.cpp itself is 0.7% above it. So the package is bigger than such a file
(8.5 bits per weight) until a scheme holds their blocks. The head (embedding / lm_head) maps by its own type.
A safetensors checkpoint's float dtype maps to f32 / f16.

| source type | body | head |
|---|---|---|
| F32 | f32 | f32 |
| F16, BF16 | f16 | f16 |
| Q8_0 | q8g32 (its blocks exactly) | q8g32 (its blocks exactly) |
| Q4_0 | q4g32 (its blocks exactly) | q4g32 |
| Q6_K, Q5_0, Q5_1, Q5_K, Q4_1, Q4_K, Q3_K, Q2_K | q8g32 | q8 (Gemma 3's Q6_K embedding: q6 lost more, 1.2% top-1) |
| TQ1_0, TQ2_0 (BitNet) | t2 (the ternary codes and the tensor's scale exactly) | by its own type |
"""
from __future__ import annotations

from collections import Counter

REQUANTIZED = ("Q6_K", "Q5_0", "Q5_1", "Q5_K", "Q4_1", "Q4_K", "Q3_K", "Q2_K")   # no scheme holds their blocks
BODY = {"F32": "f32", "F16": "f16", "BF16": "f16", "Q8_0": "q8g32", "Q4_0": "q4g32",
        **{t: "q8g32" for t in REQUANTIZED}, "TQ1_0": "t2", "TQ2_0": "t2"}
HEAD = {**BODY, **{t: "q8" for t in REQUANTIZED}}


def auto_schemes(spec, ck, family) -> tuple[str, str, str]:
    """(body scheme, head scheme, one line saying why) from the stored types of the checkpoint's matrices: the body
    by the type holding most of the body's weights, the head by the lm_head's (or the tied embedding's) own type."""
    import numpy as np

    shapes = family(spec).weight_shapes(spec)
    head_name = spec.lm_head_name
    counts: Counter = Counter()
    for name, shape in shapes.items():
        if len(shape) == 2 and name not in (head_name, "model.embed_tokens.weight"):
            counts[ck.dtype(name)] += int(np.prod(shape))
    body_type = counts.most_common(1)[0][0] if counts else ck.dtype(head_name)
    head_type = ck.dtype(head_name)
    body, head = BODY.get(body_type, "f16"), HEAD.get(head_type, "q8")
    if spec.native_quant:   # BitNet: its ternary weights are t2's exactly, whatever type stores them
        body = spec.native_quant
    total = sum(counts.values()) or 1
    mix = ", ".join(f"{t} {100 * n / total:.0f}%" for t, n in counts.most_common())
    return body, head, (f"--quant auto: the body's matrices are {mix} -> {body}; the "
                        f"{'tied embedding/lm_head' if spec.tie_word_embeddings else 'lm_head'} is {head_type} -> {head}")


# (stored type, scheme) pairs where the scheme holds the stored values exactly
KEPT = {("F32", "f32"), ("F16", "f16"), ("F16", "f32"), ("BF16", "f32"), ("Q8_0", "q8g32"), ("Q4_0", "q4g32"),
        ("TQ1_0", "t2"), ("TQ2_0", "t2"),
        ("Q8_0", "f32"), ("Q4_0", "f32"), ("Q8_0", "f16"), ("Q4_0", "f16")}


def source_types(spec, ck, family, body: str, head: str) -> dict:
    """Per stored type of the checkpoint's matrices: how many, which scheme took them, and whether their values were
    kept exactly or requantized (the manifest's quant.source_types; `edgellm info` prints it)."""
    out: dict = {}
    heads = (spec.lm_head_name, "model.embed_tokens.weight")
    for name, shape in family(spec).weight_shapes(spec).items():
        if len(shape) != 2:
            continue
        t, sch = ck.dtype(name), head if name in heads else body
        row = out.setdefault(t, {})
        # BitNet's ternary matrices are read exactly (models/gguf/ternary.py refuses any that are not)
        kept = (t, sch) in KEPT or (spec.native_quant == sch and name not in heads)
        r = row.setdefault(sch, {"tensors": 0, "kept": kept})
        r["tensors"] += 1
    return out
