"""Bad checkpoint inputs give one line (an EdgeLLMError subclass), never a traceback, crash or hang: config.json
values, safetensors headers, sharded indexes, tokenizer and generation files. Plus the inputs that must load:
tied embeddings stored only as lm_head.weight, generation_config.json's sampling defaults, `edgellm targets`
without TVM."""
from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from edgellm.errors import CompileError, ModelLoadError
from edgellm.models import load_checkpoint
from edgellm.models.checkpoint import Checkpoint, SafetensorsFile, read_config
from edgellm.models.registry import spec_from_config
from edgellm.models.synthetic import make_checkpoint, make_config, make_tokenizer
from edgellm.models.tokenizer_files import check_tokenizer_files, generation_defaults


def one_line(e: pytest.ExceptionInfo, *needles: str) -> str:
    msg = str(e.value)
    assert "\n" not in msg and msg.strip(), repr(msg)
    for n in needles:
        assert n in msg, msg
    return msg


@contextmanager
def deadline(seconds: int = 10):
    """Fail (instead of hanging the suite) if the body blocks, e.g. by opening a FIFO for reading."""
    def boom(*_):
        raise TimeoutError("blocked: a FIFO was opened for reading?")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("ck") / "m", seed=1)


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# ---------------------------------------------------------------------------------------------------------- config

def mistral_config(**kw) -> dict:
    return {**make_config("LlamaForCausalLM"), "architectures": ["MistralForCausalLM"], "model_type": "mistral", **kw}


def bitnet_config(**kw) -> dict:
    from edgellm.models.demo import DEMO_DIR

    return {**json.loads((DEMO_DIR / "demo-bitnet" / "config.json").read_text()), "vocab_size": 997, **kw}


BASES = {
    "llama": lambda: make_config("LlamaForCausalLM"),
    "mistral": mistral_config,
    "mixtral": lambda: make_config("MixtralForCausalLM"),
    "qwen2": lambda: make_config("Qwen2ForCausalLM"),
    "qwen3": lambda: make_config("Qwen3ForCausalLM"),
    "bitnet": bitnet_config,
}

POS_INTS = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "max_position_embeddings", "head_dim", "num_key_value_heads"]
INT_BAD = [None, -1, 0, "64", 64.0, 2.5, True, [64], {"n": 64}, 10**12, float("nan")]
INT_BAD_OPTIONAL = [-1, 0, "64", 64.0, True, [64], 10**12]       # keys where null means "derive it"

CASES: list[tuple[str, str, object, str]] = []   # (base, key, value, text the message must hold)
for base in BASES:
    for key in POS_INTS:
        for v in (INT_BAD_OPTIONAL if key in ("head_dim", "num_key_value_heads") else INT_BAD):
            CASES.append((base, key, v, key))
    for v in [None, 0, -1e-5, "1e-5", float("nan"), float("inf"), True, [1e-5], 10**400]:
        CASES.append((base, "rms_norm_eps", v, "rms_norm_eps"))
    for v in [None, 0, -1.0, "10000", float("nan"), float("-inf"), False, {"x": 1}]:
        CASES.append((base, "rope_theta", v, "rope_theta"))
    for v in ["true", 1, 0, [], "false"]:
        CASES.append((base, "tie_word_embeddings", v, "tie_word_embeddings"))
    for v in [-1, 997, 10**6, "0", 1.0, [0], True]:
        CASES.append((base, "bos_token_id", v, "bos_token_id"))
    for v in [-1, 997, "1", 1.5, True, {"id": 1}, [1, "2"], [1, -1], [1, 997], [None]]:
        CASES.append((base, "eos_token_id", v, "eos_token_id"))
    for key in ("rope_scaling", "rope_parameters"):
        for v in ["llama3", 5, [1], True]:
            CASES.append((base, key, v, key))
    for v in [5, ["silu"], {"a": 1}, "gelu", None]:
        CASES.append((base, "hidden_act", v, "hidden_act"))
# llama3 rope scaling, under both names
L3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 64}
for key in ("rope_scaling", "rope_parameters"):
    for field, v in [("factor", None), ("factor", "8"), ("factor", -1.0), ("factor", 0), ("factor", float("nan")),
                     ("factor", [8]), ("low_freq_factor", None), ("low_freq_factor", "1"), ("low_freq_factor", -1.0),
                     ("high_freq_factor", 0.5), ("high_freq_factor", 1.0), ("high_freq_factor", {}),
                     ("original_max_position_embeddings", 64.5), ("original_max_position_embeddings", -1),
                     ("original_max_position_embeddings", "64"), ("original_max_position_embeddings", 10**12),
                     ("rope_theta", None), ("rope_theta", "5e5"), ("rope_theta", -1), ("rope_type", 3),
                     ("rope_type", ["llama3"]), ("rope_type", "longrope")]:
        CASES.append(("llama", key, {**L3, field: v}, field if field != "rope_type" else "rope"))
    CASES.append(("llama", key, {k: v for k, v in L3.items() if k != "factor"}, "factor"))
    CASES.append(("llama", key, {"rope_type": "default", "rope_theta": None}, "rope_theta"))
# per-architecture keys
for v in [None, 0, -1, "4", 4.0, True, 10**12]:
    CASES.append(("mixtral", "num_local_experts", v, "num_local_experts"))
