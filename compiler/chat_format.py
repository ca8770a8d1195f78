"""chat_format.json: the checkpoint's chat template as plain strings, for front ends that have no jinja (the Android
app, android_app/app/.../ChatFormat.kt).

The template is rendered here over marker messages and cut at the markers:
  first         [before the user text, after it (the generation prompt included)]
  first_system  [before the system text, between it and the user text, after]   (null: the template has no system)
  next          [what follows the assistant's reply up to the next user text, after it]   (null: see below)
  stop_ids      the token that ends an assistant turn, when it is one token (its text is empty: a stop string could
                not match it); stop: the turn end as a string otherwise
A later turn is appended to the KV cache as it is, so `next` exists only where rendering the longer conversation
extends the shorter one byte for byte (templates that rewrite earlier turns, e.g. strip reasoning, get null and
the app starts a new conversation each turn). Every cut is checked: first + reply + next reproduces the template's
own rendering of the two-turn conversation."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import EdgeLLMError
from ..runtime.python.text import TextCodec

FILE = "chat_format.json"
SYS, USER1, REPLY, USER2 = ("\u2402sys\u2402", "\u2402user-1\u2402", "\u2402reply\u2402", "\u2402user-2\u2402")


def _cut(text: str, *markers: str) -> list[str] | None:
    """text split at each marker in turn (each must occur exactly once, in order), or None."""
    parts, rest = [], text
    for m in markers:
        if rest.count(m) != 1:
            return None
        head, rest = rest.split(m)
        parts.append(head)
    return [*parts, rest]


def derive(codec: TextCodec) -> dict | None:
    """The format of a package's chat template; None without a template (or one these cuts cannot express)."""
    if not codec.config.get("chat_template"):
        return None

    def render(msgs, gen=True):
        return codec.apply_chat_template([{"role": r, "content": c} for r, c in msgs], add_generation_prompt=gen)

    try:
        r1 = render([("user", USER1)])
    except EdgeLLMError:
        return None
    first = _cut(r1, USER1)
    if first is None:
        return None
    try:
        first_system = _cut(render([("system", SYS), ("user", USER1)]), SYS, USER1)
    except EdgeLLMError:   # "roles must alternate" / "no system role" templates
        first_system = None
    nxt, end = None, ""
    try:
        r2 = render([("user", USER1), ("assistant", REPLY)], gen=False)
        r3 = render([("user", USER1), ("assistant", REPLY), ("user", USER2)])
    except EdgeLLMError:
        r2 = r3 = ""
    if r2.startswith(r1 + REPLY) and r3.startswith(r2):
        end = r2[len(r1) + len(REPLY):]
        delta = _cut(r3[len(r2):], USER2)
        if delta is not None:
            nxt = [end + delta[0], delta[1]]   # so first + reply + next is r3, by construction
    out = {"first": first, "first_system": first_system, "next": nxt, "stop_ids": [], "stop": []}
    turn_end = end.strip()
    if turn_end and codec.tok is not None:
        ids = codec.tok.encode(turn_end, add_special_tokens=False).ids
        if len(ids) == 1:
            out["stop_ids"] = ids
        else:
            out["stop"] = [turn_end]
    return out


def write_chat_format(package_dir: Path) -> bool:
    """Writes PKG/chat_format.json from the package's tokenizer files; False when the package has no template."""
    try:
        fmt = derive(TextCodec(package_dir))
    except EdgeLLMError:   # unreadable tokenizer files: the Python Runtime reports them at load
        return False
    if fmt is None:
        return False
    (package_dir / FILE).write_text(json.dumps(fmt, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return True
