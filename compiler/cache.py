"""Packages compiled on demand (`edgellm run --model`, `edgellm eval`), kept in the user's cache directory.

A cache hit imports nothing from TVM; only a miss loads the compiler."""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from ..runtime.contract import MANIFEST
from .cache_dir import cache_root


CONTENT_SUFFIXES = (".json", ".safetensors", ".bin", ".model", ".gguf", ".jinja", ".txt")   # what a compile reads
_DIGESTS = "digests.json"   # (path, size, mtime) -> sha256 of the file: each file is hashed once, not every run


def packages_root() -> Path:
    return cache_root() / "packages"


def _file_digest(f: Path, memo: dict) -> str:
    st = f.stat()
    key = f"{f.resolve()}:{st.st_size}:{st.st_mtime_ns}"
    if key not in memo:
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
        memo[key] = h.hexdigest()
    return memo[key]


def content_digest(model_dir: Path) -> str:
    """Identity of a checkpoint's contents: every config, tokenizer and weight file's name and sha256 (memoized per
    path, size and mtime in the cache, so a large checkpoint is hashed once). The same files reached by another path,
    or reinstalled with new times, give the same digest."""
    import json

    memo_path = cache_root() / _DIGESTS
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}
    n = len(memo)
    h = hashlib.sha256()
    for f in sorted(model_dir.iterdir()):
        if f.suffix in CONTENT_SUFFIXES and f.is_file():
            h.update(f"{f.name}:{_file_digest(f, memo)}\n".encode())
    if len(memo) != n:
        try:
            memo_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = memo_path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(memo))
            os.replace(tmp, memo_path)
        except OSError:
            pass   # a read-only cache: hash again next time
    return h.hexdigest()


def cache_key(model_dir: Path, quant: str | None, target: str) -> str:
    """The cached package's name: the checkpoint's content, the options and the edgellm version."""
    import json

    from .. import __version__

    try:   # a readable prefix that comes from the content too (the folder's name would not)
        kind = str(json.loads((model_dir / "config.json").read_text()).get("model_type") or "model")
    except (OSError, ValueError, AttributeError):
        kind = "model"
    kind = "".join(c for c in kind if c.isalnum() or c in "_.")[:32] or "model"
    return f"{kind}-{quant or 'auto'}-{target}-{content_digest(model_dir)[:12]}-v{__version__}"


def cached_package(model: str, quant: str | None = None, target: str = "host", progress: bool = True) -> Path:
    """The package of `model` for target/quant, compiled into the cache on first use."""
    from ..models.checkpoint import resolve_model_dir

    d = resolve_model_dir(model)
    pkg = packages_root() / cache_key(d, quant, target)
    if (pkg / MANIFEST).is_file():
        _touch(pkg)
        return pkg
    if progress:
        print(f"first use of {model}: compiling it into {pkg} (cached for next time)", file=sys.stderr, flush=True)
    from .driver import compile_model

    out = compile_model(str(d), target=target, quant=quant, out=pkg, progress=progress)
    _touch(pkg, source=model if not Path(model).exists() else str(Path(model).resolve()))
    return out


def _meta(pkg: Path) -> Path:
    """Beside the package, not in it (a package holds only the files its SHA256SUMS lists): what it was compiled
    from; the file's mtime is when it was last used."""
    return pkg.with_name(pkg.name + ".meta.json")


def _touch(pkg: Path, source: str | None = None) -> None:
    import json

    m = _meta(pkg)
    try:
        if source is not None or not m.is_file():
            m.write_text(json.dumps({"source": source}))
        else:
            os.utime(m)
    except OSError:
        pass   # a read-only cache: no bookkeeping


def cached_packages() -> list[dict]:
    """Every package in the cache: {name, path, source, target, scheme, bytes, last_used (epoch s)}."""
    import json

    out = []
    root = packages_root()
    for d in sorted(root.iterdir()) if root.is_dir() else ():
        if not (d.is_dir() and (d / MANIFEST).is_file()):
            continue
        try:
            man = json.loads((d / MANIFEST).read_text())
        except (OSError, ValueError):
            man = {}
        meta = _meta(d)
        try:
            source = json.loads(meta.read_text()).get("source")
            used = meta.stat().st_mtime
        except (OSError, ValueError, AttributeError):
            source, used = None, (d / MANIFEST).stat().st_mtime
        size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file() and not f.is_symlink())
        out.append({"name": d.name, "path": str(d), "source": source,
                    "target": (man.get("target") or {}).get("name"), "scheme": (man.get("quant") or {}).get("scheme"),
                    "bytes": size, "last_used": used})
    return out


def remove_cached(name: str) -> int:
    """Deletes one cached package (by its name in `edgellm cache list`); returns the bytes freed. Only a package
    directory directly under the cache's packages/ folder is ever removed."""
    import shutil

    from ..errors import InputError

    hit = [p for p in cached_packages() if p["name"] == name]
    if not hit or "/" in name or name in (".", ".."):
        raise InputError(f"no cached package named {name!r} (see `edgellm cache list`)")
    d = packages_root() / name
    shutil.rmtree(d)
    _meta(d).unlink(missing_ok=True)
    return hit[0]["bytes"]


def package_or_model(arg: str, quant: str | None = None, target: str = "host", progress: bool = True) -> Path:
    """A package directory as is; anything else (checkpoint dir, hub id, demo name) through the cache."""
    p = Path(arg)
    if (p / MANIFEST).is_file():
        return p
    return cached_package(arg, quant, target, progress)
