"""Write weights.bin (aligned regions in execution order, sha256 each), SHA256SUMS, and install a finished package
directory atomically: everything is written into a temp dir beside the destination, then renamed into place.

The destination is replaced only when it is an edgellm package (a manifest that parses with a format version and a
plan.bin with the plan magic); any other existing directory is left alone, so no user file is ever deleted. Temp dirs
of compiles that were killed (SIGKILL, power loss) are removed by the next compile to the same place once their
process is gone."""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import signal
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..errors import CompileError
from ..runtime.contract import MANIFEST, PLAN, PLAN_MAGIC, SUMS, WEIGHT_ALIGN, file_sha256


def write_weights(path: Path, names: list[str], arrays: list[np.ndarray], progress: bool) -> tuple[list[dict], int]:
    """Returns the tensor table (name, offset, nbytes, shape, dtype, layout, sha256) and the file size."""
    table, off = [], 0
    total = sum(a.nbytes for a in arrays)
    with open(path, "wb") as f, tqdm(total=total, unit="B", unit_scale=True, desc="weights",
                                     disable=not progress or not sys.stderr.isatty(),
                                     leave=False) as bar:
        for name, a in zip(names, arrays):
            pad = (-off) % WEIGHT_ALIGN
            f.write(b"\0" * pad)
            off += pad
            b = np.ascontiguousarray(a).view(np.uint8).reshape(-1)
            f.write(b.data)
            table.append({"name": name, "offset": off, "nbytes": int(b.size), "shape": list(a.shape),
                          "dtype": str(a.dtype), "layout": "row-major", "sha256": hashlib.sha256(b.data).hexdigest()})
            off += b.size
            bar.update(b.size)
    return table, off


def write_sums(pkg: Path) -> str:
    """Writes SHA256SUMS (every file of the package, sha256sum format) and returns the package digest: the sha256 of
    SHA256SUMS, as "sha256:<hex>". A loader given the digest can trust every file it covers."""
    lines = []
    for f in sorted(p for p in pkg.rglob("*") if p.is_file() and p.name != SUMS):
        rel = f.relative_to(pkg).as_posix()
        lines.append(f"{file_sha256(f)}  {rel}\n")
    data = "".join(lines).encode()
    (pkg / SUMS).write_bytes(data)
    return "sha256:" + hashlib.sha256(data).hexdigest()


def is_package(path: Path) -> bool:
    """An edgellm package (of any format version): manifest.json parses to an object with an integer format_version,
    and plan.bin starts with the plan magic."""
    if not (path / MANIFEST).is_file() or not (path / PLAN).is_file():   # never open a FIFO: it would block
        return False
    try:
        m = json.loads((path / MANIFEST).read_text())
        if not isinstance(m, dict) or not isinstance(m.get("format_version"), int):
            return False
        with open(path / PLAN, "rb") as f:
            return f.read(len(PLAN_MAGIC)) == PLAN_MAGIC
    except (OSError, ValueError):
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temps(out: Path) -> None:
    """Removes `.NAME.tmp-PID-*` / `.NAME.old-PID-*` dirs beside out whose compile process no longer runs."""
    for d in out.parent.glob(f".{out.name}.*-*"):
        parts = d.name[len(out.name) + 2:].split("-")
        if len(parts) >= 2 and parts[0] in ("tmp", "old") and parts[1].isdigit() and d.is_dir() and \
                not d.is_symlink() and not _alive(int(parts[1])):
            shutil.rmtree(d, ignore_errors=True)


