"""Python API over libedgellm: Runtime.load / generate / stream / chat / logits."""
from __future__ import annotations

import ctypes as C
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import InputError, RuntimeLoadError
from . import lib as L
from .package import read_manifest, verify_checksums
from .text import Detokenizer, TextCodec


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]                 # the new tokens only
    prompt_tokens: int
    finish_reason: str                   # "eos" | "stop" | "length" | "context"
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    ttft_s: float = 0.0                  # prompt submitted -> first new token sampled
    extra: dict = field(default_factory=dict)


def _check_choice(name: str, value, ok: bool, why: str):
    if not ok:
        raise InputError(f"{name}={value!r} is invalid: {why}")


def check_sampling_args(max_new_tokens, temperature, top_k, top_p, repetition_penalty) -> None:
    _check_choice("max_new_tokens", max_new_tokens, isinstance(max_new_tokens, int) and max_new_tokens >= 0,
                  "must be an integer >= 0")
    _check_choice("temperature", temperature, temperature >= 0, "must be >= 0 (0 = greedy)")
    _check_choice("top_p", top_p, 0 < top_p <= 1, "must be in (0, 1]")
    _check_choice("top_k", top_k, isinstance(top_k, int) and top_k >= 0, "must be an integer >= 0 (0 = off)")
    _check_choice("repetition_penalty", repetition_penalty, repetition_penalty > 0, "must be > 0 (1 = off)")


