"""The npu/ folder of an android-npu package: per group of layers a quantized prefill-chunk graph (group<i>.onnx +
its external weights), an EPContext binary per SoC (npu/<soc>/), and the numbers that describe them (the manifest's
"npu" section: groups, chunk, quantization, calibration, error per layer against f32, sizes)."""
from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import onnx

from ...errors import CompileError, first_line
from . import qnn_ort
from ...runtime.contract import NPU_DESCRIPTOR, NPU_MAGIC, NPU_OUTLIERS, NPU_ROPE, NPU_VERSION
from .npu_chunks import MASK_VALUE, ChunkRunner, Group
from ..progress import log as _log
from ..progress import layer_progress
from .calibrate import Ranges, derive, probe_graph
from .graph import scale_for, stream_scale, trace_group
from .outliers import choose as choose_outliers
from .outliers import specs as outlier_specs
from .outliers import split_groups
from . import float16
from .quantize import NPU_QUANTS, gptq_int4, quantize_group

# Weights per group graph. The HTP's context limit is 4 GB (ExecuTorch and llama.cpp's Hexagon backend split there);
# 256 M float weights is 256 MB as int8: a 1B model in 4-5 graphs, a 7B in ~26, each prepared in reasonable memory.
GROUP_PARAMS = 256 * 2**20
CALIB_TOKENS, CALIB_SEQ = 1024, 256
NPU_WEIGHTS = ("rtn", "gptq")
NPU_ACTS = ("f16", "int16")   # activations: float16 (float16.py), or 16-bit integers with calibrated ranges (quantize.py)
CHAT_SEQS = 2   # built-in calibration: conversations in the model's chat template, besides the plain text


