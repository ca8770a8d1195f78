"""Bad input gives one clear line (EdgeLLMError; CLI: one stderr line, exit != 0), no crash, nothing half-written."""
import json
import shutil
import subprocess
import sys

import pytest

import edgellm
from edgellm.errors import CompileError, InputError, ModelLoadError, PackageError
from edgellm.models.synthetic import make_checkpoint
from edgellm.runtime import contract as K


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("ck") / "m", seed=1)


@pytest.fixture(scope="module")
def pkg(ckpt, tmp_path_factory):
    return edgellm.compile(str(ckpt), quant="f32", out=tmp_path_factory.mktemp("p") / "pkg", max_context=32,
                           prefill_chunk=8, progress=False)


def copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def cli(*args):
    r = subprocess.run([sys.executable, "-m", "edgellm.cli", *map(str, args)], capture_output=True, text=True)
    return r.returncode, r.stderr.strip()


def one_line_error(rc, err, *needles):
    assert rc != 0
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: "), err
    for n in needles:
        assert n in err, err


def test_missing_config(ckpt, tmp_path):
    d = copy(ckpt, tmp_path / "m")
    (d / "config.json").unlink()
    with pytest.raises(ModelLoadError, match="config.json is missing"):
        edgellm.compile(str(d), out=tmp_path / "o", progress=False)
    one_line_error(*cli("compile", d, "-o", tmp_path / "o2", "--quiet"), "config.json is missing")
    assert not (tmp_path / "o").exists() and not (tmp_path / "o2").exists()


def test_corrupt_config(ckpt, tmp_path):
    d = copy(ckpt, tmp_path / "m")
    (d / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        edgellm.compile(str(d), out=tmp_path / "o", progress=False)


def test_unknown_architecture(ckpt, tmp_path):
    d = copy(ckpt, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["GPTNeoXForCausalLM"]
    (d / "config.json").write_text(json.dumps(cfg))
    one_line_error(*cli("compile", d, "-o", tmp_path / "o", "--quiet"), "unknown architecture 'GPTNeoXForCausalLM'",
                   "LlamaForCausalLM")


def test_truncated_checkpoint_weights(ckpt, tmp_path):
    d = copy(ckpt, tmp_path / "m")
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    with pytest.raises(ModelLoadError, match="truncated"):
        edgellm.compile(str(d), out=tmp_path / "o", progress=False)


def test_missing_weight_and_wrong_shape(ckpt, tmp_path):
    d = copy(ckpt, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] += 1
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="has shape"):
        edgellm.compile(str(d), out=tmp_path / "o", progress=False)


def test_hub_id_offline_without_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ModelLoadError, match="not in the Hugging Face cache and HF_HUB_OFFLINE is set"):
        edgellm.compile("nobody/no-such-model", out=tmp_path / "o", progress=False)


def test_moe_on_the_npu_is_a_clear_error(tmp_path):
    d = make_checkpoint(tmp_path / "moe", "MixtralForCausalLM", seed=2)
    with pytest.raises(CompileError, match="mixture-of-experts model: --target android-npu does not run MoE"):
        edgellm.compile(str(d), target="android-npu", out=tmp_path / "o", progress=False)
    assert not (tmp_path / "o").exists()


def test_truncated_package_weights(pkg, tmp_path):
    p = copy(pkg, tmp_path / "p")
    w = p / "weights.bin"
    w.write_bytes(w.read_bytes()[:-4096])
    with pytest.raises(PackageError, match="weights.bin is truncated"):
        edgellm.Runtime.load(p)
    one_line_error(*cli("run", p, "-p", "hi"), "truncated")


def test_corrupt_package_weights_caught_by_verify(pkg, tmp_path):
    p = copy(pkg, tmp_path / "p")
    w = p / "weights.bin"
    b = bytearray(w.read_bytes())
    b[100] ^= 0xFF
    w.write_bytes(bytes(b))
    with pytest.raises(PackageError, match="does not match its digest"):
        edgellm.Runtime.load(p, verify=True)


