"""Speculative decoding (issue 36): n-gram drafts, recycled-token trees and a draft package's guesses verified several
per pass by the verify program, in the C generation loop (runtime/core/speculate.c, generate.c). The tokens must be
plain decoding's: greedy on every scheme, dense and MoE, in RAM and under a memory budget; seeded sampling draw for
draw; stop strings, max tokens, keep_context and prefix reuse as without it; every front end alike."""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

import edgellm
from edgellm.errors import EdgeLLMError
from edgellm.runtime.python.api import Runtime
from verify_tree import decoded_rows

SCHEMES = ("f32", "f16", "q8", "q4g32", "t2")


def copy_prompt(vocab: int, seed: int = 0) -> list[int]:
    """A sequence, then its first half again: what follows can be drafted from it."""
    s = [int(x) for x in np.random.default_rng(seed).integers(3, vocab, 48)]
    return s + s[:24]


@pytest.fixture(scope="module")
def packages(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("spec")
    return {q: edgellm.compile(str(tiny_models["llama-gqa"]), quant=q, out=root / q, max_context=256, tune="off",
                               progress=False, verify_tokens=8) for q in SCHEMES}


def run(rt, prompt, speculate, n=64, **kw):
    s0 = rt.context.stats()
    r = rt.generate(prompt, max_new_tokens=n, speculate=speculate, ignore_eos=True, **kw)
    s1 = rt.context.stats()
    return r, {k: s1[k] - s0[k] for k in ("spec_passes", "spec_drafted", "spec_accepted", "decode_tokens",
                                          "spec_drafted_model", "spec_accepted_model", "spec_accepted_branch")}


@pytest.mark.parametrize("scheme", SCHEMES)
def test_greedy_tokens_are_plain_decodings(scheme, packages):
    with Runtime.load(packages[scheme]) as rt:
        vocab = rt.manifest["model"]["config"]["vocab_size"]
        for seed in range(3):
            p = copy_prompt(vocab, seed)
            plain, s = run(rt, p, "off", temperature=0)
            assert s["spec_passes"] == 0
            for mode in ("ngram", "auto", "recycle"):
                got, s = run(rt, p, mode, temperature=0)
                assert got.token_ids == plain.token_ids, (scheme, mode, seed)
                if mode != "auto" and seed == 0:   # drafts both taken and refused
                    assert s["spec_passes"] > 0 and 0 < s["spec_accepted"] < s["spec_drafted"], s


def test_the_ngram_pool_drafts_a_repeated_request_in_a_fresh_context(packages):
    """The model's contexts share an n-gram pool (runtime/core/ngram_pool.c): a fresh context given a prompt another
    context answered drafts that answer from the pool where its own history has no match; the tokens stay plain
    decoding's; forget_drafts empties the pool, and another load of the package has its own."""
    def fresh(rt, mode):
        ctx = rt.new_context()
        r = ctx.generate(p, max_new_tokens=48, temperature=0, ignore_eos=True, speculate=mode)
        s = ctx.stats()
        ctx.close()
        return r.token_ids, tuple(s[k] for k in ("spec_passes", "spec_drafted", "spec_accepted"))

    with Runtime.load(packages["q8"]) as rt, Runtime.load(packages["q8"]) as other:
        vocab = rt.manifest["model"]["config"]["vocab_size"]
        p = [int(x) for x in np.random.default_rng(5).integers(3, vocab, 40)]   # no copy in it
        plain, counts = fresh(rt, "off")
        assert counts == (0, 0, 0)
        first = fresh(rt, "ngram")   # off added nothing to the pool
        again = fresh(rt, "ngram")
        elsewhere = fresh(other, "ngram")
        rt.forget_drafts()
        forgot = fresh(rt, "ngram")
        assert first[0] == again[0] == elsewhere[0] == forgot[0] == plain
        assert again[1][2] >= first[1][2] + 30, (first, again)   # most of the 48 tokens came in passes
        assert elsewhere[1] == forgot[1] == first[1], (first, elsewhere, forgot)
        for mode in ("recycle", "auto"):   # they draft from it too (auto: where a pass pays, not on this toy)
            got = fresh(rt, mode)
            assert got[0] == plain and (mode == "auto" or got[1][2] >= 24), (mode, got)


CODE = "def read_config(path):\n    with open(path) as f:\n        return json.load(f)\n\ndef read_config(path):\n"


def test_seeded_sampling_draws_what_plain_decoding_draws(demo_q8):
    """A draft is a point mass: drawing t from the target's row and keeping the draft iff t equals it is the
    target's distribution, with the same random numbers in the same order, so a seed gives the same tokens (here on
    the trained demo model, whose samples repeat their prompt often enough for drafts to be taken)."""
    with Runtime.load(demo_q8) as rt:
        p = rt.encode(CODE)
        taken = {"ngram": 0, "recycle": 0}
        for seed in range(24):
            kw = dict(temperature=0.7, top_k=8, top_p=0.95, repetition_penalty=1.05, seed=seed)
            plain, _ = run(rt, p, "off", n=32, **kw)
            for mode in taken:   # recycle: a tree, whose sampled path picks among siblings
                got, s = run(rt, p, mode, n=32, **kw)
                assert got.token_ids == plain.token_ids, (mode, seed)
                taken[mode] += s["spec_accepted"]
        assert all(taken.values()), taken


def test_stops_limits_and_context_behave_as_without(packages):
    with Runtime.load(packages["q8"]) as rt:
        vocab = rt.manifest["model"]["config"]["vocab_size"]
        p = copy_prompt(vocab, 1)
        plain, _ = run(rt, p, "off", n=40, temperature=0)
        for n in (1, 2, 7, 23):   # max_new_tokens cuts inside a verified run of drafts
            assert run(rt, p, "ngram", n=n, temperature=0)[0].token_ids == plain.token_ids[:n]
        stop = plain.token_ids[10]
        a = rt.generate(p, max_new_tokens=40, temperature=0, stop_ids=[stop])
        b = rt.generate(p, max_new_tokens=40, temperature=0, stop_ids=[stop], speculate="ngram")
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason == "stop"
        # the cache holds exactly the accepted tokens: a continuation with keep_context, and a prefix reuse of the
        # whole conversation, give what they give after plain decoding
        follow = [int(x) for x in np.random.default_rng(9).integers(3, vocab, 6)]
        outs = []
        for mode in ("off", "ngram"):
            rt.generate(p, max_new_tokens=30, temperature=0, speculate=mode, ignore_eos=True)
            x = rt.generate(follow, max_new_tokens=20, temperature=0, keep_context=True, speculate=mode)
            y = rt.generate(p + plain.token_ids[:30] + follow, max_new_tokens=20, temperature=0, reuse_prefix=True)
            outs.append((x.token_ids, y.token_ids, y.cached_tokens))
        assert outs[0] == outs[1] and outs[1][2] > 0


def test_cache_rows_equal_a_run_of_the_accepted_tokens(packages):
    """After speculation (rejected drafts' rows written past the position), the next logits equal those of a fresh
    context that ran only the prompt and the accepted tokens."""
    with Runtime.load(packages["f32"]) as rt:
        vocab = rt.manifest["model"]["config"]["vocab_size"]
        p = copy_prompt(vocab, 2)
        r, s = run(rt, p, "ngram", n=48, temperature=0)
        assert s["spec_drafted"] > s["spec_accepted"] > 0
        nxt = rt.context.decode_step(r.token_ids[-1])
    with Runtime.load(packages["f32"]) as fresh:
        fresh.context.prefill(p + r.token_ids[:-1])
        want = fresh.context.decode_step(r.token_ids[-1])
    assert np.abs(nxt - want).max() <= 1e-4 * np.abs(want).max()


def test_ngram_drafts_run_past_a_repeat_near_the_end(demo_q8):
    """A reply that repeats itself with a short period matches its last ids a period back, where the history ends
    after a period's worth of ids: the n-gram drafts come from an earlier match with a full chain after it (the demo
    model answers "abab..." with one token over and over: the latest match drafted 1 id a pass, 18 passes for 40
    tokens)."""
    with Runtime.load(demo_q8) as rt:
        ids = rt.encode("ab" * 20)
        plain = rt.generate(ids, max_new_tokens=40, temperature=0, ignore_eos=True)
        assert len(set(plain.token_ids[8:])) <= 2, plain.text   # the premise: a short period
        r, s = run(rt, ids, "ngram", n=40, temperature=0)
        assert r.token_ids == plain.token_ids
        assert s["spec_drafted"] >= 4 * s["spec_passes"] and s["spec_accepted"] >= 24, s


@pytest.mark.parametrize("scheme", ("f32", "q8"))
def test_own_drafts_through_verify_and_take(packages, scheme):
    """Context.verify / take_drafts (el_verify, el_verify_take: a front end's own drafts): a pass's rows are the
    logits that decoding its ids one by one gives (float rounding aside: the 8-token kernels may sum in another
    order), taking k drafts leaves the context as if it had decoded them, and whatever runs next drops the drafts
    not taken."""
    tol = 1e-4
    with Runtime.load(packages[scheme]) as rt:
        ctx = rt.context
        assert rt.verify_width == 8
        p = copy_prompt(rt.manifest["model"]["config"]["vocab_size"], 5)
        ctx.prefill(p[:40])
        rows = ctx.verify(p[40:48])
        assert rows.shape == (8, rt.vocab) and ctx.pos == 41
        ctx.take_drafts(3)
        assert ctx.pos == 44 and ctx.cached == p[:44]
        after = ctx.decode_step(p[44])
        with pytest.raises(EdgeLLMError, match="left 0 in a chain to take"):
            ctx.take_drafts(1)   # the decode step dropped the other drafts
        ctx.rewind(40)
        want = [ctx.decode_step(t) for t in p[40:45]]
        for got, ref in zip(list(rows[:4]) + [after], want):
            assert np.abs(got - ref).max() <= tol * np.abs(ref).max()
        ctx.rewind(40)
        ctx.verify(p[40:43])
        with pytest.raises(EdgeLLMError, match="left 2 in a chain to take"):
            ctx.take_drafts(3)
        with pytest.raises(EdgeLLMError, match="verifies 8 per pass"):
            ctx.verify(p[:9])


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_pass_computes_only_its_rows(packages, scheme):
    """The verify program's GEMMs compute a pass's real rows only (PROGRAM_ROWS: a pass of fewer drafts costs less):
    each row of a pass of n tokens is bitwise the row a full pass gives there (a chain's row sees only its own
    ancestors), through the zeros the GEMMs leave in the rows past n."""
    from edgellm.runtime import contract as K

    plan = (packages[scheme] / K.PLAN).read_bytes()
    assert K.PROGRAM_ROWS | K.PROGRAM_TREE in {p["flags"] for p in K.read_programs(plan) if p["name"] == "verify"}
    with Runtime.load(packages[scheme]) as rt:
        ctx = rt.context
        p = copy_prompt(rt.manifest["model"]["config"]["vocab_size"], 7)
        ctx.prefill(p[:40])
        full = ctx.verify(p[40:48])
        for n in (1, 2, 3, 5, 8):
            ctx.rewind(40)
            rows = ctx.verify(p[40:40 + n])
            assert np.array_equal(rows, full[:n]), (scheme, n)


def test_a_row_count_without_a_tree_is_refused(packages, tmp_path):
    import shutil
    import struct

    from edgellm.runtime import contract as K

    pkg = shutil.copytree(packages["f32"], tmp_path / "p")
    plan = bytearray((pkg / K.PLAN).read_bytes())
    at = next(p["at"] for p in K.read_programs(bytes(plan)) if p["name"] == "verify")
    struct.pack_into("<I", plan, at + K.PROGRAM.offsets()["flags"], K.PROGRAM_ROWS)
    (pkg / K.PLAN).write_bytes(bytes(plan))
    with pytest.raises(EdgeLLMError, match="program verify takes a row count without a token tree"):
        Runtime.load(pkg)


@pytest.mark.parametrize("scheme", ("f32", "q8"))
def test_token_tree_rows_and_the_path_taken(packages, scheme):
    """A pass over a token tree (el_verify_tree): each node's row equals decoding its path from the root; taking a
    path whose nodes sit further along than their depth (a branch) moves their cache rows down, so the context is
    then as if it had decoded the path; a node that does not follow the context's last one is a one-line error."""
    tol = 1e-4
    parents = [-1, 0, 0, 1, 1, 2, 3, 6]
    with Runtime.load(packages[scheme]) as rt:
        ctx = rt.context
        p = copy_prompt(rt.manifest["model"]["config"]["vocab_size"], 6)
        ids = p[40:48]
        ctx.prefill(p[:40])
        rows = ctx.verify(ids, parents)
        for node, want in enumerate(decoded_rows(ctx, 40, ids, parents)):
            assert np.abs(rows[node] - want).max() <= tol * np.abs(want).max(), node
        ctx.rewind(40)
        ctx.verify(ids, parents)
        ctx.take_node(2)
        ctx.take_node(5)   # slot 5, depth 2: its rows move to position 42
        assert ctx.pos == 43 and ctx.cached == p[:40] + [ids[0], ids[2], ids[5]]
        with pytest.raises(EdgeLLMError, match="does not follow"):
            ctx.take_node(6)
        got = ctx.decode_step(p[50])
        ctx.rewind(40)
        for t in (ids[0], ids[2], ids[5]):
            ctx.decode_step(t)
        want = ctx.decode_step(p[50])
        assert np.abs(got - want).max() <= tol * np.abs(want).max()
        with pytest.raises(EdgeLLMError, match="follows"):
            ctx.verify(ids, [-1, 0, 2, 1, 1, 2, 3, 6])


def test_recycled_trees_keep_the_cache_exact(demo_q8):
    """Recycling on the trained demo: trees whose taken paths branch; the cache then equals a fresh run of the
    prompt and the tokens."""
    with Runtime.load(demo_q8) as rt:
        p = rt.encode(CODE)
        plain = rt.generate(p, max_new_tokens=64, temperature=0, ignore_eos=True).token_ids
        for _ in range(2):   # the second run starts from the first's recycled table
            r, s = run(rt, p, "recycle", n=64, temperature=0)
            assert r.token_ids == plain and s["spec_accepted"] > 0
        nxt = rt.context.decode_step(r.token_ids[-1])
    with Runtime.load(demo_q8) as fresh:
        fresh.context.prefill(p + r.token_ids[:-1])
        want = fresh.context.decode_step(r.token_ids[-1])
    assert np.abs(nxt - want).max() <= 1e-3 * np.abs(want).max()


def test_under_a_memory_budget(demo_q8):
    """Weights streamed through a window (35% of them held): one verify pass reads them once for all its tokens."""
    from test_window import budget_for

    with Runtime.load(demo_q8) as rt:
        p = rt.encode(CODE)
        plain = rt.generate(p, max_new_tokens=48, temperature=0, ignore_eos=True).token_ids
    with Runtime.load(demo_q8, memory_budget=budget_for(demo_q8, 35), weight_policy="window", speculate="ngram") as rt:
        assert rt.memory()["policy"] == "window"
        r, s = run(rt, p, None, n=48, temperature=0)
        assert r.token_ids == plain and s["spec_passes"] > 0
        r, s = run(rt, p, "recycle", n=48, temperature=0)
        assert r.token_ids == plain and s["spec_accepted"] > 0


def test_moe(tmp_path):
    from edgellm.models.synthetic import make_checkpoint

    ck = make_checkpoint(tmp_path / "moe", "MixtralForCausalLM", seed=3)
    pkg = edgellm.compile(str(ck), quant="q8", out=tmp_path / "pkg", max_context=256, tune="off", progress=False,
                          verify_tokens=8)
    with Runtime.load(pkg) as rt:
        p = copy_prompt(rt.manifest["model"]["config"]["vocab_size"], 4)
        plain, _ = run(rt, p, "off", temperature=0)
        for mode in ("ngram", "recycle"):   # a tree's pass runs the union of its rows' experts
            got, s = run(rt, p, mode, temperature=0)
            assert got.token_ids == plain.token_ids and s["spec_passes"] > 0, mode
        # each node's row bitwise its decode path's: the router's f32 GEMM too (a rowwise kernel in the pass), so a
        # near-tie between two experts cannot route a draft elsewhere than its decode step
        ctx, drafts, parents = rt.context, p[24:32], [-1, 0, 0, 1, 1, 2, 3, 6]
        ctx.rewind(0)
        ctx.prefill(p[:24])
        rows = ctx.verify(drafts, parents=parents)
        for i, want in enumerate(decoded_rows(ctx, 24, drafts, parents)):
            assert np.array_equal(rows[i], want), i


def test_front_ends_agree(demo_q8):
    """bin/edgellm-run (the C loop over its own option table) and the CLI give the Python API's tokens, and say
    what the drafts saved."""
    with Runtime.load(demo_q8, speculate="ngram") as rt:
        ids = rt.encode(CODE)
        r, s = run(rt, ids, None, n=48, temperature=0)
        plain = rt.generate(ids, max_new_tokens=48, temperature=0, ignore_eos=True, speculate="off")
        assert r.token_ids == plain.token_ids and s["spec_passes"] > 0
    exe = demo_q8 / "bin" / "edgellm-run"
    out = subprocess.run([str(exe), str(demo_q8), "--ids", ",".join(map(str, ids)), "-n", "48", "--temperature", "0",
                          "--ignore-eos", "--print-ids", "--speculate", "ngram"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "[speculative: " in out.stderr
    assert [int(x) for x in out.stdout.split()] == r.token_ids
    cli = subprocess.run(["edgellm", "run", str(demo_q8), "--ids", ",".join(map(str, ids)), "-n", "48",
                          "--temperature", "0", "--ignore-eos", "--speculate", "ngram"], capture_output=True, text=True)
    assert cli.returncode == 0 and "[speculative: " in cli.stderr, cli.stderr
    rec = subprocess.run([str(exe), str(demo_q8), "--ids", ",".join(map(str, ids)), "-n", "48", "--temperature", "0",
                          "--ignore-eos", "--print-ids", "--speculate", "recycle"], capture_output=True, text=True)
    assert rec.returncode == 0 and [int(x) for x in rec.stdout.split()] == r.token_ids, rec.stderr


def test_bad_values_are_one_line(demo_q8):
    with Runtime.load(demo_q8) as rt:
        for kw in ({"speculate": "maybe"}, {"draft_max": 99}, {"draft_max": -1}):
            with pytest.raises(EdgeLLMError, match=next(iter(kw))):
                rt.generate("x", max_new_tokens=2, **kw)
    with pytest.raises(EdgeLLMError, match="speculate"):
        Runtime.load(demo_q8, speculate="yes")
    r = subprocess.run([str(demo_q8 / "bin" / "edgellm-run"), str(demo_q8), "--ids", "1,2", "--speculate", "yes"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and "--speculate" in r.stderr


def test_opencl(tmp_path):
    """The verify program on the OpenCL backend (PoCL here): plain decoding's tokens with drafts in flight."""
    from pathlib import Path

    demo = Path(__file__).resolve().parents[1] / "models" / "demo" / "demo-llama"
    pkg = edgellm.compile(str(demo), target="opencl", quant="q8", out=tmp_path / "cl", tune="off", progress=False,
                          verify_tokens=8)
    with Runtime.load(pkg) as rt:
        ids = rt.encode(CODE)
        plain = rt.generate(ids, max_new_tokens=48, temperature=0, ignore_eos=True).token_ids
        for mode in ("ngram", "recycle"):   # no tree kernels there: recycle drafts chains
            got, s = run(rt, ids, mode, n=48, temperature=0)
            assert got.token_ids == plain and s["spec_passes"] > 0, mode


# ---- a draft package: a smaller model with the same tokenizer (models/demo/demo-draft, distilled from demo-llama) --
DEMO = Path(__file__).resolve().parents[1] / "models" / "demo"
TEXTS = (CODE, "import os\nimport sys\n\n\ndef main(", "The following is a list of the built-in exceptions")


@pytest.fixture(scope="module")
def draft(tmp_path_factory):
    """With a verify program of its own: it drafts its guesses' n-gram continuations (staged drafting)."""
    return edgellm.compile(str(DEMO / "demo-draft"), quant="q8", out=tmp_path_factory.mktemp("draft") / "draft",
                           tune="off", progress=False, verify_tokens=8)


@pytest.fixture(scope="module")
def demo_q4(tmp_path_factory):
    return edgellm.compile(str(DEMO / "demo-llama"), quant="q4g32", out=tmp_path_factory.mktemp("dq4") / "q4",
                           tune="off", progress=False, verify_tokens=8)


@pytest.mark.parametrize("which", ("q8", "q4g32"))
def test_draft_package_gives_plain_tokens(which, demo_q8, demo_q4, draft, monkeypatch):
    """The draft's greedy guesses (n-grams first) are verified like any draft: greedy gives plain decoding's tokens,
    with auto's cost gates (this host's timings) and without them (EDGELLM_SPEC_UNGATED, where every guess is
    verified), and there the trained draft's guesses are taken often enough to matter."""
    pkg = demo_q8 if which == "q8" else demo_q4
    with Runtime.load(pkg) as rt:
        taken = 0
        for text in TEXTS:
            ids = rt.encode(text)
            plain, _ = run(rt, ids, "off", n=48, temperature=0)
            got, s = run(rt, ids, str(draft), n=48, temperature=0)
            assert got.token_ids == plain.token_ids, text
            monkeypatch.setenv("EDGELLM_SPEC_UNGATED", "1")
            got, s = run(rt, ids, str(draft), n=48, temperature=0)
            monkeypatch.delenv("EDGELLM_SPEC_UNGATED")
            assert got.token_ids == plain.token_ids, text
            taken += s["spec_accepted_model"]
        assert taken > 0 and drafted_by_the_model(rt, draft) > 0


def drafted_by_the_model(rt, draft) -> int:
    """Tokens the draft package's context ran (its catch-ups and guesses): the model stage took part."""
    st = rt.context._draft_ctx[str(Path(draft).resolve())].stats()
    return st["prefill_tokens"] + st["decode_tokens"]


def test_draft_package_seeded_sampling_and_reuse(demo_q8, draft):
    """Seeded sampling draw for draw, a per-call draft on a runtime loaded without one, and prefix reuse: the draft's
    context follows the history whatever the target's does."""
    with Runtime.load(demo_q8) as rt:
        ids = rt.encode(CODE)
        for seed in range(8):
            kw = dict(temperature=0.7, top_k=8, seed=seed)
            assert run(rt, ids, str(draft), n=32, **kw)[0].token_ids == run(rt, ids, "off", n=32, **kw)[0].token_ids
        a = rt.generate(ids, max_new_tokens=24, temperature=0, speculate=str(draft))
        b = rt.generate(ids + a.token_ids[:8], max_new_tokens=24, temperature=0, speculate=str(draft),
                        reuse_prefix=True)
        c = rt.generate(ids + a.token_ids[:8], max_new_tokens=24, temperature=0)
        assert b.token_ids == c.token_ids and b.cached_tokens > 0


def test_draft_package_under_a_budget_and_with_moe(demo_q8, draft, tmp_path, monkeypatch):
    from test_window import budget_for

    with Runtime.load(demo_q8) as rt:
        ids = rt.encode(CODE)
        plain = rt.generate(ids, max_new_tokens=40, temperature=0, ignore_eos=True).token_ids
    with Runtime.load(demo_q8, memory_budget=budget_for(demo_q8, 35), weight_policy="window",
                      speculate=str(draft)) as rt:
        r, s = run(rt, ids, None, n=40, temperature=0)
        assert r.token_ids == plain and drafted_by_the_model(rt, draft) > 0
        # every draft verified (EDGELLM_SPEC_UNGATED: whether a pass pays is this host's timing, and a host whose
        # passes cost more steps rightly runs the draft less): its guesses, and its second and third choices where it
        # is unsure (branches of the tree), are taken
        monkeypatch.setenv("EDGELLM_SPEC_UNGATED", "1")
        model = {k: 0 for k in s}
        for text in TEXTS:
            p = rt.encode(text)
            want = rt.generate(p, max_new_tokens=48, temperature=0, ignore_eos=True, speculate="off").token_ids
            got, s = run(rt, p, None, n=48, temperature=0)
            assert got.token_ids == want, text
            model = {k: model[k] + s[k] for k in s}
        assert model["spec_drafted_model"] > model["spec_accepted_model"] >= model["spec_accepted_branch"] > 0, model
        assert model["spec_accepted"] > model["spec_accepted_model"], model   # n-grams and recycled ones too
        staged = rt.context._draft_ctx[str(Path(draft).resolve())].stats()
        assert staged["spec_passes"] > 0, staged   # the draft ran its own pass over an n-gram of its guesses
        monkeypatch.delenv("EDGELLM_SPEC_UNGATED")
    moe = edgellm.compile(str(DEMO / "demo-moe"), quant="q8", out=tmp_path / "moe", tune="off", progress=False,
                          verify_tokens=8)
    with Runtime.load(moe, speculate=str(draft)) as rt:   # demo-moe shares demo-llama's tokenizer
        plain, _ = run(rt, ids, "off", n=40, temperature=0)
        got, s = run(rt, ids, None, n=40, temperature=0)
        assert got.token_ids == plain.token_ids and drafted_by_the_model(rt, draft) > 0
    # the expert cache (weight policy "experts"): a verify pass reads the union of its tokens' experts once
    budget = Runtime.plan(moe, memory_budget=1 << 40, weight_policy="experts")["minimum_budget"] * 6 // 5
    with Runtime.load(moe, memory_budget=budget, weight_policy="experts") as rt:
        assert rt.memory()["policy"] == "experts"
        base = rt.context.stats()
        got, s = run(rt, ids, "ngram", n=40, temperature=0)
        st = rt.context.stats()
        assert got.token_ids == plain.token_ids and s["spec_passes"] > 0
        assert st["expert_selected"] > base["expert_selected"]


def test_ungated_auto_verifies_whatever_passes_cost(demo_q8, monkeypatch):
    """EDGELLM_SPEC_UNGATED=1: auto verifies every draft it finds, whatever this host's timings say a pass costs, so
    what it drafts is the same run after run (each in a fresh context with the pool emptied); the tokens stay plain
    decoding's."""
    with Runtime.load(demo_q8) as rt:
        ids = rt.encode(CODE)
        plain = rt.generate(ids, max_new_tokens=48, temperature=0, ignore_eos=True).token_ids
        monkeypatch.setenv("EDGELLM_SPEC_UNGATED", "1")
        seen = []
        for _ in range(2):
            rt.forget_drafts()
            ctx = rt.new_context()
            r = ctx.generate(ids, max_new_tokens=48, temperature=0, ignore_eos=True, speculate="auto")
            st = ctx.stats()
            ctx.close()
            assert r.token_ids == plain
            seen.append((st["spec_passes"], st["spec_drafted"], st["spec_accepted"]))
        assert seen[0] == seen[1] and seen[0][0] > 0 and seen[0][2] > 0, seen


def test_draft_package_front_ends(demo_q8, draft):
    with Runtime.load(demo_q8, speculate=str(draft)) as rt:
        ids = rt.encode(CODE)
        r, s = run(rt, ids, None, n=40, temperature=0)
    exe = demo_q8 / "bin" / "edgellm-run"
    out = subprocess.run([str(exe), str(demo_q8), "--ids", ",".join(map(str, ids)), "-n", "40", "--temperature", "0",
                          "--ignore-eos", "--speculate", str(draft), "--print-ids"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert [int(x) for x in out.stdout.split()] == r.token_ids
    cli = subprocess.run(["edgellm", "run", str(demo_q8), "--ids", ",".join(map(str, ids)), "-n", "40",
                          "--temperature", "0", "--ignore-eos", "--speculate", str(draft)], capture_output=True,
                         text=True)
    assert cli.returncode == 0 and r.text.strip() and r.text in cli.stdout, (cli.stdout, cli.stderr)


def test_a_draft_that_cannot_draft_is_one_line(demo_q8, packages, draft, tmp_path):
    tiny = packages["q8"]   # another tokenizer and vocabulary
    with pytest.raises(EdgeLLMError, match="vocabulary|tokenizer"):
        Runtime.load(demo_q8, speculate=str(tiny))
    with pytest.raises(EdgeLLMError, match="draft package"):
        Runtime.load(demo_q8, speculate=str(tmp_path))   # a directory, not a package
    r = subprocess.run([str(demo_q8 / "bin" / "edgellm-run"), str(demo_q8), "--ids", "1,2", "--speculate", str(tiny)],
                       capture_output=True, text=True)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and "--speculate" in r.stderr, r.stderr
    no_verify = edgellm.compile(str(DEMO / "demo-llama"), quant="q8", out=tmp_path / "nv", tune="off", progress=False,
                                verify_tokens=0)
    with pytest.raises(EdgeLLMError, match="verify program"):
        Runtime.load(no_verify, speculate=str(draft))
