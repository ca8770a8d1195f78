"""Weight quantization schemes: the interface and registry (quant/scheme.py), one module per scheme family (each
registers its schemes when imported: the registration lines below, in SCHEMES order), and the shared packed
layout (quant/packing.py)."""
from . import packing
from .scheme import SCHEMES, Scheme, body_schemes, get_scheme, head_schemes, register

from . import float  # noqa: F401  f32, f16
from . import q8  # noqa: F401  q8
from . import q8g32  # noqa: F401  q8g32 (llama.cpp's Q8_0 grid; body only)
from . import q4  # noqa: F401  q4g32, q4g64, q4g128
from . import q4m  # noqa: F401  q4m32 (llama.cpp's Q4_1 grid: holds Q4_1 / Q4_K blocks; body only)
from . import q6  # noqa: F401  q6 (head only)
from . import t2  # noqa: F401  t2 (body only)

__all__ = ["SCHEMES", "Scheme", "body_schemes", "get_scheme", "head_schemes", "packing", "register"]
