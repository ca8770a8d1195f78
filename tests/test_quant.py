"""Quantization schemes (edgellm.quant): error bounds, exact packing round trips, layouts, shape checks, bits per
weight, and the numpy references (no TVM needed)."""
from __future__ import annotations

import numpy as np
import pytest

from edgellm.errors import CompileError
from edgellm.quant import SCHEMES, get_scheme, packing
from edgellm.quant.q6 import dequantize_q6, pack_q6, unpack_q6
from edgellm.quant.t2 import pack_t2


def rng(seed=0):
    return np.random.default_rng(seed)


def rel_rms(a, b):
    return float(np.sqrt(np.mean((a.astype(np.float64) - b) ** 2) / np.mean(b.astype(np.float64) ** 2)))


# Relative RMS error of quantize -> dequantize on Gaussian weights, and why:
#  f16: round-to-nearest with a 11-bit significand: |err| <= 2^-11 |w|, RMS ~ 2^-11 / sqrt(3) ~ 2.8e-4 (< 3e-4).
#  q8: per-row absmax: step d = max|w_row| / 127, error ~ uniform(-d/2, d/2): RMS = d / sqrt(12). For K = 1024
#      Gaussian entries E[max|w|] ~ 3.44 sigma, so RMS ~ 3.44 / 127 / 3.46 = 0.78% (< 1%). (0.5% would need sub-row
#      scales: at K = 64, E[max] ~ 2.6 sigma gives 0.59%; per-row absmax int8 cannot reach 0.5% on Gaussian rows.)
#  q4gG: step d = |m| / 8 with m the largest-magnitude value of the group (Q4_0 rule): RMS ~ E[max|w|] / 8 / sqrt(12)
#      = 2.35 / 27.7 = 8.5% (G=32), 2.59 -> 9.4% (G=64), 2.83 -> 10.2% (G=128); plus rare clipping at +8 d.
#  q6: step d = |m| / 32 (the same rule at 6 bits, G = 32): RMS ~ 2.35 / 32 / sqrt(12) = 2.1%.
#  t2: absmean ternary, s = E|w| = sqrt(2/pi) sigma: E[(w - s clip(round(w/s), -1, 1))^2] = 0.263 sigma^2 by
#      numerical integration -> 51.3% (it is a 1.58-bit format meant for QAT-trained weights, not for PTQ).
#  q8g32: the q8 rule per group of 32 (Q8_0): RMS ~ E[max|w| of 32] / 127 / sqrt(12) = 2.35 / 440 = 0.53%.
ERROR_BOUNDS = {"f32": 0.0, "f16": 3e-4, "q8": 0.010, "q8g32": 0.0065, "q4g32": 0.10, "q4g64": 0.11, "q4g128": 0.12,
                "q4m32": 0.09, "q6": 0.025, "t2": 0.55}


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_quantize_dequantize_error(name):
    s = get_scheme(name)
    w = rng(1).standard_normal((96, 1024)).astype(np.float32)
    parts = s.quantize(w)
    assert set(parts) == set(s.part_order)
    wd = s.dequantize(parts)
    assert wd.shape == w.shape and wd.dtype == np.float32
    err = rel_rms(wd, w)
    assert err <= ERROR_BOUNDS[name], f"{name}: rel RMS {err:.4f} > {ERROR_BOUNDS[name]}"
    if name.startswith(("q4", "q6")):  # the bound is tight-ish: within ~15% of the derived value
        assert err >= 0.8 * {"q4g32": 0.085, "q4g64": 0.094, "q4g128": 0.102, "q4m32": 0.078, "q6": 0.021}[name]


