"""Test helper: runs kernels of a kernels.cl / kernels.cltab pair (compiler/opencl/build.py) through pyopencl, the
way runtime/backends/backend_opencl.c does (same table, same byte-offset parameters), so single kernels can be checked
against their numpy references."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def read_table(path: Path) -> dict:
    tok = Path(path).read_text().split()
    assert tok[0] == "edgellm-opencl" and tok[1] == "1", tok[:2]
    i, kernels = 3, {}
    for _ in range(int(tok[2])):
        assert tok[i] == "kernel"
        name, nl, ns = tok[i + 1], int(tok[i + 4]), int(tok[i + 5])
        i += 6
        scratch = []
        for _ in range(ns):
            assert tok[i] == "scratch"
            scratch.append(int(tok[i + 1]))
            i += 2
        launches = []
        for _ in range(nl):
            assert tok[i] == "launch"
            cl, g, lo, npar = tok[i + 1], tuple(map(int, tok[i + 2:i + 5])), tuple(map(int, tok[i + 5:i + 8])), int(tok[i + 8])
            i += 9
            ps = []
            for _ in range(npar):
                if tok[i] == "dim":
                    ps.append(("dim", int(tok[i + 1]), int(tok[i + 2]), int(tok[i + 3])))
                    i += 4
                else:
                    ps.append((tok[i], int(tok[i + 1])))
                    i += 2
            launches.append((cl, g, lo, ps))
        kernels[name] = (scratch, launches)
    return kernels


class Kernels:
    def __init__(self, out_dir: Path):
        import pyopencl as cl

        self.cl = cl
        self.ctx = cl.Context([cl.get_platforms()[0].get_devices()[0]])
        self.q = cl.CommandQueue(self.ctx)
        self.prg = cl.Program(self.ctx, (Path(out_dir) / "kernels.cl").read_text()).build()
        self.table = read_table(Path(out_dir) / "kernels.cltab")

    def run(self, name: str, args: list[np.ndarray], written: list[int]) -> list[np.ndarray]:
        """Runs plan kernel `name` on host arrays (each its own buffer, offset 0); returns the written ones."""
        cl, mf = self.cl, self.cl.mem_flags
        scratch, launches = self.table[name]
        bufs = [cl.Buffer(self.ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(a)) for a in args]
        sbufs = [cl.Buffer(self.ctx, mf.READ_WRITE, max(n, 4)) for n in scratch]
        for clname, g, lo, ps in launches:
            k = getattr(self.prg, clname)
            vals = []
            for p in ps:
                if p[0] == "arg":
                    vals += [bufs[p[1]], np.uint64(0)]
                elif p[0] == "scratch":
                    vals += [sbufs[p[1]], np.uint64(0)]
                else:
                    v = args[p[1]].shape[p[2]]
                    vals.append(np.int64(v) if p[3] == 8 else np.int32(v))
            k(self.q, g, lo, *vals)
        out = []
        for i in written:
            a = np.empty_like(args[i])
            cl.enqueue_copy(self.q, a, bufs[i])
            out.append(a)
        self.q.finish()
        return out
