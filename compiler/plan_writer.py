"""Serialize a lowered plan to plan.bin (layout: runtime/plan_format.h; keep both in sync)."""
from __future__ import annotations

import struct

from .lower import Program

MAGIC, VERSION = b"EDGEPLAN", 1
ARCH = {"x86_64": 1, "aarch64": 2}
_HEADER = struct.Struct("<8sII64s32s12IQQii8i")
_WEIGHT = struct.Struct("<QQ")
_KERNEL = struct.Struct("<64s")
_PROGRAM = struct.Struct("<24sIIQQQ")
_STEP = struct.Struct("<II")
_ARG = struct.Struct("<IIBBHIIIQ4q")
assert (_HEADER.size, _WEIGHT.size, _KERNEL.size, _PROGRAM.size, _STEP.size, _ARG.size) == (216, 16, 64, 56, 8, 64)


def _cstr(s: str, n: int) -> bytes:
    b = s.encode()
    if len(b) >= n:
        raise ValueError(f"'{s}' does not fit in {n - 1} bytes")
    return b


def write_plan(path, *, arch: str, features: list[str], target: str, spec, max_ctx: int, chunk: int, kv_rows: int,
               weight_regions: list[tuple[int, int]], weights_bytes: int, kernels: list[str],
               programs: list[Program]) -> None:
    eos = list(spec.eos_token_ids)[:8]
    parts = [_HEADER.pack(MAGIC, VERSION, ARCH[arch], _cstr(",".join(features), 64), _cstr(target, 32),
                          spec.vocab_size, spec.hidden_size, spec.n_layers, spec.n_kv_heads, spec.head_dim, max_ctx,
                          chunk, kv_rows, 32, len(weight_regions), len(kernels), len(programs),
                          max(p.arena_bytes for p in programs), weights_bytes,
                          -1 if spec.bos_token_id is None else spec.bos_token_id, len(eos), *(eos + [0] * (8 - len(eos))))]
    parts += [_WEIGHT.pack(o, n) for o, n in weight_regions]
    parts += [_KERNEL.pack(_cstr(k, 64)) for k in kernels]
    for p in programs:
        parts.append(_PROGRAM.pack(_cstr(p.name, 24), p.tokens, len(p.steps), p.in_offset, p.out_offset,
                                   p.out_row_bytes))
        for st in p.steps:
            parts.append(_STEP.pack(st.kernel, len(st.args)))
            for a in st.args:
                code, bits = a.dl
                shape = list(a.shape) + [0] * (4 - len(a.shape))
                parts.append(_ARG.pack(a.kind, a.index, code, bits, 1, len(a.shape), a.flags, 0, a.offset, *shape))
    with open(path, "wb") as f:
        f.write(b"".join(parts))
