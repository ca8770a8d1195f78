"""The user's edgellm cache directory ($XDG_CACHE_HOME/edgellm, else ~/.cache/edgellm): compiled packages
(compiler/cache.py), device objects (compiler/device_binary.py), tuning records (compiler/tune/cache.py)."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgellm"
