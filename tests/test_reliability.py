"""Reliability and trust: each finding of the reliability review (issue 14), reproduced and now giving its one-line
error, losing nothing, or running correctly."""
from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import edgellm
from edgellm.errors import CompileError, EdgeLLMError, InputError, PackageError
from edgellm.models.synthetic import make_checkpoint
from edgellm.runtime import contract as K

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("ck") / "m", seed=4)


@pytest.fixture(scope="module")
def pkg(ckpt, tmp_path_factory):
    return edgellm.compile(str(ckpt), quant="f32", out=tmp_path_factory.mktemp("p") / "pkg", max_context=48,
                           prefill_chunk=8, progress=False)


def cli(*args, input_bytes=None, env=None):
    argv = [a if isinstance(a, bytes) else os.fsencode(str(a)) for a in args]
    r = subprocess.run([sys.executable, "-m", "edgellm.cli", *argv], capture_output=True, env=env, input=input_bytes)
    return r.returncode, r.stderr.decode("utf-8", "replace").strip()


def one_line_error(rc, err, *needles):
    assert rc != 0, err
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    for n in needles:
        assert n in err, err


def copy(src, dst):
    shutil.copytree(src, dst)
    return dst


# --- compile -o: nothing of the user's is ever deleted; nothing half-written is left --------------------------------

def test_user_dir_with_a_manifest_is_not_replaced(ckpt, tmp_path):
    """A directory that merely holds a file named manifest.json is not a package: refused, its files kept."""
    d = tmp_path / "mine"
    d.mkdir()
    (d / "manifest.json").write_text('{"my": "data"}')
    (d / "thesis.tex").write_text("years of work")
    for bad_plan in (None, b"not a plan"):
        if bad_plan is not None:
            (d / "manifest.json").write_text('{"format_version": 1}')
            (d / "plan.bin").write_bytes(bad_plan)
        with pytest.raises(CompileError, match="not an edgellm package"):
            edgellm.compile(str(ckpt), out=d, max_context=16, progress=False)
        one_line_error(*cli("compile", ckpt, "-o", d, "--quiet", "--max-context", "16"), "not an edgellm package")
        assert (d / "thesis.tex").read_text() == "years of work"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]   # no temp dirs either


def test_package_is_replaced_and_stale_temps_removed(ckpt, tmp_path):
    out = tmp_path / "pkg"
    edgellm.compile(str(ckpt), quant="f32", out=out, max_context=16, prefill_chunk=8, progress=False)
    first = (out / "plan.bin").read_bytes()
    # leftovers of compiles killed with SIGKILL: a dead pid's are removed, a running process's are not
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f".pkg.tmp-{dead.pid}-abcd"
    stale.mkdir()
    (stale / "weights.bin").write_bytes(bytes(1000))
    alive = tmp_path / f".pkg.tmp-{os.getpid()}-beef"
    alive.mkdir()
    edgellm.compile(str(ckpt), quant="f32", out=out, max_context=16, prefill_chunk=8, progress=False)
    assert (out / "plan.bin").read_bytes() != first   # a new build id: really rebuilt
    assert not stale.exists() and alive.exists()


def test_recompile_keeps_the_users_files(ckpt, tmp_path):
    """Compiling into an existing package replaces only edgellm's files: a user's notes (and a folder of them) beside
    them survive with their bytes; a user file where the new package writes one of the same name is refused, and
    the old package stays as it was."""
    out = tmp_path / "pkg"
    edgellm.compile(str(ckpt), quant="f32", out=out, max_context=16, prefill_chunk=8, progress=False)
    (out / "notes").write_text("n")
    (out / "mine").mkdir()
    (out / "mine" / "eval.csv").write_text("a,b\n1,2\n")
    first = (out / "plan.bin").read_bytes()
    edgellm.compile(str(ckpt), quant="q8", out=out, max_context=16, prefill_chunk=8, progress=False)
    assert (out / "plan.bin").read_bytes() != first
    assert (out / "notes").read_text() == "n" and (out / "mine" / "eval.csv").read_text() == "a,b\n1,2\n"
    assert "notes" not in (out / "SHA256SUMS").read_text()
    edgellm.Runtime.load(out, digest=None).close()   # still a valid package with the extra files
    (out / "SHA256SUMS").write_text("\n".join(l for l in (out / "SHA256SUMS").read_text().splitlines()
                                             if not l.endswith("tokenizer.json")) + "\n")
    (out / "tokenizer.json").write_text("my own tokenizer notes")   # now a user file the compile would overwrite
    plan = (out / "plan.bin").read_bytes()
    with pytest.raises(CompileError, match="is not an edgellm file"):
        edgellm.compile(str(ckpt), quant="f32", out=out, max_context=16, prefill_chunk=8, progress=False)
    assert (out / "tokenizer.json").read_text() == "my own tokenizer notes" and (out / "plan.bin").read_bytes() == plan
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg"]


