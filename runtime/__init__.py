"""Run-time side: ctypes over libedgellm plus tokenization. Never imports TVM."""
from .api import GenerationResult, Runtime

__all__ = ["Runtime", "GenerationResult"]
