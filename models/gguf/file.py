"""One GGUF file (llama.cpp's format) read through the `gguf` package: metadata values and tensor records, every
failure one ModelLoadError line."""
from __future__ import annotations

from pathlib import Path

from ...errors import ModelLoadError, short_repr

MAGIC = b"GGUF"


def looks_like_gguf(path: Path) -> bool:
    """A regular file that starts with the GGUF magic."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


class GGUFFile:
    def __init__(self, path: Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelLoadError(f"{self.path} is {'missing' if not self.path.exists() else 'not a regular file'}")
        if not looks_like_gguf(self.path):
            raise ModelLoadError(f"{self.path} is not a GGUF file (it does not start with 'GGUF')")
        try:
            import gguf
        except ImportError as e:  # pragma: no cover - a dependency of the package
            raise ModelLoadError(f"reading GGUF needs the gguf package ({e}); pip install gguf") from e
        try:
            self._reader = gguf.GGUFReader(str(self.path))
        except Exception as e:   # the reader raises ValueError, struct.error, IndexError... on a damaged file
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ModelLoadError(f"{self.path} is truncated or corrupt ({type(e).__name__}: {msg}); "
                                 "re-download the file") from e
        self.tensors = {t.name: t for t in self._reader.tensors}
        self.arch = self.get("general.architecture", None)
        if not isinstance(self.arch, str):
            raise ModelLoadError(f"{self.path} names no general.architecture: cannot tell which model this is")

    def get(self, key: str, default=...):
        """A metadata value (strings, numbers, bools and lists of them); `default` when absent, else an error."""
        f = self._reader.fields.get(key)
        if f is None:
            if default is ...:
                raise ModelLoadError(f"{self.path}: metadata {key} is missing; re-convert the model")
            return default
        try:
            return f.contents()
        except Exception as e:
            raise ModelLoadError(f"{self.path}: metadata {key} cannot be read ({type(e).__name__}); "
                                 "re-download the file") from e

    def arch_get(self, key: str, default=...):
        """`{general.architecture}.{key}`."""
        return self.get(f"{self.arch}.{key}", default)

    def number(self, key: str, default=..., kind=int):
        v = self.arch_get(key, default)
        if v is None or v is default:
            return v
        if isinstance(v, list) or isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ModelLoadError(f"{self.path}: metadata {self.arch}.{key} must be a number, got {short_repr(v)}")
        return kind(v)
