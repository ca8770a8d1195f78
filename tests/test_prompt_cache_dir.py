"""`edgellm serve --prompt-cache-dir` (runtime/serve/prompt_cache.py): the prefix two requests share is saved; a server
started again over the same folder loads it into the slot and prefills only the rest (usage says how many prompt
tokens were cached), with the tokens a fresh context gives; the folder stays within its bound, least recently used
first, and a damaged entry is dropped, never trusted; nothing but its own files is removed."""
from __future__ import annotations

import os

import pytest

import edgellm
from edgellm.runtime.serve.prompt_cache import PromptCacheDir

SYSTEM = ("# Utilities for reading configuration files in the INI, JSON and TOML formats.\n"
          "# Every function returns a plain dict and raises ValueError on malformed input.\n"
          "import json\nimport configparser\n\n")


def client(rt, disk):
    from fastapi.testclient import TestClient

    from edgellm.runtime.serve.app import create_app

    return TestClient(create_app(rt, "demo", prompt_cache=disk), base_url="http://127.0.0.1")


def complete(c, prompt):
    r = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 12, "temperature": 0, "return_tokens": True})
    assert r.status_code == 200, r.text
    j = r.json()
    return j["choices"][0]["tokens"], j["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_a_shared_prefix_outlives_the_server(demo_q8, tmp_path):
    d = tmp_path / "pc"
    with edgellm.Runtime.load(demo_q8, threads=2) as rt:
        n_sys = len(rt.encode(SYSTEM))
        assert n_sys >= 32
        fresh = {q: rt.new_context().generate(SYSTEM + q, max_new_tokens=12, temperature=0).token_ids
                 for q in ("def read_ini(path):", "def read_json(path):", "def read_toml(path):")}
        disk = PromptCacheDir(d, demo_q8, 1 << 30)
        c = client(rt, disk)
        assert complete(c, SYSTEM + "def read_ini(path):") == (fresh["def read_ini(path):"], 0)
        toks, cached = complete(c, SYSTEM + "def read_json(path):")   # the slot's own cache: no file needed
        assert toks == fresh["def read_json(path):"] and cached >= n_sys - 1
        assert disk.stats["saved"] == 1 and len(disk.entries) == 1
        (saved,) = disk.entries.values()
        assert len(saved) >= n_sys - 1
    with edgellm.Runtime.load(demo_q8, threads=2) as rt:   # a new server over the same folder
        disk = PromptCacheDir(d, demo_q8, 1 << 30)
        assert list(disk.entries.values()) == [saved]
        toks, cached = complete(client(rt, disk), SYSTEM + "def read_toml(path):")
        assert toks == fresh["def read_toml(path):"] and cached == len(saved)
        assert disk.stats["loaded"] == 1


def test_the_folder_is_bounded_and_damage_is_dropped(demo_q8, tmp_path):
    d = tmp_path / "pc"
    with edgellm.Runtime.load(demo_q8, threads=2) as rt:
        ctx = rt.new_context()
        a, b = rt.encode(SYSTEM), rt.encode(SYSTEM.replace("configuration", "settings").upper())
        sizes = []
        for i, x in enumerate((a, b)):   # one entry's files, for each prefix
            probe = PromptCacheDir(d / f"probe{i}", demo_q8, 1 << 30)
            for p in (x + [5], x + [6]):
                ctx.generate(p, max_new_tokens=2)
                probe.remember(ctx, p)
            sizes.append(probe.bytes)
        one = max(sizes)
        assert min(sizes) > one / 2   # two entries do not fit in 1.5 of the larger one
        disk = PromptCacheDir(d, demo_q8, int(one * 1.5))
        (disk.dir / "notes.txt").write_text("mine")
        for p in (a + [5], a + [6], b + [5], b + [6]):
            ctx.generate(p, max_new_tokens=2)
            disk.remember(ctx, p)
        assert disk.stats["saved"] == 2 and disk.stats["evicted"] == 1
        assert list(disk.entries.values()) == [b] and disk.bytes <= int(one * 1.5)
        assert sorted(f.name for f in disk.dir.iterdir() if not f.name.endswith((".state", ".ids"))) == ["notes.txt"]
        (name,) = disk.entries
        state = disk.dir / f"{name}.state"
        state.write_bytes(state.read_bytes()[:-100])
        other = rt.new_context()
        assert disk.prepare(other, b + [7]) == 0 and not disk.entries and other.cached == []
        assert not state.exists() and (disk.dir / "notes.txt").read_text() == "mine"
        got = other.generate(b + [7], max_new_tokens=6, temperature=0, reuse_prefix=True).token_ids
        assert got == rt.new_context().generate(b + [7], max_new_tokens=6, temperature=0).token_ids


def test_a_package_without_sums_or_an_unwritable_folder_is_refused(demo_q8, tmp_path):
    from edgellm.errors import EdgeLLMError

    with pytest.raises(EdgeLLMError, match="SHA256SUMS"):
        PromptCacheDir(tmp_path / "pc", tmp_path, 1 << 20)
    f = tmp_path / "a-file"
    f.write_text("x")
    with pytest.raises(EdgeLLMError, match="--prompt-cache-dir"):
        PromptCacheDir(f, demo_q8, 1 << 20)
    assert f.read_text() == "x" and os.path.isfile(f)
