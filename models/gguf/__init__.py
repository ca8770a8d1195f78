"""GGUF in: a llama.cpp model file compiled like a Hugging Face checkpoint.

`sidecar(path)` turns the file into a checkpoint folder edgellm reads like any other — config.json and the tokenizer
rebuilt from the file's metadata, plus gguf.json pointing at the file — kept in the cache, keyed by the file's
path, size and time (built once: tens of seconds for a 262k vocabulary). `open_checkpoint(folder)` reads the weights
straight from the GGUF (models/gguf/checkpoint.py); nothing is copied."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from ...errors import ModelLoadError
from .file import GGUFFile, looks_like_gguf

FORMAT = 2           # bump when the sidecar's contents change
SOURCE = "gguf.json"


def is_gguf_file(p: Path) -> bool:
    return p.is_file() and (p.suffix.lower() == ".gguf" or looks_like_gguf(p))


def gguf_in_dir(d: Path) -> Path | None:
    """The one .gguf of a folder without config.json (several: an error naming them)."""
    if (d / "config.json").exists() or (d / SOURCE).exists():
        return None
    files = sorted(p for p in d.glob("*.gguf") if p.is_file())
    if len(files) > 1:
        raise ModelLoadError(f"{d} holds {len(files)} GGUF files ({', '.join(p.name for p in files[:4])}"
                             f"{', ...' if len(files) > 4 else ''}): pass the one to compile")
    return files[0] if files else None


def _sidecar_root() -> Path:
    # the root of edgellm's cache (compiler/cache_dir.py), which this layer may not import
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edgellm" / "gguf"


def sidecar(path: Path) -> Path:
    """The checkpoint folder standing for a GGUF file (built on first use)."""
    path = Path(path).resolve()
    st = path.stat()
    key = hashlib.sha256(f"{FORMAT}:{path}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    out = _sidecar_root() / f"{path.stem[:48]}-{key}"
    if (out / SOURCE).is_file():
        return out
    f = GGUFFile(path)
    from .archs import arch_of, config
    from .tokenizer import build

    cfg = config(f, arch_of(f))
    tok_json, tok_cfg = build(f)
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
        (tmp / "tokenizer.json").write_text(tok_json)
        (tmp / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=1))
        (tmp / SOURCE).write_text(json.dumps({"file": str(path), "size": st.st_size, "sha256": h.hexdigest(),
                                              "architecture": f.arch}, indent=1))
        try:
            os.replace(tmp, out)
        except OSError:   # another process built it first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def is_sidecar(d: Path) -> bool:
    return (d / SOURCE).is_file()


def open_checkpoint(d: Path, cfg: dict):
    """The GGUFCheckpoint of a sidecar folder."""
    from .archs import arch_of, names
    from .checkpoint import GGUFCheckpoint

    try:
        src = json.loads((d / SOURCE).read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{d / SOURCE} is unreadable ({e}); delete {d} and compile the GGUF file again") from e
    if not isinstance(src, dict):
        raise ModelLoadError(f"{d / SOURCE} is not a JSON object; delete {d} and compile the GGUF file again")
    path = Path(str(src.get("file")))
    if not path.is_file():
        raise ModelLoadError(f"{path} (the GGUF file {d.name} stands for) is gone; compile the file again")
    if path.stat().st_size != src.get("size"):
        raise ModelLoadError(f"{path} changed since {d} was made from it; compile the file again")
    f = GGUFFile(path)
    arch = arch_of(f)
    return GGUFCheckpoint(f, arch, cfg, names(f, arch, cfg), d)