for v in [None, 0, -1, "2", 2.0, 5]:
    CASES.append(("mixtral", "num_experts_per_tok", v, "num_experts_per_tok"))
for v in ["offline", 5, [1], True]:
    CASES.append(("bitnet", "quantization_config", v, "quantization_config"))
for qc, needle in [({"quantization_mode": 5}, "quantization_mode"), ({"quantization_mode": "online"}, "not supported"),
                   ({"use_rms_norm": "no"}, "use_rms_norm"), ({"use_rms_norm": True}, "not supported")]:
    CASES.append(("bitnet", "quantization_config", qc, needle))
for v in [-1, 0, "4096", 4096.0, [4096], True, 10**12]:
    CASES.append(("mistral", "sliding_window", v, "sliding_window"))
for arch in ("qwen2", "qwen3"):
    for v in ["false", 1, [True]]:
        CASES.append((arch, "use_sliding_window", v, "use_sliding_window"))
for v in ["true", 1, "no"]:
    CASES.append(("llama", "attention_bias", v, "attention_bias"))
    CASES.append(("llama", "mlp_bias", v, "mlp_bias"))
CASES += [("qwen3", "attention_bias", True, "attention_bias")]   # Llama's biases are read (tests/test_pipeline.py)
for v in ["LlamaForCausalLM", {"a": 1}, [5], [["LlamaForCausalLM"]], ["NopeForCausalLM"], [None], 5]:
    CASES.append(("llama", "architectures", v, "rchitecture"))


def _case_id(c) -> str:
    base, key, v, _ = c
    return f"{base}-{key}={str(v)[:24]}"


@pytest.mark.parametrize("base, key, value, needle", CASES, ids=[_case_id(c) for c in CASES])
def test_bad_config_value(base, key, value, needle):
    cfg = BASES[base]()
    cfg[key] = value
    with pytest.raises(ModelLoadError) as e:
        spec_from_config(cfg)
    one_line(e, needle)


@pytest.mark.parametrize("base, overrides, needle", [
    ("llama", {"hidden_size": 66, "head_dim": None}, "head_dim"),            # 66 / 4 heads is not exact
    ("llama", {"head_dim": 15}, "even"),
    ("llama", {"num_key_value_heads": 3}, "divide"),
    ("mixtral", {"num_hidden_layers": 1024, "num_local_experts": 1024}, "experts"),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 16, "layer_types": "sliding_attention"}, "layer_types"),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 16, "layer_types": ["sliding_attention"]}, "layer_types"),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 16, "layer_types": [1, 2]}, "layer_types"),
    ("qwen2", {"layer_types": 5}, "layer_types"),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": "1"}, "max_window_layers"),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": -1}, "max_window_layers"),
    ("qwen3", {"use_sliding_window": True, "sliding_window": "16", "max_window_layers": 0}, "sliding_window"),
])
def test_inconsistent_config(base, overrides, needle):
    cfg = {**BASES[base](), **overrides}
    if overrides.get("head_dim", 0) is None:
        del cfg["head_dim"]
    with pytest.raises(ModelLoadError) as e:
        spec_from_config(cfg)
    one_line(e, needle)


@pytest.mark.parametrize("key", ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                 "intermediate_size", "architectures"])
def test_missing_config_key(key):
    cfg = make_config("LlamaForCausalLM")
    del cfg[key]
    with pytest.raises(ModelLoadError) as e:
        spec_from_config(cfg)
    one_line(e)


FUZZ_VALUES = [None, -1, 0, 1, 3, 2**40, 10**30, 1.5, 64.0, float("nan"), float("inf"), "x", "64", [], [1], {},
               {"rope_type": "llama3"}, True, False]


@pytest.mark.parametrize("base", sorted(BASES))
def test_config_fuzz_never_crashes(base):
    """Every key of every config, set to every kind of wrong value: a spec or a ModelLoadError, nothing else."""
    cfg0 = BASES[base]()
    keys = sorted(set(cfg0) | {"rope_scaling", "rope_parameters", "sliding_window", "layer_types", "use_sliding_window",
                               "max_window_layers", "mlp_bias", "attention_bias", "quantization_config"})
    n_err = 0
    for key in keys:
        for v in FUZZ_VALUES:
            try:
                spec = spec_from_config({**cfg0, key: v})
            except ModelLoadError as e:
                assert "\n" not in str(e), (key, v, str(e))
                n_err += 1
            else:
                assert spec.n_layers >= 1 and spec.vocab_size >= 1
    assert n_err > len(keys)