def test_bits_per_weight():
    bpw = {n: s.bits_per_weight for n, s in SCHEMES.items()}
    assert bpw["f32"] == 32 and bpw["f16"] == 16
    assert bpw["q8"] == pytest.approx(8 + 32 / 4096)
    assert (bpw["q4g32"], bpw["q4g64"], bpw["q4g128"], bpw["q4m32"], bpw["q6"]) == (4.5, 4.25, 4.125, 5.0, 6.5)
    assert bpw["t2"] == pytest.approx(2.0, abs=1e-5)
    # the counted bits match the stored bytes (scales included): at N = K = 4096 exactly, elsewhere up to the
    # per-row / per-tensor scale share
    N, K = 64, 4096
    w = rng(2).standard_normal((N, K)).astype(np.float32)
    for name, s in SCHEMES.items():
        stored = sum(a.nbytes for a in s.quantize(w).values()) * 8 / (N * K)
        expect = {"t2": 2 + 32 / (N * K)}.get(name, s.bits_per_weight)
        assert stored == pytest.approx(expect), name


@pytest.mark.parametrize("scheme,hi", [("q8", 256), ("q4", 16), ("t2", 3)])
@pytest.mark.parametrize("N,K", [(16, 64), (37, 128), (5, 32), (1, 16), (48, 2048)])
def test_pack_roundtrip_exact(scheme, hi, N, K):
    if K % packing.LAYOUTS[scheme][1]:
        pytest.skip("K not a multiple of the chunk")
    codes = rng(N + K).integers(0, hi, (N, K)).astype(np.uint8)
    packed = packing.pack_codes(codes, scheme)
    assert packed.dtype == np.uint8 and packed.shape == (N, K * packing.LAYOUTS[scheme][0] // 8)
    np.testing.assert_array_equal(packing.unpack_codes(packed, scheme), codes)


def test_group_scales_roundtrip():
    s = rng(3).standard_normal((37, 12)).astype(np.float16)
    np.testing.assert_array_equal(packing.unpack_group_scales(packing.pack_group_scales(s)), s)


def test_layout_positions():
    """Spot checks of the documented byte positions (quant/packing.py docstring)."""
    r = rng(4)
    N, K = 37, 64                      # 2 full panels + a tail panel of R = 5 rows
    c8 = r.integers(0, 256, (N, K)).astype(np.uint8)
    p8 = packing.pack_codes(c8, "q8").reshape(-1)
    assert p8[0 * 64 + 4 * 3 + 2] == c8[3, 2]                  # panel 0, chunk 0, row 3, byte 2: k = 2
    assert p8[16 * K + 5 * 64 + 4 * 7 + 1] == c8[16 + 7, 4 * 5 + 1]   # panel 1, chunk 5
    c4 = r.integers(0, 16, (N, K)).astype(np.uint8)
    p4 = packing.pack_codes(c4, "q4").reshape(-1)
    assert p4[1 * 64 + 4 * 3 + 2] == c4[3, 8 + 2] | (c4[3, 8 + 4 + 2] << 4)
    tail = 32 * K // 2                                            # tail panel: chunks of 4 * R = 20 bytes
    assert p4[tail + 2 * 20 + 4 * 1 + 3] == c4[33, 16 + 3] | (c4[33, 16 + 4 + 3] << 4)
    c2 = r.integers(0, 3, (N, K)).astype(np.uint8)
    p2 = packing.pack_codes(c2, "t2").reshape(-1)
    byte = p2[1 * 64 + 4 * 9 + 1]                                 # panel 0, chunk 1 (k 16..31), row 9, b = 1
    assert [(byte >> (2 * j)) & 3 for j in range(4)] == [c2[9, 16 + 4 * j + 1] for j in range(4)]
    s = r.standard_normal((N, 2)).astype(np.float16)
    ps = packing.pack_group_scales(s).reshape(-1)
    assert ps[16 * 2 + 1 * 16 + 4] == s[16 + 4, 1] and ps[32 * 2 + 1 * 5 + 3] == s[32 + 3, 1]


@pytest.mark.parametrize("N,K", [(16, 32), (37, 128), (5, 64), (48, 2048)])
def test_q6_pack_roundtrip_and_layout(N, K):
    """q6 codes and scales survive packing exactly; bytes sit where the quant/packing.py docstring says: per
    32-k block 4 chunks of low nibbles (as q4) then 2 chunks of high bit pairs (as t2)."""
    r = rng(N + K)
    q = r.integers(-32, 32, (N, K)).astype(np.int8)
    d = r.standard_normal((N, K // 32)).astype(np.float16)
    parts = pack_q6(q, d)
    assert parts["qweight"].shape == (N, K * 6 // 8) and parts["scales"].shape == (N, K // 32)
    np.testing.assert_array_equal(unpack_q6(parts["qweight"]), q)
    np.testing.assert_array_equal(packing.unpack_group_scales(parts["scales"]), d)
    expect = q.astype(np.float32).reshape(N, K // 32, 32) * d.astype(np.float32)[..., None]
    np.testing.assert_array_equal(dequantize_q6(parts), expect.reshape(N, K))
    if N >= 16 and K >= 64:
        code, p = q.astype(np.int16) + 32, parts["qweight"].reshape(-1)
        BPR = K * 6 // 8
        # panel 0, block 1 (k 32..63), chunk 2 (k 48..55), row 3, byte b = 1: low nibbles of k 49 and 53
        assert p[(6 + 2) * 64 + 4 * 3 + 1] == (code[3, 49] & 15) | ((code[3, 53] & 15) << 4)
        # same block, chunk 5 (high bits of k 48..63), row 9, b = 2: bit pair j holds k = 48 + 4j + 2
        byte = p[(6 + 5) * 64 + 4 * 9 + 2]
        assert [(byte >> (2 * j)) & 3 for j in range(4)] == [code[9, 48 + 4 * j + 2] >> 4 for j in range(4)]
        assert p[BPR * 16 + 4 * 2] == (code[18, 0] & 15) | ((code[18, 4] & 15) << 4)   # panel 1, row 2
    with pytest.raises(ValueError):
        pack_q6(np.full((2, 32), 32, np.int8), np.ones((2, 1), np.float16))


def test_q4_rule_and_t2_values():
    w = rng(5).standard_normal((3, 64)).astype(np.float32)
    q4 = get_scheme("q4g32")
    codes = packing.unpack_codes(q4.quantize(w)["qweight"], "q4").astype(int) - 8
    assert codes.min() >= -8 and codes.max() <= 7
    # the largest-magnitude element of every group maps to -8 exactly
    g = np.abs(w.reshape(3, 2, 32)).argmax(axis=2)
    assert (np.take_along_axis(codes.reshape(3, 2, 32), g[..., None], axis=2) == -8).all()
    t2 = get_scheme("t2")
    parts = t2.quantize(w)
    assert parts["scale"].shape == (1,) and parts["scale"][0] == pytest.approx(np.abs(w).mean(), rel=1e-6)
    assert set(np.unique(t2.dequantize(parts) / parts["scale"][0])) <= {-1.0, 0.0, 1.0}
    zero = get_scheme("q8").quantize(np.zeros((2, 32), np.float32))
    assert not np.any(get_scheme("q8").dequantize(zero))
    assert not np.any(get_scheme("q4g32").dequantize(get_scheme("q4g32").quantize(np.zeros((2, 32), np.float32))))
    assert not np.any(get_scheme("q6").dequantize(get_scheme("q6").quantize(np.zeros((2, 32), np.float32))))
    # q6: the largest-magnitude element of every group of 32 maps to -32 exactly
    q6 = unpack_q6(get_scheme("q6").quantize(w)["qweight"]).astype(int)
    assert q6.min() >= -32 and q6.max() <= 31
    assert (np.take_along_axis(q6.reshape(3, 2, 32), g[..., None], axis=2) == -32).all()


def test_check_shape_errors():
    with pytest.raises(CompileError, match=r"'model.layers.0.mlp.up_proj.weight'.*K=40.*group size 32"):
        get_scheme("q4g32").check_shape("model.layers.0.mlp.up_proj.weight", (64, 40))
    with pytest.raises(CompileError, match=r"K=96.*group size 128"):
        get_scheme("q4g128").check_shape("w", (8, 96))
    with pytest.raises(CompileError, match=r"'x'.*K=48.*32"):
        get_scheme("q8").check_shape("x", (8, 48))
    with pytest.raises(CompileError, match=r"K=40.*16"):
        get_scheme("t2").check_shape("x", (8, 40))
    with pytest.raises(CompileError, match=r"K=48.*group size 32"):
        get_scheme("q6").check_shape("x", (8, 48))
    with pytest.raises(CompileError, match="2-D"):
        get_scheme("q8").check_shape("norm", (64,))
    for name in ("f32", "f16"):
        get_scheme(name).check_shape("w", (3, 5))  # any 2-D shape
    get_scheme("q4g64").check_shape("w", (37, 128))
    with pytest.raises(CompileError, match="K=40"):
        get_scheme("q4g32").quantize(np.zeros((4, 40), np.float32))


def test_unknown_scheme():
    with pytest.raises(CompileError, match=r"unknown quantization scheme 'q3': choose one of f32, f16, q8, q8g32, q4g32"):
        get_scheme("q3")


def test_linear_kernel_specs():
    assert get_scheme("f16").linear_kernel(1, 8, 32, False) == ("linear", {"T": 1, "N": 8, "K": 32, "bias": False,
                                                                           "wdtype": "float16"})
    assert get_scheme("q4g64").linear_kernel(16, 8, 128, True) == ("linear_q4", {"T": 16, "N": 8, "K": 128,
                                                                                 "bias": True, "G": 64})
    assert get_scheme("q8").linear_kernel(1, 8, 32, False)[0] == "linear_q8"
    assert get_scheme("q6").linear_kernel(1, 8, 32, False) == ("linear_q6", {"T": 1, "N": 8, "K": 32, "bias": False})
    assert get_scheme("t2").linear_kernel(1, 8, 32, False)[0] in ("linear_t2", "linear_t2_lut")
    assert get_scheme("q8").part_order == ("qweight", "scales") and get_scheme("t2").part_order == ("qweight", "scale")


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_reference_linear_close_to_dequantized_product(name):
    """reference_linear = dequantized weights times (int8-quantized) activations: close to x @ dequantize(W).T."""
    r = rng(6)
    s = get_scheme(name)
    w = r.standard_normal((40, 256)).astype(np.float32)
    x = r.standard_normal((3, 256)).astype(np.float32)
    parts = s.quantize(w)
    y = s.reference_linear(x, parts)
    y0 = x.astype(np.float64) @ s.dequantize(parts).astype(np.float64).T
    # int8 activations: per 32-block (q8/q4) ~0.3-0.5%, per token (t2) ~1% of the output RMS
    tol = {"f32": 1e-12, "f16": 1e-12, "t2": 0.02}.get(name, 0.01)
    assert rel_rms(y, y0) <= tol, (name, rel_rms(y, y0))
    b = r.standard_normal(40).astype(np.float32)
    np.testing.assert_allclose(s.reference_linear(x, parts, bias=b), y + b, rtol=1e-12, atol=1e-12)


def test_activation_quantization_rounding():
    """Half-way cases round to even (np.rint, the kernels' nearbyint); amax maps to 127; zero blocks stay 0."""
    x = np.zeros((2, 32), np.float32)
    x[0, :6] = [127, 0.5, 1.5, 2.5, -0.5, -2.5]
    xq, dx = packing.quantize_act_blocks(x)
    assert list(xq[0, :6]) == [127, 0, 2, 2, 0, -2] and dx[0, 0] == np.float32(1)
    assert not xq[1].any()
    xt, dt = packing.quantize_act_token(x)
    assert list(xt[0, :6]) == [127, 0, 2, 2, 0, -2] and not xt[1].any()


def test_t2_matches_bitnet_bitlinear():
    """Packed BitNet b1.58 checkpoints convert losslessly: pack_t2(t, 1 / weight_scale) reproduces transformers'
    offline BitLinear (models/bitnet.py) up to float rounding."""
    from edgellm.models.bitnet import bitlinear_ref

    r = rng(7)
    N, K = 64, 96
    t = r.integers(-1, 2, (N, K)).astype(np.int8)
    weight_scale = np.float32(1.0 / 0.0213)
    codes = (t + 1).astype(np.uint8)  # transformers layout: byte row i holds rows i + j * N/4 in bits 2j
    hf = np.zeros((N // 4, K), np.uint8)
    for j in range(4):
        hf |= codes[j * (N // 4):(j + 1) * (N // 4)] << (2 * j)
    x = (r.standard_normal((5, K)) * 3).astype(np.float32)
    ref = bitlinear_ref(x, hf, weight_scale)
    parts = pack_t2(t, 1.0 / float(weight_scale))
    y = get_scheme("t2").reference_linear(x, parts)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_registry_is_the_single_place():
    """A scheme registered in quant/scheme.py's registry is seen everywhere without any other change: get_scheme,
    body_schemes / head_schemes and the compiler's scheme choice (defaults, head check, shape checks)."""
    from edgellm.compiler.driver import choose_schemes
    from edgellm.models import load_checkpoint
    from edgellm.quant import body_schemes, head_schemes, register
    from edgellm.quant.float import FloatScheme

    spec = load_checkpoint("demo")[0]
    copy = FloatScheme("f32copy", "float32", 32, "float32 weights (a throwaway copy of f32)")
    register(copy)
    try:
        assert get_scheme("f32copy") is copy and list(SCHEMES)[-1] == "f32copy"
        assert "f32copy" in body_schemes() and "f32copy" in head_schemes()
        assert choose_schemes(spec, "f32copy", None, progress=False) == (copy, copy)   # a float body keeps its head
        assert choose_schemes(spec, "q8", "f32copy", progress=False) == (get_scheme("q8"), copy)
        assert copy.linear_kernel(1, 8, 32, False) == get_scheme("f32").linear_kernel(1, 8, 32, False)
        with pytest.raises(CompileError, match=r"choose one of f32, .*, t2, f32copy"):
            get_scheme("q3")
        with pytest.raises(ValueError, match="already registered"):
            register(FloatScheme("f32copy", "float32", 32, "again"))
    finally:
        SCHEMES.pop("f32copy", None)
    assert "f32copy" not in body_schemes() and "f32copy" not in head_schemes()
    with pytest.raises(CompileError, match="unknown quantization scheme 'f32copy'"):
        choose_schemes(spec, "f32copy", None, progress=False)


def test_scheme_rules():
    """The rules each scheme carries (what the compiler used to test by name)."""
    from edgellm.quant import body_schemes, head_schemes

    assert body_schemes() == ["f32", "f16", "q8", "q8g32", "q4g32", "q4g64", "q4g128", "q4m32", "q6", "t2"]
    assert head_schemes() == ["f32", "f16", "q8", "q8g32", "q4g32", "q4g64", "q4g128", "q6"]
    assert {n: s.default_head or n for n, s in SCHEMES.items()} == {
        "f32": "f32", "f16": "f16", **{n: "q8g32" for n in ("q8", "q8g32", "q4g32", "q4g64", "q4g128", "q4m32", "q6", "t2")}}
    assert [n for n, s in SCHEMES.items() if s.gptq] == ["q4g32", "q4g64", "q4g128"]
    assert {n: s.embedding for n, s in SCHEMES.items() if s.head} == {
        "f32": "float32", "f16": "float16", "q8": "q8", "q8g32": "q8g32", "q4g32": "q4g32", "q4g64": "q4g64",
        "q4g128": "q4g128", "q6": "q6"}
    assert get_scheme("q8g32").embed_kernel(2, 100, 128) == ("embed_q8g32", {"T": 2, "V": 100, "D": 128, "G": 32})
    assert get_scheme("q4g64").embed_kernel(2, 100, 128) == ("embed_q4", {"T": 2, "V": 100, "D": 128, "G": 64})
    assert get_scheme("f16").embed_kernel(1, 10, 8) == ("embed", {"T": 1, "V": 10, "D": 8, "wdtype": "float16"})
    with pytest.raises(CompileError, match="t2 cannot store an embedding"):
        get_scheme("t2").embed_kernel(1, 10, 32)

    class Spec:
        family = "llama"
    assert "post-training ternarization" in get_scheme("t2").compile_warning(Spec())
    Spec.family = "bitnet"
    assert get_scheme("t2").compile_warning(Spec()) is None and get_scheme("q8").compile_warning(Spec()) is None
