"""Weight quantization schemes (registry by name) and their packed layouts (quant/packing.py)."""
from . import packing
from .schemes import SCHEMES, Scheme, get_scheme

__all__ = ["SCHEMES", "Scheme", "get_scheme", "packing"]