def test_valid_config_variants():
    s = spec_from_config(make_config("LlamaForCausalLM", head_dim=None, num_key_value_heads=None, rope_scaling=None))
    assert (s.head_dim, s.n_kv_heads) == (16, 4)
    cfg = make_config("LlamaForCausalLM")
    for k in ("head_dim", "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "rope_theta",
              "tie_word_embeddings", "bos_token_id", "eos_token_id"):
        del cfg[k]
    s = spec_from_config(cfg)
    assert (s.head_dim, s.max_position_embeddings, s.rms_eps, s.rope_theta, s.bos_token_id, s.eos_token_ids) == \
        (16, 2048, 1e-6, 10000.0, None, ())
    s = spec_from_config(make_config("LlamaForCausalLM", eos_token_id=[1, 2], bos_token_id=None, rope_theta=5e5,
                                     rope_parameters={"rope_type": "default", "rope_theta": 1e6}))
    assert s.eos_token_ids == (1, 2) and s.rope_theta == 1e6 and s.rope_scaling is None
    s = spec_from_config(make_config("LlamaForCausalLM", rope_parameters={**L3, "rope_theta": 5e5}))
    assert s.rope_theta == 5e5 and s.rope_scaling["factor"] == 8.0
    assert spec_from_config(mistral_config(sliding_window=None)).layer_windows == ()
    assert spec_from_config(mistral_config(sliding_window=8)).layer_windows == (8, 8)
    assert spec_from_config(make_config("Qwen2ForCausalLM", use_sliding_window=True, sliding_window=8,
                                        max_window_layers=1)).layer_windows == (0, 8)


def test_gemma3_config_forms():
    """Gemma 3's RoPE and window settings read the same from transformers 5's per-layer-type rope_parameters and
    from the older keys (rope_theta + rope_local_base_freq, sliding_window_pattern); linear scaling on the global
    layers (Gemma 3 4B+); logit soft-capping is refused, not ignored."""
    new = spec_from_config(make_config("Gemma3ForCausalLM", num_hidden_layers=6, layer_types=None,
                                       sliding_window_pattern=3))
    old_cfg = make_config("Gemma3ForCausalLM", num_hidden_layers=6, layer_types=None, sliding_window_pattern=3,
                          rope_theta=10000.0, rope_local_base_freq=100.0)
    del old_cfg["rope_parameters"]
    old = spec_from_config(old_cfg)
    assert new == old
    assert new.layer_windows == (5, 5, 0, 5, 5, 0) and new.family == "gemma"
    assert (new.rope_theta, new.rope_local_theta, new.rope_table(0), new.rope_table(2)) == (1e4, 100.0, "rope_local", "rope")
    assert new.embed_scale == 8.0 and abs(new.q_scale - (16 / 24) ** 0.5) < 1e-12
    scaled = spec_from_config(make_config("Gemma3ForCausalLM", rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}))
    assert scaled.rope_scaling == {"rope_type": "linear", "factor": 8.0} and scaled.rope_local_theta == 1e4
    with pytest.raises(ModelLoadError, match="final_logit_softcapping"):
        spec_from_config(make_config("Gemma3ForCausalLM", final_logit_softcapping=30.0))


@pytest.mark.parametrize("cls, arch", [("LlamaConfig", "LlamaForCausalLM"), ("MistralConfig", "MistralForCausalLM"),
                                       ("MixtralConfig", "MixtralForCausalLM"), ("Qwen2Config", "Qwen2ForCausalLM"),
                                       ("Qwen3Config", "Qwen3ForCausalLM"), ("BitNetConfig", "BitNetForCausalLM"),
                                       ("Gemma3TextConfig", "Gemma3ForCausalLM"), ("Olmo2Config", "Olmo2ForCausalLM"),
                                       ("SmolLM3Config", "SmolLM3ForCausalLM"), ("GraniteConfig", "GraniteForCausalLM"),
                                       ("Phi3Config", "Phi3ForCausalLM")])
def test_transformers_written_configs_are_accepted(cls, arch):
    """config.json as transformers itself writes it (its defaults and null fields included) is accepted."""
    transformers = pytest.importorskip("transformers")
    c = getattr(transformers, cls)(vocab_size=130000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    cfg = json.loads(c.to_json_string())
    cfg["architectures"] = [arch]
    s = spec_from_config(cfg)
    assert (s.n_layers, s.head_dim, s.n_kv_heads) == (2, 16, 2)


def test_bad_config_files(ckpt, tmp_path):
    bodies = {"not-json": b"{not json", "list": b"[1, 2]", "null": b"null", "not-utf8": b'{"a": "\xff\xfe"}',
              "nested": b"[" * 100000, "huge-int": b'{"vocab_size": ' + b"9" * 5000 + b"}", "empty": b"",
              "nan": b'{"architectures": ["LlamaForCausalLM"], "vocab_size": NaN}'}
    for name, body in bodies.items():
        d = copy(ckpt, tmp_path / name)
        (d / "config.json").write_bytes(body)
        with pytest.raises(ModelLoadError) as e:
            load_checkpoint(str(d))
        one_line(e, "config.json")
    d = copy(ckpt, tmp_path / "dir")
    (d / "config.json").unlink()
    (d / "config.json").mkdir()
    with pytest.raises(ModelLoadError) as e:
        load_checkpoint(str(d))
    one_line(e, "config.json")


def test_fifo_config_is_refused_without_blocking(ckpt, tmp_path):
    for f in ("config.json", "generation_config.json", "model.safetensors"):
        d = copy(ckpt, tmp_path / f)
        (d / f).unlink(missing_ok=True)
        os.mkfifo(d / f)
        with deadline(), pytest.raises(ModelLoadError) as e:
            load_checkpoint(str(d))
        one_line(e, f)


@pytest.mark.parametrize("body", [b"{oops", b"[1]", b"\xff\xfe\x00", b'{"eos_token_id": "x"}', b'{"eos_token_id": 1.5}',
                                  b'{"eos_token_id": [1, "2"]}', b'{"eos_token_id": {"a": 1}}', b'{"eos_token_id": true}',
                                  b'{"eos_token_id": 5000}', b'{"eos_token_id": -1}'])
def test_bad_generation_config_in_read_config(ckpt, tmp_path, body):
    d = copy(ckpt, tmp_path / "m")
    (d / "generation_config.json").write_bytes(body)
    with pytest.raises(ModelLoadError) as e:
        load_checkpoint(str(d))
    one_line(e, "generation_config.json", *(["eos_token_id"] if b"eos" in body else []))


def test_generation_config_eos_wins(ckpt, tmp_path):
    d = copy(ckpt, tmp_path / "m")
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 2], "bos_token_id": 0}))
    assert read_config(d)["eos_token_id"] == [1, 2]
    assert load_checkpoint(str(d))[0].eos_token_ids == (1, 2)
    (d / "generation_config.json").write_text(json.dumps({"do_sample": True}))
    assert load_checkpoint(str(d))[0].eos_token_ids == (1,)


