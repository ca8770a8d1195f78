"""edgellm vs llama.cpp on the same weights, same threads, same machine, in one interleaved run (issue 5).

    python bench/vs_llamacpp.py [--size small|1b|moe] [--moe] [--schemes f16,q8,q4g32,t2] [--rounds 3]
                                [--threads 2] [--ternary] [--work DIR] [--llama-bench PATH] [--json]
    python bench/vs_llamacpp.py --gguf FILE [FILE ...] [--rounds 3] ...   # GGUF files as they come

With --gguf, steps 1-3 are replaced: each file is compiled by edgellm with --quant auto (compiler/auto_quant.py: the
scheme nearest its block types at no more bits) and run by llama.cpp as it is; steps 4-5 are the same.

1. generates a seeded random Llama in Hugging Face format (f16 safetensors, written one tensor at a time):
   `small` ~110M (dim 768, 12 layers, 12 heads, ffn 2048, vocab 32000, tied embeddings) or `1b` (TinyLlama shape:
   dim 2048, 22 layers, 32 heads / 4 KV heads, ffn 5632, vocab 32000); `--ternary` makes every linear weight exactly
   absmean-ternary per row (so t2 and TQ2_0 hold the same weights losslessly); `--moe` (= `--size moe`, default
   schemes q8,q4g32) a seeded random Mixtral instead: 8 experts top-2, dim 1024, 16 layers, 16 heads / 4 KV heads,
   expert ffn 3584, vocab 32000, untied: 1.52B parameters, 0.46B active per token;
2. compiles it with edgellm for each scheme (a scheme that does not compile gets an "n/a" row), with the head type
   llama-quantize gives the matching file (q4g32 and t2: --head-quant q6 for Q6_K; q8 and f16 keep their own);
3. builds llama.cpp's llama-bench and llama-quantize from PyPI's llama-cpp-python 0.3.36 sdist (vendored llama.cpp
   commit 0c1e57098; -DGGML_NATIVE=ON; cached in the work dir) unless --llama-bench is given, writes the same weights
   as an F16 GGUF (Q/K rows permuted like convert_hf_to_gguf.py; for Mixtral, like its converter too: expert_count
   and expert_used_count keys, the router as an F32 ffn_gate_inp, each layer's experts merged into 3-D
   ffn_{gate,up,down}_exps tensors) and quantizes it: f16->F16, q8->Q8_0, q4g32->Q4_0, t2->TQ2_0 (for 8-expert
   models llama-quantize also keeps attn_k and attn_v at Q8_0 in the Q4_0 file: +1.7% bytes per token for --moe);
4. per scheme, --rounds rounds of --reps legs; per leg: memory read bandwidth (bench/membw.c), one engine's
   process (`edgellm bench --json --reps 1` for each --tune mode, `llama-bench -o json -r 1`; each warms up, then
   one timed run), bandwidth again, the other engine, bandwidth again; the same threads, prompt (-p) and generation
   (-n) lengths; the engines' order swaps every leg (a scheme edgellm cannot compile still gets its llama.cpp runs,
   so the row shows llama.cpp's side). Legs, not reps inside one process: this host's bandwidth jumps between ~30
   and ~55 GB/s for seconds to minutes, and a ratio means something only between runs seconds apart;
5. prints one table: prefill and decode tok/s (median over legs), edgellm/llama.cpp ratios (median, min-max over
   legs, each leg's ratio between its two runs), bytes of weights read per decoded token, and that traffic as % of
   the read bandwidth (per run, against the mean of the readings just before and after it; median over the legs
   whose two readings agree within STEADY, or over all where none does); with
   --moe, a line checking the MoE goals (decode >= 1.3x and prefill >= 1.2x llama.cpp for q8 and q4g32, decode
   >= 80% of the read bandwidth).
   Bytes per token: edgellm's from its bench JSON; llama.cpp's from the GGUF: every tensor, one embedding row
   unless it is also the output matrix, and for MoE the expert tensors x expert_used_count / expert_count.

Both sides time decode from a different context: llama-bench's tg test decodes -n tokens from an empty cache,
edgellm bench decodes after the -p prompt (the generate path), i.e. over a slightly longer context.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
LLAMA_CPP_PYTHON = "0.3.36"          # vendors llama.cpp 0c1e57098
SDIST = f"llama_cpp_python-{LLAMA_CPP_PYTHON}"

SIZES = {
    "small": dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                  num_attention_heads=12, num_key_value_heads=12, head_dim=64, tie_word_embeddings=True),
    "1b": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
               num_attention_heads=32, num_key_value_heads=4, head_dim=64, tie_word_embeddings=False),
    # Mixtral-shaped: 1.52B total, 0.46B active (top-2 of 8). Routers are random normal / sqrt(dim) like every
    # matrix (synthetic.iter_random_weights), so tokens spread over the experts instead of collapsing onto one.
    "moe": dict(arch="MixtralForCausalLM", vocab_size=32000, hidden_size=1024, intermediate_size=3584,
                num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                tie_word_embeddings=False, num_local_experts=8, num_experts_per_tok=2, router_jitter_noise=0.0,
                sliding_window=None),
}
MOE_SCHEMES = "q8,q4g32"
GGUF_TYPE = {"f16": "F16", "q8": "Q8_0", "q4g32": "Q4_0", "t2": "TQ2_0"}
# The lm_head type llama-quantize gives the output tensor of these files (Q6_K, 6.5625 bits; Q8_0 files keep Q8_0,
# F16 files F16), matched by edgellm's --head-quant so that both read the same head bytes per token.
HEAD_QUANT = {"q4g32": "q6", "t2": "q6"}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def report(header: str, table: str, rows: list, as_json: bool) -> list:
    """A side bench's ending: the host line on stderr, the markdown table on stdout (stderr with --json, whose one
    JSON document then has stdout to itself)."""
    print(f"host: {_cpu_name()}; {header}", file=sys.stderr)
    print(table, file=sys.stderr if as_json else sys.stdout)
    if as_json:
        print(json.dumps(rows, indent=1))
    return rows


# ---- 1. model -------------------------------------------------------------------------------------------------
def make_model(work: Path, size: str, seed: int, ternary: bool) -> Path:
    from edgellm.models.synthetic import make_checkpoint

    family = "mixtral" if SIZES[size].get("arch") == "MixtralForCausalLM" else "llama"
    d = work / "models" / f"{family}-{size}-seed{seed}{'-ternary' if ternary else ''}"
    if not (d / "config.json").is_file():
        log(f"generating {d.name} (f16 safetensors) ...")
        t0 = time.perf_counter()
        make_checkpoint(d, seed=seed, dtype="float16", tokenizer=False, ternary=ternary, streaming=True,
                        max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, **SIZES[size])
        log(f"  {time.perf_counter() - t0:.0f} s")
    return d


# ---- 2. edgellm packages --------------------------------------------------------------------------------------
PACKAGE_SOURCES = ("compiler", "quant", "runtime", "offload", "targets", "models")  # what a package is built from


@functools.cache
def source_stamp(max_context: int) -> str:
    """Fingerprint of the edgellm sources (and options) a cached package was built from: a package built before a
    kernel change must not be benchmarked as if it were current. Read once per run (the sources must not change
    during a benchmark anyway: TVMScript re-reads them while compiling)."""
    root = HERE.parent
    h = hashlib.sha256(f"max_context={max_context}".encode())
    for d in PACKAGE_SOURCES:
        for f in sorted((root / d).rglob("*")):
            if f.suffix in (".py", ".c", ".h") and f.is_file():
                h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def compile_package(work: Path, model: Path, scheme: str, max_context: int, tune: str) -> tuple[Path | None, str, float]:
    head = HEAD_QUANT.get(scheme)
    out = work / "packages" / f"{model.name}-{scheme}{f'-head-{head}' if head else ''}-tune-{tune}.edgellm"
    stamp = source_stamp(max_context)
    if (out / "manifest.json").is_file():
        if (out / "bench-stamp").is_file() and (out / "bench-stamp").read_text() == stamp:
            return out, "", float(json.loads((out / "manifest.json").read_text()).get("build", {}).get("seconds", 0))
        log(f"{out.name}: built from other sources, rebuilding")
        shutil.rmtree(out)
    log(f"edgellm compile {model.name} -q {scheme}{f' --head-quant {head}' if head else ''} --tune {tune} ...")
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "edgellm.cli", "compile", str(model), "-q", scheme, "-o", str(out),
           "--max-context", str(max_context), "--tune", tune, "--quiet"] + (["--head-quant", head] if head else [])
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        why = (p.stderr.strip().splitlines() or ["failed"])[-1]
        log(f"  {scheme}: n/a ({why})")
        return None, why, 0.0
    (out / "bench-stamp").write_text(stamp)
    secs = time.perf_counter() - t0
    log(f"  {secs:.0f} s")
    return out, "", secs


# ---- 3. llama.cpp ---------------------------------------------------------------------------------------------
# llama.cpp's AMX code at 0c1e57098 (its AMX weight buffer, used by default where -march=native has AMX-INT8:
# Sapphire Rapids and later) crashes llama-bench on Q8_0 and Q4_0 models (SIGSEGV / SIGILL, seen on a 2-vCPU Xeon
# VM whose AMX tiles work). There, the schemes it crashes on run a second build with AMX turned off (everything else
# -march=native, weight repacking on): the strongest llama.cpp that runs them. GCC lets -mno-* win over -march.
NO_AMX = ["-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
          "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"]


def llama_cpp_source(work: Path) -> Path:
    """llama.cpp's source tree (vendored in the llama-cpp-python sdist: its build files, and the models/ folder's
    vocabulary-only GGUFs and real chat templates), downloaded and unpacked once under work."""
    src = work / SDIST / "vendor" / "llama.cpp"
    if not (src / "CMakeLists.txt").is_file():
        tgz = work / f"{SDIST}.tar.gz"
        if not tgz.is_file():
            log(f"pip download llama-cpp-python=={LLAMA_CPP_PYTHON} (sdist) ...")
            work.mkdir(parents=True, exist_ok=True)
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", "llama-cpp-python", "--no-deps",
                            f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(work)], check=True)
        with tarfile.open(tgz) as t:
            t.extractall(work, filter="data")
    return src


def build_llamacpp(work: Path, jobs: int, amx: bool = True,
                   targets: tuple[str, ...] = ("llama-bench", "llama-quantize")) -> tuple[Path, ...]:
    """llama.cpp's tools (default llama-bench and llama-quantize; also e.g. llama-tokenize, llama-perplexity) built
    from the llama-cpp-python sdist; cached under work/llama-build (amx=False: work/llama-build-noamx, built with
    NO_AMX). Returns their paths, in the order asked."""
    build = work / ("llama-build" if amx else "llama-build-noamx")
    exes = tuple(build / "bin" / t for t in targets)
    if all(e.is_file() for e in exes):
        return exes
    src = llama_cpp_source(work)
    log(f"building {', '.join(targets)} (-j{jobs}, nice 19) in {build} ...")
    t0 = time.perf_counter()
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    nice = ["nice", "-n", "19"] if shutil.which("nice") else []
    subprocess.run([*nice, "cmake", "-S", str(src), "-B", str(build), *gen, "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF",
                    "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_TESTS=OFF", *([] if amx else NO_AMX)], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run([*nice, "cmake", "--build", str(build), "--target", *targets, f"-j{jobs}"],
                   check=True, stdout=subprocess.DEVNULL)
    (build / "edgellm-build.json").write_text(json.dumps({"seconds": time.perf_counter() - t0, "jobs": jobs}))
    log(f"  built in {time.perf_counter() - t0:.0f} s")
    return exes


def _safetensors_views(path: Path) -> dict[str, np.ndarray]:
    """Zero-copy (memory-mapped) arrays of a safetensors file."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    dt = {"F16": np.float16, "F32": np.float32}
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        out[name] = mm[8 + n + a: 8 + n + b].view(dt[e["dtype"]]).reshape(e["shape"])
    return out


