"""`edgellm chat`: an interactive conversation in the terminal. The conversation stays in one context's KV cache,
so each turn prefills only what is new (the end of the last reply and the new message: `reuse_prefix`); a stats line
after each reply says how many prompt tokens were prefilled and how many came from the cache. Prompts come from
stdin line by line when it is not a terminal."""
from __future__ import annotations

import sys

from ...errors import EdgeLLMError

HELP = "/reset: new conversation · /system TEXT: set the system prompt (and reset) · /quit · Ctrl-C stops a reply"


def chat_repl(rt, system: str | None = None, sampling: dict | None = None, stdin=None, out=None, err=None) -> int:
    stdin, out, err = stdin or sys.stdin, out or sys.stdout, err or sys.stderr
    tty = stdin.isatty()
    if tty:
        import readline  # noqa: F401 - line editing and history for input()
    ctx = rt.context
    messages: list[dict] = []

    def reset():
        messages.clear()
        if system:
            messages.append({"role": "system", "content": system})

    reset()
    if tty:
        print(f"edgellm chat: context {rt.max_context} tokens. {HELP}", file=err)
    while True:
        try:
            line = input("> ") if tty else stdin.readline()
        except EOFError:
            break
        except UnicodeDecodeError:   # a line that is not UTF-8: say so, keep the conversation
            print("[error: the line is not valid UTF-8 text]", file=err)
            continue
        if not tty and line == "":
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
        try:
            ids = rt.encode(rt.text.apply_chat_template(messages), add_special_tokens=False)
            while len(ids) >= rt.max_context and len(messages) > 2:   # drop the oldest exchange but the system's
                del messages[1 if messages[0]["role"] == "system" else 0]
                ids = rt.encode(rt.text.apply_chat_template(messages), add_special_tokens=False)
        except EdgeLLMError as e:   # e.g. a line that is not UTF-8 text: the conversation goes on without it
            messages.pop()
            print(f"[error: {e}]", file=err)
            continue
        if len(ids) >= rt.max_context:
            messages.pop()
            print(f"[the message is {len(ids)} tokens: more than the context of {rt.max_context}]", file=err)
            continue
        r: dict = {}
        try:
            for piece in ctx.stream(ids, reuse_prefix=True, _result=r, **(sampling or {})):
                out.write(piece)
                out.flush()
        except KeyboardInterrupt:
            ctx.cancel()
            r.setdefault("finish_reason", "cancelled")
        except EdgeLLMError as e:
            messages.pop()
            print(f"\n[error: {e}]", file=err)
            continue
        out.write("\n")
        out.flush()
        if "text" in r:
            messages.append({"role": "assistant", "content": r["text"]})
            new = r["prompt_tokens"] - r["cached_tokens"]
            pf = new / r["prefill_s"] if r["prefill_s"] else 0.0
            dc = r["n_decoded"] / r["decode_s"] if r["decode_s"] else 0.0
            print(f"[prefill {new} new tokens ({r['cached_tokens']} cached) {pf:.1f} tok/s; {len(r['ids'])} generated "
                  f"{dc:.1f} tok/s; {r['finish_reason']}]", file=err, flush=True)
        else:   # interrupted before the stream ended: the reply is not part of the conversation
            messages.pop()
            print("\n[stopped]", file=err)
    return 0


