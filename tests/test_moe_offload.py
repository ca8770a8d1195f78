"""MoE expert offload (offload/experts.c, offload/routed_cache.c; PREDICT steps in compiler/moe.py): the "experts"
store holds every other weight and caches experts in what the budget leaves, reading them when selected or when the
next layer's guess names them. At any expert budget and with any eviction policy the tokens equal the in-RAM run;
the runtime's recall counter equals the oracle's; peak memory stays inside a cgroup limit of the budget."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import edgellm
from edgellm.errors import InputError, RuntimeLoadError
from edgellm.models import load_checkpoint
from edgellm.models.numpy_backend import NumpyModel
from edgellm.models.synthetic import make_checkpoint
from edgellm.runtime.python.api import Runtime

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import memlimit  # noqa: E402
from test_window import FIXED_OVERHEAD, _memory_cgroup, run_in_memory_limit  # noqa: E402

PROMPT = [5, 9, 33, 2, 17, 250, 3, 41, 77, 12, 8, 400, 6, 19, 23, 99, 7, 300, 11, 60]
N_NEW = 24
MODELS = ("demo-moe", "mixtral")


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe_offload")
    mixtral = make_checkpoint(root / "mixtral", "MixtralForCausalLM", seed=7, vocab_size=512, hidden_size=128,
                              intermediate_size=256, num_hidden_layers=4, num_local_experts=8, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=32)
    src = {"demo-moe": "demo-moe", "mixtral": str(mixtral)}
    return {(m, q): edgellm.compile(src[m], quant=q, out=root / f"{m}-{q}", max_context=256, prefill_chunk=16,
                                    progress=False)
            for m in MODELS for q in ("f16", "q4g32")}


def budget_for(pkg: Path, pct: int, storage: str = "native") -> int:
    """Every weight but the experts, pct % of the experts, a context and the page cache the reads may hold."""
    p = Runtime.plan(pkg, weight_policy="experts", storage=storage)
    return p["pinned_bytes"] + p["routed_bytes"] * pct // 100 + p["context_bytes"] + p["cache_bytes"]


def greedy(rt, n=N_NEW) -> list[int]:
    return rt.generate(PROMPT, max_new_tokens=n, ignore_eos=True, temperature=0.0).token_ids


@pytest.fixture(scope="module")
def reference(packages):
    out = {}
    for key, pkg in packages.items():
        with Runtime.load(pkg, threads=2) as rt:
            out[key] = greedy(rt)
    return out


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("quant", ["f16", "q4g32"])
@pytest.mark.parametrize("pct", [100, 50, 25])
def test_same_tokens_at_every_expert_budget(packages, reference, model, quant, pct):
    pkg = packages[model, quant]
    budget = budget_for(pkg, pct)
    for eviction, predict in (("freq", True), ("lru", False), ("lfu", True)):
        with Runtime.load(pkg, threads=2, memory_budget=budget, weight_policy="experts", expert_eviction=eviction,
                          expert_predict=predict) as rt:
            assert greedy(rt) == reference[model, quant], (eviction, predict)
            mem, st = rt.memory(), rt.stats()
            assert mem["policy"] == "experts"
            assert mem["pinned_bytes"] + mem["routed_cache_bytes"] + mem["cache_bytes"] + mem["context_bytes"] <= budget
            assert (mem["routed_cache_bytes"] == mem["routed_bytes"]) == (pct == 100)
            k = 2 * (N_NEW - 1) * 4   # top-2 in 4 layers, every decoded token but the last sampled one
            assert st["expert_selected"] == k
            assert st["expert_cached"] + st["expert_prefetched"] <= k and st["expert_stalls"] <= k
            if predict:
                assert st["expert_predict_checked"] == k and 0 < st["expert_predicted"] <= k
            else:
                assert st["expert_predict_checked"] == 0 and st["expert_predict_reads"] == 0
            if pct == 100:   # everything fits: after the first reads nothing is read again
                assert st["expert_cached"] + st["expert_prefetched"] >= k - 2 * 4 * 8


def test_guesses_keep_lru_off_its_cliff(packages):
    """At 25%, demo-moe's LRU cache sits at the edge of its working set. A guess takes a slot only from an expert
    selected no more often than the guessed one, so guesses add few reads to what LRU reads without them: 1.2x the
    bytes per decoded token (when every guess was admitted, LRU evicted what the next tokens selected again: 2.6x)."""
    pkg = packages["demo-moe", "q4g32"]
    budget = budget_for(pkg, 25, "ufs4")
    read = {}
    for predict in (False, True):
        with Runtime.load(pkg, threads=2, memory_budget=budget, weight_policy="experts", expert_eviction="lru",
                          expert_predict=predict, storage="ufs4") as rt:
            rt.generate([1, 450, 496, 1735, 1701, 2991, 432, 975], max_new_tokens=240, ignore_eos=True,
                        temperature=0.0)
            st = rt.stats()
        read[predict] = st["decode_io_bytes_read"] / st["decode_tokens"]
    assert read[False] > 0 and read[True] <= 1.6 * read[False], read


@pytest.fixture(scope="module")
def router_f32(tmp_path_factory):
    """demo-moe in f32 guessing with the routers themselves (what the numpy oracle guesses)."""
    return edgellm.compile("demo-moe", quant="f32", out=tmp_path_factory.mktemp("router") / "p", max_context=256,
                           prefill_chunk=16, progress=False, expert_guesser="router")


def test_recall_counter_matches_the_oracle(router_f32):
    """A float package's guesses are the oracle's: the runtime's recall counts equal the numpy backend's on the
    same tokens (the router and its guess run in f32; ties are measure-zero on a trained model)."""
    with Runtime.load(router_f32, threads=2, weight_policy="experts", expert_predict=True) as rt:
        toks = greedy(rt)
        st = rt.stats()
    spec, ck, _ = load_checkpoint("demo-moe")
    m = NumpyModel(spec, ck.get, np.float32)
    m.g.expert_lookahead = 1
    m.forward(PROMPT)
    hit = tot = 0
    for t in toks[:-1]:
        m.g.selections.clear(), m.g.predictions.clear()
        m.forward([t])
        for j, sel in enumerate(m.g.selections):
            hit += len(set(m.g.predictions[j][0]) & set(sel[0]))
            tot += len(sel[0])
    assert st["expert_predict_checked"] == tot
    assert abs(st["expert_predicted"] - hit) <= 1, (st["expert_predicted"], hit)


def test_fitted_guesses_recall_more(packages, router_f32):
    """The default guesser (fitted on the built-in calibration text) recalls >= 80% of demo-moe's selections one
    layer ahead on held-out text, more than the layer's own router; the manifest records both on the calibration."""
    from edgellm.models.demo import HELDOUT

    router, fitted = router_f32, packages["demo-moe", "q4g32"]   # fitted: the default guesser
    text = HELDOUT.read_text(encoding="utf-8")
    recall = {}
    for name, pkg in (("router", router), ("fitted", fitted)):
        with Runtime.load(pkg, threads=2, weight_policy="experts", expert_predict=True) as rt:
            for start in (2000, 30000):
                rt.reset()
                rt.generate(text[start:start + 300], max_new_tokens=64, ignore_eos=True, temperature=0.0)
            st = rt.stats()
        recall[name] = st["expert_predicted"] / st["expert_predict_checked"]
    assert recall["fitted"] >= 0.8 and recall["fitted"] > recall["router"], recall
    g = Runtime.load(fitted).manifest["moe"]["guess"]
    assert g["calibration"] == "built-in text" and set(g["recall_fitted"]) == {"0", "1", "2", "3"}
    assert sum(g["selections"]["0"]) == 2 * g["calibration_tokens"]


