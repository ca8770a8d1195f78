"""Mixture-of-experts models (Mixtral, Qwen2-MoE with its gated shared expert, Qwen3-MoE, OLMoE): the numpy oracle
against transformers, compiled packages against the oracle (f32 exact; every scheme against the numpy model of the
package's quantized weights), chunked prefill against token-by-token decode, the expert layout, the bytes a decode
token reads (runtime counters: only the top-k experts), the bundled demo-moe, and an rpi5 package under qemu."""
import json

import numpy as np
import pytest

import edgellm
from edgellm.errors import CompileError, ModelLoadError
from edgellm.models import load_checkpoint
from edgellm.models.numpy_backend import NumpyModel
from edgellm.models.synthetic import make_checkpoint, make_config
from edgellm.quant import get_scheme
from edgellm.quant.reference_model import QuantizedModel
from edgellm.runtime.contract import WEIGHT_ALIGN

PROMPT = [5, 17, 33, 2, 99, 250, 7, 64, 128, 3, 11, 300]
N_NEW = 32
CHUNK = 5   # 12 prompt tokens: chunks of 5, 5 and a tail of 2 (the short program)
TOL = 2e-3  # quantized packages vs their oracle (tests/test_quant_packages.py explains the bound)

# name -> (architecture, overrides). Between them: renormalized and raw top-k weights, a shared expert with its
# sigmoid gate, a dense layer among MoE layers (mlp_only_layers), per-head and whole-width q/k norms, qkv bias.
ARCHS = {
    "mixtral": ("MixtralForCausalLM", {}),
    "qwen2-moe": ("Qwen2MoeForCausalLM", {"num_hidden_layers": 3, "mlp_only_layers": [1], "intermediate_size": 192}),
    "qwen3-moe": ("Qwen3MoeForCausalLM", {"num_experts": 8, "num_experts_per_tok": 3, "hidden_size": 128,
                                          "head_dim": 32, "moe_intermediate_size": 128, "intermediate_size": 256}),
    "olmoe": ("OlmoeForCausalLM", {}),
}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe")
    return {name: make_checkpoint(root / name, arch, seed=20 + i, **kw) for i, (name, (arch, kw)) in enumerate(ARCHS.items())}


@pytest.fixture(scope="module")
def packages(ckpts, tmp_path_factory):
    root = tmp_path_factory.mktemp("moepkg")
    cache = {}

    def get(model: str, quant: str = "f32", target: str = "host", **kw):
        key = (model, quant, target, tuple(sorted(kw.items())))
        if key not in cache:
            cache[key] = edgellm.compile(str(ckpts[model]), target=target, quant=quant, max_context=96,
                                         prefill_chunk=CHUNK, out=root / f"{model}-{quant}-{target}-{len(cache)}",
                                         progress=False, **kw)
        return cache[key]

    return get


