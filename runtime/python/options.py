"""The load and generation options, declared once: name, kind, default, range or choices, help, and which front ends
expose each.

From these tables come the command-line options of `edgellm run` / `bench` / `chat` / `serve` / `plan` (click), the
checks and C fields of `Runtime.load`, `bin/edgellm-run`'s parser and usage (`runtime/cli/option_table.h`, generated:
`python -m edgellm.runtime.python.gen_option_table`); the Kotlin `LoadOptions` and `GenerateParams`, the server's request
fields and `Runtime.load`'s signature are checked against them (tests/test_options.py). Sizes are read by the one C
reader (`el_parse_bytes`) everywhere.

Adding a load option: a field in `el_load_options` (edgellm.h, and its ctypes twin in lib.py), its row here, a
`Runtime.load` keyword, and the regenerated header; the front ends pick it up from the row. A backend's own option
touches no core file: the backend declares the key (its el_backend.options) and reads it (el_backend_option); a row
here with `backend=` gives it a name on the front ends (else `--backend-option NAME.KEY=VALUE` reaches it). A
generation option: its `el_gen_params` field, its row in GEN_OPTIONS, and the regenerated header.
"""
from __future__ import annotations

import os
import textwrap
from dataclasses import dataclass, field

# front ends: Runtime.load ("api"), edgellm run and bench ("run"), chat, serve, plan, bin/edgellm-run ("runner"),
# the Kotlin LoadOptions over JNI ("jni")
FRONTS = ("api", "run", "chat", "serve", "plan", "runner", "jni")
_ALL = frozenset(FRONTS)


@dataclass(frozen=True)
class Option:
    name: str                   # the Runtime.load keyword
    kind: str                   # int | float | bytes | str | choice | flag | tristate | backends
    help: str
    default: object = None      # the Python / CLI default (None: the runtime's own)
    choices: tuple = ()         # choice: names, or (name, C int value) pairs for int fields
    lo: float | None = None     # int / float: inclusive range
    hi: float | None = None
    metavar: str = ""
    c_field: str = ""           # the el_load_options field ("": the name)
    invert: bool = False        # flag: the C field holds the opposite (expert_warm -> no_expert_warm)
    fronts: frozenset = field(default=_ALL)
    kotlin: str = ""            # the Kotlin property ("": camelCase of the name)
    what: str = ""              # str: what to give, for the error message
    short: str = ""             # a one-letter command-line alias ("-n")
    openai: str = ""            # generation options: the OpenAI request field ("": the name; "-": none)
    backend: str = ""           # str: an option of this backend (el_load_options.backend_options "backend.name=v")
    cli: str = ""               # the command-line spelling when it is not the name's ("backend-option")
    or_dir: str = ""            # choice: a value that is none of the choices names a directory, this one

    @property
    def field(self) -> str:
        return "backend_options" if self.backend or self.kind == "backends" else (self.c_field or self.name)

    @property
    def flag(self) -> str:
        """The command-line spelling (a flag defaulting to on is spelled as its negation)."""
        return "--" + (self.cli or (("no-" if self.invert else "") + self.name).replace("_", "-"))

    @property
    def choice_names(self) -> tuple[str, ...]:
        return tuple(c[0] if isinstance(c, tuple) else c for c in self.choices)

    @property
    def kotlin_name(self) -> str:
        head, *rest = self.name.split("_")
        return self.kotlin or head + "".join(w.title() for w in rest)


