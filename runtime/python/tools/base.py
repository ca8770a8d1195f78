"""What every tool-call format shares: the Lark grammar (llguidance) that constrains a reply to text and/or calls,
and the JSON of one call. A format (hermes.py, llama3.py, mistral.py) says how its chat template's model writes a
call: the text that opens it, how one call is wrapped, how several are joined, and how to read them back."""
from __future__ import annotations

import json
import secrets
import string

# one call's JSON is spaced as the templates render it (jinja's tojson: json.dumps's ", " and ": ")
from ..constrain import JSON_STYLE

ANY_TEXT = r"(.|\n)*"


class ToolFormat:
    name = ""
    trigger: str | None = None      # the text that opens the calls (None: the reply itself starts with the call)
    args_key = "arguments"          # the key of the arguments object in one call's JSON
    max_calls: int | None = None    # 1: the template renders one call per turn

    @classmethod
    def detect(cls, template: str) -> bool:
        """Whether a chat template teaches this format (by default: it writes the trigger)."""
        return bool(cls.trigger) and cls.trigger in template

    # ---- grammar ---------------------------------------------------------------------------------------------------
    def call_schema(self, tool: dict) -> dict:
        fn = tool["function"]
        params = fn.get("parameters") or {"type": "object"}
        if isinstance(params.get("properties"), dict) and "additionalProperties" not in params:
            # arguments the function does not declare are an app's error: refused unless the schema allows them
            # (as llama.cpp's grammars do); small models otherwise invent keys and nest them without end
            params = {**params, "additionalProperties": False}
        return {"type": "object", "properties": {"name": {"const": fn["name"]}, self.args_key: params},
                "required": ["name", self.args_key], "additionalProperties": False}

    def call_json(self, tools: list[dict]) -> str:
        """The `%json {...}` of one call to any of the tools."""
        schemas = [self.call_schema(t) for t in tools]
        one = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
        return "%json " + json.dumps({**one, "x-guidance": JSON_STYLE})

    def call_rule(self, tools: list[dict], spell) -> str:
        """Lark rule `call`: one call to any of the tools (spell(text): the grammar's literal for a marker text)."""
        return f"call: {self.call_json(tools)}"

    def calls_rules(self, head: str, parallel: bool, spell) -> str:
        """Lark rules `calls` (everything after the trigger) given `head`, the grammar's spelling of the trigger."""
        raise NotImplementedError

    def grammar(self, tools: list[dict], required: bool, parallel: bool, spell=json.dumps,
                reasoning: bool = False) -> str:
        """A Lark grammar for llguidance. required: the reply is calls only (after a <think> block where the
        template has them: reasoning); else free text, or (lazily, once the trigger appears) text then calls.
        spell(text): the grammar's literal for a marker, `<[id]>` where the tokenizer has it as a special token
        (text cannot spell those, so no laziness is needed there)."""
        parallel = parallel and self.max_calls != 1
        head = spell(self.trigger) if self.trigger else ""
        special = head.startswith("<[")
        lines = ["%llguidance {}", self.call_rule(tools, spell), self.calls_rules(head, parallel, spell),
                 f"TEXT: /{ANY_TEXT}/"]
        if required:
            think = "think " if reasoning else ""
            lines.append(f"start: {think}{head} calls" if self.trigger else f"start: {think}calls")
            if reasoning:   # the reasoning, ended by its first </think>, then the calls
                lines += ['think: "" | think_text WS', 'think_text[lazy]: "<think>" TEXT "</think>"', r"WS: /\s*/"]
        elif self.trigger is None:     # a reply that starts with the call, or text that does not
            lines += ["start: FREE | calls", self.free_text_rule()]
        elif special:
            lines += [f"start: TEXT | TEXT {head} calls"]
        else:   # lazy: the text lexeme ends at the first trigger, and the calls' grammar applies from there
            lines += ["start: TEXT | opening calls", f"opening[lazy]: TEXT {head}"]
        return "\n".join(lines) + "\n"

    def free_text_rule(self) -> str:
        return f"FREE: /{ANY_TEXT}/"

    # ---- reading a reply back --------------------------------------------------------------------------------------
    def split(self, raw: str) -> tuple[str, str | None]:
        """(content, the text of the calls after the trigger), or (raw, None) without a call."""
        i = raw.find(self.trigger)
        return (raw, None) if i < 0 else (raw[:i], raw[i + len(self.trigger):])

    def read_calls(self, text: str) -> list[dict] | None:
        """The calls in what follows the trigger: [{"name", "arguments": dict}], None where it is not calls."""
        raise NotImplementedError

    def parse(self, raw: str) -> tuple[str, list[dict]]:
        """(content, calls) of a reply; a reply whose calls do not parse is all content."""
        content, rest = self.split(raw)
        if rest is None:
            return raw, []
        calls = self.read_calls(rest)
        if not calls:
            return raw, []
        return content.strip(), calls

    def hold(self, text: str) -> int:
        """Where the streamed content must stop: the start of a call, or of what may still become its trigger."""
        i = text.find(self.trigger)
        if i >= 0:
            return i
        for k in range(min(len(self.trigger) - 1, len(text)), 0, -1):
            if self.trigger.startswith(text[-k:]):
                return len(text) - k
        return len(text)

    def call_id(self) -> str:
        return "call_" + secrets.token_hex(12)


def read_json_objects(text: str, sep: str = "") -> list | None:
    """Consecutive JSON values in text (whitespace and `sep` between them); None where anything else is there."""
    dec, out, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and (text[i].isspace() or (sep and text.startswith(sep, i))):
            i += len(sep) if sep and text.startswith(sep, i) else 1
        if i >= len(text):
            return out
        try:
            v, i = dec.raw_decode(text, i)
        except ValueError:
            return None
        out.append(v)


def as_call(v, args_key: str) -> dict | None:
    """{"name", "arguments"} of a call object (either key name accepted), or None."""
    if not isinstance(v, dict) or not isinstance(v.get("name"), str):
        return None
    args = v.get(args_key, v.get("arguments", v.get("parameters", {})))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    return {"name": v["name"], "arguments": args} if isinstance(args, dict) else None


def alnum_id(n: int = 9) -> str:
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(n))
