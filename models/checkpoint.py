"""Read a Hugging Face checkpoint: resolve a local dir or hub id, parse config.json, open safetensors lazily.

The safetensors reader is ours (a JSON header + raw bytes, mmapped) because numpy cannot represent bf16 and we
want truncation reported before any work starts."""
from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

import numpy as np

from ..errors import ModelLoadError, short_repr
from .fused import LastFused, derived_entry

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64,
              "I8": np.int8, "U8": np.uint8, "I32": np.int32, "I64": np.int64, "I16": np.int16}
_HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.txt"]


def resolve_model_dir(model: str | os.PathLike) -> Path:
    """A local directory as is; otherwise a hub id fetched (or found in the cache) through huggingface-hub."""
    from . import gguf

    p = Path(model).expanduser()
    if p.is_dir():
        inside = gguf.gguf_in_dir(p)
        return gguf.sidecar(inside) if inside else p
    if gguf.is_gguf_file(p):
        return gguf.sidecar(p)
    from .demo import demo_path

    if (d := demo_path(str(model))) is not None:
        return d
    if p.exists():
        raise ModelLoadError(f"{p} is a file but not a GGUF model; pass a GGUF file or the checkpoint directory "
                             "that holds config.json")
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
                             "(`hf download ID`) or pass a local directory") from e
    except RepositoryNotFoundError as e:
        raise ModelLoadError(f"'{s}' does not exist on the Hugging Face Hub (or needs a token: `hf auth login`)") from e
    except Exception as e:  # network errors come in many types
        raise ModelLoadError(f"could not fetch '{s}' from the Hugging Face Hub: {type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}; pass a local directory instead") from e


def read_json_object(path: Path) -> dict:
    """A JSON object from a regular file, every failure one ModelLoadError line (FIFOs and devices are never opened:
    reading one would block or never end)."""
    if not path.is_file():
        raise ModelLoadError(f"{path} is {'missing' if not path.exists() else 'not a regular file'}; "
                             "re-download or re-export the checkpoint")
    try:
        obj = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as e:
        raise ModelLoadError(f"{path} cannot be read ({e.strerror or e})") from e
    except UnicodeDecodeError as e:
        raise ModelLoadError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}); re-download or re-export the "
                             "checkpoint") from e
    except (ValueError, RecursionError) as e:   # JSONDecodeError, over-long integer literals, absurd nesting
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ModelLoadError(f"{path} is not valid JSON ({msg}); re-download or re-export the checkpoint") from e
    if not isinstance(obj, dict):
        raise ModelLoadError(f"{path} is not a JSON object; re-download or re-export the checkpoint")
    return obj


