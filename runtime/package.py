"""The package contract on disk (shared by compiler and runtime): file names, format version, manifest checks."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import PackageError

FORMAT_VERSION = 1
MANIFEST, PLAN, WEIGHTS, KERNELS = "manifest.json", "plan.bin", "weights.bin", "kernels.so"
REQUIRED_FILES = (MANIFEST, PLAN, WEIGHTS, KERNELS)
ALIGN = 16 * 1024  # every weight region starts on a 16 KiB boundary (Android page size; x86's 4 KiB divides it)


def read_manifest(path: str | Path) -> dict:
    """Checks that `path` is a package of this format version and returns its manifest."""
    p = Path(path)
    if not p.is_dir():
        raise PackageError(f"{p} is not a package directory: compile one with `edgellm compile MODEL -o {p}`")
    mf = p / MANIFEST
    if not mf.is_file():
        raise PackageError(f"{p} has no {MANIFEST}: not an edgellm package (compile one with `edgellm compile`)")
    try:
        m = json.loads(mf.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PackageError(f"{mf} is corrupt ({e}): recompile the package") from e
    v = m.get("format_version")
    if v != FORMAT_VERSION:
        raise PackageError(f"{p} has package format version {v}, this edgellm reads {FORMAT_VERSION}: "
                           "recompile the package with this edgellm")
    for f in REQUIRED_FILES:
        if not (p / f).is_file():
            raise PackageError(f"{p} is incomplete: {f} is missing; recompile or copy the whole package again")
    return m


def verify_checksums(path: str | Path, manifest: dict) -> None:
    """sha256 of every tensor region in weights.bin against the manifest (catches corruption, not only truncation)."""
    import hashlib

    import numpy as np

    wb = Path(path) / WEIGHTS
    mm = np.memmap(wb, dtype=np.uint8, mode="r")
    for t in manifest["tensors"]:
        o, n = t["offset"], t["nbytes"]
        if o + n > mm.size or hashlib.sha256(mm[o:o + n]).hexdigest() != t["sha256"]:
            raise PackageError(f"{wb} is corrupt: tensor {t['name']} fails its checksum; recompile or copy again")


SAMPLING_KEYS = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "repetition_penalty": 1.0}


def sampling_defaults(package, given: dict) -> tuple[dict, str]:
    """Sampling settings for `edgellm run`: the values given on the command line, else those of the package's
    generation_config.json when it says do_sample (as transformers' generate() does), else greedy. Returns the
    settings and a short description of where they came from."""
    cfg = {}
    f = Path(package) / "generation_config.json"
    if f.is_file():
        try:
            cfg = json.loads(f.read_text())
        except (OSError, ValueError):
            cfg = {}
    out = dict(SAMPLING_KEYS)
    from_cfg = []
    if cfg.get("do_sample"):
        for k in out:
            if cfg.get(k) is not None:
                out[k] = type(out[k])(cfg[k])
                from_cfg.append(k)
    out.update({k: v for k, v in given.items() if v is not None})
    from_cfg = [k for k in from_cfg if given.get(k) is None]
    if out["temperature"] <= 0:
        return out, "greedy"
    desc = ", ".join(f"{k.replace('_', '-')} {out[k]:g}" for k in out if out[k] != SAMPLING_KEYS[k])
    return out, f"sampling: {desc}" + (" (generation_config.json)" if from_cfg else "")
