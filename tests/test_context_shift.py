"""Context shift (issue 38; runtime/core/generate.c): a generation that reaches the end of the context keeps the first
shift_sinks tokens and the newest ones, drops shift_tokens between them, runs the kept ones again at their new
positions and goes on. The shifted context is what a fresh context holding the same ids computes (the next step's
logits agree; the kept ids are the sinks and a suffix of the conversation), with plain and window caches (Gemma 2,
whose window layers no longer hold the sinks' position: everything kept runs again), with speculation, and through
every front end: Runtime, `edgellm run`, bin/edgellm-run, the server. Off, a full context finishes with "context"."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest
from click.testing import CliRunner

import edgellm
from edgellm.errors import EdgeLLMError
from edgellm.models.synthetic import make_checkpoint

CTX = 64


class _Packages(dict):
    """name -> package, compiled on first use (the fast tier needs only some)."""

    def __init__(self, root):
        super().__init__()
        self.root = root

    def __missing__(self, name):
        if name == "llama":
            ck = make_checkpoint(self.root / "llama", "LlamaForCausalLM", seed=41)
        else:
            ck = make_checkpoint(self.root / "gemma2", "Gemma2ForCausalLM", seed=42, num_hidden_layers=3,
                                 tie_word_embeddings=True, sliding_window=6)
        self[name] = edgellm.compile(str(ck), out=self.root / f"{name}.pkg", quant="f32", max_context=CTX,
                                     prefill_chunk=8, progress=False, verify_tokens=8)
        return self[name]


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    return _Packages(tmp_path_factory.mktemp("shift"))


def relerr(a, b):
    return float(np.abs(np.asarray(a, np.float64) - b).max() / np.abs(b).max())


PROMPT = [5, 17, 33, 2, 99, 250, 7, 64, 128, 3, 11, 300]


@pytest.mark.parametrize("name", ["llama", "gemma2"])
@pytest.mark.parametrize("sinks,drop", [(4, 0), (4, 20), (0, 0), (10, 5)])
def test_a_shifted_context_is_a_fresh_one_holding_the_kept_ids(packages, name, sinks, drop):
    with edgellm.Runtime.load(packages[name], threads=2) as rt:
        ctx = rt.new_context()
        off = ctx.generate(PROMPT, max_new_tokens=3 * CTX, temperature=0, ignore_eos=True)
        assert off.finish_reason == "context" and len(PROMPT) + len(off.token_ids) == CTX + 1
        r = ctx.generate(PROMPT, max_new_tokens=3 * CTX, temperature=0, ignore_eos=True, context_shift=True,
                         shift_sinks=sinks, shift_tokens=drop)
        assert r.finish_reason == "length" and len(r.token_ids) == 3 * CTX
        assert r.token_ids[:len(off.token_ids)] == off.token_ids   # the same tokens up to the first shift
        s = ctx.stats()
        per = drop or (CTX - sinks) // 2
        assert s["context_shifts"] >= (3 * CTX + len(PROMPT) - CTX) // per
        held = ctx.cached
        convo = PROMPT + r.token_ids[:-1]
        assert len(held) < CTX and held[:sinks] == PROMPT[:sinks]
        assert held[sinks:] == convo[len(convo) - (len(held) - sinks):]
        fresh = rt.new_context()
        fresh.prefill(held)
        nxt = r.token_ids[-1]
        assert relerr(ctx.decode_step(nxt), fresh.decode_step(nxt)) < 1e-4


@pytest.mark.parametrize("name", ["llama", "gemma2"])   # gemma2: window caches that move their rows as well
def test_with_speculation_the_tokens_are_plain_decodings(packages, name):
    with edgellm.Runtime.load(packages[name], threads=2) as rt:
        copy = PROMPT * 3
        plain = rt.generate(copy, max_new_tokens=2 * CTX, temperature=0, ignore_eos=True, context_shift=True)
        for mode in ("ngram", "recycle"):
            ctx = rt.new_context()
            got = ctx.generate(copy, max_new_tokens=2 * CTX, temperature=0, ignore_eos=True, context_shift=True,
                               speculate=mode)
            s = ctx.stats()
            assert got.token_ids == plain.token_ids and s["context_shifts"] >= 1 and s["spec_accepted"] > 0, mode


def test_bad_shift_settings_are_one_line_errors(packages):
    with edgellm.Runtime.load(packages["llama"], threads=2) as rt:
        for kw, msg in ((dict(context_shift="sideways"), "context_shift="), (dict(shift_sinks=-1), "shift_sinks="),
                        (dict(shift_tokens=1.5), "shift_tokens="),
                        (dict(context_shift=True, shift_sinks=CTX - 1), "leave room")):
            with pytest.raises(EdgeLLMError, match=msg) as e:
                rt.generate(PROMPT, max_new_tokens=4, **kw)
            assert "\n" not in str(e.value)
        with pytest.raises(EdgeLLMError, match="context_shift="):
            edgellm.Runtime.load(packages["llama"], context_shift=2)


def test_runtime_default_and_the_command_lines(packages, tmp_path):
    pkg = packages["llama"]
    with edgellm.Runtime.load(pkg, threads=2, context_shift="on", shift_sinks=2) as rt:
        r = rt.generate(PROMPT, max_new_tokens=2 * CTX, temperature=0, ignore_eos=True)
        assert r.finish_reason == "length" and rt.context.cached[:2] == PROMPT[:2]
        want = r.token_ids
    from edgellm.cli import cli

    ids = ",".join(map(str, PROMPT))
    res = CliRunner().invoke(cli, ["run", str(pkg), "--ids", ids, "-n", str(2 * CTX), "--temperature", "0",
                                   "--ignore-eos", "--context-shift", "on", "--shift-sinks", "2"])
    assert res.exit_code == 0, res.output
    assert "context shift:" in res.stderr and f"{2 * CTX} generated (length)" in res.stderr
    from edgellm.compiler.device_binary import CLI, LIB_SOURCES

    exe = tmp_path / "edgellm-run"
    subprocess.run(["gcc", "-std=c11", "-O1", str(CLI), *map(str, LIB_SOURCES), f"-I{CLI.parent}",
                    f"-I{CLI.parent.parent / 'offload'}", "-o", str(exe), "-lpthread", "-ldl", "-lm"], check=True)
    out = subprocess.run([str(exe), str(pkg), "--ids", ids, "-n", str(2 * CTX), "--temperature", "0", "--ignore-eos",
                          "--print-ids", "--context-shift", "on", "--shift-sinks", "2"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert [int(t) for t in out.stdout.split()] == want and "context shift:" in out.stderr


def test_the_server_goes_past_the_context_with_it_on(packages):
    from fastapi.testclient import TestClient

    from edgellm.runtime.serve.app import create_app

    with edgellm.Runtime.load(packages["llama"], threads=2, context_shift="on") as rt:
        client = TestClient(create_app(rt, "tiny"), base_url="http://127.0.0.1")
        body = {"prompt": PROMPT, "max_tokens": 2 * CTX, "temperature": 0, "ignore_eos": True}
        r = client.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["finish_reason"] == "length" and r.json()["usage"]["completion_tokens"] == 2 * CTX
        r = client.post("/v1/completions", json=body | {"context_shift": "off"})
        assert r.status_code == 400 and "context" in r.json()["error"]["message"]
