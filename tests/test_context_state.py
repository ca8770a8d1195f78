"""Saved contexts (issue 38, prompt caches on storage; runtime/core/state.c): a context saved to a file and loaded
into another context of the same package holds the same KV rows, position and ids, bit for bit (its next logits equal
the original's), also with window caches that have moved; a prompt that starts with what it holds prefills only the
rest and gives a fresh context's tokens; files from another package, truncated or damaged files and files that are
not saved contexts are refused in one line, the context left as it was or empty; writes are atomic; `edgellm run
--prompt-cache` reuses a saved prompt across runs and never overwrites a file that is not one."""
from __future__ import annotations

import os
import re
import subprocess

import numpy as np
import pytest
from click.testing import CliRunner

import edgellm
from edgellm.errors import EdgeLLMError
from edgellm.models.synthetic import make_checkpoint

from real_checkpoints import enabled, gguf_file

CTX, CHUNK = 256, 8
LONG = [int(t) for t in np.random.default_rng(5).integers(3, 400, 150)]


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory):
    """Gemma 2 with window caches (layers 0 and 2, window 5: they move every 64 positions), f32."""
    root = tmp_path_factory.mktemp("state")
    d = make_checkpoint(root / "ck", "Gemma2ForCausalLM", seed=30, num_hidden_layers=3, tie_word_embeddings=True)
    return edgellm.compile(str(d), out=root / "pkg", quant="f32", max_context=CTX, prefill_chunk=CHUNK, progress=False)


@pytest.mark.parametrize("which", ["gemma2", "demo_q8"])
def test_a_loaded_context_continues_bit_for_bit(which, request, tmp_path):
    pkg = request.getfixturevalue(which)
    with edgellm.Runtime.load(pkg, threads=2) as rt:
        a = rt.new_context()
        prompt = LONG[:40] if which == "gemma2" else rt.encode("def parse(line):\n    name, _, value = line.")
        first = a.generate(prompt, max_new_tokens=120 if which == "gemma2" else 24, ignore_eos=True, temperature=0)
        held = a.cached
        assert len(held) == a.pos == len(prompt) + len(first.token_ids) - 1
        if which == "gemma2":
            assert a.stats()["kv_window_moves"] > 0   # the window caches' rows start past position 0
        f = tmp_path / "ctx.state"
        a.save(f)
        b = rt.new_context()
        b.generate(prompt[:5], max_new_tokens=3)   # something to replace
        assert b.load(f) == len(held) and b.cached == held and b.pos == a.pos
        nxt = first.token_ids[-1]
        assert np.array_equal(a.decode_step(nxt), b.decode_step(nxt))
        # a prompt that starts with what it holds: only the rest is prefilled, and the tokens are a fresh context's
        c = rt.new_context()
        c.load(f)
        more = held + [nxt, 7, 8, 9]
        got = c.generate(more, max_new_tokens=16, ignore_eos=True, temperature=0, reuse_prefix=True)
        want = rt.new_context().generate(more, max_new_tokens=16, ignore_eos=True, temperature=0)
        assert got.cached_tokens == len(held) and got.token_ids == want.token_ids


@pytest.mark.parametrize("speculate", ["off", "recycle"])
def test_the_context_knows_its_tokens(demo_q8, speculate):
    """The C context keeps the id at each position (el_context_tokens: what a save writes), through prefill, decode,
    and verify passes whose tree rows it takes, and a rewind; they are the ids Python fed it."""
    with edgellm.Runtime.load(demo_q8, threads=2) as rt:
        ctx = rt.new_context()
        p = rt.encode("def add(a, b):\n    return a + b\n\ndef add(a, b):\n")
        r = ctx.generate(p, max_new_tokens=40, temperature=0, ignore_eos=True, speculate=speculate)
        if speculate != "off":
            assert ctx.stats()["spec_accepted"] > 0
        assert ctx._tokens(ctx._handle()) == ctx.cached == p + r.token_ids[:-1]
        ctx.rewind(10)
        ctx.decode_step(5)
        assert ctx._tokens(ctx._handle()) == p[:10] + [5]


