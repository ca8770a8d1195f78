"""ctypes binding of libedgellm (runtime/edgellm.h). Loading it never imports TVM."""
from __future__ import annotations

import ctypes as C
import glob
import os
from pathlib import Path

from ..errors import EdgeLLMError


class SamplerParams(C.Structure):
    _fields_ = [("temperature", C.c_float), ("top_k", C.c_int32), ("top_p", C.c_float),
                ("repetition_penalty", C.c_float), ("seed", C.c_uint64)]


class Stats(C.Structure):
    _fields_ = [("weight_bytes_resident", C.c_uint64), ("kernel_calls", C.c_uint64),
                ("prefill_seconds", C.c_double), ("decode_seconds", C.c_double),
                ("prefill_tokens", C.c_uint64), ("decode_tokens", C.c_uint64), ("weight_bytes_huge", C.c_uint64)]


_SIGS = {
    "el_last_error": (C.c_char_p, []),
    "el_version": (C.c_char_p, []),
    "el_load": (C.c_void_p, [C.c_char_p, C.c_int]),
    "el_free": (None, [C.c_void_p]),
    "el_vocab": (C.c_int, [C.c_void_p]),
    "el_max_context": (C.c_int, [C.c_void_p]),
    "el_chunk": (C.c_int, [C.c_void_p]),
    "el_pos": (C.c_int, [C.c_void_p]),
    "el_threads": (C.c_int, [C.c_void_p]),
    "el_reset": (C.c_int, [C.c_void_p]),
    "el_eos_ids": (C.c_int, [C.c_void_p, C.POINTER(C.c_int32), C.c_int]),
    "el_bos_id": (C.c_int, [C.c_void_p]),
    "el_prefill": (C.c_int, [C.c_void_p, C.POINTER(C.c_int32), C.c_int, C.POINTER(C.c_float), C.c_int]),
    "el_decode": (C.c_int, [C.c_void_p, C.c_int32, C.POINTER(C.c_float)]),
    "el_sampler_new": (C.c_void_p, [C.POINTER(SamplerParams)]),
    "el_sampler_free": (None, [C.c_void_p]),
    "el_sample": (C.c_int32, [C.c_void_p, C.POINTER(C.c_float), C.c_int, C.POINTER(C.c_int32), C.c_int]),
    "el_get_stats": (None, [C.c_void_p, C.POINTER(Stats)]),
    "el_reset_stats": (None, [C.c_void_p]),
}

# runtime/tokenizer.h. Kept apart from _SIGS because tests/test_c_runtime.py builds a libedgellm of its own from a
# source list without tokenizer.c and declares every _SIGS entry on it.
_TOK_SIGS = {
    "el_tok_load": (C.c_void_p, [C.c_char_p]),
    "el_tok_free": (None, [C.c_void_p]),
    "el_tok_encode": (C.c_int, [C.c_void_p, C.c_char_p, C.c_int, C.c_int, C.POINTER(C.c_int32), C.c_int]),
    "el_tok_decode": (C.c_int, [C.c_void_p, C.c_int32, C.c_char_p, C.c_int]),
    "el_tok_bos": (C.c_int, [C.c_void_p]),
    "el_tok_n_vocab": (C.c_int, [C.c_void_p]),
    "el_tok_is_special": (C.c_int, [C.c_void_p, C.c_int32]),
}

_lib = None


def library_path() -> Path:
    env = os.environ.get("EDGELLM_LIB")
    if env:
        return Path(env)
    here = Path(__file__).parent
    found = sorted(glob.glob(str(here / "_libedgellm*.so")))
    if not found:
        raise EdgeLLMError(f"libedgellm is not built (no _libedgellm*.so in {here}): reinstall with `pip install .`")
    return Path(found[0])


def lib() -> C.CDLL:
    global _lib
    if _lib is None:
        L = C.CDLL(str(library_path()))
        for name, (res, args) in {**_SIGS, **_TOK_SIGS}.items():
            f = getattr(L, name)
            f.restype, f.argtypes = res, args
        _lib = L
    return _lib


def last_error() -> str:
    msg = lib().el_last_error()
    return msg.decode("utf-8", "replace") if msg else "unknown error in libedgellm"