def _is_id(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def read_config(model_dir: Path) -> dict:
    path = model_dir / "config.json"
    if not path.is_file() and not path.exists():
        raise ModelLoadError(f"{path} is missing: a Hugging Face checkpoint directory needs config.json")
    cfg = read_json_object(path)
    gen = model_dir / "generation_config.json"
    if gen.exists() or gen.is_symlink():   # its eos list (e.g. Llama 3 instruct) wins over config.json's
        g = read_json_object(gen)
        eos = g.get("eos_token_id")
        if eos is not None:
            vocab = cfg.get("vocab_size")
            top = vocab if _is_id(vocab) and vocab > 0 else None   # a bad vocab_size is config.json's error, later
            ids = eos if isinstance(eos, list) else [eos]
            if not all(_is_id(e) and 0 <= e and (top is None or e < top) for e in ids):
                raise ModelLoadError(f"{gen}: eos_token_id must be a token id{f' in [0, {top})' if top else ''}, a "
                                     f"list of them or null, got {short_repr(eos)}; fix or delete generation_config.json")
            cfg = {**cfg, "eos_token_id": eos}
    return cfg




# bytes per element of every safetensors dtype (the sub-byte float formats have none: their sizes are not checked)
_ST_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2,
                "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}


class SafetensorsFile:
    """One .safetensors file: header parsed and validated eagerly (every entry's dtype, shape and offsets, against
    the file size), tensors mmapped on demand."""

    def __init__(self, path: Path):
        self.path = path
        if not path.is_file():   # a FIFO or device: never opened (a read would block)
            raise ModelLoadError(f"{path} is {'missing' if not path.exists() else 'not a regular file'}; "
                                 "re-download the checkpoint")
        try:
            size = path.stat().st_size
            with open(path, "rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise ModelLoadError(f"{path} is truncated ({size} bytes): re-download the checkpoint")
                (n,) = struct.unpack("<Q", head)
                if n > size - 8 or n > 100 << 20:
                    raise ModelLoadError(f"{path} has a corrupt header (length {n}, file {size} bytes): "
                                         "re-download the checkpoint")
                raw = f.read(n)
        except OSError as e:
            raise ModelLoadError(f"{path} cannot be read ({e.strerror or e})") from e
        try:
            header = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as e:   # UnicodeDecodeError and JSONDecodeError are ValueErrors
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ModelLoadError(f"{path} has a corrupt header ({msg}): re-download the checkpoint") from e
        if not isinstance(header, dict):
            raise ModelLoadError(f"{path} has a corrupt header (not a JSON object): re-download the checkpoint")
        self.data_start = 8 + n
        meta = header.pop("__metadata__", None)
        if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
            raise ModelLoadError(f"{path} has a corrupt header (__metadata__ must map strings to strings): "
                                 "re-download the checkpoint")
        data_size = size - self.data_start
        for name, e in header.items():
            self._check_entry(name, e, data_size)
        self.entries: dict[str, dict] = header
        self._mm = None

    def _check_entry(self, name: str, e, data_size: int) -> None:
        def bad(why: str) -> ModelLoadError:
            return ModelLoadError(f"{self.path}: tensor {short_repr(name)} has a corrupt header entry ({why}): "
                                  "re-download the checkpoint")

        if not isinstance(e, dict):
            raise bad(f"not an object: {short_repr(e)}")
        dtype, shape, offs = e.get("dtype"), e.get("shape"), e.get("data_offsets")
        if not isinstance(dtype, str):
            raise bad(f"dtype {short_repr(dtype)} is not a string")
        if not isinstance(shape, list) or not all(_is_id(d) and d >= 0 for d in shape):
            raise bad(f"shape {short_repr(shape)} is not a list of integers >= 0")
        if not (isinstance(offs, list) and len(offs) == 2 and all(_is_id(o) for o in offs)):
            raise bad(f"data_offsets {short_repr(offs)} is not [begin, end]")
        a, b = offs
        if not 0 <= a <= b:
            raise bad(f"data_offsets [{a}, {b}] are negative or reversed")
        if b > data_size:
            raise ModelLoadError(f"{self.path} is truncated: tensor {short_repr(name)} ends at byte {self.data_start + b}, "
                                 f"the file has {self.data_start + data_size}; re-download the checkpoint")
        item = _ST_ITEMSIZE.get(dtype)
        if item is not None and b - a != math.prod(shape) * item:
            raise bad(f"{b - a} bytes for shape {shape} of {dtype}, which needs {math.prod(shape) * item}")

    def check_readable(self, name: str) -> None:
        """A tensor the model needs must have a dtype we can read."""
        dt = self.entries[name]["dtype"]
        if dt not in _ST_DTYPES:
            raise ModelLoadError(f"{self.path}: tensor {name} has unsupported dtype {short_repr(dt)} (readable: "
                                 f"{', '.join(_ST_DTYPES)}); convert the checkpoint, e.g. to bfloat16")

    def release(self) -> None:
        """Drops this reader's map of the file: the pages it touched leave the process once no array views them
        (a long compile reads each weight more than once; mapped, every page read would stay resident)."""
        self._mm = None

    def get(self, name: str) -> np.ndarray:
        e = self.entries[name]
        self.check_readable(name)
        if self._mm is None:
            try:
                self._mm = np.memmap(self.path, dtype=np.uint8, mode="r")
            except (OSError, ValueError) as err:
                raise ModelLoadError(f"{self.path} cannot be mapped ({err})") from err
        a, b = e["data_offsets"]
        raw = self._mm[self.data_start + a:self.data_start + b]
        arr = raw.view(_ST_DTYPES[e["dtype"]]).reshape(e["shape"])
        if e["dtype"] == "BF16":  # bf16 is the top half of an f32
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        return arr


def _shard_name(index: Path, name, fname) -> str:
    if not isinstance(name, str) or not isinstance(fname, str):
        raise ModelLoadError(f"{index} is corrupt (weight_map must map tensor names to file names, got "
                             f"{short_repr(name)}: {short_repr(fname)}); re-download the checkpoint")
    if not fname or "/" in fname or "\\" in fname or fname in (".", "..") or fname.startswith("..") or "\0" in fname:
        raise ModelLoadError(f"{index} names the shard {short_repr(fname)}, which is not a plain file name in the "
                             "checkpoint directory; re-download the checkpoint")
    return fname


class Checkpoint:
    """Lazy name -> numpy array view of all weights of a checkpoint (single file or sharded index)."""

    def __init__(self, model_dir: Path):
        self.dir = model_dir
        self.notes: list[str] = []           # what the caller may want to tell the user (one line each)
        self._stored: dict[str, str] = {}     # name asked for -> name in the file, where they differ (aliases)
        self._transforms: dict = {}          # name -> fn applied to the stored tensor as it is read (models/gemma.py)
        self._rows: dict[str, tuple[int, int]] = {}   # name -> the rows of its stored (fused) tensor it is
        self._fused = LastFused()
        index = model_dir / "model.safetensors.index.json"
        single = model_dir / "model.safetensors"
        self._where: dict[str, SafetensorsFile] = {}
        if index.exists() or index.is_symlink():
            wm = read_json_object(index).get("weight_map")
            if not isinstance(wm, dict):
                raise ModelLoadError(f"{index} is corrupt (no weight_map object); re-download the checkpoint")
            files: dict[str, SafetensorsFile] = {}
            for name, fname in wm.items():
                fname = _shard_name(index, name, fname)
                if fname not in files:
                    fp = model_dir / fname
                    if not fp.exists():
                        raise ModelLoadError(f"{fp} is missing (listed in {index.name}); re-download the checkpoint")
                    files[fname] = SafetensorsFile(fp)
                if name not in files[fname].entries:
                    raise ModelLoadError(f"{index.name} places {short_repr(name)} in {fname}, which does not hold it; "
                                         "re-download the checkpoint")
                self._where[name] = files[fname]
        elif single.exists() or single.is_symlink():
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

    def alias(self, name: str, stored: str) -> None:
        """Make `name` read the tensor stored as `stored` (e.g. tied embeddings saved only as lm_head.weight)."""
        self._where[name] = self._where[stored]
        self._stored[name] = self._stored.get(stored, stored)

    def transform(self, name: str, fn) -> None:
        """Make `name` read as fn(stored tensor): a family's fold of a constant into a weight (Gemma's 1 + w norms)."""
        self._transforms[name] = fn

    def derive(self, name: str, stored: str, lo: int, hi: int) -> None:
        """Make `name` read rows [lo, hi) of the tensor `stored` (a fused projection, Phi-3's qkv_proj)."""
        self.alias(name, stored)
        self._rows[name] = (lo, hi)

    def names(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def entry(self, name: str) -> dict:
        """The header entry (dtype, shape, data_offsets) of a tensor (a derived one: its dtype and shape only)."""
        e = self._where[name].entries[self._stored.get(name, name)]
        return derived_entry(e, self._rows.get(name))

    def check_readable(self, name: str) -> None:
        self._where[name].check_readable(self._stored.get(name, name))

    def release(self) -> None:
        """SafetensorsFile.release for every file (the next get maps again)."""
        self._fused = LastFused()
        for f in set(self._where.values()):
            f.release()

    def get(self, name: str) -> np.ndarray:
        if name not in self._where:
            raise ModelLoadError(f"weight '{name}' is missing from the checkpoint in {self.dir}")
        stored = self._stored.get(name, name)
        if name in self._rows:
            lo, hi = self._rows[name]
            arr = self._fused.read(stored, lambda: self._where[name].get(stored))[lo:hi]
        else:
            arr = self._where[name].get(stored)
        fn = self._transforms.get(name)
        return np.asarray(fn(arr), np.float32) if fn else arr

    def dtype(self, name: str) -> str:
        return self.entry(name)["dtype"]