@pytest.mark.parametrize("how", ["file-parent", "dot", "cwd-parent", "file"])
def test_bad_output_places(ckpt, tmp_path, monkeypatch, how):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    out = {"file-parent": "afile/pkg", "dot": ".", "cwd-parent": "..", "file": "afile"}[how]
    with pytest.raises(CompileError):
        edgellm.compile(str(ckpt), out=out, max_context=16, progress=False)
    one_line_error(*cli("compile", ckpt, "-o", out, "--quiet", "--max-context", "16"))
    assert (tmp_path / "afile").read_text() == "x" and sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_code_generator_death_leaves_nothing(ckpt, tmp_path, monkeypatch):
    """LLVM reports some failures (a full disk) by exiting the process: the build runs in a child, so the compile
    fails with the message and removes its temp dir."""
    import tvm

    monkeypatch.delenv("EDGELLM_KERNEL_CACHE", raising=False)   # the code generator must run
    def llvm_error(*a, **k):
        os.write(2, b"LLVM ERROR: IO failure on output stream: No space left on device\n")
        os._exit(1)

    monkeypatch.setattr(tvm, "compile", llvm_error)
    with pytest.raises(CompileError, match="No space left on device") as e:
        edgellm.compile(str(ckpt), out=tmp_path / "o", max_context=16, progress=False)
    assert "\n" not in str(e.value)
    monkeypatch.setattr(tvm, "compile", lambda *a, **k: os.abort())
    with pytest.raises(CompileError, match="code generator died"):
        edgellm.compile(str(ckpt), out=tmp_path / "o", max_context=16, progress=False)
    assert list(tmp_path.iterdir()) == []


def _no_kernel_cache() -> dict:
    """The environment without the session's kernel cache (conftest.py): these compiles must run the build."""
    return {k: v for k, v in os.environ.items() if k != "EDGELLM_KERNEL_CACHE"}


def test_full_disk_is_one_line_and_cleans_up(ckpt, tmp_path):
    """Writes that fail (RLIMIT_FSIZE stands in for a full disk: EFBIG instead of ENOSPC) give one line and leave
    no temp dir, whether they hit weights.bin or the code generator's object file."""
    code = ("import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
            "resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), int(sys.argv[1]))); "
            "from edgellm.cli import main; sys.exit(main(sys.argv[2:]))")
    for limit in (4096, 600_000):
        r = subprocess.run([sys.executable, "-c", code, str(limit), "compile", str(ckpt), "-o", str(tmp_path / "o"),
                            "--quiet", "--max-context", "16", "--quant", "f32"], capture_output=True, text=True,
                           env=_no_kernel_cache())
        one_line_error(r.returncode, r.stderr.strip())
        assert list(tmp_path.iterdir()) == [], (limit, r.stderr)


def test_sigterm_during_compile_leaves_nothing(ckpt, tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "edgellm.cli", "compile", str(ckpt), "-o", str(tmp_path / "o"),
                          "--quiet", "--max-context", "16"], stderr=subprocess.PIPE, env=_no_kernel_cache())
    deadline = time.time() + 60
    while time.time() < deadline and not list(tmp_path.glob(".o.tmp-*")):
        time.sleep(0.02)
    assert list(tmp_path.glob(".o.tmp-*")), "the compile never started writing"
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=60)
    assert p.returncode != 0
    assert list(tmp_path.iterdir()) == []


# --- the plan cannot make a kernel write into the weights ----------------------------------------------------------

def _args(plan: bytes):
    """(offset of each arg record, its fields, the kernel it belongs to) over every program of a plan."""
    h = K.HEADER.unpack(plan)
    kern_at = K.weights_table_at(h) + h["n_weights"] * K.WEIGHT.size
    kernels = [K.KERNEL.unpack(plan, kern_at + i * K.KERNEL.size) for i in range(h["n_kernels"])]
    at = kern_at + h["n_kernels"] * K.KERNEL.size
    for _ in range(h["n_programs"]):
        p = K.PROGRAM.unpack(plan, at)
        at += K.PROGRAM.size
        for _ in range(p["n_steps"]):
            s = K.STEP.unpack(plan, at)
            at += K.STEP.size
            for i in range(s["n_args"]):
                yield at, i, K.ARG.unpack(plan, at), kernels[s["kernel"]]
                at += K.ARG.size


