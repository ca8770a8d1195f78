"""Run-time side: ctypes over libedgellm plus tokenization. Never imports TVM."""
from .python.api import Context, GenerationResult, Runtime

__all__ = ["Runtime", "Context", "GenerationResult"]
