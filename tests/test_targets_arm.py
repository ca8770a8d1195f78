"""ARM targets end to end: packages compiled for rpi4 / rpi5 / android-cpu run their own bin/edgellm-run under
qemu-aarch64 and give the host's greedy tokens and logits; the host package's bin/edgellm-run gives the Python
Runtime's tokens.

qemu runs each package on the CPU model of its device class, so an instruction the target lacks would fault:
rpi4 on cortex-a72 (NEON, no dotprod: the generic integer path), rpi5 on cortex-a76 (dotprod: SDOT kernels),
android-cpu on qemu's `max` CPU (dotprod + i8mm: SDOT decode, SMMLA prefill; the static binary with the kernels
linked in).

Tolerance of the dumped logits (ARM binary vs host binary, both the same decode program on the same weights):
f32 kernels sum in another order on NEON (4 lanes) than on AVX-512 (16 lanes): ~1e-6 of the logit range, checked
at 1e-4. Integer schemes: the dot products are exact int32 on both, but an activation within an f32 ulp of an int8
rounding boundary can flip one quantization step (1/127 of its block's absmax) when the f32 ops before it summed
in another order: checked at 2e-3 of the range, like tests/test_quant_packages.py. Greedy ids must be identical.
"""
from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

import edgellm
from edgellm.models.synthetic import make_checkpoint
from edgellm.targets import get_target

PROMPT = [5, 17, 33, 2, 99, 250, 7, 64, 128, 3, 11, 300]
N_NEW = 16
QEMU_CPU = {"rpi4": "cortex-a72", "rpi5": "cortex-a76", "android-cpu": "max"}
TOL = {"f32": 1e-4}
QUANT_TOL = 2e-3

HAVE_CROSS = shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-gcc") and \
    Path("/usr/aarch64-linux-gnu/lib").is_dir()
needs_cross = pytest.mark.skipif(not HAVE_CROSS, reason="needs qemu-aarch64, gcc-aarch64-linux-gnu and "
                                 "libc6-arm64-cross (apt-get install qemu-user gcc-aarch64-linux-gnu libc6-arm64-cross)")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("armckpt")
    base = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 32, "vocab_size": 997}   # vocab 997: the q8 head ends in a 5-row tail panel
    return {"llama": make_checkpoint(root / "llama", seed=3, **base),
            "qwen2-tied": make_checkpoint(root / "qwen2", "Qwen2ForCausalLM", seed=4, tie_word_embeddings=True, **base),
            "demo": "demo"}   # the bundled trained model: real text (random weights emit broken UTF-8)


@pytest.fixture(scope="module")
def packages(ckpts, tmp_path_factory):
    """(model, target, quant) -> package dir, compiled on first use. Prefill chunk 6: with 12 prompt tokens two
    chunks, and a ragged last token block in the ARM GEMMs (4 tokens per register block)."""
    root = tmp_path_factory.mktemp("armpkg")
    cache: dict = {}

    def get(model: str, target: str, quant: str) -> Path:
        key = (model, target, quant)
        if key not in cache:
            if quant not in get_target(target).quants:
                pytest.xfail(f"--quant {quant} is not enabled for target {target} yet (targets/registry.py quants)")
            cache[key] = edgellm.compile(str(ckpts[model]), target=target, quant=quant,
                                         out=root / f"{model}-{quant}-{target}", max_context=64, prefill_chunk=6,
                                         progress=False)
        return cache[key]

    return get


