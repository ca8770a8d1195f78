"""Decode attention in key segments (compiler/ops/attention.py SEG_MIN_CHUNKS): where a decode step's head blocks
cannot keep every thread busy (3 kv heads on 2 threads), each row's keys split into segments run as tasks and folded
in order; prefill chunks and verify passes close the same segments inside their rows, so a package's logits match
the numpy oracle at contexts of several segments, greedy decoding its tokens, and a verify tree's rows stay bitwise
the decode steps' (kernel-level checks: tests/test_ops.py test_attention_key_segments)."""
from __future__ import annotations

import json

import numpy as np
import pytest

import edgellm
from edgellm.models import load_checkpoint
from edgellm.models.numpy_backend import NumpyModel
from edgellm.models.synthetic import make_checkpoint
from edgellm.quant import get_scheme
from edgellm.quant.reference_model import QuantizedModel
from verify_tree import decoded_rows

pytest.importorskip("tvm")

TREE = [-1, 0, 0, 1, 1, 2, 3, 6]


def relerr(a, b):
    return float(np.abs(np.asarray(a, np.float64) - b).max() / np.abs(b).max())


@pytest.mark.parametrize("quant", ["q8", pytest.param("f32", marks=pytest.mark.slow)])
def test_a_package_with_key_segments(quant, tmp_path):
    import os

    from edgellm.compiler.ops.attention import split_for
    from edgellm.compiler.ops import CpuInfo

    P = split_for(CpuInfo(vector_lanes=8, num_threads=os.cpu_count() or 1), 9, 3)
    if not P:
        pytest.skip(f"{os.cpu_count()} threads spread 9 heads in 3 kv groups evenly: no key segments")
    d = make_checkpoint(tmp_path / "ck", "LlamaForCausalLM", seed=5, num_attention_heads=9, num_key_value_heads=3,
                        hidden_size=128, head_dim=32)
    spec, ck, _ = load_checkpoint(str(d))
    pkg = edgellm.compile(str(d), quant=quant, out=tmp_path / "p", max_context=384, prefill_chunk=32, progress=False,
                          verify_tokens=8)
    kernels = json.loads((pkg / "manifest.json").read_text())["kernels"]
    assert f"attention_t1_nh9_kvh3_d32_split{P}" in kernels
    assert any(k.startswith("attention_t8_") and k.endswith(f"_split{P}") for k in kernels)   # the verify program's
    prompt = [int(t) for t in np.random.default_rng(1).integers(3, 900, 300)]   # 300 keys: several segments
    ref = NumpyModel(spec, ck.get) if quant == "f32" else QuantizedModel(spec, ck.get, get_scheme(quant), get_scheme("q8g32"))
    with edgellm.Runtime.load(pkg, threads=2) as rt:
        # q8: over 300 rows one int8 activation lands on the other side of a rounding step (the same with P = 0)
        assert relerr(rt.logits(prompt), ref.logits(prompt)) < (1e-4 if quant == "f32" else 1e-2)
        toks = rt.generate(prompt, max_new_tokens=12, ignore_eos=True).token_ids
        if quant == "f32":
            assert toks == ref.greedy(prompt, 12)
        else:   # random weights have near-ties (a top-2 gap of 3e-4 at this prompt's end): each decoded token is the
            # oracle's argmax, on the package's own path, up to the logits tolerance
            for t, row in zip(toks, ref.logits(prompt + toks[:-1])[len(prompt) - 1:]):
                assert row.max() - row[t] <= 2e-2 * np.abs(row).max(), (t, int(row.argmax()))
        ctx, drafts = rt.context, [7, 64, 128, 3, 11, 300, 9, 12]
        ctx.rewind(0)
        ctx.prefill(prompt)
        rows = ctx.verify(drafts, parents=TREE)
        for i, want in enumerate(decoded_rows(ctx, len(prompt), drafts, TREE)):
            if quant == "f32":   # f32 GEMMs sum in another order at 8 tokens than at 1
                assert relerr(rows[i], want) < 1e-5, i
            else:
                assert np.array_equal(rows[i], want), i
