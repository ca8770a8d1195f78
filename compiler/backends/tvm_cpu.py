"""TVM's LLVM kernels for CPUs (host x86, ARM): kernels.so, or an object linked into a static edgellm-run."""
from __future__ import annotations

from ...runtime.contract import BACKEND_TVM_CPU, KERNELS
from . import KernelBackend, register


def _make_kernel(op, cpu, **params):
    from ..ops import make_kernel

    return make_kernel(op, cpu, **params)


def _build(funcs, tgt, pkg, table):
    from ..kernels_build import build_kernels

    return build_kernels(funcs, tgt, pkg / KERNELS, keep_object=tgt.static_binary, table=table)


TVM_CPU = register(KernelBackend(BACKEND_TVM_CPU, _make_kernel, _build, {"kernels": KERNELS}))
