"""`--layout bundled`: SwiGLU FFNs stored as neuron bundles, so a token reads only the neuron groups it uses.

Each FFN y = down(silu(gate(x)) * up(x)) with F neurons is stored as
    gate        [F, D] in the package's scheme, computed in full every token (it decides what else is read);
    bundle j    one weight per group of G neurons: up rows [jG, jG+G) then down columns [jG, jG+G), each in the
                scheme (64-byte aligned views), so a group is one contiguous read;
    ffn_scale   [F] f32 per-neuron output scale used to score groups (compiler/neuron_stats.py).
The neurons are reordered at compile time (most active first, from calibration text: exact, the FFN is a sum over
neurons) so that groups hold neurons of similar activity and cold groups are skipped together.

Lowered per FFN (ops in compiler/ops/bundled_ffn.py):
    gate GEMV -> ffn_select (ids of the groups to run, -1 after the last; their silu(gate); acc = 0)
    ROUTE over the ids: up_j GEMV -> ffn_mul -> down_j GEMV -> ffn_accumulate
Decode skips the groups whose estimated output is below the run-time threshold (EL_SETTING_FFN_THRESHOLD; 0 keeps
all: exact); prefill runs every group. The weight store sees each bundle as a routed weight: the window policy
caches the bundles recent tokens used and reads only the missing ones (offload/window.c).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import CompileError
from ..runtime.contract import ARG_ARENA, ARG_SETTINGS, ARG_WEIGHT, FLAG_EXPERT, FLAG_SLOT, SETTING_FFN_THRESHOLD
from .program import Arg, Route, Step
from .trace import Node, Val

NODE = "ffn_bundled"
ALIGN = 64
DEFAULT_THRESHOLD = 0.5   # +0.6% decode perplexity on demo-llama (bench/neuron_window.py; README "Neuron window")
MAX_GROUPS = 64           # default group size: the smallest multiple of 32 that gives at most this many groups


@dataclass
class BundleLayout:
    """What the compiler decided: neurons per group, the default threshold, and per FFN (by gate weight name) the
    neuron order and the per-neuron scales (in that order)."""
    group: int
    threshold: float = DEFAULT_THRESHOLD
    order: dict[str, np.ndarray] = field(default_factory=dict)
    scale: dict[str, np.ndarray] = field(default_factory=dict)
    ffns: list[tuple[str, str, str]] = field(default_factory=list)   # (gate, up, down) names, in layer order
    stored: dict = field(default_factory=dict)   # gate name -> (first bundle weight, views, up parts): lowering's

    def raw(self, raw):
        """The checkpoint reader with each FFN's neurons in bundle order, plus the tensors the bundles add."""
        rows = {}
        for gate, up, down in self.ffns:
            rows[gate] = rows[up] = (self.order[gate], 0)
            rows[down] = (self.order[gate], 1)
        scales = {scale_name(gate): self.scale[gate] for gate, _, _ in self.ffns}

        def get(name: str) -> np.ndarray:
            if name == THRESHOLD_NAME:
                return np.array([self.threshold], np.float32)
            if name in scales:
                return scales[name]
            w = raw(name)
            if name in rows:
                order, axis = rows[name]
                w = np.take(np.asarray(w), order, axis=axis)
            return w
        return get

    def manifest(self) -> dict:
        return {"layout": "bundled", "group": self.group, "default_threshold": self.threshold,
                "groups_per_ffn": [len(self.order[g]) // self.group for g, _, _ in self.ffns]}


THRESHOLD_NAME = "ffn.default_threshold"


def scale_name(gate: str) -> str:
    return gate.rsplit(".", 2)[0] + ".ffn_scale"


def bundle_name(gate: str, j: int) -> str:
    return f"{gate.rsplit('.', 2)[0]}.bundle.{j}"


def default_group(F: int) -> int:
    """Neurons per bundle: a multiple of 32 (the q4/q8 block along K for the down slice) dividing F, the smallest
    giving at most MAX_GROUPS groups (each group costs four kernel calls a token)."""
    if F % 32:
        raise CompileError(f"--layout bundled needs an intermediate size that is a multiple of 32, not {F}")
    for g in range(32, F + 1, 32):
        if F % g == 0 and F // g <= MAX_GROUPS:
            return g
    return F


def check_group(F: int, G: int) -> None:
    if G < 32 or G % 32 or F % G:
        raise CompileError(f"--bundle-neurons {G}: give a multiple of 32 that divides the intermediate size {F}")


@dataclass(eq=False)
class BundledFFN:
    inputs: list[Val]
    out: Val
    gate: str
    up: str
    down: str
    temps: dict[str, Val]
    op: str = NODE
    params: dict = field(default_factory=dict)
    weights: list[str] = field(default_factory=list)


def find_ffns(nodes: list) -> list[tuple[Node, Node, Node, Node]]:
    """(gate linear, up linear, swiglu, down linear) quadruples: swiglu of two bias-free linears of one value, read
    only by one bias-free linear."""
    by_out = {n.out.id: n for n in nodes if n.out is not None}
    readers: dict[int, list[Node]] = {}
    for n in nodes:
        for v in n.inputs:
            readers.setdefault(v.id, []).append(n)
    found = []
    for n in nodes:
        if n.op != "swiglu":
            continue
        lg, lu = (by_out.get(v.id) for v in n.inputs)
        rd = readers.get(n.out.id, [])
        if not (lg and lu and len(rd) == 1 and rd[0].op == "linear"):
            continue
        ld = rd[0]
        lin = [lg, lu, ld]
        if any(x.op != "linear" or x.params.get("bias") or x.params.get("ternary") for x in lin):
            continue
        if lg.inputs[0].id != lu.inputs[0].id:
            continue
        found.append((lg, lu, n, ld))
    return found


def bundle_ffns(nodes: list, g, G: int) -> list:
    """The traced nodes with each SwiGLU FFN replaced by one BundledFFN (at its down projection's place)."""
    quads = find_ffns(nodes)
    drop = {id(x) for q in quads for x in q[:3]}
    at = {id(q[3]): q for q in quads}
    out = []
    for n in nodes:
        if id(n) in drop:
            continue
        q = at.get(id(n))
        if q is None:
            out.append(n)
            continue
        lg, lu, _, ld = q
        T, F = lg.out.shape
        D = ld.out.shape[1]
        temps = {"g": g._val((T, F)), "s": g._val((F // G, T, G)), "ids": g._val((F // G,), "int32"),
                 "u": g._val((T, G)), "h": g._val((T, G)), "y": g._val((T, D))}
        out.append(BundledFFN([lg.inputs[0]], ld.out, lg.weights[0], lu.weights[0], ld.weights[0], temps))
    return out


def pack_arrays(arrays: list[np.ndarray]) -> tuple[np.ndarray, list[int]]:
    """Arrays laid end to end, each at a 64-byte aligned offset: (bytes, offsets)."""
    offs, at = [], 0
    for a in arrays:
        offs.append(at)
        at = -(-(at + a.nbytes) // ALIGN) * ALIGN
    buf = np.zeros(at, np.uint8)
    for a, o in zip(arrays, offs):
        buf[o:o + a.nbytes] = np.frombuffer(np.ascontiguousarray(a).tobytes(), np.uint8)
    return buf, offs


def _bundle_weights(low, n: BundledFFN, G: int) -> tuple[int, list[tuple[str, tuple, int]], int]:
    """Stores the FFN's bundles as consecutive weights; returns the first one's index, the views of one bundle
    ((dtype, shape, offset) per part: up's parts, then down's) and how many parts are up's."""
    scheme = low.scheme
    F = low._raw_shape(n.up)[0]
    # sub-matrices in the matrix's scheme (Scheme.cutter: requantized, or t2's codes and one scale kept)
    up = scheme.cutter(low._matrix_parts(n.up, scheme, False))
    down = scheme.cutter(low._matrix_parts(n.down, scheme, False))
    first = len(low.weights.names)
    views = []
    for j in range(F // G):
        r = slice(j * G, (j + 1) * G)
        u, d = up.parts(rows=r), down.parts(cols=r)
        arrays = [u[p] for p in scheme.part_order] + [d[p] for p in scheme.part_order]
        buf, offs = pack_arrays(arrays)
        if low.weights.add(bundle_name(n.gate, j), buf) != first + j:
            raise AssertionError("a bundle was stored before its FFN was lowered")
        views = [(str(a.dtype), a.shape, o) for a, o in zip(arrays, offs)]
    return first, views, len(scheme.part_order)


def lower_bundled(low, n: BundledFFN, T: int, act) -> list:
    scheme, s = low.scheme, low.spec
    F, D = low._raw_shape(n.up)[0], s.hidden_size
    G = low.bundles.group
    NG = F // G
    t = n.temps
    k_gate, gate_args = low._linear_weight(n.gate, T, False)
    steps = [Step(k_gate, [act(n.inputs[0]), *gate_args, act(t["g"])])]
    setting = Arg(ARG_SETTINGS, 0, "float32", (1,), 0, 4 * SETTING_FFN_THRESHOLD)
    k_sel = low._kernel("ffn_select", T=T, F=F, G=G, D=D)
    steps.append(Step(k_sel, [act(t["g"]), low._weight(scale_name(n.gate)), low._weight(THRESHOLD_NAME), setting,
                              act(t["s"]), act(t["ids"]), act(n.out)]))
    if n.gate not in low.bundles.stored:   # the first program lowered stores them; the others reuse them
        low.bundles.stored[n.gate] = _bundle_weights(low, n, G)
    first, views, n_up = low.bundles.stored[n.gate]
    wargs = [Arg(ARG_WEIGHT, first, dt, tuple(shape), FLAG_EXPERT, off, 1) for dt, shape, off in views]
    up_op, up_params = scheme.linear_kernel(T, G, D, False)
    down_op, down_params = scheme.linear_kernel(T, D, G, False)
    s_slot = Arg(ARG_ARENA, 0, "float32", (1, T, G), FLAG_SLOT, act(t["s"]).offset)
    body = [Step(low._kernel(up_op, **up_params), [act(n.inputs[0]), *wargs[:n_up], act(t["u"])]),
            Step(low._kernel("ffn_mul", T=T, G=G), [s_slot, act(t["u"]), act(t["h"])]),
            Step(low._kernel(down_op, **down_params), [act(t["h"]), *wargs[n_up:], act(t["y"])]),
            Step(low._kernel("ffn_accumulate", R=T, N=D), [act(t["y"]), act(n.out)])]
    return steps + [Route(act(t["ids"]).offset, NG, NG, len(body))] + body


def ffn_names(spec) -> list[tuple[str, str, str]]:
    """(gate, up, down) weight names of the model's SwiGLU FFNs, in layer order (from the traced decode graph)."""
    from ..models import family
    from .trace import TraceGraph

    g = TraceGraph(spec, 1)
    family(spec).body(g, g.input_ids())
    return [(lg.weights[0], lu.weights[0], ld.weights[0]) for lg, lu, _, ld in find_ffns(g.nodes)]
