"""Weight quantization schemes (registry by name)."""
from .schemes import SCHEMES, Scheme, get_scheme

__all__ = ["SCHEMES", "Scheme", "get_scheme"]
