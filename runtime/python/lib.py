"""ctypes binding of libedgellm (runtime/edgellm.h). Loading it never imports TVM.

The structs below mirror edgellm.h; tests/test_contract.py compiles the header and checks their sizes and offsets."""
from __future__ import annotations

import ctypes as C
import glob
import os
import warnings
from pathlib import Path

from ...errors import EdgeLLMError


class LoadOptions(C.Structure):
    _fields_ = [("n_threads", C.c_int32), ("huge_pages", C.c_int32), ("use_mmap", C.c_int32),
                ("prefill_backend", C.c_int32), ("memory_budget", C.c_uint64), ("weight_policy", C.c_char_p),
                ("digest", C.c_char_p), ("storage", C.c_char_p), ("io_threads", C.c_int32),
                ("direct_io", C.c_int32), ("plan_only", C.c_int32), ("ffn_threshold", C.c_float),
                ("expert_eviction", C.c_char_p), ("expert_predict", C.c_int32), ("no_expert_warm", C.c_int32),
                ("backend_options", C.c_char_p)]


class MemoryPlan(C.Structure):
    _fields_ = [("policy", C.c_char * 16), ("storage", C.c_char * 16), ("storage_what", C.c_char * 96),
                ("budget", C.c_uint64), ("context_bytes", C.c_uint64), ("weights_bytes", C.c_uint64),
                ("pinned_bytes", C.c_uint64), ("window_bytes", C.c_uint64), ("cache_bytes", C.c_uint64),
                ("mapped_bytes", C.c_uint64), ("streamed_bytes", C.c_uint64),
                ("minimum_budget", C.c_uint64), ("pinned_weights", C.c_uint32), ("streamed_weights", C.c_uint32),
                ("requests_per_token", C.c_uint32), ("storage_modelled", C.c_int32), ("direct_io", C.c_int32),
                ("reserved", C.c_int32), ("storage_bytes_per_s", C.c_double), ("storage_latency_s", C.c_double),
                ("routed_bytes", C.c_uint64), ("routed_cache_bytes", C.c_uint64)]


PREFILL_BACKENDS = {"auto": 0, "cpu": 1, "npu": 2}   # EL_PREFILL_*


class GenParams(C.Structure):
    _fields_ = [("max_new_tokens", C.c_int32), ("temperature", C.c_float), ("top_k", C.c_int32), ("top_p", C.c_float),
                ("min_p", C.c_float), ("repetition_penalty", C.c_float), ("presence_penalty", C.c_float),
                ("frequency_penalty", C.c_float), ("seed", C.c_uint64), ("ignore_eos", C.c_int32),
                ("keep_context", C.c_int32), ("n_stop_ids", C.c_int32), ("stop_ids", C.POINTER(C.c_int32)),
                ("n_stop_strings", C.c_int32), ("stop_strings", C.POINTER(C.c_char_p)), ("n_cached", C.c_int32),
                ("speculate", C.c_int32), ("draft_max", C.c_int32), ("draft", C.c_void_p),
                ("context_shift", C.c_int32), ("shift_sinks", C.c_int32), ("shift_tokens", C.c_int32),
                ("constraint", C.c_void_p)]


class Event(C.Structure):
    _fields_ = [("token", C.c_int32), ("finish", C.c_int32), ("text", C.c_void_p), ("text_len", C.c_int32),
                ("logits", C.POINTER(C.c_float))]


class GenResult(C.Structure):
    _fields_ = [("prompt_tokens", C.c_int32), ("generated_tokens", C.c_int32), ("finish", C.c_int32),
                ("prefill_seconds", C.c_double), ("decode_seconds", C.c_double), ("ttft_seconds", C.c_double),
                ("decoded_tokens", C.c_int32)]


class SamplerParams(C.Structure):
    _fields_ = [("temperature", C.c_float), ("top_k", C.c_int32), ("top_p", C.c_float), ("min_p", C.c_float),
                ("repetition_penalty", C.c_float), ("presence_penalty", C.c_float),
                ("frequency_penalty", C.c_float), ("seed", C.c_uint64)]


