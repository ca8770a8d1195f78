"""A package on disk, as the runtime sees it: the manifest (checked field by field), the integrity checks
(SHA256SUMS, package digests) and byte sizes given by users ("600MB"). File names and versions: runtime/contract.py."""
from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

from ...errors import InputError, PackageError
from ..contract import (FORMAT_VERSION, KERNELS, MANIFEST, OPENCL_CACHE_DIR, OPENCL_SOURCE, OPENCL_TABLE, REQUIRED_FILES,
                       SUMS, file_sha256)

# What the runtime and `edgellm info` read from manifest.json, with the type each must have.
_MANIFEST_FIELDS = {
    "format_version": int, "edgellm_version": str, "model": dict, "target": dict, "quant": dict,
    "max_context": int, "prefill_chunk": int, "kv_rows": int, "files": dict, "weights_bytes": int,
    "arena_bytes": int, "kernels": list, "tensors": list,
}
_CONFIG_INTS = ("n_layers", "hidden_size", "n_heads", "n_kv_heads", "head_dim", "intermediate_size", "vocab_size")
_TENSOR_FIELDS = {"name": str, "offset": int, "nbytes": int, "shape": list, "dtype": str, "sha256": str}


def _corrupt(path: Path, what: str) -> PackageError:
    return PackageError(f"{path / MANIFEST} is corrupt ({what}): recompile the package")


def _check_manifest(p: Path, m) -> dict:
    if not isinstance(m, dict):
        raise _corrupt(p, "not a JSON object")
    for k, t in _MANIFEST_FIELDS.items():
        v = m.get(k)
        if not isinstance(v, t) or isinstance(v, bool):
            raise _corrupt(p, f"'{k}' is missing or not a {t.__name__}")
    cfg = m["model"].get("config")
    if not isinstance(cfg, dict) or not isinstance(m["model"].get("arch"), str):
        raise _corrupt(p, "'model' lacks its arch or config")
    for k in _CONFIG_INTS:
        if not isinstance(cfg.get(k), int) or isinstance(cfg.get(k), bool) or cfg[k] < 1:
            raise _corrupt(p, f"model config '{k}' is not a positive integer")
    t = m["target"]
    if not isinstance(t.get("name"), str) or not isinstance(t.get("arch"), str) or \
            not isinstance(t.get("features"), list) or not all(isinstance(f, str) for f in t["features"]):
        raise _corrupt(p, "'target' lacks its name, arch or features")
    q = m["quant"]
    if not isinstance(q.get("scheme"), str) or not isinstance(q.get("bits_per_weight"), (int, float)):
        raise _corrupt(p, "'quant' lacks its scheme or bits_per_weight")
    for k in ("max_context", "prefill_chunk", "kv_rows"):
        if m[k] < 1:
            raise _corrupt(p, f"'{k}' is {m[k]}")
    for i, tensor in enumerate(m["tensors"]):
        if not isinstance(tensor, dict) or any(not isinstance(tensor.get(k), ty) or isinstance(tensor.get(k), bool)
                                               for k, ty in _TENSOR_FIELDS.items()):
            raise _corrupt(p, f"tensor entry {i} is malformed")
        if tensor["offset"] < 0 or tensor["nbytes"] < 0 or not all(isinstance(d, int) and d >= 0 for d in tensor["shape"]):
            raise _corrupt(p, f"tensor {tensor['name']!r} has a negative offset, size or shape")
    if not all(isinstance(k, str) for k in m["kernels"]):
        raise _corrupt(p, "'kernels' is not a list of names")
    tok = m["files"].get("tokenizer")
    if tok is not None and tok != "tokenizer.json":
        raise _corrupt(p, f"files.tokenizer is {tok!r}")
    return m


