"""`--quant auto`: the schemes a checkpoint's own storage asks for. A GGUF file's matrices are in llama.cpp block
types; each maps to the edgellm scheme nearest it at no more bits per weight (so a package is never bigger than the
file); Q8_0 and Q4_0 blocks land in q8g32 / q4g32 exactly (the same codes and f16 scales: their quantizers
reproduce a dequantized block, tests/test_gguf.py), so those files are kept bit for bit. The head (embedding /
lm_head) maps the same way from its own type. A safetensors checkpoint's float dtype maps to f32 / f16.

| source type | body | head |
|---|---|---|
| F32 | f32 | f32 |
| F16, BF16 | f16 | f16 |
| Q8_0 | q8g32 (its blocks exactly) | q8 (q8g32 has no embedding kernel) |
| Q6_K | q4g32 (no 6-bit body scheme yet) | q6 (llama.cpp's Q6_K output size) |
| Q4_0 | q4g32 (its blocks exactly) | q4g32 |
| Q5_0, Q5_1, Q5_K, Q4_1, Q4_K | q4g32 (4.5 bits) | q4g32 |
| Q3_K, Q2_K | q4g128 (4.1 bits: the fewest of any scheme for weights that are not ternary) | q4g128 |
"""
from __future__ import annotations

from collections import Counter

BODY = {"F32": "f32", "F16": "f16", "BF16": "f16", "Q8_0": "q8g32", "Q6_K": "q4g32", "Q5_0": "q4g32",
        "Q5_1": "q4g32", "Q5_K": "q4g32", "Q4_0": "q4g32", "Q4_1": "q4g32", "Q4_K": "q4g32", "Q3_K": "q4g128",
        "Q2_K": "q4g128"}
HEAD = {**BODY, "Q8_0": "q8", "Q6_K": "q6"}


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
    total = sum(counts.values()) or 1
    mix = ", ".join(f"{t} {100 * n / total:.0f}%" for t, n in counts.most_common())
    return body, head, (f"--quant auto: the body's matrices are {mix} -> {body}; the "
                        f"{'tied embedding/lm_head' if spec.tie_word_embeddings else 'lm_head'} is {head_type} -> {head}")


# (stored type, scheme) pairs where the scheme holds the stored values exactly
KEPT = {("F32", "f32"), ("F16", "f16"), ("F16", "f32"), ("BF16", "f32"), ("Q8_0", "q8g32"), ("Q4_0", "q4g32"),
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
        r = row.setdefault(sch, {"tensors": 0, "kept": (t, sch) in KEPT})
        r["tensors"] += 1
    return out
