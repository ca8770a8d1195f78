"""A JSON schema (or a regular expression) compiled into a byte automaton for the C runtime's own constraint
(runtime/core/constraint.c): `bin/edgellm-run --constraint FILE` and the Android library, which link no grammar
engine, constrain their output with it.

    schema --(outlines-core: the schema as a regular expression)--> regex
           --(interegular: a minimal character DFA)--> UTF-8 byte DFA --> FILE

The file depends on no model: the runtime walks each token's bytes through it, so one file serves every package.
What a regular expression cannot say (recursion: a schema that nests itself, JSON of any depth) outlines-core bounds
or refuses; the Python front ends and the server keep the full engine (llguidance, constrain.py).

Format (little-endian): b"ELDFA\\0\\0\\1", u32 nodes, u32 byte classes, u32 start node, u32 0; u8 class[256] (the class
of each byte); u8 accept[nodes]; i32 next[nodes][classes] (-1: no way on). Every node can still reach an accepting
one: a walk that dies is a token the constraint refuses.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from ...errors import EdgeLLMError

MAGIC = b"ELDFA\0\0\1"
MAX_NODES = 1 << 20   # a bigger automaton is a schema to simplify (the file would be too)
WHITESPACE = r"[ ]?"  # between JSON tokens: at most one space (unbounded whitespace lets small models loop)


MAX_INT_RANGE = 4096  # integer bounds become an enum of the values when there are at most this many


def _bounded_ints(node):
    """The schema with each integer that has both bounds (and at most MAX_INT_RANGE values) as an enum of its
    values: outlines-core writes any integer for {"type": "integer", "minimum": ..., "maximum": ...}."""
    if isinstance(node, list):
        return [_bounded_ints(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _bounded_ints(v) for k, v in node.items()}
    if out.get("type") == "integer" and "enum" not in out and "const" not in out:
        lo = out.get("minimum", out["exclusiveMinimum"] + 1 if isinstance(out.get("exclusiveMinimum"), int) else None)
        hi = out.get("maximum", out["exclusiveMaximum"] - 1 if isinstance(out.get("exclusiveMaximum"), int) else None)
        if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and 0 <= hi - lo < MAX_INT_RANGE:
            import math

            values = list(range(math.ceil(lo), math.floor(hi) + 1))
            if values:
                rest = {k: v for k, v in out.items()
                        if k not in ("type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")}
                return {**rest, "enum": values}
    return out


def schema_regex(schema: dict | str) -> str:
    """The JSON schema as a regular expression (outlines-core), or a one-line error."""
    from outlines_core.json_schema import build_regex_from_schema

    try:
        text = json.dumps(_bounded_ints(json.loads(schema) if isinstance(schema, str) else schema))
        return build_regex_from_schema(text, WHITESPACE)
    except Exception as e:  # noqa: BLE001 - outlines-core raises plain ValueErrors and its own
        why = (str(e).splitlines() or [type(e).__name__])[0]
        raise EdgeLLMError(f"this JSON schema cannot be compiled for the C runtime: {why}") from None


def _char_dfa(regex: str):
    import interegular

    try:
        return interegular.parse_pattern(regex).to_fsm().reduce()
    except Exception as e:  # noqa: BLE001
        why = (str(e).splitlines() or [type(e).__name__])[0]
        raise EdgeLLMError(f"this regular expression cannot be compiled: {why}") from None


class _Builder:
    """The byte DFA of a character DFA: its states keep their numbers; each state's non-ASCII characters become
    paths of UTF-8 bytes through nodes added after them (shared where whole ranges of characters go to one state)."""

    def __init__(self, fsm):
        self.fsm = fsm
        alpha = fsm.alphabet
        from interegular.fsm import anything_else

        self.other = alpha[anything_else] if anything_else in alpha else None
        self.explicit = sorted((ord(ch), alpha[ch]) for ch in alpha if ch is not anything_else)
        self.codes = np.array([c for c, _ in self.explicit], dtype=np.int64)
        self.states = {s: i for i, s in enumerate(sorted(fsm.states, key=lambda s: (s != fsm.initial, s)))}
        self.rows: list[list[int]] = [[-1] * 256 for _ in self.states]
        self.accept = [s in fsm.finals for s in self.states]
        self.any_tail: dict[tuple[int, int], int] = {}   # (bytes still to come, target) -> node

    def node(self, accept=False) -> int:
        if len(self.rows) >= MAX_NODES:
            raise EdgeLLMError(f"the automaton has more than {MAX_NODES} nodes: simplify the schema")
        self.rows.append([-1] * 256)
        self.accept.append(accept)
        return len(self.rows) - 1

    def target(self, s, cls) -> int:
        t = self.fsm.map.get(s, {}).get(cls)
        return -1 if t is None else self.states[t]

    def tail(self, k: int, t: int) -> int:
        """A node taking any k continuation bytes to t."""
        if k == 0 or t < 0:
            return t
        key = (k, t)
        if key not in self.any_tail:
            n = self.any_tail[key] = self.node()
            nxt = self.tail(k - 1, t)
            for b in range(0x80, 0xC0):
                self.rows[n][b] = nxt
        return self.any_tail[key]

    def explicit_in(self, lo: int, hi: int) -> bool:
        i = np.searchsorted(self.codes, lo)
        return bool(i < len(self.codes) and self.codes[i] <= hi)

    def cls_of(self, cp: int):
        i = int(np.searchsorted(self.codes, cp))
        return self.explicit[i][1] if i < len(self.codes) and self.codes[i] == cp else self.other

    @staticmethod
    def valid(a: int, z: int, base: int) -> str:
        """Whether characters a..z have UTF-8 encodings of the length whose smallest character is base: all, some
        or none (shorter ones are overlong, surrogates and past U+10FFFF have none)."""
        lo, hi = max(a, base), min(z, 0x10FFFF)
        if lo > hi or (lo >= 0xD800 and hi <= 0xDFFF):
            return "none"
        whole = a >= base and z <= 0x10FFFF and (z < 0xD800 or a > 0xDFFF)
        return "all" if whole else "some"

    def route(self, s, a: int, z: int, k: int, base: int) -> int:
        """Where characters a..z, which share their bytes so far with k continuation bytes still to come, go from
        state s: a node taking the next byte (shared where they all go to one state), or -1."""
        v = self.valid(a, z, base)
        if v == "none":
            return -1
        if k == 0:
            return self.target(s, self.cls_of(a))
        if v == "all" and not self.explicit_in(a, z):
            return self.tail(k, -1 if self.other is None else self.target(s, self.other))
        n = self.node()
        width = 64 ** (k - 1)
        for b in range(0x80, 0xC0):
            lo = a + (b - 0x80) * width
            self.rows[n][b] = self.route(s, lo, lo + width - 1, k - 1, base)
        return n

    def build(self) -> None:
        leads = ((0xC0, 0xE0, 0x80, 1), (0xE0, 0xF0, 0x800, 2), (0xF0, 0xF8, 0x10000, 3))  # lead range, base, k
        for s, i in self.states.items():
            for b in range(0x80):
                self.rows[i][b] = self.target(s, self.cls_of(b))
            for first, end, base, k in leads:
                width = 64 ** k
                for lead in range(first, end):
                    a = (lead - first) * width
                    self.rows[i][lead] = self.route(s, a, a + width - 1, k, base)


def _prune(rows: np.ndarray, accept: np.ndarray) -> np.ndarray:
    """Transitions into nodes that cannot reach an accepting one become -1 (a walk there is already lost)."""
    live = accept.copy()
    while True:
        nxt = rows.clip(min=0)
        reach = live | ((rows >= 0) & live[nxt]).any(axis=1)
        if (reach == live).all():
            break
        live = reach
    out = rows.copy()
    out[(rows >= 0) & ~live[rows.clip(min=0)]] = -1
    return out


def compile_regex(regex: str) -> bytes:
    """The automaton file's bytes for a regular expression over the text."""
    b = _Builder(_char_dfa(regex))
    b.build()
    rows = _prune(np.array(b.rows, dtype=np.int32), np.array(b.accept, dtype=bool))
    cols, cls = np.unique(rows.T, axis=0, return_inverse=True)   # bytes that behave alike share a column
    header = MAGIC + struct.pack("<4I", rows.shape[0], cols.shape[0], 0, 0)
    return (header + cls.reshape(-1).astype(np.uint8).tobytes() + np.array(b.accept, dtype=np.uint8).tobytes()
            + np.ascontiguousarray(cols.T).astype("<i4").tobytes())


