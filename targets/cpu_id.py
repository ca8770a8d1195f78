"""This machine's CPU as tuning results are keyed: model (vendor, family/model/stepping or ARM implementer/part),
the instruction-set features kernels may use, the cache sizes and the CPUs this process may run on.

Two machines with equal identities get the same measured knobs from the tune cache (compiler/tune); any difference
(another stepping, a VM that hides AVX-512, a smaller L3 slice, fewer CPUs) makes a new identity, measured anew."""
from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path

# /proc/cpuinfo keys that name the core (x86, then ARM)
_MODEL_KEYS = ("vendor_id", "cpu family", "model", "stepping", "model name",
               "CPU implementer", "CPU architecture", "CPU variant", "CPU part", "CPU revision")
# the features that change which code is fastest; other flags (virtualisation, mitigations) do not
_FEATURES = {"sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
             "avx512_fp16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16",
             "asimd", "asimddp", "i8mm", "fphp", "asimdhp", "sve", "sve2", "bf16"}
_SYS_CPU = Path("/sys/devices/system/cpu")


def _cpuinfo_first_block() -> dict:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return {}
    out: dict = {}
    for ln in text.splitlines():
        if not ln.strip():
            if out:
                break   # the first processor's block describes the model (big.LITTLE: see _arm_parts)
            continue
        key, _, val = ln.partition(":")
        out.setdefault(key.strip(), val.strip())
    return out


def _arm_parts() -> list[str]:
    """Every distinct ARM core part on the machine (a phone's big, middle and little cores differ)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return []
    return sorted({ln.partition(":")[2].strip() for ln in text.splitlines() if ln.startswith("CPU part")})


def _caches(cpu: int = 0) -> list[str]:
    """'L1d 32K', 'L2 1024K', ... of one CPU, from sysfs."""
    out = []
    for idx in sorted((_SYS_CPU / f"cpu{cpu}" / "cache").glob("index*")):
        try:
            level = (idx / "level").read_text().strip()
            kind = (idx / "type").read_text().strip()
            size = (idx / "size").read_text().strip()
        except OSError:
            continue
        out.append(f"L{level}{'d' if kind == 'Data' else 'i' if kind == 'Instruction' else ''} {size}")
    return out


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_identity() -> dict:
    """What the tune cache is keyed on (JSON-serialisable, stable across runs on one machine)."""
    info = _cpuinfo_first_block()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    ident = {"machine": platform.machine(), **{k: info[k] for k in _MODEL_KEYS if k in info},
             "features": sorted(flags & _FEATURES), "caches": _caches(), "cpus": usable_cpus()}
    parts = _arm_parts()
    if len(parts) > 1:
        ident["CPU parts"] = parts
    return ident


def cpu_key(ident: dict | None = None) -> str:
    """A short stable name of an identity (the tune cache's file name)."""
    blob = json.dumps(ident if ident is not None else cpu_identity(), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def cpu_label(ident: dict) -> str:
    """One line naming the CPU, e.g. 'AMD EPYC (family 25 model 17 stepping 1), 2 CPUs'."""
    name = ident.get("model name") or ident.get("CPU part") or ident.get("machine", "?")
    if "cpu family" in ident:
        name += f" (family {ident['cpu family']} model {ident.get('model', '?')} stepping {ident.get('stepping', '?')})"
    return f"{name}, {ident.get('cpus', '?')} CPUs"


def l3_bytes(ident: dict) -> int:
    """The largest cache's size in bytes (0 when unknown): the tuner streams weights from beyond it."""
    best = 0
    for c in ident.get("caches", []):
        size = c.split()[-1]
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
        try:
            best = max(best, int(size.rstrip("KMG")) * mult)
        except ValueError:
            continue
    return best
