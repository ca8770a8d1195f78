"""compiler/progress.py: long compile steps report on stderr, a line per step (or per tenth of a layer loop) when
stderr is a log, nothing when quiet."""
from __future__ import annotations

import io

from edgellm.compiler import progress


class _Log(io.StringIO):
    def isatty(self) -> bool:
        return False


def test_layer_progress_in_a_log(monkeypatch):
    log = _Log()
    monkeypatch.setattr(progress.sys, "stderr", log)
    assert progress.layer_progress("GPTQ q4g32", enabled=False) is None
    report = progress.layer_progress("GPTQ q4g32")
    for done in range(1, 31):
        report(done, 30)
    lines = log.getvalue().splitlines()
    assert len(lines) == 11 and all(ln.startswith("GPTQ q4g32: ") for ln in lines)   # a line per tenth, no \r
    assert lines[0].startswith("GPTQ q4g32: 1/30 layers, ") and lines[-1].startswith("GPTQ q4g32: 30/30 layers, ")


def test_step_in_a_log(monkeypatch):
    log = _Log()
    monkeypatch.setattr(progress.sys, "stderr", log)
    with progress.Step("building 3 kernels"):
        pass
    with progress.Step("quiet", enabled=False):
        pass
    lines = log.getvalue().splitlines()
    assert lines[0] == "building 3 kernels ..." and lines[1].startswith("building 3 kernels: done in ")
    assert len(lines) == 2 and "\r" not in log.getvalue()
