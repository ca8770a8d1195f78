"""Fixed-size prefill chunks over the NPU group graphs (compiler/onnx_qnn/graph.py), in Python: the feeds of a chunk
(RoPE rows, additive masks) and a runner that carries one KV cache through the groups. The compiler calibrates and
checks its graphs with it; the C runtime's QNN backend builds the same feeds.

The cache is the runtime's layout: per layer K and V of [kv_rows, kv_heads, head_dim] float32, row = position."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Not -1e4: a 16-bit activation range that must hold -1e4 leaves the softmax inputs no resolution (toolchain notes).
# exp(-50) ~ 2e-22: a hidden key gets no weight.
MASK_VALUE = -50.0


def rope_rows(spec, pos: int, chunk: int, table: str = "rope") -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [chunk, 1, head_dim] of positions pos .. pos+chunk-1 (halves repeated: rotate-half pairing)."""
    from ...models.rope import cos_sin

    c, s = cos_sin(spec, np.arange(pos, pos + chunk), table)
    f = lambda a: np.concatenate([a, a], -1).astype(np.float32)[:, None, :]   # noqa: E731
    return f(c), f(s)


def rope_tables(spec) -> list[str]:
    """The RoPE tables a model's layers read, in the order npu/rope.bin stores them ("rope" first)."""
    return sorted({spec.rope_table(layer) for layer in range(spec.n_layers)} | {"rope"})


def rope_inputs(table: str) -> tuple[str, str]:
    """The graph inputs carrying a table's cos and sin rows (compiler/onnx_qnn/graph.py)."""
    return ("cos", "sin") if table == "rope" else (f"cos_{table.removeprefix('rope_')}", f"sin_{table.removeprefix('rope_')}")


def mask(pos: int, chunk: int, kv_rows: int, window: int = 0) -> np.ndarray:
    """Additive mask [chunk, kv_rows + chunk]: query i (position pos+i) sees cached rows j < pos and chunk rows j <= i,
    and with a sliding window W only keys at positions > pos+i-W."""
    q = pos + np.arange(chunk)[:, None]
    kpos = np.concatenate([np.arange(kv_rows), pos + np.arange(chunk)])[None, :]
    visible = np.concatenate([np.broadcast_to(np.arange(kv_rows) < pos, (chunk, kv_rows)),
                              np.arange(chunk)[None, :] <= np.arange(chunk)[:, None]], axis=1)
    if window:
        visible &= kpos > q - window
    return np.where(visible, 0.0, MASK_VALUE).astype(np.float32)


@dataclass
class Outliers:
    """The CPU's share of one layer's FFN down projection (llm.npu's shadow outlier execution): the graph clips the
    projection's input to +-threshold and outputs outl<layer>, the raw values of `channels`; the CPU adds
    (outl - clip(outl)) @ cols in float. cols: [len(channels), hidden] = W_down[:, channels].T."""
    layer: int
    threshold: float
    channels: np.ndarray
    cols: np.ndarray

    def correction(self, outl: np.ndarray) -> np.ndarray:
        d = outl - np.clip(outl, -self.threshold, self.threshold)
        return d @ self.cols


@dataclass
class Group:
    layers: tuple[int, int]     # [l0, l1)
    session: object             # onnxruntime InferenceSession
    inputs: tuple[str, ...]
    outliers: tuple[Outliers, ...] = ()


class ChunkRunner:
    """Prefill in chunks of C tokens through the group sessions, over one KV cache (numpy, or views of the C
    context's cache). `observe(group_index, feeds)`, when given, sees every group's feeds (calibration).

    first: the groups position 0 runs through instead (the float graphs: the stand-in for the CPU, which runs
    position 0 of every context in the runtime, runtime/core/context.c). Trained LLMs park massive activations (10^3-10^4
    x the median, in a few residual channels) on the first token, the attention sink; a 16-bit range wide enough for
    them leaves every other token's residual stream, and the squares inside its RMSNorms, no resolution. Taking
    position 0 off the NPU takes them out of every graph's ranges (see the README, "Android NPU")."""

    def __init__(self, spec, groups: list[Group], chunk: int, kv_rows: int, cache_k=None, cache_v=None,
                 first: list[Group] | None = None):
        self.spec, self.groups, self.C, self.L, self.first = spec, groups, chunk, kv_rows, first
        shape = (spec.n_layers, kv_rows, spec.n_kv_heads, spec.head_dim)
        self.k = cache_k if cache_k is not None else np.zeros(shape, np.float32)
        self.v = cache_v if cache_v is not None else np.zeros(shape, np.float32)
        self.pos = 0

    def chunk(self, x: np.ndarray, observe=None, observe_out=None, groups: list[Group] | None = None) -> np.ndarray:
        """x [n <= C, hidden]: the embedded rows of the next n tokens. Returns the hidden states [n, hidden] leaving
        the last group; the cache gains n rows. groups: run these instead of self.groups."""
        n, C, pos = x.shape[0], self.C, self.pos
        if not 0 < n <= C:
            raise ValueError(f"a chunk holds 1..{C} tokens, got {n}")
        if pos + C > self.L:
            raise ValueError(f"position {pos} + chunk {C} is past the cache ({self.L} rows)")
        h = np.zeros((C, x.shape[1]), np.float32)
        h[:n] = x
        rope = {}
        for table in rope_tables(self.spec):
            rope.update(zip(rope_inputs(table), rope_rows(self.spec, pos, C, table)))
        masks = {}
        for gi, g in enumerate(groups or self.groups):
            feeds = {"x": h, **{k: v for k, v in rope.items() if k in g.inputs}}
            for name in g.inputs:
                if name.startswith("mask"):
                    if name not in masks:
                        masks[name] = mask(pos, C, self.L, int(name[6:]) if name != "mask" else 0)
                    feeds[name] = masks[name]
                elif name.startswith("past_"):
                    layer = int(name[6:])
                    feeds[name] = (self.k if name[5] == "k" else self.v)[layer]
            if observe is not None:
                observe(gi, {k: np.array(v) for k, v in feeds.items() if k in g.inputs})
            outs = dict(zip([o.name for o in g.session.get_outputs()], g.session.run(None, feeds)))
            if observe_out is not None:
                observe_out(gi, outs)
            for layer in range(*g.layers):
                self.k[layer, pos:pos + C] = outs[f"new_k{layer}"]
                self.v[layer, pos:pos + C] = outs[f"new_v{layer}"]
            h = outs["y"]
            for o in g.outliers:
                h = h + o.correction(outs[f"outl{o.layer}"])
        self.k[:, pos + n:pos + C] = 0   # padding rows: the runtime zeroes rows past the prompt before a chunk reads them
        self.v[:, pos + n:pos + C] = 0
        self.pos += n
        return h[:n]

    def prefill(self, x: np.ndarray, observe=None, observe_out=None) -> np.ndarray:
        """All rows of x in chunks; the hidden states of every token [T, hidden]. Position 0 runs through `first`
        when given (unobserved: calibration never sees it)."""
        out = []
        if self.pos == 0 and self.first is not None and len(x):
            out.append(self.chunk(x[:1], groups=self.first))
            x = x[1:]
        out += [self.chunk(x[i:i + self.C], observe, observe_out) for i in range(0, len(x), self.C)]
        return np.concatenate(out) if out else np.zeros((0, self.spec.hidden_size), np.float32)
