"""Structured output (issue 37): JSON, JSON-schema, regex and Lark constraints through llguidance's masks in the C
generation loop (runtime/python/constrain.py, el_generate_constrain). Every constrained output must parse and
validate, with every sampler setting and with speculation; a constraint the engine refuses is a one-line error."""
from __future__ import annotations

import json
import random
import subprocess

import pytest

from edgellm.errors import EdgeLLMError
from edgellm.runtime.python.api import Runtime

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")


def bounded_schema(rng: random.Random, depth: int = 0) -> dict:
    """A random schema whose instances are short (bounded strings, numbers, arrays; no extra keys): every value a
    model can be forced through ends within a few dozen tokens."""
    # (no "number": a fraction's digits are unbounded, and a model may write them until the cut)
    kinds = ["string", "integer", "boolean", "enum", "array"] + (["object", "anyOf"] if depth < 2 else [])
    k = rng.choice(kinds)
    if k == "string":
        return {"type": "string", "maxLength": rng.randint(0, 10)}
    if k == "integer":
        lo = rng.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 500)}
    if k == "boolean":
        return {"type": "boolean"}
    if k == "enum":
        return {"enum": rng.sample(["red", "green", "blue", 1, 2, None, True], rng.randint(1, 4))}
    if k == "array":
        return {"type": "array", "items": bounded_schema(rng, depth + 1), "maxItems": rng.randint(0, 3)}
    if k == "anyOf":
        return {"anyOf": [bounded_schema(rng, depth + 1) for _ in range(rng.randint(2, 3))]}
    names = rng.sample(["name", "age", "tags", "id", "ok", "kind", "size", "note"], rng.randint(1, 4))
    props = {n: bounded_schema(rng, depth + 1) for n in names}
    return {"type": "object", "properties": props, "required": rng.sample(names, rng.randint(0, len(names))),
            "additionalProperties": False}


