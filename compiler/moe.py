"""Mixture-of-experts layers in a package: the routing table, routed expert steps and the expert weight layout.

Lowered per MoE layer (kernels in compiler/ops/moe.py):
    router GEMM (f32 weights: the router stays float) -> moe_route (top-k per token, grouped by expert into the
        call's routing table)
    zero(out); ROUTE over the used experts (ascending ids, -1 after the last), per expert e:
        moe_gather (its tokens' rows, packed) -> gate/up GEMM (fused, expert e's weights) -> moe_swiglu -> down GEMM
        -> moe_scatter (out[token] += weight * row)
A decode step runs its k experts with one row each; a prefill chunk runs each used expert once over the rows of
the tokens routed to it (the GEMMs are row-limited, compiler/ops/rows.py), so it reads each used expert's weights
once per chunk, not once per token.

Weights: each expert of a layer is ONE stored weight, `<layer's experts prefix>.<e>`: its fused gate/up parts then
its down parts in the package's scheme, 64-byte aligned views (so an expert is one contiguous, 16 KiB-aligned
read: what expert offload streams), and the experts of a layer are consecutive weights, so a ROUTE body names
expert e's views as weight `first + e` (EL_FLAG_EXPERT, expert_stride 1). The manifest's "moe" section is the
expert table."""
from __future__ import annotations

import numpy as np

from ..runtime.contract import ARG_ARENA, ARG_WEIGHT, FLAG_EXPERT, FLAG_SLOT, weights_read_per_token
from .bundled_ffn import pack_arrays
from .program import Arg, Predict, Route, Step
from .routing import CNT, RoutingTable  # noqa: F401 (RoutingTable re-exported)


def expert_weight_name(gate: str) -> str:
    """'model.layers.0.mlp.experts.3.gate_proj.weight' -> 'model.layers.0.mlp.experts.3'."""
    return gate.rsplit(".", 2)[0]


def float_weights(spec) -> set[str]:
    """Matrices stored in f32 whatever the scheme: routers and shared-expert gates (a few rows; their outputs pick
    and weigh experts, so they stay exact)."""
    from ..models.llama import moe_names

    out = set()
    for i in range(spec.n_layers):
        if spec.is_moe_layer(i):
            n = moe_names(spec, i)
            out.add(n["router"])
            if n["shared_gate"]:
                out.add(n["shared_gate"])
    return out


def _f32():
    from ..quant import get_scheme

    return get_scheme("f32")


def router_kernel(f32, T: int, E: int, D: int, bias: bool):
    """The router's f32 GEMM: at T > 1 each token through decode's GEMV code, so that a verify pass (and prefill)
    routes each token on logits bitwise those of its decode step: a near-tie of two experts' logits then cannot pick
    another expert in the pass than decoding would."""
    op, params = f32.linear_kernel(T, E, D, bias)
    return op, {**params, "rowwise": T > 1}


def lower_route(low, n, T: int, act) -> list:
    name, tb = n.weights[0], n.params["table"]
    E, D = low._raw_shape(name)
    f32 = _f32()
    rargs = low._parts(name, f32, lambda: f32.quantize(np.asarray(low._raw(name), np.float32)))
    op, params = router_kernel(f32, T, E, D, False)
    base = act(n.out).offset
    views = [Arg(ARG_ARENA, 0, "int32", (tb.S,), 0, base), Arg(ARG_ARENA, 0, "int32", (tb.S, CNT), 0, base + tb.cnt_at),
             Arg(ARG_ARENA, 0, "int32", (tb.S, tb.TP), 0, base + tb.tok_at),
             Arg(ARG_ARENA, 0, "float32", (tb.S, tb.TP), 0, base + tb.wt_at)]
    k_route = low._kernel("moe_route", T=T, E=E, K=tb.k, normalize=n.params["normalize"], S=tb.S, TP=tb.TP)
    logits = act(n.temps["logits"])
    return [Step(low._kernel(op, **params), [act(n.inputs[0]), *rargs, logits]), Step(k_route, [logits, *views])]