class Stats(C.Structure):
    _fields_ = [("weight_bytes_resident", C.c_uint64), ("weight_bytes_huge", C.c_uint64),
                ("kernel_calls", C.c_uint64), ("prefill_seconds", C.c_double), ("decode_seconds", C.c_double),
                ("prefill_tokens", C.c_uint64), ("decode_tokens", C.c_uint64), ("kv_bytes", C.c_uint64),
                ("arena_bytes", C.c_uint64), ("context_bytes", C.c_uint64), ("io_bytes_read", C.c_uint64),
                ("io_requests", C.c_uint64), ("io_hits", C.c_uint64), ("io_misses", C.c_uint64),
                ("io_dropped", C.c_uint64), ("io_stall_seconds", C.c_double), ("routed_selected", C.c_uint64),
                ("routed_possible", C.c_uint64), ("io_routed_hits", C.c_uint64), ("io_routed_misses", C.c_uint64),
                ("weight_bytes_read", C.c_uint64), ("decode_weight_bytes_read", C.c_uint64),
                ("expert_predict_checked", C.c_uint64), ("expert_predicted", C.c_uint64),
                ("expert_selected", C.c_uint64), ("expert_cached", C.c_uint64), ("expert_prefetched", C.c_uint64),
                ("expert_stalls", C.c_uint64), ("expert_predict_reads", C.c_uint64),
                ("expert_predict_wasted", C.c_uint64), ("decode_io_bytes_read", C.c_uint64),
                ("decode_io_stall_seconds", C.c_double), ("kv_window_moves", C.c_uint64),
                ("spec_passes", C.c_uint64), ("spec_drafted", C.c_uint64), ("spec_accepted", C.c_uint64),
                ("context_shifts", C.c_uint64), ("shift_tokens_run", C.c_uint64),
                ("spec_drafted_model", C.c_uint64), ("spec_accepted_model", C.c_uint64),
                ("spec_accepted_branch", C.c_uint64)]


FINISH = {0: None, 1: "eos", 2: "stop", 3: "length", 4: "context", 5: "cancelled"}
STRUCTS = {"el_load_options": LoadOptions, "el_gen_params": GenParams, "el_event": Event,
           "el_gen_result": GenResult, "el_sampler_params": SamplerParams, "el_stats": Stats,
           "el_memory_plan": MemoryPlan}

P, I32P, F32P = C.c_void_p, C.POINTER(C.c_int32), C.POINTER(C.c_float)
# el_draft_filter: (user, ids, parents, n, keep) -> 0
DraftFilter = C.CFUNCTYPE(C.c_int, C.c_void_p, I32P, I32P, C.c_int, C.POINTER(C.c_uint8))
_SIGS = {
    "el_last_error": (C.c_char_p, []),
    "el_version": (C.c_char_p, []),
    # the backend registry (edgellm_backend.h): an el_backend* is opaque here
    "el_backend_find": (C.c_void_p, [C.c_char_p]),
    "el_backend_register": (C.c_int, [C.c_void_p]),
    "el_program_name": (C.c_char_p, [C.c_int]),
    "el_load_options_init": (None, [C.POINTER(LoadOptions)]),
    "el_parse_bytes": (C.c_int, [C.c_char_p, C.POINTER(C.c_uint64)]),
    "el_backend_options_add": (C.c_int, [C.c_char_p, C.c_size_t, C.c_char_p, C.c_char_p, C.c_char_p]),
    "el_backend_option": (C.c_char_p, [P, C.c_char_p, C.c_char_p]),
    "el_model_load": (P, [C.c_char_p, C.POINTER(LoadOptions)]),
    "el_model_free": (None, [P]),
    "el_vocab": (C.c_int, [P]),
    "el_max_context": (C.c_int, [P]),
    "el_chunk": (C.c_int, [P]),
    "el_verify_width": (C.c_int, [P]),
    "el_draft_check": (C.c_int, [P, P]),
    "el_constraint_load": (P, [C.c_char_p]),
    "el_constraint_free": (None, [P]),
    "el_model_threads": (C.c_int, [P]),
    "el_bos_id": (C.c_int, [P]),
    "el_eos_ids": (C.c_int, [P, I32P, C.c_int]),
    "el_has_tokenizer": (C.c_int, [P]),
    "el_model_prefill_backend": (C.c_int, [P, C.c_char_p, C.c_int]),
    "el_model_device": (C.c_int, [P, C.c_char_p, C.c_int]),
    "el_model_forget_drafts": (None, [P]),
    "el_model_memory": (C.c_int, [P, C.POINTER(MemoryPlan)]),
    "el_model_weights_pinned": (C.c_int, [P, C.POINTER(C.c_uint8), C.c_int]),
    "el_encode": (C.c_int, [P, C.c_char_p, C.c_int, C.c_int, I32P, C.c_int]),
    "el_token_text": (C.c_int, [P, C.c_int32, C.c_char_p, C.c_int]),
    "el_context_new": (P, [P, C.c_int]),
    "el_context_free": (None, [P]),
    "el_context_threads": (C.c_int, [P]),
    "el_pos": (C.c_int, [P]),
    "el_reset": (C.c_int, [P]),
    "el_rewind": (C.c_int, [P, C.c_int]),
    "el_rewind_floor": (C.c_int, [P]),
    "el_context_save": (C.c_int, [P, C.c_char_p, C.c_int]),
    "el_context_load": (C.c_int, [P, C.c_char_p]),
    "el_context_tokens": (C.c_int, [P, I32P, C.c_int]),
    "el_prefill": (C.c_int, [P, I32P, C.c_int, F32P, C.c_int]),
    "el_decode": (C.c_int, [P, C.c_int32, F32P]),
    "el_verify": (C.c_int, [P, I32P, C.c_int, F32P]),
    "el_verify_take": (C.c_int, [P, C.c_int]),
    "el_verify_tree": (C.c_int, [P, I32P, I32P, C.c_int, F32P]),
    "el_verify_take_node": (C.c_int, [P, C.c_int]),
    "el_verify_node": (C.c_int, [P]),
    "el_generate_constrain": (C.c_int, [P, C.POINTER(C.c_uint32), C.c_int]),
    "el_generate_filter_drafts": (C.c_int, [P, C.c_void_p, C.c_void_p]),
    "el_gen_params_default": (None, [P, C.POINTER(GenParams)]),
    "el_generate_start": (C.c_int, [P, I32P, C.c_int, C.POINTER(GenParams)]),
    "el_generate_next": (C.c_int, [P, C.POINTER(Event)]),
    "el_generate_result": (None, [P, C.POINTER(GenResult)]),
    "el_sampler_new": (P, [C.POINTER(SamplerParams)]),
    "el_sampler_free": (None, [P]),
    "el_sample": (C.c_int32, [P, F32P, C.c_int, I32P, C.c_int, C.c_int]),
    "el_get_stats": (None, [P, C.POINTER(Stats)]),
    "el_reset_stats": (None, [P]),
}

