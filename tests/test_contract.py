"""The package contract is written twice, runtime/contract.py (the compiler writes with it) and runtime/contract.h
(the C runtime reads with it); the C API structs twice too, runtime/edgellm.h and runtime/python/lib.py (ctypes). This
compiles a probe against the headers and checks every constant, struct size and field offset against Python."""
from __future__ import annotations

import ctypes as C
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from edgellm.runtime import contract as K
from edgellm.runtime.python import lib as L

ROOT = Path(__file__).resolve().parents[1]
CC = shutil.which("gcc") or shutil.which("cc")

# C expression -> the Python value it must equal
CONSTANTS = {
    "EL_FORMAT_VERSION": K.FORMAT_VERSION, "EL_PLAN_VERSION": K.PLAN_VERSION,
    "EL_PLAN_VERSION_MIN": K.PLAN_VERSION_MIN, "EL_PLAN_MAGIC": K.PLAN_MAGIC.decode(),
    "EL_FILE_MANIFEST": K.MANIFEST, "EL_FILE_PLAN": K.PLAN, "EL_FILE_WEIGHTS": K.WEIGHTS, "EL_FILE_KERNELS": K.KERNELS,
    "EL_FILE_ROUTING": K.ROUTING, "EL_ROUTING_MAGIC": K.ROUTING_MAGIC.decode(), "EL_ROUTING_VERSION": K.ROUTING_VERSION,
    "EL_TOKENIZER_MAGIC": K.TOKENIZER_MAGIC.decode(), "EL_TOKENIZER_VERSION": K.TOKENIZER_VERSION,
    "EL_OPENCL_TABLE_MAGIC": K.OPENCL_TABLE_MAGIC, "EL_OPENCL_TABLE_VERSION": K.OPENCL_TABLE_VERSION,
    "EL_NPU_MAGIC": K.NPU_MAGIC, "EL_NPU_VERSION": K.NPU_VERSION,
    "EL_FILE_TOKENIZER": K.TOKENIZER_BIN, "EL_FILE_SUMS": K.SUMS, "EL_DIR_BIN": K.BIN_DIR, "EL_FILE_RUNNER": K.RUNNER,
    "EL_WEIGHT_ALIGN": K.WEIGHT_ALIGN, "EL_TENSOR_ALIGN": K.TENSOR_ALIGN, "EL_MAX_EOS": K.MAX_EOS,
    "EL_MAX_ARGS_NDIM": K.MAX_ARGS_NDIM, "EL_ARCH_X86_64": K.ARCH["x86_64"], "EL_ARCH_AARCH64": K.ARCH["aarch64"],
    "EL_DT_INT": K.DT_INT, "EL_DT_UINT": K.DT_UINT, "EL_DT_FLOAT": K.DT_FLOAT, "EL_DT_BFLOAT": K.DT_BFLOAT,
    "EL_ARG_ARENA": K.ARG_ARENA, "EL_ARG_WEIGHT": K.ARG_WEIGHT, "EL_ARG_KCACHE": K.ARG_KCACHE,
    "EL_ARG_VCACHE": K.ARG_VCACHE, "EL_FLAG_AT_POS": K.FLAG_AT_POS, "EL_FLAG_PREFIX": K.FLAG_PREFIX,
    "EL_FLAG_EXPERT": K.FLAG_EXPERT, "EL_FLAG_SLOT": K.FLAG_SLOT, "EL_STEP_CALL": K.STEP_CALL,
    "EL_STEP_ROUTE": K.STEP_ROUTE,
    "EL_STEP_PREDICT": K.STEP_PREDICT, "EL_BACKEND_NAME_BYTES": K.BACKEND_NAME_BYTES, "EL_ARG_SETTINGS": K.ARG_SETTINGS,
    "EL_SETTING_FFN_THRESHOLD": K.SETTING_FFN_THRESHOLD, "EL_N_SETTINGS": K.N_SETTINGS,
    "EL_PROGRAM_SKIPS_FIRST": K.PROGRAM_SKIPS_FIRST, "EL_PROGRAM_TREE": K.PROGRAM_TREE,
    "EL_PROGRAM_ROWS": K.PROGRAM_ROWS, "EL_ROWS_BYTES": K.ROWS_BYTES,
    "EL_FILE_OPENCL_SOURCE": K.OPENCL_SOURCE, "EL_FILE_OPENCL_TABLE": K.OPENCL_TABLE, "EL_DIR_OPENCL_CACHE": K.OPENCL_CACHE_DIR,
    "EL_KERNEL_WRITES_KV": K.KERNEL_WRITES_KV,
    "EL_KERNEL_INFO_SYMBOL": K.KERNEL_INFO_SYMBOL, "EL_KERNEL_INFO_COUNT_SYMBOL": K.KERNEL_INFO_COUNT_SYMBOL,
}