def run_binary(pkg: Path, *args: str, prefix: tuple = (), dump: Path | None = None) -> tuple[list[int], np.ndarray | None]:
    cmd = [*prefix, str(pkg / "bin" / "edgellm-run"), str(pkg), "--ids", ",".join(map(str, PROMPT)), "-n", str(N_NEW),
           "--ignore-eos", "--print-ids", "--threads", "2", *args]
    if dump is not None:
        cmd += ["--dump-logits", str(dump)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"
    assert "tok/s" in r.stderr.splitlines()[-1]
    ids = [int(t) for t in r.stdout.split()]
    vocab = json.loads((pkg / "manifest.json").read_text())["model"]["config"]["vocab_size"]
    logits = np.fromfile(dump, dtype=np.float32).reshape(-1, vocab) if dump is not None else None
    return ids, logits


def qemu(target: str) -> tuple:
    t = get_target(target)
    return (t.run_prefix[0], "-cpu", QEMU_CPU[target], *t.run_prefix[1:])


def relerr(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def python_greedy(pkg: Path) -> list[int]:
    with edgellm.Runtime.load(pkg, threads=2) as rt:
        return rt.generate(PROMPT, max_new_tokens=N_NEW, ignore_eos=True).token_ids


def is_static_elf(path: Path) -> bool:
    """No PT_INTERP program header: the kernel runs it without a dynamic loader."""
    b = path.read_bytes()
    assert b[:4] == b"\x7fELF" and b[4] == 2   # ELF64 little-endian
    phoff, = struct.unpack_from("<Q", b, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", b, 0x36)
    return all(struct.unpack_from("<I", b, phoff + i * phentsize)[0] != 3 for i in range(phnum))


# ---------------------------------------------------------------------------------------------------------- host
@pytest.mark.parametrize("quant", ["f32", "q4g32", "t2"])
def test_host_binary_matches_python_runtime(packages, tmp_path, quant):
    pkg = packages("llama", "host", quant)
    ids, logits = run_binary(pkg, dump=tmp_path / "host.f32")
    assert ids == python_greedy(pkg)
    with edgellm.Runtime.load(pkg, threads=2) as rt:   # row i: the logits after PROMPT + ids[:i] (prefill program)
        ref = rt.logits(PROMPT + ids[:-1])[len(PROMPT) - 1:]
    assert logits.shape == ref.shape
    assert relerr(logits, ref) < TOL.get(quant, QUANT_TOL)


def test_binary_usage_errors(packages):
    pkg = packages("llama", "host", "f32")
    exe = str(pkg / "bin" / "edgellm-run")
    r = subprocess.run([exe, str(pkg)], capture_output=True, text=True)
    assert r.returncode == 2 and "exactly one of -p TEXT or --ids" in r.stderr
    r = subprocess.run([exe, str(pkg), "--ids", "1,x"], capture_output=True, text=True)
    assert r.returncode == 2 and "--ids" in r.stderr
    r = subprocess.run([exe, str(pkg), "--ids", "5,99999"], capture_output=True, text=True)
    assert r.returncode == 1 and "outside the vocabulary" in r.stderr and len(r.stderr.splitlines()) == 1
    r = subprocess.run([exe, str(pkg), "--ids", "5", "--top-p", "0"], capture_output=True, text=True)
    assert r.returncode == 1 and "top_p 0 is invalid" in r.stderr and len(r.stderr.splitlines()) == 1
    r = subprocess.run([exe, str(pkg), "--ids", "5", "--top-p", "x"], capture_output=True, text=True)
    assert r.returncode == 2 and "--top-p" in r.stderr


def test_host_binary_sampling_matches_python_runtime(packages):
    pkg = packages("llama", "host", "f32")
    opts = dict(temperature=0.8, top_k=40, top_p=0.9, seed=1234)
    ids, _ = run_binary(pkg, "--temperature", "0.8", "--top-k", "40", "--top-p", "0.9", "--seed", "1234")
    with edgellm.Runtime.load(pkg, threads=2) as rt:
        assert ids == rt.generate(PROMPT, max_new_tokens=N_NEW, ignore_eos=True, **opts).token_ids


TEXT = "def read_config(path):"


def with_tokenizer_bin(pkg: Path) -> Path:
    """The package, with tokenizer.bin (written here from tokenizer.json if the compiler did not)."""
    if not (pkg / "tokenizer.bin").is_file():
        try:
            from edgellm.compiler.tokenizer_pack import write_tokenizer_bin
        except ImportError:
            pytest.skip("no C tokenizer in this build (compiler/tokenizer_pack.py, runtime/tokenizer/tokenizer.c)")
        write_tokenizer_bin(pkg / "tokenizer.json", pkg / "tokenizer.bin")
    return pkg


def run_text(pkg: Path, *args: str, prefix: tuple = ()) -> subprocess.CompletedProcess:
    r = subprocess.run([*prefix, str(pkg / "bin" / "edgellm-run"), str(pkg), "-p", TEXT, "-n", "24", "--ignore-eos",
                        "--threads", "2", "--seed", "5", *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r


def test_host_binary_text_prompt(packages):
    pkg = with_tokenizer_bin(packages("demo", "host", "q4g32"))
    with edgellm.Runtime.load(pkg, threads=2) as rt:
        want = rt.generate(TEXT, max_new_tokens=24, ignore_eos=True, seed=5)   # the package's sampling defaults
    assert [int(t) for t in run_text(pkg, "--print-ids").stdout.split()] == want.token_ids
    assert run_text(pkg).stdout.rstrip("\n") == want.text


# ----------------------------------------------------------------------------------------------------------- ARM
ARM_CASES = [(t, q) for t in ("rpi5", "android-cpu", "rpi4") for q in ("f32", "q4g32", "t2")]


@needs_cross
@pytest.mark.parametrize("target,quant", ARM_CASES)
def test_arm_binary_under_qemu_matches_host(packages, tmp_path, target, quant):
    host = packages("llama", "host", quant)
    pkg = packages("llama", target, quant)
    want_ids, want = run_binary(host, dump=tmp_path / "host.f32")
    ids, logits = run_binary(pkg, prefix=qemu(target), dump=tmp_path / "arm.f32")
    assert ids == want_ids == python_greedy(host)
    assert relerr(logits, want) < TOL.get(quant, QUANT_TOL)


@needs_cross
@pytest.mark.parametrize("target", ["rpi5", "android-cpu"])
def test_arm_binary_text_prompt_under_qemu(packages, target):
    host = with_tokenizer_bin(packages("demo", "host", "q4g32"))
    pkg = with_tokenizer_bin(packages("demo", target, "q4g32"))
    # greedy: emulated integer kernels may differ from the host's in the last float bits, which can move a sampled
    # draw; the argmax path is what must agree
    assert run_text(pkg, "--temperature", "0", prefix=qemu(target)).stdout == run_text(host, "--temperature", "0").stdout


@needs_cross
@pytest.mark.parametrize("target,quant", [("rpi4", "q8"), ("rpi5", "q8"), ("rpi5", "q4g64")])
def test_arm_bias_and_q8_under_qemu(packages, tmp_path, target, quant):
    """Qwen2 (q/k/v biases, tied q8 embedding/head) and the q8 body (SDOT on sign-flipped codes)."""
    host = packages("qwen2-tied", "host", quant)
    pkg = packages("qwen2-tied", target, quant)
    want_ids, want = run_binary(host, dump=tmp_path / "host.f32")
    ids, logits = run_binary(pkg, prefix=qemu(target), dump=tmp_path / "arm.f32")
    assert ids == want_ids
    assert relerr(logits, want) < QUANT_TOL


@needs_cross
def test_arm_package_layout_and_feature_check(packages):
    rpi5, android = packages("llama", "rpi5", "q4g32"), packages("llama", "android-cpu", "q4g32")
    assert is_static_elf(android / "bin" / "edgellm-run")
    assert not is_static_elf(rpi5 / "bin" / "edgellm-run")
    man = json.loads((rpi5 / "manifest.json").read_text())
    assert man["target"]["arch"] == "aarch64" and "dotprod" in man["target"]["features"]
    assert man["files"]["binary"] == "bin/edgellm-run"
    # an rpi5 package on a Pi 4 class CPU (no dotprod) is refused with a clear message, before any kernel runs
    r = subprocess.run([*qemu("rpi4"), str(rpi5 / "bin" / "edgellm-run"), str(rpi5), "--ids", "5"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "needs the CPU feature dotprod" in r.stderr
    # the android binary holds its own package's kernels: another package's plan is refused, also one with the same
    # kernels (an rpi5 package of the same model and scheme) or another android build of the same model
    for other in (packages("llama", "android-cpu", "f32"), rpi5):
        r = subprocess.run([*qemu("android-cpu"), str(android / "bin" / "edgellm-run"), str(other), "--ids", "5"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and "belongs to another package" in r.stderr, r.stderr
