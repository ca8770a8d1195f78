"""Write weights.bin (16 KiB aligned regions in execution order, sha256 each) and install a finished package
directory atomically: everything is written into a temp dir beside the destination, then renamed into place."""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..errors import CompileError
from ..runtime.package import ALIGN, MANIFEST


def write_weights(path: Path, names: list[str], arrays: list[np.ndarray], progress: bool) -> tuple[list[dict], int]:
    """Returns the tensor table (name, offset, nbytes, shape, dtype, layout, sha256) and the file size."""
    table, off = [], 0
    total = sum(a.nbytes for a in arrays)
    with open(path, "wb") as f, tqdm(total=total, unit="B", unit_scale=True, desc="weights", disable=not progress,
                                     leave=False) as bar:
        for name, a in zip(names, arrays):
            pad = (-off) % ALIGN
            f.write(b"\0" * pad)
            off += pad
            b = np.ascontiguousarray(a).view(np.uint8).reshape(-1)
            f.write(b.data)
            table.append({"name": name, "offset": off, "nbytes": int(b.size), "shape": list(a.shape),
                          "dtype": str(a.dtype), "layout": "row-major", "sha256": hashlib.sha256(b.data).hexdigest()})
            off += b.size
            bar.update(b.size)
    return table, off


@contextmanager
def staged_package(out: Path):
    """Yields a temp dir; on success it replaces `out` (only if `out` is absent, empty or an edgellm package)."""
    out = Path(out)
    if out.exists():
        if not out.is_dir():
            raise CompileError(f"{out} exists and is a file: choose another output with -o")
        if any(out.iterdir()) and not (out / MANIFEST).is_file():
            raise CompileError(f"{out} exists and is not an edgellm package: refusing to overwrite it; choose another -o")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        yield tmp
        old = None
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.rename(out, old)
        os.rename(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
