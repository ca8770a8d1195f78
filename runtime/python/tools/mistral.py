"""Calls as one JSON list after a marker. Mistral (7B v0.3, Nemo): [TOOL_CALLS][{"name": ..., "arguments": {...}},
...] (the templates want 9-character alphanumeric call ids); Granite 3.x: <|tool_call|>[...] likewise."""
from __future__ import annotations

import json

from .base import ToolFormat, alnum_id, as_call, read_json_objects


class Mistral(ToolFormat):
    name = "mistral"
    trigger = "[TOOL_CALLS]"

    @staticmethod
    def detect(template: str) -> bool:
        return "[TOOL_CALLS]" in template and "[ARGS]" not in template

    def call_schema(self, tool: dict) -> dict:
        # the templates render each earlier call with its id after the arguments: a model may write one too
        s = super().call_schema(tool)
        return {**s, "properties": {**s["properties"], "id": {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}}}

    def calls_rules(self, head: str, parallel: bool, spell) -> str:
        more = ' (", " call)*' if parallel else ""
        return f'calls: SP "[" call{more} "]"\nSP: / ?/'

    def read_calls(self, text: str) -> list[dict] | None:
        objs = read_json_objects(text)
        if objs is None:   # a list cut off by max_tokens: its whole calls stand
            objs = [whole_items(text)]
        if len(objs) != 1:
            return None
        items = objs[0] if isinstance(objs[0], list) else [objs[0]]
        calls = [as_call(o, self.args_key) for o in items]
        return calls if calls and all(calls) else None

    def call_id(self) -> str:
        return alnum_id(9)


class Granite(Mistral):
    name = "granite"
    trigger = "<|tool_call|>"

    def call_schema(self, tool: dict) -> dict:
        return ToolFormat.call_schema(self, tool)

    def call_id(self) -> str:
        return ToolFormat.call_id(self)


def whole_items(text: str) -> list:
    """The complete values at the start of a JSON list that is cut off."""
    dec, out = json.JSONDecoder(), []
    i = text.find("[") + 1
    while 0 < i < len(text):
        while i < len(text) and (text[i].isspace() or text[i] == ","):
            i += 1
        try:
            v, i = dec.raw_decode(text, i)
        except ValueError:
            break
        out.append(v)
    return out
