"""TVMScript without reading source files on every kernel: while kernels are built, `inspect.stack()` and
`inspect.getouterframes()` return frames without their code context.

TVMScript's parser calls `inspect.stack()` for every `@T.prim_func` and `inspect.getouterframes()` for every macro
call, to find the caller's variables and the parser; with the default context of one line, each frame of the whole
stack has its source file located (`inspect.getmodule` scans sys.modules) and read. That was 40-45% of the time to
build a package's kernels (Gemma 2, 3 layers, q4g32: 4.2 of 9.7 s; more under a deep stack such as pytest's). The
parser only reads the frames' locals and globals (and, to spot a class-level `@I.ir_module`, a code context that no
kernel here has), so frames without context give the same PrimFuncs."""
from __future__ import annotations

import contextlib
import inspect
import sys
import threading

_lock = threading.RLock()


def _stack(context: int = 1):
    return _outer(sys._getframe(1))


def _outer(frame, context: int = 1):
    out = []
    while frame is not None:
        out.append(inspect.FrameInfo(frame, frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name, None, None))
        frame = frame.f_back
    return out


@contextlib.contextmanager
def frames_without_source():
    """Builds inside this see context-free frames from inspect.stack / inspect.getouterframes (process-wide, for
    the duration; nested and concurrent uses are serialized)."""
    with _lock:
        saved = inspect.stack, inspect.getouterframes
        inspect.stack, inspect.getouterframes = _stack, _outer
        try:
            yield
        finally:
            inspect.stack, inspect.getouterframes = saved
