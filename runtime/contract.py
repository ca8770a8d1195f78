"""The package contract, Python side: file names, format versions, plan.bin struct layouts, codes, program names.

Twin of runtime/contract.h (the C runtime reads what the compiler writes with these layouts); tests/test_contract.py
compiles the header and checks every constant, struct size and field offset against this module. Change both
together and bump PLAN_VERSION (and FORMAT_VERSION) when a layout changes. Runtime-side module: importing it never
imports TVM or the compiler.
"""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

# files of a package directory
FORMAT_VERSION = 2                      # manifest.json "format_version"
MANIFEST, PLAN, WEIGHTS, KERNELS = "manifest.json", "plan.bin", "weights.bin", "kernels.so"
TOKENIZER_BIN = "tokenizer.bin"
SUMS = "SHA256SUMS"                     # "<sha256 hex>  <path>" per file; the package digest is its sha256
# routing.bin (MoE, optional): magic, uint32 version, uint32 n_weights, uint32 calibration selections per weight
ROUTING, ROUTING_MAGIC, ROUTING_VERSION = "routing.bin", b"EDGEROUT", 1
BIN_DIR, RUNNER = "bin", "bin/edgellm-run"
REQUIRED_FILES = (MANIFEST, PLAN, WEIGHTS)   # + the kernels: kernels.so, or kernels.cl and kernels.cltab (GPU)

PLAN_MAGIC, PLAN_VERSION = b"EDGEPLAN", 8   # 3 added PREDICT steps, 4 backend names (PROGRAM), 5 KV_LAYER,
                                            # 6 PROGRAM_TREE (an older runtime would not fill the tree),
                                            # 7 PROGRAM_ROWS (nor the row count: its GEMMs would compute nothing),
                                            # 8 q4 KV rows with a minimum per block (longer rows)
PLAN_VERSION_MIN = 2                    # the oldest the runtime reads (2 and 3: PROGRAM_V3 records)
WEIGHT_ALIGN = 16 * 1024                # weight regions in weights.bin (Android page size; x86's 4 KiB divides it)
TENSOR_ALIGN = 64                       # every tensor a kernel sees (TVM's alignment assumption)
MAX_EOS = 8
MAX_ARGS_NDIM = 4

ARCH = {"x86_64": 1, "aarch64": 2}
DT_INT, DT_UINT, DT_FLOAT, DT_BFLOAT = 0, 1, 2, 4
DTYPES = {"float32": (DT_FLOAT, 32), "float16": (DT_FLOAT, 16), "bfloat16": (DT_BFLOAT, 16), "int32": (DT_INT, 32),
          "int8": (DT_INT, 8), "uint8": (DT_UINT, 8)}

ARG_ARENA, ARG_WEIGHT, ARG_KCACHE, ARG_VCACHE, ARG_SETTINGS = 0, 1, 2, 3, 4
SETTING_FFN_THRESHOLD, N_SETTINGS = 0, 4   # float32 run-time settings kernels read (ARG_SETTINGS)
FLAG_AT_POS, FLAG_PREFIX, FLAG_EXPERT, FLAG_SLOT = 1, 2, 4, 8
STEP_CALL, STEP_ROUTE, STEP_PREDICT = 0, 1, 2
# backends are named in the plan (the runtime's registry: runtime/edgellm_backend.h); these are the built-in ones,
# in the order version 2/3 plans numbered them
BACKEND_TVM_CPU, BACKEND_QNN_ORT, BACKEND_OPENCL = "tvm_cpu", "qnn_ort", "opencl"
BACKENDS = (BACKEND_TVM_CPU, BACKEND_QNN_ORT, BACKEND_OPENCL)
BACKEND_NAME_BYTES = 16
PROGRAM_SKIPS_FIRST = 1                 # program flag: calibrated without the first token; position 0 runs via decode
PROGRAM_TREE = 2                        # program flag (verify): input ids[T], then (64-aligned) int32 tree[T + 1, T]
PROGRAM_ROWS = 4                        # (verify, with TREE) then (64-aligned) int32 count[1, 16]: the real rows n at
                                        # [0, 0]; its GEMMs compute rows < n (rows past them are zeros or undefined)
