"""Calibration data and whole-model GPTQ (quant/gptq.py) for the q4 schemes.

    seqs = calibration_ids(model_dir / "tokenizer.json", calib_file=None)       # --calib FILE, or built in
    parts = gptq_model(spec, raw, get_scheme("q4g32"), seqs, act_order=False, progress=True)
    # (gptq_from_checkpoint(spec, raw, scheme, model_dir / "tokenizer.json", calib_file) does both)
    # parts[name] == {"qweight", "scales"}: the layout scheme.quantize(raw(name)) returns, for every linear
    # weight of the transformer body (q/k/v/o, gate/up/down, MoE experts); lm_head / embeddings: not included

Built-in calibration text: windows of the demo models' TRAINING split of the Python standard library
(quant/corpus.py: build_corpus / split_corpus), alternating Python source and the English language
reference (pydoc_data topics). Documents of the held-out split (models/demo/heldout.txt) are excluded by name
and by content, and every window is checked not to occur in heldout.txt, so perplexity on the held-out text
stays an honest measurement after GPTQ. For models meant for other text, pass --calib with text of the domain.

GPTQ runs layer by layer, as the paper does: the inputs of layer i's linears are computed by the model whose
layers < i are already quantized. Each calibration sequence's hidden state is kept between layers, so each
layer is evaluated only a few times (the numpy reference backend, models/numpy_backend.py, runs one layer at
a time: earlier layers are skipped and their output substituted). Within a layer the linears are quantized
"true sequential": [q, k, v] -> [o] -> [gate, up] -> [down], each group seeing the outputs of the groups
quantized before it.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ..errors import CompileError
from ..models.numpy_backend import NumpyGraph
from ..models.spec import ModelSpec
from .gptq import Q4_GRID, gptq_quantize, prepare_hessian
from .q4 import pack_q4

DEFAULT_TOKENS = 4096
DEFAULT_SEQ_LEN = 256
MIN_TOKENS = 16


# ------------------------------------------------------------------------------------------ calibration text
def _load_tokenizer(path):
    from tokenizers import Tokenizer

    p = Path(path)
    if not p.is_file():
        raise CompileError(f"GPTQ calibration needs the model's tokenizer: {p} not found")
    try:
        return Tokenizer.from_file(str(p))
    except Exception as e:  # tokenizers raises plain Exceptions
        raise CompileError(f"cannot read tokenizer {p}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from e


def builtin_calibration_docs() -> list[tuple[str, str]]:
    """(name, text) of the demo training split that may be used for calibration: not a held-out document by
    name (models/demo/results.json and split_corpus) nor by content (a text contained in heldout.txt), in a
    deterministic diverse order (SHA-256 of the name), alternating Python source and English reference text."""
    return list(_builtin_calibration_docs())


@functools.lru_cache(maxsize=1)
def _builtin_calibration_docs() -> tuple[tuple[str, str], ...]:
    # read once per process: walking and reading the standard library takes ~2 s, and a compile can calibrate
    # several times (KV-cache key means, expert guessers, GPTQ, the NPU's ranges)
    import json

    from ..models.demo import DEMO_DIR, HELDOUT
    from .corpus import build_corpus, split_corpus

    heldout_text = HELDOUT.read_text(encoding="utf-8")
    train, held = split_corpus(build_corpus())
    banned = {n for n, _ in held}
    try:
        banned |= set(json.loads((DEMO_DIR / "results.json").read_text())["corpus"]["heldout_names"])
    except (OSError, KeyError, ValueError):
        pass
    docs = [(n, t) for n, t in train if n not in banned and t not in heldout_text]
    docs.sort(key=lambda d: hashlib.sha256(d[0].encode()).hexdigest())
    code = [d for d in docs if not d[0].startswith("pydoc_data/")]
    text = [d for d in docs if d[0].startswith("pydoc_data/")]
    out = []
    for i in range(max(len(code), len(text))):
        out += [lst[i] for lst in (code, text) if i < len(lst)]
    return tuple(out)


def calibration_ids(tokenizer_json_path, calib_file=None, n_tokens: int = DEFAULT_TOKENS,
                    seq_len: int = DEFAULT_SEQ_LEN) -> list[list[int]]:
    """Calibration token sequences of seq_len tokens, about n_tokens in all.

    calib_file: a UTF-8 text file (--calib): n_tokens // seq_len windows spread evenly over its tokens (all of
    it, in seq_len chunks, when it is shorter). None: the built-in text (see the module doc), one window from
    the middle of each document, none of which occurs in models/demo/heldout.txt."""
    if n_tokens < 1 or seq_len < 1:
        raise CompileError(f"GPTQ calibration: n_tokens ({n_tokens}) and seq_len ({seq_len}) must be positive")
    tok = _load_tokenizer(tokenizer_json_path)
    n_seqs = max(1, n_tokens // seq_len)
    if calib_file is not None:
        p = Path(calib_file)
        if not p.is_file():
            raise CompileError(f"calibration file not found: {p} (--calib takes a UTF-8 text file)")
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise CompileError(f"cannot read calibration file {p} as UTF-8 text: {e}") from e
        ids = tok.encode(text, add_special_tokens=False).ids
        if len(ids) < MIN_TOKENS:
            raise CompileError(f"calibration file {p} has only {len(ids)} tokens; GPTQ needs at least {MIN_TOKENS} "
                               f"(a few thousand recommended)")
        if len(ids) <= n_seqs * seq_len:
            seqs = [ids[i:i + seq_len] for i in range(0, len(ids), seq_len)]
            return [s for s in seqs if len(s) >= MIN_TOKENS]
        starts = np.linspace(0, len(ids) - seq_len, n_seqs).round().astype(int)
        return [ids[s:s + seq_len] for s in starts]

    from ..models.demo import HELDOUT

    heldout_text = HELDOUT.read_text(encoding="utf-8")
    seqs: list[list[int]] = []
    for _, text in builtin_calibration_docs():
        ids = tok.encode(text, add_special_tokens=False).ids
        if len(ids) < seq_len:
            continue
        s = (len(ids) - seq_len) // 2
        win = ids[s:s + seq_len]
        if tok.decode(win) in heldout_text:
            continue
        seqs.append(win)
        if len(seqs) == n_seqs:
            break
    if not seqs:
        raise CompileError("no built-in calibration text fits this tokenizer; pass --calib FILE")
    return seqs


# ------------------------------------------------------------------------- one layer of the numpy backend
class _Skip:
    """Value of every op of the layers before the one being evaluated (nothing is computed)."""


SKIP = _Skip()


class _Stop(Exception):
    def __init__(self, value=None):
        super().__init__()
        self.value = value


_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def _layer_of(name: str | None) -> int | None:
    m = _LAYER_RE.search(name or "")
    return int(m.group(1)) if m else None


class _LayerGraph(NumpyGraph):
    """NumpyGraph evaluating only decoder layer `layer` of a body() whose spec has n_layers = layer + 1: ops of
    earlier layers return SKIP; the first op naming a weight of `layer` (or taking it as its layer index)
    switches evaluation on, and SKIP operands (the residual stream) are replaced by x_in, the hidden state the
    previous layers produced. layer = -1: raise _Stop(embeddings) at embed. Every linear goes through
    hook(graph, x, name, bias)."""

    def __init__(self, spec, weight, dtype, layer: int, x_in, hook):
        super().__init__(spec, weight, dtype)
        self.layer, self.x_in, self.hook, self.active = layer, x_in, hook, False

    def _see(self, layer: int | None):
        if layer is not None and layer == self.layer:
            self.active = True

    def _val(self, x, name=None):
        self._see(_layer_of(name))
        if x is SKIP and self.active:
            return self.x_in
        return x

    def _vals(self, *xs):
        xs = tuple(self._val(x) for x in xs)
        return None if any(x is SKIP for x in xs) else xs

    def embed(self, ids, w):
        if self.layer < 0:
            raise _Stop(super().embed(ids, w).astype(self.dtype))
        self._T = len(ids)
        return SKIP

    def rmsnorm(self, x, w):
        x = self._val(x, w)
        return SKIP if x is SKIP else super().rmsnorm(x, w)

    def head_rmsnorm(self, x, w, n_heads):
        x = self._val(x, w)
        return SKIP if x is SKIP else super().head_rmsnorm(x, w, n_heads)

    def linear(self, x, w, b=None):
        x = self._val(x, w)
        return SKIP if x is SKIP else self.hook(self, x, w, b)

    def base_linear(self, x, w, b=None):
        return super().linear(x, w, b)

    def rope(self, x, n_heads, table="rope"):
        x = self._val(x)
        return SKIP if x is SKIP else super().rope(x, n_heads, table).astype(self.dtype)

    def kv_store(self, layer, k, v):
        self._see(layer)
        kv = self._vals(k, v)
        if kv is not None:
            super().kv_store(layer, *kv)

    def attention(self, q, layer):
        self._see(layer)
        q = self._val(q)
        return SKIP if q is SKIP else super().attention(q, layer).astype(self.dtype)

    def add(self, a, b):
        v = self._vals(a, b)
        return SKIP if v is None else super().add(*v)

    def swiglu(self, gate, up):
        v = self._vals(gate, up)
        return SKIP if v is None else super().swiglu(*v)

    def relu2_mul(self, gate, up):
        v = self._vals(gate, up)
        return SKIP if v is None else super().relu2_mul(*v)

    def gelu_mul(self, gate, up):
        v = self._vals(gate, up)
        return SKIP if v is None else super().gelu_mul(*v)

    def bitlinear(self, x, w):
        raise CompileError("GPTQ does not apply to BitNet checkpoints (their weights are already ternary)")

    def route(self, x, router, top_k, normalize):
        x = self._val(x, router)
        return SKIP if x is SKIP else super().route(x, router, top_k, normalize)

    def experts(self, x, routing, experts):
        """NumpyGraph.experts, expert by expert through self.linear (so the hook sees each expert's tokens): every
        gate/up first, then every down (the order true-sequential GPTQ needs); experts without tokens run on
        0 rows."""
        x = self._val(x)
        if x is SKIP or routing is SKIP:
            return SKIP
        top, wts = routing
        wts = wts.astype(x.dtype)
        hs = []
        for e, (gate, up, _) in enumerate(experts):
            rows, slot = np.nonzero(top == e)
            xe = x[rows]
            hs.append((rows, slot, self.swiglu(self.linear(xe, gate), self.linear(xe, up))))
        out = np.zeros_like(x)
        for (rows, slot, h), (_, _, down) in zip(hs, experts):
            out[rows] += wts[rows, slot][:, None] * self.linear(h, down)
        return out

    def sigmoid_gate(self, x, w, y):
        v = self._vals(x, y)
        return SKIP if v is None else super().sigmoid_gate(v[0], w, v[1])


def _run(fwd, spec, weight, dtype, layer, x_in, ids, hook):
    """Output of decoder layer `layer` (hidden state [T, hidden]) for one sequence, or what _Stop carried."""
    sub = dataclasses.replace(spec, n_layers=max(layer + 1, 1))
    g = _LayerGraph(sub, weight, dtype, layer, x_in, hook)
    try:
        return fwd.body(g, list(ids))
    except _Stop as e:
        return e.value


class _Weights:
    """Weight getter of one layer: f32 arrays read once; quantized matrices replaced by their dequantized value."""

    def __init__(self, get_weight: Callable[[str], np.ndarray]):
        self.get, self.arrays = get_weight, {}

    def __call__(self, name: str) -> np.ndarray:
        if name not in self.arrays:
            self.arrays[name] = np.asarray(self.get(name), np.float32)
        return self.arrays[name]


class _Capture:
    """Linear hook: accumulates X^T X (float64) of the linears of the stage being calibrated (linears feeding on
    the same array share one sum), lets earlier stages run on their quantized weights, and stops the layer at
    the first linear of a later stage."""

    def __init__(self, stage_of: dict[str, int], stage: int, skip: int = 0):
        self.stage_of, self.stage, self.skip = stage_of, stage, skip   # skip: leading rows left out of X^T X
        self.xtx: dict[str, np.ndarray] = {}
        self.n: dict[str, int] = {}
        self.key: dict[str, str] = {}
        self._last = None

    def __call__(self, g, x, name, b):
        s = self.stage_of.get(name)
        if s is not None and s > self.stage:
            raise _Stop()
        if s == self.stage:
            if self._last is not None and self._last[0] is x:
                key = self._last[1]
            else:
                key = name
                x64 = np.asarray(x[self.skip:], np.float64)
                if key not in self.xtx:
                    self.xtx[key], self.n[key] = np.zeros((x64.shape[1],) * 2), 0
                self.xtx[key] += x64.T @ x64
                self.n[key] += x64.shape[0]
                self._last = (x, key)
            self.key[name] = key
        return g.base_linear(x, name, b)

    def hessian(self, name: str) -> tuple[str | None, np.ndarray | None]:
        """(key, H = 2 X^T X / n) of this linear's inputs (linears with the same key share H); (None, None) if
        it saw no token."""
        key = self.key.get(name)
        n = self.n.get(key, 0) if key else 0
        return (key, self.xtx[key] * (2.0 / n)) if n else (None, None)


# true-sequential groups of a decoder layer, in the order the forward pass uses them
_STAGES = (r"\.(q_proj|k_proj|v_proj)\.weight$", r"\.o_proj\.weight$",
           r"\.(gate_proj|up_proj|w1|w3)\.weight$", r"\.(down_proj|w2)\.weight$")


def _stage_index(name: str) -> int | None:
    return next((k for k, pat in enumerate(_STAGES) if re.search(pat, name)), None)


def _stages(names: list[str], true_sequential: bool) -> list[list[str]]:
    idx = [_stage_index(n) for n in names]
    if not true_sequential or None in idx or idx != sorted(idx):
        return [list(names)]          # unknown layout: every linear calibrated on the layer's float inputs
    return [[n for n, k in zip(names, idx) if k == s] for s in sorted(set(idx))]


# ---------------------------------------------------------------------------------------- memory guard
def available_memory() -> int:
    """Bytes of memory available to this process (MemAvailable on Linux, else free physical pages)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def gptq_memory_estimate(spec: ModelSpec, n_tokens: int, seq_len: int) -> tuple[int, int]:
    """(total bytes, Hessian bytes) GPTQ needs at its peak: the float64 Hessians of one layer's largest
    true-sequential group (one per distinct input), the Cholesky work of the widest linear, one layer's weights
    (float, dequantized), the working copy of the largest matrix, and the hidden states of the calibration
    tokens (input and output of the layer) with one sequence's activations."""
    from ..models import family

    shapes = {n: s for n, s in family(spec).weight_shapes(spec).items()
              if _layer_of(n) == 0 and len(s) == 2 and _stage_index(n) is not None}
    if not shapes:
        return 0, 0
    per_stage: dict[int, dict[str, int]] = {}
    for n, (_, K) in shapes.items():
        per_stage.setdefault(_stage_index(n), {})[n.rsplit(".", 2)[0]] = K
    hess = max(sum(8 * K * K for K in owners.values()) for owners in per_stage.values())
    kmax = max(K for _, K in shapes.values())
    chol = 5 * 8 * kmax * kmax
    weights = sum(2 * 4 * N * K for N, K in shapes.values())
    work = 3 * 4 * max(N * K for N, K in shapes.values())
    acts = 2 * 4 * n_tokens * spec.hidden_size
    acts += 4 * seq_len * (4 * max(spec.intermediate_size, spec.hidden_size) + 3 * spec.n_heads * seq_len)
    return hess + chol + weights + work + acts, hess


def check_memory(spec: ModelSpec, n_tokens: int, seq_len: int) -> None:
    """CompileError if GPTQ of this model would not fit in the memory available now."""
    need, hess = gptq_memory_estimate(spec, n_tokens, seq_len)
    avail = available_memory()
    if need > avail:
        gb = 2 ** 30
        raise CompileError(f"GPTQ needs ~{need / gb:.1f} GiB of memory ({hess / gb:.1f} GiB of layer Hessians + "
                           f"weights and activations of {n_tokens} calibration tokens), only {avail / gb:.1f} GiB "
                           "is available; use RTN (drop --gptq) or calibrate on fewer tokens")


# ------------------------------------------------------------------------------------------- whole model
def gptq_model(spec: ModelSpec, get_weight: Callable[[str], np.ndarray], scheme, seqs: Sequence[Sequence[int]],
               act_order: bool = False, progress=None, *, true_sequential: bool = True, block: int = 128,
               percdamp: float = 0.01, dtype=np.float32, skip: int = 0) -> dict[str, dict[str, np.ndarray]]:
    """GPTQ of every linear weight of the transformer body, sequentially layer by layer.

    get_weight(name) -> f32 checkpoint tensor (the compiler's raw()); scheme: a q4 Scheme; seqs: calibration
    token ids (calibration_ids). progress: None, True (tqdm bar over layers on stderr) or a callable
    progress(layers_done, n_layers). Returns {name: {"qweight", "scales"}} in exactly the layout of
    scheme.quantize(get_weight(name)). A linear that saw no calibration token (an MoE expert never routed to)
    falls back to RTN (scheme.quantize). skip: each sequence's first `skip` positions stay out of the Hessians
    (dense models: the NPU graphs never see position 0, the attention sink, whose massive activations would
    dominate X^T X)."""
    from ..models import family

    if not getattr(scheme, "gptq", False):
        from .scheme import SCHEMES

        raise CompileError(f"GPTQ applies to the q4 schemes ({', '.join(n for n, s in SCHEMES.items() if s.gptq)}), "
                           f"not {getattr(scheme, 'name', scheme)}")
    if not getattr(family(spec), "FLOAT_LINEARS", True):
        raise CompileError(f"GPTQ does not apply to {spec.arch} ({spec.family} family): its weights are not "
                           "float linears (BitNet checkpoints are already ternary)")
    seqs = [[int(t) for t in s] for s in seqs if len(s)]
    if not seqs:
        raise CompileError("GPTQ needs calibration text: got no calibration tokens")
    n_tokens = sum(len(s) for s in seqs)
    check_memory(spec, n_tokens, max(len(s) for s in seqs))
    fwd = family(spec)
    shapes = fwd.weight_shapes(spec)

    bar = None
    if progress is True:
        from tqdm.auto import tqdm

        bar = tqdm(total=spec.n_layers, desc=f"GPTQ {scheme.name}", unit="layer")

    embed_w = _Weights(get_weight)
    xs = [_run(fwd, spec, embed_w, dtype, -1, None, ids, None) for ids in seqs]
    del embed_w
    out: dict[str, dict[str, np.ndarray]] = {}
    try:
        for layer in range(spec.n_layers):
            weights = _Weights(get_weight)
            names: list[str] = []

            def record(g, x, name, b, names=names):
                if name not in names:
                    names.append(name)
                return g.base_linear(x, name, b)

            _run(fwd, spec, weights, dtype, layer, xs[0], seqs[0], record)
            for name in names:
                scheme.check_shape(name, shapes.get(name, weights(name).shape))
            stages = _stages(names, true_sequential)
            stage_of = {n: k for k, group in enumerate(stages) for n in group}
            for k, group in enumerate(stages):
                cap = _Capture(stage_of, k, skip)
                for ids, x in zip(seqs, xs):
                    _run(fwd, spec, weights, dtype, layer, x, ids, cap)
                prepared = {}
                for name in group:
                    w = weights(name)
                    key, H = cap.hessian(name)
                    sch = scheme.for_name(name) if hasattr(scheme, "for_name") else scheme   # (mixed precision)
                    if key is None:
                        parts = sch.quantize(w)
                    else:
                        if key not in prepared:
                            prepared[key] = prepare_hessian(H, act_order, percdamp)
                        if hasattr(sch, "gptq_quantize"):   # a grid of its own (the NPU's offset blocks)
                            parts = sch.gptq_quantize(w, prepared[key], block)
                        else:
                            grid = getattr(sch, "gptq_grid", Q4_GRID)   # q4, or the NPU graphs' int8
                            pack = getattr(sch, "gptq_pack", pack_q4)
                            parts = pack(*gptq_quantize(w, prepared[key], sch.group or w.shape[1], block=block,
                                                        grid=grid))
                    out[name] = parts
                    weights.arrays[name] = sch.dequantize(parts)
                del cap, prepared
            plain = _Capture({}, 0)
            xs = [_run(fwd, spec, weights, dtype, layer, x, ids, plain) for ids, x in zip(seqs, xs)]
            if bar is not None:
                bar.update(1)
            elif callable(progress):
                progress(layer + 1, spec.n_layers)
    finally:
        if bar is not None:
            bar.close()
    return out


def gptq_from_checkpoint(spec: ModelSpec, get_weight: Callable[[str], np.ndarray], scheme, tokenizer_json_path,
                         calib_file=None, act_order: bool = False, n_tokens: int = DEFAULT_TOKENS,
                         seq_len: int = DEFAULT_SEQ_LEN, progress=None) -> dict[str, dict[str, np.ndarray]]:
    """calibration_ids + gptq_model in one call (what `edgellm compile --quant q4gG --gptq [--calib FILE]`
    needs): {linear weight name: q4 parts} for the transformer body."""
    seqs = calibration_ids(tokenizer_json_path, calib_file, n_tokens=n_tokens, seq_len=seq_len)
    return gptq_model(spec, get_weight, scheme, seqs, act_order=act_order, progress=progress)


def perplexity(spec: ModelSpec, get_weight: Callable[[str], np.ndarray], ids: Sequence[int], ctx: int = 256,
               dtype=np.float64) -> tuple[float, int]:
    """(perplexity, tokens scored) of ids with the numpy backend, in non-overlapping windows of ctx + 1 tokens
    (each window predicts its last ctx tokens from the ones before; models/demo/train.py's windows)."""
    from ..models.numpy_backend import NumpyModel

    m = NumpyModel(spec, get_weight, dtype)
    nll, count = 0.0, 0
    for s in range(0, len(ids) - 1, ctx):
        w = list(ids[s:s + ctx + 1])
        if len(w) < 2:
            break
        logits = m.logits(w[:-1]).astype(np.float64)
        logits -= logits.max(-1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        nll -= float(logp[np.arange(len(w) - 1), w[1:]].sum())
        count += len(w) - 1
    return math.exp(nll / count), count
