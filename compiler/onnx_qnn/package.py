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
from ...runtime import qnn_ort
from ...runtime.contract import NPU_DESCRIPTOR, NPU_OUTLIERS, NPU_ROPE
from ...runtime.npu_chunks import MASK_VALUE, ChunkRunner, Group
from ..driver import _log
from .graph import trace_group
from .outliers import choose as choose_outliers
from .outliers import specs as outlier_specs
from .outliers import split_groups
from .quantize import NPU_QUANTS, quantize_group, widened_ranges

# Weights per group graph. The HTP's context limit is 4 GB (ExecuTorch and llama.cpp's Hexagon backend split there);
# 256 M float weights is 256 MB as int8: a 1B model in 4-5 graphs, a 7B in ~26, each prepared in reasonable memory.
GROUP_PARAMS = 256 * 2**20
CALIB_TOKENS, CALIB_SEQ = 1024, 256


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


def _sessions(paths, groups, backend, soc=None, cpu_parts=None):
    out = []
    for p, (l0, l1) in zip(paths, groups):
        s = qnn_ort.session(p, backend=backend, soc=soc)
        parts = tuple((cpu_parts or {})[x] for x in range(l0, l1) if x in (cpu_parts or {}))
        out.append(Group((l0, l1), s, tuple(i.name for i in s.get_inputs()), parts))
    return out


def _float_graphs(work: Path, spec, weight, chunk, kv_rows, groups, chosen=None, expose_act=False) -> list[Path]:
    paths = []
    for i, (l0, l1) in enumerate(groups):
        p = work / f"group{i}.onnx"
        m = trace_group(spec, weight, chunk, kv_rows, l0, l1, {x: chosen[x] for x in chosen or {} if l0 <= x < l1},
                        expose_act)
        onnx.save(m, str(p), save_as_external_data=True, location=p.name + ".data", size_threshold=1024)
        paths.append(p)
    return paths


def _activation_maxima(work: Path, spec, weight, chunk, kv_rows, groups, embed, seqs) -> dict[int, np.ndarray]:
    """Per layer, the largest |value| of every FFN down-projection input channel over the calibration text."""
    sessions = _sessions(_float_graphs(work, spec, weight, chunk, kv_rows, groups, expose_act=True), groups, "cpu")
    mx: dict[int, np.ndarray] = {}

    def see(gi, outs):
        for name, v in outs.items():
            if name.startswith("act"):
                layer, m = int(name[3:]), np.abs(v).max(0)
                mx[layer] = np.maximum(mx.get(layer, m), m)

    for s in seqs:
        ChunkRunner(spec, sessions, chunk, kv_rows).prefill(embed[s], observe_out=see)
    return mx


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
              socs: list[str] = (), calib: str | None = None, gptq: dict | None = None, outliers: bool = True,
              progress: bool = True) -> dict:
    """Writes pkg/npu/ and returns the manifest's "npu" section. gptq: the CPU package's GPTQ q4 parts by weight
    name (compile --gptq), whose codes and scales w4a16 reuses (None: round-to-nearest)."""
    from ...quant.calibration import calibration_ids

    if quant not in NPU_QUANTS:
        raise CompileError(f"--npu-quant {quant} is not supported (choose one of {', '.join(NPU_QUANTS)})")
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
    seqs = calibration_ids(tokenizer_json, calib, n_tokens=CALIB_TOKENS + CALIB_SEQ, seq_len=CALIB_SEQ)
    held, seqs = (seqs[-1], seqs[:-1]) if len(seqs) > 1 else (seqs[0], seqs)
    embed = np.asarray(weight("model.embed_tokens.weight"), np.float32)
    groups = plan_groups(spec)
    chosen = {}
    if outliers:   # shadow outlier execution: which layers, channels and thresholds (a float pass over the text)
        chosen = choose_outliers(_activation_maxima(work, spec, weight, chunk, kv_rows, groups, embed, seqs))
        groups = split_groups(groups, chosen)
        _log(progress, f"NPU: outlier channels on the CPU for {len(chosen)} layer(s): " + ", ".join(
            f"L{x} {len(c)} ch > {t:.3g}" for x, (t, c) in sorted(chosen.items())) if chosen else
            "NPU: no layer has outlier activation channels")
    cpu_parts = outlier_specs(chosen, weight)
    _log(progress, f"NPU: {len(groups)} graph(s) of layers {', '.join(f'{a}-{b - 1}' for a, b in groups)}, chunk {chunk}, "
                   f"{quant}")
    fpaths = _float_graphs(work, spec, weight, chunk, kv_rows, groups, chosen)
    float_groups = _sessions(fpaths, groups, "cpu", cpu_parts=cpu_parts)

    # calibration: the float graphs on the CPU EP over text, every group's feeds and outputs recorded
    feeds: list[list[dict]] = [[] for _ in groups]
    for s in seqs:
        r = ChunkRunner(spec, float_groups, chunk, kv_rows)
        r.prefill(embed[s], observe=lambda gi, f: feeds[gi].append(f))
    outs = [[dict(zip([o.name for o in g.session.get_outputs()], g.session.run(None, f))) for f in fs]
            for g, fs in zip(float_groups, feeds)]
    qpaths, formats = [], set()
    for i, p in enumerate(fpaths):
        q = out / p.name
        try:
            formats.add(quantize_group(p, q, feeds[i], widened_ranges(feeds[i], outs[i]), quant, gptq))
        except CompileError:
            raise
        except Exception as e:   # the quantization tool's own errors
            raise CompileError(f"NPU quantization of graph {i} failed: {first_line(e)}") from e
        qpaths.append(q)
        _log(progress, f"NPU: graph {i} quantized ({sum(f.stat().st_size for f in out.glob(q.name + '*')) / 2**20:.1f} MiB)")
    error = _error_table(spec, float_groups, _sessions(qpaths, groups, "cpu", cpu_parts=cpu_parts), embed[held], chunk,
                         kv_rows)
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
                      _write_outliers(pkg, cpu_parts) if cpu_parts else [])
    return {
        "chunk": chunk, "kv_rows": kv_rows, "quant": quant, "weights": "; ".join(sorted(formats)),
        "mask_value": MASK_VALUE,
        "descriptor": NPU_DESCRIPTOR,
        "outliers": {str(x): {"threshold": t, "channels": c} for x, (t, c) in sorted(chosen.items())},
        "groups": [{"layers": [l0, l1], "graph": str(q.relative_to(pkg)),
                    "bytes": sum(f.stat().st_size for f in out.glob(q.name + "*")),
                    "inputs": [i.name for i in g.session.get_inputs()]}
                   for q, (l0, l1), g in zip(qpaths, groups, float_groups)],
        "socs": soc_files,
        "calibration": {"source": calib or "built-in sample", "sequences": len(seqs), "tokens": sum(map(len, seqs))},
        "error_vs_f32": error,
        "seconds": round(time.perf_counter() - t0, 2),
    }