ROWS_BYTES = 64                         # the row count's bytes (int32[1, 16])
# every package file's marker and version (contract.h): tokenizer.bin, kernels.cltab, npu/npu.txt
TOKENIZER_MAGIC, TOKENIZER_VERSION = b"ELTK", 1
OPENCL_TABLE_MAGIC, OPENCL_TABLE_VERSION = "edgellm-opencl", 1
NPU_MAGIC, NPU_VERSION = "edgellm-npu", 1
# android-gpu / opencl (read by runtime/backends/backend_opencl.c; written by compiler/opencl/build.py)
OPENCL_SOURCE, OPENCL_TABLE, OPENCL_CACHE_DIR = "kernels.cl", "kernels.cltab", "opencl-cache"
PROGRAMS = ("prefill", "prefill_logits", "decode", "head", "prefill_short", "npu_embed", "npu_prefill", "verify")
OPTIONAL_PROGRAMS = ("prefill_short", "npu_embed", "npu_prefill", "verify")
# android-npu (read by runtime/backends/backend_qnn_ort.c)
NPU_DIR, NPU_DESCRIPTOR, NPU_ROPE, NPU_OUTLIERS = "npu", "npu/npu.txt", "npu/rope.bin", "npu/outliers.bin"
KERNEL_WRITES_KV = 1
KERNEL_INFO_SYMBOL, KERNEL_INFO_COUNT_SYMBOL = "__edgellm_kernel_info", "__edgellm_kernel_info_count"


@dataclass(frozen=True)
class Layout:
    """A C struct of the contract: (field, struct format) pairs in order, little-endian, no implicit padding."""
    name: str
    fields: tuple[tuple[str, str], ...]

    @property
    def struct(self) -> struct.Struct:
        return struct.Struct("<" + "".join(f for _, f in self.fields))

    @property
    def size(self) -> int:
        return self.struct.size

    def offsets(self) -> dict[str, int]:
        out, at = {}, 0
        for name, fmt in self.fields:
            out[name] = at
            at += struct.calcsize("<" + fmt)
        return out

    def pack(self, **values) -> bytes:
        missing = [n for n, _ in self.fields if n not in values]
        if missing:
            raise ValueError(f"{self.name}: missing {missing}")
        flat = []
        for name, fmt in self.fields:
            v = values[name]
            flat.extend(v if fmt[:-1].isdigit() and fmt[-1] not in "sx" else [v])
        return self.struct.pack(*flat)

    def unpack(self, data: bytes, offset: int = 0) -> dict:
        vals = list(self.struct.unpack_from(data, offset))
        out = {}
        for name, fmt in self.fields:
            n = int(fmt[:-1]) if fmt[:-1].isdigit() and fmt[-1] not in "sx" else 1
            out[name] = vals[:n] if n > 1 else vals[0]
            vals = vals[n:]
        return out


SAMPLING = Layout("el_plan_sampling", (("temperature", "f"), ("top_k", "i"), ("top_p", "f"), ("min_p", "f"),
                                       ("repetition_penalty", "f"), ("presence_penalty", "f"),
                                       ("frequency_penalty", "f"), ("reserved", "I")))
HEADER = Layout("el_plan_header", (
    ("magic", "8s"), ("version", "I"), ("arch", "I"), ("features", "64s"), ("target", "32s"), ("build_id", "16s"),
    ("vocab", "I"), ("dim", "I"), ("n_layers", "I"), ("n_kv_heads", "I"), ("head_dim", "I"), ("max_ctx", "I"),
    ("chunk", "I"), ("kv_rows", "I"), ("kv_dtype_bits", "I"), ("n_weights", "I"), ("n_kernels", "I"),
    ("n_programs", "I"), ("arena_bytes", "Q"), ("weights_bytes", "Q"), ("bos_id", "i"), ("n_eos", "i"),
    ("eos_ids", f"{MAX_EOS}i"),
    *((f"sampling.{n}", f) for n, f in SAMPLING.fields)))