def lower_predict(low, n, T: int, act) -> list:
    """PREDICT, then its body: rmsnorm with the target layer's MoE norm -> its router (f32) -> moe_route into a
    table of this node's own; the PREDICT step names the target layer's expert weights (resolved by
    resolve_predictions once that layer's experts are stored: they come later in the file)."""
    from .expert_guess import bias_name, weight_name

    norm, router = n.weights
    tb, (E, D) = n.params["table"], low._raw_shape(router)
    layer = n.params["layer"]
    fitted = layer in low.guessed_layers   # the compile-time fitted guesser (compiler/expert_guess.py), else the router
    mat = weight_name(layer) if fitted else router
    f32 = _f32()
    rargs = low._parts(mat, f32, lambda: f32.quantize(np.asarray(low._raw(mat), np.float32)))
    bias = [low._weight(bias_name(layer))] if fitted else []
    op, params = router_kernel(f32, T, E, D, fitted)
    h, logits, base = act(n.temps["h"]), act(n.temps["logits"]), act(n.temps["table"]).offset
    views = [Arg(ARG_ARENA, 0, "int32", (tb.S,), 0, base), Arg(ARG_ARENA, 0, "int32", (tb.S, CNT), 0, base + tb.cnt_at),
             Arg(ARG_ARENA, 0, "int32", (tb.S, tb.TP), 0, base + tb.tok_at),
             Arg(ARG_ARENA, 0, "float32", (tb.S, tb.TP), 0, base + tb.wt_at)]
    body = [Step(low._kernel("rmsnorm", R=T, D=D, eps=float(low.spec.rms_eps)), [act(n.inputs[0]), low._weight(norm), h]),
            Step(low._kernel(op, **params), [h, *rargs, *bias, logits]),
            Step(low._kernel("moe_route", T=T, E=E, K=tb.k, normalize=False, S=tb.S, TP=tb.TP), [logits, *views])]
    pred = Predict(base, tb.S, E, len(body), [])
    low.pending_predictions.append((pred, expert_weight_name(n.params["experts"][0][0])))
    return [pred, *body]


def resolve_predictions(low) -> None:
    """Fills in the expert weights each PREDICT step names (its layer's experts are stored by now)."""
    for pred, key in low.pending_predictions:
        first, views, _ = low.experts[key]
        pred.args = [Arg(ARG_WEIGHT, first, dt, tuple(shape), FLAG_EXPERT, off, 1) for dt, shape, off in views]
    low.pending_predictions.clear()


def lower_sigmoid_gate(low, n, T: int, act) -> list:
    D = n.inputs[0].shape[1]
    return [Step(low._kernel("sigmoid_gate", T=T, D=D), [act(n.inputs[0]), low._weight(n.weights[0]),
                                                           act(n.inputs[1]), act(n.out)])]


def expert_schemes(low, experts):
    """(gate/up's scheme, down's) of a layer's experts: their matrices' own (Lowering.matrix_scheme: a GGUF file's
    block types), gate and up in the body's unless they share one."""
    gate, up, down = experts[0]
    gu = low.matrix_scheme(gate)
    return (gu if low.matrix_scheme(up) is gu else low.scheme), low.matrix_scheme(down)


def _expert_weights(low, experts) -> tuple[int, list[tuple[str, tuple, int]], int]:
    """Stores a layer's experts as consecutive weights (one per expert); returns the first one's index, the views of
    one expert ((dtype, shape, offset) per part: fused gate/up's, then down's) and how many parts are gate/up's."""
    gs, ds = expert_schemes(low, experts)
    first = len(low.weights.names)
    views, n_gu = [], len(gs.part_order)
    for e, (gate, up, down) in enumerate(experts):
        gu = gs.concat_parts([low._matrix_parts(gate, gs, False), low._matrix_parts(up, gs, False)])
        dn = low._matrix_parts(down, ds, False)
        arrays = [np.ascontiguousarray(gu[p]) for p in gs.part_order] + \
                 [np.ascontiguousarray(dn[p]) for p in ds.part_order]
        buf, offs = pack_arrays(arrays)
        if low.weights.add(expert_weight_name(gate), buf) != first + e:
            raise AssertionError("an expert was stored before its layer was lowered")
        views = [(str(a.dtype), a.shape, o) for a, o in zip(arrays, offs)]
    return first, views, n_gu


