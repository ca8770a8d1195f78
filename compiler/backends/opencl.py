"""TVM's OpenCL C for GPUs (android-gpu, opencl): kernels.cl and its launch table kernels.cltab, built on the device
at load; dense models only for now."""
from __future__ import annotations

from ...errors import CompileError
from ...runtime.contract import BACKEND_OPENCL, OPENCL_SOURCE, OPENCL_TABLE
from . import KernelBackend, register


def _make_kernel(op, cpu, **params):
    from ..opencl.ops import UnsupportedOp, make_kernel

    try:
        return make_kernel(op, cpu, **params)
    except UnsupportedOp as e:
        raise CompileError(f"the OpenCL backend has no {str(e).split(' no ')[-1]}: compile this model for a CPU "
                           "target") from None


def _build(funcs, tgt, pkg, table):
    from ..opencl.build import build_opencl

    build_opencl(funcs, pkg)
    return None


def _refuses(spec, layout):
    if spec.n_experts or layout == "bundled":
        return ("mixture-of-experts layers" if spec.n_experts else "--layout bundled") + \
            " need a CPU target (host, rpi5, android-cpu)"
    return None


OPENCL = register(KernelBackend(BACKEND_OPENCL, _make_kernel, _build,
                                {"opencl": OPENCL_SOURCE, "opencl_table": OPENCL_TABLE}, _refuses))
