"""One exception hierarchy: every user-facing failure is an EdgeLLMError with a one-line message that names
the problem and the fix. The CLI prints it on one line and exits non-zero."""
from __future__ import annotations

import os
import sys
import tempfile
import threading
from contextlib import contextmanager


class EdgeLLMError(Exception):
    """Base of all edgellm errors."""


class ModelLoadError(EdgeLLMError):
    """A checkpoint cannot be read: missing/corrupt config or weights, unknown architecture, hub unreachable."""


class CompileError(EdgeLLMError):
    """The compiler cannot produce a package for this model/target/quant."""


class PackageError(EdgeLLMError):
    """A package on disk is missing, truncated, of another version or built for another machine."""


class RuntimeLoadError(PackageError):
    """libedgellm refused a package (message from the C runtime)."""


class InputError(EdgeLLMError):
    """Bad arguments at run time: empty prompt, prompt longer than the context, unknown option value."""


def short_repr(v) -> str:
    """A value for a one-line message: repr (escapes newlines), cut short."""
    try:
        r = repr(v)
    except ValueError:   # an int too long to print (Python's 4300-digit limit)
        return f"<{type(v).__name__} too large to print>"
    return r if len(r) <= 60 else r[:57] + "..."


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (a library's multi-line error in a one-line one)."""
    s = str(e).strip()
    return s.splitlines()[0][:200] if s else type(e).__name__


_STDERR_LOCK = threading.Lock()


@contextmanager
def rust_panics_silenced():
    """`tokenizers` panics on some corrupt files, and Rust's panic hook prints the panic (and a backtrace) straight to
    file descriptor 2 before Python sees a PanicException: hold fd 2 on a scratch file meanwhile, so a bad file is one
    error line, not a screen of Rust."""
    with _STDERR_LOCK, tempfile.TemporaryFile() as scratch:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(scratch.fileno(), 2)
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
