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
