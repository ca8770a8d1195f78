"""Packages compiled on demand (`edgellm run --model`, `edgellm eval`), kept in the user's cache directory.

A cache hit imports nothing from TVM; only a miss loads the compiler."""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from ..runtime.contract import MANIFEST


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgellm"


def _fingerprint(model_dir: Path) -> str:
    """Identity of a checkpoint's contents: config + weight files' names, sizes and mtimes."""
    h = hashlib.sha256()
    for f in sorted(model_dir.iterdir()):
        if f.suffix in (".json", ".safetensors") and f.is_file():
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{int(st.st_mtime)}".encode())
    return h.hexdigest()[:10]


def cached_package(model: str, quant: str | None = None, target: str = "host", progress: bool = True) -> Path:
    """The package of `model` for target/quant, compiled into the cache on first use."""
    from .. import __version__
    from ..models.checkpoint import resolve_model_dir

    d = resolve_model_dir(model)
    key = f"{d.name}-{quant or 'auto'}-{target}-{_fingerprint(d)}-v{__version__}"
    pkg = cache_root() / key
    if (pkg / MANIFEST).is_file():
        return pkg
    if progress:
        print(f"first use of {model}: compiling it into {pkg} (cached for next time)", file=sys.stderr, flush=True)
    from .driver import compile_model

    return compile_model(str(d), target=target, quant=quant, out=pkg, progress=progress)


def package_or_model(arg: str, quant: str | None = None, target: str = "host", progress: bool = True) -> Path:
    """A package directory as is; anything else (checkpoint dir, hub id, demo name) through the cache."""
    p = Path(arg)
    if (p / MANIFEST).is_file():
        return p
    return cached_package(arg, quant, target, progress)
