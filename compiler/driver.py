"""`edgellm compile`: checkpoint -> quantized weights -> traced programs -> kernels + plan -> package directory."""
from __future__ import annotations

import json
import shutil
import sys
import time
from datetime import datetime, UTC
from pathlib import Path

import numpy as np

from ..errors import CompileError
from ..models import load_checkpoint
from ..models.rope import cos_sin
from ..quant import get_scheme
from ..runtime.package import FORMAT_VERSION, KERNELS, MANIFEST, PLAN, WEIGHTS
from ..targets import get_target
from .kernels_build import build_kernels
from .lower import lower_model
from .package_writer import staged_package, write_weights
from .plan_writer import write_plan

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")
DEFAULT_MAX_CONTEXT = 4096


def _log(progress: bool, msg: str):
    if progress:
        print(msg, file=sys.stderr, flush=True)


def default_output(model: str, quant: str, target: str) -> Path:
    return Path(f"{Path(str(model).rstrip('/')).name}-{quant}-{target}.edgellm")


def compile_model(model, target: str = "host", quant: str = "f16", out=None, max_context: int | None = None,
                  prefill_chunk: int | None = None, progress: bool = True) -> Path:
    t_start = time.perf_counter()
    tgt = get_target(target)
    scheme = get_scheme(quant)
    # the output head is the most sensitive matrix: float schemes keep it, integer schemes store it as q8
    head_scheme = scheme if scheme.part_order == ("w",) else get_scheme("q8")
    if quant not in tgt.quants:
        raise CompileError(f"--quant {quant} is not supported on target {tgt.name} (supported: {', '.join(tgt.quants)})")
    spec, ck, model_dir = load_checkpoint(model)
    if spec.n_experts:
        raise CompileError(f"{spec.arch} is a mixture-of-experts model: compiling MoE packages is not supported yet "
                           "(it arrives with expert offload); the numpy reference backend runs it")
    if spec.family != "llama":
        raise CompileError(f"{spec.arch} needs ternary kernels, which are not supported yet (they arrive with the t2 "
                           "quantization scheme); the numpy reference backend runs it")
    max_ctx = int(max_context or min(spec.max_position_embeddings, DEFAULT_MAX_CONTEXT))
    if not 1 <= max_ctx <= spec.max_position_embeddings:
        raise CompileError(f"--max-context {max_ctx} is out of range: this model supports 1..{spec.max_position_embeddings}")
    chunk = int(prefill_chunk or tgt.prefill_chunk)
    if not 1 <= chunk <= 1024:
        raise CompileError(f"--prefill-chunk {chunk} is out of range: use 1..1024 (typical 16-128)")
    kv_rows = max_ctx + chunk   # a padded last chunk may write up to chunk-1 rows past max_ctx
    out = Path(out) if out else default_output(model, quant, tgt.name)
    _log(progress, f"compiling {spec.arch} ({spec.n_layers} layers, dim {spec.hidden_size}, vocab {spec.vocab_size}) "
                   f"for {tgt.name} with {scheme.name} -> {out}")

    rope = {}

    def raw(name: str) -> np.ndarray:
        if name.startswith("rope."):
            if not rope:
                c, s = cos_sin(spec, np.arange(kv_rows))
                rope.update({"rope.cos": c.astype(np.float32), "rope.sin": s.astype(np.float32)})
            return rope[name]
        return np.asarray(ck.get(name), dtype=np.float32)

    from ..compiler.ops import CpuInfo

    cpu = CpuInfo(vector_lanes=tgt.vector_lanes, num_threads=max(1, int(tgt.tvm.get("num-cores", 2))), arch=tgt.arch)
    low, programs = lower_model(spec, cpu, raw, scheme, head_scheme, chunk, kv_rows)
    with staged_package(out) as tmp:
        table, wbytes = write_weights(tmp / WEIGHTS, low.weights.names, low.weights.arrays, progress)
        write_plan(tmp / PLAN, arch=tgt.arch, features=list(tgt.features), target=tgt.name, spec=spec, max_ctx=max_ctx,
                   chunk=chunk, kv_rows=kv_rows, weight_regions=[(t["offset"], t["nbytes"]) for t in table],
                   weights_bytes=wbytes, kernels=low.kernels.names, programs=programs)
        t0 = time.perf_counter()
        _log(progress, f"building {len(low.kernels.names)} kernels with TVM for {tgt.name} ...")
        build_kernels(low.kernels.funcs, tgt, tmp / KERNELS)
        t_kernels = time.perf_counter() - t0
        tok_files = [f for f in TOKENIZER_FILES if (model_dir / f).is_file()]
        for f in tok_files:
            shutil.copyfile(model_dir / f, tmp / f)
        if "tokenizer.json" not in tok_files:
            _log(progress, "warning: no tokenizer.json in the checkpoint: the package accepts token ids only")
        manifest = {
            "format_version": FORMAT_VERSION,
            "edgellm_version": _version(),
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "model": {"source": str(model), "arch": spec.arch, "config": spec.to_dict()},
            "target": {"name": tgt.name, "arch": tgt.arch, "tvm": tgt.tvm, "features": list(tgt.features),
                       "cc": tgt.cc},
            "quant": {"scheme": scheme.name, "bits_per_weight": scheme.bits_per_weight, "head": head_scheme.name,
                      "embedding": low.embed_dtype},
            "max_context": max_ctx, "prefill_chunk": chunk, "kv_rows": kv_rows,
            "files": {"plan": PLAN, "weights": WEIGHTS, "kernels": KERNELS,
                      "tokenizer": "tokenizer.json" if "tokenizer.json" in tok_files else None},
            "weights_bytes": wbytes,
            "arena_bytes": max(p.arena_bytes for p in programs),
            "kernels": low.kernels.names,
            "programs": {p.name: {"tokens": p.tokens, "steps": len(p.steps), "arena_bytes": p.arena_bytes}
                         for p in programs},
            "build": {"seconds": round(time.perf_counter() - t_start, 2), "kernel_seconds": round(t_kernels, 2)},
            "tensors": table,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    _log(progress, f"done in {time.perf_counter() - t_start:.1f} s: {out} ({wbytes / 2**20:.1f} MiB of weights, "
                   f"{len(low.kernels.names)} kernels)")
    return out


def _version() -> str:
    from .. import __version__

    return __version__