@pytest.mark.parametrize("use_mmap", [True, False])
@pytest.mark.parametrize("new_kind", [K.ARG_WEIGHT, K.ARG_KCACHE])
def test_written_arg_turned_into_weight_or_kv_is_refused(pkg, tmp_path, monkeypatch, use_mmap, new_kind):
    """Every kernel output of the real package, in turn, pointed at weight 0 (the embedding table) or a K cache:
    refused at load; before, a weight gave SIGSEGV (mmap) or a silently overwritten embedding (EDGELLM_NO_MMAP)."""
    if not use_mmap:
        monkeypatch.setenv("EDGELLM_NO_MMAP", "1")
    plan = (pkg / "plan.bin").read_bytes()
    p = copy(pkg, tmp_path / "p")
    n = 0
    for at, i, a, kern in _args(plan):
        written = kern["writes"] >> i & 1
        if not written or a["kind"] != K.ARG_ARENA or (new_kind == K.ARG_KCACHE and kern["flags"]):
            continue
        b = bytearray(plan)
        b[at:at + 8] = struct.pack("<II", new_kind, 0)
        b[at + K.ARG.offsets()["offset"]:at + K.ARG.offsets()["offset"] + 8] = struct.pack("<Q", 0)
        (p / "plan.bin").write_bytes(bytes(b))
        with pytest.raises(PackageError, match="written by its kernel|not one that writes the KV"):
            edgellm.Runtime.load(p)
        n += 1
        if n >= 12:
            break
    assert n >= 6


# --- threads: one Runtime used from many threads ------------------------------------------------------------------

def test_threads_on_one_runtime_are_serialised_and_correct(pkg):
    """N threads calling generate on one Runtime (prompts near the context limit): every output equals its own
    sequential run; the position never runs past the context."""
    with edgellm.Runtime.load(pkg, threads=2) as rt:
        prompts = [list(range(3 + i, 3 + i + 20 + 4 * i)) for i in range(6)]
        want = [rt.generate(p, max_new_tokens=40, temperature=0.9, seed=i, ignore_eos=True).token_ids
                for i, p in enumerate(prompts)]
        got, errors = [None] * len(prompts), []

        def work(i):
            try:
                for _ in range(3):
                    got[i] = rt.generate(prompts[i], max_new_tokens=40, temperature=0.9, seed=i,
                                         ignore_eos=True).token_ids
                    assert got[i] == want[i]
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        ts = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert not errors, errors
        assert got == want and all(len(w) + len(p) - 1 <= rt.max_context for w, p in zip(want, prompts))


def test_close_and_reset_during_generate(pkg):
    """close() during a generation in another thread: it stops at its next token ("cancelled") or has finished;
    no crash, and the Runtime is closed afterwards. reset() during a generation waits for it."""
    for op in ("close", "reset"):
        rt = edgellm.Runtime.load(pkg, threads=1)
        want = rt.generate([5, 6, 7], max_new_tokens=40, ignore_eos=True, temperature=0).token_ids
        started, out = threading.Event(), {}

        def gen(rt=rt, started=started, out=out):
            pieces = []
            try:
                for piece in rt.stream([5, 6, 7], max_new_tokens=40, ignore_eos=True, temperature=0, _result=out):
                    pieces.append(piece)
                    started.set()
                    time.sleep(0.002)
            except EdgeLLMError as e:
                out["error"] = str(e)
            started.set()

        t = threading.Thread(target=gen)
        t.start()
        started.wait(10)
        getattr(rt, op)()
        t.join(30)
        assert not t.is_alive()
        if op == "close":
            assert out.get("finish_reason") in ("cancelled", "length"), out
            assert out["ids"] == want[:len(out["ids"])]
            with pytest.raises(InputError, match="closed"):
                rt.generate([5], max_new_tokens=1)
        else:
            assert out["ids"] == want and out["finish_reason"] == "length"   # reset waited for it
            assert rt.context.pos == 0
            rt.close()