def lower_experts(low, n, T: int, act) -> list:
    tb, experts = n.params["table"], n.params["experts"]
    gs, ds = expert_schemes(low, experts)
    F, D = low._raw_shape(experts[0][0])
    key = expert_weight_name(experts[0][0])
    if key not in low.experts:   # the first program lowered stores them; the others reuse them
        low.experts[key] = _expert_weights(low, experts)
    first, views, n_gu = low.experts[key]
    base = act(n.inputs[1]).offset

    def slot(dtype, shape, at):
        return Arg(ARG_ARENA, 0, dtype, shape, FLAG_SLOT, base + at)

    tok, wt, cnt = slot("int32", (1, tb.TP), tb.tok_at), slot("float32", (1, tb.TP), tb.wt_at), slot("int32", (1, CNT), tb.cnt_at)
    wargs = [Arg(ARG_WEIGHT, first, dt, tuple(shape), FLAG_EXPERT, off, 1) for dt, shape, off in views]
    gu_op, gu_params = gs.linear_kernel(T, 2 * F, D, False, (F, F))
    dn_op, dn_params = ds.linear_kernel(T, D, F, False)
    rows = []
    if T > 1:   # a prefill chunk: only the expert's rows (decode: always one)
        gu_params, dn_params, rows = {**gu_params, "rows": True}, {**dn_params, "rows": True}, [cnt]
    t = {k: act(v) for k, v in n.temps.items()}
    x = act(n.inputs[0])
    body = [Step(low._kernel("moe_gather", T=T, D=D, TP=tb.TP), [x, tok, cnt, t["xe"]]),
            Step(low._kernel(gu_op, **gu_params), [t["xe"], *wargs[:n_gu], t["g"], t["u"], *rows]),
            Step(low._kernel("moe_swiglu", T=T, F=F), [t["g"], t["u"], cnt, t["h"]]),
            Step(low._kernel(dn_op, **dn_params), [t["h"], *wargs[n_gu:], t["y"], *rows]),
            Step(low._kernel("moe_scatter", T=T, D=D, TP=tb.TP), [t["y"], tok, wt, cnt, act(n.out)])]
    return [Step(low._kernel("zero", R=T, N=D), [act(n.out)]), Route(base, tb.S, tb.E, len(body)), *body]


def manifest(spec, low, table: list[dict], n_params: int) -> dict:
    """The expert table: per MoE layer the first expert weight and the bytes of one expert; totals of parameters
    and of the weight bytes a decode token reads (non-expert weights, the embedding table's one row, top-k experts)."""
    by_name = {t["name"]: t for t in table}
    layers, skipped = [], 0
    k, E = spec.n_experts_per_tok, spec.n_experts
    for key, (first, _, _) in low.experts.items():
        t = by_name[low.weights.names[first]]
        layers.append({"name": key.rsplit(".", 1)[0], "first_weight": first, "expert_bytes": t["nbytes"]})
        skipped += (E - k) * t["nbytes"]
    per_expert = 3 * spec.hidden_size * spec.expert_size
    n_moe = sum(spec.is_moe_layer(i) for i in range(spec.n_layers))
    expert_params = n_moe * E * per_expert
    return {"experts": E, "top_k": k, "norm_topk_prob": spec.norm_topk_prob,
            "shared_expert": spec.shared_expert_intermediate_size, "moe_layers": n_moe, "layers": layers,
            "params_total": n_params, "params_active": n_params - expert_params + n_moe * k * per_expert,
            "weights_read_per_token": weights_read_per_token({"tensors": table}) - skipped}