def test_wrong_manifest_version(pkg, tmp_path):
    p = copy(pkg, tmp_path / "p")
    m = json.loads((p / "manifest.json").read_text())
    m["format_version"] = 99
    (p / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(PackageError, match="format version 99"):
        edgellm.Runtime.load(p)


def test_wrong_plan_version(pkg, tmp_path):
    p = copy(pkg, tmp_path / "p")
    b = bytearray((p / "plan.bin").read_bytes())
    b[8] = K.PLAN_VERSION + 1  # version field: newer than this runtime reads
    (p / "plan.bin").write_bytes(bytes(b))
    with pytest.raises(PackageError, match="version"):
        edgellm.Runtime.load(p)


def test_kernels_for_another_machine(pkg, tmp_path):
    p = copy(pkg, tmp_path / "p")
    k = bytearray((p / "kernels.so").read_bytes())
    k[18:20] = (183).to_bytes(2, "little")  # ELF e_machine = EM_AARCH64
    (p / "kernels.so").write_bytes(bytes(k))
    with pytest.raises(PackageError, match="aarch64"):
        edgellm.Runtime.load(p)


def test_prompt_too_long_and_empty(pkg):
    with edgellm.Runtime.load(pkg) as rt:
        with pytest.raises(InputError, match="context is 32"):
            rt.generate(list(range(3, 40)), max_new_tokens=2)
        with pytest.raises(InputError, match="empty prompt"):
            rt.generate("", max_new_tokens=2)
        with pytest.raises(InputError, match="empty prompt"):
            rt.generate([], max_new_tokens=2)
        with pytest.raises(InputError, match="out of range"):
            rt.generate([5, 100000], max_new_tokens=2)
        with pytest.raises(InputError, match="temperature"):
            rt.generate("hi", temperature=-1)
        # generation that reaches the end of the context stops cleanly
        r = rt.generate(list(range(3, 30)), max_new_tokens=50, ignore_eos=True)
        assert r.finish_reason == "context" and len(r.token_ids) == 32 - 27 + 1


def test_check_generation_refuses_what_generate_refuses(pkg):
    """Context.check_generation (the server's check before it takes a slot) says what generate would say, and
    generates nothing."""
    with edgellm.Runtime.load(pkg) as rt:
        ctx = rt.new_context()
        ctx.check_generation(max_new_tokens=4, temperature=0.7, top_k=5, top_p=0.9, stop=["\n"], seed=3)
        for bad, needle in (({"temperature": -1}, "temperature"), ({"top_p": 1.5}, "top_p"), ({"min_p": -0.5}, "min_p"),
                            ({"stop": [""]}, "stop"), ({"seed": "x"}, "seed"), ({"max_new_tokens": "many"}, "max_new_tokens")):
            with pytest.raises(InputError, match=needle) as e:
                ctx.check_generation(**bad)
            with pytest.raises(InputError) as g:
                ctx.generate("hi", **{"max_new_tokens": 2, **bad})
            assert str(e.value) == str(g.value), bad
        with pytest.raises(InputError, match="unknown sampling argument"):
            ctx.check_generation(temprature=0.5)
        assert ctx.pos == 0 and ctx.stats()["decode_tokens"] == 0


def test_unknown_option_values(ckpt, tmp_path):
    one_line_error(*cli("compile", ckpt, "--quant", "q9", "-o", tmp_path / "o", "--quiet"), "unknown quantization scheme 'q9'")
    one_line_error(*cli("compile", ckpt, "--target", "pdp11", "-o", tmp_path / "o", "--quiet"), "unknown target 'pdp11'")
    one_line_error(*cli("compile", ckpt, "--max-context", "abc"), "--max-context")
    one_line_error(*cli("run", tmp_path / "none", "-p", "x"), "not a package directory")
    assert not (tmp_path / "o").exists()
    with pytest.raises(CompileError, match="max-context"):
        edgellm.compile(str(ckpt), out=tmp_path / "o", max_context=100000, progress=False)


def test_failed_build_leaves_nothing_behind(ckpt, tmp_path, monkeypatch):
    import edgellm.compiler.kernels_build as kb

    def boom(*a, **k):
        raise CompileError("injected failure")

    monkeypatch.setattr(kb, "build_kernels", boom)   # the tvm_cpu kernel backend's build (compiler/backends/)
    with pytest.raises(CompileError, match="injected"):
        edgellm.compile(str(ckpt), out=tmp_path / "o", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_refuses_to_overwrite_foreign_dir(ckpt, tmp_path):
    d = tmp_path / "o"
    d.mkdir()
    (d / "precious.txt").write_text("keep me")
    with pytest.raises(CompileError, match="not an edgellm package"):
        edgellm.compile(str(ckpt), out=d, progress=False)
    assert (d / "precious.txt").read_text() == "keep me"
