"""Llama 3.1/3.2 JSON tool calling: the reply is the call, {"name": ..., "parameters": {...}} (optionally after
<|python_tag|>); the templates render one call per turn."""
from __future__ import annotations

from .base import ANY_TEXT, ToolFormat, as_call, read_json_objects

PYTHON_TAG = "<|python_tag|>"


class Llama3(ToolFormat):
    name = "llama3"
    trigger = None
    args_key = "parameters"
    max_calls = 1

    @staticmethod
    def detect(template: str) -> bool:
        return "<|python_tag|>" in template or ('"parameters"' in template and "ipython" in template)

    def calls_rules(self, head: str, parallel: bool, spell) -> str:
        return "calls: call"

    def free_text_rule(self) -> str:
        # text that does not open with "{" (that would be a call)
        return f"FREE: /(\\s*[^\\s{{]{ANY_TEXT})?/"

    def split(self, raw: str) -> tuple[str, str | None]:
        s = raw.strip()
        if s.startswith(PYTHON_TAG):
            s = s[len(PYTHON_TAG):].strip()
        return ("", s) if s.startswith("{") else (raw, None)

    def read_calls(self, text: str) -> list[dict] | None:
        objs = read_json_objects(text, sep=";")
        calls = [as_call(o, self.args_key) for o in objs or []]
        return calls if calls and all(calls) else None

    def hold(self, text: str) -> int:
        s = text.lstrip()
        if not s or s.startswith("{") or PYTHON_TAG.startswith(s[:len(PYTHON_TAG)]):
            return 0   # nothing shown until the reply is known not to be a call
        return len(text)
