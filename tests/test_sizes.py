"""A size means the same bytes in every front end: Runtime.load / edgellm run, plan, serve (Python's parse_bytes) and
bin/edgellm-run read sizes through one C function, el_parse_bytes ("600MB" was 600,000,000 bytes in Python and
629,145,600 in edgellm-run, which refused "600MiB"). MB/GB = 10^6/10^9, M/MiB and G/GiB = 2^20/2^30."""
from __future__ import annotations

import subprocess

import pytest

from edgellm.errors import EdgeLLMError
from edgellm.runtime.python.package import parse_bytes

M, G = 2**20, 2**30
EXPECTED = {"1048576": 1048576, "600MB": 600_000_000, "600mb": 600_000_000, "600M": 600 * M, "600MiB": 600 * M,
            "600 MiB": 600 * M, " 2GiB ": 2 * G, "1.5G": 3 * G // 2, "0.6GB": 600_000_000, "629145600": 600 * M,
            ".5k": 512, "7KB": 7000, "3kib": 3072, "1t": 2**40, "2TB": 2 * 10**12, "12b": 12, "0.001K": 1,
            "4611686018427387904": 2**62,
            # refused
            "": None, "  ": None, "MB": None, "-5M": None, "+5M": None, "1e6": None, "0x10": None, "inf": None,
            "nan": None, "5.M": None, "1..5M": None, "5 M B": None, "5MBB": None, "5XB": None, "0": None, "0MB": None,
            "0.0001": None, "99999999TB": None, "4611686018427387906000": None, "5M x": None, "\uff11M": None}


def py_parse(s: str):
    try:
        return parse_bytes(s)
    except EdgeLLMError as e:
        assert len(str(e).splitlines()) == 1
        return None


@pytest.mark.parametrize("s", list(EXPECTED))
def test_python_reads_a_size(s):
    assert py_parse(s) == EXPECTED[s]


def test_edgellm_run_reads_sizes_alike(tmp_path):
    """bin/edgellm-run (built from the same sources a package ships) accepts exactly the spellings Python accepts:
    a refused size is a usage error (exit 2) before anything loads; an accepted one gets as far as loading."""
    from edgellm.compiler.device_binary import CLI, LIB_SOURCES

    exe = tmp_path / "edgellm-run"
    subprocess.run(["gcc", "-std=c11", "-O1", str(CLI), *map(str, LIB_SOURCES), f"-I{CLI.parent}",
                    f"-I{CLI.parent.parent / 'offload'}", "-o", str(exe), "-lpthread", "-ldl", "-lm"], check=True)
    for s, want in EXPECTED.items():
        r = subprocess.run([str(exe), str(tmp_path / "none"), "--ids", "1", "--memory-budget", s],
                           capture_output=True, text=True)
        if want is None:
            assert r.returncode == 2 and "--memory-budget" in r.stderr, (s, r.stderr)
        else:
            assert r.returncode == 1 and "cannot load the package" in r.stderr, (s, r.stderr)


SPELLINGS = ("600MB", "600MiB", "0.6GB", "629145600")   # the four: two byte counts between them


@pytest.fixture(scope="module")
def budget_pkg(tmp_path_factory):
    import edgellm

    return edgellm.compile("demo", out=tmp_path_factory.mktemp("budget") / "p", quant="f32", tune="off", progress=False)


def _cli(*args: str) -> subprocess.CompletedProcess:
    import sys

    return subprocess.run([sys.executable, "-m", "edgellm.cli", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("s", SPELLINGS)
def test_every_front_end_reads_a_budget_alike(budget_pkg, s):
    """The same --memory-budget spelling is the same bytes through Runtime.load, `edgellm plan`, `edgellm run`,
    the package's bin/edgellm-run and `edgellm serve` (its /metrics); the JNI bridge: test_android_app.py."""
    import json
    import re
    import sys

    from edgellm.runtime import Runtime

    want = EXPECTED[s]
    with Runtime.load(budget_pkg, memory_budget=s) as rt:
        assert rt.memory()["budget"] == want
    r = _cli("plan", str(budget_pkg), "--memory-budget", s, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["budget"] == want, r.stderr
    r = _cli("run", str(budget_pkg), "-p", "def f", "-n", "2", "--memory-budget", s)
    assert r.returncode == 0 and f"memory budget {want:,} bytes" in r.stderr, r.stderr
    r = subprocess.run([str(budget_pkg / "bin" / "edgellm-run"), str(budget_pkg), "--ids", "1,2", "-n", "2",
                        "--memory-budget", s], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and f"[memory budget {want} bytes" in r.stderr, r.stderr
    p = subprocess.Popen([sys.executable, "-m", "edgellm.cli", "serve", str(budget_pkg), "--port", "0", "--threads",
                          "1", "--memory-budget", s], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = re.search(r"on (http://127\.0\.0\.1:\d+)", p.stdout.readline())
        assert url, p.stderr.read()[-2000:] if p.poll() is not None else "no address"
        import urllib.request

        metrics = urllib.request.urlopen(url.group(1) + "/metrics", timeout=30).read().decode()
        got = re.search(r"^edgellm_memory_budget_bytes (\S+)$", metrics, re.M)
        assert got and float(got.group(1)) == want, metrics[-1500:]
    finally:
        p.terminate()
        p.wait(timeout=30)
