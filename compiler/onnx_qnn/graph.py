"""The ONNX backend of the Graph (models/graph.py): the model's forward, written once in models/, traced into one
static prefill-chunk graph per group of layers, for ONNX Runtime's QNN execution provider (the Hexagon NPU).

A group graph maps
    x [C, hidden] (the residual stream entering the group's first layer), cos/sin [C, 1, head_dim] (RoPE of the
    chunk's positions, halves repeated; cos_local/sin_local: the sliding-window layers' own table, Gemma 3),
    mask [C, kv_rows + C] (additive: 0 visible, npu_chunks.MASK_VALUE
    hidden; one per distinct sliding window),
    past_k{l}/past_v{l} [kv_rows, kv_heads, head_dim] (the context's KV cache of layer l, in the runtime's own layout)
to
    y [C, hidden] (the residual stream leaving the group), new_k{l}/new_v{l} [C, kv_heads, head_dim] (the chunk's K/V,
    rows pos .. pos+C-1 of the cache).
Everything is static (the HTP needs fixed shapes). The embedding, the final norm and the lm_head stay on the CPU.

Tracing runs the whole body() and keeps only the ops of layers l0..l1-1: an op whose weights belong to another layer
returns None (nothing emitted), and the value of the residual stream that enters the group (the None an in-group op
receives) becomes the input `x`. This relies on one property of every family in models/: a layer reads the residual
stream only as its first op's input and its residual adds (true for llama.py, gemma.py and bitnet.py)."""
from __future__ import annotations

import re

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ...errors import CompileError
from ...models.spec import ModelSpec
from .npu_chunks import rope_inputs

OPSET = 23
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
DOWN_PROJ = "mlp.down_proj.weight"   # the FFN down projection: its input is where activation outliers live
FP16_PREFIX = "h16_"                 # the float16 attention's nodes and tensors (not calibrated, not quantized)


def scale_for(stream_max: float, scale: float) -> float:
    """The largest power of two <= scale that holds a stream of calibrated magnitude stream_max at most 65504 / 8
    (float16's largest value, with 8x headroom for text calibration never saw)."""
    while scale * stream_max > 65504 / 8 and scale > 2.0 ** -24:
        scale /= 2
    return scale


def stream_scale(spec: ModelSpec) -> float:
    """The factor the NPU graphs hold the residual stream by in float16 (max 65504): Gemma's stream reaches ~5e4 in a
    few channels on ordinary text (Gemma 3 270M; the family is known to overflow float16), so it runs at 1/32;
    the Llama family's stays below ~10^3-10^4 (SmolLM2 135M: 1e3) and runs at 1."""
    return 1.0 / 32 if spec.family == "gemma" else 1.0


def mask_name(window: int) -> str:
    return f"mask_w{window}" if window else "mask"


