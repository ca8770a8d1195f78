"""Text side of the Python front end: prompts -> ids with the package's tokenizer (Hugging Face `tokenizers`, or the
C tokenizer of tokenizer.bin when there is no tokenizer.json) and chat templates rendered in jinja2's sandbox.
Generated text comes from the C generation loop (runtime/core/generate.c), not from here."""
from __future__ import annotations

import functools
import json
from datetime import datetime
from pathlib import Path

from ...errors import InputError, PackageError, first_line
from ...errors import rust_panics_silenced as _rust_panics_silenced
from .template_env import TemplateLimit, bounded_render, template_env


class TextCodec:
    def __init__(self, package: Path):
        self.tok = None
        tj = package / "tokenizer.json"
        if tj.is_file():   # is_file: a FIFO in its place is not opened (it would block)
            from tokenizers import Tokenizer

            try:
                with _rust_panics_silenced():
                    self.tok = Tokenizer.from_file(str(tj))
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as e:  # noqa: BLE001 - plain Exception, or a Rust PanicException (a BaseException)
                raise PackageError(f"{tj} is corrupt ({first_line(e)}): recompile the package") from None
        self.config = {}
        tc = package / "tokenizer_config.json"
        if tc.is_file():
            try:
                self.config = json.loads(tc.read_bytes().decode("utf-8"))
            except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
                raise PackageError(f"{tc} is corrupt ({first_line(e)}): recompile the package") from e
            if not isinstance(self.config, dict):
                raise PackageError(f"{tc} is not a JSON object: recompile the package")
        # newer checkpoints keep the chat template in a file of its own, which wins (as in transformers)
        jinja, cj = package / "chat_template.jinja", package / "chat_template.json"
        try:
            if jinja.is_file():
                self.config = {**self.config, "chat_template": jinja.read_bytes().decode("utf-8")}
            elif cj.is_file():
                t = json.loads(cj.read_bytes().decode("utf-8"))
                self.config = {**self.config, "chat_template": t.get("chat_template") if isinstance(t, dict) else None}
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
            raise PackageError(f"the package's chat template file is corrupt ({first_line(e)}): recompile the "
                               "package") from e

    @property
    def available(self) -> bool:
        return self.tok is not None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self.tok is None:
            raise InputError("this package has no tokenizer.json: pass token ids instead of text"
                             " (a list of ints; edgellm run --ids 1,2,3)")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InputError(f"the prompt is not valid UTF-8 text (byte {e.start}): give UTF-8 text") from None
        return self.tok.encode(text, add_special_tokens=add_special_tokens).ids

    def token_str(self, key: str) -> str:
        v = self.config.get(key)
        return v.get("content", "") if isinstance(v, dict) else (v if isinstance(v, str) else "")

    def template_source(self, tools: bool = False) -> str | None:
        """The chat template's text (named templates: "tool_use" when tools are given and there is one, else
        "default", as transformers picks)."""
        tmpl = self.config.get("chat_template")
        if isinstance(tmpl, list):
            named = {t.get("name"): t["template"] for t in tmpl if isinstance(t, dict) and isinstance(t.get("template"), str)}
            tmpl = (tools and named.get("tool_use")) or named.get("default") or next(iter(named.values()), None)
        if tmpl is not None and not isinstance(tmpl, str):
            raise PackageError("tokenizer_config.json: chat_template is not a string: recompile the package")
        return tmpl

    def _bos_prefix(self) -> str:
        bos = self.token_str("bos_token")
        if not bos or self.tok is None:
            return ""
        ids = self.tok.encode("", add_special_tokens=True).ids
        return bos if ids[:1] == [self.tok.token_to_id(bos)] else ""

    def template_takes_tools(self) -> bool:
        """Whether the chat template reads `tools` (or SmolLM3's `xml_tools`): without that it has no tool support."""
        return bool(self._template_vars(self.template_source(tools=True)) & {"tools", "xml_tools"})

    def _template_vars(self, tmpl: str | None) -> frozenset:
        return _template_vars(tmpl) if tmpl else frozenset()

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list[dict] | None = None) -> str:
        """messages rendered with the package's chat template in jinja2's ImmutableSandboxedEnvironment (as
        transformers renders them): a template is data from the checkpoint, so it cannot reach Python objects,
        files or the OS. tools: OpenAI function tools, for templates that take them."""
        tmpl = self.template_source(tools=bool(tools))
        if not tmpl:
            # no template: a plain transcript that still works for base models, after the BOS the tokenizer would put
            # first (chats are encoded without special tokens, as templates write them)
            return self._bos_prefix() + "".join(f"{m['role']}: {m['content']}\n" for m in messages) + (
                "assistant:" if add_generation_prompt else "")
        import jinja2

        def raise_exception(msg):
            raise InputError(f"chat template: {msg}")

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        # the environment transformers renders chat templates in: sandboxed, loop controls, its tojson and helpers;
        # bounded here in time and size (template_env.py): a template is the package's data, run inside a server
        env = template_env()
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            extra = {"xml_tools": tools} if tools and "xml_tools" in self._template_vars(tmpl) else {}
            return bounded_render(env.from_string(tmpl), messages=messages, add_generation_prompt=add_generation_prompt,
                                  tools=tools or None, documents=None, **extra, bos_token=self.token_str("bos_token"),
                                  eos_token=self.token_str("eos_token"), pad_token=self.token_str("pad_token"),
                                  unk_token=self.token_str("unk_token"))
        except (InputError, TemplateLimit):
            raise
        except jinja2.exceptions.SecurityError as e:
            raise InputError("the package's chat template tried an unsafe operation and was stopped "
                             f"({first_line(e)})") from None
        except Exception as e:  # noqa: BLE001 - a template may fail in any way; it is the package's data
            raise InputError(f"the package's chat template failed: {type(e).__name__}: {first_line(e)}") from None


@functools.lru_cache(maxsize=16)
def _template_vars(tmpl: str) -> frozenset:
    """The variables a chat template reads (parsed once per template: each tool request asks twice)."""
    from jinja2 import meta

    try:
        return frozenset(meta.find_undeclared_variables(template_env().parse(tmpl)))
    except Exception:  # noqa: BLE001 - a template that does not parse fails when rendered, with the reason
        return frozenset()