def relerr(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def greedy(rt, n=N_NEW):
    return rt.generate(PROMPT, max_new_tokens=n, ignore_eos=True, temperature=0).token_ids


# ----------------------------------------------------------------------------------------- the numpy oracle
@pytest.mark.parametrize("name", [*ARCHS, "qwen2-moe-sparse-step"])
def test_numpy_matches_transformers(ckpts, tmp_path, name):
    pytest.importorskip("transformers")
    from test_models_vs_transformers import check_against_transformers

    if name == "qwen2-moe-sparse-step":   # every 2nd layer sparse (decoder_sparse_step), top-k not renormalized
        d = make_checkpoint(tmp_path / "m", "Qwen2MoeForCausalLM", seed=9, num_hidden_layers=4, decoder_sparse_step=2)
    else:
        d = ckpts[name]
    check_against_transformers(d)


# ------------------------------------------------------------------------------------------ compiled packages
@pytest.mark.parametrize("name", list(ARCHS))
def test_f32_package_matches_numpy(ckpts, packages, name):
    spec, ck, _ = load_checkpoint(str(ckpts[name]))
    ref = NumpyModel(spec, ck.get)
    want = ref.logits(PROMPT)
    with edgellm.Runtime.load(packages(name), threads=2) as rt:
        chunked = rt.logits(PROMPT)                       # prefill chunks: tokens grouped by expert
        rt.reset()
        stepped = np.stack([rt.decode_step(t) for t in PROMPT])   # one token at a time: top-k experts each
        assert relerr(chunked, want) < 1e-4 and relerr(stepped, want) < 1e-4
        assert relerr(chunked, stepped) < 1e-5
        assert greedy(rt) == ref.greedy(PROMPT, N_NEW)


@pytest.mark.parametrize("name,quant", [("mixtral", "q8"), ("mixtral", "q4g32"), ("qwen2-moe", "q4g64"),
                                        ("qwen3-moe", "q4g128"), ("olmoe", "t2")])
def test_quantized_package_matches_oracle(ckpts, packages, name, quant):
    spec, ck, _ = load_checkpoint(str(ckpts[name]))
    head = get_scheme(quant).default_head or quant
    ref = QuantizedModel(spec, ck.get, get_scheme(quant), get_scheme(head))
    with edgellm.Runtime.load(packages(name, quant), threads=2) as rt:
        # t2 re-quantizes every projection's input per token: rounding-edge flips compound as in the BitNet oracle
        # test (tests/test_quant_packages.py), 1e-2 of the range (0.0045 measured on a Zen 3 AVX2 host)
        assert relerr(rt.logits(PROMPT), ref.logits(PROMPT)) < (1e-2 if quant == "t2" else TOL)
        assert greedy(rt) == ref.greedy(PROMPT, N_NEW)


def test_gptq_package_matches_oracle(ckpts, packages):
    from edgellm.quant.calibration import gptq_from_checkpoint

    spec, ck, d = load_checkpoint(str(ckpts["mixtral"]))
    scheme = get_scheme("q4g32")
    pre = gptq_from_checkpoint(spec, lambda n: np.asarray(ck.get(n), np.float32), scheme, d / "tokenizer.json")
    experts = [n for n in pre if ".experts." in n]
    assert len(experts) == 3 * spec.n_experts * spec.n_layers   # every expert matrix is GPTQ-calibrated
    ref = QuantizedModel(spec, ck.get, scheme, get_scheme("q8g32"))
    ref._parts.update({(n, scheme.name): p for n, p in pre.items()})
    with edgellm.Runtime.load(packages("mixtral", "q4g32", gptq=True), threads=2) as rt:
        assert relerr(rt.logits(PROMPT), ref.logits(PROMPT)) < TOL
        assert greedy(rt) == ref.greedy(PROMPT, N_NEW)


def test_expert_layout_and_bytes_read_per_token(ckpts, packages, tmp_path):
    """Each expert is one contiguous 16 KiB-aligned weight, the experts of a layer consecutive; a decode token reads
    the non-expert weights (one embedding row) and exactly top-k experts per MoE layer (runtime counters)."""
    from edgellm.runtime.python.bench import bench

    pkg = packages("qwen2-moe", "q8")
    m = json.loads((pkg / "manifest.json").read_text())
    moe, tensors = m["moe"], m["tensors"]
    assert (moe["experts"], moe["top_k"], moe["moe_layers"], moe["shared_expert"]) == (4, 2, 2, 128)
    expert_bytes = 0
    for layer in moe["layers"]:
        block = tensors[layer["first_weight"]:layer["first_weight"] + moe["experts"]]
        assert [t["name"] for t in block] == [f"{layer['name']}.{e}" for e in range(moe["experts"])]
        assert all(t["offset"] % WEIGHT_ALIGN == 0 and t["nbytes"] == layer["expert_bytes"] for t in block)
        expert_bytes += sum(t["nbytes"] for t in block)
    other = sum(t["nbytes"] for t in tensors if ".experts." not in t["name"] and not t["name"].startswith("rope.")
                and "embed_tokens" not in t["name"])
    embed_row = next(t["nbytes"] // t["shape"][0] for t in tensors if "embed_tokens" in t["name"])
    want = other + embed_row + expert_bytes * moe["top_k"] // moe["experts"]
    assert abs(moe["weights_read_per_token"] / want - 1) < 0.001
    with edgellm.Runtime.load(pkg, threads=2) as rt:
        greedy(rt, 16)
        s = rt.stats()
    got = s["decode_weight_bytes_read"] / s["decode_tokens"]
    assert abs(got / want - 1) < 0.02, (got, want)
    r = bench(pkg, prompt_len=8, gen_len=8, reps=1)
    assert abs(r["weights_read_per_token"] / want - 1) < 0.02


def test_info_shows_experts(packages):
    from click.testing import CliRunner

    from edgellm.cli import cli

    out = CliRunner().invoke(cli, ["info", str(packages("qwen2-moe", "q8"))]).output
    assert "4 per layer in 2 layers, top-2 + a shared expert (ffn 128)" in out
    assert "parameters active per token" in out and "read per decoded token" in out


def test_demo_moe_package_matches_transformers(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    spec, ck, d = load_checkpoint("demo-moe")
    pkg = edgellm.compile("demo-moe", quant="f32", out=tmp_path / "p", max_context=128, progress=False)
    hf = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    with torch.no_grad():
        want = hf(torch.tensor([PROMPT])).logits[0].numpy()
        want_ids = hf.generate(torch.tensor([PROMPT]), max_new_tokens=N_NEW, min_new_tokens=N_NEW, do_sample=False,
                               pad_token_id=0, eos_token_id=None)[0, len(PROMPT):].tolist()
    with edgellm.Runtime.load(pkg, threads=2) as rt:
        assert relerr(rt.logits(PROMPT), want) < 1e-4
        assert greedy(rt) == want_ids


def test_rpi5_package_under_qemu_matches_host(packages, tmp_path):
    from test_targets_arm import HAVE_CROSS, qemu, run_binary

    if not HAVE_CROSS:
        pytest.skip("needs qemu-aarch64 and the aarch64 cross toolchain (see tests/test_targets_arm.py)")
    host = packages("mixtral", "q4g32")
    arm = packages("mixtral", "q4g32", target="rpi5")
    want_ids, want = run_binary(host, dump=tmp_path / "host.f32")
    ids, logits = run_binary(arm, prefix=qemu("rpi5"), dump=tmp_path / "arm.f32")
    assert ids == want_ids
    assert relerr(logits, want) < TOL


# -------------------------------------------------------------------------------------------------- bad input
def test_moe_errors(ckpts, tmp_path):
    with pytest.raises(CompileError, match="mixture-of-experts.*--layout bundled applies to dense FFNs"):
        edgellm.compile(str(ckpts["mixtral"]), layout="bundled", out=tmp_path / "o", progress=False)
    assert not (tmp_path / "o").exists()
    from edgellm.models.registry import spec_from_config

    for arch, bad, words in (
            ("Qwen3MoeForCausalLM", {"num_experts_per_tok": 9, "num_experts": 8}, "must be at most num_experts"),
            ("Qwen2MoeForCausalLM", {"mlp_only_layers": [5]}, "mlp_only_layers must be a list of layer indices"),
            ("Qwen2MoeForCausalLM", {"mlp_only_layers": "1"}, "mlp_only_layers must be a list"),
            ("OlmoeForCausalLM", {"clip_qkv": 8.0}, "clip_qkv"),
            ("OlmoeForCausalLM", {"num_experts": 0}, "num_experts must be an integer >= 1"),
            ("Qwen2MoeForCausalLM", {"moe_intermediate_size": -3}, "moe_intermediate_size must be"),
            ("Qwen2MoeForCausalLM", {"norm_topk_prob": "yes"}, "norm_topk_prob must be true or false"),
            ("Qwen2MoeForCausalLM", {"decoder_sparse_step": 0}, "decoder_sparse_step must be")):
        with pytest.raises(ModelLoadError, match=words):
            spec_from_config(make_config(arch, **bad))


def test_routing_kernel_matches_oracle():
    """moe_route on logits with ties and a NaN row: the oracle's experts (ties: the lower id) and weights, grouped
    by expert in ascending id order, -1 after the last used expert."""
    import tvm

    from edgellm.compiler.moe import RoutingTable
    from edgellm.compiler.ops import host_cpu_info, llvm_target, make_kernel
    from edgellm.models.numpy_backend import route_top_k

    rng = np.random.default_rng(1)
    for T, E, k, norm in ((1, 8, 2, True), (9, 8, 2, False), (20, 6, 3, True), (3, 64, 8, False)):
        tb = RoutingTable(T, E, k)
        lg = rng.standard_normal((T, E)).astype(np.float32)
        lg[0, 1] = lg[0, 2] = lg[0].max() + 1   # a tie for first place
        name, f = make_kernel("moe_route", host_cpu_info(), T=T, E=E, K=k, normalize=norm, S=tb.S, TP=tb.TP)
        out = [np.zeros((tb.S,), np.int32), np.zeros((tb.S, 16), np.int32), np.zeros((tb.S, tb.TP), np.int32),
               np.zeros((tb.S, tb.TP), np.float32)]
        args = [tvm.runtime.tensor(a) for a in out]
        tvm.compile(tvm.IRModule({name: f}), target=llvm_target())[name](tvm.runtime.tensor(lg), *args)
        ids, cnt, tok, wt = (a.numpy() for a in args)
        top, w = route_top_k(lg.astype(np.float64), k, norm)
        used = sorted(set(top.ravel().tolist()))
        assert ids[:len(used)].tolist() == used and (ids[len(used):] == -1).all()
        assert top[0, :2].tolist() == [1, 2]
        for s, e in enumerate(used):
            rows, slot = np.nonzero(top == e)
            assert tok[s, :cnt[s, 0]].tolist() == rows.tolist()
            np.testing.assert_allclose(wt[s, :cnt[s, 0]], w[rows, slot], rtol=1e-5)


def test_row_limited_linear_kernels_compute_only_their_rows():
    """rows.limit_rows: rows < n bitwise equal to the full kernel, for every scheme's GEMM."""
    import tvm


    rng = np.random.default_rng(2)
    T, N, K = 20, 48, 128
    x = rng.standard_normal((T, K)).astype(np.float32)
    for quant in ("f16", "q8", "q4g32", "t2"):   # the float GEMM, the block-quantized one, the ternary one
        sc = get_scheme(quant)
        parts = sc.quantize(rng.standard_normal((N, K)).astype(np.float32))
        w = [tvm.runtime.tensor(np.ascontiguousarray(parts[p])) for p in sc.part_order]
        op, params = sc.linear_kernel(T, N, K, False)
        full = np.zeros((T, N), np.float32)
        _run(op, params, [x, *w], full)
        for n in (1, 7, 13, 20):
            got = np.full((T, N), 7.0, np.float32)
            cnt = np.zeros((1, 16), np.int32)
            cnt[0, 0] = n
            _run(op, {**params, "rows": True}, [x, *w], got, cnt)
            assert np.array_equal(got[:n], full[:n]), (quant, n)
            if n == 1 and quant in ("q8", "t2"):   # token blocks of 8: the rows past the first block are skipped
                assert (got[8:] == 7.0).all()
            # ROWS_ZERO (the verify program's): the same rows, and zeros past them, fused outputs too
            segs = (16, 32)
            fop, fparams = sc.linear_kernel(T, N, K, False, segs)
            outs = [np.full((T, s), 7.0, np.float32) for s in segs]
            wf = [np.repeat(parts[p], 2) if p == "scale" and quant == "t2" else w[i]   # t2: a scale per matrix
                  for i, p in enumerate(sc.part_order)]
            _run_outs(fop, {**fparams, "rows": 2}, [x, *wf], outs, cnt)
            assert np.array_equal(np.concatenate(outs, 1)[:n], full[:n]), (quant, n)
            assert (np.concatenate(outs, 1)[n:] == 0).all(), (quant, n)


@pytest.mark.parametrize("quant", ["q8", "q8g32", "q4g32", "q4m32", "q6", "t2"])
def test_verify_shaped_row_limited_kernels_every_count(quant):
    """The verify program's shape (8 rows, ROWS_ZERO) at every real-row count: the tiered kernels (a 2-, 4-, 6- or
    8-token tile per range of counts: quant_common.token_tiles) give rows < n bitwise equal to the full kernel's, and
    zeros past them; the tiers' loops are all turned into guards."""
    import tvm

    from edgellm.compiler.ops import host_cpu_info, make_kernel
    from edgellm.compiler.ops.quant_common import token_tiles
    from edgellm.compiler.ops.rows import ROWS_TIER, ROWS_ZERO

    assert token_tiles("avx2", 8, 8, avx2_tt=8, tiered=True) == [(0, 2, 2), (2, 4, 4), (4, 6, 6), (6, 8, 8)]
    assert token_tiles("avx2", 32, 8, avx2_tt=4, tiered=True) == [(0, 2, 2), (2, 32, 4)]
    assert token_tiles("avx2", 4, 8, avx2_tt=8, tiered=True) == [(0, 2, 2), (2, 4, 4)]
    assert token_tiles("avx2", 8, 8, avx2_tt=8) == [(0, 8, 8)]
    rng = np.random.default_rng(3)
    T, N, K = 8, 40, 128
    x = rng.standard_normal((T, K)).astype(np.float32)
    sc = get_scheme(quant)
    parts = sc.quantize(rng.standard_normal((N, K)).astype(np.float32) * 0.05)
    w = [tvm.runtime.tensor(np.ascontiguousarray(parts[p])) for p in sc.part_order]
    op, params = sc.linear_kernel(T, N, K, False)
    _, func = make_kernel(op, host_cpu_info(), **params, rows=ROWS_ZERO)
    assert ROWS_TIER not in str(func.script())
    full = np.zeros((T, N), np.float32)
    _run(op, params, [x, *w], full)
    for n in range(1, T + 1):
        got = np.full((T, N), 7.0, np.float32)
        cnt = np.zeros((1, 16), np.int32)
        cnt[0, 0] = n
        _run(op, {**params, "rows": ROWS_ZERO}, [x, *w], got, cnt)
        assert np.array_equal(got[:n], full[:n]), (quant, n)
        assert (got[n:] == 0).all(), (quant, n)


@pytest.mark.parametrize("quant", ["q8", "q4g32", "t2"])
def test_rows_past_the_count_quantize_to_zeros(quant):
    """A limited kernel's per-token activation loops store zeros for the rows >= n instead of skipping them: the last
    token tile still multiplies those rows' scales, and stale ones (subnormals, NaNs) cost Intel cores microcode
    assists (on a Xeon a verify pass of 7 rows took 20% longer than one of 8). Checked on the TIR: each guarded `t`
    loop's other branch writes the same buffers, constant zeros only, and reads none of the kernel's inputs."""
    from edgellm.compiler.ops import host_cpu_info, make_kernel
    from edgellm.compiler.ops.rows import ROWS_ZERO

    op, params = get_scheme(quant).linear_kernel(8, 40, 128, False)
    _, func = make_kernel(op, host_cpu_info(), **params, rows=ROWS_ZERO)
    guards = [f.body for f in _nodes(func.body, "For")
              if f.loop_var.name == "t" and type(f.body).__name__ == "IfThenElse"]
    assert guards, "no guarded per-token loop"
    for g in guards:
        assert g.else_case is not None
        real, rest = _nodes(g.then_case, "BufferStore"), _nodes(g.else_case, "BufferStore")
        assert [s.buffer.name for s in rest] == [s.buffer.name for s in real]
        zero = {"0", "T.float32(0.0)", "T.int8(0)", "T.uint8(0)", "T.int16(0)"}
        assert all(str(s.value) in zero or str(s.value).startswith("T.Broadcast(") and
                   str(s.value)[len("T.Broadcast("):].split(",")[0] in zero for s in rest), [str(s.value) for s in rest]
        # reads only what it stored itself (its zeroed scratch), none of the kernel's inputs; the real rows read x
        own = {a.buffer.name for a in _nodes(g.else_case, "AllocBuffer")}
        assert {ld.source.name for ld in _nodes(g.else_case, "TensorLoad")} <= own
        assert {ld.source.name for ld in _nodes(g.then_case, "TensorLoad")} - own


def _nodes(stmt, kind: str) -> list:
    """Every node of TIR class `kind` under stmt."""
    import tvm_ffi

    out = []
    tvm_ffi.structural_walk(stmt, lambda n: out.append(n) if type(n).__name__ == kind else None)
    return out


def _run_outs(op, params, ins, outs, *extra):
    import tvm

    from edgellm.compiler.ops import host_cpu_info, llvm_target, make_kernel

    name, f = make_kernel(op, host_cpu_info(), **params)
    os_ = [tvm.runtime.tensor(o) for o in outs]
    args = [a if isinstance(a, tvm.runtime.Tensor) else tvm.runtime.tensor(a) for a in ins]
    tvm.compile(tvm.IRModule({name: f}), target=llvm_target())[name](*args, *os_, *(tvm.runtime.tensor(e) for e in extra))
    for o, t in zip(outs, os_):
        o[...] = t.numpy()


def _run(op, params, ins, out, *extra):
    import tvm

    from edgellm.compiler.ops import host_cpu_info, llvm_target, make_kernel

    name, f = make_kernel(op, host_cpu_info(), **params)
    o = tvm.runtime.tensor(out)
    args = [a if isinstance(a, tvm.runtime.Tensor) else tvm.runtime.tensor(a) for a in ins]
    tvm.compile(tvm.IRModule({name: f}), target=llvm_target())[name](*args, o, *(tvm.runtime.tensor(e) for e in extra))
    out[...] = o.numpy()
