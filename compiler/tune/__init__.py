"""Per-host tuning at compile time (`edgellm compile --tune off|quick|full`, default quick for `--target host`).

A short measured sweep, on this machine and the model's own shapes, of the knobs whose best value depends on the
CPU rather than on the model:
  * the software-prefetch distance of each decode GEMV class (linear_f16, linear_q4, linear_q8 for a q8 head, ...):
    every distance of the mode's list, on every decode GEMV the package runs, weights streamed from DRAM; the
    distance with the least time per token (each shape weighted by how often a token runs it) wins;
  * the prefill chunk (when --prefill-chunk is not given; `quick`: for bodies of 64 MiB of weights and more): each
    chunk of the mode's list on the body's GEMM shapes;
    the least time per prompt token wins (a tie within 2% goes to the shorter chunk: less padding on short prompts);
  * the rows per task of the f32/f16 decode GEMV (each row keeps its own sums; a long activation row is reused
    from registers for R rows instead of re-read from L2), per reduction length, at the chosen distance (Zen 4,
    1B f16: 8 rows at K=5632, 1.3x faster than 1; 1 row at K=2048);
  * `full` only: the register blocking of the x86 float prefill GEMM (linear.gemm_outer) at the chunk and at the
    prompt-tail chunk (its builds are slow: the unrolled blocks take seconds each to compile).
Both are performance hints only: a prefetch never changes a loaded value, and a prefill token's arithmetic does not
depend on how many tokens share its chunk, so any setting gives bit-identical logits (tests/test_tune.py checks
every value swept). The kernel flavour (AVX-512 or AVX2 code) is not swept: it changes the order of float sums.

Timings are cached per CPU identity (tune/cache.py): the second compile on the same CPU measures nothing.
Cross targets are never measured here: they keep the defaults of their core type (targets/registry.py)."""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field, replace

from ...errors import CompileError, first_line

MODES = ("off", "quick", "full")
# rounds: of the memory-bound decode GEMV sweeps; prefill_rounds: of the compute-bound GEMM sweeps (calls of tens of
# milliseconds, which differ by 15% and more: three rounds settle them, and seven took half of a 1B f16 tune)
SPACE = {
    "quick": {"prefetch": (0, 1024, 2048, 4096, 8192, 16384), "chunk": (32, 64, 128), "rows": (1, 2, 4, 6, 8), "rounds": 7,
              "prefill_rounds": 3, "blocking": False},
    "full": {"prefetch": (0, 256, 512, 1024, 2048, 4096, 8192, 12288, 16384, 32768), "chunk": (16, 32, 64, 128, 256),
             "rows": (1, 2, 4, 6, 8), "rounds": 15, "prefill_rounds": 7, "blocking": True},
}
CHUNK_TIE = 0.02   # a longer chunk must be this much faster per token to be chosen
ROWS_TIE = 0.03    # more rows per GEMV task must be this much faster (one row is one stream per thread)
MIN_STREAM = 64 << 20
# quick skips the chunk sweep for models whose body weighs less: their prompts take milliseconds, and the sweep's
# GEMM builds (seconds each) would cost more than they could ever save
MIN_CHUNK_TUNE_BYTES = 64 << 20


def resolve_mode(mode: str | None, target) -> str:
    """The tune mode of a compile: the flag, else $EDGELLM_TUNE, else quick for the host target and off elsewhere."""
    given = mode if mode is not None else os.environ.get("EDGELLM_TUNE") or None
    if given is not None and given not in MODES:
        raise CompileError(f"--tune {given}: use one of {', '.join(MODES)}")
    if not target.host_cpu:
        if mode not in (None, "off"):
            raise CompileError(f"--tune {mode} measures this machine, so it applies to --target host only; "
                               f"{target.name} keeps the defaults of its core type")
        return "off"
    return given or "quick"