def probe_source() -> str:
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "contract.h"', '#include "edgellm.h"',
             'int main(void) {']
    for name in CONSTANTS:
        fmt = "%s" if isinstance(CONSTANTS[name], str) else "%lld"
        cast = "" if fmt == "%s" else "(long long)"
        lines.append(f'  printf("{name}={fmt}\\n", {cast}{name});')
    lines.append('  { const char* n[] = EL_PROGRAM_NAMES; for (size_t i = 0; i < sizeof n / sizeof *n; i++) '
                 'printf("program.%zu=%s\\n", i, n[i]); }')
    for lay in K.LAYOUTS:
        lines.append(f'  printf("{lay.name}.sizeof=%zu\\n", sizeof({lay.name}));')
        for field in lay.offsets():
            lines.append(f'  printf("{lay.name}.{field}=%zu\\n", offsetof({lay.name}, {field}));')
    for cname, st in L.STRUCTS.items():
        lines.append(f'  printf("{cname}.sizeof=%zu\\n", sizeof({cname}));')
        for field, _ in st._fields_:
            lines.append(f'  printf("{cname}.{field}=%zu\\n", offsetof({cname}, {field}));')
    lines.append("  return 0;\n}\n")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> dict[str, str]:
    if not CC:
        pytest.skip("no C compiler")
    d = tmp_path_factory.mktemp("probe")
    (d / "probe.c").write_text(probe_source())
    subprocess.run([CC, "-std=c11", "-Wall", f"-I{ROOT / 'runtime'}", str(d / "probe.c"), "-o", str(d / "probe")],
                   check=True, capture_output=True, text=True)
    out = subprocess.run([str(d / "probe")], check=True, capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines())


def test_constants_agree(probe):
    for name, want in CONSTANTS.items():
        got = probe[name]
        assert (got if isinstance(want, str) else int(got)) == want, name
    names = {int(k.split(".")[1]): v for k, v in probe.items() if k.startswith("program.")}
    assert tuple(names[i] for i in range(len(names))) == K.PROGRAMS


@pytest.mark.parametrize("layout", K.LAYOUTS, ids=[x.name for x in K.LAYOUTS])
def test_plan_layouts_agree(probe, layout):
    assert int(probe[f"{layout.name}.sizeof"]) == layout.size
    for field, off in layout.offsets().items():
        assert int(probe[f"{layout.name}.{field}"]) == off, field


@pytest.mark.parametrize("cname", sorted(L.STRUCTS))
def test_api_structs_agree(probe, cname):
    st = L.STRUCTS[cname]
    assert int(probe[f"{cname}.sizeof"]) == C.sizeof(st)
    for field, _ in st._fields_:
        assert int(probe[f"{cname}.{field}"]) == getattr(st, field).offset, field


def test_every_header_define_is_checked():
    """A new constant in contract.h must get its Python twin (and a line in CONSTANTS)."""
    text = (ROOT / "runtime" / "contract.h").read_text()
    defined = set(re.findall(r"#define (EL_[A-Z0-9_]+) ", text)) | set(re.findall(r"\b(EL_[A-Z0-9_]+) = ", text))
    defined -= {"EL_PROGRAM_NAMES"}
    assert defined <= set(CONSTANTS), sorted(defined - set(CONSTANTS))


def test_library_sources_agree():
    """pyproject.toml's libedgellm and compiler/device_binary.py's edgellm-run are built from the same sources."""
    from edgellm.compiler.device_binary import LIB_SOURCES

    ext = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["ext-modules"][0]
    from edgellm.compiler.device_binary import ROOT as PKG_ROOT   # the installed package's root (CI: a wheel)

    assert sorted(ext["sources"]) == sorted(str(p.relative_to(PKG_ROOT)) for p in LIB_SOURCES)


