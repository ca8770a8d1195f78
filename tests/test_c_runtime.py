"""libedgellm (runtime/*.c, offload/*.c) through ctypes, against a hand-made package (tests/c/toy_package.py).

The library is built here with gcc into a temp dir (or taken from $EDGELLM_LIB); TVM is needed only to compile the
toy kernels, and those tests skip without it.
"""
from __future__ import annotations

import ctypes as C
import os
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "c"))
import toy_package as tp  # noqa: E402

CC = shutil.which("gcc") or shutil.which("cc")

# The ctypes declarations and the source list are the package's own; this test only builds its own library.
from edgellm.compiler.device_binary import LIB_SOURCES  # noqa: E402
from edgellm.compiler.device_binary import ROOT as PKG_ROOT  # noqa: E402
from edgellm.runtime.python.lib import LoadOptions, SamplerParams, Stats, declare  # noqa: E402

# the repo's copies of the sources the package builds libedgellm from (this test may run against an installed package)
# the repo's copies of the library's sources (LIB_SOURCES names the installed package's; CI installs a wheel)
SOURCES = [str(p.relative_to(PKG_ROOT)) for p in LIB_SOURCES]

F32P, I32P = C.POINTER(C.c_float), C.POINTER(C.c_int32)


def build_lib(out: Path) -> Path:
    so = out / "libedgellm.so"
    cmd = [CC, "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared", *[str(ROOT / s) for s in SOURCES],
           "-o", str(so), "-lpthread", "-ldl", "-lm"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return so


@pytest.fixture(scope="session")
def lib_path(tmp_path_factory) -> Path:
    if os.environ.get("EDGELLM_LIB"):
        return Path(os.environ["EDGELLM_LIB"])
    if not CC:
        pytest.skip("no C compiler")
    return build_lib(tmp_path_factory.mktemp("lib"))


@pytest.fixture(scope="session")
def lib(lib_path):
    return declare(C.CDLL(str(lib_path)))


@pytest.fixture(scope="session")
def kernels_so(tmp_path_factory) -> Path:
    pytest.importorskip("tvm")
    d = tmp_path_factory.mktemp("kernels")
    tp.build_kernels(d / "kernels.o")
    tp.link_kernels(d / "kernels.o", ROOT / "runtime" / "kernel_shim.c", d / "kernels.so", CC)
    return d / "kernels.so"


@pytest.fixture(scope="session")
def pkg(tmp_path_factory, kernels_so) -> Path:
    return tp.write_package(tmp_path_factory.mktemp("pkg") / "toy.edgellm", kernels_so)


@pytest.fixture(scope="session")
def ref():
    w = tp.make_weights()
    return lambda ids, routed=False: tp.reference(w, list(ids), routed)


def err(lib) -> str:
    return lib.el_last_error().decode()


def options(lib, threads=2, **kw):
    o = LoadOptions()
    lib.el_load_options_init(C.byref(o))
    o.n_threads = threads
    for k, v in kw.items():
        setattr(o, k, v)
    return o


class Loaded:
    """A model and one context over it (what el_load used to be)."""

    def __init__(self, lib, path, threads=2, **kw):
        self.lib = lib
        self.m = lib.el_model_load(str(path).encode(), C.byref(options(lib, threads, **kw)))
        assert self.m, err(lib)
        self.c = lib.el_context_new(self.m, 0)
        assert self.c, err(lib)

    def close(self):
        self.lib.el_context_free(self.c)
        self.lib.el_model_free(self.m)


def load(lib, path, threads=2, **kw) -> Loaded:
    return Loaded(lib, path, threads, **kw)


def ptr(a: np.ndarray, t=F32P):
    return a.ctypes.data_as(t)


def ctx(m):
    return m.c if isinstance(m, Loaded) else m


def prefill(lib, m, ids, all_logits=True, want_logits=True):
    ids = np.ascontiguousarray(ids, np.int32)
    out = np.full((len(ids), tp.V) if all_logits else (tp.V,), np.nan, np.float32)
    rc = lib.el_prefill(ctx(m), ptr(ids, I32P), len(ids), ptr(out) if want_logits else None, int(all_logits))
    return rc, out


def decode(lib, m, tok):
    out = np.full(tp.V, np.nan, np.float32)
    return lib.el_decode(ctx(m), tok, ptr(out)), out


# --- executor -----------------------------------------------------------------------------------------------------

def test_prefill_decode_match_reference(lib, pkg, ref):
    m = load(lib, pkg)
    try:
        assert (lib.el_vocab(m.m), lib.el_max_context(m.m), lib.el_chunk(m.m), lib.el_context_threads(m.c)) == (tp.V, 11, 4, 2)
        assert lib.el_bos_id(m.m) == 1
        eos = (C.c_int32 * 8)()
        assert lib.el_eos_ids(m.m, eos, 8) == 2 and list(eos[:2]) == [2, 3]
        seq = [5, 7, 9, 11, 13, 2, 4, 30, 1, 0, 17]
        want = ref(seq)
        # 7 tokens: a full chunk + a padded chunk of 3, all rows
        rc, lg = prefill(lib, m, seq[:7])
        assert rc == 0, err(lib)
        assert lib.el_pos(m.c) == 7
        np.testing.assert_allclose(lg, want[:7], rtol=1e-4, atol=1e-4)
        # decode continues from pos 7
        for i in (7, 8):
            rc, lg = decode(lib, m, seq[i])
            assert rc == 0, err(lib)
            np.testing.assert_allclose(lg, want[i], rtol=1e-4, atol=1e-4)
        assert lib.el_pos(m.c) == 9
        # prefill starting mid-chunk (pos 9), last row only, up to the full context
        rc, lg = prefill(lib, m, seq[9:], all_logits=False)
        assert rc == 0, err(lib)
        np.testing.assert_allclose(lg, want[10], rtol=1e-4, atol=1e-4)
        assert lib.el_pos(m.c) == 11
        # full: nothing fits, nothing changes
        rc, _ = decode(lib, m, 3)
        assert rc == -1 and "context is full (11 of 11" in err(lib)
        rc, _ = prefill(lib, m, [1])
        assert rc == -1 and "prompt of 1 tokens does not fit: context is at 11 of 11" in err(lib)
        assert lib.el_pos(m.c) == 11
        # reset: same answers again; last-row prefill of exactly one chunk, and without logits
        assert lib.el_reset(m.c) == 0 and lib.el_pos(m.c) == 0
        rc, lg = prefill(lib, m, seq[:4], all_logits=False)
        assert rc == 0
        np.testing.assert_allclose(lg, want[3], rtol=1e-4, atol=1e-4)
        rc, _ = prefill(lib, m, seq[4:6], want_logits=False)
        assert rc == 0 and lib.el_pos(m.c) == 6
        rc, lg = prefill(lib, m, seq[6:11])  # 5 tokens from pos 6: 4 + 1 padded
        assert rc == 0
        np.testing.assert_allclose(lg, want[6:11], rtol=1e-4, atol=1e-4)
    finally:
        m.close()


def test_prefill_rejects_without_state_change(lib, pkg):
    m = load(lib, pkg)
    try:
        rc, _ = prefill(lib, m, list(range(12)))
        assert rc == -1 and "prompt of 12 tokens does not fit: context is at 0 of 11" in err(lib)
        assert lib.el_prefill(m.c, (C.c_int32 * 1)(), 0, None, 0) == -1 and "at least one" in err(lib)
        rc, _ = prefill(lib, m, [1, 2, tp.V])
        assert rc == -1 and f"token id {tp.V} (at index 2) is outside the vocabulary" in err(lib)
        rc, _ = decode(lib, m, -1)
        assert rc == -1 and "outside the vocabulary" in err(lib)
        assert lib.el_pos(m.c) == 0
    finally:
        m.close()


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_threads_same_result(lib, pkg, ref, threads):
    m = load(lib, pkg, threads)
    try:
        assert lib.el_context_threads(m.c) == threads
        seq = [3, 1, 4, 1, 5, 9, 2, 6, 5]
        rc, lg = prefill(lib, m, seq[:6])
        assert rc == 0, err(lib)
        out = [lg]
        for t in seq[6:]:
            rc, lg = decode(lib, m, t)
            assert rc == 0, err(lib)
            out.append(lg[None])
        np.testing.assert_allclose(np.concatenate(out), ref(seq), rtol=1e-4, atol=1e-4)
    finally:
        m.close()


def test_read_fallback_and_stats(lib, pkg, ref):
    m = load(lib, pkg, 0, use_mmap=0)  # weights read() into (read-only) memory instead of mmap
    try:
        assert lib.el_context_threads(m.c) == os.cpu_count()
        rc, lg = prefill(lib, m, [5, 6, 7, 8, 9])
        assert rc == 0
        np.testing.assert_allclose(lg, ref([5, 6, 7, 8, 9]), rtol=1e-4, atol=1e-4)
        assert decode(lib, m, 10)[0] == 0
        s = Stats()
        lib.el_get_stats(m.c, C.byref(s))
        assert s.weight_bytes_resident == (pkg / "weights.bin").stat().st_size
        steps_body = 2 + 2 * tp.L
        assert s.kernel_calls == 2 * (steps_body + 1) + (steps_body + 1)  # 2 prefill_logits chunks + 1 decode
        assert (s.prefill_tokens, s.decode_tokens) == (5, 1)
        assert s.prefill_seconds > 0 and s.decode_seconds > 0
        lib.el_reset_stats(m.c)
        lib.el_get_stats(m.c, C.byref(s))
        assert (s.kernel_calls, s.prefill_tokens, s.decode_tokens) == (0, 0, 0)
        kv = 2 * tp.L * tp.KV_ROWS * tp.H * tp.DH * 4
        assert s.kv_bytes >= kv and s.arena_bytes >= tp.ARENA_BYTES
    finally:
        m.close()


def _thp_offered() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


@pytest.mark.parametrize("mode", ["1", "0"])
def test_weights_in_huge_pages(lib, pkg, ref, monkeypatch, mode):
    """huge_pages 1: the weights are copied into transparent huge pages (where the kernel offers them; the toy
    package is far below the automatic threshold), 0: mmapped. Same logits either way."""
    m = load(lib, pkg, 2, huge_pages=int(mode))
    try:
        rc, lg = prefill(lib, m, [4, 8, 15, 16, 23])
        assert rc == 0, err(lib)
        np.testing.assert_allclose(lg, ref([4, 8, 15, 16, 23]), rtol=1e-4, atol=1e-4)
        s = Stats()
        lib.el_get_stats(m.c, C.byref(s))
        size = (pkg / "weights.bin").stat().st_size
        assert s.weight_bytes_resident == size
        assert s.weight_bytes_huge == (size if mode == "1" and _thp_offered() else 0)
    finally:
        m.close()


def test_two_models_share_kernels(lib, pkg, ref):
    a, b = load(lib, pkg, 1), load(lib, pkg, 2)
    try:
        assert prefill(lib, a, [1, 2, 3])[0] == 0
        rc, lg = prefill(lib, b, [4, 5])
        assert rc == 0 and lib.el_pos(a.c) == 3 and lib.el_pos(b.c) == 2
        np.testing.assert_allclose(lg, ref([4, 5]), rtol=1e-4, atol=1e-4)  # b's KV cache is its own
        rc, lg = decode(lib, a, 6)
        np.testing.assert_allclose(lg, ref([1, 2, 3, 6])[-1], rtol=1e-4, atol=1e-4)
    finally:
        a.close()
        b.close()


def test_kernel_error_becomes_last_error(lib, kernels_so, tmp_path):
    # embed_4's output declared [4, 8] instead of [4, 16]: the kernel's own shape check fails at run time
    plan = tp.plan_bytes().replace(tp.arg(tp.ARENA, 0, tp.X, (tp.C, tp.D)), tp.arg(tp.ARENA, 0, tp.X, (tp.C, 8)))
    d = tp.write_package(tmp_path / "p", kernels_so)
    (d / "plan.bin").write_bytes(plan)
    m = load(lib, d)
    try:
        rc, _ = prefill(lib, m, [1, 2])
        msg = err(lib)
        assert rc == -1
        assert "kernel embed_4 failed (program prefill_logits, step 0" in msg and "x.shape[1]" in msg, msg
        assert "\n" not in msg
        assert lib.el_pos(m.c) == 0
    finally:
        m.close()


def link_variant(kernels_so: Path, tmp_path: Path, extra_c: str) -> Path:
    """kernels.so relinked with an extra C file (context-symbol variables the TVM codegen emits on demand)."""
    (tmp_path / "extra.c").write_text(extra_c)
    out = tmp_path / "kernels_extra.so"
    subprocess.run([CC, "-shared", "-fPIC", "-O2", str(kernels_so.with_suffix(".o")), str(ROOT / "runtime/kernel_shim.c"),
                    str(kernels_so.with_name("kernels_table.c")), str(tmp_path / "extra.c"), "-o", str(out), "-lm",
                    "-Wl,-Bsymbolic"], check=True)
    return out


def test_context_symbols(lib, kernels_so, ref, tmp_path):
    # a kernels.so with barriers: filled in, and every task gets its own thread (same results)
    so = link_variant(kernels_so, tmp_path, "int (*__TVMBackendParallelBarrier)(int, void*) = 0;\n"
                      "int filled(void) { return __TVMBackendParallelBarrier != 0; }\n")
    d = tp.write_package(tmp_path / "b", so)
    m = load(lib, d, 2)
    try:
        filled = C.CDLL(str(d / "kernels.so")).filled
        assert filled() == 1
        rc, lg = prefill(lib, m, [3, 4, 5, 6, 7])
        assert rc == 0
        np.testing.assert_allclose(lg, ref([3, 4, 5, 6, 7]), rtol=1e-4, atol=1e-4)
    finally:
        m.close()
    # one that makes packed calls we cannot serve: refused at load, not a crash at run time
    so = link_variant(kernels_so, tmp_path, "void* __TVMFFIFunctionCall = 0;\n")
    msg = load_error(lib, tp.write_package(tmp_path / "f", so))
    assert "kernels.so needs TVMFFIFunctionCall" in msg, msg


# --- validation ---------------------------------------------------------------------------------------------------

def variant(kernels_so, tmp_path, plan: bytes | None = None, **plan_kw) -> Path:
    d = tp.write_package(tmp_path / "v", kernels_so, **plan_kw)
    if plan is not None:
        (d / "plan.bin").write_bytes(plan)
    return d


def load_error(lib, d, **kw) -> str:
    m = lib.el_model_load(str(d).encode(), C.byref(options(lib, 1, **kw)))
    if m:
        lib.el_model_free(m)
        pytest.fail(f"el_model_load accepted {d}")
    msg = err(lib)
    assert msg and "\n" not in msg
    return msg


def patch_arg(plan: bytes, old: bytes, new: bytes) -> bytes:
    i = plan.find(old)
    assert i > 0
    return plan[:i] + new + plan[i + len(new):]


def test_missing_files(lib, kernels_so, tmp_path):
    assert "is not a package directory" in load_error(lib, tmp_path / "nope")
    d = variant(kernels_so, tmp_path)
    (d / "plan.bin").unlink()
    assert "cannot open" in load_error(lib, d) and "plan.bin" in err(lib)
    d = variant(kernels_so, tmp_path)
    (d / "kernels.so").unlink()
    assert "kernels.so" in load_error(lib, d)
    d = variant(kernels_so, tmp_path)
    (d / "weights.bin").unlink()
    assert "weights.bin" in load_error(lib, d)


def test_bad_magic_version_truncation(lib, kernels_so, tmp_path):
    plan = tp.plan_bytes()
    assert "not an edgellm plan" in load_error(lib, variant(kernels_so, tmp_path, b"XDGEPLAN" + plan[8:]))
    assert load_error(lib, variant(kernels_so, tmp_path, version=1)) == (
        f"package format version 1, this runtime reads {tp.K.PLAN_VERSION_MIN} to {tp.K.PLAN_VERSION}: recompile the "
        "package with this edgellm")
    assert "plan.bin is truncated: 100 bytes" in load_error(lib, variant(kernels_so, tmp_path, plan[:100]))
    assert "plan.bin is corrupt" in load_error(lib, variant(kernels_so, tmp_path, plan[:-10]))
    assert "unexpected bytes after the last program" in load_error(lib, variant(kernels_so, tmp_path, plan + bytes(8)))
    d = variant(kernels_so, tmp_path)
    full = (d / "weights.bin").stat().st_size
    with open(d / "weights.bin", "r+b") as f:
        f.truncate(1234)
    assert load_error(lib, d) == (f"weights.bin is truncated: 1234 bytes, plan needs {full}; recompile the package "
                                  "or copy it again")


def test_wrong_machine_and_features(lib, kernels_so, tmp_path):
    d = variant(kernels_so, tmp_path)
    so = bytearray((d / "kernels.so").read_bytes())
    so[18:20] = struct.pack("<H", 183)  # EM_AARCH64
    (d / "kernels.so").write_bytes(bytes(so))
    msg = load_error(lib, d)
    assert msg == "kernels.so was built for aarch64 (target host), this machine is x86_64: compile the package " \
                  "with --target host", msg
    # plan says aarch64 although the ELF is x86_64
    plan = bytearray(tp.plan_bytes())
    plan[12:16] = struct.pack("<I", 2)
    assert "kernels.so was built for aarch64" in load_error(lib, variant(kernels_so, tmp_path, bytes(plan)))
    (d / "kernels.so").write_bytes(b"not an elf at all, just text")
    assert "kernels.so is not an ELF shared library" in load_error(lib, d)
    # CPU features: unknown names are ignored; one this CPU lacks is named
    m = load(lib, variant(kernels_so, tmp_path, features="+sse4.2,fancy-future-thing"), 1)
    m.close()
    flags = set(open("/proc/cpuinfo").read().split())
    lacking = [f for f, c in [("avx512fp16", "avx512_fp16"), ("avx512bf16", "avx512_bf16"), ("avx512vnni", "avx512_vnni"),
                              ("avx512f", "avx512f"), ("avx2", "avx2")] if c not in flags]
    if lacking:
        msg = load_error(lib, variant(kernels_so, tmp_path, features=f"avx,{lacking[0]}"))
        assert f"kernels.so needs the CPU feature {lacking[0]}, which this CPU lacks" in msg, msg


def test_missing_kernel_and_program(lib, kernels_so, tmp_path):
    kernels = list(tp.KERNELS)
    kernels[3] = "attn_77"
    msg = load_error(lib, variant(kernels_so, tmp_path, kernels=kernels))
    assert "the kernel table of kernels.so has no attn_77" in msg, msg
    msg = load_error(lib, variant(kernels_so, tmp_path, programs=["prefill", "decode", "head"]))
    assert 'plan.bin has no program "prefill_logits"' in msg, msg
    msg = load_error(lib, variant(kernels_so, tmp_path, programs=["prefill", "prefill", "prefill_logits", "decode"]))
    assert "appears twice" in msg


OOB_CASES = [
    (tp.arg(tp.ARENA, 0, tp.LOGITS, (1, tp.V)), tp.arg(tp.ARENA, 0, tp.ARENA_BYTES - 64, (1, tp.V)), "beyond arena_bytes"),
    (tp.arg(tp.WEIGHT_ARG, 0, 0, (tp.V, tp.D)), tp.arg(tp.WEIGHT_ARG, 99, 0, (tp.V, tp.D)), "names weight 99"),
    (tp.arg(tp.WEIGHT_ARG, 0, 0, (tp.V, tp.D)), tp.arg(tp.WEIGHT_ARG, 0, 64, (tp.V, tp.D)), "of weight 0, which has"),
    (tp.arg(tp.WEIGHT_ARG, 2, 0, (4, tp.D), flags=1), tp.arg(tp.WEIGHT_ARG, 2, 0, (6, tp.D), flags=1), "of weight 2"),
    (tp.arg(tp.KCACHE, 1, 0, (4, tp.H, tp.DH), flags=1), tp.arg(tp.KCACHE, 2, 0, (4, tp.H, tp.DH), flags=1),
     "names layer 2, the model has 2"),
    (tp.arg(tp.KCACHE, 1, 0, (4, tp.H, tp.DH), flags=2), tp.arg(tp.KCACHE, 1, 0, (6, tp.H, tp.DH), flags=2),
     "of a KV cache"),
    (tp.arg(tp.KCACHE, 1, 0, (4, tp.H, tp.DH), flags=2),
     tp.arg(tp.KCACHE, 1, 0, (4, tp.H, tp.DH), flags=2)[:12] + struct.pack("<I", 5) + bytes(48), "bad shape"),
    (tp.arg(tp.KCACHE, 1, 0, (4, tp.H, tp.DH), flags=2), tp.arg(tp.KCACHE, 1, 0, (4, tp.H, tp.DH), flags=3),
     "combines flags"),
    (tp.arg(tp.KCACHE, 1, 0, (4, tp.H, tp.DH), flags=2), tp.arg(tp.KCACHE, 1, 0, (4, tp.H, tp.DH), flags=4),
     "outside a routed step"),
    # a kernel's output pointed at the weights (the embedding table): refused, it would overwrite them
    (tp.arg(tp.ARENA, 0, tp.LOGITS, (4, tp.V)), tp.arg(tp.WEIGHT_ARG, 0, 0, (4, tp.V)), "is written by its kernel"),
    # posadd's output into a K cache: posadd is not a kernel that writes the KV cache
    (tp.arg(tp.ARENA, 0, tp.A, (4, tp.D)), tp.arg(tp.KCACHE, 0, 0, (4, tp.H, tp.DH)), "not one that writes the KV"),
    (tp.arg(tp.VCACHE, 0, 0, (4, tp.H, tp.DH), flags=2), tp.arg(tp.VCACHE, 0, 0, (4, tp.H, tp.DH), (2, 16), 2),
     "views the 32-bit V cache"),
    (tp.arg(tp.ARENA, 0, tp.X, (4, tp.D)), tp.arg(9, 0, tp.X, (4, tp.D)), "unknown kind 9"),
]


@pytest.mark.parametrize("old,new,expect", OOB_CASES, ids=[c[2] for c in OOB_CASES])
def test_out_of_bounds_plan(lib, kernels_so, tmp_path, old, new, expect):
    plan = tp.plan_bytes()
    assert plan.find(old) > 0
    msg = load_error(lib, variant(kernels_so, tmp_path, patch_arg(plan, old, new)))
    assert msg.startswith("plan.bin is corrupt:") and expect in msg, msg


def test_bad_kernel_index_and_counts(lib, kernels_so, tmp_path):
    plan = bytearray(tp.plan_bytes())
    first_step = (tp.HEADER.size + tp.L * tp.K.KV_LAYER.size + len(tp.WEIGHT_ORDER) * 16 + len(tp.KERNELS) * tp.KERNEL.size
                  + tp.PROGRAM.size)
    plan[first_step + 4:first_step + 8] = struct.pack("<I", len(tp.KERNELS))
    assert f"calls kernel {len(tp.KERNELS)}, the plan has {len(tp.KERNELS)}" in load_error(
        lib, variant(kernels_so, tmp_path, bytes(plan)))
    plan = bytearray(tp.plan_bytes())
    plan[first_step + 8:first_step + 12] = struct.pack("<I", 0xFFFFFFFF)  # n_args
    assert "passes 4294967295 args to kernel embed_4, which takes 3" in load_error(
        lib, variant(kernels_so, tmp_path, bytes(plan)))
    plan[first_step:first_step + 4] = struct.pack("<I", 7)  # step kind
    assert "unknown kind 7" in load_error(lib, variant(kernels_so, tmp_path, bytes(plan)))
    for field, value, expect in [("n_weights", 1 << 31, "weight table"), ("n_programs", 99, "program 4 of 99"),
                                 ("kv_rows", 5, "kv_rows 5 < max_ctx"), ("weights_bytes", 100, "lies outside")]:
        d = variant(kernels_so, tmp_path, header_overrides={field: value})
        if field == "weights_bytes":
            with open(d / "weights.bin", "r+b") as f:
                f.truncate(100)
        assert expect in load_error(lib, d), (field, err(lib))


FUZZ = textwrap.dedent("""
    import ctypes as C, random, sys
    sys.path.insert(0, sys.argv[4])
    from edgellm.runtime.python.lib import LoadOptions, declare
    L = declare(C.CDLL(sys.argv[1]))
    d = sys.argv[2]; good = open(d + "/plan.bin", "rb").read(); rng = random.Random(1); loaded = 0
    ids = (C.c_int32 * 6)(1, 2, 3, 4, 5, 6); out = (C.c_float * (6 * 64))()
    o = LoadOptions(); L.el_load_options_init(C.byref(o)); o.n_threads = 2
    for it in range(int(sys.argv[3])):
        b = bytearray(good)
        for _ in range(rng.choice([1, 1, 2, 4, 16])):
            i = rng.randrange(len(b))
            b[i] = rng.choice([0, 1, 2, 3, 4, 8, 0x7F, 0x80, 0xFF, rng.randrange(256)])
        if rng.random() < 0.1: b = b[:rng.randrange(len(b))]
        open(d + "/plan.bin", "wb").write(bytes(b))
        m = L.el_model_load(d.encode(), C.byref(o))
        if m:
            loaded += 1
            c = L.el_context_new(m, 0)
            L.el_prefill(c, ids, 6, out, 1); L.el_decode(c, 1, out); L.el_prefill(c, ids, 5, out, 0)
            L.el_context_free(c); L.el_model_free(m)
    print("loaded", loaded)
""")


@pytest.mark.parametrize("routed", [False, True])
def test_fuzzed_plans_never_crash(lib_path, kernels_so, tmp_path, routed):
    """Random byte flips of plan.bin: the loader rejects or accepts, and an accepted plan runs or fails, never
    crashes. The weights are mapped read-only, so a flip that pointed a kernel's output at a weight would fault: the
    kernel tables (plan.bin's, checked against the one linked into kernels.so) make the loader refuse those."""
    d = variant(kernels_so, tmp_path, routed=routed)
    r = subprocess.run([sys.executable, "-c", FUZZ, str(lib_path), str(d), "600", str(ROOT.parent)],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "loaded" in r.stdout


# --- kernel tables, routed steps, files ----------------------------------------------------------------------------

def test_kernel_table_mismatch_and_absence(lib, kernels_so, tmp_path):
    # the plan claims embed_4 writes nothing but its first arg: kernels.so's own table disagrees
    table = tp.kernel_entries()
    table[0] = (table[0][0], 3, 0, 0b1)
    msg = load_error(lib, variant(kernels_so, tmp_path, table=table))
    assert "plan.bin is corrupt: kernel embed_4 takes 3 args writing 0x4" in msg, msg
    # a plan that says a kernel writes nothing at all is malformed
    table[0] = (table[0][0], 3, 0, 0)
    assert "write mask" in load_error(lib, variant(kernels_so, tmp_path, table=table))
    # kernels without a table (built by something else): refused before any kernel runs
    bare = tmp_path / "bare.so"
    subprocess.run([CC, "-shared", "-fPIC", "-O2", str(kernels_so.with_suffix(".o")), str(ROOT / "runtime/kernel_shim.c"),
                    "-o", str(bare), "-lm"], check=True)
    msg = load_error(lib, tp.write_package(tmp_path / "bare", bare))
    assert "no edgellm kernel table" in msg, msg


def test_routed_program_matches_reference(lib, kernels_so, tmp_path, ref):
    d = variant(kernels_so, tmp_path, routed=True)
    seq = [5, 7, 9, 11, 13, 2, 4, 30, 1]
    want = ref(seq, routed=True)
    assert not np.allclose(want, ref(seq)), "the routed layer must change the logits"
    experts = set()
    w = tp.make_weights()
    m = load(lib, d)
    try:
        rc, lg = prefill(lib, m, seq[:6])
        assert rc == 0, err(lib)
        np.testing.assert_allclose(lg, want[:6], rtol=1e-4, atol=1e-4)
        for i in (6, 7, 8):
            rc, lg = decode(lib, m, seq[i])
            assert rc == 0, err(lib)
            np.testing.assert_allclose(lg, want[i], rtol=1e-4, atol=1e-4)
    finally:
        m.close()
    # the sequence exercises more than one expert choice (else EXPERT offsets would go untested)
    for pos in range(len(seq)):
        y = w["E"][seq[pos]] * w["scale"] + w["P"][pos]
        experts.add(int(np.floor(abs(np.float32(y[0])) * 10)) % tp.NE)
    assert len(experts) > 1


def test_routed_step_checks(lib, kernels_so, tmp_path):
    plan = tp.plan_bytes(routed=True)
    route = tp.route(tp.RIDS, 2 * tp.C, tp.NE, 1)
    # an expert weight whose last expert (index + (NE - 1) * stride) lies past the weight table
    first = tp.WEIGHT_ORDER.index("ex0")
    old = tp.arg(tp.WEIGHT_ARG, first, 0, (tp.D,), flags=tp.EXPERT, stride=1)
    new = tp.arg(tp.WEIGHT_ARG, first, 0, (tp.D,), flags=tp.EXPERT, stride=2)
    assert "+ 3 experts x stride 2" in load_error(lib, variant(kernels_so, tmp_path, patch_arg(plan, old, new)))
    # ids outside the arena; a body longer than the program
    bad = tp.route(tp.ARENA_BYTES - 4, 2 * tp.C, tp.NE, 1)
    assert "expert ids at arena byte" in load_error(lib, variant(kernels_so, tmp_path, patch_arg(plan, route, bad)))
    bad = tp.route(tp.RIDS, 2 * tp.C, tp.NE, 9)
    assert "routed body of 9 steps" in load_error(lib, variant(kernels_so, tmp_path, patch_arg(plan, route, bad)))
    # a SLOT view that would run past the arena for the last id
    old = tp.arg(tp.ARENA, 0, tp.YD, (1, tp.D), flags=tp.SLOT)
    new = tp.arg(tp.ARENA, 0, tp.YD + 64, (1, tp.D), flags=tp.SLOT)
    assert "beyond arena_bytes" in load_error(lib, variant(kernels_so, tmp_path, patch_arg(plan, old, new)))
    # fewer experts than the router picks from: refused at run time, before any expert weight is touched
    d = variant(kernels_so, tmp_path, plan.replace(route, tp.route(tp.RIDS, 2 * tp.C, 1, 1)))
    m = load(lib, d)
    try:
        rc, _ = prefill(lib, m, [5])   # every token's second pick, (e0 + 1) % 3, or its first is >= 1
        assert rc == -1 and "selected expert" in err(lib) and lib.el_pos(m.c) == 0
    finally:
        m.close()


def test_fifo_in_place_of_files_does_not_hang(lib, kernels_so, tmp_path):
    for name in ("plan.bin", "kernels.so", "weights.bin", "tokenizer.bin"):
        d = tp.write_package(tmp_path / name, kernels_so)
        (d / name).unlink(missing_ok=True)
        os.mkfifo(d / name)
        msg = load_error(lib, d)   # a blocking open would hang the test here
        assert "not a regular file" in msg or "cannot open" in msg, (name, msg)


# --- contexts -------------------------------------------------------------------------------------------------------

def test_contexts_are_independent_and_threaded(lib, pkg, ref):
    """Two contexts of one model, each in its own thread, repeatedly: each gets exactly its sequential logits."""
    import threading

    m = lib.el_model_load(str(pkg).encode(), C.byref(options(lib, 2)))
    seqs = [[5, 7, 9, 11, 13, 2, 4], [3, 1, 4, 1, 5, 9, 2, 6]]
    want = [ref(s) for s in seqs]
    errors = []

    def work(i):
        c = lib.el_context_new(m, 1)
        try:
            for _ in range(20):
                lib.el_reset(c)
                rc, lg = prefill(lib, c, seqs[i][:5])
                assert rc == 0
                out = [lg]
                for t in seqs[i][5:]:
                    rc, lg = decode(lib, c, t)
                    assert rc == 0
                    out.append(lg[None])
                np.testing.assert_allclose(np.concatenate(out), want[i], rtol=1e-4, atol=1e-4)
        except Exception as e:  # noqa: BLE001
            errors.append(e)
        finally:
            lib.el_context_free(c)

    ts = [threading.Thread(target=work, args=(i,)) for i in (0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    lib.el_model_free(m)
    assert not errors, errors


def test_second_context_costs_kv_and_arena_only(lib, pkg):
    m = lib.el_model_load(str(pkg).encode(), C.byref(options(lib, 2)))
    a, b = lib.el_context_new(m, 0), lib.el_context_new(m, 0)
    sa, sb = Stats(), Stats()
    lib.el_get_stats(a, C.byref(sa))
    lib.el_get_stats(b, C.byref(sb))
    assert sa.context_bytes == sb.context_bytes
    # KV + arena + the kernels' argument bindings (~100 bytes an argument) + the struct: no weights, no O(model) copy
    n_args = sum(len(args) for _, args in tp.body_steps(tp.C, True)[0]) * 2 + sum(
        len(args) for _, args in tp.body_steps(1, True)[0]) + 3
    assert sb.kv_bytes + sb.arena_bytes <= sb.context_bytes <= sb.kv_bytes + sb.arena_bytes + 100 * n_args + 4096
    assert sa.weight_bytes_resident == sb.weight_bytes_resident == (pkg / "weights.bin").stat().st_size
    # the model outlives el_model_free while a context holds it
    lib.el_context_free(a)
    lib.el_model_free(m)
    assert prefill(lib, b, [1, 2, 3])[0] == 0
    lib.el_context_free(b)


# --- generation -----------------------------------------------------------------------------------------------------

def gen_params(lib, m, **kw):
    from edgellm.runtime.python.lib import GenParams

    p = GenParams()
    lib.el_gen_params_default(m, C.byref(p))
    for k, v in kw.items():
        setattr(p, k, v)
    return p


def run_generate(lib, c, prompt, p):
    from edgellm.runtime.python.lib import Event, GenResult

    ids = np.ascontiguousarray(prompt, np.int32)
    assert lib.el_generate_start(c, ptr(ids, I32P), len(ids), C.byref(p)) == 0, err(lib)
    toks, ev = [], Event()
    while True:
        r = lib.el_generate_next(c, C.byref(ev))
        assert r >= 0, err(lib)
        if r == 1:
            toks.append(ev.token)
        if r == 0 or ev.finish:
            break
    res = GenResult()
    lib.el_generate_result(c, C.byref(res))
    return toks, res, ev.token


def test_generate_greedy_stops_and_limits(lib, pkg, ref):
    m = load(lib, pkg)
    try:
        prompt = [5, 7, 9]
        # greedy: each token is the argmax of the reference logits of the sequence so far
        toks, res, _ = run_generate(lib, m.c, prompt, gen_params(lib, m.m, max_new_tokens=6, ignore_eos=1))
        seq = list(prompt)
        for t in toks:
            assert t == int(np.argmax(ref(seq)[-1]))
            seq.append(t)
        assert (res.prompt_tokens, res.generated_tokens, res.finish, res.decoded_tokens) == (3, 6, 3, 5)
        # the context ends it: 11 - 3 prompt tokens leave room for 8 generated ones (the last is never decoded)
        toks, res, _ = run_generate(lib, m.c, prompt, gen_params(lib, m.m, max_new_tokens=100, ignore_eos=1))
        assert len(toks) == 9 and res.finish == 4
        # a stop id ends it without being part of the output
        first = int(np.argmax(ref(prompt)[-1]))
        stop = (C.c_int32 * 1)(first)
        toks, res, last = run_generate(lib, m.c, prompt, gen_params(lib, m.m, max_new_tokens=5, ignore_eos=1,
                                                                    n_stop_ids=1, stop_ids=stop))
        assert toks == [] and res.finish == 2 and last == first
        # max_new_tokens 0: prefill only
        toks, res, _ = run_generate(lib, m.c, prompt, gen_params(lib, m.m, max_new_tokens=0))
        assert toks == [] and res.finish == 3
        # bad parameters: one line, nothing started
        for kw, msg in [({"temperature": float("nan")}, "temperature"), ({"top_p": 0.0}, "top_p"),
                        ({"repetition_penalty": float("inf")}, "repetition_penalty"), ({"min_p": 2.0}, "min_p"),
                        ({"max_new_tokens": -1}, "max_new_tokens")]:
            ids = (C.c_int32 * 1)(5)
            assert lib.el_generate_start(m.c, ids, 1, C.byref(gen_params(lib, m.m, **kw))) == -1
            assert msg in err(lib) and "\n" not in err(lib)
        # stop strings need tokenizer.bin, which the toy package has not
        s = (C.c_char_p * 1)(b"x")
        assert lib.el_generate_start(m.c, (C.c_int32 * 1)(5), 1, C.byref(gen_params(
            lib, m.m, n_stop_strings=1, stop_strings=C.cast(s, C.POINTER(C.c_char_p))))) == -1
        assert "tokenizer.bin" in err(lib)
    finally:
        m.close()


def test_generate_reset_cancels(lib, pkg):
    from edgellm.runtime.python.lib import Event

    m = load(lib, pkg)
    try:
        ids = (C.c_int32 * 2)(5, 6)
        assert lib.el_generate_start(m.c, ids, 2, C.byref(gen_params(lib, m.m, max_new_tokens=5, ignore_eos=1))) == 0
        ev = Event()
        assert lib.el_generate_next(m.c, C.byref(ev)) == 1
        lib.el_reset(m.c)
        assert lib.el_generate_next(m.c, C.byref(ev)) == 0 and ev.finish == 5
        assert lib.el_pos(m.c) == 0
    finally:
        m.close()


# --- sampler ------------------------------------------------------------------------------------------------------

def sampler(lib, temperature=1.0, top_k=0, top_p=1.0, rep=1.0, seed=0, min_p=0.0, presence=0.0, frequency=0.0):
    p = SamplerParams(temperature, top_k, top_p, min_p, rep, presence, frequency, seed)
    s = lib.el_sampler_new(C.byref(p))
    assert s, err(lib)
    return s


def sample(lib, s, logits, history=None, n_prompt=None):
    lg = np.array(logits, np.float32)
    h = None if history is None else np.array(history, np.int32)
    n = 0 if h is None else len(h)
    return lib.el_sample(s, ptr(lg), len(lg), None if h is None else ptr(h, I32P), n, n if n_prompt is None else n_prompt)


def test_sampler_greedy_and_ties(lib):
    s = sampler(lib, temperature=0)
    assert sample(lib, s, [0.1, 3.0, -1, 3.0, 2.9]) == 1  # ties -> lowest id
    assert sample(lib, s, [-5.0, -2.0, -3.0]) == 1
    assert sample(lib, s, [float("nan"), 1.0, 0.5]) == 1
    # vocabularies of blocks (the scan skips 16-logit blocks with vector compares): numpy's first maximum, ties and
    # NaN anywhere, a maximum in the ragged tail, all -inf
    rng = np.random.default_rng(5)
    for n in (16, 17, 49152, 49159, 262144):
        for trial in range(6):
            lg = rng.standard_normal(n).astype(np.float32)
            if trial == 1:
                lg[rng.integers(0, n, 3)] = lg.max() + 1   # a three-way tie
            if trial == 2:
                lg[rng.integers(0, n, 50)] = np.nan
            if trial == 3:
                lg[-1] = 100
            if trial == 4:
                lg[:] = -np.inf
            if trial == 5:
                lg = np.sort(lg)   # rising: every block beats the last
            want = 0 if trial == 4 else int(np.nanargmax(lg))
            assert sample(lib, s, lg) == want, (n, trial)
    lib.el_sampler_free(s)


def test_sampler_deterministic_and_filters(lib):
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(5000).astype(np.float32) * 3
    best = int(np.argmax(logits))
    draws = []
    for _ in range(2):
        s = sampler(lib, temperature=0.8, seed=1234)
        draws.append([sample(lib, s, logits) for _ in range(200)])
        lib.el_sampler_free(s)
    assert draws[0] == draws[1] and len(set(draws[0])) > 10
    s = sampler(lib, temperature=0.8, seed=99)
    assert [sample(lib, s, logits) for _ in range(50)] != draws[0][:50]
    for kw in ({"top_k": 1}, {"top_p": 1e-6}, {"top_k": 50, "top_p": 1e-6}):
        s = sampler(lib, temperature=1.5, seed=7, **kw)
        assert all(sample(lib, s, logits) == best for _ in range(50)), kw
        lib.el_sampler_free(s)
    # top_k: only the k best ever appear
    top5 = set(np.argsort(-logits)[:5].tolist())
    s = sampler(lib, temperature=5.0, top_k=5, seed=3)
    seen = {sample(lib, s, logits) for _ in range(500)}
    assert seen == top5
    # top_p: only the nucleus appears
    p = np.exp(logits - logits.max()).astype(np.float64)
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    nucleus = set(order[:int(np.searchsorted(np.cumsum(p[order]), 0.5) + 1)].tolist())
    s = sampler(lib, temperature=1.0, top_p=0.5, seed=4)
    seen = {sample(lib, s, logits) for _ in range(2000)}
    assert seen <= nucleus and len(seen) >= min(len(nucleus), 2)


@pytest.mark.parametrize("top_p,top_k,want", [(0.3, 0, {0}), (0.65, 0, {0, 1}), (0.75, 0, {0, 1, 2}),
                                               (0.95, 0, {0, 1, 2, 3}), (0.75, 2, {0, 1}), (0.5, 0, None)])
def test_sampler_nucleus_exact(lib, top_p, top_k, want):
    probs = np.array([0.1, 0.4, 0.2, 0.3]) if want is not None else np.full(6, 1 / 6)  # shuffled ids; ties
    logits = np.log(probs)
    order = np.argsort(-probs, kind="stable")  # ties -> lower id first
    if want is None:
        want = {0, 1, 2}  # six equal: mass 3/6 >= 0.5 with the three lowest ids
    else:
        want = {int(order[r]) for r in want}
    s = sampler(lib, temperature=1.0, top_p=top_p, top_k=top_k, seed=11)
    n = 6000
    counts = np.bincount([sample(lib, s, logits) for _ in range(n)], minlength=len(probs))
    assert set(np.nonzero(counts)[0].tolist()) == want
    q = np.where(np.isin(np.arange(len(probs)), list(want)), probs, 0)
    q /= q.sum()
    chi2 = sum((counts[i] - n * q[i]) ** 2 / (n * q[i]) for i in want)
    assert chi2 < 16.3, (counts, q)  # 3 dof at most: p = 0.001
    lib.el_sampler_free(s)


def test_sampler_repetition_penalty(lib):
    s = sampler(lib, temperature=0, rep=2.0)
    assert sample(lib, s, [1.0, 3.0, 2.0]) == 1
    assert sample(lib, s, [1.0, 3.0, 2.0], history=[1]) == 2  # 3/2 = 1.5 < 2
    assert sample(lib, s, [1.0, 3.0, 2.0], history=[1, 1, 1, 1]) == 2  # once per distinct id: 1.5, not 0.19
    assert sample(lib, s, [-1.0, -3.0, -1.5], history=[0]) == 2  # negative: multiplied (-2 < -1.5)
    assert sample(lib, s, [1.0, 3.0, 2.0], history=[7, -1]) == 1  # out-of-range ids are ignored
    lg = np.array([1.0, 3.0, 2.0], np.float32)
    h = np.array([1], np.int32)
    lib.el_sample(s, ptr(lg), 3, ptr(h, I32P), 1, 1)
    assert lg.tolist() == [1.0, 3.0, 2.0]  # the caller's logits are never modified
    lib.el_sampler_free(s)


def test_sampler_presence_frequency_min_p(lib):
    # presence / frequency: over the generated ids only (history after n_prompt)
    s = sampler(lib, temperature=0, presence=1.5)
    assert sample(lib, s, [1.0, 2.0, 1.9], history=[1], n_prompt=1) == 1  # id 1 is in the prompt: no penalty
    assert sample(lib, s, [1.0, 2.0, 1.9], history=[1], n_prompt=0) == 2  # generated: 2 - 1.5 < 1.9
    lib.el_sampler_free(s)
    s = sampler(lib, temperature=0, frequency=0.3)
    assert sample(lib, s, [1.0, 2.0, 1.5], history=[1], n_prompt=0) == 1     # 2 - 0.3 > 1.5
    assert sample(lib, s, [1.0, 2.0, 1.5], history=[1, 1], n_prompt=0) == 2  # 2 - 0.6 < 1.5
    lib.el_sampler_free(s)
    # min_p: only tokens with p >= min_p * p(best)
    p = np.array([0.5, 0.3, 0.12, 0.08])
    s = sampler(lib, temperature=1.0, min_p=0.5, seed=9)
    seen = {sample(lib, s, np.log(p)) for _ in range(2000)}
    assert seen == {0, 1}
    lib.el_sampler_free(s)


def test_sampler_frequencies(lib):
    p = np.array([0.5, 0.25, 0.125, 0.0625, 0.0625])
    s = sampler(lib, temperature=1.0, seed=2024)
    n = 20000
    counts = np.bincount([sample(lib, s, np.log(p)) for _ in range(n)], minlength=5)
    chi2 = (((counts - n * p) ** 2) / (n * p)).sum()
    assert chi2 < 18.5, (counts, chi2)  # chi-square, 4 dof: p = 0.001
    lib.el_sampler_free(s)


def test_sampler_bad_params(lib):
    assert not lib.el_sampler_new(C.byref(SamplerParams(1.0, 0, 1.0, 0.0, 0.0, 0.0, 0.0, 0)))
    assert "repetition_penalty" in err(lib)
    assert not lib.el_sampler_new(C.byref(SamplerParams(1.0, 0, 1.0, 0.0, float("inf"), 0.0, 0.0, 0)))
    assert not lib.el_sampler_new(None)


# --- thread pool --------------------------------------------------------------------------------------------------

def test_thread_pool_unit(tmp_path):
    if not CC:
        pytest.skip("no C compiler")
    exe = tmp_path / "pool_test"
    subprocess.run([CC, "-std=c11", "-O2", "-Wall", "-Wextra", f"-I{ROOT / 'runtime' / 'core'}",
                    str(ROOT / "tests/c/pool_test.c"), str(ROOT / "runtime/core/threadpool.c"), "-o", str(exe),
                    "-lpthread"], check=True)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("OK"), r.stderr


def test_speculation_cost_model_unit(tmp_path):
    """speculate.c's cost of a verify pass by its tokens (timed, interpolated, capped, kept by the model for its next
    contexts) and the draft count auto picks from it, untimed counts at the least they can cost
    (tests/c/spec_cost_test.c)."""
    if not CC:
        pytest.skip("no C compiler")
    exe = tmp_path / "spec_cost_test"
    subprocess.run([CC, "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", *(f"-I{ROOT / d}" for d in
                    ("runtime", "runtime/core", "offload")), str(ROOT / "tests/c/spec_cost_test.c"), "-o", str(exe),
                    "-lm", "-lpthread"], check=True)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("OK"), r.stderr


def test_version(lib):
    assert lib.el_version().decode().count(".") == 2


# --- backends by name ---------------------------------------------------------------------------------------------

def _with_backend(plan: bytes, name: bytes) -> bytes:
    """Every program of a version 4 plan renamed onto backend `name`."""
    K = tp.K
    out = bytearray(plan)
    for p in K.read_programs(plan):
        at = p["at"] + K.PROGRAM.offsets()["backend"]
        out[at:at + K.BACKEND_NAME_BYTES] = name.ljust(K.BACKEND_NAME_BYTES, b"\0")
    return bytes(out)


@pytest.mark.parametrize("version", [2, 3])
def test_older_plans_number_their_backends(lib, kernels_so, tmp_path, ref, version):
    """Plans of versions 2 and 3 give the backend as an index (the v3 program record): still read, same logits."""
    seq = [5, 7, 9, 11, 13, 2, 4]
    m = load(lib, variant(kernels_so, tmp_path, version=version))
    try:
        rc, lg = prefill(lib, m, seq)
        assert rc == 0, err(lib)
        np.testing.assert_allclose(lg, ref(seq)[:7], rtol=1e-4, atol=1e-4)
    finally:
        m.close()
    bad = bytearray(tp.plan_bytes(version=3))
    at = tp.HEADER.size + len(tp.WEIGHT_ORDER) * 16 + len(tp.KERNELS) * tp.KERNEL.size
    bad[at + tp.K.PROGRAM_V3.offsets()["backend"]] = 7
    assert "runs on backend 7, which no edgellm had" in load_error(lib, variant(kernels_so, tmp_path, bytes(bad)))


def test_unknown_backend_name_is_one_line(lib, kernels_so, tmp_path):
    msg = load_error(lib, variant(kernels_so, tmp_path, _with_backend(tp.plan_bytes(), b"nope")))
    assert 'runs on backend "nope", which this runtime does not have (it has: tvm_cpu, qnn_ort, opencl' in msg
    unterminated = _with_backend(tp.plan_bytes(), b"x" * tp.K.BACKEND_NAME_BYTES)
    assert "no NUL-terminated backend name" in load_error(lib, variant(kernels_so, tmp_path, unterminated))
    # a CPU package's programs moved onto another built-in backend: refused by that backend, in one line, before it
    # touches a driver (the fuzz campaign found PoCL initialising, and failing under ASan, for such a plan)
    msg = load_error(lib, variant(kernels_so, tmp_path, _with_backend(tp.plan_bytes(), b"opencl")))
    assert msg.startswith("this package has no OpenCL kernels (kernels.cltab)"), msg
    msg = load_error(lib, variant(kernels_so, tmp_path, _with_backend(tp.plan_bytes(), b"qnn_ort")))
    assert "qnn_ort backend runs a staged prefill's graphs" in msg, msg


def test_an_extra_backend_registers_without_touching_the_library(lib, lib_path, kernels_so, tmp_path, ref):
    """A backend built outside libedgellm (tests/c/trace_backend.c, public headers only) registers by name, a plan
    names it, and the runtime runs every program through it: it counts and delegates to tvm_cpu. Its own load
    option (trace.label) reaches it through el_load_options.backend_options, checked by name by the core."""
    so = tmp_path / "trace.so"
    subprocess.run([CC, "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared",
                    f"-I{ROOT / 'runtime'}", str(Path(__file__).parent / "c" / "trace_backend.c"), str(lib_path),
                    f"-Wl,-rpath,{lib_path.parent}", "-o", str(so)], check=True)
    trace = C.CDLL(str(so))
    assert trace.trace_register(b"tvm_cpu") == 0, err(lib)
    backend = C.addressof(C.c_char.in_dll(trace, "trace_backend"))
    assert lib.el_backend_find(b"trace") == backend
    assert lib.el_backend_register(backend) == 0  # the same backend again: a no-op
    runs = (C.c_long * 16).in_dll(trace, "trace_runs")
    counts = lambda name: C.c_long.in_dll(trace, name).value  # noqa: E731
    seq = [5, 7, 9, 11, 13, 2, 4]
    pkg = variant(kernels_so, tmp_path, _with_backend(tp.plan_bytes(), b"trace"))
    for bad, why in ((b"trace.colour=red\n", 'backend trace has no option "colour" (it takes: label)'),
                     (b"tracer.label=x\n", 'there is no backend "tracer"'),
                     (b"opencl.device=0:1\n", "device applies to android-gpu / opencl packages (OpenCL kernels); "
                                               "this package has none"),
                     (b"trace.label\n", "write it as backend.key=value")):
        assert not lib.el_model_load(str(pkg).encode(), C.byref(options(lib, backend_options=bad))), bad
        assert why in err(lib), (bad, err(lib))
    buf = C.create_string_buffer(64)
    assert lib.el_backend_options_add(buf, 64, b"trace", b"label", b"first") == 0
    assert lib.el_backend_options_add(buf, 64, b"trace", b"label", b"second one") == 0   # the last one wins
    assert lib.el_backend_options_add(buf, 64, b"trace", b"label", b"x" * 64) != 0       # does not fit: untouched
    assert lib.el_backend_options_add(buf, 64, b"trace", b"label", b"a\nb") != 0
    assert buf.value == b"trace.label=first\ntrace.label=second one\n"
    m = load(lib, pkg, backend_options=buf.value)
    try:
        assert counts("trace_opens") == 1 and counts("trace_binds") == 1
        assert C.string_at(C.addressof(C.c_char.in_dll(trace, "trace_label"))) == b"second one"
        names = [lib.el_program_name(k).decode() for k in range(4)]
        assert names == ["prefill", "prefill_logits", "decode", "head"] and lib.el_program_name(99) is None
        assert C.c_uint.in_dll(trace, "trace_programs").value == 0b1111  # the four programs the plan has
        rc, lg = prefill(lib, m, seq)
        assert rc == 0, err(lib)
        np.testing.assert_allclose(lg, ref(seq)[:7], rtol=1e-4, atol=1e-4)
        rc, lg = decode(lib, m, 30)
        assert rc == 0, err(lib)
        np.testing.assert_allclose(lg, ref(seq + [30])[7], rtol=1e-4, atol=1e-4)
        assert (runs[1], runs[2]) == (2, 1)  # two chunks of prefill_logits (4 + 3 tokens), one decode
    finally:
        m.close()
    assert counts("trace_unbinds") == 1 and counts("trace_closes") == 1


@pytest.mark.parametrize("layers,expect", [
    ([(tp.KV_ROWS, 0), (tp.KV_ROWS - 1, 0)], "layer 1 has a KV cache of 14 rows with window 0 (kv_rows 15)"),
    ([(tp.KV_ROWS + 1, 0), (tp.KV_ROWS, 0)], "layer 0 has a KV cache of 16 rows"),
    # a window cache of 3 rows past the run's room holds no window of 3 (it needs max(W, 2W - 2) = 4)
    ([(tp.KV_ROWS, 0), (3 + tp.C, 3)], "layer 1's window cache of 7 rows is too small for window 3"),
])
def test_bad_kv_tables_are_refused(lib, kernels_so, tmp_path, layers, expect):
    """plan.bin's per-layer KV table (version 5): caches bigger than kv_rows, smaller ones without a window, and
    window caches too small for their window and a run's chunk are refused at load, in one line."""
    msg = load_error(lib, variant(kernels_so, tmp_path, tp.plan_bytes(kv_layers=layers)))
    assert msg.startswith("plan.bin is corrupt:") and expect in msg, msg



def test_cached_runtime_objects_are_keyed_by_every_header(tmp_path, monkeypatch):
    """edgellm-run's cached object files (compiler/device_binary.py) change key with any header the sources include,
    core/el_internal.h among them: a stale object built against an older struct layout once linked into a binary
    that crashed."""
    import shutil

    from edgellm.compiler import device_binary as db

    copy = tmp_path / "runtime"
    shutil.copytree(db.RUNTIME, copy, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    monkeypatch.setattr(db, "RUNTIME", copy)
    assert {"core/el_internal.h", "tokenizer/tokenizer.h", "contract.h"} <= {
        str(f.relative_to(copy)) for f in copy.rglob("*.h")}
    before = db._headers_digest()
    (copy / "core" / "el_internal.h").write_bytes((copy / "core" / "el_internal.h").read_bytes() + b"\n")
    assert db._headers_digest() != before


def test_stale_library_is_named_in_a_checkout(tmp_path):
    """A C source edited after the last build of libedgellm is named in a git checkout (editable installs), and
    never outside one (an installed wheel), nor when the library is the newest file."""
    from edgellm.runtime.python.lib import stale_sources

    (tmp_path / "runtime" / "core").mkdir(parents=True)
    (tmp_path / "offload").mkdir()
    so = tmp_path / "runtime" / "_libedgellm.so"
    src, hdr, other = tmp_path / "runtime/core/context.c", tmp_path / "offload/io.h", tmp_path / "runtime/kernel_shim.c"
    for i, f in enumerate((src, hdr, other, so)):
        f.write_text("x")
        os.utime(f, (1000 + i, 1000 + i))
    assert stale_sources(so, tmp_path) == []              # no .git: an installed package
    (tmp_path / ".git").mkdir()
    assert stale_sources(so, tmp_path) == []              # built after every source
    os.utime(src, (2000, 2000))
    os.utime(other, (2000, 2000))                          # not part of libedgellm (linked into kernels.so)
    assert stale_sources(so, tmp_path) == [src]
    os.utime(hdr, (3000, 3000))
    assert stale_sources(so, tmp_path) == [hdr, src]  # in path order
