"""edgellm kernel library: TIR PrimFuncs (hand-scheduled for CPUs) for the ops of a decoder-only LLM.

Interface used by the lowering code:
    CpuInfo(vector_lanes, num_threads=2, arch="x86_64")
    make_kernel(op, cpu, **params) -> (name, prim_func)    # prim_func.attrs["global_symbol"] == name
    reference(op, args, **params) -> np.ndarray              # numpy float64 reference

Every kernel is destination-passing: params are the inputs followed by the output buffer.

| op        | params                    | args (in order)                                                  |
|-----------|---------------------------|------------------------------------------------------------------|
| embed     | T, V, D, wdtype           | ids int32[T], W wdtype[V, D], out f32[T, D]                      |
| rmsnorm   | R, D, eps                 | x f32[R, D], w f32[D], out f32[R, D]                             |
| linear    | T, N, K, wdtype, bias     | x f32[T, K], W wdtype[N, K], [b f32[N]], out f32[T, N]           |
| rope      | T, H, D                   | x f32[T, H, D], cos f32[T, D/2], sin f32[T, D/2], out f32[T, H, D] |
| attention | T, NH, KVH, D, W, kv, vkv | q f32[T, NH, D], k kv[S, KVH, D], v vkv (or kv)[S, KVH, D], out f32[T, NH*D] |
| add       | R, N                      | a, b f32[R, N], out f32[R, N]                                    |
| swiglu    | T, F                      | g, u f32[T, F], out f32[T, F]                                    |
| gelu_mul  | T, F                      | g, u f32[T, F], out f32[T, F] (gelu_tanh(g) * u)                 |
| scale     | R, N, c                   | a f32[R, N], out f32[R, N] (a * c; out may be a)                 |
| softcap   | R, N, c                   | a f32[R, N], out f32[R, N] (c * tanh(a / c); out may be a)       |
| copy      | R, N, dtype               | a f32[R, N], out dtype[R, N] (K/V cache rows: float32 or float16)  |
| kv_q8     | R, H, D                   | a f32[R, H*D], out int8[R, H*D + 4H] (q8 K/V cache rows: kv_quant.py) |
| kv_q4     | R, H, D                   | a f32[R, H*D], out int8[R, H*D/2 + 4H*D/B] (q4 K/V cache rows)   |
| linear_q8 | T, N, K, bias             | x f32[T, K], qweight u8[N, K], scales f32[N], [b], out f32[T, N] |
| linear_q4 | T, N, K, G, bias          | x f32[T, K], qweight u8[N, K/2], scales f16[N, K/G], [b], out    |
| linear_q6 | T, N, K, bias             | x f32[T, K], qweight u8[N, 3K/4], scales f16[N, K/32], [b], out |
| linear_t2 | T, N, K, bias             | x f32[T, K], qweight u8[N, K/4], scale f32[1], [b], out f32[T, N] |
| linear_t2_lut | T, N, K, bias         | same args as linear_t2 (lookup-table kernel)                     |
| ffn_select | T, F, G, D              | g f32[T, F], c f32[F], default f32[1], setting f32[1],           |
|           |                           |   s f32[F/G, T, G], ids int32[F/G], acc f32[T, D]                |
| ffn_mul   | T, G                      | s f32[1, T, G], u f32[T, G], h f32[T, G]                         |
| ffn_accumulate | R, N                 | y f32[R, N], acc f32[R, N] (read and written: acc += y)          |
| moe_route | T, E, K, normalize, S, TP | logits f32[T, E], ids int32[S], cnt int32[S, 16], tok int32[S, TP], |
|           |                           |   wt f32[S, TP]                                                  |
| moe_gather | T, D, TP                 | x f32[T, D], tok int32[1, TP], cnt int32[1, 16], xe f32[T, D]    |
| moe_swiglu | T, F                     | g, u f32[T, F], cnt int32[1, 16], h f32[T, F]                    |
| moe_scatter | T, D, TP                | y f32[T, D], tok int32[1, TP], wt f32[1, TP], cnt int32[1, 16],  |
|           |                           |   acc f32[T, D] (read and written)                               |
| zero      | R, N                      | out f32[R, N]                                                    |
| sigmoid_gate | T, D                   | x f32[T, D], w f32[1, D], y f32[T, D], out f32[T, D]             |

The moe_* ops, zero and sigmoid_gate are the mixture-of-experts layer's (moe.py). Every linear op also takes
rows (default 0; named "_rows<mode>" only when set): one more arg, cnt int32[1, 16], and only rows < cnt[0, 0] of
the output are computed; the others are left undefined (1: the packed tokens of one expert in a prefill chunk) or
set to zero (2: the verify program's drafts; rows.py).
The ffn_* ops are the neuron-bundled FFN's (bundled_ffn.py: group selection, gated product, accumulation).
wdtype is "float32" or "float16" (default "float32"); bias defaults to False. Every linear op also takes segs
(default (): one matrix): row counts N_0, N_1, ... summing to N when W (and b) stack several matrices computed in
one call (q/k/v, gate/up: compiler/lower.py); the kernel then takes one output per matrix, out_s f32[T, N_s], as
its last args, and linear_t2's scale is f32[nseg] (one per matrix). Named "_s<N_0>x<N_1>..." only when fused.
attention's kv: the K/V caches' element type ("float32" default, "float16": widened as read, or "q8" / "q4": codes and
scales, kv_quant.py; --kv-cache);
attention's W: sliding window (query at position p attends keys p-W+1 .. p), default 0 = full causal attention;
named "_w<W>" only when W > 0. Its cap: logit soft-capping (cap * tanh(score / cap), Gemma 2), default 0 = none;
named "_cap<cap>" only when > 0. Its P: key segments of full causal attention (attention.py SEG_MIN_CHUNKS; a
package's P from attention.split_for, the same in every program so that prefill and verify rows round as decode's),
default 0 = none; named "_split<P>" only when > 0.
The packed schemes' ops (linear_q8 ... embed_q6 above) are declared by the schemes, with their traits (quant/:
Scheme.kernel_ops, KernelTraits); their params, checks (K a multiple of 32 for q8 / q6, of G for q4 with G in
32/64/128, of 16 for t2), references and kernels come from those traits: linear_quant.py dispatches by the
traits' family to the family modules (linear_block.py q8/q4/q6, linear_t2.py t2; linear_naive.py the reference TIR
of every layout; quant_common.py what they share). Weights are in the packed layouts of edgellm.quant.packing.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, replace

from . import attention as _attention
from . import bundled_ffn as _ffn
from . import elementwise as _ew
from . import kv_quant as _kv_quant
from . import linear as _linear
from . import linear_quant as _linear_quant
from . import moe as _moe
from ...quant.scheme import KERNEL_OPS
from ._util import kernel_name
from .kslice import check as check_kslice
from .kslice import slice_width
from .reference import reference
from .script_frames import frames_without_source
from .script_sources import sources_parsed_once
from .segments import check_segs

__all__ = ["OPS", "CpuInfo", "prefetch_class", "host_cpu_info", "kernel_params", "llvm_target",
           "make_kernel", "reference"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CpuInfo:
    """What schedules need to know about the target."""

    vector_lanes: int  # f32 lanes per SIMD register: 16 AVX-512, 8 AVX2, 4 NEON
    num_threads: int = 2  # schedules may split parallel loops for this many threads
    arch: str = "x86_64"  # or "aarch64"
    features: tuple[str, ...] = ()  # target CPU features the kernels may use (aarch64: "dotprod", "i8mm")
    prefetch_bytes: int = 0  # decode GEMVs prefetch this far ahead in the weight stream (0: hardware only)
    float_prefetch_bytes: int | None = None  # the f32/f16 GEMV's distance, when it differs from prefetch_bytes
    prefetch_locality: int = 3  # the quantized stream's prefetches: 3 into L1, 2 into L2 (targets.registry.host_prefetch)
    batch_prefetch_locality: int = 3  # the same for the small-batch GEMMs (verify passes: 2..32 tokens)
    kv_prefetch_locality: int = 3  # decode attention's K/V rows (float caches)
    # measured per-host distances (compiler/tune): ((prefetch class, bytes), ...), overriding the two distances for the
    # decode GEMVs of that class ("linear_f16", "linear_q4", ...: see prefetch_class)
    tuned_prefetch: tuple[tuple[str, int], ...] = ()
    # measured register blocking of the x86 float prefill GEMM (linear.gemm_outer) per chunk length:
    # ((T, weight rows Nn, token vectors NV), ...); every output is the same FMA chain over k whatever the blocking
    tuned_blocking: tuple[tuple[int, int, int], ...] = ()

    # measured rows per task of the f32/f16 decode GEMV (linear.gemv) per reduction length: ((K, R), ...)
    tuned_gemv_rows: tuple[tuple[int, int], ...] = ()
    # float body matrices whose f32 activation row is longer than this many bytes are stored K-sliced (kslice.py) in
    # slices of at most this; 0: never (targets.registry.host_prefetch)
    float_slice_bytes: int = 0

    def float_kslice(self, K: int) -> int:
        """The K-slice width a float body matrix of reduction length K is stored in on this target (0: row-major)."""
        return slice_width(K, self.float_slice_bytes // 4)

    def gemv_rows_for(self, wdtype: str, K: int) -> int:
        return next((r for k, r in self.tuned_gemv_rows if k == K), 1)

    def blocking_for(self, T: int) -> tuple[int, int] | None:
        return next(((nn, nv) for t, nn, nv in self.tuned_blocking if t == T), None)

    def for_kernel(self, op: str, params: dict) -> CpuInfo:
        """The CpuInfo a kernel is built with: a tuned prefetch distance replaces the target's default for its
        class. A prefetch is only a hint, so this never changes what a kernel computes."""
        cls = prefetch_class(op, params)
        for name, nbytes in self.tuned_prefetch:
            if name == cls:
                return replace(self, prefetch_bytes=nbytes, float_prefetch_bytes=nbytes, tuned_prefetch=())
        return self


def prefetch_class(op: str, params: dict) -> str | None:
    """The tuning class of a decode GEMV (one prefetch distance per class), None for every other kernel."""
    if params.get("T") != 1:
        return None
    if op == "linear":
        return "linear_f16" if params.get("wdtype") == "float16" else "linear_f32"
    return op if op in KERNEL_OPS and KERNEL_OPS[op].traits.kind == "linear" else None


# op -> ordered (param, short name in the kernel name, type, default or REQUIRED)
REQUIRED = object()
# fused linears (compiler/lower.py): row counts of the stacked matrices, one output each; () = one matrix, left
# out of the kernel name (e.g. "_s2048x256x256" when fused)
SEGS = ("segs", "s", tuple, ())
ROWS = ("rows", "rows", int, 0)   # row-limited variant (rows.py: ROWS_LIMIT, ROWS_ZERO); left out of the name when 0
# int params that may be 0 (meaning "off"); they are left out of the kernel name when 0, so the names of kernels
# from before the param existed do not change
ZERO_OFF = {("attention", "W"), ("attention", "cap"), ("attention", "P"), ("linear", "KS")}
# dtype params left out of the kernel name at their default (float32), likewise
DEFAULT_OFF = {("attention", "kv"), ("copy", "dtype")}
# bool params left out of the kernel name when off (so the names of kernels from before them do not change)
NAMED_WHEN_ON = {("rope", "P"), ("attention", "M"), ("attention", "rows"), ("kv_q4", "mean"), ("linear", "rowwise")}
OPS = {
    "embed": [("T", "t", int, REQUIRED), ("V", "v", int, REQUIRED), ("D", "d", int, REQUIRED),
              ("wdtype", "", str, "float32")],
    "rmsnorm": [("R", "r", int, REQUIRED), ("D", "d", int, REQUIRED), ("eps", "eps", float, REQUIRED)],
    # rowwise: each token through the decode GEMV's code (MoE routers: a verify pass picks decode's experts)
    "linear": [("T", "t", int, REQUIRED), ("N", "n", int, REQUIRED), ("K", "k", int, REQUIRED),
               ("wdtype", "", str, "float32"), ("bias", "b", bool, False), SEGS, ROWS, ("rowwise", "rowwise", bool, False),
               ("KS", "ks", int, 0)],   # KS: W stored K-sliced, KS columns a slice (kslice.py); 0: row-major
    # P / M: a token tree (the verify program of speculative decoding; an extra int32 tree[2, T] argument)
    "rope": [("T", "t", int, REQUIRED), ("H", "h", int, REQUIRED), ("D", "d", int, REQUIRED),
             ("P", "tree", bool, False)],
    "attention": [("T", "t", int, REQUIRED), ("NH", "nh", int, REQUIRED), ("KVH", "kvh", int, REQUIRED),
                  ("D", "d", int, REQUIRED), ("W", "w", int, 0), ("cap", "cap", float, 0.0),
                  ("M", "tree", bool, False), ("kv", "kv", str, "float32"), ("vkv", "v", str, ""),
                  ("rows", "rows", bool, False), ("P", "split", int, 0)],
    "add": [("R", "r", int, REQUIRED), ("N", "n", int, REQUIRED)],
    "swiglu": [("T", "t", int, REQUIRED), ("F", "f", int, REQUIRED)],
    "copy": [("R", "r", int, REQUIRED), ("N", "n", int, REQUIRED), ("dtype", "", str, "float32")],
    "kv_q8": [("R", "r", int, REQUIRED), ("H", "h", int, REQUIRED), ("D", "d", int, REQUIRED)],
    # mean: the K cache's rows hold keys less a calibrated mean (an extra f32[H*D] argument; quant/key_mean.py)
    "kv_q4": [("R", "r", int, REQUIRED), ("H", "h", int, REQUIRED), ("D", "d", int, REQUIRED),
              ("mean", "mean", bool, False)],
    "relu2_mul": [("T", "t", int, REQUIRED), ("F", "f", int, REQUIRED)],
    "gelu_mul": [("T", "t", int, REQUIRED), ("F", "f", int, REQUIRED)],
    "scale": [("R", "r", int, REQUIRED), ("N", "n", int, REQUIRED), ("c", "c", float, REQUIRED)],
    "softcap": [("R", "r", int, REQUIRED), ("N", "n", int, REQUIRED), ("c", "c", float, REQUIRED)],
    # neuron-bundled FFN (bundled_ffn.py): F neurons in groups of G, hidden size D
    "ffn_select": [("T", "t", int, REQUIRED), ("F", "f", int, REQUIRED), ("G", "g", int, REQUIRED),
                   ("D", "d", int, REQUIRED)],
    "ffn_mul": [("T", "t", int, REQUIRED), ("G", "g", int, REQUIRED)],
    "ffn_accumulate": [("R", "r", int, REQUIRED), ("N", "n", int, REQUIRED)],
    "moe_route": [("T", "t", int, REQUIRED), ("E", "e", int, REQUIRED), ("K", "k", int, REQUIRED),
                  ("normalize", "n", bool, REQUIRED), ("S", "s", int, REQUIRED), ("TP", "tp", int, REQUIRED)],
    "moe_gather": [("T", "t", int, REQUIRED), ("D", "d", int, REQUIRED), ("TP", "tp", int, REQUIRED)],
    "moe_swiglu": [("T", "t", int, REQUIRED), ("F", "f", int, REQUIRED)],
    "moe_scatter": [("T", "t", int, REQUIRED), ("D", "d", int, REQUIRED), ("TP", "tp", int, REQUIRED)],
    "zero": [("R", "r", int, REQUIRED), ("N", "n", int, REQUIRED)],
    "sigmoid_gate": [("T", "t", int, REQUIRED), ("D", "d", int, REQUIRED)],
}


def _packed_op_params(traits) -> list:
    """The params of a packed scheme's kernel op, from its traits (quant/scheme.py KernelTraits)."""
    g = [("G", "g", int, traits.groups[0])] if traits.groups else []
    if traits.kind == "embed":
        return [("T", "t", int, REQUIRED), ("V", "v", int, REQUIRED), ("D", "d", int, REQUIRED), *g]
    return [("T", "t", int, REQUIRED), ("N", "n", int, REQUIRED), ("K", "k", int, REQUIRED), *g,
            ("bias", "b", bool, False), SEGS, ROWS]


