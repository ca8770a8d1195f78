"""A GGUF tensor's blocks as they are stored: per group of 32 weights the codes q (0 .. 2^bits - 1), a scale d and a
minimum m, w = d * q + m (symmetric types: m = -zero * d). For the types whose blocks are that (Q4_0, Q4_1, Q4_K,
Q5_0), a scheme that holds such blocks (quant/q4m.py, quant/q6.py: Scheme.from_blocks) takes them from here instead
of requantizing the dequantized values, which would not always give the codes back (a Q4_K sub-block's codes need
not span 0..15; a symmetric block whose largest magnitude is positive does not fix its scale).

Block layouts (llama.cpp's ggml-common.h, read from the format, not from its code):
  Q4_0 (32 weights, 18 bytes): f16 d, 16 bytes of nibbles (as Q4_1's); w = d * (q - 8).
  Q5_0 (32 weights, 22 bytes): f16 d, 4 bytes (u32) of fifth bits (bit j: weight j), 16 bytes of nibbles (as
       Q4_1's); w = d * (q - 16).
  Q4_1 (32 weights, 20 bytes): f16 d, f16 m, 16 bytes of nibbles (byte j: weight j low, weight j + 16 high);
       w = d * q + m.
  Q4_K (256 weights, 144 bytes): f16 d, f16 dmin, 12 bytes of 6-bit sub-block scales sc and minimums mn (8 each),
       128 bytes of nibbles (bytes 32c..32c+31: sub-block 2c in the low nibbles, 2c + 1 in the high ones);
       w = d * sc * q - dmin * mn (the products are exact in f32)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

G = 32


@dataclass
class AffineBlocks:
    """codes u8 [N, K] (0 .. 2^bits - 1), scales and mins f32 [N, K / group]: w = scale * code + min per group."""

    codes: np.ndarray
    scales: np.ndarray
    mins: np.ndarray
    bits: int = 4
    group: int = G
    zero: int | None = None   # symmetric blocks: mins == -zero * scales (the signed code is q - zero)

    def rows(self, index) -> AffineBlocks:
        """The same rows operation (a slice, or an index array) on every array."""
        return AffineBlocks(self.codes[index], self.scales[index], self.mins[index], self.bits, self.group, self.zero)

    def dequantize(self) -> np.ndarray:
        N, K = self.codes.shape
        q = self.codes.reshape(N, K // self.group, self.group).astype(np.float32)
        return (q * self.scales[..., None] + self.mins[..., None]).reshape(N, K)


def _f16(b: np.ndarray) -> np.ndarray:
    """Little-endian f16 from the two byte columns [..., 2] -> f32 [...]."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[..., 16] bytes -> [..., 32] codes: byte j holds weight j (low nibble) and weight j + 16 (high)."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


def decode_q4_0(raw: np.ndarray) -> AffineBlocks:
    """raw u8 [N, K / 32 * 18] -> AffineBlocks (symmetric, zero 8)."""
    N = raw.shape[0]
    b = raw.reshape(N, -1, 18)
    d = _f16(b[..., 0:2])
    return AffineBlocks(_nibbles(b[..., 2:]).reshape(N, -1), d, -8 * d, zero=8)


def decode_q5_0(raw: np.ndarray) -> AffineBlocks:
    """raw u8 [N, K / 32 * 22] -> AffineBlocks (5 bits, symmetric, zero 16)."""
    N = raw.shape[0]
    b = raw.reshape(N, -1, 22)
    d = _f16(b[..., 0:2])
    qh = np.ascontiguousarray(b[..., 2:6]).view("<u4")                    # [N, blocks, 1]
    high = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)   # [N, blocks, 32]: bit j of weight j
    return AffineBlocks((_nibbles(b[..., 6:]) | (high << 4)).reshape(N, -1), d, -16 * d, bits=5, zero=16)


def decode_q4_1(raw: np.ndarray) -> AffineBlocks:
    """raw u8 [N, K / 32 * 20] -> AffineBlocks."""
    N = raw.shape[0]
    b = raw.reshape(N, -1, 20)
    d, m, qs = _f16(b[..., 0:2]), _f16(b[..., 2:4]), b[..., 4:]
    return AffineBlocks(_nibbles(qs).reshape(N, -1), d, m)


def _k4_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 scale bytes of Q4_K / Q5_K super-blocks [..., 12] -> (sc, mn) u8 [..., 8] (6 bits each): sub-blocks
    0-3 in the low 6 bits of bytes 0-3 (sc) and 4-7 (mn); 4-7 in the nibbles of bytes 8-11 plus the top 2 bits of
    bytes 0-3 (sc) and 4-7 (mn)."""
    lo, mid, hi = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([lo & 63, (hi & 15) | ((lo >> 6) << 4)], axis=-1)
    mn = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=-1)
    return sc, mn


def decode_q4_k(raw: np.ndarray) -> AffineBlocks:
    """raw u8 [N, K / 256 * 144] -> AffineBlocks (groups of 32: the sub-blocks)."""
    N = raw.shape[0]
    b = raw.reshape(N, -1, 144)
    d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    sc, mn = _k4_scales(b[..., 4:16])
    qs = b[..., 16:].reshape(N, -1, 4, 32)                                 # [N, super, pair c, byte]
    codes = np.stack([qs & 15, qs >> 4], axis=3)                            # [N, super, c, nibble, 32]
    scales = (d[..., None] * sc.astype(np.float32)).reshape(N, -1)
    mins = (-(dmin[..., None] * mn.astype(np.float32))).reshape(N, -1)
    return AffineBlocks(codes.reshape(N, -1), scales, mins)


# GGUF type name -> raw rows -> AffineBlocks
DECODERS = {"Q4_0": decode_q4_0, "Q4_1": decode_q4_1, "Q4_K": decode_q4_k, "Q5_0": decode_q5_0}
