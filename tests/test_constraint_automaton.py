"""The C runtime's own output constraint (issue 37, for the front ends that link no grammar engine): a JSON schema or a
regular expression compiled on the host into a byte automaton (`edgellm schema`, runtime/python/automaton.py),
walked token by token in the C generation loop (runtime/core/constraint.c) by `bin/edgellm-run --constraint` and
the Android library. The automaton must take exactly the regular expression's language; every constrained output
must parse and validate; bad files and schemas are one-line errors."""
from __future__ import annotations

import json
import random
import re
import subprocess
from pathlib import Path

import pytest

from edgellm.errors import EdgeLLMError

jsonschema = pytest.importorskip("jsonschema")
A = pytest.importorskip("edgellm.runtime.python.automaton")
pytest.importorskip("outlines_core")

from test_structured import SCHEMAS  # noqa: E402  (50 schemas of growing complexity)


def mutations(text: str, rng: random.Random, n: int) -> list[str]:
    """Near misses: a character deleted, doubled or replaced (ASCII, a quote, a multi-byte character)."""
    out = []
    for _ in range(n):
        i = rng.randrange(len(text) + 1)
        op = rng.randrange(3)
        c = rng.choice(['"', "a", "1", ",", "}", " ", "\u00e9", "\u20ac", "\U0001F600", "\x85", "\\"])
        out.append(text[:i] + text[i + 1:] if op == 0 else text[:i] + c + text[i:] if op == 1 else
                   text[:i] + c + text[i + 1:])
    return out


@pytest.mark.parametrize("schema,valid", [
    ({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
      "required": ["name"]}, ['{"name":"x"}', '{ "name" : "h\u00e9 \U0001F600" , "n" : -12}', '{"name":""}']),
    ({"type": "object", "properties": {"tag": {"enum": ["\u03b1", "b\u20ac", "\U0001F600", 3, None]}},
      "required": ["tag"]}, ['{"tag":"\u03b1"}', '{"tag":"b\u20ac"}', '{"tag":null}', '{"tag":3}']),
    ({"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
                                       "k": {"type": "integer", "minimum": -3, "maximum": 12}},
      "required": ["xs", "k"]}, ['{"xs":[],"k":-3}', '{"xs":[true, false],"k":12}']),
])
def test_the_automaton_takes_what_the_regex_matches(schema, valid):
    """Byte for byte against Python's re on the same regular expression: valid instances, and near misses of them
    (non-ASCII characters included: the automaton walks UTF-8 bytes, the regex characters)."""
    rx = A.schema_regex(schema)
    a = A.Automaton(A.compile_schema(schema))
    rng = random.Random(0)
    for text in valid:
        assert a.matches(text) and re.fullmatch(rx, text), text
        for m in mutations(text, rng, 200):
            assert a.matches(m) == bool(re.fullmatch(rx, m)), (text, m)
    # what UTF-8 cannot be: overlong forms, surrogates, stray continuation bytes
    for bad in (b'{"name":"\xc0\xaf"}', b'{"name":"\xed\xa0\x80"}', b'{"name":"\x80"}', b'{"name":"\xf5\x80\x80\x80"}'):
        s = a.walk(bad)
        assert s < 0 or not a.accept[s], bad


def test_integer_bounds_are_kept():
    a = A.Automaton(A.compile_schema({"type": "integer", "minimum": -3, "exclusiveMaximum": 13}))
    assert [v for v in range(-20, 30) if a.matches(str(v))] == list(range(-3, 13))


@pytest.fixture(scope="module")
def automata(tmp_path_factory):
    d = tmp_path_factory.mktemp("automata")
    return [A.write(A.compile_schema(s), d / f"{i}.eldfa") for i, s in enumerate(SCHEMAS)]


def run_c(pkg: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(pkg / "bin" / "edgellm-run"), str(pkg), *args], capture_output=True, text=True,
                          timeout=300)


def finish(stderr: str) -> str:
    return re.search(r"generated \((\w+)\)", stderr).group(1)


def test_fifty_schemas_through_edgellm_run_parse_and_validate(demo_q8, automata):
    """bin/edgellm-run --constraint on the trained demo (a code model that writes no JSON of its own): greedy and two
    sampled seeds per schema; every output ends where the schema is complete, parses and validates."""
    for i, (schema, path) in enumerate(zip(SCHEMAS, automata)):
        for seed in (None, 1, 2):
            kw = ["--temperature", "0"] if seed is None else ["--temperature", "0.9", "--top-p", "0.95", "--seed",
                                                               str(seed)]
            r = run_c(demo_q8, "-p", "data = ", "-n", "300", "--constraint", str(path), *kw)
            assert r.returncode == 0, r.stderr
            assert finish(r.stderr) in ("eos", "stop"), (i, seed, r.stdout, r.stderr[-300:])
            jsonschema.validate(json.loads(r.stdout), schema)