def read_manifest(path: str | Path) -> dict:
    """Checks that `path` is a package of this format version and returns its manifest (every field the runtime or
    `edgellm info` reads is checked for presence and type)."""
    p = Path(path)
    if not p.is_dir():
        raise PackageError(f"{p} is not a package directory: compile one with `edgellm compile MODEL -o {p}`")
    mf = p / MANIFEST
    if not mf.is_file():   # also refuses a FIFO, which would block a read
        raise PackageError(f"{p} has no {MANIFEST}: not an edgellm package (compile one with `edgellm compile`)")
    try:
        m = json.loads(mf.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise PackageError(f"{mf} is corrupt ({str(e).splitlines()[0][:120] if str(e) else type(e).__name__}): "
                           "recompile the package") from e
    if not isinstance(m, dict):
        raise _corrupt(p, "not a JSON object")
    v = m.get("format_version")
    if v != FORMAT_VERSION:
        raise PackageError(f"{p} has package format version {v}, this edgellm reads {FORMAT_VERSION}: recompile the "
                           "package with this edgellm")
    _check_manifest(p, m)
    files = m.get("files") if isinstance(m.get("files"), dict) else {}
    kernels = (OPENCL_SOURCE, OPENCL_TABLE) if "opencl" in files else (KERNELS,)
    for f in (*REQUIRED_FILES, *kernels):
        if not (p / f).is_file():
            raise PackageError(f"{p} is incomplete: {f} is missing; recompile or copy the whole package again")
    return m


# Integrity ----------------------------------------------------------------------------------------------------------

def read_sums(path: str | Path) -> tuple[bytes, dict[str, str]]:
    """SHA256SUMS of a package: its bytes and {relative path: sha256 hex}."""
    f = Path(path) / SUMS
    if not f.is_file():
        raise PackageError(f"{path} has no {SUMS}, so it cannot be verified: recompile it with this edgellm")
    data = f.read_bytes()
    out = {}
    for line in data.decode("utf-8", "replace").splitlines():
        mt = re.fullmatch(r"([0-9a-f]{64})  (\S.*)", line)
        rel = mt.group(2) if mt else ""
        if not mt or rel.startswith("/") or any(part in ("", ".", "..") for part in rel.split("/")):
            raise PackageError(f"{f} has a malformed line {line[:80]!r}: recompile the package")
        out[rel] = mt.group(1)
    return data, out


def package_digest(path: str | Path) -> str:
    """The package digest `edgellm compile` prints: sha256 of SHA256SUMS."""
    data, _ = read_sums(path)
    return "sha256:" + hashlib.sha256(data).hexdigest()


def check_digest_form(digest) -> None:
    if not isinstance(digest, str) or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise InputError(f"digest {str(digest)[:80]!r} is not of the form sha256:<64 lowercase hex digits> (as "
                         "`edgellm compile` prints it)")


def verify_package(path: str | Path, digest: str | None = None, only: list[str] | None = None) -> None:
    """Every file of the package against SHA256SUMS (catches corruption and modified files), and SHA256SUMS against
    `digest` when given (then nothing can have been changed: plan, kernels, runner, tokenizer, manifest). Every file
    of the package must be listed. only: check just these files (they must be listed)."""
    p = Path(path)
    data, sums = read_sums(p)
    if digest is not None:
        check_digest_form(digest)
        got = "sha256:" + hashlib.sha256(data).hexdigest()
        if got != digest:
            raise PackageError(f"package digest mismatch: {p} is {got}, expected {digest}; the package was modified "
                               "or is not the one you pinned: do not run it")
    # opencl-cache/: program binaries the OpenCL backend writes beside a GPU package at first load (never run by a
    # digest-pinned load, which builds from the listed source)
    present = sorted(f.relative_to(p).as_posix() for f in p.rglob("*") if f.name != SUMS and
                     (f.is_file() or not f.is_dir()) and f.relative_to(p).parts[0] != OPENCL_CACHE_DIR)
    unlisted = [f for f in present if f not in sums]
    if unlisted:
        raise PackageError(f"{p} holds {unlisted[0]}, which {SUMS} does not list: the package was modified; "
                           "recompile or copy it again")
    for rel in (only if only is not None else sums):
        if rel not in sums:
            raise PackageError(f"{SUMS} does not list {rel}: the package was modified; recompile it")
        f = p / rel
        if not f.is_file():
            raise PackageError(f"{p} is incomplete: {rel} is missing or not a regular file; recompile or copy it again")
        if file_sha256(f) != sums[rel]:
            raise PackageError(f"{p / rel} does not match its digest in {SUMS}: the package is corrupt or was "
                               "modified; recompile or copy it again")


# Sizes ---------------------------------------------------------------------------------------------------------------

def parse_bytes(v, what: str = "memory_budget") -> int:
    """600000000, "600MB" (10^6), "600MiB" / "600M" (2^20), "1.5G" -> bytes. Strings go through libedgellm's
    el_parse_bytes, the one reader of sizes (bin/edgellm-run's too): the same spelling is the same bytes everywhere."""
    if isinstance(v, bool):
        raise InputError(f"{what}={v!r} is not a size: give bytes or a string like '600MB'")
    if isinstance(v, str):
        import ctypes as C

        from .lib import last_error, lib

        out = C.c_uint64()
        if lib().el_parse_bytes(v.encode("utf-8", "replace"), C.byref(out)):
            raise InputError(f"{what}: {last_error()}")
        return int(out.value)
    if isinstance(v, int):
        n = v
    elif isinstance(v, float) and math.isfinite(v):
        n = int(v)
    else:
        raise InputError(f"{what}={v!r} is not a size: give bytes or a string like '600MB' or '2GiB'")
    if n <= 0:
        raise InputError(f"{what}={v!r} is out of range: it must be more than 0 bytes")
    if n > 2**62:
        raise InputError(f"{what}={v!r} is out of range: at most 4 EiB (2^62 bytes)")
    return n
