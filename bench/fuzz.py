"""Mutation fuzzing of packages: every file a loader reads, mutated, then loaded and run through the Python Runtime
(which drives libedgellm and its C tokenizer) and through the package's bin/edgellm-run.

    python bench/fuzz.py --per-file 2000                 # a campaign on a fresh tiny package
    python bench/fuzz.py --per-file 500 --sanitize       # libedgellm and edgellm-run built with ASan + UBSan
    python bench/fuzz.py --package PKG --files plan.bin  # an existing package, one file

Each mutation ends in one of:
    error      a one-line EdgeLLMError (Python) / a one-line "error:" and exit 1 (edgellm-run)
    same       accepted, and the same tokens as the unmutated package
    different  accepted, other tokens (weights.bin bytes, sampling defaults, vocabulary strings ...)
    traceback  an exception other than EdgeLLMError, or an edgellm-run failure that is not one clean line
    crash      the process died (signal, sanitizer report)
    hang       no answer within the time limit
The last three are bugs. Mutations run in a worker process that is restarted after a crash or hang, so a campaign
costs one model load per mutation, not one Python start.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = ("plan.bin", "manifest.json", "weights.bin", "tokenizer.bin", "tokenizer.json")
# the files each package kind adds to FILES (--kind)
KIND_FILES = {"host": (), "opencl": ("kernels.cltab", "kernels.cl"), "host-npu": ("npu/npu.txt", "npu/rope.bin"),
              "moe": ("routing.bin",), "bundled": ()}
# how the worker loads each kind (the paths a mutation should reach), and edgellm-run's every other probe
KIND_LOAD = {"host-npu": {"prefill_backend": "npu", "npu_soc": "sm8650"}, "moe": {"weight_policy": "experts"},
             "bundled": {"weight_policy": "window", "ffn_threshold": 0.5}}
# what a text table's token may become: numbers at and past every limit, and paths out of the package
TOKENS = ["0", "-1", "1", "2", "7", "64", "65536", "2147483648", "18446744073709551615", "99999999999999999999", "nan",
          "inf", "-inf", "1e30", "-50", "../../../etc/passwd", "/etc/passwd", "npu/../../x", "", "kernel", "launch"]
BAD = ("crash", "hang", "traceback")
PROMPT_IDS = [5, 17, 33, 2, 9]
PROMPT_TEXT = "def read_config(path):"
INTERESTING = [0, 1, 2, 3, 4, 7, 8, 15, 16, 31, 63, 64, 255, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 1 << 31]

# ---------------------------------------------------------------------------------------------------- mutations


def _flip(b: bytearray, rng: random.Random) -> bytearray:
    for _ in range(rng.choice([1, 1, 2, 4, 16])):
        if not b:
            break
        i = rng.randrange(len(b))
        b[i] = rng.choice([0, 1, 2, 3, 4, 8, 0x7F, 0x80, 0xFF, rng.randrange(256)])
    return b


def _u32_field(b: bytearray, rng: random.Random, start: int = 0) -> bytearray:
    """A 4-byte aligned field set to an interesting value (struct fields are 4/8-byte aligned)."""
    if len(b) < start + 4:
        return _flip(b, rng)
    i = start + 4 * rng.randrange((len(b) - start) // 4)
    v = rng.choice(INTERESTING + [rng.randrange(1 << 32)])
    b[i:i + 4] = struct.pack("<I", v & 0xFFFFFFFF)
    return b


def _plan_record(b: bytearray, rng: random.Random) -> bytearray:
    """One field of one plan record (an arg, step, kernel or program) set to another valid-looking value: the
    mutations that make a plan lie consistently (e.g. a kernel's output turned into a weight view)."""
    from edgellm.runtime import contract as K

    try:
        h = K.HEADER.unpack(bytes(b))
        at = K.weights_table_at(h) + h["n_weights"] * K.WEIGHT.size + h["n_kernels"] * K.KERNEL.size
        args, progs = [], []
        for _ in range(h["n_programs"]):
            p = K.PROGRAM.unpack(bytes(b), at)
            progs.append(at)
            at += K.PROGRAM.size
            for _ in range(p["n_steps"]):
                s = K.STEP.unpack(bytes(b), at)
                at += K.STEP.size
                for _ in range(s["n_args"]):
                    args.append(at)
                    at += K.ARG.size
    except (struct.error, KeyError):
        return _flip(b, rng)
    if progs and rng.random() < 0.1:  # a program moved onto another backend (or one no runtime has)
        o = rng.choice(progs) + K.PROGRAM.offsets()["backend"]
        name = rng.choice(K.BACKENDS + ("", "trace", "x" * K.BACKEND_NAME_BYTES)).encode()
        b[o:o + K.BACKEND_NAME_BYTES] = name[:K.BACKEND_NAME_BYTES].ljust(K.BACKEND_NAME_BYTES, b"\0")
        return b
    if not args:
        return _flip(b, rng)
    a = rng.choice(args)
    off = K.ARG.offsets()
    field = rng.choice(["kind", "index", "flags", "offset", "shape", "expert_stride"])
    if field == "kind":
        b[a + off["kind"]:a + off["kind"] + 4] = struct.pack("<I", rng.choice([0, 1, 2, 3, 1, 1]))
        if rng.random() < 0.5:
            b[a + off["index"]:a + off["index"] + 4] = struct.pack("<I", rng.randrange(4))
    elif field == "index":
        b[a + off["index"]:a + off["index"] + 4] = struct.pack("<I", rng.choice(INTERESTING + [rng.randrange(64)]))
    elif field == "flags":
        b[a + off["flags"]:a + off["flags"] + 4] = struct.pack("<I", rng.choice([0, 1, 2, 3, 4, 8, 16]))
    elif field == "offset":
        b[a + off["offset"]:a + off["offset"] + 8] = struct.pack("<Q", rng.choice([0, 64, 128, 4096, 1 << 20, 1 << 40,
                                                                                   rng.randrange(1 << 16) * 64]))
    elif field == "shape":
        d = rng.randrange(4)
        b[a + off["shape"] + 8 * d:a + off["shape"] + 8 * d + 8] = struct.pack("<q", rng.choice(
            [0, 1, 2, 7, 64, 1 << 20, -1, 1 << 40]))
    else:
        b[a + off["expert_stride"]:a + off["expert_stride"] + 4] = struct.pack("<I", rng.choice([0, 1, 5]))
    return b


def _json(b: bytearray, rng: random.Random) -> bytearray:
    """A JSON-aware edit: a key removed, or a value replaced by one of the wrong type or range."""
    try:
        doc = json.loads(bytes(b))
    except ValueError:
        return _flip(b, rng)
    paths = []

    def walk(node, path, depth):
        if depth > 6 or len(paths) > 5000:
            return
        if isinstance(node, dict):
            for k, v in node.items():
                paths.append(path + [k])
                walk(v, path + [k], depth + 1)
        elif isinstance(node, list):
            for i, v in enumerate(node[:50]):
                paths.append(path + [i])
                walk(v, path + [i], depth + 1)

    walk(doc, [], 0)
    if not paths:
        return _flip(b, rng)
    path = rng.choice(paths)
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    key = path[-1]
    if isinstance(parent, dict) and rng.random() < 0.25:
        del parent[key]
    else:
        parent[key] = rng.choice([None, -1, 0, 1, 2**31, 2**64, -(2**63), 1e308, "x", "", [], {}, True, [1, 2],
                                  {"a": 1}, "\udcff" if False else "\u2581", 0.5])
    return bytearray(json.dumps(doc).encode())


def _text_tokens(b: bytearray, rng: random.Random) -> bytearray:
    """A whitespace-separated table (kernels.cltab, npu/npu.txt) with tokens replaced, duplicated or dropped."""
    lines = b.decode("utf-8", "replace").split("\n")
    for _ in range(rng.choice([1, 1, 2, 3])):
        i = rng.randrange(len(lines))
        toks = lines[i].split(" ")
        j = rng.randrange(len(toks))
        op = rng.random()
        if op < 0.6:
            toks[j] = rng.choice(TOKENS + [str(rng.randrange(1 << rng.choice([4, 16, 32, 64])))])
        elif op < 0.8:
            toks.insert(j, toks[j])
        else:
            del toks[j]
        lines[i] = " ".join(toks)
        if rng.random() < 0.1:   # a whole line repeated or dropped
            lines.insert(i, lines[i]) if rng.random() < 0.5 else lines.pop(i)
    return bytearray("\n".join(lines).encode())


def _f32_field(b: bytearray, rng: random.Random) -> bytearray:
    """A float32 table with values set to NaN, infinities, huge or denormal numbers."""
    if len(b) < 4:
        return _flip(b, rng)
    for _ in range(rng.choice([1, 1, 4, 64])):
        i = 4 * rng.randrange(len(b) // 4)
        b[i:i + 4] = struct.pack("<f", rng.choice([float("nan"), float("inf"), -float("inf"), 3e38, 1e-40, 2.0, -17.0]))
    return b


def mutate(name: str, data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    r = rng.random()
    if r < 0.08:
        return bytes(b[:rng.randrange(len(b) + 1)])   # truncated (possibly empty)
    if r < 0.12:
        return bytes(b + bytes(rng.randrange(1, 4096)))   # extended
    if name == "plan.bin":
        return bytes((_plan_record if r < 0.6 else _u32_field if r < 0.75 else _flip)(b, rng))
    if name in ("kernels.cltab", "npu/npu.txt"):
        return bytes((_text_tokens if r < 0.7 else _flip)(b, rng))
    if name == "npu/rope.bin":
        return bytes((_f32_field if r < 0.6 else _flip)(b, rng))
    if name == "routing.bin":
        return bytes((_u32_field if r < 0.6 else _flip)(b, rng))
    if name.endswith(".json"):
        return bytes((_json if r < 0.75 else _flip)(b, rng))
    if name == "tokenizer.bin":
        b = (_u32_field if r < 0.5 else _flip)(b, rng)
        if rng.random() < 0.8 and len(b) >= 64:   # a valid CRC, so the mutation reaches the parser behind the check
            b[60:64] = struct.pack("<I", zlib.crc32(bytes(b[64:])) & 0xFFFFFFFF)
            if rng.random() < 0.5:
                b[56:60] = struct.pack("<I", len(b))
        return bytes(b)
    return bytes(_flip(b, rng))   # weights.bin


# ------------------------------------------------------------------------------------------------------- worker

def _probe(pkg: Path) -> dict:
    """Load and generate through the Python Runtime; the outcome of one mutation."""
    import edgellm
    from edgellm.errors import EdgeLLMError

    try:
        extra = json.loads(os.environ.get("EDGELLM_FUZZ_LOAD", "{}"))   # e.g. host-npu: prefill on the NPU
        with edgellm.Runtime.load(pkg, threads=2, **extra) as rt:
            a = rt.generate(PROMPT_IDS, max_new_tokens=4, temperature=0, ignore_eos=True).token_ids
            b = rt.generate(PROMPT_TEXT, max_new_tokens=3, seed=1, stop=["\n\n"]).token_ids if rt.text.available \
                or rt.c_text else []
            return {"kind": "ok", "tokens": [a, b]}
    except EdgeLLMError as e:
        msg = str(e)
        return {"kind": "error" if msg and "\n" not in msg else "traceback", "msg": msg[:300]}
    except BaseException as e:  # noqa: BLE001 - what we are looking for
        return {"kind": "traceback", "msg": f"{type(e).__name__}: {str(e)[:300]}"}


def _probe_runner(pkg: Path, timeout: float, extra: list[str] | None = None) -> dict:
    """The package's own bin/edgellm-run (the C front end: its loader, tokenizer and loop)."""
    exe = pkg / "bin" / "edgellm-run"
    if not exe.is_file():
        return {"kind": "ok", "tokens": None}
    try:
        r = subprocess.run([str(exe), str(pkg), "-p", PROMPT_TEXT, "-n", "4", "--temperature", "0", "--ignore-eos",
                            "--threads", "2", "--stop", "\n\n", *(extra or [])], capture_output=True, text=True,
                           timeout=timeout, errors="replace")
    except subprocess.TimeoutExpired:
        return {"kind": "hang"}
    if r.returncode < 0 or "Sanitizer" in r.stderr or "runtime error:" in r.stderr:
        return {"kind": "crash", "msg": r.stderr[-500:]}
    if r.returncode == 0:
        return {"kind": "ok", "tokens": r.stdout}
    lines = r.stderr.strip().splitlines()
    return {"kind": "error" if len(lines) == 1 and "error" in lines[0] else "traceback", "msg": r.stderr[-300:]}


def worker() -> None:
    """Reads {"pkg": dir} lines, answers with one JSON outcome each (the parent applies the mutation first)."""
    for line in sys.stdin:
        job = json.loads(line)
        out = _probe(Path(job["pkg"]))
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


class Worker:
    def __init__(self, env: dict):
        self.env, self.p = env, None

    def ask(self, pkg: Path, timeout: float) -> dict:
        import select

        if self.p is None or self.p.poll() is not None:
            self.p = subprocess.Popen([sys.executable, __file__, "--worker"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env)
        self.p.stdin.write(json.dumps({"pkg": str(pkg)}) + "\n")
        self.p.stdin.flush()
        ready, _, _ = select.select([self.p.stdout], [], [], timeout)
        if not ready:
            self.kill()
            return {"kind": "hang"}
        line = self.p.stdout.readline()
        if not line:
            err = self.p.stderr.read()[-800:] if self.p.stderr else ""
            self.kill()
            return {"kind": "crash", "msg": err}
        return json.loads(line)

    def kill(self) -> None:
        if self.p is not None:
            self.p.kill()
            self.p.wait()
            self.p = None


# --------------------------------------------------------------------------------------------------------- driver

def make_package(work: Path, kind: str = "host") -> Path:
    """A tiny f32 package of a seeded Llama with the demo tokenizer (C tokenizer and HF tokenizer both present), for
    this CPU (host), PoCL's OpenCL device (opencl) or the HTP emulator beside this CPU (host-npu, SM8650 EPContext);
    moe: a seeded Mixtral (routing.bin, guessers, the expert cache); bundled: the Llama with --layout bundled."""
    import edgellm
    from edgellm.models.demo import DEMO_DIR
    from edgellm.models.synthetic import make_checkpoint

    ck = make_checkpoint(work / "ckpt", "MixtralForCausalLM" if kind == "moe" else "LlamaForCausalLM", seed=3,
                         vocab_size=4096)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(DEMO_DIR / "demo-llama" / f, ck / f)
    extra = {"npu_chunk": 16, "soc": "sm8650"} if kind == "host-npu" else {"layout": "bundled"} \
        if kind == "bundled" else {}
    target = kind if kind in ("opencl", "host-npu") else "host"
    return edgellm.compile(str(ck), target=target, quant="f32", out=work / "pkg.edgellm", max_context=64,
                           prefill_chunk=8, tune="off", progress=False, **extra)


def sanitizer_env(work: Path) -> dict:
    """libedgellm built with ASan + UBSan (every report fatal), preloaded into the worker."""
    from edgellm.compiler.device_binary import LIB_SOURCES

    so = work / "libedgellm-asan.so"
    flags = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g", "-O1"]
    subprocess.run(["gcc", "-std=c11", *flags, "-fPIC", "-shared", *map(str, LIB_SOURCES), f"-I{ROOT / 'runtime'}",
                    f"-I{ROOT / 'offload'}", "-o", str(so), "-lpthread", "-ldl", "-lm"], check=True)
    asan = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    ubsan = subprocess.run(["gcc", "-print-file-name=libubsan.so"], capture_output=True, text=True).stdout.strip()
    return {"EDGELLM_LIB": str(so), "LD_PRELOAD": f"{asan}:{ubsan}",
            "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1", "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}


def sanitized_runner(pkg: Path) -> None:
    """Rebuilds the package's bin/edgellm-run with ASan + UBSan (host targets only)."""
    from edgellm.compiler.device_binary import CLI, LIB_SOURCES

    flags = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-g", "-O1"]
    subprocess.run(["gcc", "-std=c11", *flags, str(CLI), *map(str, LIB_SOURCES), f"-I{ROOT / 'runtime'}",
                    f"-I{ROOT / 'offload'}", "-o", str(pkg / "bin" / "edgellm-run"), "-lpthread", "-ldl", "-lm"],
                   check=True)


def campaign(pkg: Path, files, per_file: int, seed: int = 0, sanitize: bool = False, timeout: float = 30.0,
             runner: bool = True, log=None, policy: str = "window") -> dict:
    """Runs per_file mutations of each file; returns {file: Counter(outcome)} and the bad cases under "bad"."""
    work = Path(tempfile.mkdtemp(prefix="edgellm-fuzz-"))
    try:
        env = dict(os.environ)
        target = work / "pkg"
        shutil.copytree(pkg, target, symlinks=True)
        (target / "SHA256SUMS").unlink(missing_ok=True)   # not read unless a digest is given
        if sanitize:
            env.update(sanitizer_env(work))
            sanitized_runner(target)
        w = Worker(env)
        base = w.ask(target, timeout * 4)
        if base["kind"] != "ok":
            raise SystemExit(f"the unmutated package does not run: {base}")
        base_runner = _probe_runner(target, timeout)
        # every other edgellm-run probe streams half the weights through the window store (offload/window.c), so
        # mutated plans and weights reach its layout, reads and ring as well as the resident store
        from edgellm.runtime.python.api import Runtime

        window = []
        if runner and policy == "window":   # (CPU packages: the other kinds keep their weights resident)
            plan = Runtime.plan(target, memory_budget=1 << 40, weight_policy="window", direct_io=True)
            window = ["--memory-budget", str(plan["weights_bytes"] // 2 + plan["context_bytes"] + plan["cache_bytes"]),
                      "--weight-policy", "window", "--direct-io"]
        elif runner:   # MoE: the expert cache, experts read from the file when selected or guessed
            window = ["--weight-policy", policy, "--direct-io"]
        results: dict = {"bad": []}
        rng = random.Random(seed)
        for name in files:
            orig = (pkg / name).read_bytes() if (pkg / name).is_file() else None
            if orig is None:
                continue
            counts = collections.Counter()
            # a changed OpenCL source misses every compile cache: each probe that compiles pays the full OpenCL C
            # build the unmutated package's first load paid, so it gets the same allowance (12 s here on a loaded
            # host, past 30 s with four jobs on two cores: three such probes were reported as hangs)
            limit = timeout * 4 if name == "kernels.cl" else timeout
            for i in range(per_file):
                data = mutate(name, orig, rng)
                (target / name).write_bytes(data)
                out = w.ask(target, limit)
                kind = out["kind"]
                if kind == "ok":
                    kind = "same" if out["tokens"] == base["tokens"] else "different"
                if runner and kind not in BAD:
                    ro = _probe_runner(target, timeout, window if i % 2 else None)
                    if ro["kind"] in BAD:
                        kind, out = ro["kind"], {**ro, "via": "edgellm-run"}
                    elif ro["kind"] == "ok" and kind == "error" and name != "tokenizer.json" and \
                            ro["tokens"] != base_runner["tokens"]:
                        pass   # Python refused what C ran: fine (Python checks more files)
                counts[kind] += 1
                if kind in BAD:
                    case = work.parent / f"edgellm-fuzz-case-{name.replace('/', '_')}-{seed}-{i}"
                    case.write_bytes(data)
                    results["bad"].append({"file": name, "i": i, "kind": kind, "case": str(case), **out})
                if log:
                    log(name, i, kind, out)
            (target / name).write_bytes(orig)
            results[name] = counts
        w.kill()
        return results
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--package", default=None, help="package to mutate [default: a fresh tiny f32 package]")
    ap.add_argument("--kind", default="host", choices=sorted(KIND_FILES),
                    help="package to make when --package is not given; its own files join the default --files")
    ap.add_argument("--files", default=None, help="comma-separated [default: FILES + the kind's own files]")
    ap.add_argument("--per-file", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sanitize", action="store_true", help="libedgellm and edgellm-run with ASan + UBSan")
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.worker:
        worker()
        return 0
    t0 = time.time()
    files = a.files.split(",") if a.files else [*FILES, *KIND_FILES[a.kind]]
    a.files = ",".join(files)
    if a.kind in KIND_LOAD:
        os.environ["EDGELLM_FUZZ_LOAD"] = json.dumps(KIND_LOAD[a.kind])
    with tempfile.TemporaryDirectory(prefix="edgellm-fuzz-pkg-") as tmp:
        pkg = Path(a.package) if a.package else make_package(Path(tmp), a.kind)
        res = campaign(pkg, files, a.per_file, a.seed, a.sanitize, a.timeout, runner=a.kind in ("host", "moe", "bundled"),
                       policy="experts" if a.kind == "moe" else "window")
    kinds = ("error", "same", "different", "traceback", "crash", "hang")
    if a.json:
        print(json.dumps({k: (dict(v) if isinstance(v, collections.Counter) else v) for k, v in res.items()}))
    else:
        print(f"{'file':<16}{'mutations':>10}" + "".join(f"{k:>11}" for k in kinds))
        for name in a.files.split(","):
            c = res.get(name, collections.Counter())
            print(f"{name:<16}{sum(c.values()):>10}" + "".join(f"{c[k]:>11}" for k in kinds))
        print(f"{'sanitizers: ASan+UBSan' if a.sanitize else 'no sanitizers'}; {time.time() - t0:.0f} s")
        for b in res["bad"][:20]:
            print("BAD", json.dumps(b)[:400])
    return 1 if res["bad"] else 0


if __name__ == "__main__":
    sys.exit(main())