def test_no_predictions_compiled(packages, tmp_path, reference):
    pkg = edgellm.compile("demo-moe", quant="q4g32", out=tmp_path / "p", max_context=128, prefill_chunk=16,
                          progress=False, expert_prefetch_distance=0)
    with Runtime.load(pkg, threads=2, memory_budget=budget_for(pkg, 50), weight_policy="experts", expert_predict=True) as rt:
        assert greedy(rt) == reference["demo-moe", "q4g32"]
        assert rt.stats()["expert_predict_checked"] == 0
    assert rt.manifest["moe"]["prefetch_distance"] == 0


@pytest.mark.parametrize("distance,width", [(3, 4)])
def test_guesses_further_ahead(tmp_path, reference, distance, width):
    pkg = edgellm.compile("demo-moe", quant="q4g32", out=tmp_path / "p", max_context=128, prefill_chunk=16,
                          progress=False, expert_prefetch_distance=distance, expert_guess_width=width)
    with Runtime.load(pkg, threads=2, memory_budget=budget_for(pkg, 25), weight_policy="experts", expert_predict=True) as rt:
        assert greedy(rt) == reference["demo-moe", "q4g32"]
        st = rt.stats()
    # distance d guesses layers d-1.. from layer 0's input onward: the first d-1 layers get no guess
    assert st["expert_predict_checked"] == 2 * (N_NEW - 1) * (4 - (distance - 1))