def compile_schema(schema: dict | str) -> bytes:
    return compile_regex(schema_regex(schema))


def write(data: bytes, out: Path) -> Path:
    """Written whole or not at all."""
    out = Path(out)
    tmp = out.with_name(out.name + ".part")
    try:
        tmp.write_bytes(data)
        tmp.replace(out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise EdgeLLMError(f"cannot write {out}: {e.strerror}") from None
    return out


class Automaton:
    """The file read back (tests, and a check of what the C walker does): walk(text) -> node or -1."""

    def __init__(self, data: bytes):
        if data[:8] != MAGIC:
            raise EdgeLLMError("not an edgellm automaton file (compile one with `edgellm schema`)")
        self.n, self.nc, self.start, _ = struct.unpack_from("<4I", data, 8)
        at = 24
        self.cls = np.frombuffer(data, np.uint8, 256, at)
        self.accept = np.frombuffer(data, np.uint8, self.n, at + 256).astype(bool)
        self.next = np.frombuffer(data, "<i4", self.n * self.nc, at + 256 + self.n).reshape(self.n, self.nc)

    def walk(self, data: bytes, node: int | None = None) -> int:
        s = self.start if node is None else node
        for byte in data:
            if s < 0:
                return -1
            s = int(self.next[s, self.cls[byte]])
        return s

    def matches(self, text: str) -> bool:
        s = self.walk(text.encode())
        return s >= 0 and bool(self.accept[s])