class OnnxGraph:
    """Graph backend emitting ONNX nodes for layers [l0, l1) of a prefill chunk of C tokens."""

    def __init__(self, spec: ModelSpec, weight, chunk: int, kv_rows: int, l0: int, l1: int,
                 outliers: dict | None = None, expose_act: bool = False, data=None, scale: float | None = None):
        self.spec, self.C, self.L, self.l0, self.l1 = spec, chunk, kv_rows, l0, l1
        self.f16: set[str] = set()                 # values held in float16 (the residual stream and its norms)
        self.stream: set[str] = set()              # float16 values of the residual stream, times stream_scale
        self.scale = stream_scale(spec) if scale is None else scale
        self._x16: str | None = None               # the group input x in the stream's float16 form
        self.data = data                           # (path, open file): weights are written there as traced
        self.outliers = outliers or {}             # layer -> (threshold, channels): see linear()
        self.expose_act = expose_act               # also output every FFN down-projection input (calibration)
        self._weight = weight                      # checkpoint name -> float array
        self.nodes: list[onnx.NodeProto] = []
        self.inits: dict[str, np.ndarray] = {}
        self.outputs: list[tuple[str, list[int]]] = []
        self.masks: set[int] = set()
        self.rope_tables: set[str] = set()         # the RoPE tables the group's layers read (rope_inputs)
        self.y: str | None = None                  # the residual stream leaving the group
        self._n = 0
        self.typed: list[str] = []                 # outputs of ops shape inference does not know
        self._masks16: dict[int, str] = {}         # window -> the mask input cast to float16
        self.external: dict[str, onnx.TensorProto] = {}   # weights already in the data file

    # ---------------------------------------------------------------- helpers
    def _op(self, op: str, inputs: list[str], out: str | None = None, name: str | None = None, **attrs) -> str:
        self._n += 1
        out = out or f"{op.lower()}_{self._n}"
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"{name or op}_{self._n}", **attrs))
        return out

    def _const(self, arr, name: str | None = None) -> str:
        self._n += 1
        name = name or f"c_{self._n}"
        self.inits[name] = np.asarray(arr)
        return name

    def _shape(self, *dims) -> str:
        return self._const(np.array(dims, np.int64))

    def _layer_of(self, w: str | None) -> int | None:
        m = _LAYER.search(w or "")
        return int(m.group(1)) if m else None

    def _live(self, layer: int | None, *vals) -> bool:
        """Whether an op of `layer` (None: no weights, decided by its inputs) belongs to this group."""
        if layer is not None:
            if layer >= self.l1 and self.y is None:
                self.y = next(v for v in vals if v is not None)   # the first op past the group reads its output
            return self.l0 <= layer < self.l1
        return all(v is not None for v in vals) or (self._started() and self.y is None)

    def _started(self) -> bool:
        return bool(self.nodes)

    def _in(self, v):
        return "x" if v is None else v   # the residual stream entering the group

    def _unsupported(self, what: str):
        raise CompileError(f"{self.spec.arch}: {what} cannot run on the NPU prefill path yet (android-npu supports "
                           "dense Llama-family models (Llama, Mistral, Qwen2, Qwen3, SmolLM3, Granite, Phi-3/4) and Gemma 3)")

    # ---------------------------------------------------------------- Graph API
    def embed(self, ids, w):
        return None   # the embedding runs on the CPU; its rows arrive as the first group's x

    def rmsnorm(self, x, w):
        """The residual stream, every norm over it and every residual add run in float16: the stream spans a few
        huge channels and many small ones (Gemma 3 270M: 10^3-10^4 in two channels beside a median of 3), which no
        16-bit fixed-point range of one tensor resolves (4.8% hidden-state error from its adds alone, 4.2% from its
        post-FFN norms' outputs); float16 keeps 11 bits of every value whatever its size. The stream is held times
        stream_scale (a power of two, exact) so that it stays inside float16's range. A norm reading the stream
        (its eps times scale^2) leaves as float32 (quantized) for the projections; a norm writing into it (Gemma's
        post-norms: its weight times scale) stays in the stream."""
        if not self._live(self._layer_of(w), x):
            return None
        n, eps, k = self.spec.hidden_size, float(self.spec.rms_eps), self.scale
        if x is None or x in self.stream:    # reads the stream
            out = self._h16("RMSNormalization", [self._stream(x), self._w16(w, n)], axis=-1, epsilon=eps * k * k)
        else:                                 # writes into it
            out = self._h16("RMSNormalization", [self._h16("Cast", [x], to=TensorProto.FLOAT16), self._w16(w, n, k)],
                            axis=-1, epsilon=eps)
            self.stream.add(out)
        self.f16.add(out)
        return out

    def _stream(self, v: str | None) -> str:
        """A residual add's operand in the stream's form: the group input x, or a float32 contribution (a projection's
        output), cast to float16 and scaled; stream values as they are."""
        if v is not None and v in self.stream:
            return v
        if v is None and self._x16 is not None:
            return self._x16
        src = "x" if v is None else v
        if self.scale != 1.0:   # scaled before the Cast: a stream past 65504 would be inf in float16
            src = self._op("Mul", [src, self._const(np.array(self.scale, np.float32))])
        out = self._h16("Cast", [src], to=TensorProto.FLOAT16)
        if v is None:
            self._x16 = out
        self.stream.add(out)
        self.f16.add(out)
        return out

    def _to32(self, v: str) -> str:
        """A float16 value as float32 (quantized from here on, like every float32 tensor of the graph)."""
        if v not in self.f16:
            return v
        return self._op("Cast", [v], to=TensorProto.FLOAT, name=FP16_PREFIX + "Cast_out")

    def _w16(self, name: str, n: int, k: float = 1.0) -> str:
        key = FP16_PREFIX + name
        if key not in self.inits:
            self.inits[key] = (np.asarray(self._weight(name), np.float32).reshape(n) * np.float32(k)).astype(np.float16)
        return key

    def _rms(self, x: str, w: str, n: int) -> str:
        """RMSNorm as one op (ONNX Runtime's SimplifiedLayerNormalization, which the QNN EP maps to the HTP's RmsNorm):
        spelled as Mul/ReduceMean/Sqrt/Div, each intermediate gets a 16-bit range of its own, and x*x of a real
        model's residual stream spans 0..10^5-10^9, so every ordinary token's squares quantized to 0 (the 140% hidden
        error on a 135M Llama). The output's type is declared: the quantizer only puts QDQ on typed tensors."""
        out = self._op("RMSNormalization", [x, self._w(w, (n,))], axis=-1,
                       epsilon=float(self.spec.rms_eps))
        self.typed.append(out)
        return out

    def head_rmsnorm(self, x, w, n_heads):
        if not self._live(self._layer_of(w), x):
            return None
        d = self.spec.head_dim
        # rows of [C * heads, d]: the HTP's float16 RmsNorm over the last axis of a 3-D [C, heads, d] tensor came out
        # 70% off on the emulator (2-D is right; the 16-bit integer one was right either way)
        h = self._op("Reshape", [x, self._shape(self.C * n_heads, d)])
        return self._op("Reshape", [self._rms(h, w, d), self._shape(self.C, n_heads * d)])

    def _w(self, name: str, shape, transpose=False) -> str:
        if name not in self.inits and name not in self.external:
            a = np.asarray(self._weight(name), np.float32).reshape(shape if not transpose else shape[::-1])
            a = np.ascontiguousarray(a.T if transpose else a)
            if self.data is None or a.size < 1024:
                self.inits[name] = a
            else:   # streamed to the external data file now: a group's float weights are never all in memory
                path, f = self.data
                off = -f.tell() % 4096
                f.write(bytes(off))
                t = onnx.TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(a.shape),
                                     data_location=onnx.TensorProto.EXTERNAL)
                for k, v in (("location", path), ("offset", str(f.tell())), ("length", str(a.nbytes))):
                    t.external_data.add(key=k, value=v)
                f.write(a.tobytes())
                self.external[name] = t
        return name

    def linear(self, x, w, b=None):
        layer = self._layer_of(w)
        if not self._live(layer, x):
            return None
        out_f, in_f = np.shape(self._weight(w))
        x = self._to32(self._in(x))
        if w.endswith(DOWN_PROJ):
            x = self._outlier_split(x, layer, in_f)
        y = self._op("MatMul", [x, self._w(w, (in_f, out_f), transpose=True)])   # x @ W.T
        return self._op("Add", [y, self._w(b, (out_f,))]) if b is not None else y

    def _outlier_split(self, a: str, layer: int, n: int) -> str:
        """llm.npu's shadow outlier execution, NPU side: the down projection sees its input clipped to the layer's
        calibrated threshold t (so 16-bit quantization resolves the ordinary values), and the raw values of the
        few channels that exceed t go out as outl<layer> for the CPU to add (a - clip(a)) @ W[:, channels].T in
        float (npu_chunks.py, runtime/backends/backend_qnn_ort.c)."""
        if self.expose_act:
            self._op("Identity", [a], out=f"act{layer}")
            self.outputs.append((f"act{layer}", [self.C, n]))
        if layer not in self.outliers:
            return a
        t, channels = self.outliers[layer]
        self._op("Gather", [a, self._const(np.asarray(channels, np.int64))], out=f"outl{layer}", axis=1)
        self.outputs.append((f"outl{layer}", [self.C, len(channels)]))
        return self._op("Clip", [a, self._const(np.array(-t, np.float32)), self._const(np.array(t, np.float32))])

    def rope(self, x, n_heads, table="rope"):
        if x is None:
            return None
        self.rope_tables.add(table)
        cos, sin = rope_inputs(table)
        d = self.spec.head_dim
        t = self._op("Reshape", [x, self._shape(self.C, n_heads, d)])
        lo = self._op("Slice", [t, self._shape(0), self._shape(d // 2), self._shape(2)])
        hi = self._op("Slice", [t, self._shape(d // 2), self._shape(d), self._shape(2)])
        rot = self._op("Concat", [self._op("Neg", [hi]), lo], axis=2)
        y = self._op("Add", [self._op("Mul", [t, cos]), self._op("Mul", [rot, sin])])
        return self._op("Reshape", [y, self._shape(self.C, n_heads * d)])

    def kv_store(self, layer, k, v):
        if not self.l0 <= layer < self.l1:
            return
        s = self.spec
        for kind, val in (("k", k), ("v", v)):
            out = f"new_{kind}{layer}"
            self._op("Reshape", [val, self._shape(self.C, s.n_kv_heads, s.head_dim)], out=out)
            self.outputs.append((out, [self.C, s.n_kv_heads, s.head_dim]))

    def attention(self, q, layer):
        if not self.l0 <= layer < self.l1:
            return None
        s, C = self.spec, self.C
        kvh, d, rep = s.n_kv_heads, s.head_dim, s.n_heads // s.n_kv_heads
        S = self.L + C
        K = self._op("Concat", [f"past_k{layer}", f"new_k{layer}"], axis=0)            # [S, kvh, d]
        V = self._op("Concat", [f"past_v{layer}", f"new_v{layer}"], axis=0)
        Kt = self._op("Transpose", [K], perm=[1, 2, 0])                                 # [kvh, d, S]
        Vh = self._op("Transpose", [V], perm=[1, 0, 2])                                 # [kvh, S, d]
        qs = self._op("Mul", [q, self._const(np.array(1.0 / np.sqrt(d), np.float32))])
        qh = self._op("Reshape", [qs, self._shape(C, kvh, rep, d)])
        qh = self._op("Transpose", [qh], perm=[1, 2, 0, 3])                             # [kvh, rep, C, d]; head h = g*rep + r
        qh = self._op("Reshape", [qh, self._shape(kvh, rep * C, d)])
        w = s.window(layer)
        self.masks.add(w)
        # scores, mask, softmax and p @ V in float16 (FP16_PREFIX: the quantizer leaves them alone): the HTP cuts
        # the second operand of a 16-bit x 16-bit MatMul to 8 bits (8.8% error on a real model's attention output),
        # and runs these float16 ops exactly enough (0.04%); the rest of the graph stays W8A16
        h = self._h16
        qh, Kt, Vh = (h("Cast", [t], to=TensorProto.FLOAT16) for t in (qh, Kt, Vh))
        if w not in self._masks16:
            self._masks16[w] = h("Cast", [mask_name(w)], to=TensorProto.FLOAT16)
        sc = h("Reshape", [h("MatMul", [qh, Kt]), self._shape(kvh, rep, C, S)])
        if s.attn_softcap:   # Gemma 2: cap * tanh(score / cap), before the mask
            cap = s.attn_softcap
            sc = h("Mul", [h("Tanh", [h("Mul", [sc, self._const(np.array(1.0 / cap, np.float16))])]),
                           self._const(np.array(cap, np.float16))])
        p = h("Softmax", [h("Add", [sc, self._masks16[w]])], axis=-1)
        o = h("MatMul", [h("Reshape", [p, self._shape(kvh, rep * C, S)]), Vh])               # [kvh, rep*C, d]
        o = self._op("Cast", [o], to=TensorProto.FLOAT, name=FP16_PREFIX + "Cast_out")
        o = self._op("Transpose", [self._op("Reshape", [o, self._shape(kvh, rep, C, d)])], perm=[2, 0, 1, 3])
        return self._op("Reshape", [o, self._shape(C, s.n_heads * d)])

    def _h16(self, op: str, inputs: list[str], **attrs) -> str:
        """An op of the float16 attention: output and node named FP16_PREFIX... (probe and quantizer skip them)."""
        self._n += 1
        out = f"{FP16_PREFIX}{op.lower()}_{self._n}"
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"{FP16_PREFIX}{op}_{self._n}", **attrs))
        return out

    def add(self, a, b):
        if not self._live(None, a, b):
            return None
        out = self._h16("Add", [self._stream(a), self._stream(b)])
        self.f16.add(out)
        self.stream.add(out)
        return out

    def swiglu(self, gate, up):
        if gate is None or up is None:
            return None
        return self._op("Mul", [self._op("Mul", [gate, self._op("Sigmoid", [gate])]), up])

    def route(self, x, router, top_k, normalize):
        self._unsupported("a mixture-of-experts layer")

    def experts(self, x, routing, experts):
        self._unsupported("a mixture-of-experts layer")

    def sigmoid_gate(self, x, w, y):
        self._unsupported("a mixture-of-experts layer")

    def bitlinear(self, x, w):
        self._unsupported("a BitNet ternary layer")

    def gelu_mul(self, gate, up):
        """gelu_tanh(gate) * up, spelled as the HTP's Gelu: ONNX Gelu with approximate="tanh"."""
        if gate is None or up is None:
            return None
        return self._op("Mul", [self._op("Gelu", [gate], approximate="tanh"), up])

    def relu2_mul(self, gate, up):
        self._unsupported("relu^2 gating")

    # ---------------------------------------------------------------- the model
    def to_model(self) -> onnx.ModelProto:
        s, C = self.spec, self.C
        f = lambda n, shape: helper.make_tensor_value_info(n, TensorProto.FLOAT, shape)   # noqa: E731
        ins = [f("x", [C, s.hidden_size])]
        ins += [f(n, [C, 1, s.head_dim]) for t in sorted(self.rope_tables or {"rope"}) for n in rope_inputs(t)]
        ins += [f(mask_name(w), [C, self.L + C]) for w in sorted(self.masks)]
        for layer in range(self.l0, self.l1):
            ins += [f(f"past_{k}{layer}", [self.L, s.n_kv_heads, s.head_dim]) for k in "kv"]
        y = self.y
        if y in self.stream and self.scale != 1.0:
            y = self._h16("Mul", [y, self._const(np.array(1.0 / self.scale, np.float16), FP16_PREFIX + "c_unscale")])
            self.f16.add(y)
        y = self._to32(y)
        self.nodes.append(helper.make_node("Identity", [y], ["y"], name="out_y"))
        outs = [f("y", [C, s.hidden_size])] + [f(n, shape) for n, shape in self.outputs]
        graph = helper.make_graph(self.nodes, f"prefill_c{C}_layers{self.l0}_{self.l1}", ins, outs,
                                  [numpy_helper.from_array(a, n) for n, a in self.inits.items()] +
                                  list(self.external.values()))
        graph.value_info.extend(helper.make_tensor_value_info(v, TensorProto.FLOAT, None) for v in self.typed)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="edgellm")
        m.ir_version = 10
        return m


def trace_group(spec: ModelSpec, weight, chunk: int, kv_rows: int, l0: int, l1: int, outliers: dict | None = None,
                expose_act: bool = False, data=None, scale: float | None = None) -> onnx.ModelProto:
    """The float prefill-chunk graph of layers [l0, l1). outliers: layer -> (threshold, channels) of the FFN down
    projection inputs split off for the CPU (one layer per graph then: the CPU's part must be added before the next
    layer runs); expose_act: output every down-projection input as act<layer> (calibration); data: (location, open
    binary file) to stream the weights into as they are traced (the model then refers to them: save it beside
    the file without save_as_external_data), else they are held in the model. scale: the residual stream's float16
    factor (default stream_scale: package.py lowers it when calibration finds a larger stream)."""
    from ...models import family

    if spec.family not in ("llama", "gemma") or spec.n_experts:
        OnnxGraph(spec, weight, chunk, kv_rows, l0, l1)._unsupported(
            "a mixture-of-experts model" if spec.n_experts else f"the {spec.family} family")
    g = OnnxGraph(spec, weight, chunk, kv_rows, l0, l1, outliers, expose_act, data, scale)
    x = family(spec).body(g, list(range(chunk)))
    if g.y is None:
        g.y = x
    return g.to_model()
