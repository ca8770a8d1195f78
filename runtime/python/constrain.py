"""Output constraints (issue 37): JSON, JSON schema, regex and Lark grammars, through llguidance.

llguidance (the Rust engine onnxruntime-genai and Guidance use) turns a constraint into a matcher over the package's
own tokenizer; before each draw the matcher's mask of allowed tokens goes to the C loop (el_generate_constrain), which
gives every other token -inf logits, so every sampler setting, stop string, prefix reuse and speculation work as
without it (a draft the mask forbids is simply never taken); after each draw the matcher takes the token. The
unconstrained path never imports llguidance.
"""
from __future__ import annotations

import ctypes as C
import json

from ...errors import InputError

# OpenAI's response_format types, and the grammar kinds generate(grammar=...) takes
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
GRAMMAR_KINDS = ("lark", "regex", "gbnf")
# JSON on one line, spaced as json.dumps spaces it (", " and ": "; a schema's own "x-guidance" wins): with free
# whitespace small models fill the output with newlines, which the grammar cannot refuse, and JSON with no spaces at
# all holds them to token sequences they rarely saw (SmolLM2-135M got fewer fields right: bench/structured_eval.py)
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _engine():
    try:
        import llguidance
        import llguidance.numpy  # noqa: F401 - fill_next_token_bitmask
    except ImportError:  # pragma: no cover - a dependency of edgellm
        raise InputError("structured output needs the llguidance package: pip install llguidance") from None
    return llguidance


def grammar_for(response_format=None, grammar=None) -> str | None:
    """The llguidance grammar of a response_format (OpenAI's: {"type": "json_object"}, {"type": "json_schema",
    "json_schema": {"schema": {...}}}) or a grammar (a Lark string, or {"type": "lark" | "regex" | "gbnf",
    "value": "..."}); None when neither constrains the output."""
    if response_format is not None and grammar is not None:
        raise InputError("give response_format or grammar, not both")
    if grammar is not None:
        kind, text = ("lark", grammar) if isinstance(grammar, str) else (
            (grammar.get("type"), grammar.get("value")) if isinstance(grammar, dict) else (None, None))
        if kind not in GRAMMAR_KINDS or not isinstance(text, str) or not text:
            raise InputError("grammar must be a Lark grammar (a string) or {\"type\": \"lark\" | \"regex\" | "
                             "\"gbnf\", \"value\": \"...\"}")
        g = _engine()
        if kind == "gbnf":
            from llguidance.gbnf_to_lark import gbnf_to_lark

            try:
                text, kind = gbnf_to_lark(text), "lark"
            except Exception as e:  # noqa: BLE001 - the converter's own errors, and what bad input makes it raise
                raise InputError(f"the GBNF grammar is invalid: {str(e).splitlines()[0] if str(e) else e!r}") from None
        return g.LLMatcher.grammar_from_regex(text) if kind == "regex" else g.LLMatcher.grammar_from_lark(text)
    if response_format is None:
        return None
    if isinstance(response_format, str):
        response_format = {"type": response_format}
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind not in RESPONSE_FORMATS:
        raise InputError(f"response_format type {kind!r} is invalid: choose one of {', '.join(RESPONSE_FORMATS)}")
    if kind == "text":
        return None
    if kind == "json_object":
        return _engine().LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_STYLE)
    spec = response_format.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise InputError(f"response_format json_schema.schema is not JSON: {e}") from None
    if not isinstance(schema, (dict, bool)):
        raise InputError("response_format type json_schema needs json_schema.schema: a JSON schema object")
    return _engine().LLMatcher.grammar_from_json_schema(schema, defaults=JSON_STYLE)


def engine_tokenizer(runtime):
    """llguidance's view of the package's tokenizer (built once per Runtime: ~0.3 s for a 49k vocabulary)."""
    lt = getattr(runtime, "_lltok", None)
    if lt is None:
        if not runtime.text.available:
            raise InputError("structured output needs the package's tokenizer.json (this package has none)")
        lt = _engine().LLTokenizer(runtime.text.tok.to_str(), n_vocab=runtime.vocab,
                                   eos_token=sorted(runtime.eos_ids) or None)
        runtime._lltok = lt
    return lt


def check(runtime, grammar: str) -> None:
    """InputError with the engine's reason where it refuses the grammar over this package's tokenizer (the server
    checks a request before it takes a slot, without building a matcher)."""
    err = _engine().LLMatcher.validate_grammar(grammar, engine_tokenizer(runtime))
    if err:
        raise InputError(f"the output constraint is invalid: {err.splitlines()[0]}")


class Constraint:
    """One generation's matcher: mask() before each draw, accept(token) after it."""

    def __init__(self, runtime, grammar: str):
        g = _engine()
        self._g = g
        # the matcher reports what validate_grammar would (is_error below): the grammar is not checked twice
        self.matcher = g.LLMatcher(engine_tokenizer(runtime), grammar, log_level=0)
        if self.matcher.is_error():
            raise InputError(f"the output constraint is invalid: {self.matcher.get_error().splitlines()[0]}")
        self.bits = g.numpy.allocate_token_bitmask(1, runtime.vocab)
        self.words = self.bits.shape[1]

    def mask(self):
        """The allowed tokens of the next draw, as el_generate_constrain takes them."""
        self._g.numpy.fill_next_token_bitmask(self.matcher, self.bits, 0)
        if self.matcher.is_error():
            raise InputError(f"the output constraint failed: {self.matcher.get_error().splitlines()[0]}")
        return self.bits.ctypes.data_as(C.POINTER(C.c_uint32)), self.words

    def allowed_drafts(self, ids, parents, n, keep) -> int:
        """el_draft_filter: keep[i] = 1 where the matcher takes draft i after its path (the drafts from the token
        just sampled, which it has taken, to i), without moving the matcher."""
        try:
            paths: list[list[int] | None] = [[]]   # node 0: the sampled token
            for i in range(n):
                up = paths[parents[i]] if 0 <= parents[i] <= i else None
                path = None if up is None else up + [ids[i]]
                if path is not None and self.matcher.validate_tokens(path) != len(path):
                    path = None
                paths.append(path)
                keep[i] = path is not None
            return 0
        except Exception:  # noqa: BLE001 - never raise into C: the pass then keeps its drafts (the mask still holds)
            return 1

    def accept(self, token: int) -> None:
        if not self.matcher.consume_token(int(token)):
            raise InputError(f"the output constraint refused token {token}: "
                             f"{self.matcher.get_error().splitlines()[0] if self.matcher.is_error() else 'no reason'}")