def op_spec(op: str) -> list | None:
    """The ordered params of an op: OPS's row, or a packed scheme's op (linear_q8, embed_q4, ...: declared by the
    schemes themselves, quant/: KERNEL_OPS, so a scheme registered later gets its kernels too); None if unknown."""
    if op in OPS:
        return OPS[op]
    return _packed_op_params(KERNEL_OPS[op].traits) if op in KERNEL_OPS else None



def kernel_params(op: str, params: dict) -> dict:
    """Validate and normalize params (types, defaults); raises ValueError on bad input."""
    spec = op_spec(op)
    if spec is None:
        raise ValueError(f"unknown op {op!r}; known: {sorted([*OPS, *KERNEL_OPS])}")
    names = {s[0] for s in spec}
    extra = set(params) - names
    if extra:
        raise ValueError(f"{op}: unknown params {sorted(extra)}")
    out = {}
    for name, _, typ, default in spec:
        if name not in params:
            if default is REQUIRED:
                raise ValueError(f"{op}: missing param {name!r}")
            v = default
        else:
            v = params[name]
        if typ is int:
            lo = 0 if (op, name) in ZERO_OFF or name == "rows" else 1
            if name == "rows" and v is True:
                v = 1   # the row-limited kernels' first mode, from when rows was a flag
            if isinstance(v, bool) or int(v) != v or int(v) < lo or (name == "rows" and v > 2):
                raise ValueError(f"{op}: {name} must be a {'non-negative' if lo == 0 else 'positive'} int, got {v!r}")
            v = int(v)
        elif typ is float:
            v = float(v)
            if name == "cap" and not v >= 0:
                raise ValueError(f"{op}: cap must be >= 0 (0: no soft-capping), got {v!r}")
            if op == "softcap" and not v > 0:
                raise ValueError(f"softcap: c must be > 0, got {v!r}")
        elif typ is bool:
            v = bool(v)
        elif typ is tuple:
            v = check_segs(v, out["N"])
        elif name in ("wdtype", "kv", "vkv", "dtype"):
            v = str(v)
            allowed = (("float32", "float16", "q8", "q4") + (("",) if name == "vkv" else ())
                       if name in ("kv", "vkv") else ("float32", "float16"))
            if v not in allowed:
                raise ValueError(f"{op}: {name} must be one of {', '.join(map(repr, allowed))}, got {v!r}")
        out[name] = v
    if op == "attention" and out["NH"] % out["KVH"]:
        raise ValueError(f"attention: NH={out['NH']} is not a multiple of KVH={out['KVH']}")
    if op == "attention" and not out["P"] <= _attention.SPLIT_MAX:
        raise ValueError(f"attention: P (key segments) must be <= {_attention.SPLIT_MAX}, got {out['P']}")
    if op == "attention" and out["vkv"] == out["kv"]:
        out["vkv"] = ""   # one kernel, one name
    if op == "attention" and out["vkv"] and (out["kv"] in _kv_quant.ROW_WRITERS) != (out["vkv"] in _kv_quant.ROW_WRITERS):
        raise ValueError(f"attention: K cache {out['kv']} and V cache {out['vkv']}: both float or both quantized")
    if op in KERNEL_OPS:
        _check_packed(op, KERNEL_OPS[op].traits, out)
    if op == "ffn_select" and out["F"] % out["G"]:
        raise ValueError(f"ffn_select: F={out['F']} is not a multiple of the group size G={out['G']}")
    if op == "linear":
        check_kslice(out["K"], out["KS"])
    if op == "rope" and out["D"] % 2:
        raise ValueError(f"rope: D={out['D']} must be even")
    return out


