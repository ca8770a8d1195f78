"""The neuron window (compile --layout bundled; compiler/bundled_ffn.py, offload/routed_cache.c): FFN neurons stored
in bundles, a token's active groups chosen from the full gate projection, only missing bundles read.

Threshold 0 is exact: the same logits as the dense package (f16: to rounding), and under budgets of 100/50/25 % of
the weights the same tokens and bitwise the same logits as the resident run of the bundled package, inside a cgroup
memory limit. A threshold skips groups, reads fewer bytes, and a windowed run still matches its resident run."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import edgellm
from edgellm.compiler.driver import compile_model
from edgellm.models.synthetic import make_checkpoint
from edgellm.runtime.python.api import Runtime

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_window import FIXED_OVERHEAD, PROMPT, _memory_cgroup, budget_for, greedy, run_in_memory_limit  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import memlimit  # noqa: E402

SCHEMES = ("f16", "q4g32", "t2")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("neurons")
    return make_checkpoint(root / "ckpt", "LlamaForCausalLM", seed=5, vocab_size=512, hidden_size=256,
                           intermediate_size=2048, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=64)


@pytest.fixture(scope="module")
def packages(ckpt):
    root = ckpt.parent
    return {q: compile_model(ckpt, quant=q, out=root / q, max_context=128, prefill_chunk=16, progress=False,
                             layout="bundled", tune="off") for q in SCHEMES}


@pytest.fixture(scope="module")
def reference(packages):
    out = {}
    for q, pkg in packages.items():
        with Runtime.load(pkg, threads=2, ffn_threshold=0) as rt:
            out[q] = (greedy(rt), rt.logits(PROMPT[:7]))
    return out


def test_layout_is_in_the_manifest(packages):
    import json

    m = json.loads((packages["q4g32"] / "manifest.json").read_text())
    assert m["ffn"]["layout"] == "bundled" and m["ffn"]["group"] == 32
    assert m["ffn"]["groups_per_ffn"] == [64] * 6
    names = [t["name"] for t in m["tensors"]]
    assert "model.layers.0.mlp.bundle.63" in names and "model.layers.0.mlp.up_proj.weight" not in names


def test_f16_bundles_compute_the_dense_ffn(ckpt, packages, reference):
    dense = compile_model(ckpt, quant="f16", out=ckpt.parent / "dense-f16", max_context=128, prefill_chunk=16,
                          progress=False, tune="off")
    with Runtime.load(dense, threads=2) as rt:
        want = rt.logits(PROMPT[:7])
        ctx = rt.new_context()
        ctx.prefill(PROMPT[:4])
        want_dec = [ctx.decode_step(t) for t in PROMPT[4:7]]
    got = reference["f16"][1]
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= 1e-5 * scale       # neurons reordered and summed by group: rounding only
    with Runtime.load(packages["f16"], threads=2, ffn_threshold=0) as rt:
        ctx = rt.new_context()
        ctx.prefill(PROMPT[:4])
        dec = [ctx.decode_step(t) for t in PROMPT[4:7]]
        st = ctx.stats()
    assert np.abs(np.array(dec) - np.array(want_dec)).max() <= 1e-5 * scale
    assert st["routed_selected"] == st["routed_possible"] > 0   # threshold 0 runs every group


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("pct", [100, 50, 25])
def test_same_tokens_under_budget_at_threshold_0(packages, reference, scheme, pct):
    pkg = packages[scheme]
    with Runtime.load(pkg, memory_budget=budget_for(pkg, pct), weight_policy="window", threads=2,
                      ffn_threshold=0) as rt:
        m = rt.memory()
        assert m["routed_bytes"] > 0
        assert m["pinned_bytes"] + m["window_bytes"] + m["routed_cache_bytes"] + m["cache_bytes"] + \
            m["context_bytes"] <= m["budget"]
        if pct < 100:   # bundles stream (the ones the last token ran), the others are read on demand
            assert m["streamed_bytes"] > 0 and 0 < m["routed_cache_bytes"] < m["routed_bytes"]
        tokens, logits = reference[scheme]
        assert greedy(rt) == tokens
        np.testing.assert_array_equal(rt.logits(PROMPT[:7]), logits)
        st = rt.stats()
        assert st["io_routed_hits"] == st["routed_selected"] > 0   # threshold 0: every group predicted
        assert st["io_routed_misses"] == 0
        assert st["weight_bytes_resident"] == m["pinned_bytes"] + m["window_bytes"] + m["routed_cache_bytes"]


def _decode_reads(rt, n=8, **kw) -> tuple[float, dict]:
    rt.prefill(PROMPT[:4])
    before = rt.stats()
    tok = 3
    for _ in range(n):
        tok = int(np.argmax(rt.decode_step(tok)))
    after = rt.stats()
    return (after["io_bytes_read"] - before["io_bytes_read"]) / n, after


def test_threshold_reads_fewer_bytes_and_matches_its_resident_run(packages):
    pkg = packages["q4g32"]
    with Runtime.load(pkg, threads=2, ffn_threshold=1.0) as rt:
        want = greedy(rt)
        assert rt.stats()["routed_selected"] < rt.stats()["routed_possible"]
    b = budget_for(pkg, 25)
    with Runtime.load(pkg, memory_budget=b, weight_policy="window", threads=2, ffn_threshold=1.0) as rt:
        assert greedy(rt) == want
    per_token = {}
    for thr in (0.0, 1.0):
        with Runtime.load(pkg, memory_budget=b, weight_policy="window", threads=2, ffn_threshold=thr) as rt:
            per_token[thr], st = _decode_reads(rt)
            if thr:
                assert st["routed_selected"] < 0.9 * st["routed_possible"]
    assert per_token[1.0] < 0.9 * per_token[0.0]


def test_unpredicted_groups_are_read_on_demand(packages):
    """A pass streams the groups the last one ran; a group selected that was not is read on its own (a miss), and the
    tokens stay those of the resident run."""
    pkg = packages["q4g32"]
    with Runtime.load(pkg, threads=2, ffn_threshold=1.0) as rt:
        want = greedy(rt, 16)
    with Runtime.load(pkg, memory_budget=budget_for(pkg, 50), weight_policy="window", threads=2,
                      ffn_threshold=1.0) as rt:
        assert greedy(rt, 16) == want
        st = rt.stats()
    assert st["io_routed_hits"] + st["io_routed_misses"] == st["routed_selected"]
    assert st["io_routed_misses"] > 0 and st["io_routed_hits"] > st["io_routed_misses"]
    assert st["io_dropped"] > 0    # predicted groups the next token did not run


def test_budget_holding_everything_reads_nothing_per_token(packages):
    pkg = packages["q4g32"]
    with Runtime.load(pkg, memory_budget=1 << 40, weight_policy="window", threads=2, ffn_threshold=0) as rt:
        assert rt.memory()["streamed_bytes"] == 0
        per_token, st = _decode_reads(rt)
    assert per_token == 0
    assert st["io_routed_hits"] == st["routed_selected"] > 0


def test_threshold_option_errors(packages):
    pkg = packages["q4g32"]
    for bad in (-1, float("nan"), "x", True):
        with pytest.raises(edgellm.EdgeLLMError, match="ffn_threshold"):
            Runtime.load(pkg, ffn_threshold=bad)
    r = subprocess.run([str(pkg / "bin" / "edgellm-run"), str(pkg), "--ids", "1,2", "--ffn-threshold", "-2"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and "--ffn-threshold" in r.stderr


def test_compile_errors_are_one_line(ckpt, tmp_path):
    exe = [sys.executable, "-m", "edgellm.cli", "compile", str(ckpt), "--layout", "bundled", "--quiet"]
    for extra, msg in ((["--bundle-neurons", "48"], "multiple of 32"), (["--quant", "q4g32", "--gptq"], "--gptq"),
                       (["--ffn-threshold", "-1"], "--ffn-threshold")):
        r = subprocess.run(exe + extra + ["-o", str(tmp_path / "x")], capture_output=True, text=True)
        assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and msg in r.stderr, r.stderr
        assert not (tmp_path / "x").exists()
    r = subprocess.run([sys.executable, "-m", "edgellm.cli", "compile", str(ckpt), "--ffn-threshold", "1", "--quiet",
                        "-o", str(tmp_path / "y")], capture_output=True, text=True)
    assert r.returncode != 0 and "--layout bundled" in r.stderr


def test_bitnet_has_no_swiglu_to_bundle(tmp_path):
    # BitNet's FFN is relu2 with a norm over all neurons before down: not a sum of independent groups
    with pytest.raises(edgellm.EdgeLLMError, match="SwiGLU"):
        compile_model("demo-bitnet", out=tmp_path / "o", layout="bundled", progress=False, tune="off")
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(_memory_cgroup() is None, reason="needs a writable cgroup v1 memory controller")
@pytest.mark.parametrize("scheme", SCHEMES)
def test_peak_memory_stays_under_the_budget(packages, reference, scheme):
    pkg = packages[scheme]
    for pct in (50, 25):
        budget = budget_for(pkg, pct)
        memlimit.evict(pkg / "weights.bin")
        cmd = [str(pkg / "bin" / "edgellm-run"), str(pkg), "--ids", ",".join(map(str, PROMPT)), "-n", "10",
               "--ignore-eos", "--print-ids", "--threads", "2", "--temperature", "0", "--memory-budget", str(budget),
               "--weight-policy", "window", "--ffn-threshold", "0"]
        r = run_in_memory_limit(2 * budget + FIXED_OVERHEAD, cmd)
        assert r["rc"] == 0, r["stderr"]
        assert [int(t) for t in r["stdout"].split()] == reference[scheme][0]
        assert round(r["peak_mib"] * memlimit.MiB) <= budget + FIXED_OVERHEAD


@pytest.mark.parametrize("threshold", ["0.5", "1", "2"])
def test_minimum_budget_never_stalls(packages, threshold):
    """The smallest budget (a ring of a few bundles, the unpredicted-group cache of two): 48 tokens of changing
    selections finish, with the resident run's tokens (a subprocess with a timeout: a hang fails, not blocks)."""
    pkg = packages["q4g32"]
    b = Runtime.plan(pkg, memory_budget=1 << 40, weight_policy="window")["minimum_budget"]
    base = [str(pkg / "bin" / "edgellm-run"), str(pkg), "--ids", ",".join(map(str, PROMPT)), "-n", "48",
            "--ignore-eos", "--print-ids", "--threads", "2", "--temperature", "0", "--ffn-threshold", threshold]
    want = subprocess.run(base, capture_output=True, text=True, timeout=120)
    got = subprocess.run(base + ["--memory-budget", str(b), "--weight-policy", "window"], capture_output=True,
                         text=True, timeout=120)
    assert want.returncode == 0 and got.returncode == 0, got.stderr
    assert got.stdout.split() == want.stdout.split()
    assert "routed:" in got.stderr
