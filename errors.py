"""One exception hierarchy: every user-facing failure is an EdgeLLMError with a one-line message that names
the problem and the fix. The CLI prints it on one line and exits non-zero."""


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
