"""Hermes-style calls (Qwen2/2.5/3, SmolLM3, Hermes, many fine-tunes): each call is a JSON object between
<tool_call> and </tool_call>, several calls one after another."""
from __future__ import annotations

import re

from .base import ToolFormat, as_call, read_json_objects


class Hermes(ToolFormat):
    name = "hermes"
    trigger = "<tool_call>"

    def calls_rules(self, head: str, parallel: bool, spell) -> str:
        # the newlines the templates write around the JSON, optional (SmolLM3 writes none)
        one = 'NL call NL "</tool_call>"'
        more = f' (NL {head} {one})*' if parallel else ""
        return f"calls: {one}{more}\nNL: /\\n?/"

    def read_calls(self, text: str) -> list[dict] | None:
        blocks = re.split(r"</tool_call>\s*(?:<tool_call>)?", text)
        calls = []
        for i, b in enumerate(blocks):
            if not b.strip():
                continue
            objs = read_json_objects(b)
            if not objs or len(objs) != 1 or (c := as_call(objs[0], self.args_key)) is None:
                if i == len(blocks) - 1 and calls:
                    break   # a last call cut off by max_tokens: the whole ones stand
                return None
            calls.append(c)
        return calls