def test_stream_reentry_in_one_thread_is_an_error(pkg):
    with edgellm.Runtime.load(pkg) as rt:
        s = rt.stream([5, 6], max_new_tokens=8, ignore_eos=True)
        next(s, None)
        with pytest.raises(InputError, match="busy in this thread"):
            rt.generate([5], max_new_tokens=2)
        s.close()
        assert rt.generate([5], max_new_tokens=2, ignore_eos=True).token_ids   # usable again


# --- trust: digests, verify, sandboxed templates --------------------------------------------------------------------

def test_digest_pins_every_file(pkg, tmp_path):
    from edgellm.runtime.python.package import package_digest

    digest = package_digest(pkg)
    with edgellm.Runtime.load(pkg, digest=digest) as rt:
        assert rt.generate([5, 6], max_new_tokens=3, ignore_eos=True).token_ids
    with pytest.raises(PackageError, match="digest mismatch"):
        edgellm.Runtime.load(pkg, digest="sha256:" + "0" * 64)
    with pytest.raises(InputError, match="sha256:<64"):
        edgellm.Runtime.load(pkg, digest="md5:abc")
    for name in ("plan.bin", "kernels.so", "weights.bin", "bin/edgellm-run", "tokenizer_config.json", "manifest.json"):
        p = copy(pkg, tmp_path / name.replace("/", "_"))
        f = p / name
        if not f.exists():
            continue
        b = bytearray(f.read_bytes())
        b[-1] ^= 1
        f.write_bytes(bytes(b))
        with pytest.raises(PackageError, match="modified|mismatch|corrupt"):
            edgellm.Runtime.load(p, digest=digest)
        with pytest.raises(PackageError):
            edgellm.Runtime.load(p, verify=True)
    # a file that was never part of the package (a planted chat template) is refused too
    p = copy(pkg, tmp_path / "planted")
    (p / "tokenizer_config.json").write_text('{"chat_template": "{{ 1 }}"}')
    with pytest.raises(PackageError, match="does not list|modified"):
        edgellm.Runtime.load(p, digest=digest)


