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