class Runtime:
    """A loaded package. Not thread-safe: one generation at a time per Runtime."""

    def __init__(self, path: Path, manifest: dict, handle: int):
        self.path, self.manifest, self._h = path, manifest, handle
        self._lib = L.lib()
        self.text = TextCodec(path)
        self.vocab = self._lib.el_vocab(handle)
        self.max_context = self._lib.el_max_context(handle)
        self.chunk = self._lib.el_chunk(handle)
        n = 8
        buf = (C.c_int32 * n)()
        self.eos_ids = set(buf[:self._lib.el_eos_ids(handle, buf, n)])

    @classmethod
    def load(cls, path: str | os.PathLike, threads: int | None = None, memory_budget: int | None = None,
             verify: bool = False) -> Runtime:
        """Load a package. threads: default one per CPU. verify: also check every tensor's sha256."""
        p = Path(path)
        m = read_manifest(p)
        if verify:
            verify_checksums(p, m)
        if memory_budget is not None:
            raise InputError("memory_budget needs an offload policy, which this build does not have yet: leave it unset")
        h = L.lib().el_load(str(p).encode(), int(threads or 0))
        if not h:
            raise RuntimeLoadError(L.last_error())
        return cls(p, m, h)

    def close(self):
        if self._h:
            self._lib.el_free(self._h)
            self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def threads(self) -> int:
        return self._lib.el_threads(self._h)

    def stats(self) -> dict:
        """Runtime counters since load: weight bytes held (and of those in transparent huge pages), kernel calls,
        prefill/decode tokens and seconds."""
        s = L.Stats()
        self._lib.el_get_stats(self._h, C.byref(s))
        return {name: getattr(s, name) for name, _ in L.Stats._fields_}

    # ---- low level -------------------------------------------------------------------------------------------
    def reset(self):
        self._lib.el_reset(self._h)

    def _ids(self, token_ids) -> np.ndarray:
        ids = np.ascontiguousarray(np.asarray(token_ids, dtype=np.int64))
        if ids.ndim != 1 or ids.size == 0:
            raise InputError("empty prompt: give at least one token")
        if ids.min() < 0 or ids.max() >= self.vocab:
            raise InputError(f"token id {int(ids.max() if ids.max() >= self.vocab else ids.min())} is out of range "
                             f"[0, {self.vocab})")
        if ids.size > self.max_context:
            raise InputError(f"prompt has {ids.size} tokens but the package's context is {self.max_context}: shorten it "
                             "or recompile with a larger --max-context")
        return ids.astype(np.int32)

    def _call(self, rc: int):
        if rc != 0:
            raise InputError(L.last_error())

    def logits(self, token_ids) -> np.ndarray:
        """Logits [len(token_ids), vocab] float32 of a fresh context (the context is left holding these tokens)."""
        ids = self._ids(token_ids)
        out = np.empty((ids.size, self.vocab), np.float32)
        self.reset()
        self._call(self._lib.el_prefill(self._h, ids.ctypes.data_as(C.POINTER(C.c_int32)), ids.size,
                                        out.ctypes.data_as(C.POINTER(C.c_float)), 1))
        return out

    def prefill(self, token_ids) -> np.ndarray:
        """Append tokens to the current context; returns the last position's logits [vocab]."""
        ids = self._ids(token_ids)
        out = np.empty(self.vocab, np.float32)
        self._call(self._lib.el_prefill(self._h, ids.ctypes.data_as(C.POINTER(C.c_int32)), ids.size,
                                        out.ctypes.data_as(C.POINTER(C.c_float)), 0))
        return out

    def decode_step(self, token: int) -> np.ndarray:
        out = np.empty(self.vocab, np.float32)
        self._call(self._lib.el_decode(self._h, int(token), out.ctypes.data_as(C.POINTER(C.c_float))))
        return out

    # ---- generation ------------------------------------------------------------------------------------------
    def _prompt_ids(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise InputError("empty prompt: give some text or token ids")
            ids = self.text.encode(prompt)
            if not ids:
                raise InputError("the prompt tokenizes to no tokens: give some text")
            return ids
        if isinstance(prompt, (list, tuple, np.ndarray)):
            return [int(t) for t in prompt]
        raise InputError(f"prompt must be a str or a list of token ids, not {type(prompt).__name__}")

    def _tokens(self, ids, max_new_tokens, temperature, top_k, top_p, repetition_penalty, seed, ignore_eos, info):
        """Yields new token ids; fills info with timings and the finish reason."""
        check_sampling_args(max_new_tokens, temperature, top_k, top_p, repetition_penalty)
        ids = self._ids(ids)
        if seed is None:
            seed = int.from_bytes(os.urandom(8), "little")
        params = L.SamplerParams(float(temperature), int(top_k), float(top_p), float(repetition_penalty),
                                 int(seed) & (2**64 - 1))
        sampler = self._lib.el_sampler_new(C.byref(params))
        history = (C.c_int32 * (ids.size + max_new_tokens + 1))(*ids.tolist())
        nh = ids.size
        info.update(finish_reason="length", prefill_s=0.0, decode_s=0.0, n_decoded=0)
        try:
            self.reset()
            t0 = time.perf_counter()
            logits = self.prefill(ids)
            info["prefill_s"] = time.perf_counter() - t0
            td = time.perf_counter()
            for i in range(max_new_tokens):
                tok = int(self._lib.el_sample(sampler, logits.ctypes.data_as(C.POINTER(C.c_float)), self.vocab,
                                              history, nh))
                if i == 0:
                    info["ttft_s"] = time.perf_counter() - t0
                if tok in self.eos_ids and not ignore_eos:
                    info["finish_reason"] = "eos"
                    return
                history[nh] = tok
                nh += 1
                yield tok
                if i + 1 == max_new_tokens:
                    break
                if self._lib.el_pos(self._h) >= self.max_context:
                    info["finish_reason"] = "context"
                    return
                logits = self.decode_step(tok)
                info["n_decoded"] += 1
                info["decode_s"] = time.perf_counter() - td
        finally:
            self._lib.el_sampler_free(sampler)

    def stream(self, prompt, max_new_tokens: int = 128, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
               repetition_penalty: float = 1.0, seed: int | None = None, stop: str | list[str] | None = None,
               ignore_eos: bool = False, _result: dict | None = None) -> Iterator[str]:
        """Yields text pieces as they are generated (same arguments as generate)."""
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        ids = self._prompt_ids(prompt)
        info: dict = {}
        detok = Detokenizer(self.text, stops) if self.text.tok is not None else None
        new: list[int] = []
        for tok in self._tokens(ids, max_new_tokens, temperature, top_k, top_p, repetition_penalty, seed,
                                ignore_eos, info):
            new.append(tok)
            if detok is not None:
                piece = detok.push(tok)
                if piece:
                    yield piece
                if detok.stopped:
                    info["finish_reason"] = "stop"
                    break
        if detok is not None:
            tail = detok.flush()
            if tail:
                yield tail
        if _result is not None:
            _result.update(info, ids=new, prompt_tokens=len(ids), text=detok.text if detok else "")

    def generate(self, prompt, max_new_tokens: int = 128, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, repetition_penalty: float = 1.0, seed: int | None = None,
                 stop: str | list[str] | None = None, ignore_eos: bool = False) -> GenerationResult:
        """Generate from a str prompt (tokenized with the package's tokenizer) or a list of token ids (used as is)."""
        r: dict = {}
        for _ in self.stream(prompt, max_new_tokens, temperature, top_k, top_p, repetition_penalty, seed, stop,
                             ignore_eos, _result=r):
            pass
        return GenerationResult(
            text=r["text"], token_ids=r["ids"], prompt_tokens=r["prompt_tokens"], finish_reason=r["finish_reason"],
            prefill_tokens_per_s=r["prompt_tokens"] / r["prefill_s"] if r["prefill_s"] > 0 else 0.0,
            decode_tokens_per_s=r["n_decoded"] / r["decode_s"] if r["decode_s"] > 0 else 0.0,
            ttft_s=r.get("ttft_s", 0.0))

    def chat(self, messages: list[dict], **kwargs) -> GenerationResult:
        """messages: [{"role": "user", "content": "..."}, ...], rendered with the package's chat template."""
        if not messages:
            raise InputError("chat needs at least one message")
        prompt = self.text.apply_chat_template(messages)
        ids = self.text.encode(prompt, add_special_tokens=False)
        return self.generate(ids, **kwargs)
