"""Shared fixtures: seeded tiny checkpoints for every architecture and config corner the spine must handle."""
from __future__ import annotations

import os

import pytest

# Compiles in tests keep the targets' default knobs: no timing on a loaded CI host, the same packages every run.
# tests/test_tune.py turns tuning on where it tests it.
os.environ.setdefault("EDGELLM_TUNE", "off")

from edgellm.models.synthetic import make_checkpoint

# name -> (architecture, config overrides). Together they cover: GQA, MHA, tied embeddings, head_dim 8 and 64,
# a vocab that is not a multiple of 64, qkv bias (Qwen2), q/k norm (Qwen3), llama3 rope scaling.
TINY = {
    "llama-gqa": ("LlamaForCausalLM", {}),
    "llama-tied-hd8": ("LlamaForCausalLM", {"tie_word_embeddings": True, "hidden_size": 32, "num_attention_heads": 4,
                                            "num_key_value_heads": 4, "head_dim": 8, "vocab_size": 1001}),
    "llama3-hd64": ("LlamaForCausalLM", {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
                                         "head_dim": 64, "intermediate_size": 256, "rope_theta": 500000.0,
                                         "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                          "high_freq_factor": 4.0,
                                                          "original_max_position_embeddings": 64}}),
    "qwen2": ("Qwen2ForCausalLM", {"tie_word_embeddings": True}),
    "qwen3": ("Qwen3ForCausalLM", {"num_hidden_layers": 3}),
    "gemma3": ("Gemma3ForCausalLM", {"num_hidden_layers": 3, "tie_word_embeddings": True}),
}


@pytest.fixture(scope="session", autouse=True)
def kernel_cache(tmp_path_factory):
    """Packages with identical kernels (the same model and scheme compiled by several test modules) link their
    kernels.so once per session (compiler/kernels_build.py); tests of the build's failure paths turn it off."""
    old = os.environ.get("EDGELLM_KERNEL_CACHE")
    if os.environ.get("PYTEST_XDIST_WORKER"):   # pytest -n: the workers share one cache (entries land by rename)
        root = tmp_path_factory.getbasetemp().parent / "kernel-cache"
        root.mkdir(exist_ok=True)
    else:
        root = tmp_path_factory.mktemp("kernel-cache")
    os.environ["EDGELLM_KERNEL_CACHE"] = str(root)
    yield
    if old is None:
        os.environ.pop("EDGELLM_KERNEL_CACHE", None)
    else:
        os.environ["EDGELLM_KERNEL_CACHE"] = old


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """name -> checkpoint dir, generated once per session."""
    root = tmp_path_factory.mktemp("ckpt")
    return {name: make_checkpoint(root / name, arch, seed=i, **cfg) for i, (name, (arch, cfg)) in enumerate(TINY.items())}


@pytest.fixture(scope="session")
def demo_q8(tmp_path_factory):
    """The demo model compiled for this CPU in q8, once per session, for the front-end tests (JNI, serve, chat) that
    only read it."""
    from pathlib import Path

    from edgellm.compiler.driver import compile_model

    demo = Path(__file__).resolve().parents[1] / "models" / "demo" / "demo-llama"
    return compile_model(demo, target="host", quant="q8", out=tmp_path_factory.mktemp("demo-q8") / "demo-q8",
                         progress=False)


@pytest.fixture(params=sorted(TINY))
def tiny_model(request, tiny_models):
    return tiny_models[request.param]


@pytest.fixture()
def plain_kernels(monkeypatch):
    """Every tuned schedule raises, so make_kernel falls back to the plain kernels; its cache is cleared before and
    after, so no other test sees a fallback kernel."""
    from edgellm.compiler import ops

    real = ops._build

    def failing(op, cpu, p, fast):
        if fast:
            raise RuntimeError("schedule rejected (test)")
        return real(op, cpu, p, fast)

    monkeypatch.setattr(ops, "_build", failing)
    ops._make_cached.cache_clear()
    yield
    ops._make_cached.cache_clear()