KV_LAYER = Layout("el_plan_kv_layer", (("rows", "I"), ("window", "I")))   # version 5, n_layers after the header
WEIGHT = Layout("el_plan_weight", (("offset", "Q"), ("nbytes", "Q")))
KERNEL = Layout("el_plan_kernel", (("name", "64s"), ("n_args", "I"), ("flags", "I"), ("writes", "Q")))
PROGRAM = Layout("el_plan_program", (("name", "24s"), ("backend", f"{BACKEND_NAME_BYTES}s"), ("tokens", "I"),
                                     ("n_steps", "I"), ("in_offset", "Q"), ("out_offset", "Q"), ("out_row_bytes", "Q"),
                                     ("flags", "I"), ("reserved", "I")))
# version 2 and 3 plans: the backend as an index into BACKENDS
PROGRAM_V3 = Layout("el_plan_program_v3", (("name", "24s"), ("tokens", "I"), ("n_steps", "I"), ("in_offset", "Q"),
                                           ("out_offset", "Q"), ("out_row_bytes", "Q"), ("backend", "I"),
                                           ("flags", "I")))
STEP = Layout("el_plan_step", (("kind", "I"), ("kernel", "I"), ("n_args", "I"), ("n_body", "I"), ("ids_offset", "Q"),
                               ("n_select", "I"), ("n_experts", "I")))
ARG = Layout("el_plan_arg", (("kind", "I"), ("index", "I"), ("dtype_code", "B"), ("dtype_bits", "B"),
                             ("dtype_lanes", "H"), ("ndim", "I"), ("flags", "I"), ("expert_stride", "I"),
                             ("offset", "Q"), ("shape", f"{MAX_ARGS_NDIM}q")))


def weights_table_at(header: dict) -> int:
    """Byte offset of plan.bin's weight table: after the header and (version 5) the per-layer KV table."""
    return HEADER.size + (header["n_layers"] * KV_LAYER.size if header["version"] >= 5 else 0)


def read_programs(plan: bytes) -> list[dict]:
    """A version >= 4 plan's program records, in order (name and backend as str; at: the record's offset), without
    their steps."""
    h = HEADER.unpack(plan)
    at = weights_table_at(h) + h["n_weights"] * WEIGHT.size + h["n_kernels"] * KERNEL.size
    out = []
    for _ in range(h["n_programs"]):
        p = PROGRAM.unpack(plan, at)
        off = at + PROGRAM.offsets()["backend"]
        out.append({**p, "at": at, "name": p["name"].rstrip(b"\0").decode(),
                    "backend": plan[off:off + BACKEND_NAME_BYTES].rstrip(b"\0").decode()})
        at += PROGRAM.size
        for _ in range(p["n_steps"]):
            at += STEP.size + STEP.unpack(plan, at)["n_args"] * ARG.size
    return out


LAYOUTS = (SAMPLING, HEADER, KV_LAYER, WEIGHT, KERNEL, PROGRAM, PROGRAM_V3, STEP, ARG)


# ---- the manifest's tensor table ----------------------------------------------------------------------------------
ROPE_TABLES = ("rope", "rope_local")   # precomputed cos/sin tables a package stores beside the checkpoint's weights


def rope_table_of(name: str) -> str | None:
    """The rope table a stored tensor name belongs to ("rope.cos" -> "rope"), or None for a checkpoint weight."""
    table, _, part = name.partition(".")
    return table if table in ROPE_TABLES and part in ("cos", "sin") else None


def weights_read_per_token(manifest: dict) -> int:
    """Bytes of weights one decode step of a dense package reads (the planned figure; `bench` reports the runtime's
    measured el_stats.decode_weight_bytes_read per token): every tensor once, except the embedding table (one row,
    unless it is tied to the lm_head) and tables the kernels index by position (rope)."""
    total = 0
    tied = not any(t["name"].startswith("lm_head.") for t in manifest["tensors"])
    for t in manifest["tensors"]:
        name = t["name"]
        if rope_table_of(name):
            continue
        if "embed_tokens" in name and t["shape"] and not tied:
            total += t["nbytes"] // max(1, t["shape"][0])
            continue
        total += t["nbytes"]
    return total


def file_sha256(f) -> str:
    """A package file's digest as SUMS lists it (hex sha256 of its bytes)."""
    h = hashlib.sha256()
    with open(f, "rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()
