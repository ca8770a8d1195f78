"""The compile cache (`edgellm run demo`, `--model`, serve, chat, eval compile into it) and `edgellm cache`: keys from
content, not file times or paths; list, rm, prune; and the commands a newcomer tries first on the demo names."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from edgellm.compiler.cache import cache_key
from edgellm.models.demo import demo_path


def test_cache_key_is_content(tmp_path, monkeypatch):
    """The same checkpoint under two paths, with new file times, is one cache entry; one changed byte is another."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    a, b = tmp_path / "a" / "mine", tmp_path / "b" / "copy"
    shutil.copytree(demo_path("demo"), a)
    shutil.copytree(demo_path("demo"), b)
    for f in b.iterdir():
        os.utime(f, (time.time() + 1000, time.time() + 1000))
    assert cache_key(a, None, "host") == cache_key(b, None, "host") == cache_key(demo_path("demo"), None, "host")
    assert cache_key(a, "q8", "host") != cache_key(a, None, "host")
    cfg = json.loads((b / "config.json").read_text())
    cfg["rms_norm_eps"] = cfg.get("rms_norm_eps", 1e-5) * 2
    (b / "config.json").write_text(json.dumps(cfg))
    assert cache_key(a, None, "host") != cache_key(b, None, "host")


def cli(*args, env, check=True):
    r = subprocess.run([sys.executable, "-m", "edgellm.cli", *args], capture_output=True, text=True, env=env,
                       timeout=600, stdin=subprocess.DEVNULL)
    if check:
        assert r.returncode == 0, r.stderr[-2000:]
    return r


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return {**os.environ, "XDG_CACHE_HOME": str(tmp_path_factory.mktemp("xdg"))}


def test_first_hour_commands(env):
    """`edgellm run demo --quiet` (no -p: the default prompt, echoed; nothing on stderr, the first use's compile
    included), `info demo`, `run --ids`, then `cache list` / `rm`;
    a user's file in the cache folder is never touched."""
    assert "no cached packages" in cli("cache", "list", env=env).stdout
    r = cli("run", "demo", "-n", "8", "--temperature", "0", "--quiet", env=env)   # first use: compiles
    assert r.stdout.startswith("def read_config(path):") and r.stderr == ""     # --quiet: nothing but the text
    info = cli("info", "demo", env=env).stdout
    assert "LlamaForCausalLM" in info
    ids = cli("run", "demo", "--ids", "5,17,33", "-n", "4", "--temperature", "0", env=env)
    assert ids.returncode == 0 and not ids.stdout.startswith("def read_config") and "4 generated" in ids.stderr
    bad = cli("run", "demo", "--ids", "5,x", env=env, check=False)
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1 and "--ids" in bad.stderr
    rows = json.loads(cli("cache", "list", "--json", env=env).stdout)
    assert len(rows) == 1, rows   # run, info and --ids share one package
    row = rows[0]
    assert row["source"] == "demo" and row["target"] == "host" and row["bytes"] > 1 << 20
    assert "1 package(s)" in cli("cache", "list", env=env).stdout
    mine = os.path.join(env["XDG_CACHE_HOME"], "edgellm", "packages", "notes.txt")
    open(mine, "w").write("mine")
    r = cli("cache", "rm", "no-such-package", env=env, check=False)
    assert r.returncode != 0 and "no cached package" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "removed 0 package(s)" in cli("cache", "prune", "--older-than", "30d", env=env).stdout
    assert "removed 1 package(s)" in cli("cache", "rm", "--all", env=env).stdout
    assert json.loads(cli("cache", "list", "--json", env=env).stdout) == []
    assert open(mine).read() == "mine"
    r = cli("cache", "prune", "--older-than", "soon", env=env, check=False)
    assert r.returncode != 0 and "--older-than" in r.stderr
