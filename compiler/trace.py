"""The tracing Graph backend: running a model definition on it records a list of op nodes with static shapes."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..models.spec import ModelSpec
from .routing import RoutingTable


@dataclass(eq=False)
class Val:
    id: int
    shape: tuple[int, ...]
    dtype: str = "float32"


@dataclass(eq=False)
class Node:
    op: str
    inputs: list[Val]
    out: Val | None
    weights: list[str] = field(default_factory=list)   # checkpoint names, in kernel argument order
    params: dict = field(default_factory=dict)
    temps: dict = field(default_factory=dict)          # name -> Val: scratch of this node only (lowering)


class TraceGraph:
    def __init__(self, spec: ModelSpec, tokens: int, expert_lookahead: int = 0, guess_width: int = 0):
        from ..models import family

        self.spec, self.T = spec, tokens
        # decode (T = 1) reads experts ahead: the model asks for predictions this many layers ahead (0: none)
        self.expert_lookahead = expert_lookahead if tokens == 1 else 0
        self.guess_width = guess_width   # experts a guess names (0: top_k)
        self.wshape = family(spec).weight_shapes(spec)
        self.nodes: list[Node] = []
        self._n = 0

    def _val(self, shape, dtype="float32") -> Val:
        self._n += 1
        return Val(self._n, tuple(shape), dtype)

    def _emit(self, op, inputs, shape, weights=(), **params) -> Val:
        out = self._val(shape)
        self.nodes.append(Node(op, list(inputs), out, [w for w in weights if w is not None], params))
        return out

    # program inputs
    def input_ids(self) -> Val:
        return self._val((self.T,), "int32")

    def input_hidden(self) -> Val:
        return self._val((self.T, self.spec.hidden_size))

    # Graph API (models/graph.py)
    def embed(self, ids, w):
        return self._emit("embed", [ids], (self.T, self.spec.hidden_size), [w])

    def rmsnorm(self, x, w):
        return self._emit("rmsnorm", [x], x.shape, [w], heads=1)

    def head_rmsnorm(self, x, w, n_heads):
        return self._emit("rmsnorm", [x], x.shape, [w], heads=n_heads)

    def linear(self, x, w, b=None):
        return self._emit("linear", [x], (x.shape[0], self.wshape[w][0]), [w, b], bias=b is not None)

    def rope(self, x, n_heads, table="rope"):
        return self._emit("rope", [x], x.shape, [f"{table}.cos", f"{table}.sin"], heads=n_heads)

    def kv_store(self, layer, k, v):
        self.nodes.append(Node("kv_store", [k, v], None, params={"layer": layer}))

    def attention(self, q, layer):
        return self._emit("attention", [q], q.shape, layer=layer)

    def add(self, a, b):
        return self._emit("add", [a, b], a.shape)

    def swiglu(self, gate, up):
        return self._emit("swiglu", [gate, up], gate.shape)

    def relu2_mul(self, gate, up):
        return self._emit("relu2_mul", [gate, up], gate.shape)

    def gelu_mul(self, gate, up):
        return self._emit("gelu_mul", [gate, up], gate.shape)

    def softcap(self, x, cap):
        return self._emit("softcap", [x], x.shape, c=float(cap))

    def route(self, x, router, top_k, normalize):
        E = self.wshape[router][0]
        table = RoutingTable(self.T, E, top_k)
        out = self._val((table.words,), "int32")
        self.nodes.append(Node("moe_route", [x], out, [router], {"table": table, "normalize": bool(normalize)},
                               {"logits": self._val((self.T, E))}))
        return out

    def experts(self, x, routing, experts):
        F, D = self.wshape[experts[0][0]]
        T = self.T
        table = next(n.params["table"] for n in reversed(self.nodes) if n.out is routing)
        temps = {"xe": self._val((T, D)), "g": self._val((T, F)), "u": self._val((T, F)), "h": self._val((T, F)),
                 "y": self._val((T, D))}
        out = self._val(x.shape)
        self.nodes.append(Node("moe_experts", [x, routing], out, [], {"table": table, "experts": list(experts)},
                               temps))
        return out

    def sigmoid_gate(self, x, w, y):
        return self._emit("sigmoid_gate", [x, y], y.shape, [w])

    def predict_experts(self, x, norm, router, top_k, experts, layer):
        E = self.wshape[router][0]
        table = RoutingTable(self.T, E, min(E, self.guess_width or top_k))
        temps = {"h": self._val(x.shape), "logits": self._val((self.T, E)), "table": self._val((table.words,), "int32")}
        self.nodes.append(Node("moe_predict", [x], None, [norm, router],
                               {"table": table, "experts": list(experts), "layer": layer}, temps))

    def bitlinear(self, x, w):
        # packed ternary weights: 4 output rows per byte row (models/bitnet.py)
        return self._emit("linear", [x], (x.shape[0], 4 * self.wshape[w + ".weight"][0]), [w + ".weight"],
                          bias=False, ternary=True)