def plan_groups(spec, max_params: int = GROUP_PARAMS) -> list[tuple[int, int]]:
    """Consecutive layer ranges [l0, l1) of at most max_params weights each (at least one layer)."""
    d, f, hd = spec.hidden_size, spec.intermediate_size, spec.head_dim
    per_layer = d * hd * (2 * spec.n_heads + 2 * spec.n_kv_heads) + 3 * d * f
    n = max(1, max_params // max(per_layer, 1))
    return [(i, min(i + n, spec.n_layers)) for i in range(0, spec.n_layers, n)]


def parse_socs(socs: str | None) -> list[str]:
    if socs is None:
        return list(qnn_ort.DEFAULT_SOCS)
    out = [s.strip().lower() for s in socs.split(",") if s.strip()]
    bad = [s for s in out if s not in qnn_ort.SOCS and s != "none"]
    if bad or not out:
        raise CompileError(f"--soc {socs!r}: unknown SoC {', '.join(bad) or '(empty)'} (choose from "
                           f"{', '.join(qnn_ort.SOCS)}, comma-separated, or 'none' for ONNX graphs only)")
    return [] if out == ["none"] else out


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _session(path: Path, layers: tuple[int, int], backend: str, cpu_parts=None, soc=None) -> Group:
    s = qnn_ort.session(path, backend=backend, soc=soc)
    parts = tuple(cpu_parts[x] for x in range(*layers) if x in (cpu_parts or {}))
    return Group(layers, s, tuple(i.name for i in s.get_inputs()), parts)


def _float_graph(work: Path, i: int, spec, weight, chunk, kv_rows, layers, chosen=None, expose_act=False,
                 scale: float | None = None) -> Path:
    l0, l1 = layers
    p = work / f"group{i}.onnx"
    with open(work / (p.name + ".data"), "wb") as f:   # weights stream into the file while the graph is traced
        m = trace_group(spec, weight, chunk, kv_rows, l0, l1, {x: chosen[x] for x in chosen or {} if l0 <= x < l1},
                        expose_act, data=(p.name + ".data", f), scale=scale)
    onnx.save(m, str(p))
    return p


def _drop(path: Path) -> None:
    for f in path.parent.glob(path.name + "*"):
        f.unlink()


def _through(spec, group: Group, xs: list[np.ndarray], chunk, kv_rows, first: Group | None = None,
             observe=None, observe_out=None, runners: list | None = None) -> list[np.ndarray]:
    """Group-major: every sequence's hidden states [T, hidden] through one group (its own KV cache per sequence);
    position 0 through `first` (the CPU's stand-in). runners, when given, collects each sequence's ChunkRunner."""
    out = []
    for x in xs:
        r = ChunkRunner(spec, [group], chunk, kv_rows, first=[first or group])
        out.append(r.prefill(x, observe, observe_out))
        if runners is not None:
            runners.append(r)
    return out


def _activation_maxima(work: Path, spec, weight, chunk, kv_rows, groups, xs) -> dict[int, np.ndarray]:
    """Per layer, the largest |value| of every FFN down-projection input channel over the calibration text
    (position 0, which the CPU runs, excluded)."""
    mx: dict[int, np.ndarray] = {}

    def see(gi, outs):
        for name, v in outs.items():
            if name.startswith("act"):
                layer, m = int(name[3:]), np.abs(v).max(0)
                mx[layer] = np.maximum(mx.get(layer, m), m)

    for i, layers in enumerate(groups):
        p = _float_graph(work, i, spec, weight, chunk, kv_rows, layers, expose_act=True)
        xs = _through(spec, _session(p, layers, "cpu"), xs, chunk, kv_rows, observe_out=see)
        _drop(p)
    return mx


def calibration_sequences(pkg: Path, tokenizer_json: Path, calib: str | None) -> tuple[list[list[int]], list[int], str]:
    """(calibration sequences, a held-out one, what they are). --calib FILE: windows of that text. Built-in: the built-in sample
    (Python source and English prose) plus, when the package has a chat template, conversations of that prose in
    the model's own template (a chat model is prompted that way: its special tokens set ranges too)."""
    from ...quant.calibration import builtin_calibration_docs, calibration_ids
    from ...runtime.python.text import TextCodec

    seqs = calibration_ids(tokenizer_json, calib, n_tokens=CALIB_TOKENS + CALIB_SEQ, seq_len=CALIB_SEQ)
    held, seqs = (seqs[-1], seqs[:-1]) if len(seqs) > 1 else (seqs[0], seqs)
    source = calib or "built-in sample"
    codec = TextCodec(pkg)
    if calib is None and codec.available and codec.config.get("chat_template"):
        prose = [t for n, t in builtin_calibration_docs() if n.startswith("pydoc_data/")]
        for k in range(CHAT_SEQS):
            parts = [" ".join(t.split()[:60]) for t in prose[3 * k:3 * k + 3]]
            if len(parts) < 3:
                break
            msgs = [{"role": "system", "content": parts[0]}, {"role": "user", "content": parts[1]},
                    {"role": "assistant", "content": parts[2]}]
            try:
                ids = codec.encode(codec.apply_chat_template(msgs, add_generation_prompt=False),
                                   add_special_tokens=False)
            except Exception:   # noqa: BLE001 - a template that cannot render these messages: prose only
                break
            seqs.append(ids[:CALIB_SEQ])
            source = "built-in sample + chat template"
    return seqs, held, source


def _write_outliers(pkg: Path, cpu_parts: dict) -> list[str]:
    """npu/outliers.bin (per layer: int32 channels, then float32 W_down[:, channels].T) and its descriptor lines."""
    lines, blob, off = [f"outliers_file {NPU_OUTLIERS}"], [], 0
    for layer, o in sorted(cpu_parts.items()):
        part = o.channels.astype("<i4").tobytes() + o.cols.astype("<f4").tobytes()
        lines.append(f"outliers {layer} {o.threshold!r} {len(o.channels)} {off}")
        blob.append(part)
        off += len(part)
    (pkg / NPU_OUTLIERS).write_bytes(b"".join(blob))
    return lines


def write_npu(pkg: Path, spec, weight, tokenizer_json: Path, *, chunk: int, kv_rows: int, quant: str = "w8a16",
              socs: list[str] = (), calib: str | None = None, gptq: dict | None = None, outliers: bool = False,
              weights: str = "rtn", residual: bool = False, act: str = "f16", release=None,
              progress: bool = True) -> dict:
    """Writes pkg/npu/ and returns the manifest's "npu" section. gptq: the CPU package's GPTQ q4 parts by weight
    name (compile --gptq), whose codes and scales w4a16 reuses (None: round-to-nearest). weights (w8a16): "rtn"
    (round-to-nearest) or "gptq" (GPTQ on the NPU's own grids, calibrated on the text). residual
    (w8a16): every projection also gets an int4 plane of what its int8 codes miss (quantize.weight_planes).
    act: "f16" (float16 activations, block-quantized weights: float16.py) or "int16" (calibrated 16-bit integers).
    release: called after each group's weights are read (the checkpoint drops the pages it mapped).

    Group by group, so that peak memory is one group's graphs, not the model's: trace the float graph, stream every
    tensor's range over the calibration text (calibrate.py), quantize, measure its error against float on a
    held-out sequence, and hand the group's outputs (float and quantized chains) to the next group."""
    if quant not in NPU_QUANTS:
        raise CompileError(f"--npu-quant {quant} is not supported (choose one of {', '.join(NPU_QUANTS)})")
    if act not in NPU_ACTS:
        raise CompileError(f"--npu-act {act}: choose {' or '.join(NPU_ACTS)}")
    if outliers and act != "int16":
        raise CompileError("--npu-outliers applies to --npu-act int16 (float16 activations need no outlier split)")
    if quant == "w4a16-mixed" and act != "f16":
        raise CompileError("--npu-quant w4a16-mixed applies to --npu-act f16")
    if weights not in NPU_WEIGHTS or (weights != "rtn" and quant != "w8a16" and act != "f16"):
        raise CompileError(f"--npu-weights {weights}: choose {' or '.join(NPU_WEIGHTS)} (gptq applies to w8a16, and "
                           "to w4a16 with --npu-act f16)")
    try:
        import onnxruntime.quantization  # noqa: F401
    except ImportError as e:
        raise CompileError("--target android-npu needs onnxruntime: pip install onnxruntime onnxruntime-qnn") from e
    if socs and not qnn_ort.qnn_available():
        raise CompileError("preparing EPContext binaries needs the QNN execution provider: pip install onnxruntime-qnn "
                           "(or pass --soc none for ONNX graphs only)")
    t0 = time.perf_counter()
    out, work = pkg / "npu", pkg / "npu.float"
    out.mkdir()
    work.mkdir()
    seqs, held, source = calibration_sequences(pkg, tokenizer_json, calib)
    fit = max(1, kv_rows - chunk)   # a sequence's last chunk must end inside the cache (a small --max-context)
    seqs, held = [s[:fit] for s in seqs], held[:fit]
    embed, k = np.asarray(weight("model.embed_tokens.weight"), np.float32), np.float32(spec.embed_scale)
    xs, x_held = [embed[s] * k for s in seqs], embed[held] * k   # the rows the CPU's npu_embed program makes
    del embed
    groups = plan_groups(spec)
    chosen = {}
    if outliers:   # shadow outlier execution: which layers, channels and thresholds (a float pass over the text)
        chosen = choose_outliers(_activation_maxima(work, spec, weight, chunk, kv_rows, groups, xs))
        groups = split_groups(groups, chosen)
        _log(progress, f"NPU: outlier channels on the CPU for {len(chosen)} layer(s): " + ", ".join(
            f"L{x} {len(c)} ch > {t:.3g}" for x, (t, c) in sorted(chosen.items())) if chosen else
            "NPU: no layer has outlier activation channels")
    cpu_parts = outlier_specs(chosen, weight)
    npu_parts = None
    if weights == "gptq":   # GPTQ on the NPU's own grids, Hessians without position 0 (the CPU's): quant/calibration.py
        from ...quant.calibration import gptq_model
        from .weights import NpuInt4Offset, NpuInt8

        t = time.perf_counter()
        grid = NpuInt8(float16.BLOCK if act == "f16" else None)
        if quant != "w8a16":
            grid = _MixedGrid(quant, grid, NpuInt4Offset(float16.BLOCK))
        npu_parts = gptq_model(spec, weight, grid, seqs, skip=1, progress=layer_progress(f"NPU GPTQ {quant}", progress))
        _log(progress, f"NPU: GPTQ {quant} weights on {sum(map(len, seqs))} tokens in "
                       f"{time.perf_counter() - t:.0f} s")
    _log(progress, f"NPU: {len(groups)} graph(s) of layers {', '.join(f'{a}-{b - 1}' for a, b in groups)}, chunk {chunk}, "
                   f"{quant}, {'float16' if act == 'f16' else '16-bit integer'} activations, calibrated on "
                   f"{sum(map(len, seqs))} tokens")
    qpaths, formats, infos, table = [], set(), [], _ErrorTable(spec, len(held))
    hf, hq = x_held, x_held
    scales = []
    for i, layers in enumerate(groups):
        scale = stream_scale(spec)
        while True:   # the residual stream's float16 factor: lowered (and the group traced again) if the text needs it
            fpath = _float_graph(work, i, spec, weight, chunk, kv_rows, layers, chosen, scale=scale)
            if release is not None:
                release()
            probe = _session(probe_graph(fpath), layers, "cpu", cpu_parts)   # the float graph, its tensors exposed
            ranges = Ranges()
            ys = _through(spec, probe, xs, chunk, kv_rows, observe=ranges.see, observe_out=ranges.see)
            r = ranges.ranges()
            peak = max(abs(v) for name in ("x", "y") for v in r.get(name, (0.0, 0.0)))
            # the graph's output leaves float16 unscaled (graph.py to_model): Gemma 3 270M's reaches 4.8e4 of 65504
            if peak > 0.9 * 65504:
                raise CompileError(f"NPU graph {i + 1}: the residual stream reaches {peak:.3g} on the calibration text, "
                                   "too close to float16's 65504 for the graph's output; this model cannot run on the "
                                   "NPU prefill path yet")
            lower = scale_for(peak, scale)
            if lower == scale:
                break
            _log(progress, f"NPU: graph {i + 1}'s residual stream reaches {peak:.3g}: held x{lower:g} in float16")
            del probe
            _drop(fpath)
            scale = lower
        xs = ys
        scales.append(scale)
        q = out / fpath.name
        try:
            if act == "f16":
                peaks = {k: max(-lo, hi) for k, (lo, hi) in ranges.ranges().items()}
                codes = weights if quant == "w8a16" or weights == "gptq" else ("gptq (the CPU package's codes)" if gptq
                                                                               else "rtn")
                formats.add(f"{float16.lower(fpath, q, _planes(quant, gptq, npu_parts, residual), peaks)}, {codes}, "
                            "float16 activations")
            else:
                formats.add(quantize_group(fpath, q, derive(ranges.ranges(), fpath), quant, gptq, npu_parts,
                                           residual))
        except CompileError:
            raise
        except Exception as e:   # the quantization tool's own errors
            raise CompileError(f"NPU quantization of graph {i} failed: {first_line(e)}") from e
        quant_group = _session(q, layers, "cpu", cpu_parts)
        infos.append({"layers": list(layers), "graph": str(q.relative_to(pkg)),
                      "bytes": sum(f.stat().st_size for f in out.glob(q.name + "*")),
                      "inputs": list(quant_group.inputs)})
        hf, hq = table.step(probe, quant_group, hf, hq, chunk, kv_rows, last=i == len(groups) - 1)
        del probe, quant_group, ranges
        _drop(fpath)
        qpaths.append(q)
        _log(progress, f"NPU: graph {i + 1}/{len(groups)} (layers {layers[0]}-{layers[1] - 1}) quantized, "
                       f"{infos[-1]['bytes'] / 2**20:.1f} MiB, hidden error {table.hidden[-1]:.2%} "
                       f"({time.perf_counter() - t0:.0f} s)")
    shutil.rmtree(work)

    soc_files: dict[str, dict] = {}
    for soc in socs:
        d = out / soc
        d.mkdir()
        files, t = [], time.perf_counter()
        for i, q in enumerate(qpaths):
            ctx = d / q.name
            cfg = {"ep.context_enable": "1", "ep.context_file_path": str(ctx), "ep.context_embed_mode": "0"}
            try:
                qnn_ort.session(q, backend="qnn", soc=soc, config=cfg)
            except Exception as e:
                raise CompileError(f"NPU: preparing graph {i} for {soc} failed: {first_line(e)}") from e
            files.append(str(ctx.relative_to(pkg)))
        arch, model = qnn_ort.SOCS[soc]
        soc_files[soc] = {"htp_arch": arch, "soc_model": model, "graphs": files,
                          "bytes": sum(f.stat().st_size for f in d.iterdir()),
                          "files": sorted(str(f.relative_to(pkg)) for f in d.iterdir())}
        _log(progress, f"NPU: EPContext for {soc} (v{arch}) in {time.perf_counter() - t:.1f} s, "
                       f"{soc_files[soc]['bytes'] / 2**20:.1f} MiB")
    _write_descriptor(pkg, spec, chunk, kv_rows, qpaths, groups, soc_files,
                      _write_outliers(pkg, cpu_parts) if cpu_parts else [], float16.ONNX_SOC if act == "f16" else None)
    return {
        "chunk": chunk, "kv_rows": kv_rows, "quant": quant, "act": act, "weights": "; ".join(sorted(formats)),
        "mask_value": MASK_VALUE,
        "descriptor": NPU_DESCRIPTOR,
        "cpu_positions": 1,   # position 0 (the attention sink) runs on the CPU: runtime/core/context.c
        "precision": precision_table(quant, residual, min(scales), act),
        "outliers": {str(x): {"threshold": t, "channels": c} for x, (t, c) in sorted(chosen.items())},
        "groups": infos,
        "socs": soc_files,
        "calibration": {"source": source, "sequences": len(seqs), "tokens": sum(map(len, seqs))},
        "error_vs_f32": table.result(),
        "seconds": round(time.perf_counter() - t0, 2),
    }


MIXED_INT8 = ("v_proj.weight", "down_proj.weight")   # w4a16-mixed: the projections kept in int8 blocks


def _int8_projection(quant: str, name: str) -> bool:
    return quant == "w8a16" or (quant == "w4a16-mixed" and name.endswith(MIXED_INT8))


class _MixedGrid:
    """gptq_model's scheme for w4a16[-mixed]: the int8 grid for the projections the scheme keeps in int8, the int4
    offset blocks for the rest (for_name picks)."""
    name, gptq = "npu-w4a16", True

    def __init__(self, quant: str, int8, int4):
        self.quant, self.int8, self.int4 = quant, int8, int4

    def for_name(self, name: str):
        return self.int8 if _int8_projection(self.quant, name) else self.int4

    def check_shape(self, name: str, shape) -> None:
        self.for_name(name).check_shape(name, shape)


def _planes(quant: str, gptq: dict | None, npu: dict | None, residual: bool):
    """float16.lower's planes(name, w [in, out]) for the scheme: w8a16 int8 blocks (npu's GPTQ codes, else RTN) and
    the int4 residual plane; w4a16 int4 blocks with a float offset each (npu's GPTQ codes, else the CPU package's
    GPTQ int4 codes, else round-to-nearest on the fitted grid); w4a16-mixed the same but int8 blocks for
    MIXED_INT8."""
    def planes(name, w):
        p = (npu or {}).get(name)
        if _int8_projection(quant, name):
            return float16.planes_w8(w, p, residual)
        if p is not None:
            return [(4, p["q"].T, p["scales"].T, p["offsets"].T)]
        if gptq is not None and name in gptq:
            return [(4, *gptq_int4(gptq[name]))]
        q, d, o = float16.int4_offset(w)
        return [(4, q, d, o)]
    return planes


def precision_table(quant: str, residual: bool, scale: float = 1.0, act: str = "f16") -> dict[str, list[str]]:
    """What runs at which precision in the graphs, and why (manifest npu.precision; `edgellm info` prints it)."""
    stream = ("float16" + (f" (held x{scale:g})" if scale != 1.0 else ""), "a few channels of 1e3-1e4 beside a median "
              "of a few units: 8.3% hidden-state error in 16-bit integers on Gemma 3 270M")
    if act == "f16":
        out = {"activations": ["float16 (inputs and outputs float32)", "held-out text leaves any calibrated 16-bit "
                               "integer range (up to 1.6x on SmolLM2-135M): 0.5-4% hidden-state error per prompt "
                               "there, 0.3-0.8% in float16 on the HTP emulator"],
               "residual stream (adds and the RMSNorms over it)": list(stream)}
        if quant == "w8a16":
            out["projections"] = ([f"int8 blocks of {float16.BLOCK} + int4 residual plane", "int8 blocks alone: 1.7% "
                                   "hidden-state error on SmolLM2-135M, 0.3% with the plane"] if residual else
                                  [f"int8 blocks of {float16.BLOCK}", "--npu-residual off"])
        elif quant == "w4a16-mixed":
            out["projections"] = [f"int4 blocks of {float16.BLOCK} with float offsets; V and FFN down projections "
                                  "int8 blocks", "all int4: 21.5% hidden-state error on Gemma 3 270M, 14.5% with "
                                  "these two in int8"]
        else:
            out["projections"] = [f"int4 blocks of {float16.BLOCK} with float offsets", "--npu-quant w4a16"]
        return out
    out = {"activations": ["16-bit integers, ranges per tensor from the calibration text", "--npu-act int16"],
           "attention (q @ K^T, mask, softmax, p @ V)": [
               "float16", "the HTP cuts the second operand of a 16-bit x 16-bit MatMul to 8 bits: 8.8% error on a "
               "real model's attention output"],
           "residual stream (adds and the RMSNorms over it)": [stream[0], stream[1] + ", 1.9% in float16"]}
    if quant == "w8a16":
        out["projections"] = (["int8 per channel + int4 residual plane", "int8 alone: 3.1% hidden-state error on a "
                               "real 135M model whose inputs carry outlier channels"] if residual else
                              ["int8 per channel", "--npu-residual off"])
    else:
        out["projections"] = ["int4 blocks", "--npu-quant w4a16"]
    return out


def _write_descriptor(pkg: Path, spec, chunk, kv_rows, qpaths, groups, soc_files, extra=(),
                      onnx_soc: str | None = None) -> None:
    """npu/npu.txt and npu/rope.bin: what the C runtime's QNN backend (runtime/backends/backend_qnn_ort.c) reads."""
    from .npu_chunks import rope_rows, rope_tables

    tables = rope_tables(spec)
    rows = [a.reshape(kv_rows, -1) for t in tables for a in rope_rows(spec, 0, kv_rows, t)]
    np.concatenate(rows).astype("<f4").tofile(pkg / NPU_ROPE)
    lines = [f"{NPU_MAGIC} {NPU_VERSION}", f"chunk {chunk}", f"kv_rows {kv_rows}", f"mask_value {MASK_VALUE}",
             f"rope {NPU_ROPE}"]
    if len(tables) > 1:   # older runtimes read one table and no such line: packages with one table keep their bytes
        lines.append(f"rope_tables {len(tables)}")
    lines += [f"group {l0} {l1} {q.relative_to(pkg).as_posix()}" for q, (l0, l1) in zip(qpaths, groups)]
    if onnx_soc:   # the HTP the ONNX graphs need where no SoC is detected (runtime/backends/backend_qnn_ort.c)
        lines.append(f"onnx_soc {onnx_soc}")
    for soc, v in soc_files.items():
        lines += [f"soc {soc} {i} {g}" for i, g in enumerate(v["graphs"])]
    lines += list(extra)
    (pkg / NPU_DESCRIPTOR).write_text("\n".join(lines) + "\n")


class _ErrorTable:
    """Relative L2 error against the float graphs over a held-out sequence, positions 1.. (position 0 runs on the CPU
    in both): K and V per layer, the residual stream entering each later graph and leaving the last (whole, and the
    median over tokens). Measured with the QDQ graphs on the CPU EP (the same arithmetic the HTP does: the scheme's
    error, not the emulator's; tests check the HTP itself)."""

    def __init__(self, spec, n: int):
        self.spec, self.n, self.layers, self.hidden, self.out = spec, n, [], [], {}

    def step(self, float_group: Group, quant_group: Group, hf, hq, chunk, kv_rows, last: bool):
        """One group: the float chain's hidden states hf and the quantized chain's hq through it (position 0 through
        the float graph in both); returns the next (hf, hq)."""
        fr, qr = [], []
        hf = _through(self.spec, float_group, [hf], chunk, kv_rows, runners=fr)[0]
        hq = _through(self.spec, quant_group, [hq], chunk, kv_rows, first=float_group, runners=qr)[0]
        self._add(float_group.layers, fr[0], qr[0], hf, hq, last)
        return hf, hq

    def _add(self, layers, fr, qr, hf, hq, last: bool) -> None:
        n = self.n
        self.layers += [{"layer": x, "k": round(_rel(qr.k[x, 1:n], fr.k[x, 1:n]), 5),
                         "v": round(_rel(qr.v[x, 1:n], fr.v[x, 1:n]), 5)} for x in range(*layers)]
        self.hidden.append(_rel(hq[1:], hf[1:]))
        if last:
            per_token = np.linalg.norm(hq[1:] - hf[1:], axis=-1) / np.maximum(np.linalg.norm(hf[1:], axis=-1), 1e-30)
            self.out = {"hidden_out": round(self.hidden[-1], 5),
                        "hidden_out_token_median": round(float(np.median(per_token)), 5)}

    def result(self) -> dict:
        return {"tokens": self.n, "layers": self.layers,
                "hidden_into_group": [round(h, 5) for h in self.hidden[:-1]], **self.out}


def error_table(spec, float_groups: list[Group], quant_groups: list[Group], x, chunk: int, kv_rows: int) -> dict:
    """The compile's error table (manifest npu.error_vs_f32) of quantized graphs against their float graphs, over
    the embedded rows x of a held-out sequence."""
    t, hf, hq = _ErrorTable(spec, len(x)), x, x
    for i, (f, q) in enumerate(zip(float_groups, quant_groups)):
        hf, hq = t.step(f, q, hf, hq, chunk, kv_rows, last=i == len(float_groups) - 1)
    return t.result()