# ----------------------------------------------------------------------------------------------------- safetensors

def read_st(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_st(path: Path, header, data: bytes, raw_header: bytes | None = None) -> None:
    h = raw_header if raw_header is not None else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


T = "model.norm.weight"    # a [64] f32 tensor every Llama needs


def _entry(**kw):
    return lambda e: {**e, **kw}


ENTRY_MUTATIONS = {
    "entry-int": lambda e: 5, "entry-str": lambda e: "x", "entry-list": lambda e: [1], "entry-null": lambda e: None,
    "dtype-int": _entry(dtype=5), "dtype-null": _entry(dtype=None), "dtype-list": _entry(dtype=["F32"]),
    "dtype-missing": lambda e: {k: v for k, v in e.items() if k != "dtype"},
    "shape-str": _entry(shape="64"), "shape-float": _entry(shape=[64.0]), "shape-neg": _entry(shape=[-64]),
    "shape-null": _entry(shape=None), "shape-bool": _entry(shape=[True]), "shape-missing":
        lambda e: {k: v for k, v in e.items() if k != "shape"},
    "shape-size": _entry(shape=[32]), "shape-huge": _entry(shape=[2**62, 2**62]),
    "dtype-size": _entry(dtype="F16"), "dtype-size-i64": _entry(dtype="I64"),
    "offs-null": _entry(data_offsets=None), "offs-short": _entry(data_offsets=[0]),
    "offs-long": lambda e: {**e, "data_offsets": e["data_offsets"] + [0]},
    "offs-str": lambda e: {**e, "data_offsets": [str(o) for o in e["data_offsets"]]},
    "offs-float": lambda e: {**e, "data_offsets": [float(o) for o in e["data_offsets"]]},
    "offs-neg": lambda e: {**e, "data_offsets": [-e["data_offsets"][1], 0]},
    "offs-neg-both": lambda e: {**e, "data_offsets": [-512, -256]},
    "offs-reversed": lambda e: {**e, "data_offsets": e["data_offsets"][::-1]},
    "offs-past-end": lambda e: {**e, "data_offsets": [2**40, 2**40 + 256]},
    "offs-huge": lambda e: {**e, "data_offsets": [0, 10**40]},
    "offs-size": lambda e: {**e, "data_offsets": [e["data_offsets"][0], e["data_offsets"][1] + 4]},
    "offs-missing": lambda e: {k: v for k, v in e.items() if k != "data_offsets"},
}


@pytest.mark.parametrize("mutation", sorted(ENTRY_MUTATIONS))
def test_bad_safetensors_entry(ckpt, tmp_path, mutation):
    d = copy(ckpt, tmp_path / "m")
    st = d / "model.safetensors"
    header, data = read_st(st)
    header[T] = ENTRY_MUTATIONS[mutation](header[T])
    write_st(st, header, data)
    with pytest.raises(ModelLoadError) as e:
        load_checkpoint(str(d))
    one_line(e, "model.safetensors", T)


@pytest.mark.parametrize("name, raw", [
    ("list", b"[]"), ("str", b'"x"'), ("int", b"5"), ("null", b"null"), ("bad-json", b'{"a": '),
    ("not-utf8", b'{"\xff": 1}'), ("empty", b""), ("nested", b"[" * 200000), ("huge-int", b"[" + b"7" * 5000 + b"]"),
    ("meta-list", b'{"__metadata__": [1]}'), ("meta-int-value", b'{"__metadata__": {"format": 1}}'),
    ("meta-str", b'{"__metadata__": "pt"}'),
])
def test_bad_safetensors_header(ckpt, tmp_path, name, raw):
    d = copy(ckpt, tmp_path / "m")
    st = d / "model.safetensors"
    _, data = read_st(st)
    write_st(st, None, data, raw_header=raw)
    with pytest.raises(ModelLoadError) as e:
        load_checkpoint(str(d))
    one_line(e, "model.safetensors")


def test_bad_safetensors_framing(ckpt, tmp_path):
    d = copy(ckpt, tmp_path / "m")
    st = d / "model.safetensors"
    raw = st.read_bytes()
    for body in (b"", b"\x01\x02", struct.pack("<Q", len(raw)) + raw[8:], struct.pack("<Q", 2**63) + raw[8:],
                 raw[:len(raw) // 2], raw[:-1]):
        st.write_bytes(body)
        with pytest.raises(ModelLoadError) as e:
            load_checkpoint(str(d))
        one_line(e, "model.safetensors")
    st.unlink()
    st.mkdir()
    with pytest.raises(ModelLoadError) as e:
        load_checkpoint(str(d))
    one_line(e, "model.safetensors")


def test_safetensors_header_byte_fuzz(ckpt, tmp_path):
    """Random byte edits of the header: the file loads or is refused in one line, never anything else."""
    src = ckpt / "model.safetensors"
    raw = src.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    rng = np.random.default_rng(0)
    st = tmp_path / "x.safetensors"
    outcomes = {"ok": 0, "err": 0}
    for _ in range(300):
        b = bytearray(raw[:8 + n])
        for _ in range(int(rng.integers(1, 4))):
            i = int(rng.integers(0, 8 + n))
            b[i] = int(rng.choice([ord(c) for c in '0123456789-.,[]{}":eE ']) if rng.random() < 0.8
                       else rng.integers(0, 256))
        st.write_bytes(bytes(b) + raw[8 + n:])
        try:
            f = SafetensorsFile(st)
            for name in f.entries:
                if f.entries[name]["dtype"] in ("F32", "F16", "BF16", "I32", "I64", "U8", "I8", "F64", "I16"):
                    f.get(name)
            outcomes["ok"] += 1
        except ModelLoadError as e:
            assert "\n" not in str(e)
            outcomes["err"] += 1
    assert outcomes["err"] > 0


def test_unknown_dtype_only_matters_on_needed_tensors(ckpt, tmp_path):
    d = copy(ckpt, tmp_path / "m")
    st = d / "model.safetensors"
    header, data = read_st(st)
    header["extra.fp4"] = {"dtype": "F4", "shape": [7], "data_offsets": [0, 4]}       # unknown, unused: fine
    write_st(st, header, data)
    load_checkpoint(str(d))
    for dt, item in (("F8_E4M3", 1), ("U32", 4), ("F4_X", None)):   # known-but-unsupported and unknown, on a needed one
        h = dict(header)
        a = h[T]["data_offsets"][0]
        h[T] = {**h[T], "dtype": dt, "data_offsets": [a, a + 64 * (item or 4)]}
        write_st(st, h, data)
        with pytest.raises(ModelLoadError) as ei:
            load_checkpoint(str(d))
        one_line(ei, "model.safetensors", T, "dtype")


# ---------------------------------------------------------------------------------------------- sharded checkpoints

def shard(src: Path, dst: Path) -> Path:
    """src's weights as two shards + model.safetensors.index.json."""
    from safetensors.numpy import load_file, save_file

    d = copy(src, dst)
    w = load_file(str(d / "model.safetensors"))
    (d / "model.safetensors").unlink()
    names = sorted(w)
    parts = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    wm = {}
    for fname, ns in parts.items():
        save_file({n: w[n] for n in ns}, str(d / fname), metadata={"format": "pt"})
        wm.update({n: fname for n in ns})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 1}, "weight_map": wm}))
    return d


