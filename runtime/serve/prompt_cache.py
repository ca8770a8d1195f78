"""`edgellm serve --prompt-cache-dir DIR`: the prompt prefixes a server keeps seeing (a system prompt, a document
several requests ask about) saved to storage, so that a restarted server, or a slot that last held another
conversation, prefills only what follows them.

After each request, the longest prefix its prompt shares with one of the last RECENT prompts (MIN_TOKENS at least)
is saved from the slot's context (Context.save of its first n tokens) unless an entry already holds it; before each
request, the longest entry its prompt starts with is loaded into the slot when it holds more of the prompt than the
slot's cache does. Entries live in DIR/<the package's digest>/ as <sha256 of the ids>.state (the context's state,
written atomically and checked at load against the package and its own checksum) and .ids (the token ids, for the
index); together bounded by max_bytes, the least recently used evicted first (last use: the files' mtime, so the
order survives restarts). Only files named as this module names them are ever removed, and only in that folder."""
from __future__ import annotations

import hashlib
import os
import re
import threading
from collections import deque
from pathlib import Path

import numpy as np

from ...errors import EdgeLLMError, InputError
from .slots import common_prefix

RECENT, MIN_TOKENS = 16, 32
NAME = re.compile(r"^[0-9a-f]{32}\.(state|ids)$")


class PromptCacheDir:
    def __init__(self, root: str | os.PathLike, package: str | os.PathLike, max_bytes: int, min_tokens: int = MIN_TOKENS):
        sums = Path(package) / "SHA256SUMS"
        if not sums.is_file():
            raise InputError("--prompt-cache-dir needs the package's SHA256SUMS, which it does not have: recompile it "
                             "with this edgellm")
        self.dir = Path(root) / hashlib.sha256(sums.read_bytes()).hexdigest()[:32]
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InputError(f"--prompt-cache-dir {root}: {e.strerror}") from None
        if not os.access(self.dir, os.W_OK):
            raise InputError(f"--prompt-cache-dir {root}: not writable")
        self.max_bytes, self.min_tokens = max_bytes, min_tokens
        self.recent: deque[list[int]] = deque(maxlen=RECENT)
        self._lock = threading.Lock()
        self.entries: dict[str, list[int]] = {}   # name -> ids
        self.stats = {"loaded": 0, "loaded_tokens": 0, "saved": 0, "evicted": 0}
        for f in self.dir.glob("*.ids"):
            if NAME.match(f.name) and f.with_suffix(".state").is_file():
                try:
                    self.entries[f.stem] = np.fromfile(f, np.int32).tolist()
                except (OSError, ValueError):
                    continue

    def _files(self, name: str) -> tuple[Path, Path]:
        return self.dir / f"{name}.state", self.dir / f"{name}.ids"

    def _drop(self, name: str) -> None:
        self.entries.pop(name, None)
        for f in self._files(name):
            f.unlink(missing_ok=True)

    def prepare(self, ctx, ids: list[int]) -> int:
        """Before a request on ctx: load the longest entry its prompt starts with, when that holds more of it than
        ctx's cache does. Returns the tokens loaded (0: none)."""
        have = common_prefix(ctx.cached, ids)
        with self._lock:
            fits = [(len(e), n) for n, e in self.entries.items()
                    if have < len(e) <= len(ids) and ids[:len(e)] == e]
        if not fits:
            return 0
        size, name = max(fits)
        state, ids_file = self._files(name)
        try:
            n = ctx.load(state)
        except EdgeLLMError:   # damaged, or left by another build of the package: not ours to trust
            with self._lock:
                self._drop(name)
            return 0
        for f in (state, ids_file):   # its last use: what eviction orders by
            try:
                os.utime(f)
            except OSError:
                pass
        self.stats["loaded"] += 1
        self.stats["loaded_tokens"] += n
        return n

    def remember(self, ctx, ids: list[int]) -> None:
        """After a request on ctx (which holds its prompt): save the prefix it shares with a recent prompt."""
        with self._lock:
            best = max((common_prefix(r, ids) for r in self.recent), default=0)
            self.recent.append(list(ids))
            if best < self.min_tokens or any(len(e) >= best and ids[:best] == e[:best] for e in self.entries.values()):
                return
        prefix = ids[:best]
        name = hashlib.sha256(np.asarray(prefix, np.int32).tobytes()).hexdigest()[:32]
        state, ids_file = self._files(name)
        try:
            ctx.save(state, n_tokens=best)
        except EdgeLLMError:   # e.g. sliding-window layers no longer hold the prefix's start
            return
        tmp = ids_file.with_name(ids_file.name + f".tmp-{os.getpid()}")
        np.asarray(prefix, np.int32).tofile(tmp)
        os.replace(tmp, ids_file)
        with self._lock:
            self.entries[name] = prefix
            self.stats["saved"] += 1
            self._evict(keep=name)

    def _evict(self, keep: str) -> None:
        sizes = {}
        for n in list(self.entries):
            try:
                sizes[n] = (sum(f.stat().st_size for f in self._files(n)), self._files(n)[0].stat().st_mtime)
            except OSError:
                self.entries.pop(n, None)
        total = sum(s for s, _ in sizes.values())
        # least recently used first; the entry just saved last (and it too, if it alone is over the bound)
        for n, (s, _) in sorted(sizes.items(), key=lambda kv: (kv[0] == keep, kv[1][1])):
            if total <= self.max_bytes:
                break
            self._drop(n)
            total -= s
            self.stats["evicted"] += 1

    @property
    def bytes(self) -> int:
        return sum(f.stat().st_size for n in self.entries for f in self._files(n) if f.exists())