def test_bad_files_are_refused_in_one_line(demo_q8, gemma2, tmp_path):
    with edgellm.Runtime.load(demo_q8, threads=2) as rt:
        ctx = rt.new_context()
        ctx.generate(rt.encode("print("), max_new_tokens=8)
        good = tmp_path / "good.state"
        ctx.save(good)
        data = good.read_bytes()
        cases = {"truncated": (data[:-7], "damaged (wrong size)"),
                 "flipped": (data[:300] + bytes([data[300] ^ 1]) + data[301:], "damaged (its checksum differs)"),
                 "not-a-state": (b"hello, world\n" * 40, "is not a saved edgellm context"),
                 "empty": (b"", "is not a saved edgellm context")}
        for name, (body, msg) in cases.items():
            p = tmp_path / name
            p.write_bytes(body)
            held = rt.new_context()
            held.generate(rt.encode("x = "), max_new_tokens=4)
            before = held.cached
            with pytest.raises(EdgeLLMError, match=re.escape(msg)) as e:
                held.load(p)
            assert "\n" not in str(e.value)
            # refused before a cache row was written: as it was; refused after: empty, never half-loaded
            assert held.cached == (before if name != "flipped" else []) and held.pos == len(held.cached)
            assert p.read_bytes() == body   # never rewritten
        with pytest.raises(EdgeLLMError, match="No such file"):
            ctx.load(tmp_path / "missing.state")
        with pytest.raises(EdgeLLMError, match="not a file"):
            ctx.load(tmp_path)
    with edgellm.Runtime.load(gemma2, threads=2) as other:
        with pytest.raises(EdgeLLMError, match="another package"):
            other.context.load(good)


def test_saving_is_atomic(demo_q8, tmp_path):
    with edgellm.Runtime.load(demo_q8, threads=2) as rt:
        ctx = rt.new_context()
        ctx.generate(rt.encode("import os\n"), max_new_tokens=8)
        f = tmp_path / "c.state"
        f.write_bytes(b"old")
        ctx.save(f)   # replaces the file as a whole
        assert f.read_bytes()[:8] == b"ELSTATE1" and sorted(os.listdir(tmp_path)) == ["c.state"]
        with pytest.raises(EdgeLLMError, match="cannot write"):
            ctx.save(tmp_path / "no-such-dir" / "c.state")
        ro = tmp_path / "ro"
        ro.mkdir()
        (ro / "c.state").write_bytes(b"kept")
        os.chmod(ro, 0o500)
        try:
            if not os.access(ro, os.W_OK):   # (root writes anywhere)
                with pytest.raises(EdgeLLMError, match="cannot write"):
                    ctx.save(ro / "c.state")
                assert (ro / "c.state").read_bytes() == b"kept" and os.listdir(ro) == ["c.state"]
        finally:
            os.chmod(ro, 0o700)


def test_run_prompt_cache_reuses_the_prompt_across_runs(demo_q8, tmp_path):
    from edgellm.cli import cli

    f = tmp_path / "prompt.state"
    args = ["run", str(demo_q8), "-p", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
            "-n", "12", "--temperature", "0", "--prompt-cache", str(f)]
    first = CliRunner().invoke(cli, args)
    assert first.exit_code == 0, first.output
    assert "prompt cache" in first.stderr and " 0 of " in first.stderr and f.read_bytes()[:8] == b"ELSTATE1"
    again = CliRunner().invoke(cli, args)
    assert again.exit_code == 0 and again.stdout == first.stdout
    n_prompt = int(again.stderr.split("were in it")[0].split("of ")[-1].split()[0])
    assert f" {n_prompt - 1} of {n_prompt} " in again.stderr   # all but the last prompt token (its logits are needed)
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    bad = CliRunner().invoke(cli, args[:-1] + [str(notes)])
    assert isinstance(bad.exception, EdgeLLMError) and "not a saved edgellm context" in str(bad.exception)
    assert notes.read_text() == "my notes\n"


