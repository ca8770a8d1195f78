"""Serialize a lowered plan to plan.bin (layouts: runtime/contract.py, twin of runtime/contract.h)."""
from __future__ import annotations

from ..runtime import contract as K
from .program import Predict, Program, Route

SAMPLING_DEFAULTS = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0,
                     "presence_penalty": 0.0, "frequency_penalty": 0.0}


def _cstr(s: str, n: int) -> bytes:
    b = s.encode()
    if len(b) >= n:
        raise ValueError(f"'{s}' does not fit in {n - 1} bytes")
    return b


def write_plan(path, *, arch: str, features: list[str], target: str, build_id: bytes, spec, max_ctx: int, chunk: int,
               kv_rows: int, weight_regions: list[tuple[int, int]], weights_bytes: int,
               kernels: list[tuple[str, int, int, int]], programs: list[Program], sampling: dict | None = None,
               kv_layers: list[tuple[int, int]] | None = None, kv_dtype_bits: int = 32) -> None:
    """kernels: (name, n_args, flags, writes) per kernel; sampling: defaults from generation_config.json; kv_layers:
    (rows, window) per layer (compiler/kv_layout.py; None: every layer kv_rows rows, window 0)."""
    eos = list(spec.eos_token_ids)[:K.MAX_EOS]
    samp = {**SAMPLING_DEFAULTS, **(sampling or {})}
    parts = [K.HEADER.pack(
        magic=K.PLAN_MAGIC, version=K.PLAN_VERSION, arch=K.ARCH[arch], features=_cstr(",".join(features), 64),
        target=_cstr(target, 32), build_id=build_id, vocab=spec.vocab_size, dim=spec.hidden_size,
        n_layers=spec.n_layers, n_kv_heads=spec.n_kv_heads, head_dim=spec.head_dim, max_ctx=max_ctx, chunk=chunk,
        kv_rows=kv_rows, kv_dtype_bits=kv_dtype_bits, n_weights=len(weight_regions), n_kernels=len(kernels),
        n_programs=len(programs), arena_bytes=max(p.arena_bytes for p in programs), weights_bytes=weights_bytes,
        bos_id=-1 if spec.bos_token_id is None else spec.bos_token_id, n_eos=len(eos),
        eos_ids=eos + [0] * (K.MAX_EOS - len(eos)), **{f"sampling.{k}": v for k, v in samp.items()},
        **{"sampling.reserved": 0})]
    parts += [K.KV_LAYER.pack(rows=r, window=w) for r, w in (kv_layers or [(kv_rows, 0)] * spec.n_layers)]
    parts += [K.WEIGHT.pack(offset=o, nbytes=n) for o, n in weight_regions]
    parts += [K.KERNEL.pack(name=_cstr(name, 64), n_args=n, flags=flags, writes=writes)
              for name, n, flags, writes in kernels]
    for p in programs:
        parts.append(K.PROGRAM.pack(name=_cstr(p.name, 24), tokens=p.tokens, n_steps=len(p.steps),
                                    in_offset=p.in_offset, out_offset=p.out_offset, out_row_bytes=p.out_row_bytes,
                                    backend=_cstr(p.backend, K.BACKEND_NAME_BYTES), flags=p.flags, reserved=0))
        for st in p.steps:
            if isinstance(st, Route):
                parts.append(K.STEP.pack(kind=K.STEP_ROUTE, kernel=0, n_args=0, n_body=st.n_body,
                                         ids_offset=st.ids_offset, n_select=st.n_select, n_experts=st.n_experts))
                continue
            if isinstance(st, Predict):
                parts.append(K.STEP.pack(kind=K.STEP_PREDICT, kernel=0, n_args=len(st.args), n_body=st.n_body,
                                         ids_offset=st.ids_offset, n_select=st.n_select, n_experts=st.n_experts))
            else:
                parts.append(K.STEP.pack(kind=K.STEP_CALL, kernel=st.kernel, n_args=len(st.args), n_body=0,
                                         ids_offset=0, n_select=0, n_experts=0))
            for a in st.args:
                code, bits = K.DTYPES[a.dtype]
                parts.append(K.ARG.pack(kind=a.kind, index=a.index, dtype_code=code, dtype_bits=bits, dtype_lanes=1,
                                        ndim=len(a.shape), flags=a.flags, expert_stride=a.expert_stride, offset=a.offset,
                                        shape=list(a.shape) + [0] * (K.MAX_ARGS_NDIM - len(a.shape))))
    with open(path, "wb") as f:
        f.write(b"".join(parts))
