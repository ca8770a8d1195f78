"""Window caches: a sliding-window layer keeps only the KV rows its window can still see (compiler/kv_layout.py,
runtime/contract.h). Over prompts and generations many times longer than the cache, packages with them give the
logits and tokens of packages with whole-context caches (--swa-full) and of the numpy model; a conversation rewound
past what they hold falls back to a full prefill with the same tokens; the memory they save is what the plan says."""
import numpy as np
import pytest

import edgellm
from edgellm.compiler.kv_layout import kv_cache_bytes, kv_layers, window_cache_rows
from edgellm.models import load_checkpoint
from edgellm.models.numpy_backend import NumpyModel
from edgellm.models.synthetic import make_checkpoint

CTX, CHUNK = 256, 8
RNG = np.random.default_rng(7)
LONG = [int(t) for t in RNG.integers(3, 400, 200)]   # 200 tokens: the 72-row caches move three times in its prefill


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory):
    """Gemma 2 (layers 0 and 2 sliding, window 5; soft-capping on), f32: the window cache and the whole cache."""
    root = tmp_path_factory.mktemp("window-cache")
    d = make_checkpoint(root / "ck", "Gemma2ForCausalLM", seed=30, num_hidden_layers=3, tie_word_embeddings=True)
    opts = dict(quant="f32", max_context=CTX, prefill_chunk=CHUNK, progress=False)
    return (d, edgellm.compile(str(d), out=root / "window", **opts),
            edgellm.compile(str(d), out=root / "full", swa_full=True, **opts))


def relerr(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_layout_rules():
    """2W rows rounded up to 64, plus a chunk of room; none where that is no smaller than the context."""
    assert window_cache_rows(5, 256, 264) == 64 + 8
    assert window_cache_rows(512, 4096, 4224) == 1024 + 128
    assert window_cache_rows(512, 1024, 1152) is None and window_cache_rows(0, 4096, 4224) is None

    class Spec:
        n_layers, n_kv_heads, head_dim = 4, 1, 256

        def window(self, layer):
            return (512, 512, 512, 0)[layer]

    layers = kv_layers(Spec(), 32768, 32768 + 128)
    assert layers == [(1152, 512)] * 3 + [(32896, 0)]
    assert kv_layers(Spec(), 32768, 32896, window_caches=False) == [(32896, 512)] * 3 + [(32896, 0)]
    # Gemma 3 270M's shape at 32k: 15 of 18 layers sliding (window 512) -> the cache shrinks by 80%
    saved = 1 - kv_cache_bytes(Spec(), layers) / kv_cache_bytes(Spec(), [(32896, 0)] * 4)
    assert 0.72 < saved < 0.73   # 3 of 4 layers at 1152 / 32896 rows


def test_long_prompt_and_generation_match_the_whole_cache(gemma2):
    d, window, full = gemma2
    with edgellm.Runtime.load(window, threads=2) as w, edgellm.Runtime.load(full, threads=2) as f:
        assert w.stats()["kv_bytes"] == (264 + 2 * 72) / (3 * 264) * f.stats()["kv_bytes"]
        lw, lf = w.logits(LONG), f.logits(LONG)   # every position's logits, through 25 chunks
        assert relerr(lw, lf) < 1e-5
        assert w.stats()["kv_window_moves"] == 2 * 3   # two window layers, moved at positions 64, 124 and 184
        gw = w.generate(LONG[:12], max_new_tokens=CTX - 13, ignore_eos=True).token_ids
        assert gw == f.generate(LONG[:12], max_new_tokens=CTX - 13, ignore_eos=True).token_ids
    spec, ck, _ = load_checkpoint(str(d))
    ref = NumpyModel(spec, ck.get)
    assert relerr(lw, ref.logits(LONG)) < 1e-4
    assert gw == ref.greedy(LONG[:12], CTX - 13)


def test_reuse_prefix_before_what_the_window_holds_prefills_again(gemma2):
    """A conversation rewound to a point the window layers no longer hold keys for is prefilled from the start
    (cached_tokens 0); one rewound after their last move reuses its prefix. Both give a fresh context's tokens."""
    _, window, _ = gemma2
    with edgellm.Runtime.load(window, threads=2) as rt:
        ctx, fresh = rt.new_context(), rt.new_context()
        first = ctx.generate(LONG[:12], max_new_tokens=100, ignore_eos=True)   # the caches move at 64 and 124
        held = LONG[:12] + first.token_ids[:-1]
        for common, reused in ((30, False), (len(held) - 3, True)):
            prompt = held[:common] + [9, 8, 7]
            got = ctx.generate(prompt, max_new_tokens=20, ignore_eos=True, reuse_prefix=True)
            want = fresh.generate(prompt, max_new_tokens=20, ignore_eos=True)
            assert got.token_ids == want.token_ids
            assert got.cached_tokens == (common if reused else 0)
            # back to the long conversation for the next case
            ctx.generate(LONG[:12], max_new_tokens=100, ignore_eos=True)


def test_info_says_what_the_window_caches_save(gemma2):
    from click.testing import CliRunner

    from edgellm.cli import cli

    def memory_line(pkg):
        return next(x for x in CliRunner().invoke(cli, ["info", str(pkg)]).output.splitlines() if "memory:" in x)

    _, window, full = gemma2
    assert "KV cache 0.1 MiB (2 sliding-window layers keep 72 of 264 rows: 0.1 MiB (48%) less than 0.2 MiB)" in \
        memory_line(window), memory_line(window)
    assert "sliding" not in memory_line(full)


def test_opencl_window_caches_move_on_the_device(gemma2, tmp_path):
    """The OpenCL backend moves its own (device) copy of the rows: same tokens as the CPU over 240 tokens."""
    from test_opencl import assert_close, needs_device

    if needs_device.args[0]:
        pytest.skip(needs_device.kwargs["reason"])
    d, window, _ = gemma2
    gpu_pkg = edgellm.compile(str(d), target="opencl", out=tmp_path / "cl", quant="f32", max_context=CTX,
                              prefill_chunk=CHUNK, progress=False)
    with edgellm.Runtime.load(gpu_pkg) as gpu, edgellm.Runtime.load(window, threads=2) as cpu:
        assert_close(gpu.logits(LONG), cpu.logits(LONG), "f32")
        assert gpu.stats()["kv_window_moves"] == 6
        assert (gpu.generate(LONG[:12], max_new_tokens=CTX - 13, ignore_eos=True).token_ids ==
                cpu.generate(LONG[:12], max_new_tokens=CTX - 13, ignore_eos=True).token_ids)
