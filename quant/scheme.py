"""The quantization scheme interface and the registry (one entry per scheme).

A scheme turns a float weight matrix into the named arrays its kernels read (`quantize`), and back
(`dequantize`: the oracle's view of the weights); it names the kernels that read them (`linear_kernel`,
`embed_kernel`, for compiler.ops.make_kernel) and models its linear kernel exactly in numpy (`reference_linear`).
It also carries its rules: the K multiple it needs (and why), whether it may store the transformer body's linears
(--quant) and/or the embedding / lm_head (--head-quant), the head scheme it defaults to, whether --gptq applies,
and a compile-time warning. Callers (compiler/lower.py, compiler/driver.py, quant/reference_model.py, ...) ask the
scheme; they never test a scheme by name. Only matrices (linear, embedding) are quantized; norms, biases and
RoPE tables stay f32.

Each scheme family lives in its own module, which owns its packing, numpy reference and kernel op names and
registers its schemes; quant/__init__.py imports those modules (the registration lines):

| scheme | module        | parts                                     | bits/weight | math                                     |
|--------|---------------|-------------------------------------------|-------------|------------------------------------------|
| f32    | quant/float.py| w f32[N, K]                               | 32          | exact                                    |
| f16    | quant/float.py| w f16[N, K]                               | 16          | f16 weights, f32 math                    |
| q8     | quant/q8.py   | qweight u8[N, K], scales f32[N]           | 8 + 32/K    | int8 per row; int8 act per 32-k block    |
| q4gG   | quant/q4.py   | qweight u8[N, K/2], scales f16[N, K/G]    | 4 + 16/G    | int4 per G-group; int8 act per 32-k block|
| q4m32  | quant/q4m.py  | qweight u8[N, K/2], scales, mins f16[N,K/32]| 5           | int4 + min per 32-group; int8 act per blk|
| q6     | quant/q6.py   | qweight u8[N, 3K/4], scales f16[N, K/32]  | 6.5         | int6 per 32-group; int8 act per 32-k blk |
| t2     | quant/t2.py   | qweight u8[N, K/4], scale f32[1]          | 2 + 32/(NK) | ternary absmean per tensor; int8 per token|

(bits_per_weight counts the scales; the per-row / per-tensor ones are counted at K = 4096 / N = K = 4096.)
The shared byte layout (16-row panels, VNNI-ready chunks) and the exact activation quantization: quant/packing.py.

q8 / q4 / q6 quantize activations to int8 per block of 32 k (absmax, llama.cpp Q8_0 style) so that the kernels
can use integer dot products (AVX-512 VNNI / AVX2 / ARM dot); per-block scales keep that accurate: output rel
RMS error from the activations alone 0.54% on Gaussian x (K=4096), 0.93% with 4 channels 50x outliers
(per-token absmax would give 0.86% / 10%); the q8 weight error is ~0.8%, q4's ~8-10%. t2: see quant/t2.py.

Kernel traits. Each packed scheme also declares, as data, what its kernels read (`KernelTraits`: the kernel
family, the code layout, the scale layout, the activation quantization, the K granularity and the scale groups)
for each kernel op it names (`kernel_ops`). register() files those rows in KERNEL_OPS; the compiler builds its op
table, its checks, its references and its CPU / OpenCL kernels from them (compiler/ops/linear_quant.FAMILIES,
compiler/opencl/ops.FAMILIES: family -> kernel maker), so nothing outside quant/ tests a scheme by name.

Adding a scheme: a module with a Scheme subclass (or an instance of an existing one), its `kernel_ops` rows and
`register(...)`, and its import in quant/__init__.py (the one registration line). A scheme whose layout an
existing kernel family reads (another q4 group size, a new block scheme with the q8/q4 chunk layouts) needs no
compiler change; a new layout adds its family's kernels: a module in compiler/ops (as linear_block.py,
linear_t2.py) and one line in each FAMILIES table (targets accept every body scheme unless their `quants` list in
targets/registry.py says otherwise).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import CompileError


@dataclass(frozen=True)
class KernelTraits:
    """What one kernel op of a packed scheme reads, as data (one row per op, like llama.cpp's type traits)."""

    kind: str                    # "linear" (x f32[T, K] @ W.T) or "embed" (row gather of a [V, D] table)
    family: str                  # the kernel family that builds it (compiler/ops/linear_quant.FAMILIES, ...)
    layout: str                  # packed code layout: a quant.packing.LAYOUTS key ("q8", "q4", "t2"), or "q6"
    scale: str                   # "row": f32[N]; "group": f16[N, K/G] panel-interleaved; "matrix": f32[nseg], one
                                 # per stacked matrix (segs)
    act: str = "block"           # int8 activations per "block" of 32 k, or per "token" (linear)
    k_multiple: int = 1          # K (linear) / D (embed) must be a multiple of this
    groups: tuple[int, ...] = ()  # the op takes the scale group as param G, one of these (default the first)
    group: int = 0               # the scale group when the layout fixes it (no G param)
    minimum: bool = False        # a per-group minimum part follows the scales (same layout): w = s * code + m

    def group_of(self, G: int | None) -> int | None:
        """The scale group along K of a kernel with param G (None: the scale is not per group)."""
        return (G or self.groups[0]) if self.groups else (self.group or None)


class Scheme:
    """One quantization scheme. Subclasses set the class attributes (or pass them to __init__) and implement
    `_quantize`, `dequantize`, `linear_ref`, `linear_kernel` and, for head schemes, `embed_kernel`."""

    name: str                            # the registry key (--quant / --head-quant value)
    bits_per_weight: float               # stored bits per weight, scales included
    description: str
    parts: tuple[str, ...] = ("w",)      # names of the stored arrays, in kernel argument order
    k_multiple: int = 1                  # K (the reduction dim) must be a multiple of this ...
    k_multiple_why: str = ""             # ... because of this ("the group size 32")
    body: bool = True                    # may store the transformer body's linear layers (--quant)
    head: bool = True                    # may store the embedding table and lm_head (--head-quant)
    default_head: str | None = None      # head scheme when this is the body scheme and no --head-quant (None: itself)
    gptq: bool = False                   # --gptq applies (quant/gptq.py produces this scheme's parts)
    float_math: bool = False             # float weights and f32 math: prefill GEMMs are FMA-bound (long chunks pay)
    # how each part stacks when several matrices are fused row-wise into one kernel (compiler/lower.py: q/k/v,
    # gate/up): "rows" natural row order, an int: panel-interleaved rows with that unit (quant/packing.py),
    # "matrix": one entry per matrix (t2's per-tensor scale). None: this scheme's matrices are not fused
    stacking: dict[str, object] | None = None
    # the kernel ops this scheme's linear_kernel / embed_kernel name, with what they read (KernelTraits); float
    # schemes name the float ops (linear, embed) and leave this empty
    kernel_ops: dict[str, KernelTraits] = {}

    @property
    def part_order(self) -> tuple[str, ...]:
        """The older name of `parts`."""
        return self.parts

    @property
    def embedding(self) -> str:
        """How the manifest names the stored embedding table (quant.embedding): the scheme, or a float dtype."""
        return self.name

    def compile_warning(self, spec) -> str | None:
        """A warning to print when a model (ModelSpec) is compiled with this body scheme, or None."""
        return None

    # ------------------------------------------------------------------------------------------ weights
    def check_shape(self, name: str, shape) -> None:
        """Raise CompileError naming the tensor if this scheme cannot store a matrix of this shape."""
        shape = tuple(int(s) for s in shape)
        if len(shape) != 2 or min(shape) < 1:
            raise CompileError(f"cannot quantize '{name}' with {self.name}: expected a 2-D [N, K] matrix, "
                               f"got shape {list(shape)}")
        K = shape[1]
        if self.k_multiple > 1 and K % self.k_multiple:
            raise CompileError(f"cannot quantize '{name}' [{shape[0]}, {K}] with {self.name}: K={K} is not a "
                               f"multiple of {self.k_multiple_why}; use --quant f16 (or a scheme whose block divides K)")

    def quantize(self, w: np.ndarray) -> dict[str, np.ndarray]:
        """w f32 [N, K] -> the named parts, in the layout the kernels read."""
        w = np.asarray(w, dtype=np.float32)
        self.check_shape("weight", w.shape)
        return self._quantize(w)

    def _quantize(self, w: np.ndarray) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def dequantize(self, parts: dict[str, np.ndarray]) -> np.ndarray:
        """parts -> f32 [N, K]: what the weights are after quantization."""
        raise NotImplementedError

    def concat_parts(self, parts_list: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """The parts of several matrices (same K) stacked row-wise, as one fused kernel reads them (see stacking):
        for per-row and per-group scales the same as quantizing the stacked matrix."""
        if self.stacking is None:
            raise CompileError(f"{self.name} matrices cannot be fused")
        from .packing import stack_rows

        out = {}
        for p in self.parts:
            arrays = [np.asarray(parts[p]) for parts in parts_list]
            how = self.stacking[p]
            out[p] = stack_rows(arrays, how) if isinstance(how, int) else np.concatenate(arrays)
        return out

    # ------------------------------------------------------------------------------------------ kernels
    def linear_ref(self, x: np.ndarray, *parts, bias=None) -> np.ndarray:
        """float64 numpy of exactly what the linear kernel computes, parts given in `parts` order."""
        raise NotImplementedError

    def reference_linear(self, x: np.ndarray, parts: dict[str, np.ndarray], bias=None, segs=()):
        """float64 numpy of exactly what the kernel computes (activation quantization included). segs: parts of
        stacked matrices (concat_parts) with these row counts; returns one array per matrix."""
        kw = {"segs": tuple(segs)} if segs and "matrix" in (self.stacking or {}).values() else {}
        y = self.linear_ref(np.asarray(x, np.float32), *[parts[k] for k in self.parts], bias=bias, **kw)
        return split_rows(y, segs) if segs else y

    def linear_kernel(self, T: int, N: int, K: int, bias: bool, segs=()) -> tuple[str, dict]:
        """(op, params) for compiler.ops.make_kernel. Kernel args: x f32[T, K], the parts in `parts` order,
        [b f32[N]], out f32[T, N]; with segs (row counts of stacked matrices, see concat_parts) one output per
        matrix, out_s f32[T, N_s]."""
        raise NotImplementedError

    def embed_kernel(self, T: int, V: int, D: int) -> tuple[str, dict]:
        """(op, params) of the row gather from a [V, D] table stored in this scheme. Kernel args: ids i32[T],
        the parts in `parts` order, out f32[T, D]."""
        raise CompileError(f"{self.name} cannot store an embedding table")

    def cutter(self, parts: dict[str, np.ndarray]):
        """Sub-matrices of a stored matrix in this scheme (compiler/bundled_ffn.py cuts FFN neuron bundles):
        cutter(parts).parts(rows, cols) -> the parts of w[rows, cols]. By default the dequantized values are
        requantized (per-row and per-block schemes give back the matrix's own codes and scales, since bundles cut
        at multiples of 32); a scheme whose scale belongs to the whole matrix (t2) keeps it."""
        return _Requantize(self, self.dequantize(parts))

    @staticmethod
    def _params(T: int, N: int, K: int, bias: bool, segs=()) -> dict:
        p = {"T": int(T), "N": int(N), "K": int(K), "bias": bool(bias)}
        return {**p, "segs": tuple(int(s) for s in segs)} if segs else p

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class _Requantize:
    def __init__(self, scheme: Scheme, w: np.ndarray):
        self.scheme, self.w = scheme, np.asarray(w, np.float32)

    def parts(self, rows=slice(None), cols=slice(None)) -> dict:
        return self.scheme.quantize(np.ascontiguousarray(self.w[rows, cols]))


def split_rows(y: np.ndarray, segs) -> list[np.ndarray]:
    """[T, N] -> one [T, N_s] array per segment of rows."""
    return np.split(y, np.cumsum(segs)[:-1], axis=1)


# ---------------------------------------------------------------------------------------------- registry
SCHEMES: dict[str, Scheme] = {}   # name -> scheme, in registration order (quant/__init__.py imports)


@dataclass(frozen=True)
class KernelOp:
    """A kernel op of the packed schemes: its traits and the scheme whose references model it."""

    name: str
    traits: KernelTraits
    scheme: Scheme


KERNEL_OPS: dict[str, KernelOp] = {}   # op name -> KernelOp, filed by register() from the schemes' kernel_ops


def register(scheme: Scheme) -> Scheme:
    """Adds a scheme to the registry (its name must be new) and files its kernel ops (schemes sharing an op, as the
    q4 group sizes do, must give it the same traits); returns it."""
    if scheme.name in SCHEMES:
        raise ValueError(f"quantization scheme {scheme.name!r} is already registered")
    for op, traits in scheme.kernel_ops.items():
        if op in KERNEL_OPS and KERNEL_OPS[op].traits != traits:
            raise ValueError(f"kernel op {op!r} is already registered with other traits")
    SCHEMES[scheme.name] = scheme
    for op, traits in scheme.kernel_ops.items():
        KERNEL_OPS.setdefault(op, KernelOp(op, traits, scheme))
    return scheme


def get_scheme(name: str) -> Scheme:
    if name not in SCHEMES:
        raise CompileError(f"unknown quantization scheme '{name}': choose one of {', '.join(SCHEMES)}")
    return SCHEMES[name]


def body_schemes() -> list[str]:
    """Names of the schemes that may store the body's linear layers (--quant), in registry order."""
    return [n for n, s in SCHEMES.items() if s.body]


def head_schemes() -> list[str]:
    """Names of the schemes that may store the embedding / lm_head (--head-quant), in registry order."""
    return [n for n, s in SCHEMES.items() if s.head]
