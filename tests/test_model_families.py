"""The families beyond Llama/Qwen/Gemma 3 (Gemma 2, OLMo 2, SmolLM3, Granite, Phi-3/3.5/4-mini): the numpy model against
transformers (logits within 1e-4, 32 greedy tokens identical), their compiled packages against the numpy model of
their weights (and their verify passes' token trees against decode steps, speculative decoding against plain), and
the config corners each brings (NoPE layers, multipliers, fused projections, partial rotary, LongRoPE's short and long
factors, soft-capping)."""
import json

import numpy as np
import pytest

import edgellm
from edgellm.errors import ModelLoadError
from edgellm.models import load_checkpoint
from edgellm.models.numpy_backend import NumpyGraph, NumpyModel
from edgellm.models.registry import spec_from_config
from edgellm.models.rope import resolve_longrope
from edgellm.models.synthetic import make_checkpoint, make_config
from edgellm.quant import get_scheme
from edgellm.quant.reference_model import QuantizedModel
from verify_tree import decoded_rows

PROMPT = [5, 17, 33, 2, 99, 250, 7, 64, 128, 3, 11, 300]
SHORT = [1.0, 1.1, 1.3, 1.6, 2.0, 2.5]
LONG = [1.5, 2.5, 4.0, 6.0, 9.0, 14.0]

