"""numpy float64 references for every op (used by tests; also handy for debugging a runtime)."""
from __future__ import annotations

import numpy as np

from ...quant.scheme import KERNEL_OPS

NINPUTS = {"embed": 2, "relu2_mul": 2, "gelu_mul": 2, "scale": 1, "softcap": 1, "rmsnorm": 2, "rope": 3, "attention": 3, "add": 2,
           "swiglu": 2, "copy": 1}


def _split(y, segs):
    return np.split(y, np.cumsum(segs)[:-1], axis=1)


def _packed(op: str, a, p, segs=()):
    """A packed scheme's op, exactly as its kernels compute it (int8 activation quantization included): the
    scheme's own numpy model (quant/: linear_ref, dequantize). Args: x (ids), the parts in the scheme's order, [b]."""
    k = KERNEL_OPS[op]
    parts = a[1:1 + len(k.scheme.parts)]
    if k.traits.kind == "embed":
        table = k.scheme.dequantize(dict(zip(k.scheme.parts, parts))).astype(np.float64)
        return table[np.clip(np.asarray(a[0]), 0, table.shape[0] - 1)]
    kw = {"segs": segs} if segs else {}   # only a per-matrix scale reads them: the others are split afterwards
    return k.scheme.linear_ref(a[0], *parts, bias=a[1 + len(parts)] if p.get("bias", False) else None, **kw)


def _f64(a):
    return np.asarray(a).astype(np.float64)


def reference(op: str, args, **p):
    """The op's output; a fused linear (segs) returns one array per segment of rows."""
    segs = tuple(p.get("segs") or ())
    nin = NINPUTS.get(op)
    if op == "linear":
        nin = 3 if p.get("bias", False) else 2
    if (op, True) in (("rope", p.get("P")), ("attention", p.get("M"))):
        nin += 1   # the token tree
    if op in KERNEL_OPS:  # x (ids), the parts, [b]
        nin = 1 + len(KERNEL_OPS[op].scheme.parts) + (KERNEL_OPS[op].traits.kind == "linear" and p.get("bias", False))
    if nin is None:
        raise ValueError(f"unknown op {op!r}")
    if len(args) not in (nin, nin + max(1, len(segs))):  # inputs, optionally followed by the output buffer(s)
        raise ValueError(f"{op}: expected {nin} inputs, got {len(args)} arrays")
    a = list(args[:nin])
    if segs:
        per_matrix = op in KERNEL_OPS and KERNEL_OPS[op].traits.scale == "matrix"
        return _split(_packed(op, a, p, segs) if per_matrix else reference(op, a, **{**p, "segs": ()}), segs)
    if op == "embed":
        ids, W = a
        return _f64(W)[np.asarray(ids).astype(np.int64)]
    if op == "rmsnorm":
        x, w = _f64(a[0]), _f64(a[1])
        eps = float(p["eps"])
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w
    if op == "linear":
        from .kslice import from_sliced

        x, W = _f64(a[0]), _f64(from_sliced(np.asarray(a[1]), int(p.get("KS", 0))))
        y = x @ W.T
        if p.get("bias", False):
            y = y + _f64(a[2])
        return y
    if op in KERNEL_OPS:
        return _packed(op, a, p)
    if op == "rope":
        x, c, s = (_f64(v) for v in a[:3])
        if p.get("P"):   # a token tree: row t rotates by table row tree[0, t] (its depth)
            c, s = c[a[3][0]], s[a[3][0]]
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        c, s = c[:, None, :], s[:, None, :]
        return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
    if op == "attention":
        q, k, v = (_f64(t) for t in a[:3])
        T, NH, D = q.shape
        S, KVH = k.shape[0], k.shape[1]
        G = NH // KVH
        W = int(p.get("W", 0))  # sliding window (0: full causal attention)
        tree = a[3] if p.get("M") else None   # [T + 1, T]: depths, then each row's ancestors by depth (a token tree)
        out = np.zeros((T, NH, D))
        for t in range(T):
            n = S - T + t + 1
            keys = np.arange(n)
            if tree is not None:   # the prefix, then its ancestors' rows by depth; the window follows the depth
                d = int(tree[0][t])
                keys = np.concatenate([np.arange(S - T), S - T + np.asarray(tree[1 + t][:d + 1], np.int64)])
                n = S - T + d + 1
            keys = keys[np.arange(len(keys)) >= max(0, n - W)] if W else keys
            for h in range(NH):
                s = k[keys, h // G] @ q[t, h] / np.sqrt(D)
                if p.get("cap"):
                    s = p["cap"] * np.tanh(s / p["cap"])
                e = np.exp(s - s.max())
                out[t, h] = (e / e.sum()) @ v[keys, h // G]
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
    if op == "softcap":
        return float(p["c"]) * np.tanh(_f64(a[0]) / float(p["c"]))
    raise ValueError(f"unknown op {op!r}")
