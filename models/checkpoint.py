"""Read a Hugging Face checkpoint: resolve a local dir or hub id, parse config.json, open safetensors lazily.

The safetensors reader is ours (a JSON header + raw bytes, mmapped) because numpy cannot represent bf16 and we
want truncation reported before any work starts."""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np

from ..errors import ModelLoadError

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64,
              "I8": np.int8, "U8": np.uint8, "I32": np.int32, "I64": np.int64, "I16": np.int16}
_HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.txt"]


def resolve_model_dir(model: str | os.PathLike) -> Path:
    """A local directory as is; otherwise a hub id fetched (or found in the cache) through huggingface-hub."""
    p = Path(model).expanduser()
    if p.is_dir():
        return p
    from .demo import demo_path

    if (d := demo_path(str(model))) is not None:
        return d
    if p.exists():
        raise ModelLoadError(f"{p} is a file; pass the checkpoint directory that holds config.json")
    s = str(model)
    if s.count("/") != 1 or s.startswith((".", "/", "~")):
        raise ModelLoadError(f"model '{s}' is neither a local directory nor a Hugging Face id (owner/name)")
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError
    except ImportError as e:  # pragma: no cover - dependency of the package
        raise ModelLoadError(f"huggingface-hub is not installed ({e}); pip install huggingface-hub") from e
    try:
        return Path(snapshot_download(s, allow_patterns=_HUB_PATTERNS))
    except LocalEntryNotFoundError as e:
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
        why = "HF_HUB_OFFLINE is set" if offline else "the Hub cannot be reached"
        raise ModelLoadError(f"'{s}' is not in the Hugging Face cache and {why}: download it where there is network "
                             "(huggingface-cli download) or pass a local directory") from e
    except RepositoryNotFoundError as e:
        raise ModelLoadError(f"'{s}' does not exist on the Hugging Face Hub (or needs a token: huggingface-cli login)") from e
    except Exception as e:  # network errors come in many types
        raise ModelLoadError(f"could not fetch '{s}' from the Hugging Face Hub: {type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}; pass a local directory instead") from e


def read_config(model_dir: Path) -> dict:
    path = model_dir / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing: a Hugging Face checkpoint directory needs config.json")
    try:
        cfg = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{path} is not valid JSON ({e}); re-download or re-export the checkpoint") from e
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"{path} is not a JSON object; re-download or re-export the checkpoint")
    gen = model_dir / "generation_config.json"
    if gen.is_file():  # generation_config's eos list (e.g. Llama 3 instruct) wins over config.json's
        try:
            g = json.loads(gen.read_text())
            if g.get("eos_token_id") is not None:
                cfg = {**cfg, "eos_token_id": g["eos_token_id"]}
        except json.JSONDecodeError:
            pass
    return cfg


class SafetensorsFile:
    """One .safetensors file: header parsed eagerly (and checked against the file size), tensors mmapped on demand."""

    def __init__(self, path: Path):
        self.path = path
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ModelLoadError(f"{path} is truncated ({size} bytes): re-download the checkpoint")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8 or n > 100 << 20:
                raise ModelLoadError(f"{path} has a corrupt header: re-download the checkpoint")
            try:
                header = json.loads(f.read(n))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ModelLoadError(f"{path} has a corrupt header ({e}): re-download the checkpoint") from e
        self.data_start = 8 + n
        header.pop("__metadata__", None)
        self.entries = header
        end = max((e["data_offsets"][1] for e in header.values()), default=0)
        if self.data_start + end > size:
            raise ModelLoadError(f"{path} is truncated: {size} bytes, its header needs {self.data_start + end}; "
                                 "re-download the checkpoint")
        self._mm = None

    def get(self, name: str) -> np.ndarray:
        e = self.entries[name]
        if e["dtype"] not in _ST_DTYPES:
            raise ModelLoadError(f"{self.path}: tensor {name} has unsupported dtype {e['dtype']}")
        if self._mm is None:
            self._mm = np.memmap(self.path, dtype=np.uint8, mode="r")
        a, b = e["data_offsets"]
        raw = self._mm[self.data_start + a:self.data_start + b]
        arr = raw.view(_ST_DTYPES[e["dtype"]]).reshape(e["shape"])
        if e["dtype"] == "BF16":  # bf16 is the top half of an f32
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        return arr


class Checkpoint:
    """Lazy name -> numpy array view of all weights of a checkpoint (single file or sharded index)."""

    def __init__(self, model_dir: Path):
        self.dir = model_dir
        index = model_dir / "model.safetensors.index.json"
        single = model_dir / "model.safetensors"
        self._where: dict[str, SafetensorsFile] = {}
        if index.is_file():
            try:
                wm = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError) as e:
                raise ModelLoadError(f"{index} is corrupt ({e}); re-download the checkpoint") from e
            files: dict[str, SafetensorsFile] = {}
            for name, fname in wm.items():
                if fname not in files:
                    fp = model_dir / fname
                    if not fp.is_file():
                        raise ModelLoadError(f"{fp} is missing (listed in {index.name}); re-download the checkpoint")
                    files[fname] = SafetensorsFile(fp)
                self._where[name] = files[fname]
        elif single.is_file():
            f = SafetensorsFile(single)
            self._where = {n: f for n in f.entries}
        else:
            shards = sorted(model_dir.glob("*.safetensors"))
            if not shards:
                bins = list(model_dir.glob("*.bin")) + list(model_dir.glob("*.pt"))
                hint = (" (found PyTorch .bin weights: convert them with transformers' save_pretrained(..., "
                        "safe_serialization=True))" if bins else "")
                raise ModelLoadError(f"no *.safetensors weights in {model_dir}{hint}")
            for fp in shards:
                f = SafetensorsFile(fp)
                self._where.update({n: f for n in f.entries})

    def names(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> np.ndarray:
        if name not in self._where:
            raise ModelLoadError(f"weight '{name}' is missing from the checkpoint in {self.dir}")
        return self._where[name].get(name)

    def dtype(self, name: str) -> str:
        return self._where[name].entries[name]["dtype"]
