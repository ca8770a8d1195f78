"""The neuron-bundled FFN kernels (compiler/ops/bundled_ffn.py) against numpy: group selection by estimated output
norm, the -1 tail, silu(gate) gathered in selection order, prefill keeping every group, and the accumulate."""
from __future__ import annotations

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from test_ops import build  # noqa: E402


def _silu(x):
    return x / (1 + np.exp(-x.astype(np.float64)))


def _select(g, c, dflt, setting, G, D):
    T_, F = g.shape
    f = build("ffn_select", T=T_, F=F, G=G, D=D)[1]
    NG = F // G
    bufs = [tvm.runtime.tensor(np.ascontiguousarray(a, np.float32)) for a in (g, c, [dflt], [setting])]
    s = tvm.runtime.tensor(np.full((NG, T_, G), np.nan, np.float32))
    ids = tvm.runtime.tensor(np.full(NG, 77, np.int32))
    acc = tvm.runtime.tensor(np.full((T_, D), np.nan, np.float32))
    f(*bufs, s, ids, acc)
    return s.numpy(), ids.numpy(), acc.numpy()


@pytest.mark.parametrize("setting,dflt", [(-1.0, 0.9), (0.9, 5.0), (0.0, 5.0), (-1.0, 0.0)])
def test_select_decode(setting, dflt):
    r = np.random.default_rng(0)
    F, G, D = 256, 32, 48
    g = r.standard_normal((1, F)).astype(np.float32) * np.repeat(r.uniform(0.1, 2, F // G), G)[None].astype(np.float32)
    c = r.uniform(0.05, 0.3, F).astype(np.float32)
    s, ids, acc = _select(g, c, dflt, setting, G, D)
    thr = setting if setting >= 0 else dflt
    score = np.sqrt(((_silu(g[0]) * c) ** 2).reshape(-1, G).sum(1))
    want = np.flatnonzero(score >= thr)
    assert 0 < len(want) <= F // G
    if thr > 0.5:
        assert len(want) < F // G, "the threshold must drop some groups for this test to mean anything"
    np.testing.assert_array_equal(ids[:len(want)], want)
    assert (ids[len(want):] == -1).all()
    np.testing.assert_allclose(s[:len(want), 0], _silu(g[0]).reshape(-1, G)[want], rtol=1e-5, atol=1e-6)
    assert (acc == 0).all()


def test_select_prefill_keeps_every_group_in_order():
    r = np.random.default_rng(1)
    T_, F, G, D = 5, 128, 32, 16
    g = r.standard_normal((T_, F)).astype(np.float32)
    s, ids, acc = _select(g, np.zeros(F, np.float32), 1e9, 1e9, G, D)   # prefill ignores the threshold
    np.testing.assert_array_equal(ids, np.arange(F // G))
    np.testing.assert_allclose(s, _silu(g).reshape(T_, F // G, G).transpose(1, 0, 2), rtol=1e-5, atol=1e-6)
    assert (acc == 0).all()


def test_mul_and_accumulate():
    r = np.random.default_rng(2)
    T_, G, N = 3, 32, 40
    s, u = r.standard_normal((1, T_, G)).astype(np.float32), r.standard_normal((T_, G)).astype(np.float32)
    h = tvm.runtime.tensor(np.zeros((T_, G), np.float32))
    build("ffn_mul", T=T_, G=G)[1](tvm.runtime.tensor(s), tvm.runtime.tensor(u), h)
    np.testing.assert_allclose(h.numpy(), s[0] * u, rtol=1e-6)
    y, a0 = r.standard_normal((T_, N)).astype(np.float32), r.standard_normal((T_, N)).astype(np.float32)
    acc = tvm.runtime.tensor(a0.copy())
    build("ffn_accumulate", R=T_, N=N)[1](tvm.runtime.tensor(y), acc)
    np.testing.assert_allclose(acc.numpy(), a0 + y, rtol=1e-6)
