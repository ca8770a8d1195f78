"""`--quant auto`: the schemes a checkpoint's own storage asks for. A GGUF file's matrices are in llama.cpp block
types; each body scheme holds some of them (HOLDS): "exact" (the file's values, e.g. Q8_0's blocks in q8g32, Q4_1's
in q4m32, Q5_0's in q6: the same codes and f16 scales, taken from the stored blocks, models/gguf/blocks.py),
"codes" (the same codes, each group's scale and minimum rounded once to f16: Q4_K's d * sc, dmin * mn in q4m32), or
"requantized" on a grid fine enough to add little to the type's own error (a 6-bit or 8-bit grid under a 4- to
6-bit type). The body takes the cheapest scheme (fewest bits per weight) that holds every type storing at least
MINOR of the body's weights; types under that share are requantized into it. Measured against llama.cpp on the
same real files (bench/llamacpp_agreement.py): a second rounding onto a 4-bit grid that does not line up with the
type's costs real models 15-50% perplexity (SmolLM2's Q4_1 file on q4g32: +24%; Gemma 3's Q4_K_M file, whose body
is 63% Q5_0, on q4m32: +16%), while the choices here stay within 0.5% of llama.cpp on the same file.
The head (embedding / lm_head) maps by its own type. A safetensors checkpoint's float dtype maps to f32 / f16.

| body types (>= MINOR of the weights) | body scheme | bits/weight | head type -> head |
|---|---|---|---|
| F32 / F16, BF16 | f32 / f16 | 32 / 16 | the same |
| Q4_0 | q4g32 (exact) | 4.5 | Q4_0 -> q4g32 |
| Q4_1, Q4_K (Q4_K_S), with Q4_0 | q4m32 (Q4_0, Q4_1 exact; Q4_K codes) | 5 | |
| Q5_0, and the rest but Q8_0 (Q4_K_M: Q4_K + Q6_K; Q5_x, Q6_K, Q3_K, Q2_K) | q6 (Q5_0, Q4_0 exact) | 6.5 | others -> q8g32 |
| Q8_0 | q8g32 (exact) | 8.5 | Q8_0 -> q8g32 |
| TQ1_0, TQ2_0 (BitNet) | t2 (the ternary codes and the tensor's scale exactly) | 2 | by its own type |
"""
from __future__ import annotations

from collections import Counter

MINOR = 0.05   # a block type storing less of the body's weights than this does not decide the body scheme
K_QUANTS = ("Q6_K", "Q5_K", "Q5_1", "Q4_K", "Q4_1", "Q3_K", "Q2_K")
# body scheme -> {block type: how it holds it}, cheapest scheme first (the order auto tries them)
HOLDS = {
    "q4g32": {"Q4_0": "exact"},
    "q4m32": {"Q4_0": "exact", "Q4_1": "exact", "Q4_K": "codes"},
    "q6": {"Q4_0": "exact", "Q5_0": "exact", **{t: "requantized" for t in K_QUANTS}},
    "q8g32": {"Q8_0": "exact", "Q4_0": "requantized", "Q5_0": "requantized", **{t: "requantized" for t in K_QUANTS}},
}
FLOAT_BODY = {"F32": "f32", "F16": "f16", "BF16": "f16", "TQ1_0": "t2", "TQ2_0": "t2"}
HEAD = {"F32": "f32", "F16": "f16", "BF16": "f16", "Q8_0": "q8g32", "Q4_0": "q4g32"}   # others: q8g32 (Gemma 3's
# Q6_K embedding: q6 lost 1.2% top-1 against llama.cpp)


def body_scheme(counts: Counter) -> str:
    """The body scheme for the block types of the body's matrices (type -> weights)."""
    total = sum(counts.values()) or 1
    major = {t for t, n in counts.items() if n >= MINOR * total}
    top = counts.most_common(1)[0][0]
    if top in FLOAT_BODY:
        return FLOAT_BODY[top]
    for scheme, holds in HOLDS.items():
        if major <= set(holds):
            return scheme
    return "q8g32"


# the scheme each block type is stored in when the matrices each keep their own (`mixed`): the cheapest that holds
# it (HOLDS is in that order), the float types as they are
OWN = {**{t: next(sch for sch, holds in HOLDS.items() if t in holds) for t in set().union(*HOLDS.values())},
       **{t: FLOAT_BODY[t] for t in ("F32", "F16", "BF16")}}


