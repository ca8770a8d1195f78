"""Core v2: one generation loop (C) behind every front end, many contexts over one model.

- `edgellm run`, Runtime.generate and bin/edgellm-run give the same tokens and text for the same prompt, seed and
  sampling arguments (greedy, sampled with the package's defaults, stop strings);
- contexts: two conversations in two threads equal two sequential runs; a second context costs its KV cache and
  arena only; multi-turn with keep_context;
- cancelling from the callback (C) and by closing a stream (Python);
- `edgellm targets` and `edgellm run` work with TVM unimportable.
"""
from __future__ import annotations

import ctypes as C
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import edgellm
from edgellm.runtime.python import lib as L

PROMPT = "def read_config(path):"


@pytest.fixture(scope="module")
def pkg(tmp_path_factory):
    """The demo model (byte-level BPE tokenizer.json + tokenizer.bin, generation_config.json that samples)."""
    return edgellm.compile("demo", quant="f32", out=tmp_path_factory.mktemp("fe") / "demo.edgellm", max_context=96,
                           prefill_chunk=16, progress=False)


def runner(pkg, *args) -> tuple[str, str]:
    r = subprocess.run([str(pkg / "bin" / "edgellm-run"), str(pkg), *map(str, args)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.rstrip("\n"), r.stderr


def cli_run(pkg, *args, env=None) -> tuple[str, str]:
    r = subprocess.run([sys.executable, "-m", "edgellm.cli", "run", str(pkg), *map(str, args)], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout.rstrip("\n"), r.stderr


CASES = {
    "greedy": ["--temperature", "0"],
    "package-defaults": ["--seed", "7"],                                   # sampled, penalties from the package
    "sampled": ["--seed", "3", "--temperature", "1.2", "--top-k", "20", "--top-p", "0.9", "--min-p", "0.02",
                "--repetition-penalty", "1.3", "--presence-penalty", "0.5", "--frequency-penalty", "0.2"],
    "stop": ["--seed", "11", "--stop", "):", "--stop", "\n\n"],
}


def api_kwargs(args: list[str]) -> dict:
    kw, stops, it = {}, [], iter(args)
    for a in it:
        v = next(it)
        if a == "--stop":
            stops.append(v)
        else:
            k = a[2:].replace("-", "_")
            kw[k] = int(v) if k in ("seed", "top_k") else float(v)
    return {**kw, "stop": stops or None}


@pytest.mark.parametrize("case", sorted(CASES))
def test_three_front_ends_same_tokens(pkg, case):
    args = CASES[case]
    with edgellm.Runtime.load(pkg) as rt:
        r = rt.generate(PROMPT, max_new_tokens=40, **api_kwargs(args))
    ids, _ = runner(pkg, "-p", PROMPT, "-n", 40, "--print-ids", *args)
    text_runner, _ = runner(pkg, "-p", PROMPT, "-n", 40, *args)
    text_cli, err = cli_run(pkg, "-p", PROMPT, "-n", 40, *args)
    assert [int(t) for t in ids.split()] == r.token_ids
    assert text_runner == text_cli == r.text
    if case == "stop":
        assert r.finish_reason == "stop" and not any(s in r.text for s in ("):", "\n\n"))
    if case == "package-defaults":
        assert "package defaults" in err


def test_greedy_matches_logits(pkg):
    """The loop's greedy tokens are the argmax of the logits, step by step (repetition penalty off)."""
    with edgellm.Runtime.load(pkg) as rt:
        ids = rt.encode(PROMPT)
        r = rt.generate(ids, max_new_tokens=12, temperature=0, repetition_penalty=1.0, ignore_eos=True)
        seq = list(ids)
        for t in r.token_ids:
            assert t == int(np.argmax(rt.logits(seq)[-1]))
            seq.append(t)


def test_contexts_in_threads_equal_sequential_runs(pkg):
    with edgellm.Runtime.load(pkg, threads=2) as rt:
        prompts = [PROMPT, "class Config:", "import os\n", "for i in range("]
        want = [rt.generate(p, max_new_tokens=24, seed=i).token_ids for i, p in enumerate(prompts)]
        ctxs = [rt.new_context(threads=1) for _ in prompts]
        got, errors = [None] * len(prompts), []

        def work(i):
            try:
                for _ in range(2):
                    got[i] = ctxs[i].generate(prompts[i], max_new_tokens=24, seed=i).token_ids
                    assert got[i] == want[i]
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        ts = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert not errors and got == want


def test_second_context_costs_kv_and_arena(pkg):
    with edgellm.Runtime.load(pkg) as rt:
        a = rt.stats()
        c = rt.new_context()
        b = c.stats()
        assert b["weight_bytes_resident"] == a["weight_bytes_resident"] == (pkg / "weights.bin").stat().st_size
        m = rt.manifest
        cfg = m["model"]["config"]
        kv = 2 * cfg["n_layers"] * m["kv_rows"] * cfg["n_kv_heads"] * cfg["head_dim"] * 4
        assert b["kv_bytes"] == kv and b["arena_bytes"] >= m["arena_bytes"]
        c.generate(PROMPT, max_new_tokens=4)
        b = c.stats()
        # KV + arena + the kernels' argument bindings (~100 bytes an argument, a few per step) + the generation's
        # buffers (logits and sampler scratch, O(vocab)): nothing of the size of the weights
        extra = b["context_bytes"] - b["kv_bytes"] - b["arena_bytes"]
        steps = sum(p["steps"] for p in m["programs"].values())
        assert 0 < extra <= 40 * cfg["vocab_size"] + 800 * steps + 65536, extra
        assert extra < b["weight_bytes_resident"] / 10


def test_keep_context_multi_turn(pkg):
    """keep_context appends to the conversation: the same tokens as one prompt of the whole transcript."""
    with edgellm.Runtime.load(pkg) as rt:
        a = rt.encode(PROMPT)
        r1 = rt.generate(a, max_new_tokens=6, temperature=0, ignore_eos=True)
        b = rt.encode("\n    return")
        r2 = rt.generate(b, max_new_tokens=6, temperature=0, ignore_eos=True, keep_context=True)
        # the last generated token of turn 1 was sampled but not decoded into the context: turn 2 starts after it
        whole = rt.generate(a + r1.token_ids[:-1] + b, max_new_tokens=6, temperature=0, ignore_eos=True)
        assert r2.token_ids == whole.token_ids
        assert rt.context.pos == len(a) + 5 + len(b) + 5


def test_cancel_from_callback_and_stream_close(pkg):
    with edgellm.Runtime.load(pkg) as rt:
        lib, ctx = rt._lib, rt.context._h
        ids = np.ascontiguousarray(rt.encode(PROMPT), np.int32)
        p = L.GenParams()
        lib.el_gen_params_default(rt._model, C.byref(p))
        p.max_new_tokens, p.ignore_eos = 50, 1
        seen = []
        CB = C.CFUNCTYPE(C.c_int, C.c_void_p, C.POINTER(L.Event))

        @CB
        def on_event(user, ev):
            seen.append(ev.contents.token)
            return 1 if len(seen) == 3 else 0

        res = L.GenResult()
        gen = lib.el_generate
        gen.restype = C.c_int
        gen.argtypes = [C.c_void_p, L.I32P, C.c_int, C.POINTER(L.GenParams), CB, C.c_void_p, C.POINTER(L.GenResult)]
        assert gen(ctx, ids.ctypes.data_as(L.I32P), ids.size, C.byref(p), on_event, None, C.byref(res)) == 0
        assert len(seen) == 3 and res.generated_tokens == 3 and L.FINISH[res.finish] == "cancelled"
        # Python: a consumer that stops early ends the generation; the context is free again
        s = rt.stream(PROMPT, max_new_tokens=50, ignore_eos=True)
        next(s)
        s.close()
        assert len(rt.generate(PROMPT, max_new_tokens=5, ignore_eos=True).token_ids) == 5


NO_TVM = "import sys; sys.modules['tvm'] = None; from edgellm.cli import main; sys.exit(main(sys.argv[1:]))"


def test_run_and_targets_without_tvm(pkg):
    """The run-time path never imports TVM: with `import tvm` failing, `edgellm run` and `targets` work."""
    r = subprocess.run([sys.executable, "-c", NO_TVM, "run", str(pkg), "-p", PROMPT, "-n", "8"], capture_output=True,
                       text=True)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    r = subprocess.run([sys.executable, "-c", NO_TVM, "targets"], capture_output=True, text=True)
    assert r.returncode == 0 and "host" in r.stdout and "android-cpu" in r.stdout, r.stderr
    r = subprocess.run([sys.executable, "-c", NO_TVM, "info", str(pkg)], capture_output=True, text=True)
    assert r.returncode == 0 and "digest: sha256:" in r.stdout, r.stderr


def test_memory_budget(pkg):
    """The budget counts the weights + one context's KV cache and arena; what does not fit is streamed."""
    size = (pkg / "weights.bin").stat().st_size
    ctx = edgellm.Runtime.plan(pkg)["context_bytes"]
    with edgellm.Runtime.load(pkg, memory_budget=f"{size + ctx}B") as rt:
        assert rt.memory()["policy"] == "resident"
        assert rt.generate([5, 6], max_new_tokens=2, ignore_eos=True).token_ids
    with pytest.raises(edgellm.PackageError, match="smaller than the weights"):
        edgellm.Runtime.load(pkg, memory_budget=size // 2, weight_policy="resident")


def test_env_free_policies(pkg, monkeypatch):
    """huge pages and mmap are load options; the EDGELLM_* variables only set their defaults in Python."""
    size = (pkg / "weights.bin").stat().st_size
    with edgellm.Runtime.load(pkg, huge_pages=False) as rt:
        assert rt.stats()["weight_bytes_huge"] == 0
    monkeypatch.setenv("EDGELLM_NO_MMAP", "1")
    with edgellm.Runtime.load(pkg) as rt:
        assert rt.stats()["weight_bytes_resident"] == size


@pytest.mark.skipif(not os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"), reason="no THP")
def test_huge_pages_option(pkg):
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
        offered = "[never]" not in f.read()
    with edgellm.Runtime.load(pkg, huge_pages=True) as rt:
        assert rt.stats()["weight_bytes_huge"] == ((pkg / "weights.bin").stat().st_size if offered else 0)
