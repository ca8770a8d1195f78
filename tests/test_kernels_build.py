"""The kernel build (compiler/kernels_build.py): one object per kernel, compiled in parallel children and cached per
kernel; and the TVMScript frames shortcut (compiler/ops/script_frames.py) that builds the same kernels faster."""
from __future__ import annotations

import pytest

from edgellm.compiler import kernels_build as kb
from edgellm.compiler import ops
from edgellm.compiler.ops import script_sources
from edgellm.compiler.ops.script_frames import frames_without_source
from edgellm.compiler.ops.script_sources import sources_parsed_once
from edgellm.errors import CompileError
from edgellm.targets import get_target


def _funcs(*specs):
    cpu = ops.host_cpu_info()
    return dict(ops.make_kernel(op, cpu, **p) for op, p in specs)


COMMON = (("rmsnorm", {"R": 1, "D": 64, "eps": 1e-5}), ("add", {"R": 1, "N": 64}),
          ("attention", {"T": 1, "NH": 4, "KVH": 2, "D": 16}))


@pytest.fixture()
def codegen_calls(monkeypatch):
    """Counts the kernels handed to the code generator."""
    calls = []
    real = kb._codegen_in_children

    def counting(jobs, target):
        calls.append(len(jobs))
        return real(jobs, target)

    monkeypatch.setattr(kb, "_codegen_in_children", counting)
    return calls


def test_kernels_are_cached_one_by_one(tmp_path, monkeypatch, codegen_calls):
    """A second library sharing three of its four kernels with the first compiles only the fourth; a library built
    from cached objects is byte-identical to one built without the cache, and to one built by a single child."""
    monkeypatch.setenv("EDGELLM_KERNEL_CACHE", str(tmp_path / "cache"))
    host = get_target("host")
    a = _funcs(*COMMON, ("linear", {"T": 1, "N": 32, "K": 64, "wdtype": "float32"}))
    b = _funcs(*COMMON, ("linear", {"T": 1, "N": 48, "K": 64, "wdtype": "float32"}))
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir(), (tmp_path / "b2").mkdir(), (tmp_path / "b3").mkdir()
    kb.build_kernels(a, host, tmp_path / "a" / "kernels.so")
    kb.build_kernels(b, host, tmp_path / "b" / "kernels.so")
    assert codegen_calls == [4, 1]
    assert len(list((tmp_path / "cache").glob("*.o"))) == 5
    assert not list((tmp_path / "cache").glob("*.tmp")) and not list(tmp_path.glob("*/.kernels-*"))
    monkeypatch.delenv("EDGELLM_KERNEL_CACHE")
    monkeypatch.setenv("EDGELLM_BUILD_JOBS", "1")
    kb.build_kernels(b, host, tmp_path / "b2" / "kernels.so")
    monkeypatch.setenv("EDGELLM_BUILD_JOBS", "3")
    kb.build_kernels(b, host, tmp_path / "b3" / "kernels.so")
    assert codegen_calls == [4, 1, 4, 4]
    built = (tmp_path / "b" / "kernels.so").read_bytes()
    assert (tmp_path / "b2" / "kernels.so").read_bytes() == built == (tmp_path / "b3" / "kernels.so").read_bytes()


def test_static_targets_get_one_kernels_object(tmp_path, monkeypatch):
    """android-cpu links its kernels into a static runner: the per-kernel objects are joined into one kernels.o
    that holds every kernel's symbol, and kernels.so is built from it."""
    import shutil
    import subprocess

    t = get_target("android-cpu")
    if shutil.which(t.cc_cmd[0]) is None:
        pytest.skip(f"needs {t.cc}")
    funcs = dict(ops.make_kernel(op, ops.CpuInfo(vector_lanes=4, num_threads=2, arch="aarch64"), **p) for op, p in COMMON)
    obj = kb.build_kernels(funcs, t, tmp_path / "kernels.so", keep_object=True)
    assert obj == tmp_path / kb.KERNELS_OBJECT and (tmp_path / "kernels.so").is_file()
    nm = shutil.which("aarch64-linux-gnu-nm") or shutil.which("nm")
    syms = subprocess.run([nm, str(obj)], capture_output=True, text=True, check=True).stdout
    for name in funcs:
        assert f" T __tvm_ffi_{name}\n" in syms


def test_bad_job_count_is_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("EDGELLM_BUILD_JOBS", raising=False)
    assert 1 <= kb.build_jobs() <= kb.MAX_DEFAULT_JOBS
    monkeypatch.setenv("EDGELLM_BUILD_JOBS", "12")
    assert kb.build_jobs() == 12
    monkeypatch.setenv("EDGELLM_BUILD_JOBS", "two")
    monkeypatch.delenv("EDGELLM_KERNEL_CACHE", raising=False)
    with pytest.raises(CompileError, match="EDGELLM_BUILD_JOBS='two'"):
        kb.build_kernels(_funcs(COMMON[0]), get_target("host"), tmp_path / "kernels.so")


@pytest.mark.parametrize("op, p", [
    ("attention", {"T": 4, "NH": 4, "KVH": 2, "D": 16}),
    ("linear_q4", {"T": 1, "N": 64, "K": 128, "G": 32}),
    ("linear_q8", {"T": 4, "N": 64, "K": 128}),
    ("rmsnorm", {"R": 2, "D": 64, "eps": 1e-6}),
])
def test_frames_without_source_build_the_same_kernels(op, p):
    """TVMScript parsed under frames_without_source gives the PrimFunc it gives with inspect's own frames, and under
    sources_parsed_once too, the first time (documents made) and the second (documents reused)."""
    import inspect

    from tvm.script.parser.core.diagnostics import Source

    cpu = ops.host_cpu_info()
    params = ops.kernel_params(op, p)
    k = cpu.for_kernel(op, params)
    stack, as_ast = inspect.stack, Source.as_ast
    plain = ops._build(op, k, params, fast=True).script()
    with frames_without_source():
        assert inspect.stack is not stack
        fast = ops._build(op, k, params, fast=True).script()
    assert inspect.stack is stack
    assert fast == plain
    script_sources._docs.clear()
    for _ in range(2):
        with frames_without_source(), sources_parsed_once():
            assert Source.as_ast is not as_ast
            assert ops._build(op, k, params, fast=True).script() == plain
        assert Source.as_ast is as_ast
    assert script_sources._docs   # the second build read documents made by the first