def test_sharded_checkpoint_loads(ckpt, tmp_path):
    d = shard(ckpt, tmp_path / "s")
    spec, ck, _ = load_checkpoint(str(d))
    spec0, ck0, _ = load_checkpoint(str(ckpt))
    assert spec == spec0 and sorted(ck.names()) == sorted(ck0.names())
    assert np.array_equal(ck.get(T), ck0.get(T))


def _index_mutations():
    def wm(f):
        return lambda idx: {**idx, "weight_map": f(idx["weight_map"])}

    first = lambda m: next(iter(m))   # noqa: E731
    return {
        "list": lambda idx: [idx], "str": lambda idx: "x", "null": lambda idx: None,
        "no-weight-map": lambda idx: {"metadata": {}}, "weight-map-list": wm(lambda m: list(m.items())),
        "weight-map-str": wm(lambda m: "model.safetensors"), "weight-map-null": wm(lambda m: None),
        "value-int": wm(lambda m: {**m, first(m): 5}), "value-null": wm(lambda m: {**m, first(m): None}),
        "value-list": wm(lambda m: {**m, first(m): ["a"]}),
        "traversal": wm(lambda m: {**m, first(m): "../model-00001-of-00002.safetensors"}),
        "subdir": wm(lambda m: {**m, first(m): "sub/model-00001-of-00002.safetensors"}),
        "absolute": wm(lambda m: {**m, first(m): "/etc/passwd"}),
        "dotdot": wm(lambda m: {**m, first(m): ".."}), "dot": wm(lambda m: {**m, first(m): "."}),
        "empty-name": wm(lambda m: {**m, first(m): ""}), "backslash": wm(lambda m: {**m, first(m): "..\\x"}),
        "missing-shard": wm(lambda m: {**m, first(m): "model-00003-of-00002.safetensors"}),
        "wrong-shard": wm(lambda m: {n: "model-00001-of-00002.safetensors" for n in m}),
    }


INDEX_MUTATIONS = _index_mutations()


@pytest.fixture(scope="module")
def sharded(ckpt, tmp_path_factory):
    return shard(ckpt, tmp_path_factory.mktemp("sh") / "s")


