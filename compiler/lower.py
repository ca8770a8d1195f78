"""Graph -> Plan: turn traced programs into kernel calls with a static activation memory plan.

Each traced node becomes one kernel call (ops.make_kernel), except that the linears reading one value (q/k/v,
gate/up) are fused into one call (fuse_linears): their matrices are stored stacked row-wise as one tensor and the
kernel writes each matrix's rows to that matrix's own output, so one pass over the input serves them all and a
decode step launches 4 GEMVs per Llama layer instead of 7. Values live in one arena (first-fit by lifetime);
K/V rows are written straight into the runtime's KV cache by the producing kernel (RoPE for K, the projection
for V), so no copy is needed; attention reads the cache prefix whose length the runtime sets per call."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..models.spec import ModelSpec
from ..runtime.contract import ARG_ARENA as ARENA
from ..runtime.contract import ARG_KCACHE as KCACHE
from ..runtime.contract import ARG_VCACHE as VCACHE
from ..runtime.contract import ARG_WEIGHT as WEIGHT
from ..runtime.contract import (BACKEND_QNN_ORT, BACKEND_TVM_CPU, KERNEL_WRITES_KV, PROGRAM_ROWS,
                                PROGRAM_SKIPS_FIRST, PROGRAM_TREE, ROWS_BYTES, TENSOR_ALIGN)
from ..runtime.contract import DTYPES as _DT
from ..runtime.contract import FLAG_AT_POS as AT_POS
from ..runtime.contract import FLAG_PREFIX as PREFIX
from ..runtime.contract import TENSOR_ALIGN as ALIGN
from ..quant.key_mean import key_mean_name
from .kv_layout import KEY_MEAN, QUANTIZED_KV, kv_row_bytes
from .ops.attention import split_for
from .ops.kslice import to_sliced
from .ops.rows import CNT_SHAPE, ROWS_LIMIT, ROWS_ZERO
from .program import Arg, Predict, Program, Route, Step  # noqa: F401 (re-exported)
from .trace import Node, TraceGraph, Val


FUSED = "linear_fused"


@dataclass(eq=False)
class FusedLinear:
    """Linears on one input computed by one kernel (q/k/v, gate/up): their matrices stacked row-wise, one output
    per member, so arena lifetimes and the KV-cache placement of V stay per matrix."""
    members: list[Node]
    op: str = FUSED

    @property
    def inputs(self) -> list[Val]:
        return self.members[0].inputs

    @property
    def outs(self) -> list[Val]:
        return [m.out for m in self.members]


def _outs(n) -> list[Val]:
    return n.outs if isinstance(n, FusedLinear) else [] if n.out is None else [n.out]


def _fuse_key(n: Node) -> tuple:
    return (n.inputs[0].id, n.params["bias"], bool(n.params.get("ternary")))


def fuse_linears(nodes: list, fusable) -> list:
    """The nodes with each group of fusable linears that read the same value (same bias-ness and ternary-ness, and
    the same truthy `fusable(n)`: the scheme their matrices are stored in) replaced by one FusedLinear at the first
    member's place. Moving a later member up is safe: its input is ready
    there and its output is a new value or, for V, KV-cache rows that only attention reads; so a group never spans
    an attention or a kv_store (BitNet's q, rope, k, rope, v still fuse)."""
    out, open_groups = [], {}
    for n in nodes:
        if n.op in ("attention", "kv_store"):
            open_groups.clear()
        how = fusable(n) if n.op == "linear" else None
        if not how:
            out.append(n)
            continue
        g = open_groups.get((_fuse_key(n), how))
        if g is not None:
            g.members.append(n)
            continue
        open_groups[(_fuse_key(n), how)] = g = FusedLinear([n])
        out.append(g)
    return [n.members[0] if isinstance(n, FusedLinear) and len(n.members) == 1 else n for n in out]


def _sliced(parts: dict, ks: int) -> dict:
    """A float matrix's parts with W in the K-sliced byte order (ops/kslice.py) when ks."""
    return {**parts, "w": to_sliced(parts["w"], ks)} if ks else parts


def _rows(mode: int) -> dict:
    """The `rows` kernel param of a row-limited linear (ops/rows.py), left out when off."""
    return {"rows": mode} if mode else {}


def fused_name(names: list[str]) -> str:
    """The stored name of stacked matrices: 'a.q_proj.weight', 'a.k_proj.weight', 'a.v_proj.weight' ->
    'a.qkv_proj.weight'; 'm.gate_proj.weight', 'm.up_proj.weight' -> 'm.gate_up_proj.weight'."""
    split = [n.rsplit(".", 2) for n in names]
    if any(len(p) != 3 for p in split) or len({(p[0], p[2]) for p in split}) != 1:
        return "+".join(names)
    proj = all(p[1].endswith("_proj") for p in split)
    stems = [p[1].removesuffix("_proj") if proj else p[1] for p in split]
    joined = ("" if all(len(x) == 1 for x in stems) else "_").join(stems)
    return f"{split[0][0]}.{joined}{'_proj' if proj else ''}.{split[0][2]}"


@dataclass
class WeightTable:
    """Stored tensors in first-use order (= execution order of the decode program, which is traced first)."""
    names: list[str] = field(default_factory=list)
    arrays: list[np.ndarray] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, array: np.ndarray) -> int:
        if name not in self.index:
            self.index[name] = len(self.names)
            self.names.append(name)
            self.arrays.append(array)
        return self.index[name]


