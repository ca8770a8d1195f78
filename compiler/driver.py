"""`edgellm compile`: checkpoint -> quantized weights -> traced programs -> kernels + plan -> package directory."""
from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter
from datetime import datetime, UTC
from pathlib import Path

import numpy as np

from ..errors import CompileError
from ..models import load_checkpoint
from ..models.chat_families import INFERRED_KEY
from ..models.rope import cos_sin, resolve_longrope
from ..models.rope import table_of as rope_table_of
from ..quant import SCHEMES, body_schemes, get_scheme, head_schemes
from ..runtime.contract import BACKEND_TVM_CPU, FORMAT_VERSION, MANIFEST, PLAN, ROUTING, WEIGHTS
from ..targets import get_target, short_prefill_chunk
from .device_binary import BIN_DIR, BINARY, build_edgellm_run
from .backends import kernel_backend
from .lower import lower_model
from .moe import manifest as moe_manifest
from .onnx_qnn.options import npu_options
from .package_writer import check_destination, staged_package, write_sums, write_weights
from .plan_writer import write_plan
from .progress import Step, layer_progress
from .tune import Tuner, resolve_mode
from .chat_format import write_chat_format
from .progress import log as _log
from .tokenizer_pack import maybe_write_tokenizer_bin

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                   "chat_template.jinja", "chat_template.json")   # the last two: newer checkpoints' chat templates
DEFAULT_MAX_CONTEXT = 4096
# the verify program's tokens (speculative decoding: the last token and up to VERIFY_TOKENS - 1 drafts per pass over
# the weights). A pass costs 2.3 decode steps at 8 on SmolLM2-135M q8g32 (README "Speculative decoding"), no more
# than 16 prefill_short rows do: the small-batch kernels, not the width, set the cost today
VERIFY_TOKENS = 8


class StoredBlocks:
    """Lowering's `quantized` map for schemes that take a checkpoint's stored blocks (Scheme.from_blocks): a
    matrix's parts from its blocks, or None (quantized from its values) where its scheme (scheme_of(name)) does not
    hold them."""

    def __init__(self, ck, scheme_of):
        self.ck, self.scheme_of = ck, scheme_of

    def get(self, name: str):
        scheme = self.scheme_of(name)
        return scheme.from_blocks(self.ck.blocks(name)) if hasattr(scheme, "from_blocks") else None


def verify_width(tokens: int | None, chunk: int) -> int | None:
    """The verify program's tokens (None: no program): `tokens`, else $EDGELLM_VERIFY_TOKENS (the test session
    sets 0: only the packages that test speculation pay for its kernels), else VERIFY_TOKENS; at most a chunk."""
    if tokens is None:
        env = os.environ.get("EDGELLM_VERIFY_TOKENS", "")
        tokens = int(env) if env.isdigit() else VERIFY_TOKENS
    if tokens != 0 and not 2 <= tokens <= 32:
        raise CompileError(f"verify_tokens {tokens}: 0 (no verify program) or 2..32")
    return min(tokens, chunk) if tokens else None


def default_output(model: str, quant: str, target: str) -> Path:
    return Path(f"{Path(str(model).rstrip('/')).name}-{quant}-{target}.edgellm")


def choose_schemes(spec, quant: str | None, head_quant: str | None, progress: bool = True):
    """(body scheme, head scheme) for a model: the defaults, the checks, and the body scheme's compile warning
    (t2: post-training ternarization). The head scheme stores the lm_head and the embedding table (once, when they
    are tied). What a scheme allows comes from the scheme (quant/scheme.py), never from its name."""
    if spec.native_quant:
        quant = quant or spec.native_quant
        if quant != spec.native_quant:
            raise CompileError(f"{spec.arch} checkpoints hold {get_scheme(spec.native_quant).description.split(' (')[0]} "
                               f"weights: compile them with --quant {spec.native_quant} (got --quant {quant})")
    scheme = get_scheme(quant or "f16")
    if not scheme.body:
        raise CompileError(f"--quant {scheme.name} is an embedding / lm_head scheme: pass it as --head-quant {scheme.name} "
                           f"(body schemes: {', '.join(body_schemes())})")
    if head_quant is None:   # the scheme's default head: float packages keep their float head, integer ones q8g32
        head_quant = scheme.default_head or scheme.name
    head = get_scheme(head_quant)
    if not head.head:
        raise CompileError(f"--head-quant {head.name} is not supported: the embedding/lm_head scheme must be one of "
                           f"{', '.join(head_schemes())}")
    _check_matrix_shapes(spec, scheme, head)
    warning = scheme.compile_warning(spec)
    if warning:
        _log(progress, f"warning: {warning}")
    return scheme, head


