"""Tool calling (OpenAI's `tools` / `tool_choice`): the tools go into the prompt through the model's own chat
template, the reply is constrained (llguidance, runtime/python/constrain.py) to the calls format that template
teaches, and read back into OpenAI tool_calls.

    plan = tool_plan(codec, tools, tool_choice, parallel_tool_calls)   # None: no tools in play
    prompt = codec.apply_chat_template(template_messages(messages), tools=plan.tools if plan else None)
    ... generate with grammar=plan.grammar(codec) and raw_text=True ...
    content, calls = plan.parse(raw_text)

A format is its own module (hermes.py, llama3.py, mistral.py, mistral_args.py) plus one line in FORMATS; a
template is matched to the first format whose marker it contains. tool_choice: "auto" (text or calls; the call is
constrained once its opening appears), "required" (calls only), {"type": "function", "function": {"name": ...}}
(that one function), "none" (the tools are not offered)."""
from __future__ import annotations

import json
from dataclasses import dataclass

from ....errors import InputError
from .base import ToolFormat
from .hermes import Hermes
from .llama3 import Llama3
from .mistral import Granite, Mistral
from .mistral_args import MistralArgs

# detection order: the first whose marker the template holds
FORMATS: dict[str, type[ToolFormat]] = {f.name: f for f in (MistralArgs, Mistral, Granite, Hermes, Llama3)}
CHOICES = ("auto", "none", "required")


def template_format(template: str) -> ToolFormat | None:
    return next((f() for f in FORMATS.values() if f.detect(template)), None)


def check_tools(tools) -> list[dict]:
    """OpenAI's function tools, checked: [{"type": "function", "function": {"name", "description"?, "parameters"?}}]."""
    if not isinstance(tools, list) or not tools:
        raise InputError("tools must be a non-empty list of {\"type\": \"function\", \"function\": {...}}")
    names = set()
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) and t.get("type", "function") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise InputError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}")
        if fn["name"] in names:
            raise InputError(f"tools[{i}]: the function name {fn['name']!r} is given twice")
        names.add(fn["name"])
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise InputError(f"tools[{i}].function.parameters must be a JSON schema object")
    # a description and parameters always there: templates read them without checking (Hermes 3's)
    return [{"type": "function", "function": {"description": "", "parameters": {"type": "object", "properties": {}},
                                              **{k: v for k, v in t["function"].items() if v is not None}}}
            for t in tools]


@dataclass
class ToolPlan:
    fmt: ToolFormat
    tools: list[dict]      # offered to the template
    callable: list[dict]   # those the reply may call (tool_choice naming one: that one)
    required: bool
    parallel: bool

    reasoning: bool = False   # the template's model thinks in <think> blocks first

    def grammar(self, codec) -> dict:
        specials = special_ids(codec)

        def spell(text: str) -> str:   # a marker the tokenizer has as a special token is that token
            tid = codec.tok.token_to_id(text) if codec.tok is not None else None
            return f"<[{tid}]>" if tid is not None and tid in specials else json.dumps(text)

        return {"type": "lark", "value": self.fmt.grammar(self.callable, self.required, self.parallel, spell,
                                                          self.reasoning)}

    def parse(self, raw: str) -> tuple[str | None, list[dict]]:
        """(content, OpenAI tool_calls) of a raw reply (special tokens included)."""
        content, calls = self.fmt.parse(raw)
        known = {t["function"]["name"] for t in self.tools}
        if any(c["name"] not in known for c in calls):
            return raw, []   # an unconstrained model calling a function it was not given: plain text
        out = [{"id": self.fmt.call_id(), "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)}}
               for c in calls]
        return (content or None) if out else content, out


def special_ids(codec) -> set[int]:
    cached = getattr(codec, "_special_ids", None)
    if cached is None:
        cached = {i for i, t in codec.tok.get_added_tokens_decoder().items() if t.special}
        codec._special_ids = cached
    return cached


def tool_plan(codec, tools, tool_choice=None, parallel_tool_calls: bool | None = True) -> ToolPlan | None:
    """The plan of a request's tools, or None (no tools, or tool_choice "none"). InputError where the package's chat
    template has no tool support or a format edgellm does not read."""
    if tools is None or tools == []:
        if tool_choice not in (None, "none", "auto"):
            raise InputError("tool_choice needs tools")
        return None
    tools = check_tools(tools)
    choice = "auto" if tool_choice is None else tool_choice
    if choice == "none":
        return None
    if isinstance(choice, dict):
        fn = choice.get("function") if choice.get("type", "function") == "function" else None
        name = fn.get("name") if isinstance(fn, dict) else None
        match = [t for t in tools if t["function"]["name"] == name]
        if not match:
            raise InputError(f"tool_choice names the function {name!r}, which is not in tools")
        callable_, required = match, True
    elif choice in CHOICES:
        callable_, required = tools, choice == "required"
    else:
        raise InputError(f"tool_choice {choice!r} is invalid: \"auto\", \"none\", \"required\" or "
                         "{\"type\": \"function\", \"function\": {\"name\": ...}}")
    template = codec.template_source()
    if not template or not codec.template_takes_tools():
        raise InputError("this model's chat template has no tool support: it cannot be given tools")
    fmt = template_format(template)
    if fmt is None:
        raise InputError("this model's chat template writes tool calls in a format edgellm does not read "
                         f"(it reads: {', '.join(FORMATS)})")
    parallel = parallel_tool_calls is not False and not isinstance(choice, dict)
    return ToolPlan(fmt, tools, callable_, required, parallel, "<think>" in template)


def template_messages(messages: list[dict]) -> list[dict]:
    """OpenAI messages as chat templates take them (transformers' convention): an assistant's tool call arguments as
    an object, not a JSON string; a tool result keeps its tool_call_id and gets the function's name."""
    names, out = {}, []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                fn = dict(c.get("function") or {})
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except ValueError:
                        raise InputError(f"a tool call's arguments are not JSON: {fn['arguments'][:80]!r}") from None
                names[c.get("id")] = fn.get("name")
                calls.append({**c, "type": "function", "function": fn})
            m["tool_calls"] = calls
        if m.get("role") == "tool" and "name" not in m and m.get("tool_call_id") in names:
            m["name"] = names[m["tool_call_id"]]
        if m.get("content") is None:
            m["content"] = ""
        out.append(m)
    return out


class ToolStream:
    """Streams a reply's content while holding back anything that is (or may still become) a tool call."""

    def __init__(self, plan: ToolPlan):
        self.plan, self.raw, self.sent = plan, "", 0

    def push(self, piece: str) -> str:
        self.raw += piece
        end = self.plan.fmt.hold(self.raw)
        if end <= self.sent:
            return ""
        out, self.sent = self.raw[self.sent:end], end
        return out

    def finish(self) -> tuple[str, list[dict]]:
        """(content not yet sent, tool_calls)."""
        content, calls = self.plan.parse(self.raw)
        if calls:
            return "", calls
        return self.raw[self.sent:], []