LOAD_OPTIONS = (
    Option("threads", "int", "CPU threads of the model's contexts (0: one per CPU) [default: one per CPU]", lo=0, hi=256,
           metavar="N", c_field="n_threads", fronts=_ALL - {"plan"}),
    Option("digest", "str", "refuse to run unless the package matches this sha256:... digest (printed by edgellm "
           "compile): every file is checked before anything is loaded", metavar="sha256:HEX",
           fronts=_ALL - {"plan"}, what="the sha256:... digest edgellm compile printed"),
    Option("memory_budget", "bytes", "memory the model may use, e.g. 600MB: the weights it holds + one context's KV "
           "cache and activations; weights beyond it stream from the package every token (600MB = 600*10^6 bytes, "
           "600M = 600MiB = 600*2^20) [default: no limit]", metavar="SIZE"),
    Option("weight_policy", "choice", "resident: all weights in memory; window: stream what the budget cannot hold; "
           "experts (MoE): all but the experts held, experts cached in the budget; auto: resident when everything "
           "fits, else experts for MoE packages, else window", default="auto",
           choices=("auto", "resident", "window", "experts"), fronts=_ALL - {"chat", "serve"}),
    Option("expert_eviction", "choice", "--weight-policy experts: which cached expert makes room [default: freq]",
           choices=("freq", "lru", "lfu"), fronts=frozenset({"api", "run", "runner"})),
    Option("expert_predict", "flag", "--weight-policy experts: run the package's guesses of the next layers' experts "
           "and read the guessed ones ahead [default: off: on this project's hosts they cost more reads than they "
           "save; README \"MoE models bigger than RAM\"]", default=False, fronts=frozenset({"api", "run", "runner"})),
    Option("expert_warm", "flag", "--weight-policy experts: start with an empty expert cache [default: filled at load "
           "with the experts calibration selected most]", default=True, c_field="no_expert_warm", invert=True,
           fronts=frozenset({"api", "run", "runner"})),
    Option("storage", "choice", "shape streamed reads like this storage (ufs3/ufs4: modelled from RAM)",
           default="native", choices=("native", "sd", "emmc", "ufs3", "ufs4"),
           fronts=frozenset({"api", "run", "plan", "runner"})),
    Option("io_threads", "int", "reader threads for streamed weights [default: 2]", lo=1, hi=4, metavar="N",
           fronts=frozenset({"api", "run", "runner"})),
    Option("direct_io", "flag", "O_DIRECT reads for streamed weights [default: buffered reads dropped from the page "
           "cache behind them]", default=False, fronts=frozenset({"api", "run", "plan", "runner"})),
    Option("huge_pages", "tristate", "resident weights in transparent huge pages: auto (default), on, off (plain "
           "mmap; EDGELLM_HUGEPAGES=0/1 sets it for the Python API)", choices=(("auto", -1), ("on", 1), ("off", 0)),
           fronts=frozenset({"api", "runner"})),
    Option("ffn_threshold", "float", "--layout bundled packages: skip FFN neuron groups whose estimated output is below "
           "this (0: exact) [default: the package's]", lo=0, hi=1e6, metavar="T",
           fronts=frozenset({"api", "run", "runner"})),
    Option("prefill_backend", "choice", "android-npu / host-npu packages: prefill prompts on the NPU (ONNX Runtime + "
           "QNN EP), the CPU, or the NPU when it loads", default="auto",
           choices=(("auto", 0), ("cpu", 1), ("npu", 2)), fronts=_ALL - {"chat", "serve", "plan"}, kotlin="prefill"),
    Option("npu_soc", "str", "the SoC whose prepared NPU graphs to load (sm8550, sm8650, sm8750; none: the ONNX "
           "graphs) [default: this phone's]", metavar="SOC", fronts=frozenset({"api", "run", "runner"}),
           what="a SoC name (sm8550, sm8650, sm8750) or none", backend="qnn_ort"),
    Option("device", "str", "android-gpu / opencl packages: the OpenCL device, \"P:D\" or part of its name [default: "
           "$EDGELLM_OPENCL_DEVICE, else the first GPU]", metavar="D", fronts=_ALL - {"plan"},
           what="an OpenCL device as \"P:D\" or part of its name", backend="opencl"),
    Option("backend_options", "backends", "an option of one of the package's backends, as BACKEND.KEY=VALUE "
           "(repeatable; e.g. qnn_ort.qnn_backend=/path/libQnnHtp.so; README \"Backends\")", metavar="B.K=V",
           fronts=frozenset({"api", "run", "runner"}), cli="backend-option"),
)
BY_NAME = {o.name: o for o in LOAD_OPTIONS}

