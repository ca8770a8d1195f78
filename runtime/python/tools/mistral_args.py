"""Mistral's newer calls (v11+ tokenizers: Mistral Small 3.2, Ministral 3, Devstral, Magistral): each call is
[TOOL_CALLS]name[ARGS]{arguments} (Small 3.2's template also renders [CALL_ID]id before [ARGS]); several follow one
another. The markers are special tokens of those tokenizers."""
from __future__ import annotations

import json
import re

from .base import ToolFormat, alnum_id, read_json_objects


class MistralArgs(ToolFormat):
    name = "mistral-args"
    trigger = "[TOOL_CALLS]"

    @staticmethod
    def detect(template: str) -> bool:
        return "[TOOL_CALLS]" in template and "[ARGS]" in template

    def call_rule(self, tools: list[dict], spell) -> str:
        alts = []
        for t in tools:
            params = self.call_schema(t)["properties"][self.args_key]
            args = json.dumps({**params, "x-guidance": {"whitespace_flexible": False, "item_separator": ", ",
                                                        "key_separator": ": "}})
            alts.append(f'{json.dumps(t["function"]["name"])} call_id? {spell("[ARGS]")} %json {args}')
        return "call: " + " | ".join(alts) + f"\ncall_id: {spell('[CALL_ID]')} /[a-zA-Z0-9]{{9}}/"

    def calls_rules(self, head: str, parallel: bool, spell) -> str:
        return f"calls: call ({head} call)*" if parallel else "calls: call"

    def read_calls(self, text: str) -> list[dict] | None:
        calls = []
        for part in text.split(self.trigger):
            m = re.match(r"\s*([^\[\s]+)\s*(?:\[CALL_ID\]\s*[A-Za-z0-9]+\s*)?\[ARGS\](.*)$", part, re.S)
            objs = read_json_objects(m.group(2)) if m else None
            if not objs or len(objs) != 1 or not isinstance(objs[0], dict):
                if calls and part is text.split(self.trigger)[-1]:
                    break   # a last call cut off by max_tokens
                return None
            calls.append({"name": m.group(1), "arguments": objs[0]})
        return calls

    def call_id(self) -> str:
        return alnum_id(9)