def _write_descriptor(pkg: Path, spec, chunk, kv_rows, qpaths, groups, soc_files, extra=()) -> None:
    """npu/npu.txt and npu/rope.bin: what the C runtime's QNN backend (runtime/backend_qnn_ort.c) reads."""
    from ...runtime.npu_chunks import rope_rows

    cos, sin = rope_rows(spec, 0, kv_rows)
    np.concatenate([cos.reshape(kv_rows, -1), sin.reshape(kv_rows, -1)]).astype("<f4").tofile(pkg / NPU_ROPE)
    lines = ["edgellm-npu 1", f"chunk {chunk}", f"kv_rows {kv_rows}", f"mask_value {MASK_VALUE}", f"rope {NPU_ROPE}"]
    lines += [f"group {l0} {l1} {q.relative_to(pkg).as_posix()}" for q, (l0, l1) in zip(qpaths, groups)]
    for soc, v in soc_files.items():
        lines += [f"soc {soc} {i} {g}" for i, g in enumerate(v["graphs"])]
    lines += list(extra)
    (pkg / NPU_DESCRIPTOR).write_text("\n".join(lines) + "\n")


def _error_table(spec, float_groups, quant_groups, x, chunk, kv_rows) -> dict:
    """Relative L2 error against the float graphs over a held-out calibration sequence: K and V per layer, the
    residual stream entering each later graph and leaving the last. Measured with the QDQ graphs on the CPU EP (the
    same arithmetic the HTP does: the scheme's error, not the emulator's; tests check the HTP itself)."""
    f = ChunkRunner(spec, float_groups, chunk, kv_rows)
    q = ChunkRunner(spec, quant_groups, chunk, kv_rows)
    hf, hq = [], []
    yf = f.prefill(x, observe=lambda gi, feeds: hf.append((gi, feeds["x"])))
    yq = q.prefill(x, observe=lambda gi, feeds: hq.append((gi, feeds["x"])))
    n = len(x)
    layers = [{"layer": layer, "k": round(_rel(q.k[layer, :n], f.k[layer, :n]), 5),
               "v": round(_rel(q.v[layer, :n], f.v[layer, :n]), 5)} for layer in range(spec.n_layers)]
    hidden = {}
    for (gi, a), (_, b) in zip(hq, hf):
        hidden.setdefault(gi, []).append((a, b))
    groups = [round(_rel(np.concatenate([a for a, _ in v]), np.concatenate([b for _, b in v])), 5)
              for gi, v in sorted(hidden.items()) if gi > 0]
    return {"tokens": n, "layers": layers, "hidden_into_group": groups, "hidden_out": round(_rel(yq, yf), 5)}