# Generation options (el_gen_params): a sampling value not given takes the package's default (its
# generation_config.json), on every front end alike; the C sampler checks the ranges it does not state here.
_GEN = frozenset({"api", "run", "serve", "runner", "jni"})
_SAMPLED = _GEN | {"chat"}
_SPEC = _SAMPLED - {"jni"}   # the Kotlin GenerateParams does not carry them yet
GEN_OPTIONS = (
    Option("max_new_tokens", "int", "tokens to generate at most (more than the context holds: to its end)",
           default=128, lo=0, metavar="N", short="-n", fronts=_GEN, openai="max_tokens"),
    Option("temperature", "float", "0 = greedy [default: the package's generation_config.json if it samples, else 0]",
           metavar="T", fronts=_SAMPLED),
    Option("top_k", "int", "0 = off [default: the package's]", lo=0, hi=2**31 - 1, metavar="K", fronts=_SAMPLED),
    Option("top_p", "float", "1 = off [default: the package's]", metavar="P", fronts=_SAMPLED),
    Option("min_p", "float", "0 = off [default: the package's]", metavar="P", fronts=_GEN),
    Option("repetition_penalty", "float", "1 = off; applies when greedy too [default: the package's]", metavar="R",
           fronts=_SAMPLED),
    Option("presence_penalty", "float", "0 = off [default: the package's]", metavar="P", fronts=_GEN),
    Option("frequency_penalty", "float", "0 = off [default: the package's]", metavar="F", fronts=_GEN),
    Option("seed", "u64", "sampling seed [default: random]", lo=0, hi=2**64 - 1, metavar="S", fronts=_SAMPLED),
    Option("ignore_eos", "flag", "keep generating past end-of-sequence tokens", default=False,
           fronts=_GEN - {"serve"}),
    # speculative decoding (runtime/core/speculate.c): the tokens are those plain decoding draws
    Option("speculate", "choice", "speculative decoding: draft tokens from n-grams of the prompt and reply, verify "
           "several per pass over the weights (auto: where drafts pay, else plain; ngram: whenever one matches; "
           "recycle: every pass, a tree of n-grams and the tokens the model found likeliest after each token before; "
           "DRAFT_PKG: a smaller model's package with the same tokenizer guesses where no n-gram matches, as auto) "
           "[default: off]", default="off", choices=(("off", 0), ("auto", 1), ("ngram", 2), ("recycle", 3)),
           metavar="off|auto|ngram|recycle|DRAFT_PKG", or_dir="a draft package", fronts=_SPEC),
    Option("draft_max", "int", "drafts per verify pass at most [default: the package's verify width - 1]", lo=0,
           hi=31, metavar="N", fronts=_SPEC),
    # context shift (runtime/core/generate.c): a conversation that outgrows the context goes on
    Option("context_shift", "choice", "when the context is full, keep its first --shift-sinks tokens (attention "
           "sinks) and its newest ones, drop --shift-tokens between them, and go on instead of stopping [default: on "
           "for chat and serve, off for run]", choices=(("off", 0), ("on", 1)), fronts=_SPEC),
    Option("shift_sinks", "int", "context shift: tokens kept at the start [default: 4]", lo=0, hi=1024, metavar="N",
           fronts=_SPEC),
    Option("shift_tokens", "int", "context shift: tokens dropped per shift [default: half of those after the sinks]",
           lo=0, hi=2**31 - 1, metavar="N", fronts=_SPEC),
)
SAMPLING = tuple(o.name for o in GEN_OPTIONS if o.kind == "float" or o.name == "top_k")   # the sampler's knobs
# generation rows Runtime.load (and so every command that loads) also takes, as its contexts' defaults
LOAD_DEFAULTS = ("speculate", "draft_max", "context_shift", "shift_sinks", "shift_tokens")
GEN_BY_NAME = {o.name: o for o in GEN_OPTIONS}
SPEC_OPTIONS = (GEN_BY_NAME["speculate"], GEN_BY_NAME["draft_max"])
SHIFT_OPTIONS = tuple(GEN_BY_NAME[k] for k in ("context_shift", "shift_sinks", "shift_tokens"))
SPECULATE = dict(GEN_BY_NAME["speculate"].choices)   # speculate's names -> el_gen_params values
DRAFT_MAX = int(GEN_BY_NAME["draft_max"].hi)         # drafts per pass at most (el_internal.h EL_MAX_DRAFT)