@dataclass
class Tuning:
    """What a tune decided and how (recorded in the package manifest and printed by the compile)."""
    mode: str
    cpu: str = ""
    cpu_label: str = ""
    prefetch: dict = field(default_factory=dict)      # decode GEMV class -> bytes
    chunk: int | None = None                          # prefill chunk (None: not tuned, the given/default one)
    blocking: dict = field(default_factory=dict)      # prefill chunk -> float GEMM register blocking "NnxNV"
    gemv_rows: dict = field(default_factory=dict)     # K -> rows per task of the float decode GEMV
    measured: int = 0                                 # kernel variants timed by this compile (0: all from the cache)
    seconds: float = 0.0
    details: dict = field(default_factory=dict)       # knob -> {value: time relative to the best}
    failed: list = field(default_factory=list)        # knobs left at the target's default because tuning failed

    def manifest(self) -> dict:
        return {"mode": self.mode, "cpu": self.cpu_label, "cpu_key": self.cpu, "prefetch_bytes": self.prefetch,
                "prefill_chunk": self.chunk, "prefill_blocking": self.blocking, "gemv_rows": self.gemv_rows,
                "measured_variants": self.measured,
                "seconds": round(self.seconds, 2),
                "relative_times": self.details, "failed": self.failed}

    def summary(self) -> str:
        knobs = [f"{c} prefetch {_kib(b)}" for c, b in sorted(self.prefetch.items())]
        if self.chunk:
            knobs.append(f"prefill chunk {self.chunk}")
        knobs += [f"prefill blocking {b} at {t} tokens" for t, b in self.blocking.items()]
        knobs += [f"f16/f32 GEMV rows {r} at K={k}" for k, r in self.gemv_rows.items()]
        how = (f"measured {self.measured} kernel variants in {self.seconds:.1f} s" if self.measured
               else "from the tune cache, nothing measured")
        return f"tuned ({self.mode}) for {self.cpu_label}: {', '.join(knobs) or 'nothing to tune'} ({how})"


def _kib(b: int) -> str:
    return "off" if b == 0 else f"{b // 1024} KiB" if b % 1024 == 0 else f"{b} B"


