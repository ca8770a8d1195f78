"""The load options are declared once (runtime/python/options.py); every front end's spelling comes from that table or is
checked against it here: the generated header bin/edgellm-run parses with, the ctypes struct, Runtime.load's
keywords, the edgellm commands' options and the Kotlin LoadOptions the JNI bridge takes."""
from __future__ import annotations

import inspect
import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgellm.runtime.python import lib as L
from edgellm.runtime.python import options as O
from edgellm.runtime.python.api import Runtime

ROOT = Path(__file__).resolve().parents[1]
# el_load_options fields no front end spells: set by the Python API from the environment
PLUMBING = {"use_mmap", "plan_only"}


def test_generated_header_is_in_step():
    """runtime/cli/option_table.h is what the table renders (regenerate: python -m edgellm.runtime.python.gen_option_table)."""
    assert (ROOT / "runtime" / "cli" / "option_table.h").read_text() == O.render_c_header()


def test_every_struct_field_has_one_row():
    fields = {name for name, _ in L.LoadOptions._fields_}
    rows = [o.field for o in O.LOAD_OPTIONS if not o.backend]   # a backend's own options share backend_options
    assert len(rows) == len(set(rows))
    assert set(rows) | PLUMBING == fields, (set(rows) | PLUMBING) ^ fields


def test_runtime_load_takes_the_api_rows():
    params = set(inspect.signature(Runtime.load).parameters) - {"cls", "path", "verify"}
    assert params == {o.name for o in O.for_front("api")} | set(O.LOAD_DEFAULTS)


@pytest.mark.parametrize("command,front,own", [("run", "run", ()), ("chat", "chat", ()), ("serve", "serve", ()),
                                               ("plan", "plan", ()), ("bench", "run", ("--threads", "--digest"))])
def test_commands_spell_their_rows(command, front, own):
    from edgellm.cli import cli

    help_text = CliRunner().invoke(cli, [command, "--help"], terminal_width=200).output
    flags = set(re.findall(r"(--[a-z][a-z-]+)", help_text))
    for o in O.for_front(front):
        assert o.flag in flags or o.flag in own, (command, o.flag)
    # and no load option this front end does not have (bench has its own --threads)
    others = {o.flag for o in O.LOAD_OPTIONS} - {o.flag for o in O.for_front(front)}
    assert not (others & flags) - set(own), (command, others & flags)


def test_kotlin_load_options_are_the_jni_rows():
    kt = (ROOT / "android_app" / "edgellm" / "src" / "main" / "java" / "ai" / "edgellm" / "LoadOptions.kt").read_text()
    body = kt[kt.index("data class LoadOptions("):]
    props = re.findall(r"val (\w+):", body[:body.index(")\n")])
    assert sorted(props) == sorted(o.kotlin_name for o in O.for_front("jni"))


def test_sampling_names_agree():
    from edgellm import cli
    from edgellm.runtime.python.api import SAMPLING_ARGS

    assert SAMPLING_ARGS == O.SAMPLING == cli.SAMPLING


@pytest.mark.parametrize("command,front", [("run", "run"), ("chat", "chat")])
def test_commands_spell_the_generation_rows(command, front):
    from edgellm.cli import cli

    help_text = CliRunner().invoke(cli, [command, "--help"], terminal_width=200).output
    for o in O.for_front(front, O.GEN_OPTIONS):
        assert o.flag in help_text, (command, o.flag)


def test_server_requests_take_the_serve_rows():
    """The OpenAI request fields edgellm serve accepts include every generation row meant for it (OpenAI's names)."""
    from edgellm.runtime.serve import openai_api as oa

    fields = set(oa._Request.model_fields)
    for o in O.for_front("serve", O.GEN_OPTIONS):
        assert (o.openai or o.name) in fields, o.name


def test_kotlin_generate_params_have_the_jni_rows():
    kt = (ROOT / "android_app" / "edgellm" / "src" / "main" / "java" / "ai" / "edgellm" / "GenerateParams.kt").read_text()
    body = kt[kt.index("data class GenerateParams("):]
    props = set(re.findall(r"val (\w+):", body[:body.index("\n)\n")]))
    assert {o.kotlin_name for o in O.for_front("jni", O.GEN_OPTIONS)} <= props


def test_python_checks_name_the_option():
    from edgellm.errors import InputError

    for name, bad in [("threads", 999), ("threads", 1.5), ("io_threads", 9), ("weight_policy", "all"),
                      ("storage", "floppy"), ("expert_predict", "yes"), ("huge_pages", 1), ("ffn_threshold", -1),
                      ("memory_budget", "lots"), ("device", " "), ("prefill_backend", "gpu")]:
        with pytest.raises(InputError, match=name):
            O.check(name, bad)
    assert O.check("prefill_backend", "npu") == 2 and O.check("huge_pages", False) == 0
    assert O.check("expert_warm", False) == 1 and O.check("expert_warm", True) == 0   # the C field is the negation
    assert O.check("memory_budget", "600MB") == 600_000_000 and O.check("weight_policy", "window") == "window"


def test_edgellm_run_parses_by_the_table(tmp_path):
    """bin/edgellm-run (built from the shipped sources) knows every runner row of both tables and refuses a bad value
    of each kind as a usage error (exit 2) naming the option; a good value gets as far as loading the (missing)
    package."""
    from edgellm.compiler.device_binary import CLI, LIB_SOURCES

    exe = tmp_path / "edgellm-run"
    subprocess.run(["gcc", "-std=c11", "-O1", str(CLI), *map(str, LIB_SOURCES), f"-I{CLI.parent}",
                    f"-I{CLI.parent.parent / 'offload'}", "-o", str(exe), "-lpthread", "-ldl", "-lm"], check=True)
    usage = subprocess.run([str(exe), "--help"], capture_output=True, text=True).stdout
    good = {"int": "1", "float": "0.5", "bytes": "600MiB", "str": "x", "flag": None, "u64": "18446744073709551615",
            "backends": "opencl.device=0:1"}
    bad = {"int": "-7", "float": "x", "bytes": "600 furlongs", "choice": "nope", "u64": "-1", "backends": "opencl=1"}
    for o in O.for_front("runner") + O.for_front("runner", O.GEN_OPTIONS):
        assert o.flag in usage
        value = good.get(o.kind, o.choice_names[0] if o.choices else None)
        args = [str(exe), str(tmp_path / "none"), "--ids", "1", o.flag] + ([] if value is None else [value])
        r = subprocess.run(args, capture_output=True, text=True)
        assert r.returncode == 1 and "cannot load the package" in r.stderr, (o.flag, r.stderr)
        kind = "choice" if o.kind == "tristate" else o.kind
        if kind in bad:
            r = subprocess.run(args[:-1] + [bad[kind]], capture_output=True, text=True)
            assert r.returncode == 2 and o.flag in r.stderr and len(r.stderr.splitlines()) == 1, (o.flag, r.stderr)


def test_cli_and_api_read_a_row_alike():
    """A value given on the command line reaches Runtime.load as the API spells it (a negated flag inverted)."""
    assert O.api_kwargs({"no_expert_warm": True, "memory_budget": "1G", "unrelated": 1}) == \
        {"expert_warm": False, "memory_budget": "1G"}
    assert O.api_kwargs({"backend_option": ("opencl.device=0:1", "qnn_ort.npu_soc=x=y")}) == \
        {"backend_options": {"opencl.device": "0:1", "qnn_ort.npu_soc": "x=y"}}