def check_destination(out: Path) -> Path:
    """The resolved output path, or a one-line CompileError when writing a package there would be wrong."""
    out = Path(out).expanduser()
    if not out.name or out.name in (".", ".."):
        raise CompileError(f"-o {out}: give the package a directory name of its own (e.g. -o model.edgellm)")
    resolved = out.resolve()
    cwd = Path.cwd().resolve()
    if resolved == cwd or resolved in cwd.parents:
        raise CompileError(f"-o {out} is the current directory or one of its parents: give the package a new "
                           "directory name (e.g. -o model.edgellm)")
    for parent in resolved.parents:
        if parent.exists() and not parent.is_dir():
            raise CompileError(f"cannot write the package to {out}: {parent} is a file, not a directory")
    if resolved.exists() or resolved.is_symlink():
        if not resolved.is_dir():
            raise CompileError(f"{out} exists and is not a directory: choose another output with -o")
        if any(resolved.iterdir()) and not is_package(resolved):
            raise CompileError(f"{out} exists and is not an edgellm package: refusing to overwrite it; choose another -o")
    return resolved


def user_files(pkg: Path) -> list[str]:
    """Paths (relative, POSIX) under an existing package that edgellm did not write: not in its SHA256SUMS, which
    lists every file a compile writes but itself."""
    sums = pkg / "SHA256SUMS"
    if not sums.is_file():
        raise CompileError(f"{pkg} has no SHA256SUMS, so its files cannot be told from yours: choose another -o")
    ours = {line.split(None, 1)[1].lstrip("*").strip() for line in sums.read_text(errors="replace").splitlines()
            if len(line.split(None, 1)) == 2} | {"SHA256SUMS"}
    out = []
    for root, dirs, files in os.walk(pkg):
        for name in files + [d for d in dirs if (Path(root) / d).is_symlink()]:
            rel = (Path(root) / name).relative_to(pkg).as_posix()
            if rel not in ours:
                out.append(rel)
    return sorted(out)


def keep_user_files(old: Path, new: Path) -> None:
    """Copies the files of the package being replaced that are not edgellm's (user_files) into the new one, so a
    recompile replaces only what edgellm writes; refuses when the new package writes a file of the same name."""
    mine = user_files(old)
    clash = [r for r in mine if (new / r).exists() or (new / r).is_symlink()]
    if clash:
        raise CompileError(f"{old / clash[0]} is not an edgellm file and the new package writes one of that name: "
                           "move it away or choose another -o")
    for r in mine:
        dst = new / r
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(old / r, dst, follow_symlinks=False)


class _Terminated(BaseException):
    """SIGTERM during a compile: unwinds like an interrupt, so the temp dir is removed."""


@contextmanager
def staged_package(out: Path):
    """Yields a temp dir beside `out`; on success it replaces `out` (absent, empty or an edgellm package: see
    check_destination). On any failure, including SIGTERM and a full disk, the temp dir is removed."""
    global _terminated
    out = check_destination(out)
    _terminated = False
    old_handler = None
    try:   # before the temp dir exists: a SIGTERM from here on unwinds through the clean-up below
        old_handler = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:   # not the main thread: leave signals alone
        pass
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    old = None
    try:
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            remove_stale_temps(out)
            tmp.mkdir()
        except OSError as e:
            raise CompileError(f"cannot write the package to {out}: {e.strerror or e}") from e
        yield tmp
        if _terminated:   # the handler's exception was swallowed somewhere (e.g. raised inside a __del__)
            raise _Terminated()
        if out.exists() and not is_package(out) and any(out.iterdir()):   # appeared while we compiled
            raise CompileError(f"{out} was filled with other files during the compile: refusing to overwrite it")
        if out.exists():
            keep_user_files(out, tmp)
            old = out.parent / f".{out.name}.old-{os.getpid()}-{secrets.token_hex(4)}"
            os.rename(out, old)
        os.rename(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException as e:
        if old_handler is not None:   # no second SIGTERM in the middle of the clean-up
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if old is not None and old.exists() and not out.exists():
            os.rename(old, out)   # interrupted between the two renames: the previous package goes back
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError):
            raise CompileError(f"cannot write the package to {out}: {e.strerror or e}") from e
        if isinstance(e, _Terminated):
            raise SystemExit(143) from None
        raise
    finally:
        if old_handler is not None:
            signal.signal(signal.SIGTERM, old_handler)


_terminated = False


def _raise_terminated(signum, frame):
    global _terminated
    _terminated = True
    raise _Terminated()