class Tuner:
    def __init__(self, mode: str, target, cpu, progress: bool = True):
        from ...targets.cpu_id import cpu_identity, cpu_key, cpu_label, l3_bytes
        from .cache import TuneCache

        assert mode in SPACE, mode
        self.target, self.cpu, self.progress = target, cpu, progress
        self.space = SPACE[mode]
        self.cache = TuneCache(cpu_identity())
        self.stream = max(2 * l3_bytes(self.cache.ident), MIN_STREAM)
        self.result = Tuning(mode, cpu_key(self.cache.ident), cpu_label(self.cache.ident))
        self._t0 = time.perf_counter()
        if self.cache.ignored and progress:
            print(f"note: tune cache {self.cache.path} ignored ({self.cache.ignored}): measuring", file=sys.stderr)

    def guarded(self, what: str, fn, fallback):
        """fn(), or `fallback` when it fails: tuning is a performance hint, so a failure (no memory for the weight
        copies, a variant TVM cannot build) keeps the target's defaults for those knobs, with a warning, and never
        fails the compile."""
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - any failure of a measurement falls back to the defaults
            why = f"{type(e).__name__}: {first_line(e)}"
            self.result.failed.append(f"{what}: {why}")
            print(f"warning: tuning the {what} failed ({why}): keeping the target's defaults", file=sys.stderr)
            return fallback

    def _timings(self, requests: dict, rounds: int | None = None) -> dict:
        """requests: cache key -> (variants, make) with make(variant) -> (function name, PrimFunc); returns key ->
        {variant: seconds}, measuring (all missing keys' variants built in one module) only what the cache lacks.
        Nothing is made for a key the cache holds: a cached tune costs milliseconds."""
        out, missing = {}, {}
        for key, (variants, make) in requests.items():
            got = self.cache.get(key, variants)
            if got is None:
                missing[key] = {v: make(v) for v in variants}
            else:
                out[key] = got
        if missing:
            from ..progress import Step

            n = sum(len(v) for v in missing.values())
            with Step(f"tuning: timing {n} kernel variants on this CPU", self.progress):
                out.update(self._measure(missing, rounds))
        self.result.seconds = time.perf_counter() - self._t0
        return out

    def _measure(self, missing: dict, rounds: int | None) -> dict:
        from .measure import build, fake_args, signature, time_variants

        out = {}
        mod = build({name: f for vs in missing.values() for name, f in vs.values()}, self.target)
        for key, variants in missing.items():
            made: dict = {}   # variants with one signature (decode: all of them) share their copies
            args = {}
            for v, (_, f) in variants.items():
                sig = signature(f)
                if sig not in made:
                    made[sig] = fake_args(f, self.stream)
                args[str(v)] = made[sig]
            t = time_variants(mod, {str(v): name for v, (name, _) in variants.items()}, args,
                              rounds or self.space["rounds"])
            del args, made
            self.cache.put(key, t)
            out[key] = t
            self.result.measured += len(variants)
        self.cache.save()
        return out

    def _choose(self, knob: str, costs: dict, tie: float = 0.0):
        """The value of least cost (a later, larger value must beat the earlier ones by `tie`); records relative
        costs for the report."""
        best = min(costs.values())
        pick = next(v for v in sorted(costs) if costs[v] <= best * (1 + tie))
        self.result.details[knob] = {str(v): round(c / best, 3) for v, c in sorted(costs.items())}
        return pick

    def prefill(self, spec, scheme, head_scheme, chunk: int | None, fuse: bool = True):
        """The prefill chunk (the given one, else the one of least time per token on the body's GEMM shapes) and,
        for float schemes on x86, the register blocking of their GEMMs at that chunk and at its prompt-tail chunk.
        Returns (chunk, the CpuInfo to lower with)."""
        from ...targets import short_prefill_chunk
        from ..ops import linear as _linear
        from ..ops import make_kernel

        shapes = body_gemm_shapes(spec, scheme, head_scheme, fuse)
        body_bytes = sum(uses * p["N"] * p["K"] for _, p, uses in shapes) * scheme.bits_per_weight / 8
        if chunk is None and (self.space["blocking"] or body_bytes >= MIN_CHUNK_TUNE_BYTES):
            def maker(op, params):
                def make(c):
                    name, func = make_kernel(op, self.cpu, **{**params, "T": c})
                    return f"{name}__tune", func.with_attr("global_symbol", f"{name}__tune")
                return make

            requests = {_key("prefill", op, params): (self.space["chunk"], maker(op, params))
                        for op, params, _ in shapes}
            timings = self._timings(requests, self.space["prefill_rounds"])
            costs = {c: sum(uses * timings[_key("prefill", op, params)][str(c)] / c
                            for op, params, uses in shapes) for c in self.space["chunk"]}
            chunk = self.result.chunk = self._choose("prefill_chunk", costs, CHUNK_TIE)
        lengths = [t for t in (chunk, short_prefill_chunk(chunk or 1)) if t and _linear.use_outer(self.cpu, t)]
        if scheme.float_math and lengths and self.space["blocking"]:
            self.cpu = replace(self.cpu, tuned_blocking=tuple(
                (t, *self._blocking(shapes, t)) for t in lengths))
            self.result.blocking = {str(t): f"{nn}x{nv}" for t, nn, nv in self.cpu.tuned_blocking}
        return chunk, self.cpu

    def _blocking(self, shapes, T: int) -> tuple[int, int]:
        """The gemm_outer register blocking (weight rows, token vectors) of least total time at chunk T."""
        from ..ops import make_kernel

        cands = outer_blockings(self.cpu, T)

        def maker(op, params):
            def make(b):
                nn, nv = (int(x) for x in str(b).split("x"))
                cpu = replace(self.cpu, tuned_blocking=((T, nn, nv),))
                name, func = make_kernel(op, cpu, **{**params, "T": T})
                return f"{name}__b{nn}x{nv}", func.with_attr("global_symbol", f"{name}__b{nn}x{nv}")
            return make

        requests = {_key("blocking", op, {**params, "T": T}): (cands, maker(op, params)) for op, params, _ in shapes}
        timings = self._timings(requests, self.space["prefill_rounds"])
        costs = {b: sum(uses * timings[_key("blocking", op, {**params, "T": T})][b] for op, params, uses in shapes)
                 for b in cands}
        best = self._choose(f"blocking T={T}", costs)
        return tuple(int(x) for x in best.split("x"))

    def decode_prefetch(self, kernels, decode) -> object:
        """Measures the prefetch distances of the decode program's GEMV classes, remakes those kernels with the
        best one, and returns the CpuInfo that makes them (its tuned_prefetch names the choice)."""
        from ..ops import make_kernel, prefetch_class

        uses: dict[str, int] = {}
        for st in decode.steps:
            if st.kernel < 0:   # a routed step calls no kernel
                continue
            name = kernels.names[st.kernel]
            uses[name] = uses.get(name, 0) + 1
        by_class: dict[str, list[str]] = {}
        for name in uses:
            op, params = kernels.made.get(name, (None, {}))
            # a K-sliced GEMV issues no prefetches (linear.gemv_sliced): timing it at each distance would be wasted
            cls = prefetch_class(op, params) if op and not params.get("KS") else None
            if cls:
                by_class.setdefault(cls, []).append(name)
        def maker(cls, name):
            def make(d):
                op, params = kernels.made[name]
                _, func = make_kernel(op, replace(self.cpu, tuned_prefetch=((cls, d),)), **params)
                return f"{name}__pf{d}", func.with_attr("global_symbol", f"{name}__pf{d}")
            return make

        requests = {_key("decode", *kernels.made[name]): (self.space["prefetch"], maker(cls, name))
                    for cls, names in by_class.items() for name in names}
        timings = self._timings(requests)
        for cls, names in sorted(by_class.items()):
            costs = {d: sum(uses[n] * timings[_key("decode", *kernels.made[n])][str(d)] for n in names)
                     for d in self.space["prefetch"]}
            self.result.prefetch[cls] = self._choose(f"prefetch {cls}", costs)
        tuned = replace(self.cpu, tuned_prefetch=tuple(sorted(self.result.prefetch.items())))
        float_names = [n for c in ("linear_f16", "linear_f32") for n in by_class.get(c, [])]   # none K-sliced
        if float_names:
            tuned = self._gemv_rows(kernels, float_names, uses, tuned)
        for names in by_class.values():
            for name in names:
                op, params = kernels.made[name]
                kernels.funcs[name] = make_kernel(op, tuned, **params)[1]
        return tuned


    def _gemv_rows(self, kernels, names, uses, cpu):
        """Rows per task of the float decode GEMVs (linear.gemv's R), per reduction length K, at the tuned
        prefetch distances: the CpuInfo with tuned_gemv_rows set."""
        from ..ops import make_kernel

        def maker(name):
            def make(r):
                op, params = kernels.made[name]
                c = replace(cpu, tuned_gemv_rows=((params["K"], r),))
                _, func = make_kernel(op, c, **params)
                return f"{name}__r{r}", func.with_attr("global_symbol", f"{name}__r{r}")
            return make

        pf = ",".join(f"{c}={b}" for c, b in cpu.tuned_prefetch)
        key = {n: _key(f"rows[{pf}]", *kernels.made[n]) for n in names}
        timings = self._timings({key[n]: (self.space["rows"], maker(n)) for n in names})
        by_k: dict[int, list[str]] = {}
        for n in names:
            by_k.setdefault(kernels.made[n][1]["K"], []).append(n)
        rows = []
        for k, ns in sorted(by_k.items()):
            costs = {r: sum(uses[n] * timings[key[n]][str(r)] for n in ns) for r in self.space["rows"]}
            rows.append((k, self._choose(f"gemv rows K={k}", costs, ROWS_TIE)))
        self.result.gemv_rows = {str(k): r for k, r in rows}
        return replace(cpu, tuned_gemv_rows=tuple(rows))