FAMILIES = {
    # attention and final-logit soft-capping at caps the random weights reach (models/synthetic.py), sliding layers
    # 0 and 2 (window 5 < the prompt), GeGLU, pre+post norms, query_pre_attn_scalar != head_dim
    "gemma2": ("Gemma2ForCausalLM", {"num_hidden_layers": 3, "tie_word_embeddings": True}),
    "gemma2-nocap": ("Gemma2ForCausalLM", {"attn_logit_softcapping": None, "final_logit_softcapping": None}),
    # q/k norms over all heads; norms after attention and after the FFN, none before
    "olmo2": ("Olmo2ForCausalLM", {}),
    # layer 1 of 3 without RoPE (no_rope_layer_interval 2), tied head
    "smollm3": ("SmolLM3ForCausalLM", {"num_hidden_layers": 3, "tie_word_embeddings": True}),
    # embedding, residual, attention and logit multipliers all away from 1 (models/synthetic.py), biases on
    "granite": ("GraniteForCausalLM", {"tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True}),
    # Phi-3-mini-4k: fused qkv / gate_up, whole heads rotated, no scaling
    "phi3": ("Phi3ForCausalLM", {}),
    # Phi-4-mini's shape: 3/4 of each head rotated, LongRoPE past its original context (8 < the 12-token prompt: the
    # long factors from the first token on, in transformers as in a package of context 96)
    "phi4-mini": ("Phi3ForCausalLM", {"partial_rotary_factor": 0.75, "original_max_position_embeddings": 8,
                                      "tie_word_embeddings": True,
                                      "rope_scaling": {"rope_type": "longrope", "short_factor": SHORT,
                                                       "long_factor": LONG}}),
    # Phi-3.5's: LongRoPE inside its original context (64 > prompt + 32 tokens: the short factors throughout)
    "phi3.5-short": ("Phi3ForCausalLM", {"partial_rotary_factor": 0.75, "original_max_position_embeddings": 64,
                                         "max_position_embeddings": 256,
                                         "rope_scaling": {"type": "longrope", "short_factor": SHORT, "long_factor": LONG}}),
}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {n: make_checkpoint(root / n, arch, seed=30 + i, **cfg) for i, (n, (arch, cfg)) in enumerate(FAMILIES.items())}


def relerr(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_numpy_matches_transformers(name, ckpts):
    from test_models_vs_transformers import check_against_transformers

    check_against_transformers(ckpts[name])


def test_longrope_switch_matches_transformers_forward(tmp_path):
    """Across the original context, transformers' forward switches to the long factors for every later pass (the
    keys already cached keep their rotation); the numpy model does the same. (transformers' generate() disagrees
    with its own forward there, so the comparison is of forward passes.)"""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    d = make_checkpoint(tmp_path / "p", "Phi3ForCausalLM", seed=3, original_max_position_embeddings=14,
                        rope_scaling={"rope_type": "longrope", "short_factor": SHORT + [3.0, 3.5],
                                      "long_factor": LONG + [20.0, 30.0]})
    spec, ck, _ = load_checkpoint(str(d))
    hf = transformers.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()
    m = NumpyModel(spec, ck.get)
    m.reset()
    m.forward(PROMPT)
    seq = PROMPT + [40, 41, 42, 43, 44]
    with torch.no_grad():
        out = hf(torch.tensor([PROMPT]), use_cache=True)
        for t in seq[12:]:       # positions 12..16: short up to 13, long from 14 on
            out = hf(torch.tensor([[t]]), past_key_values=out.past_key_values, use_cache=True)
            assert relerr(m.forward([t])[-1], out.logits[0, -1].numpy()) < 1e-4


# one scheme per family, between them every scheme family: float, int8, int4 (RTN and GPTQ), ternary
PACKAGES = [("gemma2", "f32"), ("gemma2", "q4g32"), ("olmo2", "f32"), ("olmo2", "q4g32"), ("smollm3", "q8"), ("granite", "q4g32"),
            ("phi4-mini", "f32"), ("phi4-mini", "q8"), ("phi3.5-short", "t2")]


@pytest.mark.parametrize("name,quant", PACKAGES)
def test_package_matches_numpy(name, quant, ckpts, tmp_path):
    spec, ck, _ = load_checkpoint(str(ckpts[name]))
    pkg = edgellm.compile(str(ckpts[name]), quant=quant, out=tmp_path / "p", max_context=96, prefill_chunk=8,
                          progress=False, verify_tokens=8)
    spec = resolve_longrope(spec, 96)
    ref = (NumpyModel(spec, ck.get) if quant == "f32" else
           QuantizedModel(spec, ck.get, get_scheme(quant), get_scheme("q8g32")))
    with edgellm.Runtime.load(pkg, threads=2) as rt:
        assert relerr(rt.logits(PROMPT), ref.logits(PROMPT)) < (1e-4 if quant == "f32" else 2e-3)
        greedy = rt.generate(PROMPT, max_new_tokens=32, ignore_eos=True).token_ids
        assert greedy == ref.greedy(PROMPT, 32)
        check_verify_tree(rt, quant)
        # speculative decoding on the family's own corners (soft-capping, NoPE layers, post-norms, partial rotary)
        for mode in ("ngram", "recycle", "auto"):
            got = rt.generate(PROMPT, max_new_tokens=32, ignore_eos=True, temperature=0, speculate=mode).token_ids
            assert got == greedy, mode


TREE = [-1, 0, 0, 1, 1, 2, 3, 6]   # a verify pass's token tree: node i follows node TREE[i]


def check_verify_tree(rt, quant):
    """Each node of a verify pass's tree has the logits of decoding its path (bitwise on the integer schemes, whose
    GEMMs sum each token alike at every token count; f32's sum in another order)."""
    ctx, drafts = rt.context, [7, 64, 128, 3, 11, 300, 9, 12]
    ctx.rewind(0)
    ctx.prefill(PROMPT)
    rows = ctx.verify(drafts, parents=TREE)
    for i, want in enumerate(decoded_rows(ctx, len(PROMPT), drafts, TREE)):
        if quant == "f32":
            assert relerr(rows[i], want) < 1e-5, i
        else:
            assert np.array_equal(rows[i], want), i
    ctx.rewind(0)


def test_longrope_factors_follow_the_package_context(ckpts, tmp_path):
    """A package whose context stays inside original_max_position_embeddings rotates with the short factors, a
    longer one with the long factors at every position (llama.cpp's choice by n_ctx); each equals the numpy model
    so fixed, and the two differ."""
    d = ckpts["phi3.5-short"]
    spec, ck, _ = load_checkpoint(str(d))
    got = {}
    for ctx in (64, 96):
        pkg = edgellm.compile(str(d), quant="f32", out=tmp_path / str(ctx), max_context=ctx, prefill_chunk=8,
                              progress=False)
        cfg = json.loads((pkg / "manifest.json").read_text())["model"]["config"]
        assert cfg["rope_scaling"]["long"] is (ctx > 64)
        with edgellm.Runtime.load(pkg, threads=2) as rt:
            got[ctx] = rt.logits(PROMPT)
        assert relerr(got[ctx], NumpyModel(resolve_longrope(spec, ctx), ck.get).logits(PROMPT)) < 1e-4
    assert relerr(got[64], got[96]) > 1e-2


def test_gptq_layer_by_layer_forward_on_post_norm_and_fused_families(ckpts):
    """GPTQ's per-layer evaluation (earlier layers skipped, the hidden state substituted) equals the numpy forward
    pass for a family whose layers start with a projection (OLMo 2) and one read from fused tensors (Phi-4-mini)."""
    from edgellm.models import family
    from edgellm.quant import calibration as cal

    for name in ("olmo2", "phi4-mini"):
        spec, ck, _ = load_checkpoint(str(ckpts[name]))
        ids = list(range(1, 30))
        fwd = family(spec)
        x = cal._run(fwd, spec, cal._Weights(ck.get), np.float64, -1, None, ids, None)
        for layer in range(spec.n_layers):
            x = cal._run(fwd, spec, cal._Weights(ck.get), np.float64, layer, x, ids, cal._Capture({}, 0))
        np.testing.assert_allclose(x, fwd.body(NumpyGraph(spec, ck.get, np.float64), ids), rtol=1e-9, atol=1e-9)


def test_gptq_package(ckpts, tmp_path):
    """--gptq on OLMo 2 (calibrated layer by layer through its post-norm blocks; the per-layer evaluation is the
    forward pass, test above): the package records GPTQ, its codes differ from RTN's, and it stays a q4 model of
    the float one. (Which of the two is closer to the float model on random weights is the weights' luck: GPTQ's
    guarantee is per layer, on the calibration text, tests/test_gptq.py.)"""
    d = ckpts["olmo2"]
    spec, ck, _ = load_checkpoint(str(d))
    want = NumpyModel(spec, ck.get).logits(PROMPT)
    got = {}
    for gptq in (False, True):
        pkg = edgellm.compile(str(d), quant="q4g32", gptq=gptq, out=tmp_path / str(gptq), max_context=96,
                              prefill_chunk=8, progress=False)
        with edgellm.Runtime.load(pkg, threads=2) as rt:
            assert rt.manifest["quant"]["method"] == ("gptq" if gptq else "rtn")
            got[gptq] = rt.logits(PROMPT)
    assert relerr(got[True], got[False]) > 1e-3
    assert all(np.isfinite(g).all() and relerr(g, want) < 0.6 for g in got.values())


# ---- configs as the released models write them (values from their config.json; factor lists of the right length)
REAL_CONFIGS = {
    "gemma-2-2b-it": dict(arch="Gemma2ForCausalLM", hidden_size=2304, num_attention_heads=8, num_key_value_heads=4,
                          head_dim=256, intermediate_size=9216, num_hidden_layers=26, vocab_size=256000,
                          query_pre_attn_scalar=256, sliding_window=4096, attn_logit_softcapping=50.0,
                          final_logit_softcapping=30.0, tie_word_embeddings=True, layer_types=None),
    "Phi-3.5-mini-instruct": dict(arch="Phi3ForCausalLM", hidden_size=3072, num_attention_heads=32,
                                  num_key_value_heads=32, intermediate_size=8192, num_hidden_layers=32,
                                  vocab_size=32064, max_position_embeddings=131072,
                                  original_max_position_embeddings=4096, sliding_window=262144,
                                  rope_scaling={"type": "longrope", "short_factor": [1.0] * 48,
                                                "long_factor": [1.5] * 48}),
    "Phi-4-mini-instruct": dict(arch="Phi3ForCausalLM", hidden_size=3072, num_attention_heads=24,
                                num_key_value_heads=8, intermediate_size=8192, num_hidden_layers=32, vocab_size=200064,
                                max_position_embeddings=131072, original_max_position_embeddings=4096,
                                partial_rotary_factor=0.75, tie_word_embeddings=True, sliding_window=262144,
                                rope_scaling={"type": "longrope", "short_factor": [1.0] * 48,
                                              "long_factor": [1.5] * 48}),
    "SmolLM3-3B": dict(arch="SmolLM3ForCausalLM", hidden_size=2048, num_attention_heads=16, num_key_value_heads=4,
                       intermediate_size=11008, num_hidden_layers=36, vocab_size=128256, rope_theta=5000000.0,
                       no_rope_layers=[int((i + 1) % 4 != 0) for i in range(36)], use_sliding_window=False,
                       sliding_window=None, max_position_embeddings=65536, tie_word_embeddings=True),
    "granite-3.3-2b-instruct": dict(arch="GraniteForCausalLM", hidden_size=2048, num_attention_heads=32,
                                    num_key_value_heads=8, intermediate_size=8192, num_hidden_layers=40,
                                    vocab_size=49159, embedding_multiplier=12.0, residual_multiplier=0.22,
                                    attention_multiplier=0.015625, logits_scaling=8.0, tie_word_embeddings=True),
    "OLMo-2-0425-1B": dict(arch="Olmo2ForCausalLM", hidden_size=2048, num_attention_heads=16, num_key_value_heads=16,
                           intermediate_size=8192, num_hidden_layers=16, vocab_size=100352, rope_theta=500000.0),
}


@pytest.mark.parametrize("name", sorted(REAL_CONFIGS))
def test_released_configs(name):
    kw = dict(REAL_CONFIGS[name])
    arch = kw.pop("arch")
    cfg = make_config(arch, **{"head_dim": None, **kw})
    s = spec_from_config(cfg)
    if name == "gemma-2-2b-it":
        assert (s.head_dim, s.attn_softcap, s.final_softcap, s.q_scale) == (256, 50.0, 30.0, 1.0)
        assert s.layer_windows == (4096, 0) * 13 and not s.qk_norm
        return
    assert s.head_dim == kw["hidden_size"] // kw["num_attention_heads"]
    if name == "Phi-4-mini-instruct":
        assert s.rotary_dim == 96 and s.fused_qkv and s.rope_scaling["original_max_position_embeddings"] == 4096
    if name == "SmolLM3-3B":
        assert s.nope_layers == tuple(range(3, 36, 4)) and s.tie_word_embeddings
    if name == "granite-3.3-2b-instruct":
        assert (s.embed_scale, s.residual_scale, s.logit_scale) == (12.0, 0.22, 1 / 8.0)
        assert abs(s.q_scale - 0.015625 * 8) < 1e-12     # attention_multiplier in place of 1/sqrt(64)
    if name.startswith("Phi"):
        assert set(s.layer_windows) == {262144}


@pytest.mark.parametrize("arch,bad,match", [
    ("SmolLM3ForCausalLM", {"no_rope_layers": [1, 2]}, "no_rope_layers must be a list of 2 flags"),
    ("Phi3ForCausalLM", {"partial_rotary_factor": 0.2}, "partial_rotary_factor 0.2 of head_dim 16 rotates 3"),
    ("Phi3ForCausalLM", {"partial_rotary_factor": 1.5}, "partial_rotary_factor must be a number in"),
    ("Phi3ForCausalLM", {"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 8}},
     "short_factor must be a list of 8 numbers"),
    ("Phi3ForCausalLM", {"original_max_position_embeddings": None,
                         "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [1.0] * 8}},
     "needs original_max_position_embeddings"),
    ("GraniteForCausalLM", {"logits_scaling": 0}, "logits_scaling must be a finite number > 0"),
    ("Olmo2ForCausalLM", {"attention_bias": True}, "attention_bias: true is not supported yet"),
])
def test_bad_configs_are_one_line(arch, bad, match):
    with pytest.raises(ModelLoadError, match=match) as e:
        spec_from_config(make_config(arch, **bad))
    assert "\n" not in str(e.value)


# ---- the other compiler paths, on the two families that differ most from Llama's: a post-norm block (OLMo 2) and
# fused checkpoint tensors + partial rotary + LongRoPE (Phi-4-mini)
def _host_and(ckpts, tmp_path, name, target, quant, **kw):
    opts = dict(quant=quant, max_context=96, prefill_chunk=8, progress=False, **kw)
    return (edgellm.compile(str(ckpts[name]), out=tmp_path / f"{name}-host", **opts),
            edgellm.compile(str(ckpts[name]), target=target, out=tmp_path / f"{name}-{target}", **opts))


def test_softcapping_changes_the_model(ckpts):
    """The caps of the tiny Gemma 2 bite: without them the same weights give other logits."""
    import dataclasses

    spec, ck, _ = load_checkpoint(str(ckpts["gemma2"]))
    assert (spec.attn_softcap, spec.final_softcap) == (4.0, 60.0)
    capped = NumpyModel(spec, ck.get).logits(PROMPT)
    for off in ({"attn_softcap": 0.0}, {"final_softcap": 0.0}):
        assert relerr(NumpyModel(dataclasses.replace(spec, **off), ck.get).logits(PROMPT), capped) > 0.01


@pytest.mark.parametrize("name,quant", [("olmo2", "q8"), ("phi4-mini", "q4g32"), ("gemma2", "f32")])
def test_opencl_matches_the_cpu(name, quant, ckpts, tmp_path):
    from test_opencl import assert_close, needs_device

    if needs_device.args[0]:
        pytest.skip(needs_device.kwargs["reason"])
    cpu_pkg, gpu_pkg = _host_and(ckpts, tmp_path, name, "opencl", quant)
    with edgellm.Runtime.load(gpu_pkg) as gpu, edgellm.Runtime.load(cpu_pkg) as cpu:
        assert gpu.device and gpu.device.startswith("OpenCL")
        assert_close(gpu.logits(PROMPT), cpu.logits(PROMPT), quant)
        assert (gpu.generate(PROMPT, max_new_tokens=24, ignore_eos=True).token_ids ==
                cpu.generate(PROMPT, max_new_tokens=24, ignore_eos=True).token_ids)


@pytest.mark.parametrize("name,quant", [("olmo2", "q4g32"), ("phi4-mini", "q8")])
def test_rpi5_under_qemu_matches_the_host(name, quant, ckpts, tmp_path):
    from test_targets_arm import HAVE_CROSS, QUANT_TOL, qemu, run_binary

    if not HAVE_CROSS:
        pytest.skip("needs qemu-aarch64 and the aarch64 cross toolchain")
    host, arm = _host_and(ckpts, tmp_path, name, "rpi5", quant)
    want_ids, want = run_binary(host, dump=tmp_path / "host.f32")
    ids, logits = run_binary(arm, prefix=qemu("rpi5"), dump=tmp_path / "arm.f32")
    assert ids == want_ids and relerr(logits, want) < QUANT_TOL


def test_windowed_olmo2(tmp_path):
    """OLMo 2 whose layers outweigh its embeddings, under a 40% weight budget (weights streamed through a window):
    the same tokens and bitwise the same logits as with every weight resident."""
    from test_window import budget_for

    d = make_checkpoint(tmp_path / "c", "Olmo2ForCausalLM", seed=3, vocab_size=512, hidden_size=512,
                        intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                        head_dim=64)
    pkg = edgellm.compile(str(d), quant="q8", out=tmp_path / "p", max_context=96, prefill_chunk=8, progress=False)
    with edgellm.Runtime.load(pkg, threads=2) as rt:
        want_ids, want = rt.generate(PROMPT, max_new_tokens=10, ignore_eos=True).token_ids, rt.logits(PROMPT)
    with edgellm.Runtime.load(pkg, threads=2, memory_budget=budget_for(pkg, 40), weight_policy="window") as rt:
        assert rt.memory()["streamed_bytes"] > 0
        assert rt.generate(PROMPT, max_new_tokens=10, ignore_eos=True).token_ids == want_ids
        np.testing.assert_array_equal(rt.logits(PROMPT), want)


@pytest.mark.parametrize("name", ["olmo2", "phi4-mini"])
def test_bundled_layout(name, ckpts, tmp_path):
    """The neuron-bundled FFN layout (gate/up/down rows of a neuron stored together) gives the plain layout's
    tokens: OLMo 2's FFN reads the un-normed stream, Phi-4-mini's gate and up come out of one fused tensor."""
    opts = dict(quant="f16", max_context=96, prefill_chunk=8, progress=False)
    plain = edgellm.compile(str(ckpts[name]), out=tmp_path / "p", **opts)
    bundled = edgellm.compile(str(ckpts[name]), layout="bundled", out=tmp_path / "b", **opts)
    # threshold 0: every neuron group runs (exact up to summation order)
    with edgellm.Runtime.load(plain, threads=2) as a, edgellm.Runtime.load(bundled, threads=2, ffn_threshold=0) as b:
        assert relerr(b.logits(PROMPT), a.logits(PROMPT)) < 1e-5
        assert (b.generate(PROMPT, max_new_tokens=16, ignore_eos=True).token_ids ==
                a.generate(PROMPT, max_new_tokens=16, ignore_eos=True).token_ids)


@pytest.mark.parametrize("name", ["phi4-mini", "gemma2"])
def test_npu_prefill(name, ckpts, tmp_path):
    """Phi-4-mini's partial rotary (zero frequencies in npu/rope.bin) and LongRoPE tables, Gemma 2's soft-capped
    attention scores (Tanh in the float16 attention), through the NPU graphs on the HTP emulator: the NPU prefill's
    logits against the same package's CPU path; OLMo 2 (projections reading the un-normed residual stream, which
    the graphs keep in float16) is refused in one line."""
    from test_npu import needs_qnn

    if needs_qnn.args[0]:
        pytest.skip(needs_qnn.kwargs["reason"])
    opts = dict(target="host-npu", quant="f32", max_context=64, npu_chunk=16, soc="sm8650", progress=False)
    pkg = edgellm.compile(str(ckpts[name]), out=tmp_path / "p", **opts)
    ids = [int(i) for i in np.random.default_rng(3).integers(0, 997, 40)]
    with edgellm.Runtime.load(pkg, prefill_backend="npu", npu_soc="sm8650", threads=2) as n, \
            edgellm.Runtime.load(pkg, prefill_backend="cpu", threads=2) as c:
        assert n.prefill_backend == "npu", n.prefill_backend_note
        a, b = n.logits(ids), c.logits(ids)
    assert relerr(a, b) < 0.02 and (a.argmax(-1) == b.argmax(-1)).mean() >= 0.95
    if name == "gemma2":
        return
    with pytest.raises(edgellm.EdgeLLMError, match="the olmo2 family cannot run on the NPU prefill path") as e:
        edgellm.compile(str(ckpts["olmo2"]), out=tmp_path / "o", **opts)
    assert "\n" not in str(e.value) and not (tmp_path / "o").exists()
