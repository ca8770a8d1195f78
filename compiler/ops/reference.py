"""numpy float64 references for every op (used by tests; also handy for debugging a runtime)."""
from __future__ import annotations

import numpy as np

NINPUTS = {"embed": 2, "embed_q8": 3, "embed_q4": 3, "embed_q6": 3, "relu2_mul": 2, "gelu_mul": 2, "scale": 1, "rmsnorm": 2, "rope": 3,
           "attention": 3, "add": 2, "swiglu": 2, "copy": 1}
QUANT_LINEAR = ("linear_q8", "linear_q4", "linear_q6", "linear_t2", "linear_t2_lut")
T2_OPS = ("linear_t2", "linear_t2_lut")


def _split(y, segs):
    return np.split(y, np.cumsum(segs)[:-1], axis=1)


def _t2_fused(a, p, segs):
    """t2 with stacked matrices: one scale per matrix."""
    from ...quant import t2

    return t2.linear_t2_ref(a[0], a[1], a[2], a[3] if p.get("bias", False) else None, segs=segs)


def _f64(a):
    return np.asarray(a).astype(np.float64)


def reference(op: str, args, **p):
    """The op's output; a fused linear (segs) returns one array per segment of rows."""
    segs = tuple(p.get("segs") or ())
    nin = NINPUTS.get(op)
    if op == "linear":
        nin = 3 if p.get("bias", False) else 2
    if op in QUANT_LINEAR:  # x, qweight, scales / scale, [b]
        nin = 4 if p.get("bias", False) else 3
    if nin is None:
        raise ValueError(f"unknown op {op!r}")
    if len(args) not in (nin, nin + max(1, len(segs))):  # inputs, optionally followed by the output buffer(s)
        raise ValueError(f"{op}: expected {nin} inputs, got {len(args)} arrays")
    a = list(args[:nin])
    if segs:
        return _split(reference(op, a, **{**p, "segs": ()}) if op == "linear" or op not in T2_OPS
                      else _t2_fused(a, p, segs), segs)
    if op == "embed":
        ids, W = a
        return _f64(W)[np.asarray(ids).astype(np.int64)]
    if op == "rmsnorm":
        x, w = _f64(a[0]), _f64(a[1])
        eps = float(p["eps"])
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w
    if op == "linear":
        x, W = _f64(a[0]), _f64(a[1])
        y = x @ W.T
        if p.get("bias", False):
            y = y + _f64(a[2])
        return y
    if op in QUANT_LINEAR:
        # exactly what the kernels compute (int8 activation quantization included), see quant/packing.py
        from ...quant import q4, q6, q8, t2

        fn = {"linear_q8": q8.linear_q8_ref, "linear_q4": q4.linear_q4_ref, "linear_q6": q6.linear_q6_ref,
              "linear_t2": t2.linear_t2_ref, "linear_t2_lut": t2.linear_t2_ref}[op]
        return fn(a[0], a[1], a[2], a[3] if p.get("bias", False) else None)
    if op == "rope":
        x, c, s = (_f64(v) for v in a)
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        c, s = c[:, None, :], s[:, None, :]
        return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
    if op == "attention":
        q, k, v = (_f64(t) for t in a)
        T, NH, D = q.shape
        S, KVH = k.shape[0], k.shape[1]
        G = NH // KVH
        W = int(p.get("W", 0))  # sliding window (0: full causal attention)
        out = np.zeros((T, NH, D))
        for t in range(T):
            n = S - T + t + 1
            lo = max(0, n - W) if W else 0
            for h in range(NH):
                s = k[lo:n, h // G] @ q[t, h] / np.sqrt(D)
                e = np.exp(s - s.max())
                out[t, h] = (e / e.sum()) @ v[lo:n, h // G]
        return out.reshape(T, NH * D)
    if op == "add":
        return _f64(a[0]) + _f64(a[1])
    if op == "swiglu":
        g, u = _f64(a[0]), _f64(a[1])
        sig = np.where(g >= 0, 1.0 / (1.0 + np.exp(-np.abs(g))), np.exp(-np.abs(g)) / (1.0 + np.exp(-np.abs(g))))
        return g * sig * u
    if op == "copy":
        return _f64(a[0]).copy()
    if op == "relu2_mul":
        return np.maximum(_f64(a[0]), 0) ** 2 * _f64(a[1])
    if op == "gelu_mul":
        from ...models.numpy_backend import gelu_tanh

        return gelu_tanh(_f64(a[0])) * _f64(a[1])
    if op == "scale":
        return _f64(a[0]) * float(p["c"])
    if op in ("embed_q8", "embed_q4", "embed_q6"):
        from ...quant import q4, q6, q8

        deq = {"embed_q8": q8.dequantize_q8, "embed_q4": q4.dequantize_q4, "embed_q6": q6.dequantize_q6}[op]
        table = deq({"qweight": a[1], "scales": a[2]}).astype(np.float64)
        return table[np.clip(np.asarray(a[0]), 0, table.shape[0] - 1)]
    raise ValueError(f"unknown op {op!r}")