@pytest.mark.parametrize("mutation", sorted(INDEX_MUTATIONS))
def test_bad_shard_index(sharded, tmp_path, mutation):
    d = copy(sharded, tmp_path / "s")
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes((d / "model-00001-of-00002.safetensors").read_bytes())
    idx = d / "model.safetensors.index.json"
    idx.write_text(json.dumps(INDEX_MUTATIONS[mutation](json.loads(idx.read_text()))))
    with pytest.raises(ModelLoadError) as e:
        load_checkpoint(str(d))
    one_line(e, "index.json" if mutation != "missing-shard" else "model-00003")


def test_bad_shard_index_files(sharded, tmp_path):
    for body in (b"{oops", b"\xff\xfe", b"[" * 100000, b""):
        d = copy(sharded, tmp_path / f"s{len(body)}")
        (d / "model.safetensors.index.json").write_bytes(body)
        with pytest.raises(ModelLoadError) as e:
            load_checkpoint(str(d))
        one_line(e, "model.safetensors.index.json")
    d = copy(sharded, tmp_path / "fifo")
    (d / "model-00002-of-00002.safetensors").unlink()
    os.mkfifo(d / "model-00002-of-00002.safetensors")
    with deadline(), pytest.raises(ModelLoadError) as e:
        load_checkpoint(str(d))
    one_line(e, "model-00002-of-00002.safetensors")


def test_unindexed_shards_skip_fifos(ckpt, tmp_path):
    d = copy(ckpt, tmp_path / "m")
    (d / "model.safetensors").rename(d / "weights-a.safetensors")
    os.mkfifo(d / "weights-b.safetensors")
    with deadline(), pytest.raises(ModelLoadError) as e:
        Checkpoint(d)
    one_line(e, "weights-b.safetensors")


# ------------------------------------------------------------------------------------ tied embeddings in lm_head only

PROMPT = [5, 17, 33, 2, 99, 250, 7, 64, 128, 3, 11, 300]


def lm_head_only(dst: Path) -> Path:
    from safetensors.numpy import load_file, save_file

    d = make_checkpoint(dst, seed=7, tie_word_embeddings=True, hidden_size=32, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=8, vocab_size=1001)
    w = load_file(str(d / "model.safetensors"))
    w["lm_head.weight"] = w.pop("model.embed_tokens.weight")
    save_file(w, str(d / "model.safetensors"), metadata={"format": "pt"})
    return d


@pytest.fixture(scope="module")
def tied_lm_head(tmp_path_factory):
    return lm_head_only(tmp_path_factory.mktemp("tied") / "m")


def test_tied_lm_head_only_loads(tied_lm_head, tmp_path):
    spec, ck, _ = load_checkpoint(str(tied_lm_head))
    assert spec.tie_word_embeddings and "model.embed_tokens.weight" in ck
    assert any("lm_head.weight" in n for n in ck.notes) and all("\n" not in n for n in ck.notes)
    assert np.array_equal(ck.get("model.embed_tokens.weight"), ck.get("lm_head.weight"))
    assert ck.dtype("model.embed_tokens.weight") == "F32"
    assert load_checkpoint(str(make_checkpoint(tmp_path / "e", tie_word_embeddings=True)))[1].notes == []
    # untied: lm_head.weight cannot stand in for the embeddings
    d = copy(tied_lm_head, tmp_path / "u")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": False}))
    with pytest.raises(ModelLoadError) as e:
        load_checkpoint(str(d))
    one_line(e, "model.embed_tokens.weight")


def test_tied_lm_head_only_matches_transformers(tied_lm_head):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from edgellm.models.numpy_backend import NumpyModel

    spec, ck, d = load_checkpoint(str(tied_lm_head))
    hf = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([PROMPT])).logits[0].numpy()
        want = hf.generate(torch.tensor([PROMPT]), max_new_tokens=32, do_sample=False, min_new_tokens=32,
                           pad_token_id=0, eos_token_id=None)[0, len(PROMPT):].tolist()
    ours = NumpyModel(spec, ck.get)
    err = np.abs(ours.logits(PROMPT) - ref).max() / np.abs(ref).max()
    assert err < 1e-4, err
    assert ours.greedy(PROMPT, 32) == want


def test_tied_lm_head_only_compiles(tied_lm_head, tmp_path):
    pytest.importorskip("tvm")
    import edgellm
    from edgellm.models.numpy_backend import NumpyModel

    spec, ck, _ = load_checkpoint(str(tied_lm_head))
    pkg = edgellm.compile(str(tied_lm_head), quant="f32", out=tmp_path / "pkg", max_context=64, prefill_chunk=8,
                          progress=False)
    with edgellm.Runtime.load(pkg) as rt:
        got = rt.logits(PROMPT)
    ref = NumpyModel(spec, ck.get).logits(PROMPT)
    rel = np.abs(np.asarray(got) - ref).max() / np.abs(ref).max()
    assert rel < 1e-4, rel


# ------------------------------------------------------------------------------------------------ tokenizer files

@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    make_tokenizer(d, vocab_size=300, chat_template="{{ messages[0]['content'] }}")
    return d