# runtime/tokenizer/tokenizer.h (the C tokenizer on its own, for tests and for checking a package's tokenizer.bin)
_TOK_SIGS = {
    "el_tok_load": (P, [C.c_char_p]),
    "el_tok_free": (None, [P]),
    "el_tok_encode": (C.c_int, [P, C.c_char_p, C.c_int, C.c_int, I32P, C.c_int]),
    "el_tok_decode": (C.c_int, [P, C.c_int32, C.c_char_p, C.c_int]),
    "el_tok_bos": (C.c_int, [P]),
    "el_tok_n_vocab": (C.c_int, [P]),
    "el_tok_is_special": (C.c_int, [P, C.c_int32]),
}

_lib = None


def library_path() -> Path:
    env = os.environ.get("EDGELLM_LIB")
    if env:
        return Path(env)
    here = Path(__file__).parent.parent   # the extension is built into edgellm/runtime/
    found = sorted(glob.glob(str(here / "_libedgellm*.so")))
    if not found:
        raise EdgeLLMError(f"libedgellm is not built (no _libedgellm*.so in {here}): reinstall with `pip install .`")
    return Path(found[0])


# What setuptools compiles into libedgellm (pyproject's ext-module: these folders' C files and the headers they take).
_LIB_SOURCES = ("runtime/*.h", "runtime/core/*.[ch]", "runtime/backends/*.[ch]", "runtime/tokenizer/*.[ch]",
                "offload/*.[ch]")


def stale_sources(so: Path, root: Path) -> list[Path]:
    """The sources of libedgellm under `root` newer than `so`, when `root` is a git checkout (an editable install):
    there a C edit takes effect only after `pip install -e .`, and a stale library runs the old code silently.
    Never in an installed wheel, whose files all carry the install's times."""
    if not (root / ".git").exists():
        return []
    built = so.stat().st_mtime
    return sorted(f for pat in _LIB_SOURCES for f in root.glob(pat) if f.stat().st_mtime > built)


def declare(L: C.CDLL) -> C.CDLL:
    for name, (res, args) in {**_SIGS, **_TOK_SIGS}.items():
        f = getattr(L, name)
        f.restype, f.argtypes = res, args
    return L


def lib() -> C.CDLL:
    global _lib
    if _lib is None:
        path = library_path()
        newer = [] if os.environ.get("EDGELLM_LIB") else stale_sources(path, path.parent.parent)
        if newer:
            warnings.warn(f"{path.name} is older than {newer[0].relative_to(path.parent.parent)}"
                          f"{f' and {len(newer) - 1} more sources' if len(newer) > 1 else ''}: it runs the code of "
                          "its last build; rebuild it with `pip install -e .`", stacklevel=2)
        _lib = declare(C.CDLL(str(path)))
    return _lib


def last_error() -> str:
    msg = lib().el_last_error()
    return msg.decode("utf-8", "replace") if msg else "unknown error in libedgellm"
