"""The OpenAI API subset `edgellm serve` speaks: request models (pydantic; a field outside the subset is refused
with 400, not silently ignored) and the response objects, shaped as the official `openai` client parses them."""
from __future__ import annotations

import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..python.options import DRAFT_MAX, SPECULATE

Speculate = Literal[tuple(SPECULATE)]   # the option table's names

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length", "cancelled": "stop"}


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    stream: bool = False
    stream_options: dict | None = None          # {"include_usage": true}
    max_tokens: int | None = Field(default=None, ge=0)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = 1
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    user: str | None = None                     # accepted (OpenAI clients send it), unused
    # llama.cpp-server extensions
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0, le=1)
    repetition_penalty: float | None = Field(default=None, gt=0)
    ignore_eos: bool = False
    speculate: Speculate | None = None   # None: the server's (edgellm serve --speculate)
    draft_max: int | None = Field(default=None, ge=0, le=DRAFT_MAX)
    context_shift: Literal["off", "on"] | bool | None = None   # None: the server's (on unless --context-shift off)
    shift_sinks: int | None = Field(default=None, ge=0, le=1024)
    shift_tokens: int | None = Field(default=None, ge=0, le=2**31 - 1)
    return_tokens: bool = False                 # the generated token ids in each choice ("tokens"), not streamed
    # {"type": "text" | "json_object"} or {"type": "json_schema", "json_schema": {"schema": {...}}}: the output is
    # constrained to it (runtime/python/constrain.py)
    response_format: dict | None = None
    # refused unless left at their defaults (see unsupported())
    logprobs: bool | int | None = None
    logit_bias: dict | None = None

    def unsupported(self) -> str | None:
        if self.n != 1:
            return "n must be 1: one completion per request (send several requests)"
        if self.logprobs:
            return "logprobs are not supported"
        if self.logit_bias:
            return "logit_bias is not supported"
        return None

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > 16 or any(not s for s in stops):
            raise ValueError("stop: at most 16 non-empty strings")
        return stops

    def sampling(self) -> dict:
        """Keyword arguments of Context.stream (None: the package's default)."""
        return {"max_new_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
                "top_k": self.top_k, "min_p": self.min_p, "repetition_penalty": self.repetition_penalty,
                "presence_penalty": self.presence_penalty, "frequency_penalty": self.frequency_penalty,
                "seed": None if self.seed is None else self.seed & (2**64 - 1), "stop": self.stops(),
                "ignore_eos": self.ignore_eos, "speculate": self.speculate, "draft_max": self.draft_max,
                "context_shift": self.context_shift, "shift_sinks": self.shift_sinks, "shift_tokens": self.shift_tokens,
                "response_format": self.response_format, "grammar": None}

    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    arguments: str                              # a JSON string, as OpenAI sends it


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict] | None = None     # None: an assistant turn that only called tools
    name: str | None = None
    tool_calls: list[ToolCall] | None = None    # an assistant's calls, sent back with the tools' results
    tool_call_id: str | None = None             # a tool result: the call it answers
    # what the official client echoes back of an earlier reply's message: accepted, unused
    refusal: str | None = None
    annotations: list | None = None
    audio: dict | None = None
    function_call: dict | None = None

    def text(self) -> str:
        """String content, or the text parts of a content list (images and audio are refused)."""
        if self.content is None:
            if self.role == "assistant" and self.tool_calls:
                return ""
            raise ValueError(f"a {self.role} message needs content")
        if isinstance(self.content, str):
            return self.content
        parts = []
        for p in self.content:
            if p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise ValueError(f"message content part of type {p.get('type')!r} is not supported: text only")
            parts.append(p["text"])
        return "".join(parts)

    def for_template(self) -> dict:
        m = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.tool_calls:
            m["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            m["tool_call_id"] = self.tool_call_id
        if self.name is not None and self.role == "tool":
            m["name"] = self.name
        return m


class ChatRequest(_Request):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    # OpenAI function tools (runtime/python/tools): offered through the model's chat template, calls constrained
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None       # "auto" (default with tools) | "none" | "required" | a function
    parallel_tool_calls: bool | None = None     # None/true: several calls in one reply where the format has them

    def sampling(self) -> dict:
        out = super().sampling()
        if self.max_completion_tokens is not None:
            out["max_new_tokens"] = self.max_completion_tokens
        return out


class CompletionRequest(_Request):
    prompt: str | list[int]
    echo: bool = False

    def unsupported(self) -> str | None:
        return "echo is not supported" if self.echo else super().unsupported()


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(r: dict) -> dict:
    return {"prompt_tokens": r["prompt_tokens"], "completion_tokens": len(r["ids"]),
            "total_tokens": r["prompt_tokens"] + len(r["ids"]),
            "prompt_tokens_details": {"cached_tokens": r["cached_tokens"]}}


def timings(r: dict) -> dict:
    """llama.cpp-style timings (extension): what the prefill and decode took. predicted_n counts every generated
    token (usage.completion_tokens); the first comes with the prefill, so the decode rate is over the others."""
    new = r["prompt_tokens"] - r["cached_tokens"]
    return {"prompt_n": new, "prompt_ms": 1e3 * r["prefill_s"], "cached_n": r["cached_tokens"],
            "predicted_n": len(r["ids"]), "predicted_ms": 1e3 * r["decode_s"], "ttft_ms": 1e3 * r["ttft_s"],
            "prompt_per_second": new / r["prefill_s"] if r["prefill_s"] > 0 else 0.0,
            "predicted_per_second": r["n_decoded"] / r["decode_s"] if r["decode_s"] > 0 else 0.0}


def finish_reason(r: dict, calls: list | None = None) -> str:
    return "tool_calls" if calls and r["finish_reason"] in ("eos", "stop") else FINISH[r["finish_reason"]]


def chat_response(rid: str, model: str, r: dict, tokens: bool = False, content: str | None = None,
                  calls: list | None = None) -> dict:
    """calls: the reply's tool_calls (content is then what came before them, None if nothing did)."""
    message = {"role": "assistant", "content": r["text"] if calls is None else content}
    if calls:
        message["tool_calls"] = calls
    choice = {"index": 0, "message": message, "finish_reason": finish_reason(r, calls), "logprobs": None}
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{**choice, "tokens": r["ids"]} if tokens else choice], "usage": usage(r), "timings": timings(r)}


def tool_call_deltas(calls: list) -> list[dict]:
    """A streamed reply's calls, each whole in one delta (the official client joins argument pieces; one piece is
    a valid stream)."""
    return [{"tool_calls": [{"index": i, **c}]} for i, c in enumerate(calls)]


def chat_chunk(rid: str, model: str, delta: dict, finish: str | None = None) -> dict:
    return {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}


def completion_response(rid: str, model: str, r: dict, tokens: bool = False) -> dict:
    choice = {"index": 0, "text": r["text"], "finish_reason": FINISH[r["finish_reason"]], "logprobs": None}
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{**choice, "tokens": r["ids"]} if tokens else choice], "usage": usage(r), "timings": timings(r)}


def completion_chunk(rid: str, model: str, text: str, finish: str | None = None) -> dict:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}]}


def usage_chunk(rid: str, model: str, obj: str, r: dict) -> dict:
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [],
            "usage": usage(r), "timings": timings(r)}


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
