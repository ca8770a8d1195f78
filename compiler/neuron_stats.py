"""Calibration of the neuron-bundled FFN layout (compiler/bundled_ffn.py): neuron order and group scores.

For each SwiGLU FFN, on calibration text run through the float model (models/numpy_backend.py):
    c_i      = |up row i| * |down column i|: how much neuron i's activation can move the output;
    order    neurons by mean |silu(gate_i)| * c_i, most active first, so a group holds neurons of like activity;
    scale_i  = c_i / (the layer's mean group score), the group score of a token being
             sqrt(sum over the group of (silu(gate_i) * c_i)^2): with these scales a threshold of 1 means "the
             layer's average group", whatever the layer's own activation size.
"""
from __future__ import annotations

import numpy as np

from ..models import family
from ..models.numpy_backend import NumpyGraph
from ..errors import CompileError
from .bundled_ffn import DEFAULT_THRESHOLD, BundleLayout, check_group, default_group, ffn_names

N_TOKENS, SEQ_LEN = 512, 128


class _GateCapture(NumpyGraph):
    """The reference forward pass, keeping every SwiGLU's gate pre-activation (one per FFN, in layer order)."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.gates: list[np.ndarray] = []

    def swiglu(self, gate, up):
        self.gates.append(np.asarray(gate, np.float32))
        return super().swiglu(gate, up)


def calibration_seqs(spec, tokenizer_json, calib) -> list[list[int]]:
    """Token windows of calibration text (quant/calibration.py: --calib FILE or the built-in text); random ids
    when the checkpoint has no tokenizer (the statistics then describe noise, which the manifest says)."""
    if tokenizer_json is not None and tokenizer_json.is_file():
        from ..quant.calibration import calibration_ids

        return calibration_ids(tokenizer_json, calib, n_tokens=N_TOKENS, seq_len=SEQ_LEN)
    r = np.random.default_rng(0)
    return [r.integers(0, spec.vocab_size, SEQ_LEN).tolist() for _ in range(N_TOKENS // SEQ_LEN)]


def calibrate(spec, raw, ffns: list[tuple[str, str, str]], group: int, threshold: float, seqs,
              progress=None) -> BundleLayout:
    fwd = family(spec)
    gates: list[list[np.ndarray]] = [[] for _ in ffns]
    cache: dict[str, np.ndarray] = {}

    def weight(name):
        if name not in cache:
            cache[name] = np.asarray(raw(name), np.float32)
        return cache[name]

    for i, seq in enumerate(seqs):
        g = _GateCapture(spec, weight, np.float32)
        fwd.body(g, list(seq))
        if len(g.gates) != len(ffns):
            raise AssertionError(f"{len(g.gates)} SwiGLUs ran, the traced graph has {len(ffns)}")
        for k, a in enumerate(g.gates):
            gates[k].append(a)
        if progress:
            progress(f"neuron bundles: calibration window {i + 1}/{len(seqs)}")
    lay = BundleLayout(group=group, threshold=threshold, ffns=list(ffns))
    for k, (gate, up, down) in enumerate(ffns):
        a = np.concatenate(gates[k]).astype(np.float64)
        act = a / (1 + np.exp(-a))                                     # silu(gate) [N, F]
        c = np.linalg.norm(weight(up), axis=1) * np.linalg.norm(weight(down), axis=0)
        order = np.argsort(-(np.abs(act) * c).mean(0), kind="stable")
        v = (act * c)[:, order]
        score = np.sqrt((v.reshape(len(v), -1, group) ** 2).sum(-1))  # [N, groups]
        lay.order[gate] = order.astype(np.int64)
        lay.scale[gate] = (c[order] / max(score.mean(), 1e-30)).astype(np.float32)
    return lay


def plan_layout(spec, raw, model_dir, calib, group: int | None, threshold: float | None, log) -> BundleLayout:
    """The bundled layout of a checkpoint: its FFNs, the group size, and the calibrated neuron order and scales."""
    ffns = ffn_names(spec)
    if not ffns:
        raise CompileError(f"--layout bundled applies to SwiGLU FFNs (gate, up, down without bias); {spec.arch} "
                           "has none")
    F = spec.intermediate_size
    G = default_group(F) if group is None else group
    check_group(F, G)
    seqs = calibration_seqs(spec, model_dir / "tokenizer.json", calib)
    log(f"neuron bundles: {F // G} groups of {G} neurons per FFN; calibrating the neuron order on "
        f"{sum(map(len, seqs))} tokens of {calib or 'the built-in sample'}")
    return calibrate(spec, raw, ffns, G, DEFAULT_THRESHOLD if threshold is None else threshold, seqs)
