"""The compile side of the runtime's backends: for each backend a package's programs run on, the op library the
lowering builds its kernels from, how those kernels go into the package, the files the manifest names for them,
and the models it cannot run yet. A target picks its kernel backend by name (targets: Target.kernel_backend); the
NPU's prefill graphs are a staged prefill beside the CPU programs, built by compiler/onnx_qnn/.

Adding a kernel backend: its module here (a KernelBackend and `register(...)`), its import below, and its runtime
backend (runtime/backends/) under the same name."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class KernelBackend:
    name: str                 # the runtime backend the programs name (plan.bin; runtime/backends/)
    make_kernel: Callable     # (op, cpu, **params) -> (name, prim_func): the op library (compiler/ops interface)
    # (funcs name -> prim_func, target, package dir, kernel table) -> an object file to link into a static runner, or
    # None; writes the package's kernel files
    build: Callable
    files: dict               # manifest "files" entries of those kernel files
    refuses: Callable = lambda spec, layout: None   # (ModelSpec, layout) -> why it cannot run the model, or None

    def lower_args(self) -> dict:
        """compiler/lower.lower_model's keywords for this backend."""
        return {"make_kernel": self.make_kernel, "backend": self.name}


BACKENDS: dict[str, KernelBackend] = {}


def register(b: KernelBackend) -> KernelBackend:
    if b.name in BACKENDS:
        raise ValueError(f"kernel backend {b.name!r} is already registered")
    BACKENDS[b.name] = b
    return b


def kernel_backend(target) -> KernelBackend:
    """The kernel backend a target's programs run on."""
    return BACKENDS[target.kernel_backend]




from . import tvm_cpu  # noqa: E402,F401  (registration lines)
from . import opencl  # noqa: E402,F401
