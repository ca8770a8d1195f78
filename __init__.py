"""edgellm: compile Hugging Face LLM checkpoints with Apache TVM into packages that a small C runtime executes.

Importing `edgellm` (or `edgellm.runtime`) does not import TVM: only `edgellm.compile` / `edgellm.compiler` do.
"""
from .errors import CompileError, EdgeLLMError, InputError, ModelLoadError, PackageError
from .runtime import Context, GenerationResult, Runtime

__version__ = "0.2.0"


def compile(model, target="host", quant=None, out=None, **kwargs):  # noqa: A001 - public name from the spec
    """Compile a Hugging Face checkpoint (local dir, hub id or demo name) into an edgellm package; returns its path.
    quant None: f16, or t2 for BitNet checkpoints. Keyword arguments: see compiler.driver.compile_model."""
    from .compiler.driver import compile_model

    return compile_model(model, target=target, quant=quant, out=out, **kwargs)


__all__ = ["Runtime", "Context", "GenerationResult", "compile", "EdgeLLMError", "ModelLoadError", "CompileError",
           "PackageError", "InputError", "__version__"]