def _check_packed(op: str, traits, p: dict) -> None:
    """A packed op's shape rules, from its traits: the scale group G (one the kernels take) and the reduction
    length (K; an embedding's row length D) a multiple of G and of the kernels' granularity."""
    dim = "D" if traits.kind == "embed" else "K"
    if traits.groups:
        if p["G"] not in traits.groups:
            raise ValueError(f"{op}: G must be one of {', '.join(map(str, traits.groups))}, got {p['G']}")
        if p[dim] % p["G"]:
            raise ValueError(f"{op}: {dim}={p[dim]} is not a multiple of the group size G={p['G']}")
    if p[dim] % traits.k_multiple:
        raise ValueError(f"{op}: {dim}={p[dim]} is not a multiple of {traits.k_multiple}")


def _name(op: str, p: dict) -> str:
    return kernel_name(op, [(short, "x".join(map(str, p[name])) if typ is tuple else p[name])
                            for name, short, typ, _ in op_spec(op)
                            if not ((op, name) in ZERO_OFF and p[name] == 0) and not (typ is tuple and not p[name])
                            and not ((op, name) in DEFAULT_OFF and p[name] == "float32")
                            and not (name == "vkv" and not p[name])
                            and not (typ is bool and not p[name] and (op, name) in NAMED_WHEN_ON
                                     or name == "rows" and not p[name])])


