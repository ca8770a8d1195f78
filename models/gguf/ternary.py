"""BitNet b1.58 matrices in a GGUF file: llama.cpp's converter stores each BitLinear weight as its ternary values times
the tensor's absmean scale (F32 / F16, or llama-quantize's TQ1_0 / TQ2_0, whose per-256 block scales are then all
that one scale). Read back as transformers' packed form (the codes, 4 output rows per byte, and weight_scale = 1 / s),
the form the bitnet family and the t2 scheme take, losslessly; a matrix that is not exactly ternary is refused."""
from __future__ import annotations

import numpy as np

from ...errors import ModelLoadError

# the BitLinear projections of the bitnet family (models/bitnet.py PROJ)
PROJ_SUFFIXES = tuple(f"{p}.weight" for p in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                              "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"))


def ternarize(w: np.ndarray, where: str) -> tuple[np.ndarray, float]:
    """w = t * s exactly, t in {-1, 0, 1}: (t as int8, s)."""
    s = float(np.abs(w).max())
    t = np.rint(w / s).astype(np.int8) if s > 0 else np.zeros(w.shape, np.int8)
    if s > 0 and not np.array_equal(t.astype(np.float32) * np.float32(s), w):
        raise ModelLoadError(f"{where} is not ternary (values other than 0 and +-{s:g}): not a BitNet b1.58 export")
    return t, s


def pack_hf(t: np.ndarray) -> np.ndarray:
    """transformers' packed layout (models/bitnet.py unpack_ternary's inverse): byte row i holds output rows i + j*R
    in bits 2j..2j+1, as code t + 1."""
    rows = t.shape[0] // 4
    codes = (t.astype(np.int16) + 1).astype(np.uint8).reshape(4, rows, -1)
    return (codes[0] | codes[1] << 2 | codes[2] << 4 | codes[3] << 6).astype(np.uint8)
