"""The tier table in conftest.py names real modules and test functions (a renamed test must not slip out of its tier
silently), and the fast tier keeps a test of every module that is not slow as a whole."""
from __future__ import annotations

import ast
from pathlib import Path

import conftest

HERE = Path(__file__).resolve().parent


def _functions(module: str) -> set[str]:
    tree = ast.parse((HERE / module).read_text(encoding="utf-8"))
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


def test_slow_modules_exist():
    for m in conftest.SLOW_MODULES:
        assert (HERE / m).is_file(), m


def test_slow_tests_exist_and_leave_a_fast_one():
    for m, names in conftest.SLOW_TESTS.items():
        have = _functions(m)
        assert set(names) <= have, (m, set(names) - have)
        assert m == "test_readme.py" or have - set(names), m   # README blocks: one parametrized test


def test_fast_exceptions_name_slow_tests():
    for nodeid in conftest.FAST_ANYWAY:
        m, name = nodeid.split("::")
        assert name.split("[")[0] in conftest.SLOW_TESTS[m], nodeid