def auto_schemes(spec, ck, family, mixed: bool = False, allowed=None) -> tuple[str, str, str, dict]:
    """(body scheme, head scheme, one line saying why, {matrix name: scheme} for the body matrices stored in another
    scheme than the body's) from the stored types of the checkpoint's matrices; the head by the lm_head's (or the
    tied embedding's) own type. mixed (a dense model's own linears): each matrix in the scheme of its own type
    (OWN), the body's scheme the one storing most weights; else one scheme for all (body_scheme). allowed: the
    schemes the target takes (others fall back to the body's)."""
    import numpy as np

    shapes = family(spec).weight_shapes(spec)
    head_name = spec.lm_head_name
    counts: Counter = Counter()
    types: dict[str, str] = {}
    for name, shape in shapes.items():
        if len(shape) == 2 and name not in (head_name, "model.embed_tokens.weight"):
            types[name] = ck.dtype(name)
            counts[types[name]] += int(np.prod(shape))
    body_type = counts.most_common(1)[0][0] if counts else ck.dtype(head_name)
    head_type = ck.dtype(head_name)
    head = HEAD.get(head_type, "q8g32")
    own: dict[str, str] = {}
    if mixed and not spec.native_quant and counts and all(t in OWN for t in counts):
        by_scheme: Counter = Counter()
        for t, n in counts.items():
            by_scheme[OWN[t]] += n
        body = by_scheme.most_common(1)[0][0]
        own = {name: OWN[t] for name, t in types.items()
               if OWN[t] != body and (allowed is None or OWN[t] in allowed)}
    else:
        body = body_scheme(counts) if counts else FLOAT_BODY.get(body_type, "f16")
    if spec.native_quant:   # BitNet: its ternary weights are t2's exactly, whatever type stores them
        body = spec.native_quant
    total = sum(counts.values()) or 1
    mix = ", ".join(f"{t} {100 * n / total:.0f}%" for t, n in counts.most_common())
    others = Counter(own.values())
    also = "".join(f" + {sch} ({n} matrices)" for sch, n in sorted(others.items()))
    return body, head, (f"--quant auto: the body's matrices are {mix} -> {body}{also}; the "
                        f"{'tied embedding/lm_head' if spec.tie_word_embeddings else 'lm_head'} is {head_type} -> "
                        f"{head}"), own


# (stored type, scheme) pairs where the scheme holds the stored values exactly (besides HOLDS' "exact" rows)
KEPT = {("F32", "f32"), ("F16", "f16"), ("F16", "f32"), ("BF16", "f32"), ("TQ1_0", "t2"), ("TQ2_0", "t2"),
        ("Q8_0", "f32"), ("Q4_0", "f32"), ("Q4_1", "f32"), ("Q5_0", "f32")}   # (f16 rounds d * q: not exact)


def kept(stored: str, scheme: str):
    """True (the stored values exactly), "codes" (the codes, scales rounded to f16) or False (requantized)."""
    how = HOLDS.get(scheme, {}).get(stored)
    return True if (stored, scheme) in KEPT or how == "exact" else "codes" if how == "codes" else False


def source_types(spec, ck, family, body: str, head: str, own=None) -> dict:
    """Per stored type of the checkpoint's matrices: how many, which scheme took them (own: the body matrices in
    another scheme than body's), and whether their values were kept exactly or requantized (the manifest's
    quant.source_types; `edgellm info` prints it)."""
    from .moe import float_weights

    out: dict = {}
    own = {**(own or {}), **{n: "f32" for n in (float_weights(spec) if spec.n_experts else ())}}   # routers: f32
    heads = (spec.lm_head_name, "model.embed_tokens.weight")
    for name, shape in family(spec).weight_shapes(spec).items():
        if len(shape) != 2:
            continue
        t, sch = ck.dtype(name), head if name in heads else own.get(name, body)
        row = out.setdefault(t, {})
        # BitNet's ternary matrices are read exactly (models/gguf/ternary.py refuses any that are not)
        how = True if spec.native_quant == sch and name not in heads else kept(t, sch)
        r = row.setdefault(sch, {"tensors": 0, "kept": how})
        r["tensors"] += 1
    return out
