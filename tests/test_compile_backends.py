"""The compile side of the backends is a registry too (compiler/backends/): a target names its kernel backend, and
compile_model builds the kernels, names the programs' runtime backend and lists the files through it, with no
branch on the target's kind. Shown by a kernel backend registered in this test only."""
from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("tvm")

import edgellm.compiler.driver as drv  # noqa: E402
from edgellm.compiler.backends import BACKENDS, kernel_backend, register  # noqa: E402
from edgellm.errors import RuntimeLoadError  # noqa: E402
from edgellm.runtime import Runtime  # noqa: E402
from edgellm.runtime import contract as K  # noqa: E402
from edgellm.targets import get_target  # noqa: E402


def program_backends(plan: bytes) -> set[str]:
    return {p["backend"] for p in K.read_programs(plan)}


def test_targets_name_their_kernel_backend():
    assert {t: kernel_backend(get_target(t)).name for t in ("host", "rpi5", "android-npu", "opencl", "android-gpu")} \
        == {"host": "tvm_cpu", "rpi5": "tvm_cpu", "android-npu": "tvm_cpu", "opencl": "opencl", "android-gpu": "opencl"}


def test_a_kernel_backend_registered_by_name_builds_the_package(tiny_models, tmp_path, monkeypatch):
    cpu = BACKENDS["tvm_cpu"]
    built = []

    def build(funcs, tgt, pkg, table):
        built.append(len(funcs))
        return cpu.build(funcs, tgt, pkg, table)

    register(dataclasses.replace(cpu, name="traced", build=build))
    try:
        host = get_target("host")
        monkeypatch.setattr(drv, "get_target", lambda name: dataclasses.replace(host, kernel_backend="traced"))
        pkg = drv.compile_model(tiny_models["llama-gqa"], out=tmp_path / "p", progress=False)
    finally:
        del BACKENDS["traced"]
    assert built and built[0] > 0 and (pkg / K.KERNELS).is_file()
    assert program_backends((pkg / K.PLAN).read_bytes()) == {"traced"}
    # the runtime has no backend of that name: the load says so (an application would register one first)
    with pytest.raises(RuntimeLoadError, match='runs on backend "traced", which this runtime does not have'):
        Runtime.load(pkg)