@dataclass
class KernelTable:
    names: list[str] = field(default_factory=list)
    funcs: dict = field(default_factory=dict)
    writes: dict = field(default_factory=dict)    # name -> bit mask of the arguments the kernel writes
    kv_writers: set = field(default_factory=set)  # kernels some step lets write a KV cache view
    made: dict = field(default_factory=dict)      # name -> (op, params) it was made from (compiler/tune remakes them)

    def add(self, name: str, func, op: str | None = None, params: dict | None = None) -> int:
        if name not in self.funcs:
            from .kernel_table import written_args

            self.funcs[name] = func
            self.made[name] = (op, dict(params or {}))
            self.writes[name] = written_args(func, name)
            self.names.append(name)
        return self.names.index(name)

    def note_steps(self, steps: list[Step]) -> None:
        """Marks the kernels whose outputs some step puts in the KV cache (their table flag allows it)."""
        for st in steps:
            if isinstance(st, (Route, Predict)):
                continue
            name = self.names[st.kernel]
            if any(self.writes[name] >> i & 1 and a.kind in (KCACHE, VCACHE) for i, a in enumerate(st.args)):
                self.kv_writers.add(name)

    def entries(self) -> list[tuple[str, int, int, int]]:
        """(name, n_args, flags, writes) per kernel, in table order: plan.bin's and the kernels' own table."""
        return [(n, len(self.funcs[n].params), KERNEL_WRITES_KV if n in self.kv_writers else 0, self.writes[n])
                for n in self.names]


class _Arena:
    """First-fit allocator over [offset, offset+size) blocks."""

    def __init__(self):
        self.used: list[tuple[int, int]] = []   # (offset, size), sorted
        self.peak = 0

    def alloc(self, nbytes: int) -> int:
        nbytes = (nbytes + ALIGN - 1) // ALIGN * ALIGN
        off = 0
        for o, s in self.used:
            if o - off >= nbytes:
                break
            off = max(off, o + s)
        self.used.append((off, nbytes))
        self.used.sort()
        self.peak = max(self.peak, off + nbytes)
        return off

    def free(self, off: int):
        self.used = [u for u in self.used if u[0] != off]


def _nbytes(v: Val) -> int:
    return int(np.prod(v.shape)) * _DT[v.dtype][1] // 8


