"""A GGUF file as a Checkpoint: Hugging Face tensor names and shapes, each weight dequantized to f32 as it is read;
`dtype(name)` is the GGUF block type it was stored in (F32, Q8_0, Q4_K, ...)."""
from __future__ import annotations

import numpy as np

from ...errors import ModelLoadError
from ..fused import LastFused, derived_entry
from .archs import GGUFArch
from .file import GGUFFile
from .ternary import PROJ_SUFFIXES, pack_hf, ternarize

NORM_SUFFIXES = ("norm.weight",)
# Linear(hidden, 1) weights that llama.cpp's converter squeezes to a vector (Qwen2-MoE's ffn_gate_inp_shexp)
ONE_ROW_LINEARS = ("mlp.shared_expert_gate.weight",)
# GGUF types edgellm reads (dequantized by the gguf package); the IQ types and others are refused by name
READABLE = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
            "TQ1_0", "TQ2_0")


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's LLaMA q/k row permutation (convert_hf_to_gguf's `permute`): rows [head, half, pair] back to
    [head, pair, half], the rotate-half layout transformers and edgellm rotate with."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class GGUFCheckpoint:
    """Checkpoint's interface (models/checkpoint.py) over one GGUF file."""

    def __init__(self, f: GGUFFile, arch: GGUFArch, cfg: dict, names: dict[str, tuple[str, int | None]], sidecar):
        self.file, self.arch, self.cfg = f, arch, cfg
        self.dir = sidecar                       # the folder holding the rebuilt tokenizer and config files
        self.notes: list[str] = []
        self._names = dict(names)
        self._transforms: dict = {}
        self._rows: dict[str, tuple[int, int]] = {}
        self._fused = LastFused()
        # BitNet (arch.ternary): each BitLinear weight read as transformers' packed codes plus a weight_scale
        self._ternary = {n for n in names if arch.ternary and n.endswith(PROJ_SUFFIXES)}
        self._scale_of = {n.removesuffix(".weight") + ".weight_scale": n for n in self._ternary}
        self._names.update({sc: self._names[w] for sc, w in self._scale_of.items()})
        self._last_ternary: tuple[str, np.ndarray, float] | None = None

    # ---- the Checkpoint interface
    def names(self) -> list[str]:
        return list(self._names)

    def __contains__(self, name: str) -> bool:
        return name in self._names

    def alias(self, name: str, stored: str) -> None:
        self._names[name] = self._names[stored]

    def transform(self, name: str, fn) -> None:
        self._transforms[name] = fn

    def derive(self, name: str, stored: str, lo: int, hi: int) -> None:
        self._names[name] = self._names[stored]
        self._rows[name] = (lo, hi)

    def release(self) -> None:
        self._fused = LastFused()   # the reader's map stays; dequantized arrays are the caller's

    def entry(self, name: str) -> dict:
        if name in self._scale_of:
            return {"dtype": "F32", "shape": [1]}
        g, e = self._names[name]
        t = self.file.tensors[g]
        shape = [int(d) for d in reversed(t.shape.tolist())]   # ggml lists the fastest dimension first
        if name in self._ternary:
            shape = [shape[0] // 4, *shape[1:]]                 # transformers' packed rows
        if name.endswith(ONE_ROW_LINEARS) and len(shape) == 1:
            shape = [1, *shape]
        return derived_entry({"dtype": t.tensor_type.name, "shape": shape[1:] if e is not None else shape},
                             self._rows.get(name))

    def check_readable(self, name: str) -> None:
        t = self.file.tensors[self._names[name][0]]
        if t.tensor_type.name not in READABLE:
            raise ModelLoadError(f"{self.file.path.name}: tensor {t.name} is of GGUF type {t.tensor_type.name}, which "
                                 f"edgellm does not read (readable: {', '.join(READABLE)}); use a file of one of those")

    def dtype(self, name: str) -> str:
        return self.entry(name)["dtype"]

    def get(self, name: str) -> np.ndarray:
        if name not in self._names:
            raise ModelLoadError(f"weight '{name}' is missing from {self.file.path}")
        if name in self._ternary or name in self._scale_of:
            packed, s = self._ternary_weight(self._scale_of.get(name, name))
            return packed if name in self._ternary else np.array([1.0 / s if s else 1.0], np.float32)
        arr = self._dequantized(name)
        fn = self._transforms.get(name)
        return np.asarray(fn(arr), np.float32) if fn else arr

    def blocks(self, name: str):
        """The weight's stored blocks (models/gguf/blocks.py DECODERS: Q4_0, Q4_1, Q4_K, Q5_0), with the same row
        operations as get() (a fused tensor's rows, llama.cpp's q/k row order undone), or None where it is not
        stored so."""
        from .blocks import DECODERS

        if name not in self._names or name in self._ternary or name in self._scale_of or name in self._transforms:
            return None
        g, e = self._names[name]
        t = self.file.tensors[g]
        decode = DECODERS.get(t.tensor_type.name)
        shape = self.entry(name)["shape"]
        if decode is None or len(shape) != 2:
            return None

        def load():
            data = np.asarray(t.data if e is None else t.data[e], np.uint8)
            return decode(data.reshape(-1, data.shape[-1]))

        if name in self._rows:   # a part of a fused tensor: decoded once for all its parts
            b = self._fused.read(("blocks", g, e), load).rows(slice(*self._rows[name]))
        else:
            b = load()
        if b.codes.shape != tuple(shape):
            return None
        heads = self._permuted_heads(name)
        return b.rows(_unpermute(np.arange(shape[0]), heads)) if heads else b

    # ---- GGUF specifics
    def _ternary_weight(self, name: str) -> tuple[np.ndarray, float]:
        """A BitLinear weight as (packed codes, absmean scale s), read once for the weight and its weight_scale."""
        if self._last_ternary is None or self._last_ternary[0] != name:
            t, s = ternarize(self._dequantized(name), f"{self.file.path.name}: tensor {self._names[name][0]}")
            self._last_ternary = (name, pack_hf(t), s)
        return self._last_ternary[1], self._last_ternary[2]

    def _dequantized(self, name: str) -> np.ndarray:
        import gguf

        g, e = self._names[name]
        t = self.file.tensors[g]

        def load() -> np.ndarray:
            data = t.data if e is None else t.data[e]
            try:
                w = np.asarray(gguf.quants.dequantize(np.asarray(data), t.tensor_type), np.float32)
            except Exception as err:
                raise ModelLoadError(f"{self.file.path.name}: tensor {g} cannot be dequantized "
                                     f"({type(err).__name__}: {err})") from err
            return w.reshape([-1] + self.entry(name)["shape"][1:])

        if name in self._rows:   # a part of a fused tensor (phi3's attn_qkv): dequantized once for all its parts
            lo, hi = self._rows[name]
            return self.undo_convert(name, self._fused.read((g, e), load)[lo:hi])
        return self.undo_convert(name, load())

    def _permuted_heads(self, name: str) -> int | None:
        """The heads whose rows llama.cpp's converter permuted in this q/k weight or bias (None: not permuted)."""
        if self.arch.permuted_qk and name.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                                    "self_attn.q_proj.bias", "self_attn.k_proj.bias")):
            return self.cfg["num_attention_heads"] if ".q_proj." in name else self.cfg["num_key_value_heads"]
        return None

    def undo_convert(self, name: str, w: np.ndarray) -> np.ndarray:
        """What llama.cpp's converter did to this weight, undone (q/k row order, norm offsets)."""
        heads = self._permuted_heads(name)
        if heads:
            w = _unpermute(w, heads)
        if self.arch.norm_shift and name.endswith(NORM_SUFFIXES):
            w = w - np.float32(self.arch.norm_shift)
        return w
