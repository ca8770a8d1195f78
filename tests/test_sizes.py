"""A size means the same bytes in every front end: Python's parse_bytes (Runtime.load, edgellm run/serve/plan) and
libedgellm's el_parse_bytes (bin/edgellm-run, the JNI bridge) accept and refuse the same spellings and give the same
numbers ("600MB" was 600,000,000 bytes in Python and 629,145,600 in edgellm-run, which refused "600MiB")."""
from __future__ import annotations

import ctypes as C

import pytest

from edgellm.errors import EdgeLLMError
from edgellm.runtime.lib import lib
from edgellm.runtime.package import parse_bytes

SPELLINGS = ["1048576", "600MB", "600mb", "600M", "600MiB", "600 MiB", " 2GiB ", "1.5G", "1.5GB", ".5k", "7KB",
             "3kib", "1t", "2TB", "1TiB", "12b", "0.001K", "4611686018427387904", "4096T",
             # refused by both
             "", "  ", "MB", "-5M", "+5M", "1e6", "0x10", "inf", "nan", "5.M", "1..5M", "5 M B", "5MBB", "5XB",
             "0", "0MB", "0.0001", "99999999TB", "4611686018427387906000", "5M x", "１M"]


def c_parse(s: str):
    out = C.c_uint64()
    return int(out.value) if lib().el_parse_bytes(s.encode(), C.byref(out)) == 0 else None


def py_parse(s: str):
    try:
        return parse_bytes(s)
    except EdgeLLMError:
        return None


@pytest.mark.parametrize("s", SPELLINGS)
def test_python_and_c_read_a_size_alike(s):
    assert c_parse(s) == py_parse(s), (s, c_parse(s), py_parse(s))


def test_units():
    assert c_parse("600MB") == 600_000_000 and c_parse("600M") == c_parse("600MiB") == 600 * 2**20
    assert c_parse("1.5G") == 3 * 2**29 and c_parse("99999999TB") is None
    assert sum(py_parse(s) is not None for s in SPELLINGS) == 19