def test_plan_writer_round_trip(tmp_path):
    """What compiler/plan_writer.py writes parses back with the contract's layouts."""
    from types import SimpleNamespace

    from edgellm.compiler.program import Arg, Program, Step
    from edgellm.compiler.plan_writer import write_plan

    spec = SimpleNamespace(vocab_size=10, hidden_size=4, n_layers=1, n_kv_heads=1, head_dim=4, eos_token_ids=(2, 3),
                           bos_token_id=1)
    prog = Program("decode", 1, [Step(0, [Arg(K.ARG_ARENA, 0, "int32", (1,)), Arg(K.ARG_WEIGHT, 0, "float32", (10, 4)),
                                          Arg(K.ARG_ARENA, 0, "float32", (1, 4), 0, 64)])], 0, 64, 16, 128)
    write_plan(tmp_path / "plan.bin", arch="x86_64", features=["avx2"], target="host", build_id=bytes(16), spec=spec,
               max_ctx=8, chunk=4, kv_rows=12, weight_regions=[(0, 160)], weights_bytes=160,
               kernels=[("embed", 3, 0, 4)], programs=[prog], sampling={"temperature": 0.7, "top_k": 5})
    b = (tmp_path / "plan.bin").read_bytes()
    h = K.HEADER.unpack(b)
    assert h["magic"] == K.PLAN_MAGIC and h["version"] in (K.PLAN_VERSION_MIN, K.PLAN_VERSION) and h["eos_ids"][:2] == [2, 3]
    assert abs(h["sampling.temperature"] - 0.7) < 1e-6 and h["sampling.top_k"] == 5 and h["sampling.top_p"] == 1.0
    at = K.weights_table_at(h) + K.WEIGHT.size
    k = K.KERNEL.unpack(b, at)
    assert k["name"].rstrip(b"\0") == b"embed" and (k["n_args"], k["writes"]) == (3, 4)
    p = K.PROGRAM.unpack(b, at + K.KERNEL.size)
    assert p["name"].rstrip(b"\0") == b"decode" and p["n_steps"] == 1
    assert p["backend"].rstrip(b"\0").decode() == K.BACKEND_TVM_CPU and h["version"] == K.PLAN_VERSION
    s = K.STEP.unpack(b, at + K.KERNEL.size + K.PROGRAM.size)
    assert (s["kind"], s["kernel"], s["n_args"]) == (K.STEP_CALL, 0, 3)
    assert len(b) == at + K.KERNEL.size + K.PROGRAM.size + K.STEP.size + 3 * K.ARG.size


# Every file of a package, with the test that writes it with the compiler and reads it back with the C runtime (the
# full round trip; each needs a compiled package, so it lives beside its feature), the Python writer and the C reader.
FORMATS = {
    "plan.bin": ("test_c_runtime.py::test_prefill_decode_match_reference", "compiler/plan_writer.py",
                 "runtime/core/plan.c"),
    "manifest.json": ("test_packaging.py", "compiler/package_writer.py", "runtime/python/package.py"),
    "weights.bin": ("test_c_runtime.py::test_prefill_decode_match_reference", "compiler/package_writer.py",
                    "offload/resident.c"),
    "tokenizer.bin": ("test_c_tokenizer.py::test_ids_match_hf", "compiler/tokenizer_pack.py",
                      "runtime/tokenizer/tokenizer.c"),
    "kernels.cltab": ("test_opencl.py::test_same_tokens_and_logits_as_the_cpu", "compiler/opencl/build.py",
                      "runtime/backends/backend_opencl.c"),
    "npu/npu.txt": ("test_npu_f16.py::test_runtime_without_a_soc", "compiler/onnx_qnn/package.py",
                    "runtime/backends/backend_qnn_ort.c"),
    "routing.bin": ("test_moe_offload.py::test_hot_experts_are_read_at_load", "compiler/expert_guess.py",
                    "runtime/core/loader.c"),
}


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_format_has_its_round_trip(name):
    """Each package file has a writer, a reader and a round-trip test that exist; the markers and versions the
    binary and text formats start with come from the contract on both sides (no literal of its own on either)."""
    test, writer, reader = FORMATS[name]
    module, _, func = test.partition("::")
    src = (ROOT / "tests" / module).read_text()
    assert not func or re.search(rf"^def {func}\(", src, re.M), test
    assert (ROOT / writer).is_file() and (ROOT / reader).is_file()
    markers = {"tokenizer.bin": ("ELTK", "EL_TOKENIZER_MAGIC", "K.TOKENIZER_MAGIC"),
               "kernels.cltab": ("edgellm-opencl", "EL_OPENCL_TABLE_MAGIC", "K.OPENCL_TABLE_MAGIC"),
               "npu/npu.txt": ("edgellm-npu", "EL_NPU_MAGIC", "NPU_MAGIC"),
               "routing.bin": ("EDGEROUT", "EL_ROUTING_MAGIC", "ROUTING_MAGIC"),
               "plan.bin": ("EDGEPLAN", "EL_PLAN_MAGIC", "K.PLAN_MAGIC")}.get(name)
    if markers:
        literal, c_name, py_name = markers
        c_src, py_src = (ROOT / reader).read_text(), (ROOT / writer).read_text()
        assert f'"{literal}' not in c_src and c_name in c_src, (reader, c_name)
        assert f'"{literal}' not in py_src and py_name in py_src, (writer, py_name)