def test_edgellm_run_and_python_share_prompt_caches(demo_q8, tmp_path):
    """bin/edgellm-run (built from the shipped sources) loads a context Python saved, prefills only the rest of the
    prompt, gives Python's tokens, and saves what it then holds, which Python loads."""
    from edgellm.compiler.device_binary import CLI, LIB_SOURCES

    exe = tmp_path / "edgellm-run"
    subprocess.run(["gcc", "-std=c11", "-O1", str(CLI), *map(str, LIB_SOURCES), f"-I{CLI.parent}",
                    f"-I{CLI.parent.parent / 'offload'}", "-o", str(exe), "-lpthread", "-ldl", "-lm"], check=True)
    f = tmp_path / "p.state"
    with edgellm.Runtime.load(demo_q8, threads=2) as rt:
        prompt = rt.encode("class Stack:\n    def __init__(self):\n        self.items = []\n")
        ctx = rt.new_context()
        ctx.prefill(prompt[:-3])
        ctx.save(f)
        want = rt.new_context().generate(prompt, max_new_tokens=8, temperature=0, ignore_eos=True).token_ids
        r = subprocess.run([str(exe), str(demo_q8), "--ids", ",".join(map(str, prompt)), "-n", "8", "--temperature",
                            "0", "--ignore-eos", "--print-ids", "--prompt-cache", str(f)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert [int(t) for t in r.stdout.split()] == want
        assert f"{len(prompt) - 3} of {len(prompt)} prompt tokens were in it" in r.stderr
        back = rt.new_context()
        assert back.load(f) == len(prompt) + len(want) - 1 and back.cached == prompt + want[:-1]
        bad = subprocess.run([str(exe), str(demo_q8), "--ids", "1,2", "--prompt-cache", str(CLI)], capture_output=True,
                             text=True)
        assert bad.returncode == 1 and len(bad.stderr.splitlines()) == 1 and "not a saved edgellm context" in bad.stderr


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.skipif(not enabled(), reason="real-checkpoint tier: set EDGELLM_REAL=1")
def test_a_real_chat_models_system_prompt_is_saved_and_reused(tmp_path):
    """SmolLM2-135M-Instruct (its GGUF, --quant auto): a conversation's system prompt saved once, then each new
    conversation loads it and prefills only its own turn; the replies are a fresh context's."""
    pkg = edgellm.compile(str(gguf_file("smollm2-135m")), quant="auto", out=tmp_path / "pkg", max_context=1024,
                          tune="off", progress=False)
    system = {"role": "system", "content": "You are a terse assistant for a hardware store. Answer in one sentence, "
                                           "name the aisle, and never recommend a competitor."}
    with edgellm.Runtime.load(pkg, threads=2) as rt:
        prompts = [rt.encode(rt.text.apply_chat_template([system, {"role": "user", "content": q}],
                                                         add_generation_prompt=True), add_special_tokens=False)
                   for q in ("Where are the hinges?", "Do you sell paint rollers?")]
        n = next(i for i, (a, b) in enumerate(zip(*prompts)) if a != b)
        base = prompts[0][:n]   # the system turn and what follows it up to the user's words
        assert n > 30
        ctx = rt.new_context()
        ctx.prefill(base)
        ctx.save(tmp_path / "system.state")
        for ids in prompts:
            c = rt.new_context()
            c.load(tmp_path / "system.state")
            got = c.generate(ids, max_new_tokens=24, temperature=0, reuse_prefix=True)
            want = rt.new_context().generate(ids, max_new_tokens=24, temperature=0)
            assert got.cached_tokens == len(base) and got.token_ids == want.token_ids