def test_hot_experts_are_read_at_load(packages, reference):
    """routing.bin (calibration selections per expert) fills the cache with the hottest experts at load (a warm
    start); the tokens do not change."""
    pkg = packages["demo-moe", "q4g32"]
    raw = (pkg / "routing.bin").read_bytes()
    assert raw[:8] == b"EDGEROUT" and np.frombuffer(raw[8:16], "<u4").tolist()[0] == 1
    sel = np.frombuffer(raw[16:], "<u4")
    with Runtime.load(pkg) as rt:
        tokens = rt.manifest["moe"]["guess"]["calibration_tokens"]
    assert (sel > 0).sum() == 32 and sel.sum() == 4 * 2 * tokens   # 4 layers, top-2, every calibration token
    m = Runtime.plan(pkg, memory_budget=budget_for(pkg, 50), weight_policy="experts")
    expert = m["routed_bytes"] // 32
    slots = m["routed_cache_bytes"] // expert
    read = {}
    for pin in (True, False):
        with Runtime.load(pkg, threads=2, memory_budget=budget_for(pkg, 50), weight_policy="experts",
                          expert_warm=pin) as rt:
            read[pin] = rt.stats()["io_bytes_read"]
            assert greedy(rt) == reference["demo-moe", "q4g32"]
    assert read[True] - read[False] == slots * expert


def test_auto_picks_the_expert_cache(packages):
    """auto: resident when everything fits, else the expert cache where the other weights fit (O_DIRECT reads: no
    page cache to budget for, so the demo's experts are worth caching)."""
    pkg = packages["demo-moe", "f16"]
    p = Runtime.plan(pkg, weight_policy="experts", direct_io=True)
    assert p["cache_bytes"] == 0 and p["minimum_budget"] < p["weights_bytes"] + p["context_bytes"]
    assert Runtime.plan(pkg, memory_budget=p["minimum_budget"], direct_io=True)["policy"] == "experts"
    assert Runtime.plan(pkg, memory_budget=p["weights_bytes"] + p["context_bytes"])["policy"] == "resident"


def test_bad_expert_options_are_one_line(packages, tmp_path):
    pkg = packages["demo-moe", "q4g32"]
    with pytest.raises(InputError, match="expert_eviction"):
        Runtime.load(pkg, weight_policy="experts", expert_eviction="mru")
    with pytest.raises(RuntimeLoadError, match="below this package's minimum") as e:
        Runtime.load(pkg, weight_policy="experts", memory_budget=budget_for(pkg, 0) - (4 << 20))
    assert "\n" not in str(e.value)
    dense = edgellm.compile("demo", quant="q4g32", out=tmp_path / "d", max_context=64, progress=False)
    with pytest.raises(RuntimeLoadError, match="no experts"):
        Runtime.load(dense, weight_policy="experts")
    with pytest.raises(edgellm.CompileError, match="mixture-of-experts"):
        edgellm.compile("demo", expert_prefetch_distance=1, out=tmp_path / "x", progress=False)
    with pytest.raises(edgellm.CompileError, match="out of range"):
        edgellm.compile("demo-moe", expert_prefetch_distance=9, out=tmp_path / "y", progress=False)
    with pytest.raises(edgellm.CompileError, match="out of range"):
        edgellm.compile("demo-moe", expert_guess_width=1, out=tmp_path / "w", progress=False)
    with pytest.raises(edgellm.CompileError, match="fitted or router"):
        edgellm.compile("demo-moe", expert_guesser="oracle", out=tmp_path / "z", progress=False)
    run = packages["demo-moe", "q4g32"] / "bin" / "edgellm-run"
    r = subprocess.run([str(run), str(pkg), "--ids", "1,2", "--expert-eviction", "mru"], capture_output=True, text=True)
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "--expert-eviction" in r.stderr


@pytest.mark.skipif(_memory_cgroup() is None, reason="needs a writable cgroup v1 memory controller")
@pytest.mark.parametrize("model", MODELS)
def test_peak_memory_stays_under_the_budget(packages, reference, model):
    pkg = packages[model, "q4g32"]
    for pct in (50, 25):
        budget = budget_for(pkg, pct)
        memlimit.evict(pkg / "weights.bin")   # pages cached by another process would not be charged to the group
        cmd = [str(pkg / "bin" / "edgellm-run"), str(pkg), "--ids", ",".join(map(str, PROMPT)), "-n", str(N_NEW),
               "--ignore-eos", "--print-ids", "--threads", "2", "--temperature", "0", "--memory-budget", str(budget),
               "--weight-policy", "experts", "--expert-predict"]
        r = run_in_memory_limit(2 * budget + FIXED_OVERHEAD, cmd)
        assert r["rc"] == 0, r["stderr"]
        assert [int(t) for t in r["stdout"].split()] == reference[model, "q4g32"]
        assert "[experts:" in r["stderr"]
        assert round(r["peak_mib"] * memlimit.MiB) <= budget + FIXED_OVERHEAD