def test_with_speculation_and_stops(demo_q8, tmp_path):
    """Drafts the automaton refuses get no row; the tokens are the constrained plain run's. A stop string and a
    max-token cut end it as they do without a constraint."""
    path = A.write(A.compile_regex(r"(\[10, 20, 30, 40\]; )+"), tmp_path / "list.eldfa")
    prompt = "x = [10, 20, 30, 40]; y = [10, 20, 30, 40]; z = "
    plain = run_c(demo_q8, "-p", prompt, "-n", "40", "--temperature", "0", "--constraint", str(path), "--print-ids")
    spec = run_c(demo_q8, "-p", prompt, "-n", "40", "--temperature", "0", "--constraint", str(path), "--print-ids",
                 "--speculate", "ngram")
    assert plain.returncode == 0 and spec.returncode == 0, (plain.stderr, spec.stderr)
    assert spec.stdout == plain.stdout and "speculative:" in spec.stderr, spec.stderr
    text = run_c(demo_q8, "-p", prompt, "-n", "40", "--temperature", "0", "--constraint", str(path))
    out = text.stdout.rstrip("\n")
    assert out and ("[10, 20, 30, 40]; " * 20).startswith(out), out   # what the regex takes, cut by -n
    stopped = run_c(demo_q8, "-p", prompt, "-n", "40", "--temperature", "0", "--constraint", str(path), "--stop", "30")
    assert stopped.returncode == 0 and finish(stopped.stderr) == "stop" and stopped.stdout.rstrip("\n") == "[10, 20, "
    cut = run_c(demo_q8, "-p", prompt, "-n", "3", "--temperature", "0", "--constraint", str(path))
    assert finish(cut.stderr) == "length"


def test_bad_files_and_schemas_are_one_line(demo_q8, tmp_path):
    bad = tmp_path / "bad.eldfa"
    good = A.compile_regex("(yes|no)")
    cases = {"missing": tmp_path / "none.eldfa", "not one": tmp_path / "text.eldfa", "truncated": bad}
    cases["not one"].write_text("hello")
    bad.write_bytes(good[:-3])
    for what, path in cases.items():
        r = run_c(demo_q8, "-p", "x", "--constraint", str(path))
        assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and "constraint" in r.stderr, (what, r)
    r = run_c(demo_q8, "-p", "x", "--constraint", "schema.json")
    assert r.returncode != 0 and "edgellm schema" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    damaged = bytearray(good)
    damaged[-4:] = (10**6).to_bytes(4, "little")   # a transition past the last node
    bad.write_bytes(bytes(damaged))
    r = run_c(demo_q8, "-p", "x", "--constraint", str(bad))
    assert r.returncode != 0 and "damaged" in r.stderr
    # the command line: one line, and no file left behind
    schema = tmp_path / "s.json"
    for args, text in ((["--regex", "("], None), ([str(schema)], "{not json"),
                       ([str(schema)], json.dumps({"type": "object", "properties": {"x": {"$ref": "#/nowhere"}}})),
                       ([str(tmp_path / "none.json")], None)):
        if text is not None:
            schema.write_text(text)
        out = tmp_path / "out.eldfa"
        r = subprocess.run(["edgellm", "schema", *args, "-o", str(out)], capture_output=True, text=True)
        assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
        assert not out.exists() and not list(tmp_path.glob("*.part"))
    with pytest.raises(EdgeLLMError):
        A.compile_regex("(")


def test_complete_text_ends_the_generation(demo_q8, tmp_path):
    """A text the automaton takes nothing after ends with `stop` even where the end-of-sequence id may not be drawn
    (--ignore-eos)."""
    path = A.write(A.compile_regex("(yes|no)"), tmp_path / "yn.eldfa")
    for extra in ([], ["--ignore-eos"]):
        r = run_c(demo_q8, "-p", "answer: ", "-n", "20", "--temperature", "0", "--constraint", str(path), *extra)
        assert r.returncode == 0 and r.stdout.strip() in ("yes", "no"), r
        assert finish(r.stderr) in (("eos", "stop") if not extra else ("stop",)), r.stderr
