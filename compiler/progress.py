"""Progress of long compile steps on stderr: a line whose elapsed time moves on a terminal, one line per step in a
log (no carriage returns), nothing with --quiet."""
from __future__ import annotations

import sys
import threading
import time


def log(enabled: bool, msg: str) -> None:
    """One progress line on stderr (nothing with --quiet)."""
    if enabled:
        print(msg, file=sys.stderr, flush=True)


class Step:
    """with Step("building 35 kernels with TVM", enabled): ... -> "building ... 12 s" ticking, then "... done in 14 s"."""

    def __init__(self, what: str, enabled: bool = True, every: float = 1.0):
        self.what, self.enabled, self.every = what, enabled, every
        self.tty = enabled and sys.stderr.isatty()
        self._stop = threading.Event()

    def _tick(self) -> None:
        while not self._stop.wait(self.every):
            sys.stderr.write(f"\r{self.what} ... {time.perf_counter() - self.t0:.0f} s")
            sys.stderr.flush()

    def __enter__(self):
        self.t0 = time.perf_counter()
        if self.enabled:
            sys.stderr.write(f"{self.what} ..." + ("" if self.tty else "\n"))
            sys.stderr.flush()
        if self.tty:
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, kind, value, tb):
        if self.tty:
            self._stop.set()
            self._thread.join()
        if self.enabled:
            end = "failed" if kind is not None else f"done in {time.perf_counter() - self.t0:.1f} s"
            sys.stderr.write((f"\r{self.what} ... {end}\033[K\n") if self.tty else f"{self.what}: {end}\n")
            sys.stderr.flush()
        return False


def layer_progress(what: str, enabled: bool = True):
    """A layer loop's progress argument (quant/calibration.gptq_model's): None (quiet), True on a terminal (its tqdm
    bar), else a callable progress(done, total) writing a line at every tenth of the layers, with elapsed seconds."""
    if not enabled:
        return None
    if sys.stderr.isatty():
        return True
    t0, said = time.perf_counter(), set()

    def report(done: int, total: int) -> None:
        tenth = done * 10 // max(total, 1)
        if tenth not in said:
            said.add(tenth)
            sys.stderr.write(f"{what}: {done}/{total} layers, {time.perf_counter() - t0:.0f} s\n")
            sys.stderr.flush()
    return report
