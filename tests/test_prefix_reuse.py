"""Prefix reuse (Context.generate(..., reuse_prefix=True) over el_rewind + el_gen_params.n_cached) and
Context.cancel(): a prompt that shares a prefix with what the cache holds prefills only the rest and gives the tokens
of a generation from an empty context (the sampler's penalties still see the whole prompt); bad rewinds and n_cached
values are errors; cancel() from another thread stops at the next token."""
from __future__ import annotations

import ctypes as C
import threading
from pathlib import Path

import pytest

pytest.importorskip("tvm")

from edgellm.compiler.driver import compile_model  # noqa: E402
from edgellm.errors import InputError  # noqa: E402
from edgellm.runtime.python import lib as L  # noqa: E402
from edgellm.runtime.python.api import Runtime  # noqa: E402

DEMO = Path(__file__).resolve().parents[1] / "models" / "demo" / "demo-llama"


@pytest.fixture(scope="module")
def rt(demo_q8):
    with Runtime.load(demo_q8, threads=1) as r:
        yield r


def test_float_package_reuse_is_exact(tiny_models, tmp_path):
    """f16 (float GEMMs): a prompt continued from a cached prefix gives a fresh run's tokens under sampling with a
    repetition penalty, over prefixes ending inside and at the end of a prefill chunk."""
    pkg = compile_model(tiny_models["llama-gqa"], target="host", quant="f16", out=tmp_path / "f16", max_context=128,
                        prefill_chunk=16, progress=False)
    prompt = [(7 * i + 3) % 500 for i in range(40)]
    kw = dict(max_new_tokens=12, temperature=0.9, seed=2, repetition_penalty=1.3)
    with Runtime.load(pkg, threads=1) as rt:
        want = fresh(rt, prompt, **kw).token_ids
        for k in (5, 16, 23, 39):
            ctx = rt.new_context()
            ctx.prefill(prompt[:k])
            r = ctx.generate(prompt, reuse_prefix=True, **kw)
            assert r.cached_tokens == min(k, len(prompt) - 1) and r.token_ids == want, k


def fresh(rt, ids, **kw):
    with rt.new_context() as c:
        return c.generate(ids, **kw)


def test_reused_prefix_gives_the_fresh_tokens(rt):
    ctx = rt.new_context()
    base = rt.encode("def read_config(path):\n    with open(path) as f:")
    # sampled with the package's repetition penalty (1.1): the history must include the cached prompt part
    r1 = ctx.generate(base, max_new_tokens=12, seed=3, reuse_prefix=True)
    assert r1.cached_tokens == 0 and r1.token_ids == fresh(rt, base, max_new_tokens=12, seed=3).token_ids
    assert ctx.cached == (base + r1.token_ids)[:len(ctx.cached)] and len(ctx.cached) == ctx.pos
    longer = base + rt.encode("\n        data = f.read()", add_special_tokens=False)
    held = ctx.cached
    lcp = next((i for i, (x, y) in enumerate(zip(held, longer)) if x != y), min(len(held), len(longer)))
    r2 = ctx.generate(longer, max_new_tokens=12, seed=4, reuse_prefix=True)
    assert r2.cached_tokens == lcp >= len(base) and r2.prompt_tokens == len(longer)
    assert r2.token_ids == fresh(rt, longer, max_new_tokens=12, seed=4).token_ids
    # the same prompt again: everything but its last token comes from the cache
    r3 = ctx.generate(longer, max_new_tokens=12, seed=4, reuse_prefix=True)
    assert r3.cached_tokens == len(longer) - 1 and r3.token_ids == r2.token_ids
    # a prompt that shares nothing starts over
    other = rt.encode("import os")
    r4 = ctx.generate(other, max_new_tokens=4, seed=1, reuse_prefix=True)
    assert r4.cached_tokens == 0 and r4.token_ids == fresh(rt, other, max_new_tokens=4, seed=1).token_ids


def test_chat_reuses_the_conversation(rt):
    ctx = rt.new_context()
    m = [{"role": "user", "content": "Write a function that adds two numbers"}]
    a = ctx.chat(m, max_new_tokens=12, temperature=0)
    m += [{"role": "assistant", "content": a.text}, {"role": "user", "content": "Now multiply"}]
    b = ctx.chat(m, max_new_tokens=12, temperature=0)
    assert b.cached_tokens >= a.prompt_tokens
    assert b.token_ids == rt.new_context().chat(m, max_new_tokens=12, temperature=0).token_ids


def test_cache_tracking_through_the_low_level_calls(rt):
    ctx = rt.new_context()
    ids = rt.encode("def f(x):")
    ctx.logits(ids)
    assert ctx.cached == ids
    ctx.prefill([5, 6])
    ctx.decode_step(7)
    assert ctx.cached == ids + [5, 6, 7] and ctx.pos == len(ids) + 3
    ctx.reset()
    assert ctx.cached == [] and ctx.pos == 0
    with pytest.raises(InputError, match="exclude each other"):
        ctx.generate(ids, keep_context=True, reuse_prefix=True)


def test_bad_rewind_and_n_cached_are_errors(rt):
    ctx = rt.new_context()
    ids = rt.encode("def f(x):")
    ctx.prefill(ids)
    lib, h = rt._lib, ctx._handle()
    assert lib.el_rewind(h, len(ids) + 1) != 0 and "outside the conversation" in L.last_error()
    assert lib.el_rewind(h, -1) != 0
    assert lib.el_rewind(h, 2) == 0 and lib.el_pos(h) == 2
    p = L.GenParams()
    lib.el_gen_params_default(rt._model, C.byref(p))
    arr = (C.c_int32 * len(ids))(*ids)
    for keep, cached in ((0, 1), (1, 3), (1, len(ids)), (1, -1)):   # no keep_context; more than held; all; negative
        p.keep_context, p.n_cached = keep, cached
        assert lib.el_generate_start(h, arr, len(ids), C.byref(p)) != 0 and "n_cached" in L.last_error()
    p.keep_context, p.n_cached = 1, 2
    assert lib.el_generate_start(h, arr, len(ids), C.byref(p)) == 0 and lib.el_pos(h) == len(ids)


def test_cancel_from_another_thread(rt):
    ctx = rt.new_context()
    got, started = [], threading.Event()

    def run():
        for piece in ctx.stream("Once upon a time", max_new_tokens=900, temperature=0, ignore_eos=True, _result=res):
            got.append(piece)
            started.set()

    res: dict = {}
    t = threading.Thread(target=run)
    t.start()
    assert started.wait(30)
    ctx.cancel()
    t.join(30)
    assert not t.is_alive() and res["finish_reason"] == "cancelled" and len(res["ids"]) < 900
    # the next generation is not affected by the old cancel
    assert ctx.generate("Once upon a time", max_new_tokens=8, temperature=0).finish_reason == "length"
