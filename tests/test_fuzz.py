"""Mutated packages never crash, hang or raise a traceback (bench/fuzz.py, a short campaign; the long one with
ASan + UBSan is `python bench/fuzz.py --per-file 3000 --sanitize`)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import fuzz  # noqa: E402


@pytest.fixture(scope="module")
def pkg(tmp_path_factory):
    return fuzz.make_package(tmp_path_factory.mktemp("fuzz"))


@pytest.mark.parametrize("name", fuzz.FILES)
def test_mutated_files_give_clean_outcomes(pkg, name):
    res = fuzz.campaign(pkg, [name], per_file=60, seed=fuzz.FILES.index(name), timeout=60)
    counts = res[name]
    assert sum(counts.values()) == 60
    assert not res["bad"], res["bad"][:3]
    assert counts["error"] > 0   # the mutations do reach the checks
    if name == "weights.bin":
        assert counts["same"] + counts["different"] > 0   # accepted: the bytes are data


def test_mutations_are_deterministic():
    import random

    data = bytes(range(256)) * 4
    a = [fuzz.mutate("plan.bin", data, random.Random(5)) for _ in range(3)]
    b = [fuzz.mutate("plan.bin", data, random.Random(5)) for _ in range(3)]
    assert a == b and any(x != data for x in a)


@pytest.mark.parametrize("kind", ["opencl", "host-npu"])
def test_mutated_tables_of_other_kinds(tmp_path, kind, monkeypatch):
    """The files an OpenCL package (kernels.cltab, kernels.cl) and an NPU package (npu/npu.txt, npu/rope.bin) add,
    mutated with SHA256SUMS removed (so every mutation reaches the parsers behind it): clean outcomes only."""
    import json

    from edgellm.compiler.onnx_qnn import qnn_ort

    if kind == "host-npu":
        if not qnn_ort.qnn_available():
            pytest.skip("needs onnxruntime-qnn")
        monkeypatch.setenv("EDGELLM_FUZZ_LOAD", json.dumps({"prefill_backend": "npu", "npu_soc": "sm8650"}))
    else:
        from test_opencl import _opencl_device

        if not _opencl_device():
            pytest.skip("no OpenCL platform (apt-get install pocl-opencl-icd)")
    pkg = fuzz.make_package(tmp_path, kind)
    files = list(fuzz.KIND_FILES[kind])
    res = fuzz.campaign(pkg, files, per_file=25, seed=7, timeout=60, runner=False)
    assert not res["bad"], res["bad"][:3]
    for name in files:
        assert sum(res[name].values()) == 25 and res[name]["error"] > 0, (name, res[name])



def _asan_loads(tmp_path, kind: str, variants):
    """A `kind` package (SHA256SUMS removed: the parsers are what is tested) loaded by the fuzz worker with libedgellm
    under ASan + UBSan once per variants() step (each rewrites a file); yields the worker's outcome of each load."""
    import json
    import os
    import shutil
    import subprocess

    pkg = fuzz.make_package(tmp_path, kind)
    (pkg / "SHA256SUMS").unlink()
    env = {**os.environ, **fuzz.sanitizer_env(tmp_path), "EDGELLM_FUZZ_LOAD": json.dumps(fuzz.KIND_LOAD[kind])}
    for _ in variants(pkg):
        r = subprocess.run([sys.executable, str(ROOT / "bench" / "fuzz.py"), "--worker"], env=env, text=True,
                           input=json.dumps({"pkg": str(pkg)}) + "\n", capture_output=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        yield json.loads(r.stdout)
    shutil.rmtree(pkg)


def test_truncated_routing_table_is_refused_under_asan(tmp_path):
    """A routing.bin cut short (the MoE expert cache's calibration counts) is one clean error, with libedgellm
    built under ASan + UBSan: the loader read its header before checking the size (found by `bench/fuzz.py --kind
    moe --sanitize`: 9 heap over-reads in 2000 mutations)."""
    def cuts(pkg):
        full = (pkg / "routing.bin").read_bytes()
        for n in (0, 5, 12, 15, len(full) - 1):
            yield (pkg / "routing.bin").write_bytes(full[:n])

    for out in _asan_loads(tmp_path, "moe", cuts):
        assert out["kind"] == "error" and "routing.bin is corrupt" in out["msg"], out


def test_bad_rope_table_is_refused_under_asan(tmp_path):
    """An NPU package's npu/rope.bin holding a NaN or a value no cos/sin table has is one clean error, with libedgellm
    built under ASan + UBSan: the error message read the table after freeing it (found by `bench/fuzz.py --kind
    host-npu --sanitize`: every value-changing mutation of rope.bin was a heap use-after-free)."""
    import struct

    from edgellm.compiler.onnx_qnn import qnn_ort

    if not qnn_ort.qnn_available():
        pytest.skip("needs onnxruntime-qnn")

    def bad_values(pkg):
        full = (pkg / "npu" / "rope.bin").read_bytes()
        for bad in (float("nan"), 1e6):
            yield (pkg / "npu" / "rope.bin").write_bytes(full[:52] + struct.pack("<f", bad) + full[56:])

    for out in _asan_loads(tmp_path, "host-npu", bad_values):
        assert out["kind"] == "error" and "holds a value no RoPE table has" in out["msg"], out
