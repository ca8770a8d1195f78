"""The tune cache: measured kernel timings of one CPU identity (targets/cpu_id.py), one JSON file per identity
under <cache dir>/tune/. A later compile on the same CPU reads its knobs from here and measures nothing.

An entry holds the timings of one kernel shape under every variant measured together in one interleaved run
(`variants` -> seconds): only timings taken side by side are compared, so a request for variants an entry lacks
(a `full` tune after a `quick` one) measures the whole set again and replaces the entry. A file whose recorded
identity differs from this CPU's (copied from another machine, or a hash collision) is ignored, never used; so is
one measured with other kernels (the kernels' source digest differs: an upgrade that changed a kernel's schedule
would otherwise keep choices timed on the old code, e.g. a prefill chunk picked for another token tile)."""
from __future__ import annotations

import functools
import json
import os
import tempfile
from pathlib import Path

from ...targets.cpu_id import cpu_identity, cpu_key
from ..cache_dir import cache_root

FORMAT = 1


@functools.lru_cache(maxsize=1)
def kernels_stamp() -> str:
    """A digest of the kernel sources (compiler/ops and the packed layouts they read): what the timings measured.
    Read once per process (a compile loads and saves the cache; the sources do not change under it)."""
    import hashlib

    here = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for f in sorted((here / "ops").glob("*.py")) + [here.parent / "quant" / "packing.py"]:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def tune_dir() -> Path:
    return cache_root() / "tune"


class TuneCache:
    def __init__(self, ident: dict | None = None, directory: Path | None = None):
        self.ident = ident if ident is not None else cpu_identity()
        self.path = (directory or tune_dir()) / f"{cpu_key(self.ident)}.json"
        self.entries: dict[str, dict[str, float]] = {}
        self.ignored: str | None = None   # why an existing file was not used
        self._load()

    def _load(self) -> None:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:
            self.ignored = f"unreadable ({type(e).__name__})"
            return
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            self.ignored = "another format"
        elif data.get("cpu") != self.ident:
            self.ignored = "measured on another CPU"
        elif data.get("kernels") != kernels_stamp():
            self.ignored = "measured with other kernels"
        elif isinstance(data.get("entries"), dict):
            self.entries = {k: v for k, v in data["entries"].items() if isinstance(v, dict)}

    def get(self, key: str, variants) -> dict[str, float] | None:
        """The timings of `key` when every one of `variants` was measured (in one run), else None."""
        got = self.entries.get(key)
        if got is None or any(str(v) not in got for v in variants):
            return None
        return {str(v): float(got[str(v)]) for v in variants}

    def put(self, key: str, timings: dict) -> None:
        self.entries[key] = {str(k): float(v) for k, v in timings.items()}

    def save(self) -> None:
        """Atomic write (temp file + rename): a concurrent compile never reads half a file. A read-only or full
        cache directory only costs the next compile a measurement."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tune-", dir=self.path.parent)
            with os.fdopen(fd, "w") as fh:
                data = {"format": FORMAT, "cpu": self.ident, "kernels": kernels_stamp(), "entries": self.entries}
                json.dump(data, fh, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
        except OSError:
            try:
                os.unlink(tmp)
            except (OSError, UnboundLocalError):
                pass
