"""Expert guessers fitted at compile time: per MoE layer, a linear map from the residual stream where decode makes its
guess (models/llama.py `_predict`: the stream entering layer L - D + 1, normed with layer L's MoE norm) to layer L's
router logits, so the experts a token will select are known D layers early.

The plain guess applies layer L's own router to that earlier stream; the fitted one is the router plus a ridge-
regression correction (and a bias) learned on calibration text run through the float model, so with little data it
falls back to the router. On demo-moe's held-out text it raises recall one layer ahead from ~78% to ~85% and two
layers ahead from ~58% to ~82% (README "MoE models bigger than RAM"). The same pass counts how often the calibration
routed to each expert (the manifest's routing statistics)."""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

import numpy as np

RIDGE = 0.1      # penalty, relative to the mean feature energy per token
SEQ_LEN = 256    # calibration sequences of SEQ_LEN tokens: 8 per hidden unit (>= 2 sequences, <= 8)


def _n_tokens(spec) -> int:
    return min(8, max(2, 8 * spec.hidden_size // SEQ_LEN)) * SEQ_LEN
_LAYER = re.compile(r"\.layers\.(\d+)\.")


def weight_name(layer: int) -> str:
    return f"model.layers.{layer}.expert_guess.weight"


def bias_name(layer: int) -> str:
    return f"model.layers.{layer}.expert_guess.bias"


@dataclass
class Guessers:
    weights: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # layer -> (W [E, D], b [E])
    recall: dict[int, tuple[float, float]] = field(default_factory=dict)   # layer -> (router's, fitted) on calibration
    counts: dict[int, list[int]] = field(default_factory=dict)             # layer -> selections per expert
    tokens: int = 0
    source: str = ""

    def raw(self, name: str):
        """The fitted arrays by stored name (None for any other name)."""
        m = _LAYER.search(name)
        if not m or int(m.group(1)) not in self.weights:
            return None
        W, b = self.weights[int(m.group(1))]
        return W if name == weight_name(int(m.group(1))) else b if name == bias_name(int(m.group(1))) else None

    def routing_bin(self, first_weight: dict[int, int], n_weights: int) -> bytes:
        """routing.bin (runtime/contract.py): selections per weight; layer -> its first expert weight."""
        from ..runtime import contract as K

        sel = np.zeros(n_weights, np.uint32)
        for layer, counts in self.counts.items():
            if layer in first_weight:
                sel[first_weight[layer]:first_weight[layer] + len(counts)] = counts
        return K.ROUTING_MAGIC + np.array([K.ROUTING_VERSION, n_weights], "<u4").tobytes() + sel.astype("<u4").tobytes()

    def manifest(self) -> dict:
        return {"calibration_tokens": self.tokens, "calibration": self.source,
                "recall_router": {str(k): round(v[0], 4) for k, v in self.recall.items()},
                "recall_fitted": {str(k): round(v[1], 4) for k, v in self.recall.items()},
                "selections": {str(k): v for k, v in self.counts.items()}}


def _calibration(spec, model_dir, calib_file) -> tuple[list[list[int]], str]:
    tok = model_dir / "tokenizer.json" if model_dir is not None else None
    if tok is not None and tok.is_file():
        from ..errors import CompileError
        from ..quant.calibration import calibration_ids

        try:
            return calibration_ids(tok, calib_file, _n_tokens(spec), SEQ_LEN), calib_file or "built-in text"
        except CompileError:
            if calib_file is not None:
                raise
    rng = np.random.default_rng(0)   # no tokenizer (random-weight benchmark models): seeded random ids
    return [rng.integers(0, spec.vocab_size, SEQ_LEN).tolist() for _ in range(_n_tokens(spec) // SEQ_LEN)], "random ids"


def _top_k(logits: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-logits, axis=-1, kind="stable")[:, :k]


def _recall(pred: np.ndarray, true: np.ndarray, k: int) -> float:
    a, b = _top_k(pred, k), _top_k(true, k)
    return float(np.mean([len(set(x) & set(y)) / k for x, y in zip(a, b)])) if len(a) else 0.0


def _layer_runs(spec, raw, seqs):
    """Yields (layer, inputs, router logits or None) for every decoder layer: the residual stream entering it for
    each calibration sequence, and the router logits it computed. One layer's weights in memory at a time (as GPTQ
    calibrates: quant/calibration.py), so a model far bigger than RAM fits."""
    from ..models import family
    from ..models.numpy_backend import NumpyGraph
    from ..quant.calibration import SKIP, _LayerGraph, _run, _Stop, _Weights

    fwd, f32 = family(spec), np.float32

    def plain(g, x, name, b):
        return g.base_linear(x, name, b)

    class Recorder(_LayerGraph):
        logits = None

        def route(self, x, router, top_k, normalize):
            x = self._val(x, router)
            if x is SKIP:
                return SKIP
            self.logits = x @ self.w(router).T
            return NumpyGraph.route(self, x, router, top_k, normalize)

    xs = [_run(fwd, spec, _Weights(raw), f32, -1, None, ids, plain) for ids in seqs]   # the embeddings
    for layer in range(spec.n_layers):
        weights, outs, logits = _Weights(raw), [], []
        sub = dataclasses.replace(spec, n_layers=layer + 1)
        for ids, x in zip(seqs, xs):
            g = Recorder(sub, weights, f32, layer, x, plain)
            try:
                outs.append(np.asarray(fwd.body(g, list(ids)), f32))
            except _Stop as e:   # pragma: no cover (a plain hook never stops)
                outs.append(e.value)
            if g.logits is not None:
                logits.append(g.logits)
        yield layer, xs, (np.concatenate(logits) if logits else None)
        xs = outs


def fit(spec, raw, model_dir, calib_file, lookahead: int, log=lambda msg: None, guessers: bool = True) -> Guessers:
    """Runs the float model over calibration text layer by layer, keeping the residual stream at every guess point
    and every router's logits; counts each expert's selections and (guessers) fits each guessed layer's map (router
    + ridge correction, and a bias)."""
    from ..models.llama import moe_names

    seqs, source = _calibration(spec, model_dir, calib_file)
    out = Guessers(tokens=sum(len(s) for s in seqs), source=source)
    k = spec.n_experts_per_tok
    inputs: dict[int, list] = {}   # layer -> the residual stream entering it (kept while a later guess needs it)
    for layer, xs, Y in _layer_runs(spec, raw, seqs):
        inputs[layer] = xs
        inputs.pop(layer - lookahead, None)
        if Y is None:
            continue
        Y = Y.astype(np.float64)
        out.counts[layer] = np.bincount(_top_k(Y, k).ravel(), minlength=spec.n_experts).tolist()
        src = layer - lookahead + 1
        if not guessers or not lookahead or src < 0 or not spec.is_moe_layer(layer):
            continue
        names = moe_names(spec, layer)
        norm = np.asarray(raw(f"model.layers.{layer}.post_attention_layernorm.weight"), np.float64)
        X0 = np.concatenate(inputs[src]).astype(np.float64)
        F = X0 / np.sqrt(np.mean(X0 * X0, axis=-1, keepdims=True) + spec.rms_eps) * norm
        R = np.asarray(raw(names["router"]), np.float64)
        X = np.concatenate([F, np.ones((len(F), 1))], 1)
        lam = RIDGE * float(np.mean(np.sum(F * F, axis=1))) + 1e-6
        delta = np.linalg.solve(X.T @ X + lam * np.eye(X.shape[1]), X.T @ (Y - F @ R.T))
        W, b = R + delta[:-1].T, delta[-1]
        out.weights[layer] = (W.astype(np.float32), b.astype(np.float32))
        out.recall[layer] = (_recall(F @ R.T, Y, k), _recall(F @ W.T + b, Y, k))
    if out.recall:
        r0 = np.mean([v[0] for v in out.recall.values()])
        r1 = np.mean([v[1] for v in out.recall.values()])
        log(f"expert guesses {lookahead} layer{'s' if lookahead > 1 else ''} ahead, fitted on {out.tokens} tokens "
            f"({source}): recall on them {100 * r0:.0f}% with the routers, {100 * r1:.0f}% fitted")
    return out