def for_front(front: str, table: tuple[Option, ...] = LOAD_OPTIONS) -> tuple[Option, ...]:
    return tuple(o for o in table if front in o.fronts)


# ---- checks (Runtime.load) ----------------------------------------------------------------------------------------

def check(name: str, value):
    """The value as the C field takes it (None: leave the runtime's default), or an InputError naming the option."""
    from ...errors import InputError
    from .package import parse_bytes

    o = BY_NAME[name]
    if value is None:
        return None
    if o.kind == "bytes":
        return parse_bytes(value, name)
    if o.kind == "backends":   # {"backend.key": value} -> [(backend, key, value)]
        if not isinstance(value, dict):
            raise InputError(f"{name} {value!r}: a dict of \"backend.key\": value")
        out = []
        for k, v in value.items():
            b, _, key = str(k).partition(".")
            if not b or not key or "=" in k or "\n" in k or not isinstance(v, str) or "\n" in v:
                raise InputError(f"{name}: {k!r}: {v!r}: give \"backend.key\": \"value\" (one line each)")
            out.append((b, key, v))
        return out
    if o.kind in ("flag", "tristate") and not isinstance(value, bool):
        raise InputError(f"{name} {value!r}: True or False" + (" (or None: automatic)" if o.kind == "tristate" else ""))
    if o.kind == "flag":
        return int(value != o.invert)
    if o.kind == "tristate":
        return 1 if value else 0
    if o.kind == "choice":
        names = o.choice_names
        if value not in names:
            raise InputError(f"{name} {value!r}: choose one of {', '.join(names)}")
        return dict(c for c in o.choices if isinstance(c, tuple)).get(value, value)
    if o.kind in ("int", "float"):
        ok = (isinstance(value, int) if o.kind == "int" else isinstance(value, (int, float))) and \
            not isinstance(value, bool) and o.lo <= value <= o.hi
        if not ok:
            what = "an integer" if o.kind == "int" else "a number"
            raise InputError(f"{name} {value!r}: {what} from {o.lo:g} to {o.hi:g}")
        return value
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{name} {value!r}: give {o.what or 'a non-empty string'}")
    return value


def apply(opts, values: dict, backend_extra=()) -> list:
    """Checks each given value (None: the runtime's default) and sets its el_load_options field on opts (a ctypes
    LoadOptions); the backends' options (rows with `backend`, the backend_options dict, and backend_extra's
    (backend, key, value)) become its backend_options lines. Returns the byte strings the struct points to: keep
    them alive until the load returns."""
    keep, lines = [], []
    for name, value in values.items():
        v = check(name, value)
        if v is None:
            continue
        o = BY_NAME[name]
        if o.backend or o.kind == "backends":
            lines += [(o.backend, o.name, v)] if o.backend else v
            continue
        if isinstance(v, str):
            keep.append(v.encode())
            v = keep[-1]
        setattr(opts, BY_NAME[name].field, v)
    lines += list(backend_extra)
    if lines:
        keep.append("".join(f"{b}.{k}={v}\n" for b, k, v in lines).encode())
        opts.backend_options = keep[-1]
    return keep