def test_good_tokenizer_files(tok_dir, tmp_path):
    from edgellm.models.demo import DEMO_DIR

    check_tokenizer_files(tok_dir)
    check_tokenizer_files(tmp_path)                      # nothing there: fine
    for demo in ("demo-llama", "demo-moe", "demo-bitnet"):
        check_tokenizer_files(DEMO_DIR / demo)
    d = copy(tok_dir, tmp_path / "t")
    tc = json.loads((d / "tokenizer_config.json").read_text())
    tc.update(bos_token={"content": "<s>", "lstrip": False, "__type": "AddedToken"}, eos_token=None,
              chat_template=[{"name": "default", "template": "{{ x }}"}, {"name": "tool_use", "template": "y"}])
    (d / "tokenizer_config.json").write_text(json.dumps(tc))
    (d / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": {"content": "</s>"}}))
    (d / "chat_template.jinja").write_text("{{ messages }}")
    (d / "chat_template.json").write_text(json.dumps({"chat_template": "{{ m }}"}))
    check_tokenizer_files(d)


TOKENIZER_JSON_BAD = {
    "garbage": bytes(range(256)) * 4, "empty": b"", "list": b"[]", "null": b"null",
    "object": b"{}", "truncated": None, "wrong-schema": b'{"model": 5}', "not-utf8": b'{"version": "\xff"}',
    "nested": b"[" * 100000,
}


@pytest.mark.parametrize("name", sorted(TOKENIZER_JSON_BAD))
def test_corrupt_tokenizer_json(tok_dir, tmp_path, name):
    d = copy(tok_dir, tmp_path / "t")
    body = TOKENIZER_JSON_BAD[name]
    if body is None:
        good = (d / "tokenizer.json").read_bytes()
        body = good[: len(good) // 2]
    (d / "tokenizer.json").write_bytes(body)
    with pytest.raises(CompileError) as e:
        check_tokenizer_files(d)
    one_line(e, "tokenizer.json is corrupt", "re-download")


@pytest.mark.parametrize("fname", ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                   "chat_template.jinja", "generation_config.json"])
def test_tokenizer_files_not_regular(tok_dir, tmp_path, fname):
    for kind in ("fifo", "dir", "dangling"):
        d = copy(tok_dir, tmp_path / kind)
        (d / fname).unlink(missing_ok=True)
        if kind == "fifo":
            os.mkfifo(d / fname)
        elif kind == "dir":
            (d / fname).mkdir()
        else:
            (d / fname).symlink_to(d / "nowhere")
        fn = generation_defaults if fname == "generation_config.json" else check_tokenizer_files
        with deadline(), pytest.raises(CompileError) as e:
            fn(d)
        one_line(e, fname)


@pytest.mark.parametrize("fname, body, needle", [
    ("tokenizer_config.json", b"{oops", "not valid JSON"), ("tokenizer_config.json", b"[1]", "not a JSON object"),
    ("tokenizer_config.json", b"\xff\xfe{}", "UTF-8"), ("tokenizer_config.json", b"", "not valid JSON"),
    ("tokenizer_config.json", b"[" * 100000, "not valid JSON"),
    ("tokenizer_config.json", b'{"chat_template": 5}', "chat_template"),
    ("tokenizer_config.json", b'{"chat_template": {"default": "x"}}', "chat_template"),
    ("tokenizer_config.json", b'{"chat_template": [{"name": 1, "template": "x"}]}', "chat_template"),
    ("tokenizer_config.json", b'{"chat_template": [{"name": "a"}]}', "chat_template"),
    ("tokenizer_config.json", b'{"chat_template": ["x"]}', "chat_template"),
    ("tokenizer_config.json", b'{"bos_token": 5}', "bos_token"),
    ("tokenizer_config.json", b'{"bos_token": ["<s>"]}', "bos_token"),
    ("tokenizer_config.json", b'{"eos_token": {"content": 5}}', "eos_token"),
    ("tokenizer_config.json", b'{"eos_token": {"text": "x"}}', "eos_token"),
    ("tokenizer_config.json", b'{"eos_token": true}', "eos_token"),
    ("special_tokens_map.json", b"null", "not a JSON object"), ("special_tokens_map.json", b"{", "not valid JSON"),
    ("special_tokens_map.json", b'{"eos_token": 2}', "eos_token"),
    ("special_tokens_map.json", b'{"bos_token": {"content": null}}', "bos_token"),
    ("chat_template.json", b'{"chat_template": 5}', "chat_template"), ("chat_template.json", b"[]", "JSON object"),
    ("chat_template.jinja", b"\xff\xfe\xfd", "UTF-8"),
])
def test_bad_tokenizer_side_files(tok_dir, tmp_path, fname, body, needle):
    d = copy(tok_dir, tmp_path / "t")
    (d / fname).write_bytes(body)
    with pytest.raises(CompileError) as e:
        check_tokenizer_files(d)
    one_line(e, fname, needle)


# ------------------------------------------------------------------------------------------- generation defaults

def gen(tmp_path: Path, cfg) -> dict:
    (tmp_path / "generation_config.json").write_text(json.dumps(cfg))
    return generation_defaults(tmp_path)


@pytest.mark.parametrize("cfg, want", [
    ({"do_sample": True, "temperature": 0.8, "top_k": 40, "top_p": 0.95, "repetition_penalty": 1.1},
     {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "repetition_penalty": 1.1}),
    ({"do_sample": True}, {"temperature": 1.0, "top_k": 50, "top_p": 1.0}),                 # transformers' defaults
    ({"do_sample": True, "temperature": 0.6, "top_p": 0.9, "eos_token_id": [1, 2]},           # Llama 3.x instruct
     {"temperature": 0.6, "top_k": 50, "top_p": 0.9}),
    ({"do_sample": True, "min_p": 0.05, "top_k": 0}, {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.05}),
    ({"do_sample": True, "temperature": None, "top_k": None}, {"temperature": 1.0, "top_k": 50, "top_p": 1.0}),
    ({"do_sample": True, "temperature": 1, "top_p": 1}, {"temperature": 1.0, "top_k": 50, "top_p": 1.0}),
    ({"do_sample": False, "temperature": 0.8, "top_k": 40}, {"temperature": 0.0}),
    ({"temperature": 0.8, "top_p": 0.5}, {"temperature": 0.0}),                               # no do_sample: greedy
    ({"do_sample": False, "repetition_penalty": 1.3}, {"temperature": 0.0, "repetition_penalty": 1.3}),
    ({"bos_token_id": 1, "eos_token_id": 2, "transformers_version": "4.40.0"}, {"temperature": 0.0}),
    ({"do_sample": None, "repetition_penalty": None}, {"temperature": 0.0}),
])
def test_generation_defaults_semantics(tmp_path, cfg, want):
    got = gen(tmp_path, cfg)
    assert got == want and all(type(got[k]) is type(want[k]) for k in want), got


def test_generation_defaults_without_file(tmp_path):
    assert generation_defaults(tmp_path) == {}


def test_generation_defaults_of_demo_models():
    from edgellm.models.demo import DEMO_DIR

    assert generation_defaults(DEMO_DIR / "demo-llama") == {"temperature": 0.8, "top_k": 40, "top_p": 0.95,
                                                            "repetition_penalty": 1.1}


GEN_BAD = [("do_sample", v) for v in ["true", 1, 0, [True]]]
GEN_BAD += [("temperature", v) for v in [-0.1, "0.7", float("nan"), float("inf"), True, [0.7], 10**400]]
GEN_BAD += [("top_k", v) for v in [-1, 40.0, "40", True, [40]]]
GEN_BAD += [("top_p", v) for v in [0, 0.0, -0.5, 1.01, "0.9", float("nan"), True, {"p": 1}]]
GEN_BAD += [("min_p", v) for v in [-0.01, 1.5, "0.1", float("nan"), False]]
GEN_BAD += [("repetition_penalty", v) for v in [0, -1.0, "1.1", float("inf"), float("nan"), True]]


@pytest.mark.parametrize("do_sample", [True, False])
@pytest.mark.parametrize("key, value", GEN_BAD, ids=[f"{k}={v!r}"[:30] for k, v in GEN_BAD])
def test_bad_generation_config_value(tmp_path, key, value, do_sample):
    cfg = {"do_sample": do_sample, key: value}
    (tmp_path / "generation_config.json").write_text(json.dumps(cfg))   # json writes NaN/Infinity as Python reads them
    with pytest.raises(CompileError) as e:
        generation_defaults(tmp_path)
    one_line(e, key, "generation_config.json")


@pytest.mark.parametrize("body", [b"{oops", b"[1]", b"null", b"\xff\xfe", b"", b"[" * 100000,
                                  b'{"top_k": ' + b"9" * 5000 + b"}"])
def test_corrupt_generation_config(tmp_path, body):
    (tmp_path / "generation_config.json").write_bytes(body)
    with pytest.raises(CompileError) as e:
        generation_defaults(tmp_path)
    one_line(e, "generation_config.json")


# --------------------------------------------------------------------------------------------------- targets, CLI

def test_targets_without_tvm():
    code = ("import sys; sys.modules['tvm'] = None; from edgellm.cli import main; sys.exit(main(['targets']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    names = [ln.split()[0] for ln in r.stdout.splitlines() if ln.strip()]
    assert {"x86-avx2", "x86-avx512", "rpi4", "rpi5", "android-cpu"} <= set(names), r.stdout
    if os.uname().machine == "x86_64":
        assert names[0] == "host" and "this machine's CPU" in r.stdout


def test_host_target_resolves_mcpu_lazily():
    from edgellm.targets import get_target

    if os.uname().machine != "x86_64":
        pytest.skip("host target is x86-64 only")
    t = get_target("host")
    assert "mcpu" not in t.tvm and t.tvm["num-cores"] >= 1
    pytest.importorskip("tvm")
    d = t.tvm_dict()
    assert isinstance(d["mcpu"], str) and d["mcpu"] and d["num-cores"] == t.tvm["num-cores"]
    assert str(t.tvm_target().attrs["mcpu"]) == d["mcpu"]
    assert get_target("rpi5").tvm_dict() == get_target("rpi5").tvm


def test_cli_compile_bad_config_is_one_line(ckpt, tmp_path):
    d = copy(ckpt, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": -1}))
    r = subprocess.run([sys.executable, "-m", "edgellm.cli", "compile", str(d), "-o", str(tmp_path / "o"), "--quiet"],
                       capture_output=True, text=True, timeout=300)
    err = r.stderr.strip()
    assert r.returncode != 0 and len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert "num_hidden_layers" in err and "-1" in err
    assert not (tmp_path / "o").exists()