def test_kernels_constructor_never_runs_without_a_matching_digest(pkg, tmp_path):
    """A package is native code: kernels.so's constructors run at dlopen. A tampered kernels.so (here one whose
    constructor writes a marker file) is refused by the digest check before dlopen, in Python and edgellm-run."""
    p = copy(pkg, tmp_path / "evil")
    from edgellm.runtime.python.package import package_digest

    digest_before = package_digest(pkg)
    marker = tmp_path / "pwned"
    src = tmp_path / "evil.c"
    src.write_text(f'#include <stdio.h>\n__attribute__((constructor)) static void c(void) {{ '
                   f'FILE* f = fopen("{marker}", "w"); if (f) fclose(f); }}\n')
    subprocess.run(["gcc", "-shared", "-fPIC", str(src), "-o", str(tmp_path / "evil.so")], check=True)
    # the attacker appends a constructor library's bytes to kernels.so: any change at all is caught
    with open(p / "kernels.so", "ab") as f:
        f.write(b"\0")
    with pytest.raises(PackageError):
        edgellm.Runtime.load(p, digest=digest_before)
    r = subprocess.run([str(p / "bin/edgellm-run"), str(p), "--ids", "5,6", "-n", "2", "--digest", digest_before],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "kernels.so does not match" in r.stderr, r.stderr
    shutil.copy(tmp_path / "evil.so", p / "kernels.so")
    with pytest.raises(PackageError):
        edgellm.Runtime.load(p, digest=digest_before)
    r = subprocess.run([str(p / "bin/edgellm-run"), str(p), "--ids", "5,6", "-n", "2", "--digest", digest_before],
                       capture_output=True, text=True)
    assert r.returncode == 1 and not marker.exists()
    # the threat is real: without a pinned digest the loader gets as far as dlopen, and the constructor runs
    r = subprocess.run([str(p / "bin/edgellm-run"), str(p), "--ids", "5,6", "-n", "2"], capture_output=True, text=True)
    assert r.returncode == 1 and marker.exists()


def test_chat_template_is_sandboxed(pkg, tmp_path):
    p = copy(pkg, tmp_path / "p")
    marker = tmp_path / "ran"
    evil = ("{% for c in ''.__class__.__mro__[1].__subclasses__() %}{% if c.__name__ == 'Popen' %}"
            "{{ c(['touch', '" + str(marker) + "']) }}{% endif %}{% endfor %}"
            "{{ cycler.__init__.__globals__.os.system('touch " + str(marker) + "') }}")
    (p / "tokenizer_config.json").write_text(json.dumps({"chat_template": evil}))
    (p / "SHA256SUMS").unlink()
    with edgellm.Runtime.load(p) as rt:
        with pytest.raises(InputError, match="chat template"):
            rt.chat([{"role": "user", "content": "hi"}], max_new_tokens=2)
    assert not marker.exists()


# --- one-line errors instead of tracebacks ------------------------------------------------------------------------

def test_cli_bad_values_are_one_line(pkg, ckpt, tmp_path):
    one_line_error(*cli("run", pkg, "-p", "hi", "--repetition-penalty", "inf"), "repetition_penalty")
    one_line_error(*cli("run", pkg, "-p", "hi", "--temperature", "nan"), "temperature")
    one_line_error(*cli("run", pkg, "-p", "hi", "--threads", "100000"), "--threads")
    one_line_error(*cli("run", pkg, "-p", "hi", "--stop", ""), "stop")
    one_line_error(*cli("run", pkg, "-p", "hi", "--top-p", "0"), "top_p")
    one_line_error(*cli("run", pkg, "-p", "hi", "--memory-budget", "lots"), "not a size")
    one_line_error(*cli("run", pkg, "-p", "hi", "--memory-budget", "1KB"), "minimum")
    one_line_error(*cli("run", pkg, "-p", b"caf\xff\xfe"), "not valid UTF-8")
    one_line_error(*cli("compile", ckpt, "-o", tmp_path / "o", "--max-context", "0"), "--max-context")
    one_line_error(*cli("compile", ckpt, "-o", tmp_path / "o", "--prefill-chunk", "0"), "--prefill-chunk")
    one_line_error(*cli("eval", "ppl", pkg, "--max-tokens", "0"), "--max-tokens")
    for n in (10**12, 10**30):   # more tokens than the context holds: runs to its end
        rc, err = cli("run", pkg, "-p", "hi", "-n", n, "--ignore-eos")
        assert rc == 0 and "(context)" in err.splitlines()[-1], err


def test_api_bad_values_are_input_errors(pkg):
    with edgellm.Runtime.load(pkg) as rt:
        for kw in ({"temperature": "hot"}, {"top_k": 1.5}, {"top_k": -1}, {"repetition_penalty": float("inf")},
                   {"seed": "x"}, {"stop": [""]}, {"stop": [3]}, {"max_new_tokens": -1}, {"stop_ids": [10**9]},
                   {"min_p": 2.0}):
            with pytest.raises(InputError):
                rt.generate([5, 6], **kw)
        with pytest.raises(InputError, match="UTF-8"):
            rt.generate("caf\udcff")
        with pytest.raises(InputError):
            rt.generate([1.5, 2])
        r = rt.generate([5, 6], max_new_tokens=10**12, ignore_eos=True)
        assert r.finish_reason == "context"
    for t in (2**32 + 1, -1, 100000, "2"):
        with pytest.raises(InputError, match="threads"):
            edgellm.Runtime.load(pkg, threads=t)


@pytest.mark.parametrize("name,content,where", [
    ("tokenizer.json", b"{not json", "load"), ("tokenizer.json", b'{"model": 5}', "load"),
    ("tokenizer_config.json", b"[1, 2]", "load"), ("tokenizer_config.json", b"\xff\xfe", "load"),
    ("manifest.json", b'{"format_version": 2}', "load"), ("manifest.json", b"null", "load"),
])
def test_corrupt_package_files_are_one_line(pkg, tmp_path, name, content, where):
    p = copy(pkg, tmp_path / "p")
    (p / name).write_bytes(content)
    with pytest.raises(PackageError) as e:
        edgellm.Runtime.load(p)
    assert "\n" not in str(e.value)
    if name == "manifest.json":
        one_line_error(*cli("info", p), "manifest.json")


def test_manifest_field_types_checked(pkg, tmp_path):
    for path, value in [(("model", "config", "n_layers"), None), (("tensors",), [{"name": 1}]), (("quant",), []),
                        (("target", "features"), "avx2"), (("max_context",), -5), (("kernels",), {"a": 1})]:
        p = copy(pkg, tmp_path / "_".join(map(str, path)))
        m = json.loads((p / "manifest.json").read_text())
        node = m
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
        (p / "manifest.json").write_text(json.dumps(m))
        one_line_error(*cli("info", p), "manifest.json is corrupt")
        with pytest.raises(PackageError, match="manifest.json is corrupt"):
            edgellm.Runtime.load(p, verify=True)


def test_runner_errors_are_one_line(pkg, tmp_path):
    exe = pkg / "bin" / "edgellm-run"
    r = subprocess.run([str(exe), str(tmp_path / "nope"), "--ids", "1"], capture_output=True, text=True)
    assert r.returncode == 1 and "is not a package directory" in r.stderr and len(r.stderr.splitlines()) == 1
    for args, needle in [(["--ids", "1", "--repetition-penalty", "inf"], "--repetition-penalty"),
                         (["--ids", "1", "--top-p", "0"], "top_p"), (["--ids", "1", "--stop", ""], "--stop"),
                         (["--ids", "99999999"], "outside the vocabulary"), (["--ids", "1", "--digest", "x"], "digest")]:
        r = subprocess.run([str(exe), str(pkg), *args], capture_output=True, text=True)
        assert r.returncode != 0 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)