def _build(op: str, cpu: CpuInfo, p: dict, fast: bool, tiered: bool = False):
    if p.get("rows") and op != "attention":
        from .rows import ROWS_ZERO, limit_rows

        # float GEMMs: only token blocks (their `t` loop transposes x into zero-padded tiles; skipping rows would leave
        # stale floats in lanes that the last block still multiplies)
        return limit_rows(_build(op, cpu, {**p, "rows": 0}, fast, tiered=True), p["T"], guard_tokens=op != "linear",
                          zero_rest=p["rows"] == ROWS_ZERO)
    if op == "linear":
        if fast:
            return _linear.make(cpu, p["T"], p["N"], p["K"], p["wdtype"], p["bias"], p["segs"], p["rowwise"], p["KS"])
        return _linear.naive(p["T"], p["N"], p["K"], p["wdtype"], p["bias"], p["segs"], p["KS"])
    if op == "attention":
        return _attention.make(cpu, p["T"], p["NH"], p["KVH"], p["D"], simple=not fast, W=p["W"], cap=p["cap"],
                               M=p["M"], KV=p["kv"], VKV=p["vkv"], rows=p["rows"], P=p["P"])
    simple_cpu = cpu if fast else CpuInfo(vector_lanes=1, num_threads=1, arch=cpu.arch)
    if op in KERNEL_OPS:
        traits = KERNEL_OPS[op].traits
        if traits.kind == "embed":
            return _ew.embed_packed(simple_cpu, traits, p["T"], p["V"], p["D"], p.get("G"))
        if fast:
            return _linear_quant.make(traits, cpu, p["T"], p["N"], p["K"], G=p.get("G"), bias=p["bias"], segs=p["segs"],
                                      tiered=tiered)
        return _linear_quant.make_naive(traits, p["T"], p["N"], p["K"], G=p.get("G"), bias=p["bias"], segs=p["segs"])
    if op == "embed":
        return _ew.embed(simple_cpu, p["T"], p["V"], p["D"], p["wdtype"])
    if op == "rmsnorm":
        return _ew.rmsnorm(simple_cpu, p["R"], p["D"], p["eps"])
    if op == "rope":
        return _ew.rope(simple_cpu, p["T"], p["H"], p["D"], p["P"])
    if op == "add":
        return _ew.add(simple_cpu, p["R"], p["N"])
    if op == "swiglu":
        return _ew.swiglu(simple_cpu, p["T"], p["F"])
    if op == "copy":
        return _ew.copy(simple_cpu, p["R"], p["N"], p["dtype"])
    if op == "kv_q8":
        return _kv_quant.q8_rows(simple_cpu, p["R"], p["H"], p["D"])
    if op == "kv_q4":
        return _kv_quant.q4_rows(simple_cpu, p["R"], p["H"], p["D"], p["mean"])
    if op == "relu2_mul":
        return _ew.relu2_mul(simple_cpu, p["T"], p["F"])
    if op == "gelu_mul":
        return _ew.gelu_mul(simple_cpu, p["T"], p["F"])
    if op == "scale":
        return _ew.scale(simple_cpu, p["R"], p["N"], p["c"])
    if op == "softcap":
        return _ew.softcap(simple_cpu, p["R"], p["N"], p["c"])
    if op == "ffn_select":
        return _ffn.ffn_select(simple_cpu, p["T"], p["F"], p["G"], p["D"])
    if op == "ffn_mul":
        return _ffn.ffn_mul(simple_cpu, p["T"], p["G"])
    if op == "ffn_accumulate":
        return _ffn.ffn_accumulate(simple_cpu, p["R"], p["N"])
    if op == "moe_route":
        return _moe.moe_route(simple_cpu, p["T"], p["E"], p["K"], p["normalize"], p["S"], p["TP"])
    if op in ("moe_gather", "moe_scatter"):
        return getattr(_moe, op)(simple_cpu, p["T"], p["D"], p["TP"])
    if op == "moe_swiglu":
        return _moe.moe_swiglu(simple_cpu, p["T"], p["F"])
    if op == "zero":
        return _moe.zero(simple_cpu, p["R"], p["N"])
    if op == "sigmoid_gate":
        return _moe.sigmoid_gate(simple_cpu, p["T"], p["D"])
    raise ValueError(op)


