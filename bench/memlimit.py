"""Runs under a memory limit, for the benchmarks and tests of models bigger than RAM: the page-cache state of a file
(fincore, evict, warm) and a fresh cgroup-v1 memory sub-group per run (page cache charged; the group's peak usage,
failcnt and OOM kills read back; the group always removed). See shared/toolchain-notes.md "Storage I/O"."""
from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MiB = 1 << 20


# ---- page cache ------------------------------------------------------------------------------------------------
def cached_bytes(path: Path) -> int | None:
    """Bytes of the file in the page cache (fincore), None if fincore is missing or fails."""
    if not shutil.which("fincore"):
        return None
    p = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES", str(path)],
                       capture_output=True, text=True)
    try:
        return int(p.stdout.split()[0])
    except (IndexError, ValueError):
        return None


def evict(path: Path) -> int | None:
    """Drops the file from the page cache (pages still mapped by some process stay); returns what is left cached."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return cached_bytes(path)


def warm(path: Path) -> int | None:
    """Reads the file into the page cache from this process (outside any sub-group: not charged to one)."""
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(8 * MiB)
        while f.readinto(buf):
            pass
    return cached_bytes(path)


# ---- cgroup v1 memory sub-groups ---------------------------------------------------------------------------------
def cgroup_parent() -> Path | None:
    """The cgroup-v1 memory group this process is in (None: no such controller)."""
    for ln in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrl, path = ln.split(":", 2)
        if "memory" in ctrl.split(","):
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/")
    return None


def remove_stale_groups(parent: Path, prefix: str) -> None:
    """Empty sub-groups a killed earlier run of this script left (rmdir only succeeds on empty groups)."""
    for d in parent.glob(prefix + "*"):
        try:
            pid = int(d.name[len(prefix):].split("_")[0])
            os.kill(pid, 0)
            continue                            # its run is still going
        except (ValueError, ProcessLookupError):
            pass
        except PermissionError:
            continue
        try:
            d.rmdir()
        except OSError:
            pass


_seq = 0


def run_limited(cmd: list[str], limit: int, timeout: float, env: dict | None = None,
                prefix: str = "edgellm_memlimit_") -> dict:
    """Runs cmd in a fresh memory sub-group limited to `limit` bytes (swappiness 0); returns rc, output, the group's
    max_usage / failcnt / oom_kill, the child's peak RSS and wall time. The group is always removed."""
    global _seq
    _seq += 1
    parent = cgroup_parent()
    cg = parent / f"{prefix}{os.getpid()}_{_seq}"
    cg.mkdir()
    p = None
    try:
        (cg / "memory.limit_in_bytes").write_text(str(limit))
        try:
            (cg / "memory.swappiness").write_text("0")
        except OSError:
            pass
        procs = str(cg / "cgroup.procs")

        def enter():                            # in the child, before exec
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            t0 = time.perf_counter()
            p = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env, preexec_fn=enter)
            timed_out = False
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                p.kill()
                p.wait()
            wall = time.perf_counter() - t0
            out.seek(0)
            err.seek(0)
            res = {"rc": p.returncode, "timed_out": timed_out, "wall_s": wall, "stdout": out.read(),
                   "stderr": err.read()}
        stat = {}
        for k in ("max_usage_in_bytes", "failcnt", "limit_in_bytes"):
            try:
                stat[k] = int((cg / f"memory.{k}").read_text())
            except (OSError, ValueError):
                stat[k] = None
        oom = dict(ln.split() for ln in (cg / "memory.oom_control").read_text().splitlines() if ln.strip())
        res.update(peak_mib=(stat["max_usage_in_bytes"] or 0) / MiB, failcnt=stat["failcnt"],
                   limit_mib=(stat["limit_in_bytes"] or 0) / MiB, oom_kill=int(oom.get("oom_kill", 0)))
        return res
    finally:
        if p is not None and p.poll() is None:   # interrupted: end our child before removing its group
            p.kill()
            p.wait()
        for i in range(50):
            try:
                cg.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as e:
                if e.errno != errno.EBUSY or i == 49:
                    print(f"warning: could not remove cgroup {cg}: {e}", file=sys.stderr)
                    break
                time.sleep(0.1)