def schemas(n: int) -> list[dict]:
    """n schemas of growing complexity: objects at the top (as apps ask for), some with $ref definitions."""
    rng = random.Random(37)
    out = []
    for i in range(n):
        s = bounded_schema(rng, depth=max(0, 1 - i // 20))
        if s.get("type") != "object":
            s = {"type": "object", "properties": {"value": s}, "required": ["value"], "additionalProperties": False}
        if i % 5 == 4:   # a $ref to a definition
            s = {"$defs": {"item": s}, "type": "object", "properties": {"item": {"$ref": "#/$defs/item"},
                                                                        "count": {"type": "integer", "minimum": 0,
                                                                                  "maximum": 9}},
                 "required": ["item", "count"], "additionalProperties": False}
        out.append(s)
    return out


SCHEMAS = schemas(50)


def fmt(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}


def test_fifty_schemas_parse_and_validate(demo_q8):
    """Greedy and two sampled seeds per schema, on the trained demo (a code model that writes no JSON of its own):
    every output ends (eos), parses and validates."""
    with Runtime.load(demo_q8) as rt:
        for i, schema in enumerate(SCHEMAS):
            for seed in (None, 1, 2):
                kw = {"temperature": 0} if seed is None else {"temperature": 0.9, "top_p": 0.95, "seed": seed}
                r = rt.generate("data = ", max_new_tokens=300, response_format=fmt(schema), **kw)
                assert r.finish_reason == "eos", (i, seed, r.text)
                jsonschema.validate(json.loads(r.text), schema)


def test_json_object_regex_and_lark(demo_q8):
    with Runtime.load(demo_q8) as rt:
        r = rt.generate("x = ", max_new_tokens=200, temperature=0, response_format={"type": "json_object"})
        assert r.finish_reason in ("eos", "length")
        if r.finish_reason == "eos":
            assert isinstance(json.loads(r.text), dict)
        else:   # the demo may fill a string to the cut: what it wrote is still a prefix the grammar allows
            assert r.text.startswith("{")
        r = rt.generate("answer: ", max_new_tokens=20, temperature=0, grammar={"type": "regex", "value": r"(yes|no)"})
        assert r.text in ("yes", "no") and r.finish_reason == "eos"
        lark = 'start: "[" num ("," num)* "]"\nnum: /[0-9]{1,3}/\n'
        r = rt.generate("xs = ", max_new_tokens=60, temperature=0.8, seed=3, grammar=lark)
        if r.finish_reason == "eos":
            assert all(0 <= v <= 999 for v in json.loads(r.text))
        gbnf = 'root ::= "true" | "false"\n'
        r = rt.generate("ok = ", max_new_tokens=8, temperature=0, grammar={"type": "gbnf", "value": gbnf})
        assert r.text in ("true", "false")
        assert rt.generate("x", max_new_tokens=4, response_format={"type": "text"}).text is not None


def test_with_speculation_stops_limits_and_reuse(demo_q8):
    """The mask is per draw: drafts the constraint forbids are never taken, so speculative runs give the constrained
    plain run's tokens; max_new_tokens cuts say length; stop strings cut the text; prefix reuse keeps working."""
    schema = SCHEMAS[7]
    with Runtime.load(demo_q8) as rt:
        plain = rt.generate("data = ", max_new_tokens=200, temperature=0, response_format=fmt(schema))
        for mode in ("ngram", "recycle", "auto"):
            got = rt.generate("data = ", max_new_tokens=200, temperature=0, response_format=fmt(schema),
                              speculate=mode)
            assert got.token_ids == plain.token_ids, mode
        cut = rt.generate("data = ", max_new_tokens=3, temperature=0, response_format=fmt(schema))
        assert cut.finish_reason == "length" and cut.token_ids == plain.token_ids[:3]
        if '"' in plain.text[1:]:
            stop = '"'
            r = rt.generate("data = ", max_new_tokens=200, temperature=0, response_format=fmt(schema), stop=stop)
            assert r.finish_reason == "stop" and stop not in r.text
        conv = [{"role": "user", "content": "give data"}]
        a = rt.chat(conv, max_new_tokens=100, temperature=0, response_format={"type": "json_object"})
        b = rt.chat(conv + [{"role": "assistant", "content": a.text}, {"role": "user", "content": "again"}],
                    max_new_tokens=100, temperature=0, response_format={"type": "json_object"})
        assert b.cached_tokens > 0 and b.text.startswith("{")


def test_drafts_the_constraint_refuses_are_dropped_before_their_pass(demo_q8, monkeypatch):
    """el_generate_filter_drafts: the matcher checks a pass's drafts along their paths; a refused draft and what
    follows it get no row. A prompt whose n-grams the constraint forbids drafts fewer tokens than with the check
    off (measured 29 against 43), and the tokens stay the constrained plain run's."""
    import ctypes as C

    from edgellm.runtime.python import constrain

    with Runtime.load(demo_q8) as rt:
        c = constrain.Constraint(rt, constrain.grammar_for(grammar={"type": "regex", "value": "(ab)+c"}))
        a, b, cc = (rt.encode(x, add_special_tokens=False) for x in ("ab", "c", "x"))
        assert len(a) == len(b) == len(cc) == 1
        # a tree: ab -> ab -> c, ab -> x (refused) -> ab (dropped with it), c (refused: (ab)+ needs one ab first)
        ids, parents = [a[0], a[0], b[0], cc[0], a[0], b[0]], [0, 1, 2, 1, 4, 0]
        keep = (C.c_uint8 * 6)()
        assert c.allowed_drafts(ids, parents, 6, keep) == 0
        assert list(keep) == [1, 1, 1, 0, 0, 0]
        # the n-grams of the prompt continue " bbbb aaaa ...", which the constraint forbids
        prompt, rx = "aaaa bbbb aaaa bbbb aaaa bbbb aaaa", {"type": "regex", "value": "( aaaa){1,12}"}
        plain = rt.generate(prompt, max_new_tokens=40, temperature=0, grammar=rx)

        def drafted(**kw):   # the stats count over the context's life: this generation's share
            before = rt.stats()["spec_drafted"]
            r = rt.generate(prompt, max_new_tokens=40, temperature=0, grammar=rx, speculate="ngram", **kw)
            return r, rt.stats()["spec_drafted"] - before

        checked, n_checked = drafted()
        monkeypatch.setattr(constrain.Constraint, "allowed_drafts",
                            lambda self, ids, parents, n, keep: [keep.__setitem__(i, 1) for i in range(n)] and 0)
        unchecked, n_unchecked = drafted()
        assert checked.token_ids == unchecked.token_ids == plain.token_ids
        assert n_checked < n_unchecked, (n_checked, n_unchecked)


def test_bad_constraints_are_one_line(demo_q8):
    with Runtime.load(demo_q8) as rt:
        for kw, match in (({"response_format": {"type": "xml"}}, "response_format"),
                          ({"response_format": {"type": "json_schema"}}, "schema"),
                          ({"response_format": fmt({"type": "object", "properties": {"a": {"$ref": "#/nope"}}})},
                           "constraint is invalid"),
                          ({"grammar": "start: @@@"}, "constraint is invalid"),
                          ({"grammar": {"type": "pcre", "value": "x"}}, "grammar"),
                          ({"grammar": "start: \"a\"", "response_format": {"type": "json_object"}}, "not both")):
            with pytest.raises(EdgeLLMError, match=match) as e:
                rt.generate("x", max_new_tokens=4, **kw)
            assert "\n" not in str(e.value)


def test_cli_flags(demo_q8, tmp_path):
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(SCHEMAS[3]))
    r = subprocess.run(["edgellm", "run", str(demo_q8), "-p", "data = ", "-n", "300", "--temperature", "0",
                        "--json-schema", str(schema), "--quiet"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    jsonschema.validate(json.loads(r.stdout), SCHEMAS[3])
    g = tmp_path / "yn.gbnf"
    g.write_text('root ::= "yes" | "no"\n')
    r = subprocess.run(["edgellm", "run", str(demo_q8), "-p", "ok? ", "-n", "8", "--temperature", "0", "--grammar",
                        str(g), "--quiet"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() in ("yes", "no"), r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = subprocess.run(["edgellm", "run", str(demo_q8), "-p", "x", "--json-schema", str(bad)], capture_output=True,
                       text=True)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and "not JSON" in r.stderr, r.stderr