def make_kernel(op: str, cpu: CpuInfo, **params):
    """Returns (name, prim_func) with global_symbol == name. The name is built deterministically from op
    and the (normalized) params, e.g. 'linear_t1_n768_k768_f16_b0', so equal params dedupe to one kernel.
    If the tuned schedule cannot be generated for a shape, a plain (slower, always valid) version is
    returned under the same name. Results are cached (PrimFuncs are immutable)."""
    p = kernel_params(op, params)
    if cpu.vector_lanes < 1 or cpu.vector_lanes & (cpu.vector_lanes - 1):
        raise ValueError(f"vector_lanes must be a power of two, got {cpu.vector_lanes}")
    return _make_cached(op, cpu.for_kernel(op, p), tuple(sorted(p.items())))


# a worker of the test session meets ~1500 kernels (0.05-0.5 MB each); at 512 it parsed some of them again
@functools.lru_cache(maxsize=2048)
def _make_cached(op: str, cpu: CpuInfo, items: tuple):
    p = dict(items)
    name = _name(op, p)
    with frames_without_source(), sources_parsed_once():
        try:
            func = _build(op, cpu, p, fast=True)
        except Exception as e:  # noqa: BLE001 - any schedule failure must fall back to the plain kernel
            log.warning("edgellm.ops: schedule for %s failed (%s: %s); using the plain kernel", name,
                        type(e).__name__, e)
            func = _build(op, cpu, p, fast=False)
    return name, func.with_attr("global_symbol", name)


def host_cpu_info(num_threads: int = 2) -> CpuInfo:
    """CpuInfo for the machine this runs on (tests, benchmarks)."""
    import platform

    import tvm

    arch = platform.machine()
    if arch in ("aarch64", "arm64"):
        return CpuInfo(vector_lanes=4, num_threads=num_threads, arch="aarch64")
    lanes = 8
    try:
        with open("/proc/cpuinfo") as fh:
            flags = fh.read()
        if " avx512f" in flags:
            lanes = 16
        elif " avx2" not in flags:
            lanes = 4
    except OSError:
        cpu = tvm.target.codegen.llvm_get_system_cpu()
        lanes = 16 if any(s in cpu for s in ("avx512", "skylake-avx512", "cascadelake", "icelake",
                                                 "sapphirerapids", "znver4", "znver5")) else 8
    from ...targets.registry import host_prefetch

    return CpuInfo(vector_lanes=lanes, num_threads=num_threads, arch="x86_64", **host_prefetch())


def llvm_target(num_threads: int = 2):
    """LLVM target for the host CPU (tests, benchmarks)."""
    import tvm

    return tvm.target.Target({"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu(),
                              "num-cores": num_threads})