# ---- click (the edgellm CLI) --------------------------------------------------------------------------------------

def click_options(front: str, skip: tuple[str, ...] = (), table: tuple[Option, ...] = LOAD_OPTIONS) -> list:
    """The click options of this front end's rows, in table order."""
    import click

    out = []
    for o in for_front(front, table):
        if o.name in skip:
            continue
        names = [o.short, o.flag] if o.short else [o.flag]
        if o.kind in ("flag",):
            out.append(click.option(*names, is_flag=True, help=o.help))
        elif o.kind == "backends":
            out.append(click.option(*names, multiple=True, help=o.help, metavar=o.metavar or None))
        elif o.or_dir:
            out.append(click.option(*names, type=_ChoiceOrDir(o), default=o.default,
                                    show_default=o.default is not None, help=o.help, metavar=o.metavar or None))
        elif o.kind in ("choice", "tristate"):
            out.append(click.option(*names, type=click.Choice(list(o.choice_names)), default=o.default,
                                    show_default=o.default is not None, help=o.help))
        elif o.kind in ("int", "u64"):
            hi = None if o.hi is None else int(o.hi)   # no bound: the runtime clamps (max_new_tokens)
            out.append(click.option(*names, type=click.IntRange(int(o.lo), hi), default=o.default,
                                    show_default=o.default is not None, help=o.help, metavar=o.metavar or None))
        elif o.kind == "float":
            rng = click.FloatRange(o.lo, o.hi) if o.lo is not None else float
            out.append(click.option(*names, type=rng, default=None, help=o.help, metavar=o.metavar or None))
        else:
            out.append(click.option(*names, default=None, help=o.help, metavar=o.metavar or None))
    return out


def _ChoiceOrDir(o: Option):
    """click's type for a choice that may instead name a directory (speculate: a draft package)."""
    import click

    class ChoiceOrDir(click.ParamType):
        name = o.metavar or "|".join(o.choice_names)

        def convert(self, value, param, ctx):
            if value is None or value in o.choice_names or os.path.isdir(str(value)):
                return value
            self.fail(f"{value!r} is none of {', '.join(o.choice_names)}, nor a directory ({o.or_dir})", param, ctx)

    return ChoiceOrDir()


def api_kwargs(cli_values: dict) -> dict:
    """Runtime.load keywords from click's parameters (click names a negated flag after its spelling)."""
    out = {}
    for o in LOAD_OPTIONS:
        key = o.flag[2:].replace("-", "_")
        if key in cli_values:
            v = cli_values[key]
            if o.kind == "backends":   # ("opencl.device=0:1", ...) -> {"opencl.device": "0:1"}
                v = _backend_pairs(v)
            out[o.name] = (not v) if o.invert else v
    for name in LOAD_DEFAULTS:
        if name in cli_values:
            out[name] = cli_values[name]
    return out


def _backend_pairs(values) -> dict | None:
    from ...errors import InputError

    out = {}
    for s in values or ():
        k, eq, v = s.partition("=")
        if not eq:
            raise InputError(f"--backend-option {s!r}: give BACKEND.KEY=VALUE")
        out[k] = v
    return out or None


# ---- bin/edgellm-run (C) ------------------------------------------------------------------------------------------

_C_KIND = {"int": "EL_OPT_INT", "float": "EL_OPT_FLOAT", "bytes": "EL_OPT_BYTES", "str": "EL_OPT_STR",
           "choice": "EL_OPT_CHOICE", "flag": "EL_OPT_FLAG", "tristate": "EL_OPT_CHOICE", "u64": "EL_OPT_U64",
           "backends": "EL_OPT_BACKEND"}


