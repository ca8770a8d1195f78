"""Text side of the runtime: tokenizer.json through `tokenizers`, chat templates through jinja2, incremental
detokenization that never emits half a UTF-8 character, and stop strings."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import InputError


class TextCodec:
    def __init__(self, package: Path):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(package / "tokenizer.json")) if (package / "tokenizer.json").is_file() else None
        tc = package / "tokenizer_config.json"
        self.config = json.loads(tc.read_text()) if tc.is_file() else {}

    def _need(self):
        if self.tok is None:
            raise InputError("this package has no tokenizer.json: pass token ids (a list of ints) instead of text")

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self._need()
        return self.tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int]) -> str:
        self._need()
        return self.tok.decode(ids, skip_special_tokens=True)

    def token_str(self, key: str) -> str:
        v = self.config.get(key)
        return v.get("content", "") if isinstance(v, dict) else (v or "")

    def apply_chat_template(self, messages: list[dict]) -> str:
        tmpl = self.config.get("chat_template")
        if isinstance(tmpl, list):  # named templates: take "default"
            tmpl = next((t["template"] for t in tmpl if t.get("name") == "default"), tmpl[0]["template"])
        if not tmpl:
            # no template: a plain transcript that still works for base models
            return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
        import jinja2

        env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)

        def raise_exception(msg):
            raise InputError(f"chat template: {msg}")

        env.globals["raise_exception"] = raise_exception
        return env.from_string(tmpl).render(messages=messages, add_generation_prompt=True,
                                            bos_token=self.token_str("bos_token"), eos_token=self.token_str("eos_token"))


class Detokenizer:
    """Turns a growing list of ids into text pieces; holds back incomplete UTF-8 and possible stop-string prefixes."""

    def __init__(self, codec: TextCodec, stop: list[str]):
        self.codec, self.stop = codec, stop
        self.ids: list[int] = []
        self.emitted = 0          # characters of the full text already handed out
        self.stopped = False
        self.text = ""

    def _full_text(self) -> str:
        text = self.codec.decode(self.ids)
        for s in self.stop:
            i = text.find(s)
            if i >= 0:
                text, self.stopped = text[:i], True
        return text

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self._full_text()
        if text.endswith("\ufffd") and not self.stopped:  # an incomplete multi-byte character: wait for more
            return ""
        self.text = text
        safe = len(text)
        if not self.stopped:  # keep back a tail that could still grow into a stop string
            for s in self.stop:
                for k in range(min(len(s) - 1, len(text)), 0, -1):
                    if text.endswith(s[:k]):
                        safe = min(safe, len(text) - k)
                        break
        piece = text[self.emitted:safe] if safe > self.emitted else ""
        self.emitted = max(self.emitted, safe)
        return piece

    def flush(self) -> str:
        if self.ids:
            self.text = self._full_text()
        piece = self.text[self.emitted:]
        self.emitted = len(self.text)
        return piece