def test_fifo_package_files_do_not_hang(pkg, tmp_path):
    """A FIFO in place of a package file is never opened for reading (that would block forever)."""
    for name in ("manifest.json", "tokenizer.json", "tokenizer_config.json", "plan.bin", "weights.bin"):
        p = copy(pkg, tmp_path / name)
        (p / name).unlink()
        os.mkfifo(p / name)
        r = subprocess.run([sys.executable, "-m", "edgellm.cli", "run", str(p), "-p", "hi", "-n", "2"],
                           capture_output=True, text=True, timeout=60)
        if r.returncode:
            one_line_error(r.returncode, r.stderr.strip())
        r = subprocess.run([str(pkg / "bin/edgellm-run"), str(p), "--ids", "1", "-n", "2"], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0 or len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_chat_template_renders_like_transformers(tmp_path):
    """The sandboxed environment still renders real templates as transformers does (loop controls, tojson)."""
    from transformers import PreTrainedTokenizerFast

    from edgellm.models.demo import DEMO_DIR
    from edgellm.runtime.python.text import TextCodec

    tmpl = ("{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
            "<|{{ m.role }}|>{{ m.content | trim }}{{ eos_token }}{% if loop.index > 6 %}{% break %}{% endif %}"
            "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}{{ {'k': 'é'} | tojson }}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": tmpl, "bos_token": "<s>",
                                                                "eos_token": "</s>"}))
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": " héllo "},
            {"role": "assistant", "content": "hi"}, {"role": "user", "content": "more"}]
    hf = PreTrainedTokenizerFast(tokenizer_file=str(DEMO_DIR / "demo-llama" / "tokenizer.json"), bos_token="<s>",
                                 eos_token="</s>")
    want = hf.apply_chat_template(msgs, chat_template=tmpl, tokenize=False, add_generation_prompt=True)
    assert TextCodec(tmp_path).apply_chat_template(msgs) == want


def test_chat_template_file_of_its_own(pkg, tmp_path):
    """Newer checkpoints keep the template in chat_template.jinja: it is copied into the package and wins."""
    from edgellm.runtime.python.text import TextCodec

    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "old {{ messages[0].content }}"}))
    (tmp_path / "chat_template.jinja").write_text("new {{ messages[0].content }}")
    assert TextCodec(tmp_path).apply_chat_template([{"role": "user", "content": "x"}]) == "new x"
    from edgellm.compiler.driver import TOKENIZER_FILES

    assert "chat_template.jinja" in TOKENIZER_FILES


def test_options_a_package_has_nothing_for(pkg):
    """--npu-soc, --device and --ffn-threshold on a package without NPU graphs, OpenCL kernels or bundled FFNs are
    one-line load errors (libedgellm's loader: the same for Runtime.load and bin/edgellm-run), not ignored."""
    from edgellm.errors import RuntimeLoadError

    for kw, what in (({"npu_soc": "sm8650"}, "npu-soc applies to"), ({"device": "0:0"}, "device applies to"),
                     ({"ffn_threshold": 0.1}, "ffn-threshold applies to")):
        with pytest.raises(RuntimeLoadError, match=what) as e:
            edgellm.Runtime.load(pkg, **kw)
        assert "\n" not in str(e.value)
    one_line_error(*cli("run", pkg, "-p", "hi", "-n", "1", "--device", "0:0"), "device applies to")
    r = subprocess.run([str(pkg / "bin" / "edgellm-run"), str(pkg), "-p", "hi", "-n", "1", "--ffn-threshold", "0.1"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "ffn-threshold applies to" in r.stderr
