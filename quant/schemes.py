"""Quantization scheme registry. A scheme turns a float weight matrix into the named arrays its kernels read
(`quantize`), and back (`dequantize`: the oracle's view of the weights); it names the linear kernel that reads
them (`linear_kernel`, for compiler.ops.make_kernel) and models that kernel exactly in numpy (`reference_linear`).
Only matrices (linear, embedding) are quantized; norms, biases and RoPE tables stay f32.

| scheme | parts (part_order)                        | bits/weight | math                                           |
|--------|-------------------------------------------|-------------|------------------------------------------------|
| f32    | w f32[N, K]                               | 32          | exact                                          |
| f16    | w f16[N, K]                               | 16          | f16 weights, f32 math                          |
| q8     | qweight u8[N, K], scales f32[N]           | 8 + 32/K    | int8 per row; int8 activations per 32-k block  |
| q4gG   | qweight u8[N, K/2], scales f16[N, K/G]    | 4 + 16/G    | int4 per G-group; int8 activations per 32-k blk|
| q6     | qweight u8[N, 3K/4], scales f16[N, K/32]  | 6.5         | int6 per 32-group; int8 activations per 32-k blk|
| t2     | qweight u8[N, K/4], scale f32[1]          | 2 + 32/(NK) | ternary absmean per tensor; int8 act per token |

(bits_per_weight counts the scales; the per-row / per-tensor ones are counted at K = 4096 / N = K = 4096.)
Byte layouts (16-row panels, VNNI-ready chunks) and the exact activation quantization: quant/packing.py.

t2 uses ONE absmean scale per tensor, as BitNet b1.58 trains and ships it (microsoft/bitnet-b1.58-2B-4T:
weight_scale [1]), so packed BitNet checkpoints convert losslessly (packing.pack_t2(t, 1 / weight_scale)).
Activations of t2 are int8 per token (absmax, BitNet's clamp 1e-5): y = (xq . t) * absmax/127 * scale.
q8 / q4 also quantize activations to int8 (per block of 32 k, absmax, llama.cpp Q8_0 style) so that the
kernels can use integer dot products (AVX-512 VNNI / AVX2 / ARM dot); per-block scales keep that accurate:
output rel RMS error from the activations alone 0.54% on Gaussian x (K=4096), 0.93% with 4 channels 50x
outliers (per-token absmax would give 0.86% / 10%); the q8 weight error is ~0.8%, q4's ~8-10%.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import CompileError
from . import packing

# t2 kernel choice: linear_t2 (VNNI-style integer dot) beats linear_t2_lut for every shape measured on AVX-512
# VNNI and AVX2 x86 (bench/quant_ops_bench.py); the LUT kernel stays selectable via T2_OP.
T2_OP = "linear_t2"


@dataclass(frozen=True)
class Scheme:
    name: str
    bits_per_weight: float
    description: str
    kind: str = "float"               # float | q8 | q4 | q6 | t2
    dtype: str = "float32"            # float schemes: storage dtype of "w"
    group: int = 0                    # q4: group size along K
    part_order: tuple[str, ...] = ("w",)

    # ------------------------------------------------------------------------------------------ weights
    def check_shape(self, name: str, shape) -> None:
        """Raise CompileError naming the tensor if this scheme cannot store a matrix of this shape."""
        shape = tuple(int(s) for s in shape)
        if len(shape) != 2 or min(shape) < 1:
            raise CompileError(f"cannot quantize '{name}' with {self.name}: expected a 2-D [N, K] matrix, "
                               f"got shape {list(shape)}")
        K = shape[1]
        mult = {"q8": packing.QA, "q4": self.group, "q6": packing.Q6_GROUP, "t2": 16}.get(self.kind)
        if mult and K % mult:
            why = {"q8": "the int8 activation block of 32", "q4": f"the group size {self.group}",
                   "q6": f"the group size {packing.Q6_GROUP}",
                   "t2": "the packed ternary chunk of 16"}[self.kind]
            raise CompileError(f"cannot quantize '{name}' [{shape[0]}, {K}] with {self.name}: K={K} is not a "
                               f"multiple of {why}; use --quant f16 (or a scheme whose block divides K)")

    def quantize(self, w: np.ndarray) -> dict[str, np.ndarray]:
        """w f32 [N, K] -> named parts, in the layout the kernels read."""
        w = np.asarray(w, dtype=np.float32)
        self.check_shape("weight", w.shape)
        if self.kind == "float":
            return {"w": np.ascontiguousarray(w, dtype=self.dtype)}
        if self.kind == "q8":
            return packing.quantize_q8(w)
        if self.kind == "q4":
            return packing.quantize_q4(w, self.group)
        if self.kind == "q6":
            return packing.quantize_q6(w)
        return packing.quantize_t2(w)

    def dequantize(self, parts: dict[str, np.ndarray]) -> np.ndarray:
        """parts -> f32 [N, K]: what the weights are after quantization."""
        if self.kind == "float":
            return np.asarray(parts["w"]).astype(np.float32)
        return {"q8": packing.dequantize_q8, "q4": packing.dequantize_q4, "q6": packing.dequantize_q6,
                "t2": packing.dequantize_t2}[self.kind](parts)

    # ------------------------------------------------------------------------------------------ kernels
    def linear_kernel(self, T: int, N: int, K: int, bias: bool) -> tuple[str, dict]:
        """(op, params) for compiler.ops.make_kernel. Kernel args: x f32[T, K], the parts in part_order,
        [b f32[N]], out f32[T, N]."""
        p = {"T": int(T), "N": int(N), "K": int(K), "bias": bool(bias)}
        if self.kind == "float":
            return "linear", {**p, "wdtype": self.dtype}
        if self.kind == "q8":
            return "linear_q8", p
        if self.kind == "q4":
            return "linear_q4", {**p, "G": self.group}
        if self.kind == "q6":
            return "linear_q6", p
        return T2_OP, p

    def reference_linear(self, x: np.ndarray, parts: dict[str, np.ndarray], bias=None) -> np.ndarray:
        """float64 numpy of exactly what the kernel computes (activation quantization included)."""
        x = np.asarray(x, np.float32)
        if self.kind == "float":
            y = x.astype(np.float64) @ np.asarray(parts["w"]).astype(np.float64).T
            return y if bias is None else y + np.asarray(bias, np.float64)
        args = [parts[k] for k in self.part_order]
        fn = {"q8": packing.linear_q8_ref, "q4": packing.linear_q4_ref, "q6": packing.linear_q6_ref,
              "t2": packing.linear_t2_ref}[self.kind]
        return fn(x, *args, bias=bias)


def _q4(G: int) -> Scheme:
    return Scheme(f"q4g{G}", 4 + 16 / G, f"int4 per group of {G} along K (symmetric, f16 scale per group), "
                  "int8 activations per 32-k block, integer dot products", kind="q4", group=G,
                  part_order=("qweight", "scales"))


SCHEMES: dict[str, Scheme] = {
    "f32": Scheme("f32", 32, "float32 weights (exact)", kind="float", dtype="float32"),
    "f16": Scheme("f16", 16, "float16 weights, f32 math", kind="float", dtype="float16"),
    "q8": Scheme("q8", 8 + 32 / 4096, "int8 per output row (symmetric, f32 scale per row), int8 activations "
                 "per 32-k block, integer dot products", kind="q8", part_order=("qweight", "scales")),
    "q4g32": _q4(32),
    "q4g64": _q4(64),
    "q4g128": _q4(128),
    # an embedding / lm_head scheme (--head-quant q6): the bits of llama.cpp's Q6_K output tensor
    "q6": Scheme("q6", 6 + 16 / 32, "int6 per group of 32 along K (symmetric, f16 scale per group), int8 "
                 "activations per 32-k block, integer dot products", kind="q6", group=32,
                 part_order=("qweight", "scales")),
    "t2": Scheme("t2", 2 + 32 / 4096 ** 2, "ternary {-1,0,+1} (BitNet b1.58 absmean, one f32 scale per tensor), "
                 "2 bits packed, int8 activations per token", kind="t2", part_order=("qweight", "scale")),
}


def get_scheme(name: str) -> Scheme:
    if name not in SCHEMES:
        raise CompileError(f"unknown quantization scheme '{name}': choose one of {', '.join(SCHEMES)}")
    return SCHEMES[name]