def _c_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _c_rows(table, struct: str) -> list[str]:
    rows = []
    for o in for_front("runner", table):
        choices = "|".join(f"{c[0]}={c[1]}" if isinstance(c, tuple) else c for c in o.choices)
        if o.backend:   # a named backend option: its "backend.key" where a choice list would be
            choices = f"{o.backend}.{o.name}"
        lo = "0" if o.lo is None or o.kind == "u64" else repr(float(o.lo))
        hi = "0" if o.hi is None or o.kind == "u64" else repr(float(o.hi))
        if o.kind == "int" and o.hi is None:
            hi = repr(float(2**31 - 1))   # an int32 field
        if o.kind == "float" and o.lo is None:
            lo, hi = "-1e30", "1e30"   # the sampler checks these ranges when a generation starts
        kind = "EL_OPT_BACKEND" if o.backend else _C_KIND[o.kind]
        rows.append(f"    {{{_c_str(o.flag)}, {_c_str(o.short) if o.short else 'NULL'}, {kind}, "
                    f"offsetof({struct}, {o.field}), {_c_str(choices) if choices else 'NULL'}, {lo}, {hi}}},")
    return rows


def _usage(table) -> list[str]:
    usage = []
    for o in for_front("runner", table):
        arg = "" if o.kind == "flag" else " " + (o.metavar or ("|".join(o.choice_names) if o.choices else "X"))
        head = f"  {o.short + ', ' if o.short else ''}{o.flag}{arg}"
        lines = textwrap.wrap(o.help, 112 - 24)
        first = head.ljust(23) + " " + lines[0] if len(head) < 23 else head + "\n" + " " * 24 + lines[0]
        usage.append("\n".join([first] + [" " * 24 + ln for ln in lines[1:]]))
    return "\n".join(usage).splitlines()


def _c_macro(name: str, lines: list[str]) -> str:
    body = ['  "' + ln.replace("\\", "\\\\").replace('"', '\\"') + '\\n"' for ln in lines]
    return f"#define {name} \\\n" + " \\\n".join(body) + "\n"


def render_c_header() -> str:
    """runtime/cli/option_table.h: edgellm-run's load and generation options and their usage lines."""
    return (
        "/* Generated from runtime/python/options.py by python -m edgellm.runtime.python.gen_option_table; do not edit:\n"
        " * tests/test_options.py fails when it and the tables differ. bin/edgellm-run's options. */\n"
        "#ifndef EDGELLM_OPTION_TABLE_H\n#define EDGELLM_OPTION_TABLE_H\n#include <stddef.h>\n\n#include \"../edgellm.h\"\n\n"
        "enum { EL_OPT_INT, EL_OPT_FLOAT, EL_OPT_BYTES, EL_OPT_STR, EL_OPT_CHOICE, EL_OPT_FLAG, EL_OPT_U64, EL_OPT_BACKEND };\n\n"
        "/* choices: \"a|b|c\" (the field is a string: the chosen name) or \"a=N|b=M\" (an int32 field: N or M);\n"
        " * EL_OPT_BACKEND: \"backend.key\" (the value is that option's), or NULL (the value is \"backend.key=value\") */\n"
        "typedef struct {\n  const char* flag;\n  const char* short_flag; /* or NULL */\n  int kind;\n  size_t offset;\n"
        "  const char* choices;\n  double lo, hi; /* EL_OPT_INT / EL_OPT_FLOAT: inclusive range */\n} el_cli_option;\n\n"
        "/* into el_load_options */\nstatic const el_cli_option EL_LOAD_OPTIONS[] = {\n"
        + "\n".join(_c_rows(LOAD_OPTIONS, "el_load_options")) + "\n};\n\n"
        "/* into el_gen_params (a value given replaces the package's default) */\n"
        "static const el_cli_option EL_GEN_OPTIONS[] = {\n"
        + "\n".join(_c_rows(GEN_OPTIONS, "el_gen_params")) + "\n};\n\n"
        + _c_macro("EL_LOAD_OPTIONS_USAGE", _usage(LOAD_OPTIONS)) + "\n"
        + _c_macro("EL_GEN_OPTIONS_USAGE", _usage(GEN_OPTIONS)) + "\n#endif\n")
