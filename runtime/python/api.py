"""Python API over libedgellm: Runtime (a loaded package) and Context (one conversation).

    rt = Runtime.load(pkg)             # the model (read-only, shared) and a default context
    rt.generate("...")                 # on the default context
    ctx = rt.new_context()             # more conversations over the same weights: KV cache + arena each
    ctx.generate("...")                # distinct contexts may run in distinct threads

Generation runs in C (runtime/core/generate.c: el_generate_start / el_generate_next), the loop edgellm-run and every
other front end use: sampling, penalties, stop ids and strings, and the defaults (the package's
generation_config.json) are decided there, so the same arguments and seed give the same tokens everywhere.

Thread safety: each Context has a lock held for a whole generate()/stream() (and for each prefill, decode, reset,
logits call): N threads on one context are serialised and each gets correct output. reset() waits for a running
generation; close() asks a running generation to stop at its next token (finish_reason "cancelled"), waits for it,
then frees. One context per thread is the way to run conversations concurrently.
"""
from __future__ import annotations

import ctypes as C
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import EdgeLLMError, InputError, RuntimeLoadError
from . import lib as L
from . import options as O
from .package import read_manifest, verify_package
from .text import TextCodec

INT32_MAX = 2**31 - 1


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]                 # the new tokens only
    prompt_tokens: int
    finish_reason: str                   # "eos" | "stop" | "length" | "context" | "cancelled"
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    ttft_s: float = 0.0                  # prompt submitted -> first new token sampled
    extra: dict = field(default_factory=dict)
    cached_tokens: int = 0               # prompt tokens the context already held (reuse_prefix): not prefilled again
    # chat(tools=...): the calls the reply made, as OpenAI's tool_calls ({"id", "type": "function", "function":
    # {"name", "arguments": a JSON string}}); finish_reason is then "tool_calls" and text what came before them
    tool_calls: list[dict] = field(default_factory=list)


SAMPLING_ARGS = O.SAMPLING   # the sampler's knobs (runtime/python/options.py GEN_OPTIONS)


def _threads(threads) -> int:
    if threads is None:
        return 0
    if isinstance(threads, bool) or not isinstance(threads, int) or not 0 <= threads <= 256:
        raise InputError(f"threads={threads!r} is invalid: give an integer in 1..256 (or None / 0 for one per CPU)")
    return threads


def speculation(speculate, draft_max) -> tuple[int | None, int | None, str | None]:
    """speculate ("off" | "auto" | "ngram" | "recycle", or a draft package's directory) and draft_max as el_gen_params takes
    them, and the draft package's path (None: not given). A draft package drafts in auto mode: n-grams first, its
    greedy guesses where none matches, plain decoding while drafts do not pay."""
    draft = None
    if speculate is not None and speculate not in O.SPECULATE:
        if not isinstance(speculate, (str, os.PathLike)) or not (Path(speculate) / "manifest.json").is_file():
            raise InputError(f"speculate={str(speculate)!r} is invalid: choose one of {', '.join(O.SPECULATE)}, or "
                             "give a draft package's directory (a smaller model with the same tokenizer)")
        draft, speculate = str(Path(speculate).resolve()), "auto"
    if draft_max is not None:
        draft_max = _num("draft_max", draft_max, int)
        if draft_max > O.DRAFT_MAX:
            raise InputError(f"draft_max={draft_max} is invalid: at most {O.DRAFT_MAX} drafts per pass")
    return (None if speculate is None else O.SPECULATE[speculate]), draft_max, draft


def _num(name: str, v, kind=float):
    """A sampling argument as given (None: the package's default): numbers only, checked for range in C."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise InputError(f"{name}={v!r} is invalid: it must be a number")
    if kind is int:
        if isinstance(v, (float, np.floating)) and not float(v).is_integer():
            raise InputError(f"{name}={v!r} is invalid: it must be an integer")
        v = int(v)
        if not 0 <= v <= INT32_MAX:
            raise InputError(f"{name}={v!r} is invalid: it must be an integer in 0..{INT32_MAX}")
        return v
    return float(v)


class _Lock:
    """A context's lock: held across a whole generation (also a suspended stream), so it knows its owner thread and
    refuses re-entry from it (which would deadlock) with a clear error."""

    def __init__(self):
        self._lock = threading.Lock()
        self.owner: int | None = None

    @contextmanager
    def hold(self):
        me = threading.get_ident()
        if self.owner == me:
            raise InputError("this context is busy in this thread (an unfinished stream()): finish or close that "
                             "stream first, or use another context (Runtime.new_context())")
        with self._lock:
            self.owner = me
            try:
                yield
            finally:
                self.owner = None


class _Closes:
    """`with x:` closes x at the end (Context, Runtime)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def shifting(context_shift, shift_sinks, shift_tokens) -> tuple[int | None, int | None, int | None]:
    """context_shift (True/"on", False/"off", None), shift_sinks and shift_tokens as el_gen_params takes them (None:
    not given)."""
    names = dict(O.GEN_BY_NAME["context_shift"].choices)
    if context_shift is not None and not isinstance(context_shift, bool) and context_shift not in names:
        raise InputError(f"context_shift={context_shift!r} is invalid: give True, False, \"on\" or \"off\"")
    cs = None if context_shift is None else int(context_shift) if isinstance(context_shift, bool) else names[context_shift]
    out = [cs]
    for name, v in (("shift_sinks", shift_sinks), ("shift_tokens", shift_tokens)):
        hi = int(O.GEN_BY_NAME[name].hi)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v <= hi):
            raise InputError(f"{name}={v!r} is invalid: an integer from 0 to {hi}")
        out.append(None if v is None else int(v))
    return tuple(out)


def _path_arg(path, what: str) -> bytes:
    if not isinstance(path, (str, bytes, os.PathLike)) or not os.fspath(path):
        raise InputError(f"{what}: {path!r} is not a file path")
    return os.fsencode(os.fspath(path))


