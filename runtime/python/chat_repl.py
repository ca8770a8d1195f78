"""`edgellm chat`: an interactive conversation in the terminal. The conversation stays in one context's KV cache,
so each turn prefills only what is new (the end of the last reply and the new message: `reuse_prefix`); a stats line
after each reply says how many prompt tokens were prefilled and how many came from the cache. Prompts come from
stdin line by line when it is not a terminal."""
from __future__ import annotations

import sys

from ...errors import EdgeLLMError

HELP = "/reset: new conversation · /system TEXT: set the system prompt (and reset) · /quit · Ctrl-C stops a reply"


def chat_repl(rt, system: str | None = None, sampling: dict | None = None, stdin=None, out=None, err=None,
              tools: list[dict] | None = None, tool_choice=None) -> int:
    """tools: OpenAI function tools offered to the model (edgellm chat --tools FILE): a call it makes is shown as
    `[tool call] name {arguments}` and its result is asked for (the next line), then the model goes on."""
    from .tools import template_messages, tool_plan

    stdin, out, err = stdin or sys.stdin, out or sys.stdout, err or sys.stderr
    tty = stdin.isatty()
    if tty:
        import readline  # noqa: F401 - line editing and history for input()
    ctx = rt.context
    messages: list[dict] = []
    plan = tool_plan(rt.text, tools, tool_choice) if tools else None
    constrain = {"grammar": plan.grammar(rt.text), "_raw_text": True} if plan else {}

    def render() -> list[int]:
        prompt = rt.text.apply_chat_template(template_messages(messages), tools=plan.tools if plan else None)
        return rt.encode(prompt, add_special_tokens=False)

    def read_line(prompt: str) -> str | None:
        try:
            line = input(prompt) if tty else stdin.readline()
        except EOFError:
            return None
        return None if not tty and line == "" else line

    def reset():
        messages.clear()
        if system:
            messages.append({"role": "system", "content": system})

    reset()
    if tty:
        print(f"edgellm chat: context {rt.max_context} tokens. {HELP}", file=err)
    while True:
        try:
            line = read_line("> ")
        except UnicodeDecodeError:   # a line that is not UTF-8: say so, keep the conversation
            print("[error: the line is not valid UTF-8 text]", file=err)
            continue
        if line is None:
            break
        line = line.strip()
        if not line:
            continue
        if line in ("/quit", "/exit", "/q"):
            break
        if line == "/reset":
            reset()
            print("[new conversation]", file=err)
            continue
        if line.startswith("/system"):
            system = line[len("/system"):].strip() or None
            reset()
            print(f"[system prompt {'set' if system else 'cleared'}; new conversation]", file=err)
            continue
        if line == "/help" or line.startswith("/"):
            print(HELP, file=err)
            continue
        messages.append({"role": "user", "content": line})
        if not reply(rt, ctx, messages, render, sampling, constrain, plan, read_line, out, err):
            break
    return 0




def reply(rt, ctx, messages, render, sampling, constrain, plan, read_line, out, err) -> bool:
    """The model's turn (and, after its tool calls and their results, its next one). False: stdin ended."""
    from .tools import ToolStream

    while True:
        try:
            ids = render()
            while len(ids) >= rt.max_context and len(messages) > 2:   # drop the oldest exchange but the system's
                del messages[1 if messages[0]["role"] == "system" else 0]
                ids = render()
        except EdgeLLMError as e:   # e.g. a line that is not UTF-8 text: the conversation goes on without it
            messages.pop()
            print(f"[error: {e}]", file=err)
            return True
        if len(ids) >= rt.max_context:
            messages.pop()
            print(f"[the message is {len(ids)} tokens: more than the context of {rt.max_context}]", file=err)
            return True
        r: dict = {}
        calls_out = ToolStream(plan) if plan else None
        try:
            for piece in ctx.stream(ids, reuse_prefix=True, _result=r, **(sampling or {}), **constrain):
                out.write(calls_out.push(piece) if calls_out else piece)
                out.flush()
        except KeyboardInterrupt:
            ctx.cancel()
            r.setdefault("finish_reason", "cancelled")
        except EdgeLLMError as e:
            messages.pop()
            print(f"\n[error: {e}]", file=err)
            return True
        calls = []
        if calls_out is not None and "text" in r:
            rest, calls = calls_out.finish()
            out.write(rest)
            for c in calls:
                out.write(f"\n[tool call] {c['function']['name']} {c['function']['arguments']}")
        out.write("\n")
        out.flush()
        if "text" not in r:   # interrupted before the stream ended: the reply is not part of the conversation
            messages.pop()
            print("\n[stopped]", file=err)
            return True
        content = plan.parse(r["text"])[0] if calls else r["text"]
        messages.append({"role": "assistant", "content": content, "tool_calls": calls} if calls else
                        {"role": "assistant", "content": r["text"]})
        new = r["prompt_tokens"] - r["cached_tokens"]
        pf = new / r["prefill_s"] if r["prefill_s"] else 0.0
        dc = r["n_decoded"] / r["decode_s"] if r["decode_s"] else 0.0
        print(f"[prefill {new} new tokens ({r['cached_tokens']} cached) {pf:.1f} tok/s; {len(r['ids'])} generated "
              f"{dc:.1f} tok/s; {'tool_calls' if calls else r['finish_reason']}]", file=err, flush=True)
        if not calls:
            return True
        for c in calls:   # the app's part: here the person at the terminal answers for each tool
            result = read_line(f"result of {c['function']['name']}> ")
            if result is None:
                return False
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": result.strip()})
