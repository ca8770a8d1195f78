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

    from edgellm.runtime import qnn_ort

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