class Context(_Closes):
    """One conversation over a loaded package: its own KV cache, arena and position."""

    def __init__(self, runtime: Runtime, threads: int | None = None):
        self.runtime = runtime
        self._lib = runtime._lib
        self._lock = _Lock()              # held across a generation
        self._life = threading.Lock()     # held by quick calls (threads, pos, stats) and by the free: never a freed handle
        self._closing = False
        self._cancel = threading.Event()  # cancel(): the generation in progress stops at its next token
        self._kv: list[int] | None = []   # the token ids the KV cache holds, in order (None: not known)
        self._drafts: list[int] = []   # the last verify pass's ids, node by node (take_drafts, take_node)
        self._draft_ctx: dict[str, Context] = {}   # draft package path -> its context for this one (speculate=)
        self._h = self._lib.el_context_new(runtime._model, _threads(threads))
        if not self._h:
            raise RuntimeLoadError(L.last_error())

    # ---- lifetime -------------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Frees the context. A generation running in another thread stops at its next token and finishes with
        "cancelled"; a stream suspended in this thread ends when it is next resumed."""
        if self._h is None:
            return
        self._closing = True
        if self._lock.owner == threading.get_ident():
            return   # our own suspended stream: it frees the context when it ends
        with self._lock.hold():
            self._free()

    def _draft_context(self, path: str) -> Context:
        """This context's own context of a draft package (loaded once per Runtime): the C loop drafts in it."""
        c = self._draft_ctx.get(path)
        if c is None:
            c = self._draft_ctx[path] = self.runtime.draft_runtime(path).new_context(self.threads)
        return c

    def _free(self) -> None:
        for c in self._draft_ctx.values():
            c.close()
        self._draft_ctx = {}
        with self._life:
            if self._h is not None:
                self._lib.el_context_free(self._h)
                self._h = None

    def __del__(self):
        try:
            if getattr(self, "_h", None) is not None and self._lock.owner is None:
                self._free()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def _handle(self):
        if self._h is None or self._closing:
            raise InputError("this context (or its Runtime) is closed")
        return self._h

    # ---- low level ------------------------------------------------------------------------------------------------
    @property
    def threads(self) -> int:
        with self._life:
            return self._lib.el_context_threads(self._handle())

    @property
    def pos(self) -> int:
        """Tokens in the KV cache."""
        with self._life:
            return self._lib.el_pos(self._handle())

    def stats(self) -> dict:
        """Counters: weight bytes held (and in huge pages), this context's kernel calls, prefill/decode tokens and
        seconds, and its memory: KV cache, arena, and everything it allocated (context_bytes). Safe to call while
        another thread generates on this context."""
        s = L.Stats()
        with self._life:
            self._lib.el_get_stats(self._handle(), C.byref(s))
        return {name: getattr(s, name) for name, _ in L.Stats._fields_}

    def reset(self) -> None:
        with self._lock.hold():
            self._lib.el_reset(self._handle())
            self._kv = []

    def rewind(self, n: int) -> None:
        """Keep only the first n tokens of the context (0 <= n <= pos): the next call continues from there."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise InputError(f"rewind: {n!r} is not a token count")
        with self._lock.hold():
            self._call(self._lib.el_rewind(self._handle(), int(n)))
            if self._kv is not None:
                self._kv = self._kv[:int(n)]

    def cancel(self) -> None:
        """Stops the generation in progress (from any thread) at its next token: it finishes with "cancelled" and
        that token is not handed on. No-op when none runs."""
        self._cancel.set()

    def save(self, path, n_tokens: int | None = None) -> None:
        """Save what this context holds (its KV cache rows, position and token ids; n_tokens: only its first ones,
        e.g. a system prompt) to `path`, atomically: a killed process leaves the old file or the new one. load() in a
        context of the same package (same load settings) continues from there without prefilling it again; CPU
        packages."""
        path = _path_arg(path, "save")
        if n_tokens is not None and (isinstance(n_tokens, bool) or not isinstance(n_tokens, (int, np.integer))
                                     or n_tokens < 0):
            raise InputError(f"save: n_tokens={n_tokens!r} is not a token count")
        with self._lock.hold():
            self._call(self._lib.el_context_save(self._handle(), path, -1 if n_tokens is None else int(n_tokens)))

    def load(self, path) -> int:
        """Replace what this context holds with a state save() wrote from the same package and load settings; returns
        the tokens it now holds (generate(..., reuse_prefix=True) skips them where a prompt starts with them).
        Another package or settings, a damaged or truncated file: InputError, and the context is left as it was or
        empty, never half-loaded."""
        path = _path_arg(path, "load")
        with self._lock.hold():
            h = self._handle()
            n = self._lib.el_context_load(h, path)
            err = L.last_error() if n < 0 else ""
            self._kv = self._tokens(h)
            if n < 0:
                raise InputError(err)
        return n

    def _tokens(self, h) -> list[int]:
        """The ids the C context holds (el_context_tokens)."""
        ids = np.empty(self._lib.el_context_tokens(h, None, 0), np.int32)   # the count, then the ids
        n = self._lib.el_context_tokens(h, ids.ctypes.data_as(L.I32P), ids.size)
        return ids[:n].tolist()

    @property
    def cached(self) -> list[int]:
        """The token ids this context's KV cache holds (what a reuse_prefix generation can skip)."""
        return list(self._kv or [])

    def _ids(self, token_ids) -> np.ndarray:
        try:
            ids = np.asarray(token_ids)
        except (TypeError, ValueError) as e:
            raise InputError(f"token ids must be a list of integers ({e})") from None
        if ids.ndim != 1 or ids.size == 0:
            raise InputError("empty prompt: give at least one token")
        if ids.dtype.kind not in "iu":
            if ids.dtype.kind == "f" and np.all(np.isfinite(ids)) and np.all(ids == np.round(ids)):
                ids = ids.astype(np.int64)
            else:
                raise InputError("token ids must be integers")
        vocab = self.runtime.vocab
        if ids.min() < 0 or ids.max() >= vocab:
            bad = int(ids.max() if ids.max() >= vocab else ids.min())
            raise InputError(f"token id {bad} is out of range [0, {vocab})")
        if ids.size > self.runtime.max_context:
            raise InputError(f"prompt has {ids.size} tokens but the package's context is {self.runtime.max_context}: "
                             "shorten it or recompile with a larger --max-context")
        return np.ascontiguousarray(ids, dtype=np.int32)

    def _call(self, rc: int) -> None:
        if rc != 0:
            raise InputError(L.last_error())

    def logits(self, token_ids) -> np.ndarray:
        """Logits [len(token_ids), vocab] float32 from an empty context (the context is left holding these tokens)."""
        ids = self._ids(token_ids)
        out = np.empty((ids.size, self.runtime.vocab), np.float32)
        with self._lock.hold():
            h = self._handle()
            self._lib.el_reset(h)
            self._kv = None
            self._call(self._lib.el_prefill(h, ids.ctypes.data_as(L.I32P), ids.size, out.ctypes.data_as(L.F32P), 1))
            self._kv = ids.tolist()
        return out

    def prefill(self, token_ids) -> np.ndarray:
        """Append tokens to the context; returns the last position's logits [vocab]."""
        ids = self._ids(token_ids)
        out = np.empty(self.runtime.vocab, np.float32)
        with self._lock.hold():
            kv, self._kv = self._kv, None
            self._call(self._lib.el_prefill(self._handle(), ids.ctypes.data_as(L.I32P), ids.size,
                                            out.ctypes.data_as(L.F32P), 0))
            self._kv = None if kv is None else kv + ids.tolist()
        return out

    def decode_step(self, token: int) -> np.ndarray:
        """Append one token; returns its logits [vocab]."""
        if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or not 0 <= int(token) < self.runtime.vocab:
            raise InputError(f"token {token!r} is not a token id in [0, {self.runtime.vocab})")
        out = np.empty(self.runtime.vocab, np.float32)
        with self._lock.hold():
            kv, self._kv = self._kv, None
            self._call(self._lib.el_decode(self._handle(), int(token), out.ctypes.data_as(L.F32P)))
            self._kv = None if kv is None else kv + [int(token)]
        return out

    def verify(self, token_ids, parents=None) -> np.ndarray:
        """Speculative decoding with your own drafts: token_ids[0] (the next token) and the drafts after it in one
        pass over the weights (at most runtime.verify_width ids); returns each one's logits [n, vocab]. The context
        then holds token_ids[0]; take_drafts(k) appends the first k drafts, whose cache rows the pass wrote.
        parents: the drafts as a tree: token_ids[i] follows node parents[i] < i (node 0 is token_ids[0]; parents[0]
        is ignored); take_node(i) then appends a child of the context's last node (None: a chain)."""
        ids = self._ids(token_ids)
        width = self.runtime.verify_width
        if ids.size > width:
            raise InputError(f"{ids.size} tokens to verify; this package verifies {width} per pass" if width else
                             "this package has no verify program: recompile it with this edgellm")
        par = None
        if parents is not None:
            par = np.ascontiguousarray(parents, dtype=np.int32).reshape(-1)
            if par.size != ids.size:
                raise InputError(f"{par.size} parents for {ids.size} tokens: give one per token")
        out = np.empty((ids.size, self.runtime.vocab), np.float32)
        with self._lock.hold():
            kv, self._kv = self._kv, None
            self._call(self._lib.el_verify_tree(self._handle(), ids.ctypes.data_as(L.I32P),
                                                None if par is None else par.ctypes.data_as(L.I32P), ids.size,
                                                out.ctypes.data_as(L.F32P)))
            self._kv = None if kv is None else kv + [int(ids[0])]
            self._drafts = ids.tolist()   # the pass's nodes (node 0 is in the context)
        return out

    def take_drafts(self, k: int) -> None:
        """After verify(): the next k drafts of a chain join the context (their rows came with the pass)."""
        with self._lock.hold():
            n0 = self._lib.el_verify_node(self._handle())
            self._call(self._lib.el_verify_take(self._handle(), int(k)))
            if self._kv is not None:
                self._kv = self._kv + self._drafts[n0 + 1:n0 + 1 + int(k)]

    def take_node(self, node: int) -> None:
        """After verify(parents=...): draft `node`, a child of the context's last node, joins the context."""
        with self._lock.hold():
            self._call(self._lib.el_verify_take_node(self._handle(), int(node)))
            if self._kv is not None:
                self._kv = self._kv + [self._drafts[int(node)]]

    # ---- generation -----------------------------------------------------------------------------------------------
    def check_generation(self, max_new_tokens: int | None = None, seed: int | None = None, stop=None,
                         ignore_eos: bool = False, **sampling) -> None:
        """Raise InputError for the arguments generate() would refuse (the C sampler's range checks included), without
        generating or touching this context's state: the server checks a request before it takes a slot."""
        unknown = set(sampling) - set(SAMPLING_ARGS)
        if unknown:
            raise InputError(f"unknown sampling argument(s): {', '.join(sorted(unknown))}")
        params, _keep = self._params(max_new_tokens, sampling, seed, stop, None, ignore_eos, False)
        sp = L.SamplerParams(params.temperature, params.top_k, params.top_p, params.min_p, params.repetition_penalty,
                             params.presence_penalty, params.frequency_penalty, params.seed)
        s = self._lib.el_sampler_new(C.byref(sp))
        if not s:
            raise InputError(L.last_error())
        self._lib.el_sampler_free(s)

    def _prompt_ids(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise InputError("empty prompt: give some text or token ids")
            ids = self.runtime.encode(prompt)
            if not ids:
                raise InputError("the prompt tokenizes to no tokens: give some text")
            return ids
        if isinstance(prompt, (list, tuple, np.ndarray)):
            return self._ids(prompt).tolist()
        raise InputError(f"prompt must be a str or a list of token ids, not {type(prompt).__name__}")

    def _params(self, max_new_tokens, sampling: dict, seed, stop, stop_ids, ignore_eos, keep_context,
                speculate=None, draft_max=None, shift=(None, None, None)):
        """The C parameters: the package's defaults, then what the caller gave. Returns (params, keep-alive)."""
        p = L.GenParams()
        self._lib.el_gen_params_default(self.runtime._model, C.byref(p))
        for name, given, default in zip(("context_shift", "shift_sinks", "shift_tokens"), shifting(*shift),
                                        self.runtime.shift):
            v = given if given is not None else default
            if v is not None:   # else the C default
                setattr(p, name, v)
        spec, dmax, draft = speculation(speculate, draft_max)
        if spec is None:   # Runtime.load's
            spec, draft = self.runtime.speculate[0], self.runtime.speculate[2]
        p.speculate = spec
        p.draft_max = dmax if dmax is not None else self.runtime.speculate[1]
        if draft is not None and spec:
            p.draft = self._draft_context(draft)._handle()
        if max_new_tokens is not None:
            n = _num("max_new_tokens", max_new_tokens, int) if not (isinstance(max_new_tokens, int) and
                                                                   max_new_tokens > INT32_MAX) else INT32_MAX
            p.max_new_tokens = min(n, INT32_MAX)   # more than the context holds just runs to its end
        for k in SAMPLING_ARGS:
            v = _num(k, sampling.get(k), int if k == "top_k" else float)
            if v is not None:
                setattr(p, k, v)
        if seed is not None:
            if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
                raise InputError(f"seed={seed!r} is invalid: it must be an integer")
            p.seed = int(seed) & (2**64 - 1)
        p.ignore_eos = 1 if ignore_eos else 0
        p.keep_context = 1 if keep_context else 0
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        for s in stops:
            if not isinstance(s, str) or not s:
                raise InputError(f"stop={s!r} is invalid: stop strings must be non-empty strings")
        try:
            enc = [s.encode("utf-8") for s in stops]
        except UnicodeEncodeError:
            raise InputError("a stop string is not valid UTF-8 text") from None
        keep = []
        if enc:
            arr = (C.c_char_p * len(enc))(*enc)
            keep += [arr, enc]
            p.n_stop_strings, p.stop_strings = len(enc), C.cast(arr, C.POINTER(C.c_char_p))
        sids = [_num("stop_ids", t, int) for t in (stop_ids or [])]
        if sids:
            arr = (C.c_int32 * len(sids))(*sids)
            keep.append(arr)
            p.n_stop_ids, p.stop_ids = len(sids), C.cast(arr, L.I32P)
        return p, keep

    def stream(self, prompt, max_new_tokens: int | None = 128, temperature: float | None = None,
               top_k: int | None = None, top_p: float | None = None, repetition_penalty: float | None = None,
               seed: int | None = None, stop: str | list[str] | None = None, ignore_eos: bool = False, *,
               min_p: float | None = None, presence_penalty: float | None = None,
               frequency_penalty: float | None = None, stop_ids: list[int] | None = None, keep_context: bool = False,
               reuse_prefix: bool = False, speculate: str | None = None, draft_max: int | None = None,
               response_format: dict | str | None = None, grammar: str | dict | None = None,
               context_shift: bool | str | None = None, shift_sinks: int | None = None,
               shift_tokens: int | None = None, _result: dict | None = None,
               _raw_text: bool = False) -> Iterator[str]:
        """Yields text pieces as they are generated (never half a UTF-8 character, never part of a stop string).
        Arguments as generate(). _raw_text: the text of special tokens too (tool calls: runtime/python/tools)."""
        sampling = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p,
                    "repetition_penalty": repetition_penalty, "presence_penalty": presence_penalty,
                    "frequency_penalty": frequency_penalty}
        if reuse_prefix and keep_context:
            raise InputError("reuse_prefix and keep_context exclude each other: reuse_prefix takes the whole "
                             "conversation as the prompt, keep_context only what follows it")
        params, keep = self._params(max_new_tokens, sampling, seed, stop, stop_ids, ignore_eos, keep_context,
                                    speculate, draft_max, (context_shift, shift_sinks, shift_tokens))
        ids = self._prompt_ids(prompt)
        arr = np.ascontiguousarray(ids, dtype=np.int32)
        if _raw_text and not self.runtime.text.available:
            raise InputError("tool calls need the package's tokenizer.json (this package has none)")
        fallback = _FallbackText(self.runtime, special=_raw_text, stops=stop if _raw_text else None) if _raw_text or (
            not self.runtime.c_text and self.runtime.text.available) else None
        constraint = None
        if response_format is not None or grammar is not None:
            from .constrain import Constraint, grammar_for

            g = grammar_for(response_format, grammar)
            constraint = Constraint(self.runtime, g) if g is not None else None
        self._cancel.clear()   # here, not when the stream starts: a cancel() after this call is never lost
        return self._run(arr, params, keep, fallback, _result, reuse_prefix, constraint)

    def _run(self, arr, params, keep, fallback, result, reuse=False, constraint=None):
        tokens: list[int] = []
        pieces: list[bytes] = []
        finish = None
        with self._lock.hold():
            try:
                h = self._handle()
                ids = arr.tolist()
                cached = 0
                if reuse and self._kv:
                    # the longest prefix the cache already holds, short of the prompt's last token (its logits are
                    # needed): rewind to it and prefill only the rest
                    limit = min(len(self._kv), len(ids) - 1)
                    cached = next((i for i in range(limit) if self._kv[i] != ids[i]), limit)
                    if cached and cached < self._lib.el_rewind_floor(h):
                        cached = 0   # sliding-window layers no longer hold the keys position `cached` needs
                    if cached:
                        self._call(self._lib.el_rewind(h, cached))
                        params.keep_context, params.n_cached = 1, cached
                self._kv = None   # unknown until the run ends
                if self._lib.el_generate_start(h, arr.ctypes.data_as(L.I32P), arr.size, C.byref(params)) != 0:
                    raise InputError(L.last_error())
                if constraint is not None:   # drafts the constraint refuses are dropped before their pass
                    check = L.DraftFilter(lambda _u, ids, parents, n, keep: constraint.allowed_drafts(
                        ids, parents, n, keep))
                    keep.append(check)
                    self._lib.el_generate_filter_drafts(h, C.cast(check, C.c_void_p), None)
                ev = L.Event()
                while True:
                    if constraint is not None:   # the allowed tokens of this draw
                        self._call(self._lib.el_generate_constrain(h, *constraint.mask()))
                    r = self._lib.el_generate_next(h, C.byref(ev))
                    if r < 0:
                        raise InputError(L.last_error())
                    if r == 1:
                        tokens.append(ev.token)
                        if constraint is not None:
                            constraint.accept(ev.token)
                    piece = C.string_at(ev.text, ev.text_len) if ev.text_len else b""
                    if fallback is not None and r == 1:
                        piece = fallback.push(ev.token)
                    if piece:
                        pieces.append(piece)
                        yield piece.decode("utf-8", "replace")
                    if r == 0 or ev.finish:
                        finish = L.FINISH[ev.finish]
                        break
                    if self._closing or self._cancel.is_set():
                        finish = "cancelled"
                        break
                if fallback is not None and (tail := fallback.flush()):
                    pieces.append(tail)
                    yield tail.decode("utf-8", "replace")
                res = L.GenResult()
                self._lib.el_generate_result(h, C.byref(res))
                self._kv = self._tokens(h)   # what it holds (a context shift dropped some)
                if result is not None:
                    result.update(ids=tokens, text=b"".join(pieces).decode("utf-8", "replace"), cached_tokens=cached,
                                  prompt_tokens=res.prompt_tokens, finish_reason=finish or L.FINISH[res.finish] or
                                  "cancelled", prefill_s=res.prefill_seconds, decode_s=res.decode_seconds,
                                  ttft_s=res.ttft_seconds, n_decoded=res.decoded_tokens)
            finally:
                if constraint is not None and self._h is not None:
                    self._lib.el_generate_filter_drafts(self._h, None, None)   # before the callback is freed
                del keep
                if self._closing:
                    self._free()

    def generate(self, prompt, max_new_tokens: int | None = 128, temperature: float | None = None,
                 top_k: int | None = None, top_p: float | None = None, repetition_penalty: float | None = None,
                 seed: int | None = None, stop: str | list[str] | None = None, ignore_eos: bool = False, *,
                 min_p: float | None = None, presence_penalty: float | None = None,
                 frequency_penalty: float | None = None, stop_ids: list[int] | None = None,
                 keep_context: bool = False, reuse_prefix: bool = False, speculate: str | None = None,
                 draft_max: int | None = None, response_format: dict | str | None = None,
                 grammar: str | dict | None = None, context_shift: bool | str | None = None,
                 shift_sinks: int | None = None, shift_tokens: int | None = None,
                 _raw_text: bool = False) -> GenerationResult:
        """Generate from a str prompt (tokenized with the package's tokenizer) or a list of token ids (used as is).

        Sampling arguments left None take the package's defaults (its generation_config.json: sampled where it says
        do_sample, else greedy); temperature 0 is greedy decoding, with the penalties still applied. seed None: a
        random seed. stop: strings that end the generation (not part of the text); stop_ids: token ids that do.
        keep_context: append the prompt to the conversation so far instead of starting from an empty context.
        reuse_prefix: the prompt is the whole conversation; what of it this context's cache already holds (the longest
        common prefix with its earlier prompts and replies) is kept and not prefilled again (result.cached_tokens).
        Prefill-computed cache rows are bit-identical to a fresh prefill's, so the tokens are the same as without it
        (rows of earlier replies came from decode steps: the same up to float rounding in f16/f32 packages).
        speculate: "off", "auto", "ngram" or "recycle" (None: Runtime.load's): drafts from n-grams of the prompt and
        reply (recycle: a tree of them and recycled tokens), verified several per pass over the weights; the tokens
        are those plain decoding draws (same seed, same tokens; float rounding aside). draft_max: drafts per pass at
        most (None/0: the package's verify width - 1).
        response_format: constrain the output as OpenAI's field does ({"type": "json_object"}: any JSON object;
        {"type": "json_schema", "json_schema": {"schema": {...}}}: JSON valid against the schema); grammar: a Lark
        grammar, or {"type": "lark" | "regex" | "gbnf", "value": "..."} (llguidance: runtime/python/constrain.py).
        context_shift (True/"on", False/"off"; None: Runtime.load's, else off): when the context is full, keep its
        first shift_sinks tokens (default 4) and its newest ones, drop shift_tokens between them (default: half of
        those after the sinks), run the kept ones again at their new positions and go on instead of finishing with
        "context" (stats(): context_shifts)."""
        r: dict = {}
        for _ in self.stream(prompt, max_new_tokens, temperature, top_k, top_p, repetition_penalty, seed, stop,
                             ignore_eos, min_p=min_p, presence_penalty=presence_penalty,
                             frequency_penalty=frequency_penalty, stop_ids=stop_ids, keep_context=keep_context,
                             reuse_prefix=reuse_prefix, speculate=speculate, draft_max=draft_max,
                             response_format=response_format, grammar=grammar, context_shift=context_shift,
                             shift_sinks=shift_sinks, shift_tokens=shift_tokens, _result=r, _raw_text=_raw_text):
            pass
        return GenerationResult(
            text=r["text"], token_ids=r["ids"], prompt_tokens=r["prompt_tokens"], finish_reason=r["finish_reason"],
            prefill_tokens_per_s=r["prompt_tokens"] / r["prefill_s"] if r["prefill_s"] > 0 else 0.0,
            decode_tokens_per_s=r["n_decoded"] / r["decode_s"] if r["decode_s"] > 0 else 0.0,
            ttft_s=r["ttft_s"], cached_tokens=r["cached_tokens"])

    def chat(self, messages: list[dict], tools: list[dict] | None = None, tool_choice: str | dict | None = None,
             parallel_tool_calls: bool = True, **kwargs) -> GenerationResult:
        """messages: [{"role": "user", "content": "..."}, ...], rendered with the package's chat template. The
        conversation so far stays in this context's cache: a call that extends the previous one (its messages, the
        reply, a new message) prefills only the new part (result.cached_tokens says how much was reused).
        tools / tool_choice / parallel_tool_calls: OpenAI's function tools, offered through the chat template; the
        reply is constrained to the template's call format and its calls come back in result.tool_calls (feed them
        back as an assistant message with "tool_calls", then {"role": "tool", "tool_call_id", "content"} results)."""
        from .tools import template_messages, tool_plan

        if not isinstance(messages, list) or not messages or not all(_chat_message(m) for m in messages):
            raise InputError("chat needs a non-empty list of {'role': str, 'content': str} messages (an assistant "
                             "message may carry tool_calls instead of content)")
        plan = tool_plan(self.runtime.text, tools, tool_choice, parallel_tool_calls)
        prompt = self.runtime.text.apply_chat_template(template_messages(messages), tools=plan.tools if plan else None)
        # a conversation grows by appending: what the cache holds of it is not prefilled again
        kwargs.setdefault("reuse_prefix", not kwargs.get("keep_context", False))
        if plan is not None:
            if kwargs.get("response_format") is not None or kwargs.get("grammar") is not None:
                raise InputError("give tools or response_format/grammar, not both: the tool calls are the constraint")
            kwargs.update(grammar=plan.grammar(self.runtime.text), _raw_text=True)
        r = self.generate(self.runtime.encode(prompt, add_special_tokens=False), **kwargs)
        if plan is not None:
            content, calls = plan.parse(r.text)
            r.text, r.tool_calls = content or "", calls
            if calls:
                r.finish_reason = "tool_calls"
        return r


