"""Weight windowing (offload/window.c, offload/io.c): models larger than the memory budget stream their weights from
the package every token and give the same tokens and logits as the resident run, read exactly the planned bytes,
stay inside a cgroup memory limit, and refuse a budget below the minimum with one line."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import edgellm
from edgellm.compiler.driver import compile_model
from edgellm.models.synthetic import make_checkpoint
from edgellm.runtime.python.api import Runtime

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import memlimit  # noqa: E402

SCHEMES = ("f16", "q4g32", "t2")
PROMPT = [5, 9, 33, 2, 17, 250, 3, 41, 77, 12, 8, 400, 6, 19, 23, 99, 7, 300, 11, 60]   # > one 16-token chunk
# What a process needs besides its budget under a cgroup limit: edgellm-run, libc and kernels.so text, thread
# stacks, the tokenizer (the page cache of what it maps is charged to it).
FIXED_OVERHEAD = 16 << 20


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    """An 8-layer Llama whose layers outweigh its embeddings (what real models look like), in three schemes."""
    root = tmp_path_factory.mktemp("window")
    ckpt = make_checkpoint(root / "ckpt", "LlamaForCausalLM", seed=3, vocab_size=512, hidden_size=512,
                           intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                           head_dim=64)
    return {q: compile_model(ckpt, quant=q, out=root / q, max_context=128, prefill_chunk=16, progress=False)
            for q in SCHEMES}


def budget_for(pkg: Path, pct: int, **kw) -> int:
    """pct % of the weights held, plus what the runtime needs besides: one context's KV cache and arena, and the
    page cache buffered reads may hold (the device's read-ahead; 0 with direct_io)."""
    p = Runtime.plan(pkg, memory_budget=1 << 40, weight_policy="window", **kw)
    return p["weights_bytes"] * pct // 100 + p["context_bytes"] + p["cache_bytes"]


def greedy(rt, n=10) -> list[int]:
    return rt.generate(PROMPT, max_new_tokens=n, ignore_eos=True, temperature=0.0).token_ids


@pytest.fixture(scope="module")
def reference(packages):
    out = {}
    for q, pkg in packages.items():
        with Runtime.load(pkg, threads=2) as rt:
            out[q] = (greedy(rt), rt.logits(PROMPT[:7]))
    return out


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("pct", [100, 50, 25])
@pytest.mark.parametrize("direct_io", [False, True], ids=["buffered", "direct"])
def test_same_tokens_and_logits_under_budget(packages, reference, scheme, pct, direct_io):
    pkg = packages[scheme]
    with Runtime.load(pkg, memory_budget=budget_for(pkg, pct, direct_io=direct_io), weight_policy="window",
                      threads=2, direct_io=direct_io) as rt:
        m = rt.memory()
        assert m["policy"] == "window"
        assert m["pinned_bytes"] + m["window_bytes"] + m["cache_bytes"] + m["context_bytes"] <= m["budget"]
        if pct < 100:
            assert m["streamed_bytes"] > 0 and m["streamed_weights"] > 0
        else:
            assert m["streamed_bytes"] == 0
        tokens, logits = reference[scheme]
        assert greedy(rt) == tokens
        np.testing.assert_array_equal(rt.logits(PROMPT[:7]), logits)   # the same bytes: bitwise the same result
        assert rt.stats()["weight_bytes_resident"] == m["pinned_bytes"] + m["window_bytes"] or pct == 100


@pytest.mark.parametrize("scheme", ["q4g32", "t2"])
def test_each_decode_token_reads_the_planned_bytes(packages, scheme):
    pkg = packages[scheme]
    with Runtime.load(pkg, memory_budget=budget_for(pkg, 50), weight_policy="window", threads=2) as rt:
        m = rt.memory()
        assert m["streamed_bytes"] > 0
        rt.prefill(PROMPT[:4])
        before = rt.stats()
        tok, n = 3, 8
        for _ in range(n):
            tok = int(np.argmax(rt.decode_step(tok)))
        after = rt.stats()
        # Every token reads each streamed weight once. The readers run up to one token ahead (they queue the next
        # pass when this one is all in flight), so the count over n tokens is off by at most one pass either way.
        read = after["io_bytes_read"] - before["io_bytes_read"]
        assert (n - 1) * m["streamed_bytes"] <= read <= (n + 1) * m["streamed_bytes"]
        reqs = after["io_requests"] - before["io_requests"]
        assert (n - 1) * m["requests_per_token"] <= reqs <= (n + 1) * m["requests_per_token"]
        assert after["io_dropped"] == 0   # nothing read ahead was thrown away: the order announced is the one used
        assert after["io_hits"] + after["io_misses"] > 0


def test_plan_is_what_a_load_does(packages):
    pkg = packages["q4g32"]
    for pct in (60, 30):
        b = budget_for(pkg, pct)
        planned = Runtime.plan(pkg, memory_budget=b, weight_policy="window")
        with Runtime.load(pkg, memory_budget=b, weight_policy="window") as rt:
            got = rt.memory()
        assert planned == got
        assert sum(not x for x in planned["pinned"]) == planned["streamed_weights"]


def test_smaller_budget_streams_more(packages):
    pkg = packages["f16"]
    streamed = [Runtime.plan(pkg, memory_budget=budget_for(pkg, pct), weight_policy="window")["streamed_bytes"]
                for pct in (90, 70, 50, 30)]
    assert streamed == sorted(streamed) and streamed[0] < streamed[-1]


def test_budget_below_minimum_is_one_line(packages):
    pkg = packages["f16"]
    minimum = Runtime.plan(pkg)["minimum_budget"]
    with pytest.raises(edgellm.EdgeLLMError, match=f"below this package's minimum of {minimum / 1e6:.1f} MB"):
        Runtime.load(pkg, memory_budget=minimum - 4096)
    with Runtime.load(pkg, memory_budget=minimum) as rt:   # the minimum itself runs
        assert rt.memory()["streamed_bytes"] > 0
        rt.generate(PROMPT[:3], max_new_tokens=2, ignore_eos=True)
    with pytest.raises(edgellm.EdgeLLMError, match="smaller than the weights"):
        Runtime.load(pkg, memory_budget=minimum, weight_policy="resident")
    r = subprocess.run([sys.executable, "-m", "edgellm.cli", "run", str(pkg), "-p", "hi", "--memory-budget", "1MB"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and "minimum" in r.stderr, r.stderr
    r = subprocess.run([str(pkg / "bin" / "edgellm-run"), str(pkg), "--ids", "1,2", "--memory-budget", "1M"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and "minimum" in r.stderr, r.stderr


def test_bad_store_options_are_one_line(packages):
    pkg = packages["t2"]
    for kw, msg in (({"storage": "floppy"}, "storage"), ({"weight_policy": "lru"}, "weight_policy"),
                    ({"io_threads": 9}, "io_threads")):
        with pytest.raises(edgellm.EdgeLLMError, match=msg):
            Runtime.load(pkg, memory_budget=budget_for(pkg, 50), **kw)
    r = subprocess.run([str(pkg / "bin" / "edgellm-run"), str(pkg), "--ids", "1,2", "--memory-budget", "5M",
                        "--storage", "floppy"], capture_output=True, text=True)
    assert r.returncode != 0 and "--storage takes one of native|sd" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_throttled_storage_is_no_faster_than_its_profile(packages, reference):
    """emmc: 300 MB/s + 0.2 ms per request. The limiter is a floor on time, so this cannot flake on a slow host.
    The clock spans the runtime's whole life: a read is counted when issued, and a prefetch still in flight when
    the tokens are out has its modelled time only once close() has joined the reader."""
    pkg = packages["q4g32"]
    t0 = time.perf_counter()
    with Runtime.load(pkg, memory_budget=budget_for(pkg, 25), weight_policy="window", storage="emmc",
                      threads=2) as rt:
        m = rt.memory()
        assert m["storage"] == "emmc" and not m["storage_modelled"] and m["storage_bytes_per_s"] == 300e6
        assert greedy(rt, 4) == reference["q4g32"][0][:4]
        read = rt.stats()["io_bytes_read"]
    elapsed = time.perf_counter() - t0
    assert read >= 3 * m["streamed_bytes"]   # 3 decode tokens, and the prompt's chunks
    assert elapsed >= read / 300e6


def test_modelled_storage_is_labelled(packages, reference):
    pkg = packages["t2"]
    with Runtime.load(pkg, memory_budget=budget_for(pkg, 50, storage="ufs4"), weight_policy="window",
                      storage="ufs4") as rt:
        m = rt.memory()
        assert m["storage_modelled"] == 1 and m["direct_io"] == 0 and "modelled" in m["storage_what"]
        assert greedy(rt, 4) == reference["t2"][0][:4]
    r = subprocess.run([sys.executable, "-m", "edgellm.cli", "plan", str(pkg), "--memory-budget",
                        str(budget_for(pkg, 50, storage="ufs4")), "--storage", "ufs4", "--weight-policy", "window"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "modelled" in r.stdout and "streamed every token" in r.stdout, r.stderr


def test_plan_cli(packages):
    pkg = packages["f16"]
    b = budget_for(pkg, 40)
    r = subprocess.run([sys.executable, "-m", "edgellm.cli", "plan", str(pkg), "--memory-budget", str(b), "--json",
                        "--weight-policy", "window"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    import json

    p = json.loads(r.stdout)
    assert p["policy"] == "window"
    assert p["streamed_bytes"] == Runtime.plan(pkg, memory_budget=b, weight_policy="window")["streamed_bytes"] > 0
    assert p["storage_bound_tok_s"] is None or p["storage_bound_tok_s"] > 0
    r = subprocess.run([sys.executable, "-m", "edgellm.cli", "plan", str(pkg)], capture_output=True, text=True)
    assert r.returncode == 0 and "all weights resident" in r.stdout


def test_contexts_on_threads_share_a_window(packages, reference):
    """One program runs at a time on a windowed store; results stay exact from any number of threads."""
    pkg = packages["q4g32"]
    with Runtime.load(pkg, memory_budget=budget_for(pkg, 40), weight_policy="window", threads=1) as rt:
        ctxs = [rt.new_context(threads=1) for _ in range(3)]
        out = [None] * 3

        def work(i):
            out[i] = ctxs[i].generate(PROMPT, max_new_tokens=6, ignore_eos=True, temperature=0.0).token_ids
        ts = [threading.Thread(target=work, args=(i,)) for i in range(3)]
        [t.start() for t in ts]
        [t.join(60) for t in ts]
        assert out == [reference["q4g32"][0][:6]] * 3


def test_weights_changing_under_a_window_is_an_error(packages, tmp_path):
    import shutil

    pkg = Path(shutil.copytree(packages["t2"], tmp_path / "pkg"))
    with Runtime.load(pkg, memory_budget=budget_for(pkg, 30), weight_policy="window") as rt:
        size = (pkg / "weights.bin").stat().st_size
        os.truncate(pkg / "weights.bin", size // 3)
        with pytest.raises(edgellm.EdgeLLMError, match="changed while in use"):
            rt.generate(PROMPT, max_new_tokens=3, ignore_eos=True)


# --- peak memory inside a cgroup v1 memory limit --------------------------------------------------------------------

def _memory_cgroup() -> Path | None:
    parent = memlimit.cgroup_parent()
    return parent if parent and (parent / "memory.limit_in_bytes").exists() and os.access(parent, os.W_OK) else None


def run_in_memory_limit(limit: int, cmd: list[str]) -> dict:
    """bench/memlimit.run_limited, skipping where the memory controller is listed but not ours to divide."""
    try:
        return memlimit.run_limited(cmd, limit, timeout=300, prefix="edgellm_test_")
    except OSError as e:
        pytest.skip(f"cannot make a memory cgroup: {e}")


@pytest.mark.skipif(_memory_cgroup() is None, reason="needs a writable cgroup v1 memory controller")
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("direct", [[], ["--direct-io"]], ids=["buffered", "direct"])
def test_peak_memory_stays_under_the_budget(packages, reference, scheme, direct):
    pkg = packages[scheme]
    for pct in (50, 25):
        budget = budget_for(pkg, pct, direct_io=bool(direct))
        memlimit.evict(pkg / "weights.bin")   # pages cached by another process would not be charged to the group
        cmd = [str(pkg / "bin" / "edgellm-run"), str(pkg), "--ids", ",".join(map(str, PROMPT)), "-n", "10",
               "--ignore-eos", "--print-ids", "--threads", "2", "--temperature", "0", "--memory-budget", str(budget),
               "--weight-policy", "window"]
        # a limit with room to spare: the kernel does not squeeze the page cache, so the peak is what the runtime
        # itself holds (weights, ring, KV, arena, and the read-ahead the window leaves cached)
        r = run_in_memory_limit(2 * budget + FIXED_OVERHEAD, cmd + direct)
        assert r["rc"] == 0, r["stderr"]
        assert [int(t) for t in r["stdout"].split()] == reference[scheme][0]
        assert "streamed per token" in r["stderr"]
        peak = round(r["peak_mib"] * memlimit.MiB)
        assert peak <= budget + FIXED_OVERHEAD


def test_bench_reports_streaming(packages):
    import json

    pkg = packages["q4g32"]
    b = budget_for(pkg, 40)
    r = subprocess.run([sys.executable, "-m", "edgellm.cli", "bench", str(pkg), "--memory-budget", str(b),
                        "--weight-policy", "window", "--prompt-len", "8", "--gen-len", "4", "--reps", "1", "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    planned = Runtime.plan(pkg, memory_budget=b, weight_policy="window")
    assert out["weight_policy"] == "window" and out["streamed_bytes_per_token"] == planned["streamed_bytes"] > 0
    assert out["io_bytes_read"] >= planned["pinned_bytes"] + 4 * planned["streamed_bytes"]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_minimum_budget_runs_to_the_end(packages, reference, scheme):
    """At the minimum the ring holds exactly the largest step's weights (the lm_head's packed codes and scales): a
    step's weights get ring space together, else the first could sit where the second cannot follow and wait forever
    (a subprocess with a timeout: a hang fails, not blocks)."""
    pkg = packages[scheme]
    b = Runtime.plan(pkg, memory_budget=1 << 40, weight_policy="window")["minimum_budget"]
    r = subprocess.run([str(pkg / "bin" / "edgellm-run"), str(pkg), "--ids", ",".join(map(str, PROMPT)), "-n", "10",
                        "--ignore-eos", "--print-ids", "--threads", "2", "--temperature", "0", "--memory-budget",
                        str(b), "--weight-policy", "window"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert [int(t) for t in r.stdout.split()] == reference[scheme][0]