class Lowering:
    """Shared state of one package build: the weight table, the kernel table and the weight provider."""

    def __init__(self, spec: ModelSpec, cpu, raw_weight, scheme, head_scheme, rope_rows: int, quantized=None,
                 fuse: bool = True, bundles=None, make_kernel=None, backend: str = BACKEND_TVM_CPU,
                 matrix_schemes=None, kv_dtype: str = "float32", v_dtype: str | None = None, key_mean: bool = False):
        if make_kernel is None:
            from .ops import make_kernel

        self.spec, self.cpu, self.make_kernel = spec, cpu, make_kernel
        self.backend = backend              # the backend tag of the programs it lowers
        self.weights, self.kernels = WeightTable(), KernelTable()
        self._raw = raw_weight              # name -> numpy array as stored in the checkpoint (or a RoPE table)
        self.scheme, self.head_scheme = scheme, head_scheme
        # body matrices stored in another scheme than the body's (name -> Scheme: a GGUF file's mixed block types,
        # compiler/auto_quant.matrix_schemes); dense linears only (experts and bundles stay in the body's)
        self.matrix_schemes = dict(matrix_schemes or {})
        self.quantized = quantized or {}    # name -> parts computed ahead (GPTQ, a file's blocks), for its scheme
        self.rope_rows = rope_rows
        self.kv_dtype = kv_dtype            # the K cache's element type (float32 | float16 | q8 | q4: kv_layout.py)
        self.v_dtype = v_dtype or kv_dtype  # the V cache's (--kv-cache K,V; as K's by default)
        self.key_mean = key_mean            # a q4 K cache holds keys less their calibrated mean (quant/key_mean.py)
        self.fuse = fuse                    # one kernel per group of linears on one input (fuse_linears)
        self.bundles = bundles              # neuron-bundled FFNs (compiler/bundled_ffn.BundleLayout) or None
        self.experts: dict = {}             # MoE layer's experts prefix -> (first weight, views, gate/up parts)
        self.pending_predictions: list = [] # (Predict step, experts prefix) until that layer's experts are stored
        self._tree: Arg | None = None       # while lowering a tree program: its tree view (rope, attention take it)
        self._rows: Arg | None = None       # ... and its count of real rows (the GEMMs take it)
        self._out_id = -1
        self.guessed_layers: set = set()    # MoE layers whose PREDICT steps use a fitted guesser (expert_guess.py)

    @property
    def embed_dtype(self) -> str:
        """How the embedding table is stored: in the head scheme (one copy when the embeddings are tied)."""
        return self.head_scheme.embedding

    def _kernel(self, op: str, **params) -> int:
        name, func = self.make_kernel(op, self.cpu, **params)
        return self.kernels.add(name, func, op, params)

    def _weight(self, name: str, shape=None, flags=0, dtype="float32") -> Arg:
        """A tensor stored as is (norms, biases, RoPE tables, float embedding tables)."""
        if name not in self.weights.index:
            self.weights.add(name, np.ascontiguousarray(self._raw(name), dtype=dtype))
        arr = self.weights.arrays[self.weights.index[name]]
        return Arg(WEIGHT, self.weights.index[name], str(arr.dtype), tuple(shape or arr.shape), flags)

    def _parts(self, name: str, scheme, make_parts) -> list[Arg]:
        """Weight args of a matrix stored in `scheme` (quantized once, shared by every program and by a tied
        embedding / lm_head pair)."""
        keys = [name] if scheme.part_order == ("w",) else [f"{name}.{p}" for p in scheme.part_order]
        if keys[0] not in self.weights.index:
            parts = make_parts()
            for key, part in zip(keys, scheme.part_order):
                self.weights.add(key, np.ascontiguousarray(parts[part]))
        return [Arg(WEIGHT, self.weights.index[k], str(self.weights.arrays[self.weights.index[k]].dtype),
                    self.weights.arrays[self.weights.index[k]].shape) for k in keys]

    def matrix_scheme(self, name: str):
        if name in (self.spec.lm_head_name, "lm_head.weight"):
            return self.head_scheme
        return self.matrix_schemes.get(name, self.scheme)

    def _linear_weight(self, name: str, T: int, bias: bool, rows: int = 0) -> tuple[int, list[Arg]]:
        """Kernel and weight arguments of x @ W.T with W stored in the package's scheme (the lm_head in the head's).
        rows: the row-limited kernel (ops/rows.py; it takes the count as one more argument)."""
        scheme = self.matrix_scheme(name)
        N, K = self._matrix_shape(name, scheme, False)
        ks = self._kslice(name, scheme, K)
        args = self._parts(name, scheme, lambda: _sliced(self._matrix_parts(name, scheme, False), ks))
        op, params = scheme.linear_kernel(T, N, K, bias)
        return self._kernel(op, **params, **_rows(rows), **({"KS": ks} if ks else {})), args

    def _kslice(self, name: str, scheme, K: int) -> int:
        """The K-slice width a float body matrix is stored in (ops/kslice.py; the CPU kernels' target choice), 0 for
        row-major: the head (a tied one is also the embedding table, read by rows), packed schemes, other backends."""
        if (self.backend != BACKEND_TVM_CPU or not scheme.float_math or scheme.part_order != ("w",)
                or name in (self.spec.lm_head_name, "lm_head.weight")):
            return 0
        return self.cpu.float_kslice(K)

    def _ternary_weight(self, name: str, T: int, rows: int = 0) -> tuple[int, list[Arg]]:
        """A BitNet BitLinear: the checkpoint's packed ternary codes and weight_scale, repacked losslessly to t2."""
        t2 = self._t2()
        N, K = self._matrix_shape(name, t2, True)
        args = self._parts(name, t2, lambda: self._matrix_parts(name, t2, True))
        op, params = t2.linear_kernel(T, N, K, False)
        return self._kernel(op, **params, **_rows(rows)), args

    def _fused_weight(self, n: FusedLinear, T: int, rows: int = 0) -> tuple[int, list[Arg]]:
        """Kernel and weight arguments of a FusedLinear: the members' parts stacked (scheme.concat_parts: for
        per-row / per-group scales the same bytes as quantizing the stacked matrix; t2 keeps one scale per
        matrix), stored once under fused_name."""
        names = [m.weights[0] for m in n.members]
        ternary = bool(n.members[0].params.get("ternary"))
        scheme = self._t2() if ternary else self.matrix_scheme(names[0])   # fuse_linears: the members share it
        shapes = [self._matrix_shape(w, scheme, ternary) for w in names]
        segs, K = tuple(N for N, _ in shapes), shapes[0][1]
        ks = 0 if ternary else self._kslice(names[0], scheme, K)
        args = self._parts(fused_name(names), scheme, lambda: _sliced(
            scheme.concat_parts([self._matrix_parts(w, scheme, ternary) for w in names]), ks))
        op, params = scheme.linear_kernel(T, sum(segs), K, n.members[0].params["bias"], segs)
        return self._kernel(op, **params, **_rows(rows), **({"KS": ks} if ks else {})), args

    def _fused_bias(self, n: FusedLinear) -> Arg:
        names = [m.weights[1] for m in n.members]
        key = fused_name(names)
        if key not in self.weights.index:
            self.weights.add(key, np.concatenate([np.asarray(self._raw(b), np.float32) for b in names]))
        return self._weight(key)

    def _fusable(self, n: Node):
        """Body linears fuse (not the lm_head: it has no partner), in a scheme whose parts stack, with the linears
        stored in the same scheme: its name (False: not fusable)."""
        if n.weights[0] in (self.spec.lm_head_name, "lm_head.weight"):
            return False
        if n.params.get("ternary"):
            return "t2"
        scheme = self.matrix_scheme(n.weights[0])
        return scheme.stacking is not None and scheme.name

    @staticmethod
    def _t2():
        from ..quant import get_scheme

        return get_scheme("t2")

    def _matrix_shape(self, name: str, scheme, ternary: bool) -> tuple[int, int]:
        """[N, K] of a matrix (BitNet's packed ternary ones hold 4 rows per byte row), checked against its scheme."""
        N, K = self._raw_shape(name)
        N = 4 * N if ternary else N
        scheme.check_shape(name, (N, K))
        return N, K

    def _matrix_parts(self, name: str, scheme, ternary: bool) -> dict:
        """A matrix's parts in `scheme`: precomputed (GPTQ), repacked BitNet ternary codes, or quantized here."""
        if ternary:
            from ..models.bitnet import unpack_ternary
            from ..quant.t2 import pack_t2

            wscale = np.asarray(self._raw(name.removesuffix(".weight") + ".weight_scale"), np.float64)[0]
            return pack_t2(unpack_ternary(np.asarray(self._raw(name))), 1.0 / float(wscale))
        pre = self.quantized.get(name) if scheme is self.matrix_schemes.get(name, self.scheme) else None
        return pre if pre is not None else scheme.quantize(np.asarray(self._raw(name), dtype=np.float32))

    def _raw_shape(self, name: str) -> tuple[int, int]:
        from ..models import family

        return family(self.spec).weight_shapes(self.spec)[name]

    def program(self, name: str, g: TraceGraph, inp: Val, out: Val, tree: bool = False) -> Program:
        """tree: the input is T ids then a token tree (int32 [T + 1, T]: depths, then each row's ancestors by depth;
        ops/attention.py) that RoPE and attention follow (PROGRAM_TREE: the verify program's drafts may branch)."""
        s, T = self.spec, g.T
        nodes = g.nodes
        if self.bundles is not None:
            from .bundled_ffn import bundle_ffns

            nodes = bundle_ffns(nodes, g, self.bundles.group)
        nodes = fuse_linears(nodes, self._fusable) if self.fuse else nodes
        # 1. values that a producer writes straight into the KV cache
        consumers: dict[int, int] = {}
        for n in nodes:
            for v in n.inputs:
                consumers[v.id] = consumers.get(v.id, 0) + 1
        producer = {o.id: n for n in nodes for o in _outs(n)}
        kv_loc: dict[int, tuple[int, int]] = {}   # val id -> (KCACHE|VCACHE, layer)
        for n in nodes:
            if n.op == "kv_store":
                for v, kind in zip(n.inputs, (KCACHE, VCACHE)):
                    p = producer.get(v.id)
                    # a float32 cache only: producers write f32 rows (a float16 cache's rows come through a copy)
                    if (p is not None and consumers[v.id] == 1 and p.op in ("rope", "linear", FUSED)
                            and self._cache_dtype(kind) == "float32"):
                        kv_loc[v.id] = (kind, n.params["layer"])   # else _lower_node emits a copy
        # 2. lifetimes
        last_use: dict[int, int] = {}
        for i, n in enumerate(nodes):
            for v in n.inputs:
                last_use[v.id] = i
        last_use[out.id] = len(nodes)
        if tree:
            last_use[inp.id] = len(nodes)   # the tree after the ids is read by every layer
        arena = _Arena()
        ids_bytes = -(-_nbytes(inp) // TENSOR_ALIGN) * TENSOR_ALIGN   # the tree starts aligned after the ids
        rows_at = -(-(ids_bytes + 4 * T * (T + 1)) // TENSOR_ALIGN) * TENSOR_ALIGN   # then (PROGRAM_ROWS) the row count
        loc: dict[int, int] = {inp.id: arena.alloc(rows_at + ROWS_BYTES if tree else _nbytes(inp))}
        self._tree = Arg(ARENA, 0, "int32", (T + 1, T), 0, loc[inp.id] + ids_bytes) if tree else None
        self._rows = Arg(ARENA, 0, "int32", CNT_SHAPE, 0, loc[inp.id] + rows_at) if tree else None
        self._out_id = out.id
        steps: list[Step] = []

        def act(v: Val, shape=None) -> Arg:
            if v.id in kv_loc:
                kind, layer = kv_loc[v.id]
                return Arg(kind, layer, "float32", tuple(shape or (T, s.n_kv_heads * s.head_dim)), AT_POS)
            return Arg(ARENA, 0, v.dtype, tuple(shape or v.shape), 0, loc[v.id])

        for i, n in enumerate(nodes):
            for o in _outs(n):   # a fused group's outputs all at once
                if o.id not in kv_loc:
                    loc[o.id] = arena.alloc(_nbytes(o))
            temps = list(getattr(n, "temps", {}).values())   # scratch of one node, freed right after it
            for v in temps:
                loc[v.id] = arena.alloc(_nbytes(v))
            steps.extend(self._lower_node(n, T, act))
            for v in temps:
                arena.free(loc[v.id])
            for v in n.inputs:
                if last_use.get(v.id) == i and v.id in loc and v.id != out.id:
                    arena.free(loc[v.id])
        row_bytes = _nbytes(out) // T
        if self.pending_predictions:
            from .moe import resolve_predictions

            resolve_predictions(self)
        self.kernels.note_steps(steps)
        self._tree = self._rows = None
        return Program(name, T, steps, loc[inp.id], loc[out.id], row_bytes, arena.peak, self.backend,
                       PROGRAM_TREE | PROGRAM_ROWS if tree else 0)

    def _lower_node(self, n: Node, T: int, act) -> list[Step]:
        s, op = self.spec, n.op
        if op == "ffn_bundled":
            from .bundled_ffn import lower_bundled

            return lower_bundled(self, n, T, act)
        if op in ("moe_route", "moe_experts", "sigmoid_gate", "moe_predict"):
            from . import moe

            return {"moe_route": moe.lower_route, "moe_experts": moe.lower_experts,
                    "sigmoid_gate": moe.lower_sigmoid_gate, "moe_predict": moe.lower_predict}[op](self, n, T, act)
        if op == "embed":
            name, (V, D), head = n.weights[0], self._raw_shape(n.weights[0]), self.head_scheme
            head.check_shape(name, (V, D))   # stored like the lm_head (shared with it when tied)
            wargs = self._parts(name, head, lambda: head.quantize(np.asarray(self._raw(name), np.float32)))
            kop, kparams = head.embed_kernel(T, V, D)
            k = self._kernel(kop, **kparams)
            steps = [Step(k, [act(n.inputs[0]), *wargs, act(n.out)])]
            if s.embed_scale != 1.0:   # Gemma: rows times sqrt(hidden), in place (the tied lm_head stays unscaled)
                steps.append(Step(self._kernel("scale", R=T, N=D, c=float(np.float32(s.embed_scale))),
                                  [act(n.out), act(n.out)]))
            return steps
        if op == "rmsnorm":
            h = n.params["heads"]
            R, D = T * h, n.inputs[0].shape[1] // h
            k = self._kernel("rmsnorm", R=R, D=D, eps=float(s.rms_eps))
            return [Step(k, [act(n.inputs[0], (R, D)), self._weight(n.weights[0]), act(n.out, (R, D))])]
        # the verify program's GEMMs compute its real rows only (PROGRAM_ROWS): zeros past them keep every later
        # kernel's padding rows finite; the program's own output (the logits) is only read up to them
        rows = (0 if self._rows is None or op not in ("linear", FUSED, "attention")
                else ROWS_LIMIT if [o.id for o in _outs(n)] == [self._out_id] else ROWS_ZERO)
        cnt = [self._rows] if rows else []   # attention: its query blocks likewise (zeros past them)
        if op == FUSED:
            k, wargs = self._fused_weight(n, T, rows)
            bias = [self._fused_bias(n)] if n.members[0].params["bias"] else []
            return [Step(k, [act(n.inputs[0]), *wargs, *bias, *[act(o) for o in n.outs], *cnt])]
        if op == "linear" and n.params.get("ternary"):
            k, wargs = self._ternary_weight(n.weights[0], T, rows)
            return [Step(k, [act(n.inputs[0]), *wargs, act(n.out), *cnt])]
        if op == "linear":
            k, wargs = self._linear_weight(n.weights[0], T, n.params["bias"], rows)
            bias = [self._weight(n.weights[1])] if n.params["bias"] else []
            return [Step(k, [act(n.inputs[0]), *wargs, *bias, act(n.out), *cnt])]
        if op == "rope":
            H, D = n.params["heads"], s.head_dim
            tree = [self._tree] if self._tree else []   # rows rotate by their depth (<= their slot): table rows < T
            k = self._kernel("rope", T=T, H=H, D=D, **({"P": True} if tree else {}))
            cs = [self._weight(w, (T, D // 2), AT_POS) for w in n.weights]
            return [Step(k, [act(n.inputs[0], (T, H, D)), *cs, *tree, act(n.out, (T, H, D))])]
        if op == "attention":
            NH, KVH, D, layer = s.n_heads, s.n_kv_heads, s.head_dim, n.params["layer"]
            W = s.window(layer)   # sliding window; one at least as long as the KV cache (rope_rows) never cuts
            tree = [self._tree] if self._tree else []
            W = 0 if W >= self.rope_rows else W
            # key segments where decode's head blocks cannot keep the threads busy: every program's kernel the same,
            # so prefill and verify rows round as decode's (CPU kernels; OpenCL's attention has its own schedule)
            P = split_for(self.cpu, NH, KVH) if W == 0 and self.backend == BACKEND_TVM_CPU else 0
            k = self._kernel("attention", T=T, NH=NH, KVH=KVH, D=D, W=W, **({"P": P} if P else {}),
                             cap=float(np.float32(s.attn_softcap)), **({"M": True} if tree else {}),
                             **({"kv": self.kv_dtype} if self.kv_dtype != "float32" else {}),
                             **({"vkv": self.v_dtype} if self.v_dtype != self.kv_dtype else {}),
                             **({"rows": True} if cnt else {}))
            kv = [self._kv_view(kind, layer, T, PREFIX) for kind in (KCACHE, VCACHE)]
            return [Step(k, [act(n.inputs[0], (T, NH, D)), *kv, *tree, act(n.out), *cnt])]
        if op in ("add", "swiglu", "relu2_mul", "gelu_mul"):
            R, N = n.out.shape
            k = self._kernel(op, R=R, N=N) if op == "add" else self._kernel(op, T=R, F=N)
            return [Step(k, [act(v) for v in n.inputs] + [act(n.out)])]
        if op == "softcap":   # in place: out may be the input
            R, N = n.out.shape
            return [Step(self._kernel("softcap", R=R, N=N, c=float(np.float32(n.params["c"]))),
                         [act(n.inputs[0]), act(n.out)])]
        if op == "kv_store":
            steps = []
            for v, kind in zip(n.inputs, (KCACHE, VCACHE)):
                if act(v).kind == kind:   # produced in place (an f32 cache)
                    continue
                dst, dtype = self._kv_view(kind, n.params["layer"], v.shape[0], AT_POS), self._cache_dtype(kind)
                if kind == KCACHE and self.key_mean and KEY_MEAN.get(dtype):   # keys less their mean (key_mean.py)
                    k = self._kernel(f"kv_{dtype}", R=v.shape[0], H=s.n_kv_heads, D=s.head_dim, mean=True)
                    mu = self._weight(key_mean_name(n.params["layer"]), (1, s.n_kv_heads * s.head_dim))
                    steps.append(Step(k, [act(v), mu, dst]))
                    continue
                if dtype in QUANTIZED_KV:   # quantized as the rows are written
                    k = self._kernel(f"kv_{dtype}", R=v.shape[0], H=s.n_kv_heads, D=s.head_dim)
                else:                       # copied into the cache rows (f16: rounded)
                    dt = {"dtype": dtype} if dtype != "float32" else {}
                    k = self._kernel("copy", R=v.shape[0], N=v.shape[1], **dt)
                steps.append(Step(k, [act(v), dst]))
            return steps
        raise AssertionError(f"no lowering for op {op}")

    def _kv_view(self, kind: int, layer: int, rows: int, flag: int) -> Arg:
        """rows of a layer's K or V cache as the attention and row-writing kernels take them (kv_layout.py)."""
        KVH, D, dtype = self.spec.n_kv_heads, self.spec.head_dim, self._cache_dtype(kind)
        if dtype in QUANTIZED_KV:
            return Arg(kind, layer, "int8", (rows, kv_row_bytes(KVH, D, int(dtype[1:]))), flag)
        return Arg(kind, layer, dtype, (rows, KVH, D) if flag == PREFIX else (rows, KVH * D), flag)

    def _cache_dtype(self, kind: int) -> str:
        return self.kv_dtype if kind == KCACHE else self.v_dtype


PROGRAMS = (  # name, tokens ("chunk", "short" or a count), body, head
    ("decode", 1, True, True),
    ("prefill", "chunk", True, False),
    ("prefill_logits", "chunk", True, True),
    ("head", 1, False, True),
    ("prefill_short", "short", True, False),   # only with a short chunk: the tail of a prompt (runtime el_prefill)
    ("verify", "verify", True, True),          # speculative decoding: a token and its drafts, each one's logits
)


def lower_model(spec: ModelSpec, cpu, raw_weight, scheme, head_scheme, chunk: int,
                kv_rows: int, quantized=None, short_chunk: int | None = None, verify_tokens: int | None = None,
                fuse: bool = True, npu_chunk: int | None = None, bundles=None,
                expert_lookahead: int = 0, guessed_layers=(), guess_width: int = 0, make_kernel=None,
                backend: str = BACKEND_TVM_CPU, matrix_schemes=None,
                kv_dtype: str = "float32", v_dtype: str | None = None,
                key_mean: bool = False) -> tuple[Lowering, list[Program]]:
    """expert_lookahead: decode predicts each MoE layer's experts from the residual stream this many layers
    earlier (1: at the layer's own input; 0: no predictions), naming guess_width experts (0: top-k); the layers in
    guessed_layers use a fitted guesser (compiler/expert_guess.py). fuse: one kernel per group of linears on one
    input (q/k/v, gate/up; fuse_linears); off for A/B runs. npu_chunk: also npu_embed (the chunk's embedding rows,
    on the CPU) and npu_prefill (the chunk on the NPU backend: no steps, its graphs are the package's npu/).
    make_kernel / backend: another kernel library and the backend its programs run on (compiler/opencl: OpenCL)."""
    from ..models import family

    fam = family(spec)
    low = Lowering(spec, cpu, raw_weight, scheme, head_scheme, kv_rows, quantized, fuse, bundles, make_kernel, backend,
                   matrix_schemes, kv_dtype, v_dtype, key_mean)
    low.guessed_layers = set(guessed_layers)
    progs = []
    for name, tokens, body, head in PROGRAMS:
        if (tokens == "short" and not short_chunk) or (tokens == "verify" and not verify_tokens):
            continue
        g = TraceGraph(spec, {"chunk": chunk, "short": short_chunk, "verify": verify_tokens}.get(tokens, tokens),
                       expert_lookahead, guess_width)
        inp = g.input_ids() if body else g.input_hidden()
        x = fam.body(g, inp) if body else inp
        if head:
            x = fam.head(g, x)
        # the CPU's verify program takes token trees (the kernels of other backends have no tree variant)
        progs.append(low.program(name, g, inp, x, tree=tokens == "verify" and backend == BACKEND_TVM_CPU))
    if npu_chunk:
        g = TraceGraph(spec, npu_chunk)
        inp = g.input_ids()
        emb = low.program("npu_embed", g, inp, g.embed(inp, "model.embed_tokens.weight"))
        rows = npu_chunk * emb.out_row_bytes
        out = -(-(emb.out_offset + rows) // TENSOR_ALIGN) * TENSOR_ALIGN
        progs += [emb, Program("npu_prefill", npu_chunk, [], emb.out_offset, out, emb.out_row_bytes, out + rows,
                               BACKEND_QNN_ORT, PROGRAM_SKIPS_FIRST)]   # graphs calibrated without the sink
    return low, progs