def _chat_message(m) -> bool:
    return isinstance(m, dict) and isinstance(m.get("role"), str) and (
        isinstance(m.get("content"), str) or (m.get("content") is None and bool(m.get("tool_calls"))))


class _FallbackText:
    """Text of the generated ids for packages without tokenizer.bin (their tokenizer is outside the C tokenizer's
    families): Hugging Face decode of the ids so far, handed out as it grows (held back while it ends in an
    unfinished character). Stop strings need tokenizer.bin and are refused for such packages.
    special (tool calls, whose openings may be special tokens): the text of special tokens too, but for those that
    end the reply; the stop strings are then applied here as the C loop applies them to its own text (the text ends
    before the first one; what may still become one is held back)."""

    def __init__(self, runtime: Runtime, special: bool = False, stops=None):
        self.tok, self.ids, self.done, self.stopped = runtime.text.tok, [], "", False
        self.skip, self.end = not special, set(runtime.eos_ids) if special else set()
        self.stops = [stops] if isinstance(stops, str) else [x for x in (stops or []) if x]

    def _text(self) -> str:
        return self.tok.decode(self.ids, skip_special_tokens=self.skip) if self.ids else ""

    def _take(self, text: str, final: bool) -> bytes:
        cut = min((i for i in (text.find(x) for x in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            text, final, self.stopped = text[:cut], True, True
        end = len(text)
        if not final:   # hold back a tail that may still become a stop string
            end -= max((k for x in self.stops for k in range(min(len(x) - 1, end), 0, -1)
                        if x.startswith(text[end - k:])), default=0)
        if not text.startswith(self.done) or end <= len(self.done):
            return b""
        piece, self.done = text[len(self.done):end], text[:end]
        return piece.encode()

    def push(self, token: int) -> bytes:
        if token in self.end or self.stopped:
            return b""
        self.ids.append(token)
        text = self._text()
        return b"" if text.endswith("\ufffd") else self._take(text, False)

    def flush(self) -> bytes:
        return b"" if self.stopped else self._take(self._text(), True)


@contextmanager
def _stdout_to_stderr(on: bool):
    """Qualcomm's HTP libraries print a banner on stdout (fd 1) when they load: keep a CLI's output clean."""
    if not on:
        yield
        return
    import sys

    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _package_dir(name: str) -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec(name)
    return Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else None


def _npu_libraries() -> list[tuple[str, str, str]]:
    """ONNX Runtime and the QNN EP for the NPU backend, from the installed onnxruntime / onnxruntime-qnn wheels, as
    its backend options (EDGELLM_ORT_LIB, EDGELLM_QNN_EP_LIB and EDGELLM_QNN_BACKEND override; the backend reads
    those itself too)."""
    ort_lib = os.environ.get("EDGELLM_ORT_LIB")
    ep_lib, backend = os.environ.get("EDGELLM_QNN_EP_LIB"), os.environ.get("EDGELLM_QNN_BACKEND")
    ort_dir, qnn_dir = _package_dir("onnxruntime"), _package_dir("onnxruntime_qnn")   # found, not imported
    if not ort_lib and ort_dir:
        ort_lib = next(iter(sorted((ort_dir / "capi").glob("libonnxruntime.so*"))), None)
    if qnn_dir and (qnn_dir / "libonnxruntime_providers_qnn.so").is_file():
        ep_lib = ep_lib or str(qnn_dir / "libonnxruntime_providers_qnn.so")
        backend = backend or str(qnn_dir / "libQnnHtp.so")
    found = {"ort_library": ort_lib and str(ort_lib), "qnn_ep_library": ep_lib, "qnn_backend": backend}
    return [("qnn_ort", k, v) for k, v in found.items() if v]


def _memory(lib, handle) -> dict:
    mp = L.MemoryPlan()
    if lib.el_model_memory(handle, C.byref(mp)) != 0:
        raise RuntimeLoadError(L.last_error())
    out = {name: getattr(mp, name) for name, _ in L.MemoryPlan._fields_ if name != "reserved"}
    for k in ("policy", "storage", "storage_what"):
        out[k] = out[k].decode()
    n = lib.el_model_weights_pinned(handle, None, 0)
    buf = (C.c_uint8 * max(n, 1))()
    lib.el_model_weights_pinned(handle, buf, n)
    out["pinned"] = [bool(b) for b in buf[:n]]
    return out



class Runtime(_Closes):
    """A loaded package: the model (plan, kernels, weights, tokenizer; read-only and shared) and a default context.
    The generation methods run on the default context; new_context() makes more conversations over the same
    weights, each costing only its KV cache and arena."""

    def __init__(self, path: Path, manifest: dict, handle: int):
        self.path, self.manifest = path, manifest
        self._lib = L.lib()
        self._model = handle
        self.speculate = (0, 0, None)   # (el_gen_params speculate, draft_max, draft path): generate()'s defaults
        self.shift = (None, None, None)   # (context_shift, shift_sinks, shift_tokens): generate()'s defaults
        self._draft_rts: dict[str, Runtime] = {}   # draft packages loaded for speculate=PATH
        self.vocab = self._lib.el_vocab(handle)
        self.max_context = self._lib.el_max_context(handle)
        self.chunk = self._lib.el_chunk(handle)
        self.verify_width = self._lib.el_verify_width(handle)   # tokens per verify pass (0: no verify program)
        self.bos_id = self._lib.el_bos_id(handle)
        self.c_text = bool(self._lib.el_has_tokenizer(handle))
        buf = (C.c_int32 * 8)()
        self.eos_ids = set(buf[:self._lib.el_eos_ids(handle, buf, 8)])
        self._contexts: list[Context] = []
        try:
            self.text = TextCodec(path)
            self.context = self.new_context()
        except BaseException:
            self._model = None   # the caller (load) frees the handle; __del__ must not free it again
            raise

    @classmethod
    def load(cls, path: str | os.PathLike, threads: int | None = None, memory_budget: int | str | None = None,
             verify: bool = False, digest: str | None = None, huge_pages: bool | None = None,
             prefill_backend: str = "auto", npu_soc: str | None = None, weight_policy: str | None = None,
             storage: str | None = None, io_threads: int | None = None, direct_io: bool = False,
             ffn_threshold: float | None = None, expert_eviction: str | None = None,
             expert_predict: bool = False, expert_warm: bool = True, device: str | None = None,
             backend_options: dict[str, str] | None = None, speculate: str | None = None,
             draft_max: int | None = None, context_shift: bool | str | None = None, shift_sinks: int | None = None,
             shift_tokens: int | None = None) -> Runtime:
        """Load a package.

        threads: default threads of its contexts (None: one per CPU). memory_budget: bytes (or "600MB") the model
        may use: the weights it holds + one context's KV cache and arena; weights beyond it are streamed from the
        package every token (weight_policy "window"; memory() says how). weight_policy: "resident", "window",
        "experts" (MoE packages: every other weight held, experts read into a cache when selected or guessed) or
        None (resident when everything fits, else experts for MoE packages whose other weights fit, else window).
        expert_eviction: the expert cache's eviction policy ("freq", "lru", "lfu"; None: freq). expert_predict:
        run the package's guesses of later layers' experts and read the guessed ones ahead (default off: experts
        are read once selected). expert_warm: fill the
        expert cache at load with the experts calibration selected most (the package's routing.bin).
        storage: the storage profile streamed reads are shaped to ("native",
        "sd", "emmc", "ufs3", "ufs4"; the last two are modelled). io_threads: reader threads (None: 2). direct_io:
        O_DIRECT reads instead of buffered ones dropped from the page cache behind them. verify: check every
        file against the package's SHA256SUMS. digest: the "sha256:..." that `edgellm compile` printed; every file
        is checked against it before any of the package's code is loaded (load packages you did not build only
        this way). huge_pages: weights in transparent huge pages (None: automatic; EDGELLM_HUGEPAGES=0/1 sets it).
        prefill_backend: "auto" | "cpu" | "npu", where android-npu packages prefill prompts ("auto": the NPU when
        ONNX Runtime with the QNN EP loads; `prefill_backend` then says which ran). npu_soc: the SoC whose
        EPContext graphs to load ("sm8650", ...; "none": the ONNX graphs; None: this phone's, if the package has
        them). ffn_threshold: packages compiled with --layout bundled skip the FFN neuron groups whose estimated
        output is below it (0: exact; None: the package's default, manifest "ffn"). device: the OpenCL device of
        android-gpu / opencl packages ("P:D" platform and device index, or part of the device name; None:
        $EDGELLM_OPENCL_DEVICE, else the first GPU, else the first OpenCL device); `device` says which ran.
        backend_options: the package's backends' own options, {"backend.key": "value"} (README "Backends").
        speculate / draft_max: generate()'s defaults for this runtime's contexts (None: off; the package's width).
        context_shift / shift_sinks / shift_tokens: generate()'s defaults too (None: off, 4, half)."""
        spec = speculation(speculate, draft_max)
        shift = shifting(context_shift, shift_sinks, shift_tokens)
        p = Path(path)
        opts = L.LoadOptions()
        L.lib().el_load_options_init(C.byref(opts))
        if huge_pages is None and os.environ.get("EDGELLM_HUGEPAGES", "") in ("0", "1"):
            huge_pages = os.environ["EDGELLM_HUGEPAGES"] == "1"
        # every option checked and set by its row of the one table (runtime/python/options.py)
        values = {
            "threads": threads, "digest": digest, "memory_budget": memory_budget, "weight_policy": weight_policy,
            "expert_eviction": expert_eviction, "expert_predict": expert_predict, "expert_warm": expert_warm,
            "storage": storage, "io_threads": io_threads, "direct_io": direct_io, "huge_pages": huge_pages,
            "ffn_threshold": ffn_threshold, "prefill_backend": prefill_backend, "npu_soc": npu_soc,
            "device": device, "backend_options": backend_options}
        keep = O.apply(opts, values)   # the strings opts points to: alive until the load returns
        manifest = read_manifest(p)
        if prefill_backend != "cpu" and manifest.get("npu") is not None:   # where ONNX Runtime is, for NPU graphs
            keep += O.apply(opts, values, backend_extra=_npu_libraries())
        if os.environ.get("EDGELLM_NO_MMAP", "0") not in ("", "0"):
            opts.use_mmap = 0
        if digest is not None:
            # the small files Python reads here; libedgellm checks everything before it loads any code
            verify_package(p, digest, only=[f for f in ("manifest.json", "tokenizer.json", "tokenizer_config.json",
                                                        "chat_template.jinja", "chat_template.json") if (p / f).is_file()])
        elif verify:
            verify_package(p)
        with _stdout_to_stderr(prefill_backend != "cpu" and manifest.get("npu") is not None):
            h = L.lib().el_model_load(str(p).encode(), C.byref(opts))
        if not h:
            raise RuntimeLoadError(L.last_error())
        try:
            rt = cls(p, manifest, h)
        except BaseException:
            L.lib().el_model_free(h)
            raise
        try:
            rt.speculate = (spec[0] or 0, spec[1] or 0, spec[2])
            rt.shift = shift
            if spec[2] is not None:
                rt.draft_runtime(spec[2], threads)   # a draft that cannot draft fails the load, in one line
            return rt
        except BaseException:
            rt.close()
            raise

    @classmethod
    def plan(cls, path: str | os.PathLike, memory_budget: int | str | None = None, weight_policy: str | None = None,
             storage: str | None = None, direct_io: bool = False, expert_eviction: str | None = None) -> dict:
        """How a package would use memory under a budget, without reading its weights or loading its kernels:
        memory() of the model Runtime.load would make, plus "pinned" (per weight, in manifest order: held or
        streamed)."""
        p = Path(path)
        read_manifest(p)
        opts = L.LoadOptions()
        L.lib().el_load_options_init(C.byref(opts))
        keep = O.apply(opts, {"memory_budget": memory_budget, "weight_policy": weight_policy,  # noqa: F841
                              "storage": storage, "direct_io": direct_io, "expert_eviction": expert_eviction,
                              "prefill_backend": "cpu"})
        opts.plan_only = 1
        h = L.lib().el_model_load(str(p).encode(), C.byref(opts))
        if not h:
            raise RuntimeLoadError(L.last_error())
        try:
            return _memory(L.lib(), h)
        finally:
            L.lib().el_model_free(h)

    def memory(self) -> dict:
        """The weight store's layout: policy, budget, bytes pinned / streamed per token / in the window, the
        minimum budget, one context's KV cache + arena, and the storage profile."""
        return _memory(self._lib, self._model)

    @property
    def prefill_backend(self) -> str:
        """"npu" or "cpu": where this package prefills prompts (prefill_backend_note: why not the NPU, with auto)."""
        return "npu" if self._lib.el_model_prefill_backend(self._model, None, 0) == L.PREFILL_BACKENDS["npu"] else "cpu"

    @property
    def device(self) -> str | None:
        """The OpenCL device an android-gpu / opencl package runs on (and whether its program came from the binary
        cache); None for CPU packages."""
        buf = C.create_string_buffer(1024)
        n = self._lib.el_model_device(self._model, buf, len(buf))
        return buf.value.decode(errors="replace") if n > 0 else None

    @property
    def prefill_backend_note(self) -> str:
        buf = C.create_string_buffer(1024)
        self._lib.el_model_prefill_backend(self._model, buf, len(buf))
        return buf.value.decode(errors="replace")

    def sampling_defaults(self) -> dict:
        """The package's sampling defaults (from its generation_config.json), as every front end applies them."""
        p = L.GenParams()
        self._lib.el_gen_params_default(self._model, C.byref(p))
        return {k: getattr(p, k) for k in SAMPLING_ARGS}

    def new_context(self, threads: int | None = None) -> Context:
        """A new conversation over this package's model (its own KV cache and arena)."""
        if self._model is None:
            raise InputError("this Runtime is closed")
        c = Context(self, threads)
        self._contexts.append(c)
        return c

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of text: Hugging Face tokenizers when the package has tokenizer.json, else its tokenizer.bin."""
        if not isinstance(text, str):
            raise InputError(f"text must be a str, not {type(text).__name__}")
        if self.text.available:
            return self.text.encode(text, add_special_tokens)
        if not self.c_text:
            raise InputError("this package has no tokenizer: pass token ids instead of text"
                             " (a list of ints; edgellm run --ids 1,2,3)")
        try:
            raw = text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InputError(f"the prompt is not valid UTF-8 text (byte {e.start}): give UTF-8 text") from None
        n = self._lib.el_encode(self._model, raw, len(raw), -1 if add_special_tokens else 0, None, 0)
        out = (C.c_int32 * max(n, 1))()
        if n < 0 or self._lib.el_encode(self._model, raw, len(raw), -1 if add_special_tokens else 0, out, n) != n:
            raise InputError(L.last_error())
        return list(out[:n])

    def forget_drafts(self) -> None:
        """Empties the n-gram pool this model's contexts share for speculative decoding (what followed each 3-token
        n-gram they read or wrote, runtime/core/ngram_pool.c): drafts then come from each context's own history
        again (a benchmark that repeats its prompts in fresh contexts calls this between runs). Tokens never
        depend on the pool, only the passes that produce them."""
        if self._model is not None:
            self._lib.el_model_forget_drafts(self._model)

    def draft_runtime(self, path: str, threads: int | None = None) -> Runtime:
        """The draft package at path, loaded once (speculate=PATH) and checked to share this package's tokenizer
        token by token (el_draft_check); this package must have a verify program."""
        rt = self._draft_rts.get(path)
        if rt is not None:
            return rt
        if not self.verify_width:
            raise InputError("this package has no verify program, which speculative decoding runs: recompile it "
                             "with this edgellm")
        try:
            rt = Runtime.load(path, threads=threads if threads is not None else self.threads, prefill_backend="cpu")
        except EdgeLLMError as e:
            raise InputError(f"draft package {path}: {e}") from None
        if self._lib.el_draft_check(self._model, rt._model) != 0:
            msg = L.last_error()
            rt.close()
            raise InputError(f"draft package {path}: {msg}")
        self._draft_rts[path] = rt
        return rt

    def close(self) -> None:
        for c in self._contexts:
            c.close()
        self._contexts = []
        for d in self._draft_rts.values():
            d.close()
        self._draft_rts = {}
        if self._model is not None:
            self._lib.el_model_free(self._model)   # freed for good once the last context is
            self._model = None

    def __del__(self):
        try:
            if getattr(self, "_model", None) is not None:
                self._lib.el_model_free(self._model)
                self._model = None
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # ---- the default context --------------------------------------------------------------------------------------
    @property
    def threads(self) -> int:
        return self.context.threads

    def stats(self) -> dict:
        return self.context.stats()

    def reset(self) -> None:
        self.context.reset()

    def logits(self, token_ids) -> np.ndarray:
        return self.context.logits(token_ids)

    def prefill(self, token_ids) -> np.ndarray:
        return self.context.prefill(token_ids)

    def decode_step(self, token: int) -> np.ndarray:
        return self.context.decode_step(token)

    def verify(self, token_ids, parents=None) -> np.ndarray:
        return self.context.verify(token_ids, parents)

    def take_drafts(self, k: int) -> None:
        self.context.take_drafts(k)

    def take_node(self, node: int) -> None:
        self.context.take_node(node)

    def stream(self, prompt, *args, **kwargs) -> Iterator[str]:
        return self.context.stream(prompt, *args, **kwargs)

    def generate(self, prompt, *args, **kwargs) -> GenerationResult:
        return self.context.generate(prompt, *args, **kwargs)

    def chat(self, messages: list[dict], **kwargs) -> GenerationResult:
        return self.context.chat(messages, **kwargs)