def _key(kind: str, op: str, params: dict) -> str:
    rest = ",".join(f"{k}={v}" for k, v in sorted(params.items()) if not (kind == "prefill" and k == "T"))
    return f"{kind}|{op}|{rest}"


def outer_blockings(cpu, T: int) -> tuple[str, ...]:
    """Candidate gemm_outer blockings "NnxNV" that fit the register file (Nn*NV accumulators, NV token vectors and
    a broadcast): one token vector for chunks of at most a vector of tokens, else two."""
    if T <= cpu.vector_lanes:
        rows = (6, 8, 14, 20) if cpu.vector_lanes >= 16 else (4, 8, 12)
        return tuple(f"{r}x1" for r in rows)
    rows = (4, 7, 10, 14) if cpu.vector_lanes >= 16 else (3, 4, 6)
    return tuple(f"{r}x2" for r in rows)


def body_gemm_shapes(spec, scheme, head_scheme, fuse: bool = True) -> list[tuple[str, dict, int]]:
    """(op, params, uses) of each distinct linear kernel of the transformer body as the lowering will emit it (fused
    q/k/v and gate/up included; uses: how many a forward pass runs). Traces the model; reads no weights."""
    from ...models import family
    from ...quant import get_scheme
    from ..lower import FUSED, Lowering, fuse_linears
    from ..trace import TraceGraph

    g = TraceGraph(spec, 2)
    family(spec).body(g, g.input_ids())
    fusable = Lowering(spec, None, None, scheme, head_scheme, 0)._fusable
    nodes = fuse_linears(g.nodes, fusable) if fuse else g.nodes
    out: dict = {}
    for n in nodes:
        if n.op not in ("linear", FUSED):
            continue
        members = n.members if n.op == FUSED else [n]
        first = members[0]
        sch = get_scheme("t2") if first.params.get("ternary") else scheme
        segs = tuple(m.out.shape[1] for m in members) if len(members) > 1 else ()
        op, params = sch.linear_kernel(2, sum(m.out.shape[1] for m in members), first.inputs[0].shape[1],
                                       bool(first.params["bias"]), segs)
        k = (op, tuple(sorted(params.items())))
        out[k] = out.get(k, 0) + 1
    return [(op, dict(p), n) for (op, p), n in out.items()]