def permute_qk(w: np.ndarray, n_head: int, n_head_kv: int | None = None) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.permute: HF rotate_half row order -> GGML's interleaved rope pairs."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class _Stacked:
    """Per-expert matrices as one [n_expert, ...] tensor, written expert by expert from the memory map: GGUFWriter
    needs only shape, dtype, nbytes and tofile, and np.stack would hold every merged tensor (~2.8 GB for --moe)
    in memory until the writer runs."""

    def __init__(self, parts: list[np.ndarray]):
        self.parts, self.dtype = parts, parts[0].dtype
        self.shape, self.nbytes = (len(parts), *parts[0].shape), sum(x.nbytes for x in parts)

    def tofile(self, f) -> None:
        for x in self.parts:
            np.ascontiguousarray(x).tofile(f)


def write_gguf(model: Path, out: Path) -> Path:
    """The checkpoint as an F16 llama GGUF (norms F32, as convert_hf_to_gguf.py writes them) with an SPM vocab:
    <s> </s> <unk>, the 256 byte tokens, then filler pieces. Mixtral as the converter writes it too: arch llama
    with expert_count / expert_used_count, the router as an F32 ffn_gate_inp (the converter and llama-quantize keep
    it F32), and the experts of each layer stacked in expert order into ffn_gate_exps (w1) and ffn_up_exps (w3)
    [n_expert, ff, dim] and ffn_down_exps (w2) [n_expert, dim, ff]."""
    import gguf

    if out.is_file():
        return out
    cfg = json.loads((model / "config.json").read_text())
    nh, nkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    hd, vocab = cfg.get("head_dim", d // nh), cfg["vocab_size"]
    w = gguf.GGUFWriter(str(out) + ".tmp", "llama")
    w.add_name(model.name)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(d)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(vocab)
    n_exp = cfg.get("num_local_experts", 0)
    if n_exp:
        w.add_expert_count(n_exp)
        w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581t{i}" for i in range(len(tokens), vocab)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    types += [gguf.TokenType.NORMAL] * (vocab - len(types))
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * 259 + [-float(i) for i in range(vocab - 259)])
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_add_bos_token(False)
    t = _safetensors_views(model / "model.safetensors")
    w.add_tensor("token_embd.weight", t["model.embed_tokens.weight"])
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.asarray(t[p + "input_layernorm.weight"], dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", permute_qk(np.asarray(t[p + "self_attn.q_proj.weight"]), nh, nh))
        w.add_tensor(f"blk.{i}.attn_k.weight", permute_qk(np.asarray(t[p + "self_attn.k_proj.weight"]), nh, nkv))
        w.add_tensor(f"blk.{i}.attn_v.weight", t[p + "self_attn.v_proj.weight"])
        w.add_tensor(f"blk.{i}.attn_output.weight", t[p + "self_attn.o_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_norm.weight",
                     np.asarray(t[p + "post_attention_layernorm.weight"], dtype=np.float32))
        if n_exp:
            m = p + "block_sparse_moe."
            w.add_tensor(f"blk.{i}.ffn_gate_inp.weight", np.asarray(t[m + "gate.weight"], dtype=np.float32))
            for gg, hf in (("gate", "w1"), ("up", "w3"), ("down", "w2")):
                w.add_tensor(f"blk.{i}.ffn_{gg}_exps.weight",
                             _Stacked([t[f"{m}experts.{e}.{hf}.weight"] for e in range(n_exp)]))
            continue
        w.add_tensor(f"blk.{i}.ffn_gate.weight", t[p + "mlp.gate_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_up.weight", t[p + "mlp.up_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_down.weight", t[p + "mlp.down_proj.weight"])
    w.add_tensor("output_norm.weight", np.asarray(t["model.norm.weight"], dtype=np.float32))
    if "lm_head.weight" in t:
        w.add_tensor("output.weight", t["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(str(out) + ".tmp", out)
    return out


def quantize_gguf(quantize: Path, f16: Path, gtype: str, threads: int) -> tuple[Path | None, str]:
    if gtype == "F16":
        return f16, ""
    out = f16.with_name(f16.name.replace("-F16.gguf", f"-{gtype}.gguf"))
    if out.is_file():
        return out, ""
    log(f"llama-quantize {gtype} ...")
    try:
        p = subprocess.run([str(quantize), str(f16), str(out) + ".tmp", gtype, str(threads)], capture_output=True,
                           text=True)
    except OSError as e:
        log(f"  {gtype}: n/a ({e})")
        return None, str(e)
    if p.returncode != 0:
        why = (p.stderr.strip().splitlines() or ["failed"])[-1]
        log(f"  {gtype}: n/a ({why})")
        return None, why
    os.replace(str(out) + ".tmp", out)
    return out, ""


def gguf_read_per_token(path: Path) -> int:
    """Bytes of weights llama.cpp reads per decoded token: all tensors, token_embd only one row unless it is also
    the output matrix (no output.weight); of MoE expert tensors (*_exps) only the expert_used_count routed
    experts' slices."""
    import gguf

    r = gguf.GGUFReader(str(path))
    names = {t.name for t in r.tensors}
    n_exp = int(r.fields["llama.expert_count"].contents()) if "llama.expert_count" in r.fields else 0
    used = int(r.fields["llama.expert_used_count"].contents()) if n_exp else 0
    total = 0
    for t in r.tensors:
        if t.name == "token_embd.weight" and "output.weight" in names:
            total += int(t.n_bytes) // int(t.shape[-1])   # GGUF shape is (n_embd, n_vocab): rows are the last dim
        elif n_exp and "_exps." in t.name:
            total += int(t.n_bytes) * used // n_exp
        else:
            total += int(t.n_bytes)
    return total


# ---- 4. runs --------------------------------------------------------------------------------------------------
def run_child(cmd: list[str]) -> tuple[str, float]:
    """stdout of a command and its own peak RSS in MB (os.wait4: per child, not the max over all children)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if p.returncode != 0:
            tail = err.read().strip().splitlines()[-3:]
            raise RuntimeError(f"{' '.join(cmd[:4])} ... exited {p.returncode}: {' | '.join(tail)}")
        return out.read(), ru.ru_maxrss / 1024


def build_membw(work: Path) -> Path:
    exe = work / "membw"
    src = HERE / "membw.c"
    if not exe.is_file() or exe.stat().st_mtime < src.stat().st_mtime:
        subprocess.run(["gcc", "-O3", "-march=native", "-pthread", str(src), "-o", str(exe)], check=True)
    return exe


def membw(exe: Path, threads: int) -> float:
    out, _ = run_child([str(exe), str(threads), "1024", "8"])
    return json.loads(out)["read_gbs_median"]


def run_edgellm(pkg: Path, a) -> dict:
    out, rss = run_child([sys.executable, "-m", "edgellm.cli", "bench", str(pkg), "--prompt-len", str(a.prompt_len),
                          "--gen-len", str(a.gen_len), "--threads", str(a.threads), "--reps", "1", "--json"])
    r = json.loads(out)
    return {"prefill": r["prefill_tok_s"], "decode": r["decode_tok_s"], "ttft_s": r["ttft_s"], "rss_mb": rss,
            "read_per_token": r["weights_read_per_token"]}


def llamacpp_crashes(bench: Path, ggufs: list[Path], threads: int) -> bool:
    """Whether llama-bench dies of a signal on any of these models (a short prefill and decode each)."""
    for g in ggufs:
        p = subprocess.run([str(bench), "-m", str(g), "-t", str(threads), "-p", "16", "-n", "2", "-r", "1"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if p.returncode < 0:
            log(f"llama-bench died of signal {-p.returncode} on {g.name}")
            return True
    return False


def host_has_amx() -> bool:
    try:
        return "amx_int8" in Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return False


def run_llamacpp(bench: Path, gguf_path: Path, a) -> dict:
    out, rss = run_child([str(bench), "-m", str(gguf_path), "-t", str(a.threads), "-p", str(a.prompt_len),
                          "-n", str(a.gen_len), "-r", "1", "-o", "json"])
    res = {"rss_mb": rss}
    for t in json.loads(out):
        key = "prefill" if t["n_prompt"] > 0 and t["n_gen"] == 0 else "decode"
        res[key] = statistics.median(t["samples_ts"])
        res["model_size"] = t["model_size"]
    return res


# ---- 5. report ------------------------------------------------------------------------------------------------
STEADY = 0.15   # bandwidth readings around a run that differ by at most this share: the host kept one state


def steady(before: float, after: float) -> bool:
    """Whether the host kept one bandwidth state through a run: its readings before and after agree within STEADY."""
    return max(before, after) <= (1 + STEADY) * min(before, after)


def steady_median(legs: list[tuple[float, bool]]) -> tuple[float, int]:
    """(median of the values of the steady legs, or of every leg where none is steady; how many legs are steady)
    of [(value, steady)]."""
    values = [v for v, ok in legs if ok] or [v for v, _ in legs]
    return statistics.median(values), sum(ok for _, ok in legs)


def summarize(rounds: list[dict], side: str = "edgellm") -> dict:
    """The summary of one edgellm side (`edgellm`: the first --tune mode; `edgellm-<mode>`: the others) against
    llama.cpp; llama.cpp's numbers alone (no ratios) where the scheme has no edgellm runs."""
    sides = [k for k in rounds[0] if k.startswith("edgellm")] + ["llamacpp"]   # in run order, as membw_gbs
    names = {"edgellm": side, "llamacpp": "llamacpp"} if side in sides else {"llamacpp": "llamacpp"}
    runs = {k: [r[name] for r in rounds] for k, name in names.items()}
    s = {}
    for k in ("prefill", "decode"):
        s[k] = {who: statistics.median(x[k] for x in runs[who]) for who in names}
        if "edgellm" in names:
            ratios = [x[k] / y[k] for x, y in zip(runs["edgellm"], runs["llamacpp"])]
            s[k].update(ratio=statistics.median(ratios), ratio_min=min(ratios), ratio_max=max(ratios))
    s["membw_gbs"] = statistics.median(b for r in rounds for b in r["membw_gbs"])
    s["read_per_token"] = {who: runs[who][0]["read_per_token"] for who in names}
    # The share of bandwidth is taken per run, against the mean of the membw readings just before and just after
    # it (bandwidth on shared hosts moves by 1.5x within a round), then the median over the legs whose two readings
    # agree (within STEADY): where they disagree the host switched between its slow and fast states (here ~33 and
    # ~55 GB/s) somewhere around the run, and their mean is neither state, so the share it gives is off by up to
    # 1.5x either way. Over every leg where none is steady.
    def share(r, who, name):   # (% of the bandwidth, steady) of that run, by the readings just before and after it
        i = r.get("order", sides).index(name)
        bw = r["membw_gbs"][i:i + 2]
        return 100 * s["read_per_token"][who] * r[name]["decode"] / (statistics.mean(bw) * 1e9), steady(*bw)

    s["bw_pct"], s["bw_legs"] = {}, {}
    for who, name in names.items():
        s["bw_pct"][who], s["bw_legs"][who] = steady_median([share(r, who, name) for r in rounds])
    s["peak_rss_mb"] = {who: max(x["rss_mb"] for x in runs[who]) for who in names}
    return s


def tune_gain(rounds: list[dict], other: str) -> dict:
    """Per phase, the first tune mode's tok/s over another mode's (median over rounds of the per-round ratio)."""
    return {k: statistics.median(r["edgellm"][k] / r[other][k] for r in rounds) for k in ("prefill", "decode")}


def tune_table(result: dict) -> str:
    """What the first --tune mode bought over each other mode, and that mode against llama.cpp."""
    modes = result["meta"].get("tune", [])
    if len(modes) < 2:
        return ""
    lines = [f"\n| scheme | --tune | prefill x llama.cpp | decode x llama.cpp | decode % of mem BW | "
             f"{modes[0]} / this mode: prefill | decode | compile s |", "|" + "---|" * 8]
    for scheme, r in result["schemes"].items():
        for m in modes:
            if m not in r.get("by_tune", {}):
                continue
            s, g = r["by_tune"][m], r.get("tune_gain", {}).get(m)
            gain = f"{g['prefill']:.2f} | {g['decode']:.2f}" if g else "1 | 1"
            lines.append(f"| {scheme} | {m} | {s['prefill']['ratio']:.2f} | {s['decode']['ratio']:.2f} | "
                         f"{s['bw_pct']['edgellm']:.0f} | {gain} | {r['compile_seconds'].get(m, 0):.0f} |")
    return "\n".join(lines) if len(lines) > 2 else ""   # no scheme ran edgellm: no table


def table(result: dict) -> str:
    hdr = ("| scheme (llama.cpp) | prefill tok/s edgellm / llama.cpp | ratio (min-max) | decode tok/s edgellm / llama.cpp "
           "| ratio (min-max) | weights read/token MB edgellm / llama.cpp | % of mem BW edgellm / llama.cpp |")
    lines = [hdr, "|" + "---|" * 7]
    for scheme, r in result["schemes"].items():
        name = r.get("label") or (f"{scheme} ({GGUF_TYPE.get(scheme, '?')})"
                                  + (f", head {HEAD_QUANT[scheme]} (Q6_K)" if scheme in HEAD_QUANT else ""))
        if "summary" not in r:
            lines.append(f"| {name} | n/a | | n/a | | | {r.get('error', '')} |")
            continue
        s = r["summary"]
        p, d, rb, bw = s["prefill"], s["decode"], s["read_per_token"], s["bw_pct"]
        if "edgellm" not in p:   # edgellm n/a, llama.cpp measured
            lines.append(f"| {name} | n/a / {p['llamacpp']:.1f} | {r.get('error', '')} | n/a / {d['llamacpp']:.1f} | "
                         f"| n/a / {rb['llamacpp'] / 1e6:.1f} | n/a / {bw['llamacpp']:.0f} |")
            continue
        lines.append(f"| {name} | {p['edgellm']:.1f} / {p['llamacpp']:.1f} | {p['ratio']:.2f} ({p['ratio_min']:.2f}-"
                     f"{p['ratio_max']:.2f}) | {d['edgellm']:.1f} / {d['llamacpp']:.1f} | {d['ratio']:.2f} "
                     f"({d['ratio_min']:.2f}-{d['ratio_max']:.2f}) | {rb['edgellm'] / 1e6:.1f} / "
                     f"{rb['llamacpp'] / 1e6:.1f} | {bw['edgellm']:.0f} / {bw['llamacpp']:.0f} "
                     f"({s['bw_legs']['edgellm']} / {s['bw_legs']['llamacpp']} of {len(r['rounds'])}) |")
    m = result["meta"]
    bws = [b for r in result["schemes"].values() if "summary" in r for rd in r.get("rounds", ()) for b in rd["membw_gbs"]]
    lines.append(f"\n{m['model']}: {m['threads']} threads, prompt {m['prompt_len']}, generate {m['gen_len']}, "
                 f"{m['rounds']} rounds x {m['reps']} interleaved legs (medians over legs); "
                 f"edgellm --tune {m.get('tune', ['?'])[0]}; llama.cpp {m['llamacpp']}; CPU {m.get('cpu', '?')}; "
                 f"read bandwidth ({m['threads']} threads) {min(bws, default=0):.1f}-{max(bws, default=0):.1f} GB/s; "
                 f"% of mem BW: median over the legs whose readings before and after the run agree within "
                 f"{STEADY:.0%} (in brackets: how many; all legs where none)")
    if m.get("moe"):
        lines.append(moe_goals(result))
    return "\n".join(lines)


# The MoE targets: decode and prefill against llama.cpp on the same weights, and decode bandwidth on the bytes
# actually read (the routed experts only), for the two schemes that matter on device.
MOE_GOALS = {"schemes": ("q4g32", "q8"), "decode_x": 1.3, "prefill_x": 1.2, "prefill_len": 128, "decode_bw_pct": 80}


def moe_goals(result: dict) -> str:
    g, m = MOE_GOALS, result["meta"]
    plen = "" if m["prompt_len"] == g["prefill_len"] else f" (measured at {m['prompt_len']}: not comparable)"
    out = [f"MoE goals (edgellm --tune {m.get('tune', ['?'])[0]}): decode >= {g['decode_x']}x llama.cpp, prefill "
           f"({g['prefill_len']} tokens{plen}) >= {g['prefill_x']}x, decode >= {g['decode_bw_pct']}% of read "
           f"bandwidth on the bytes read"]
    for scheme in g["schemes"]:
        s = result["schemes"].get(scheme, {}).get("summary")
        if s is None or "ratio" not in s["decode"]:
            out.append(f"  {scheme}: n/a")
            continue
        d, p, bw = s["decode"]["ratio"], s["prefill"]["ratio"], s["bw_pct"]["edgellm"]
        out.append(f"  {scheme}: decode {d:.2f}x {'met' if d >= g['decode_x'] else 'MISSED'}, "
                   f"prefill {p:.2f}x {'met' if p >= g['prefill_x'] else 'MISSED'}, "
                   f"decode {bw:.0f}% of BW {'met' if bw >= g['decode_bw_pct'] else 'MISSED'}")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--moe", action="store_true", help=f"the Mixtral model: --size moe, default --schemes {MOE_SCHEMES}")
    ap.add_argument("--schemes", default=None, help="comma list of " + ",".join(GGUF_TYPE)
                    + f" [default: f16,q8,q4g32,t2; {MOE_SCHEMES} for MoE]")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3,
                    help="legs per round: each engine runs once per leg, the order swapped every leg")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ternary", action="store_true", help="exactly absmean-ternary linear weights (per row)")
    ap.add_argument("--work", default=os.path.expanduser("~/.cache/edgellm/bench"))
    ap.add_argument("--llama-bench", default=None, help="use this llama-bench instead of building one")
    ap.add_argument("--llama-quantize", default=None, help="[default: llama-quantize beside --llama-bench]")
    ap.add_argument("--jobs", type=int, default=2, help="build parallelism for llama.cpp")
    ap.add_argument("--tune", default="quick,off",
                    help="edgellm compile --tune modes, comma list: the first is the main table's edgellm, the others "
                         "run interleaved beside it and get a table of what tuning bought (default quick,off)")
    ap.add_argument("--json", action="store_true", help="print the whole result as JSON (the table goes to stderr)")
    ap.add_argument("--gguf", nargs="+", default=None, metavar="FILE",
                    help="instead of a generated model: these GGUF files, each compiled with --quant auto (the "
                         "schemes nearest its block types) and run by llama.cpp as it is")
    a = ap.parse_args(argv)
    if a.moe:
        a.size = "moe"
    moe = "num_local_experts" in SIZES[a.size]
    if a.schemes is None:
        a.schemes = MOE_SCHEMES if moe else "f16,q8,q4g32,t2"
    modes = [m.strip() for m in a.tune.split(",") if m.strip()]
    if not modes or any(m not in ("off", "quick", "full") for m in modes) or len(set(modes)) != len(modes):
        ap.error(f"--tune {a.tune}: a comma list of distinct off, quick, full")
    schemes = [s.strip() for s in a.schemes.split(",") if s.strip()]
    bad = [s for s in schemes if s not in GGUF_TYPE]
    if bad or a.rounds < 1:
        ap.error(f"unknown scheme(s) {bad}: choose from {','.join(GGUF_TYPE)}" if bad else "--rounds must be >= 1")
    try:
        import gguf  # noqa: F401
    except ImportError:
        ap.error("the GGUF writer is missing: pip install gguf")
    work = Path(a.work).expanduser()
    work.mkdir(parents=True, exist_ok=True)

    if a.llama_bench:
        lbench = Path(a.llama_bench)
        if not lbench.is_file():
            ap.error(f"--llama-bench {lbench} does not exist")
        lquant = Path(a.llama_quantize) if a.llama_quantize else lbench.with_name("llama-quantize")
        version = str(lbench)
    else:
        lbench, lquant = build_llamacpp(work, a.jobs)
        version = f"0c1e57098 (llama-cpp-python {LLAMA_CPP_PYTHON} sdist), GGML_NATIVE=ON"
    files = {}
    if a.gguf:   # the files as they come: llama.cpp runs each, edgellm compiles each with --quant auto
        files = {Path(f).name: Path(f).expanduser().resolve() for f in a.gguf}
        missing = [str(f) for f in files.values() if not f.is_file()]
        if missing:
            ap.error(f"--gguf: no such file: {', '.join(missing)}")
        schemes, moe = list(files), False
    mbw = build_membw(work)
    max_ctx = max(256, a.prompt_len + a.gen_len)
    if files:
        label = "GGUF files (edgellm --quant auto)"
    else:
        model = make_model(work, a.size, a.seed, a.ternary)
        (work / "gguf").mkdir(exist_ok=True)
        f16 = write_gguf(model, work / "gguf" / f"{model.name}-F16.gguf")
        views = _safetensors_views(model / "model.safetensors")
        n_params = sum(v.size for v in views.values())
        label = f"{model.name} ({n_params / 1e6:.0f}M params)"
    if moe:
        cfg = SIZES[a.size]
        n_exp = sum(v.size for k, v in views.items() if ".experts." in k)
        active = n_params - n_exp + n_exp * cfg["num_experts_per_tok"] // cfg["num_local_experts"]
        label = (f"{model.name} ({n_params / 1e6:.0f}M params, {active / 1e6:.0f}M active: "
                 f"{cfg['num_experts_per_tok']} of {cfg['num_local_experts']} experts)")
        del views

    result = {"meta": {"model": label, "moe": moe,
                       "threads": a.threads, "prompt_len": a.prompt_len, "gen_len": a.gen_len, "rounds": a.rounds,
                       "reps": a.reps, "llamacpp": version, "cpu": _cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M"),
                       "tune": modes},
              "schemes": {}}
    todo = {}
    sides = {m: "edgellm" if i == 0 else f"edgellm-{m}" for i, m in enumerate(modes)}
    for s in schemes:
        pkgs, why, secs = {}, "", {}
        for m in modes:
            pkg, why, secs[m] = compile_package(work, files.get(s) or model, "auto" if files else s, max_ctx, m)
            if pkg is None:
                break
            pkgs[m] = pkg
        if len(pkgs) < len(modes):   # edgellm n/a: llama.cpp still runs, so the row has its side
            pkgs = {}
        gg, why2 = (files[s], "") if files else quantize_gguf(lquant, f16, GGUF_TYPE[s], a.threads)
        result["schemes"][s] = {"packages": {m: str(p) for m, p in pkgs.items()}, "gguf": str(gg) if gg else None,
                                "compile_seconds": secs}
        if files and pkgs:   # what --quant auto chose, for the table
            q = json.loads((next(iter(pkgs.values())) / "manifest.json").read_text())["quant"]
            result["schemes"][s]["label"] = f"{s} (edgellm {q['scheme']}, head {q['head']})"
        if not pkgs or gg is None:
            result["schemes"][s]["error"] = f"llama.cpp: {why2}" if gg is None else f"edgellm: {why}"
        if gg is not None:
            todo[s] = (pkgs, gg)
    # per scheme, the native build unless it crashes on that scheme's model (then the build without AMX, which is
    # slower where the native one works: F16 decode 9 vs 11 tok/s on the Xeon)
    lbenches = {s: lbench for s in todo}
    if not a.llama_bench and host_has_amx():
        crashed = [s for s, (_, gg) in todo.items() if llamacpp_crashes(lbench, [gg], a.threads)]
        if crashed:
            no_amx, _ = build_llamacpp(work, a.jobs, amx=False)
            lbenches.update({s: no_amx for s in crashed})
            version += f"; AMX off for {', '.join(crashed)} (the AMX build crashed on {'them' if crashed[1:] else 'it'})"
            result["meta"]["llamacpp"] = version
    read_lc = {s: gguf_read_per_token(gg) for s, (_, gg) in todo.items()}
    for s, (pkgs, gg) in todo.items():
        by_side = {sides[m]: pkg for m, pkg in pkgs.items()}
        rounds, failed = [], False   # one entry per leg: a round is --reps legs, each engine run once per leg
        for i in range(a.rounds):
            for j in range(a.reps):
                # membw | one engine | membw | the other | membw, the engines' order swapped every leg: this host's
                # bandwidth jumps between ~30 and ~55 GB/s for seconds to minutes, so each ratio is taken between
                # runs seconds apart, and neither engine always runs first
                order = list(by_side) + ["llamacpp"]
                if (i * a.reps + j) % 2:
                    order = order[-1:] + order[:-1]
                try:
                    rd = {"membw_gbs": [membw(mbw, a.threads)], "order": order}
                    for who in order:
                        if who == "llamacpp":
                            rd[who] = run_llamacpp(lbenches[s], gg, a) | {"read_per_token": read_lc[s]}
                        else:
                            rd[who] = run_edgellm(by_side[who], a)
                        rd["membw_gbs"].append(membw(mbw, a.threads))
                except (OSError, RuntimeError, json.JSONDecodeError, KeyError) as ex:
                    result["schemes"][s]["error"] = str(ex)
                    log(f"{s}: n/a ({ex})")
                    failed = True
                    break
                rounds.append(rd)
                lc = rd["llamacpp"]
                log(f"{s} round {i + 1}/{a.rounds} leg {j + 1}/{a.reps}: bw "
                    f"{'/'.join(f'{b:.1f}' for b in rd['membw_gbs'])} GB/s | "
                    + "".join(f"{sides[m]} prefill {rd[sides[m]]['prefill']:.1f} decode {rd[sides[m]]['decode']:.1f} | "
                              for m in pkgs)
                    + f"llama.cpp prefill {lc['prefill']:.1f} decode {lc['decode']:.1f} tok/s")
            if failed:
                break
        else:
            result["schemes"][s]["rounds"] = rounds
            result["schemes"][s]["summary"] = summarize(rounds)
            if pkgs:
                result["schemes"][s]["by_tune"] = {m: summarize(rounds, sides[m]) for m in modes}
                result["schemes"][s]["tune_gain"] = {m: tune_gain(rounds, sides[m]) for m in modes[1:]}
    out = work / f"result-{'gguf' if files else a.size}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=1))
    t = table(result) + tune_table(result)
    if a.json:
        log(t)
        print(json.dumps(result, indent=1))
    else:
        print(t)
    log(f"(result saved to {out})")


def _cpu_name() -> str:
    from edgellm.targets.cpu_id import cpu_identity, cpu_label

    return cpu_label(cpu_identity())


if __name__ == "__main__":
    main()