def _check_matrix_shapes(spec, scheme, head) -> None:
    """Fail before any work if a matrix does not fit its scheme (the error names the tensor)."""
    from ..models import family

    from .moe import float_weights

    shapes = family(spec).weight_shapes(spec)
    head_names = {"model.embed_tokens.weight", spec.lm_head_name, "lm_head.weight"}
    floats = float_weights(spec) if spec.n_experts else set()
    for name, shape in shapes.items():
        bitnet_packed = spec.family == "bitnet" and name.endswith("_proj.weight")
        if len(shape) == 2 and name not in head_names and name not in floats and not bitnet_packed:
            scheme.check_shape(name, shape)
    for name in head_names & shapes.keys():
        head.check_shape(name, shapes[name])


def compile_model(model, target: str = "host", quant: str | None = None, out=None, max_context: int | None = None,
                  prefill_chunk: int | None = None, progress: bool = True, head_quant: str | None = None,
                  gptq: bool = False, calib: str | None = None, act_order: bool = False,
                  tune: str | None = None, fuse: bool = True, npu_chunk: int | None = None,
                  npu_quant: str = "w8a16", soc: str | None = None, npu_outliers: bool = False,
                  layout: str = "dense", bundle_neurons: int | None = None, ffn_threshold: float | None = None,
                  expert_prefetch_distance: int | None = None, expert_guesser: str = "fitted",
                  expert_guess_width: int | None = None, npu_weights: str = "rtn",
                  npu_residual: str | None = None, npu_act: str | None = None, swa_full: bool = False,
                  verify_tokens: int | None = None, kv_cache: str = "f32") -> Path:
    """Compile a checkpoint into a package. quant None: f16 (t2 for BitNet checkpoints); head_quant None: the
    body's float scheme, or q8g32 for integer schemes. gptq: GPTQ instead of round-to-nearest for q4 schemes,
    calibrated on calib (a text file) or the built-in sample. tune: off | quick | full (compiler/tune; None: quick
    for the host target, off for cross targets). fuse: q/k/v and gate/up as one kernel each (off: for A/B runs).
    expert_prefetch_distance (MoE): decode guesses layer L's experts from the residual stream entering layer
    L - D + 1 (1: layer L's own input; 0: no guesses; None: 1), so an expert cache reads them ahead; expert_guesser:
    "fitted" (a per-layer map fitted on calib text, compiler/expert_guess.py) or "router" (layer L's own router);
    expert_guess_width: how many of the most likely experts each guess names (None: top-k). kv_cache: the K/V
    caches' element type, "f32", "f16" (half the memory), "q8" or "q4" (codes and scales, compiler/ops/kv_quant.py),
    or "K,V" for keys and values of two types (both float or both quantized: "q8,q4"); CPU targets."""
    t_start = time.perf_counter()
    for name, v, lo, hi in (("--max-context", max_context, 1, 1 << 24), ("--prefill-chunk", prefill_chunk, 1, 1024),
                            ("--npu-chunk", npu_chunk, 1, 1024)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi):
            raise CompileError(f"{name} {v} is out of range: use {lo}..{hi}")
    tgt = get_target(target)
    kernels = kernel_backend(tgt)   # the backend the programs run on (compiler/backends/)
    tune_mode = resolve_mode(tune, tgt)
    npu = npu_options(tgt, npu_chunk, npu_quant, soc, npu_outliers, npu_weights, npu_residual, npu_act)
    _check_layout(layout, bundle_neurons, ffn_threshold, gptq, npu, tgt)
    from .kv_layout import KEY_MEAN, KV_CACHE_TYPES, kv_cache_name, kv_dtype_bits_field, parse_kv_cache

    try:
        k_cache, v_cache = parse_kv_cache(kv_cache)
    except ValueError as e:
        raise CompileError(str(e)) from None
    kv_cache = kv_cache_name(k_cache, v_cache)
    if kv_cache != "f32" and (npu or kernels.name != BACKEND_TVM_CPU):
        raise CompileError(f"--kv-cache {kv_cache}: target {tgt.name} keeps K/V in f32 (its "
                           f"{'NPU graphs' if npu else 'GPU kernels'} read them so); use --kv-cache f32")
    (kv_dtype, k_bits), (v_dtype, v_bits) = KV_CACHE_TYPES[k_cache], KV_CACHE_TYPES[v_cache]
    kv_bits = min(k_bits, v_bits)
    _check_schemes_and_calib(quant, head_quant, calib, tgt)
    if out is not None:
        check_destination(out)   # fail before any work when the output place is wrong
    spec, ck, model_dir = load_checkpoint(model)
    for note in ck.notes:
        _log(progress, f"note: {note}")
    from ..models.tokenizer_files import check_tokenizer_files, generation_defaults

    check_tokenizer_files(model_dir)
    sampling = generation_defaults(model_dir)
    own, quant_was_auto = {}, quant == "auto"
    if quant == "auto":   # the schemes the checkpoint's own storage asks for (compiler/auto_quant.py)
        from ..models import family
        from .auto_quant import auto_schemes

        # each matrix keeps the scheme of its own block type (a layer's experts: per projection; bundles: one)
        quant, auto_head, why_auto, own = auto_schemes(spec, ck, family, allowed=tgt.quants,
                                                       mixed=not (layout == "bundled" or gptq))
        head_quant = head_quant or auto_head
        _log(progress, why_auto)
        if quant not in tgt.quants:
            raise CompileError(f"{why_auto}, which target {tgt.name} does not support (supported: "
                               f"{', '.join(tgt.quants)}); pass --quant")
    scheme, head_scheme = choose_schemes(spec, quant, head_quant, progress)
    own = {name: get_scheme(sch) for name, sch in own.items()} if quant_was_auto else {}
    why = kernels.refuses(spec, layout)
    if why:
        raise CompileError(f"--target {tgt.name} runs dense models only for now: {why}")
    if spec.n_experts and (npu or layout == "bundled"):
        raise CompileError(f"{spec.arch} is a mixture-of-experts model: "
                           + (f"--target {tgt.name} does not run MoE layers yet (use android-cpu)" if npu else
                              "--layout bundled applies to dense FFNs (a token already reads only its experts)"))
    if layout == "bundled" and spec.mlp_bias:
        raise CompileError(f"--layout bundled does not handle MLP biases yet ({spec.arch} with mlp_bias): compile it "
                           "with the dense layout")
    lookahead, width = expert_options(spec, expert_prefetch_distance, expert_guesser, expert_guess_width)
    quant = scheme.name
    if gptq and not scheme.gptq:
        raise CompileError(f"--gptq applies to the int4 schemes ({', '.join(n for n, s in SCHEMES.items() if s.gptq)}), "
                           f"not to {scheme.name}")
    max_ctx = int(max_context if max_context is not None else min(spec.max_position_embeddings, DEFAULT_MAX_CONTEXT))
    spec = resolve_longrope(spec, max_ctx)   # LongRoPE's short/long factors, fixed by the package's context
    if not 1 <= max_ctx <= spec.max_position_embeddings:
        raise CompileError(f"--max-context {max_ctx} is out of range: this model supports 1..{spec.max_position_embeddings}")
    from ..compiler.ops import CpuInfo
    from .kv_layout import kv_layers

    cpu = CpuInfo(vector_lanes=tgt.vector_lanes, num_threads=max(1, int(tgt.tvm.get("num-cores", 2))), arch=tgt.arch,
                  features=tuple(tgt.features), prefetch_bytes=tgt.prefetch_bytes,
                  float_prefetch_bytes=tgt.float_prefetch_bytes, prefetch_locality=tgt.prefetch_locality,
                  batch_prefetch_locality=tgt.batch_prefetch_locality, kv_prefetch_locality=tgt.kv_prefetch_locality,
                  float_slice_bytes=tgt.float_slice_bytes)
    tuner = Tuner(tune_mode, tgt, cpu, progress) if tune_mode != "off" else None
    if tuner is not None:
        prefill_chunk, cpu = tuner.guarded("prefill knobs", lambda: tuner.prefill(spec, scheme, head_scheme,
                                                                                   prefill_chunk, fuse),
                                           (prefill_chunk, cpu))
    chunk = int(prefill_chunk if prefill_chunk is not None else
                (tgt.float_prefill_chunk if scheme.float_math and tgt.float_prefill_chunk else tgt.prefill_chunk))
    kv_rows = max_ctx + max(chunk, npu.chunk if npu else 0)   # a padded last chunk may write up to chunk-1 rows past max_ctx
    if kv_bits <= 8 and spec.head_dim % 4:
        raise CompileError(f"--kv-cache {kv_cache}: head_dim {spec.head_dim} is not a multiple of 4 (the scales follow "
                           "the codes in each row); use --kv-cache f16")
    # sliding-window layers keep only the rows their window sees (not on the NPU, whose graphs take whole caches)
    kv_table = kv_layers(spec, max_ctx, kv_rows, window_caches=not (npu or swa_full))
    short = short_prefill_chunk(chunk)
    verify = verify_width(verify_tokens, chunk)
    out = Path(out) if out else default_output(model, quant, tgt.name)
    _log(progress, f"compiling {spec.arch} ({spec.n_layers} layers, dim {spec.hidden_size}, vocab {spec.vocab_size}) "
                   f"for {tgt.name} with {scheme.name} -> {out}")

    from ..quant.key_mean import CALIB_TOKENS, applies, calibrated_key_means

    rope, key_mean = {}, {}
    if KEY_MEAN.get(kv_dtype, False) and applies(spec):   # a q4 K cache holds keys less their mean (key_mean.py)
        _log(progress, f"--kv-cache {kv_cache}: measuring each layer's mean key on {CALIB_TOKENS} tokens of "
                       f"{calib or 'the built-in sample'}")
        key_mean = calibrated_key_means(spec, lambda n: np.asarray(ck.get(n), np.float32), model_dir / "tokenizer.json",
                                        max_ctx, calib)

    def raw(name: str) -> np.ndarray:
        if name in key_mean:
            return key_mean[name]
        table = rope_table_of(name)
        if table:
            if name not in rope:
                c, s = cos_sin(spec, np.arange(kv_rows), table)
                rope.update({f"{table}.cos": c.astype(np.float32), f"{table}.sin": s.astype(np.float32)})
            return rope[name]
        return ck.get(name)

    pre = None
    if gptq:
        from ..quant.calibration import gptq_from_checkpoint

        _log(progress, f"GPTQ{' (act-order)' if act_order else ''}: calibrating on {calib or 'the built-in sample'}")
        t = time.perf_counter()
        pre = gptq_from_checkpoint(spec, lambda n: np.asarray(ck.get(n), np.float32), scheme,
                                   model_dir / "tokenizer.json", calib_file=calib, act_order=act_order,
                                   progress=layer_progress(f"GPTQ {scheme.name}", progress))
        _log(progress, f"GPTQ: {len(pre)} matrices in {time.perf_counter() - t:.0f} s")
    elif hasattr(ck, "blocks") and any(hasattr(s, "from_blocks") for s in (scheme, *own.values())):
        # the file's own blocks where the matrix's scheme holds them (Q4_1, Q4_K on q4m32; Q5_0 on q6)
        pre = StoredBlocks(ck, lambda name: own.get(name, scheme))
    bundles = None
    if layout == "bundled":
        from .neuron_stats import plan_layout

        bundles = plan_layout(spec, raw, model_dir, calib, bundle_neurons, ffn_threshold,
                              lambda msg: _log(progress, msg))
        raw = bundles.raw(raw)
    guess = None
    if spec.n_experts:   # routing statistics (routing.bin: hot experts), and the fitted guessers
        from .expert_guess import fit

        guess = fit(spec, raw, model_dir, calib, lookahead, lambda msg: _log(progress, msg),
                    guessers=expert_guesser == "fitted")
        plain_raw = raw

        def raw(name: str) -> np.ndarray:   # noqa: F811 (the checkpoint, plus the fitted guessers)
            a = guess.raw(name)
            return plain_raw(name) if a is None else a

    low, programs = lower_model(spec, cpu, raw, scheme, head_scheme, chunk, kv_rows, quantized=pre,
                                short_chunk=short, verify_tokens=verify, fuse=fuse, npu_chunk=npu.chunk if npu else None,
                                bundles=bundles, expert_lookahead=lookahead, matrix_schemes=own,
                                guessed_layers=guess.weights if guess else (), guess_width=width,
                                kv_dtype=kv_dtype, v_dtype=v_dtype, key_mean=bool(key_mean), **kernels.lower_args())
    if tuner is not None:
        tuner.guarded("decode knobs", lambda: tuner.decode_prefetch(
            low.kernels, next(p for p in programs if p.name == "decode")), None)
        _log(progress, tuner.result.summary())
    tuning = tuner.result.manifest() if tuner is not None else {"mode": "off"}
    build_id = os.urandom(16)   # ties a static edgellm-run to this package's plan
    kernel_table = low.kernels.entries()
    with staged_package(out) as tmp:
        table, wbytes = write_weights(tmp / WEIGHTS, low.weights.names, low.weights.arrays, progress)
        low.weights.arrays = []   # written: the CPU copies (and the checkpoint pages they view) are not needed again
        ck.release()
        n_params = count_params(spec)
        write_plan(tmp / PLAN, arch=tgt.arch, features=list(tgt.features), target=tgt.name, build_id=build_id,
                   spec=spec, max_ctx=max_ctx, chunk=chunk, kv_rows=kv_rows,
                   weight_regions=[(t["offset"], t["nbytes"]) for t in table], weights_bytes=wbytes,
                   kernels=kernel_table, programs=programs, sampling=sampling, kv_layers=kv_table,
                   kv_dtype_bits=kv_dtype_bits_field(k_bits, v_bits))
        _log(progress, f"weights: {wbytes / 2**20:.1f} MiB written")
        t0 = time.perf_counter()
        with Step(f"building {len(low.kernels.names)} kernels with TVM for {tgt.name}", progress):
            kobj = kernels.build(low.kernels.funcs, tgt, tmp, kernel_table)
        t_kernels = time.perf_counter() - t0
        build_edgellm_run(tgt, tmp / BIN_DIR / BINARY, kernels_obj=kobj, build_id=build_id.hex())   # the device's runner
        if kobj is not None:
            kobj.unlink()
            kobj.with_name("kernel_table.c").unlink(missing_ok=True)
        tok_files = [f for f in TOKENIZER_FILES if (model_dir / f).is_file()]
        for f in tok_files:
            shutil.copyfile(model_dir / f, tmp / f)
        maybe_write_tokenizer_bin(tmp, lambda msg: _log(progress, msg))   # for edgellm-run (C tokenizer)
        write_chat_format(tmp)   # the chat template as strings, for the Android app
        _report_inferred_chat_format(tmp, progress)
        if "tokenizer.json" not in tok_files:
            _log(progress, "warning: no tokenizer.json in the checkpoint: the package accepts token ids only")
        npu_section = None
        if npu:
            from .onnx_qnn.package import write_npu

            if "tokenizer.json" not in tok_files:
                raise CompileError("--target android-npu calibrates on text: the checkpoint needs a tokenizer.json")
            npu_section = write_npu(tmp, spec, raw, model_dir / "tokenizer.json", chunk=npu.chunk, kv_rows=kv_rows,
                                    quant=npu.quant, socs=list(npu.socs), calib=calib, gptq=pre, outliers=npu.outliers,
                                    weights=npu.weights, residual=npu.residual == "int4", act=npu.act,
                                    release=ck.release, progress=progress)
        manifest = {
            "format_version": FORMAT_VERSION,
            "edgellm_version": _version(),
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "model": {"source": str(model), "arch": spec.arch, "config": spec.to_dict()},
            "target": {"name": tgt.name, "arch": tgt.arch, "tvm": tgt.tvm_dict(), "features": list(tgt.features),
                       "cc": tgt.cc},
            "build_id": build_id.hex(),
            "sampling_defaults": sampling,
            "quant": {"scheme": scheme.name, "bits_per_weight": round(_bits_per_weight(table, n_params), 3),
                      "head": head_scheme.name, "embedding": low.embed_dtype,
                      "method": "gptq" if gptq else ("native" if spec.family == "bitnet" else "rtn"),
                      "n_params": n_params, "source_types": _source_types(spec, ck, scheme, head_scheme, gptq, own),
                      **({"matrix_schemes": dict(Counter(s.name for s in own.values()))} if own else {})},
            "max_context": max_ctx, "prefill_chunk": chunk, "prefill_short_chunk": short, "kv_rows": kv_rows,
            "verify_tokens": verify, "kv_cache": kv_cache,
            "kv_layers": [list(x) for x in kv_table],
            "files": {"plan": PLAN, "weights": WEIGHTS, "binary": f"{BIN_DIR}/{BINARY}",
                      **kernels.files,
                      "tokenizer": "tokenizer.json" if "tokenizer.json" in tok_files else None,
                      "tokenizer_bin": "tokenizer.bin" if (tmp / "tokenizer.bin").is_file() else None},
            "weights_bytes": wbytes,
            "arena_bytes": max(p.arena_bytes for p in programs),
            "kernels": low.kernels.names,
            "programs": {p.name: {"tokens": p.tokens, "steps": len(p.steps), "arena_bytes": p.arena_bytes}
                         for p in programs},
            "tuning": tuning,
            **({"ffn": bundles.manifest()} if bundles else {}),
            **({"moe": {**moe_manifest(spec, low, table, n_params), "prefetch_distance": lookahead,
                        "guesser": expert_guesser if lookahead else None, "guess_width": width if lookahead else 0,
                        **({"guess": guess.manifest()} if guess else {}),
                        **({"routing": ROUTING} if guess else {})}}
               if spec.n_experts else {}),
            **({"npu": npu_section} if npu_section else {}),
            "build": {"seconds": round(time.perf_counter() - t_start, 2), "kernel_seconds": round(t_kernels, 2)},
            "tensors": table,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        if guess:   # hot experts for the expert cache
            import re

            first = {int(re.search(r"layers\.(\d+)\.", key).group(1)): f for key, (f, _, _) in low.experts.items()}
            (tmp / ROUTING).write_bytes(guess.routing_bin(first, len(table)))
        digest = write_sums(tmp)   # last: it covers every file above
    _log(progress, f"done in {time.perf_counter() - t_start:.1f} s: {out} ({wbytes / 2**20:.1f} MiB of weights, "
                   f"{len(low.kernels.names)} kernels)\npackage digest {digest} (check it with "
                   f"`edgellm run {out} --digest {digest}` or Runtime.load(..., digest=...))")
    return out


def _report_inferred_chat_format(pkg: Path, progress: bool) -> None:
    try:
        family = json.loads((pkg / "tokenizer_config.json").read_text()).get(INFERRED_KEY)
    except (OSError, ValueError, AttributeError):
        return
    if family:
        _log(progress, f"chat template: none in the checkpoint; chats use the {family} format its vocabulary's turn "
                       "markers name")


def _check_layout(layout: str, bundle_neurons, ffn_threshold, gptq: bool, npu, tgt) -> None:
    if layout not in ("dense", "bundled"):
        raise CompileError(f"--layout {layout}: choose dense or bundled")
    if layout != "bundled" and (bundle_neurons is not None or ffn_threshold is not None):
        raise CompileError("--bundle-neurons and --ffn-threshold apply to --layout bundled")
    if layout == "bundled" and (gptq or npu):
        raise CompileError(f"--layout bundled does not combine with {'--gptq' if gptq else '--target ' + tgt.name} yet")
    if ffn_threshold is not None and not (0 <= ffn_threshold < 1e6):
        raise CompileError(f"--ffn-threshold {ffn_threshold}: give a number >= 0 (0: exact)")


def _check_schemes_and_calib(quant: str | None, head_quant: str | None, calib: str | None, tgt) -> None:
    """The scheme names the target takes and the calibration file, before the checkpoint is read."""
    if quant == "auto":   # resolved from the checkpoint once it is read
        quant = None
    if quant is not None:
        get_scheme(quant)
    if head_quant is not None:
        get_scheme(head_quant)
    if quant is not None and quant not in tgt.quants and not get_scheme(quant).body:
        raise CompileError(f"--quant {quant} is an embedding / lm_head scheme: pass it as --head-quant {quant} "
                           f"(body schemes on {tgt.name}: {', '.join(tgt.quants)})")
    if quant is not None and quant not in tgt.quants:
        raise CompileError(f"--quant {quant} is not supported on target {tgt.name} (supported: {', '.join(tgt.quants)})")
    if calib is not None and not Path(calib).is_file():
        what = "is a directory" if Path(calib).is_dir() else ("is not a regular file" if Path(calib).exists() else
                                                                "does not exist")
        raise CompileError(f"calibration file {calib} {what}: pass a text file to --calib (or drop it to use "
                           "the built-in sample)")


def expert_options(spec, distance: int | None, guesser: str, width: int | None) -> tuple[int, int]:
    """(look-ahead, guess width) of a model's expert guesses from the --expert-* options (0, 0 for dense models);
    a CompileError names a wrong one."""
    if distance is not None:
        if not spec.n_experts:
            raise CompileError("--expert-prefetch-distance applies to mixture-of-experts checkpoints")
        if isinstance(distance, bool) or not isinstance(distance, int) or not 0 <= distance <= spec.n_layers:
            raise CompileError(f"--expert-prefetch-distance {distance} is out of range: use 0..{spec.n_layers}")
    lookahead = (1 if distance is None else distance) if spec.n_experts else 0
    if guesser not in ("fitted", "router"):
        raise CompileError(f"--expert-guesser {guesser}: choose fitted or router")
    if width is not None:
        if not spec.n_experts:
            raise CompileError("--expert-guess-width applies to mixture-of-experts checkpoints")
        if isinstance(width, bool) or not isinstance(width, int) or \
                not spec.n_experts_per_tok <= width <= spec.n_experts:
            raise CompileError(f"--expert-guess-width {width} is out of range: use "
                               f"{spec.n_experts_per_tok}..{spec.n_experts} (top-k .. every expert)")
    return lookahead, width or (spec.n_experts_per_tok if spec.n_experts else 0)


def count_params(spec) -> int:
    """Parameters of the checkpoint (BitNet's packed ternary matrices count 4 weights per byte)."""
    from ..models import family

    n = 0
    for name, shape in family(spec).weight_shapes(spec).items():
        k = int(np.prod(shape))
        n += 4 * k if spec.family == "bitnet" and name.endswith("_proj.weight") else k
    return n


def _source_types(spec, ck, scheme, head_scheme, gptq: bool, own=None) -> dict:
    """What happened to each stored type of the checkpoint's matrices (compiler/auto_quant.py source_types)."""
    from ..models import family
    from .auto_quant import source_types

    try:
        out = source_types(spec, ck, family, scheme.name, head_scheme.name,
                           {name: s.name for name, s in (own or {}).items()})
    except (KeyError, AttributeError):   # a checkpoint without per-tensor types (BitNet's packed ternary weights)
        return {}
    if gptq:   # GPTQ rewrites the body's codes: nothing it touches is kept
        for row in out.values():
            if scheme.name in row:
                row[scheme.name]["kept"] = False
    return out


def _bits_per_weight(table, n_params: int) -> float:
    """Stored bits per parameter over all weights (scales, norms and the embedding/head included; not RoPE tables)."""
    return 8 * sum(t["nbytes"] for t in table if not rope_table_of(t["name"])) / max(n_params, 1)


def _version() -> str:
    from .. import __version__

    return __version__
