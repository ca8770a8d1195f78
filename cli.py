"""The `edgellm` command line. Errors print as one line on stderr with a non-zero exit. TVM is imported only by
`compile` (run/info/targets stay light)."""
from __future__ import annotations

import os
import sys

import click

from .errors import EdgeLLMError


def _positive(name):
    """click callback: an integer option that must be >= 1 when given (0 would silently mean "default")."""
    def check(ctx, param, value):
        if value is not None and value < 1:
            raise click.BadParameter(f"{value} is out of range: it must be >= 1", param_hint=name)
        return value
    return check


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="edgellm")
def cli():
    """Compile LLMs for devices with Apache TVM and run them with a small C runtime."""


@cli.command("compile")
@click.argument("model")
@click.option("--target", "-t", default="host", show_default=True, help="target name (see `edgellm targets`)")
@click.option("--quant", "-q", default=None,
              help="weight scheme: f32, f16, q8, q8g32, q4g32, q4g64, q4g128, t2, or auto (the scheme nearest the "
                   "checkpoint's own storage: a GGUF's block types) [default: f16; t2 for BitNet checkpoints]")
@click.option("--head-quant", default=None,
              help="scheme of the embedding table and lm_head: f32, f16, q8, q8g32, q6, q4g32, q4g64, q4g128 (q6: 6.5 "
                   "bits, llama.cpp's Q6_K output size) [default: the float scheme, q8g32 for integer ones]")
@click.option("--gptq", is_flag=True, help="GPTQ (second-order error compensation) instead of round-to-nearest, for q4 schemes")
@click.option("--calib", type=click.Path(), default=None,
              help="calibration text file for --gptq and the MoE expert guesser [default: built-in sample]")
@click.option("--act-order", is_flag=True, help="GPTQ: quantize columns in order of decreasing activation energy")
@click.option("-o", "--out", type=click.Path(), default=None,
              help="package directory [default: <model>-<quant>-<target>.edgellm]")
@click.option("--max-context", type=int, default=None, callback=_positive("--max-context"),
              help="longest sequence the package runs [default: min(model's, 4096)]")
@click.option("--prefill-chunk", type=int, default=None, callback=_positive("--prefill-chunk"),
              help="prefill chunk length C [default: the target's]")
@click.option("--tune", type=click.Choice(["off", "quick", "full"]), default=None,
              help="measure the CPU-dependent knobs (decode prefetch distances, prefill chunk) on this machine, "
                   "cached per CPU model [default: quick for --target host, off for cross targets; $EDGELLM_TUNE]")
@click.option("--npu-chunk", type=int, default=None, callback=_positive("--npu-chunk"),
              help="android-npu: tokens per NPU prefill chunk [default: 128]")
@click.option("--npu-quant", type=click.Choice(["w8a16", "w4a16", "w4a16-mixed"]), default="w8a16",
              show_default=True, help="android-npu: weight bits of the NPU graphs (activations 16-bit: --npu-act); "
              "w4a16-mixed keeps the V and FFN down projections in int8")
@click.option("--npu-act", type=click.Choice(["f16", "int16"]), default=None,
              help="android-npu: activations in float16 (block-quantized weights; no calibrated ranges to leave) or "
                   "16-bit integers with ranges calibrated on text [default: f16]")
@click.option("--soc", default=None, help="android-npu: SoCs to prepare EPContext binaries for, comma-separated "
              "(sm8550, sm8650, sm8750, or none) [default: all three]")
@click.option("--npu-weights", type=click.Choice(["rtn", "gptq"]), default="rtn", show_default=True,
              help="android-npu: weights rounded to nearest, or by GPTQ on the NPU's own grids over the calibration "
                   "text (lower error, minutes longer; w4a16 needs --npu-act f16)")
@click.option("--npu-residual", type=click.Choice(["int4", "off"]), default=None,
              help="android-npu w8a16: each projection also carries an int4 plane of what its int8 codes miss "
                   "(~11-bit weights for 1.5x the NPU weight bytes and a second MatMul; off: int8 only) "
                   "[default: int4 for w8a16]")
@click.option("--npu-outliers", type=click.Choice(["auto", "off"]), default="off", show_default=True,
              help="android-npu: compute outlier activation channels on the CPU in float (llm.npu's shadow "
                   "execution) where calibration finds them; each such layer ends its graph")
@click.option("--layout", type=click.Choice(["dense", "bundled"]), default="dense", show_default=True,
              help="bundled: FFN neurons stored in groups (up rows + down columns together) so a token under a "
                   "memory budget reads only the groups it uses (README \"Neuron window\")")
@click.option("--bundle-neurons", type=int, default=None,
              help="--layout bundled: neurons per group, a multiple of 32 dividing the FFN size (default: the "
                   "smallest giving at most 64 groups)")
@click.option("--ffn-threshold", type=float, default=None,
              help="--layout bundled: the package's default threshold (0: exact; run time: --ffn-threshold)")
@click.option("--expert-prefetch-distance", type=int, default=None,
              help="MoE: decode guesses layer L's experts from the residual stream entering layer L-D+1 (1: L's own "
                   "input, before its attention) so the expert cache reads them ahead; 0: no guesses [default: 1]")
@click.option("--expert-guesser", type=click.Choice(["fitted", "router"]), default="fitted", show_default=True,
              help="MoE: the guess is a per-layer map fitted on calibration text (--calib or built in), or the "
                   "layer's own router")
@click.option("--expert-guess-width", type=int, default=None,
              help="MoE: experts each guess names (the most likely ones), top-k .. all [default: top-k]")
@click.option("--swa-full", is_flag=True,
              help="sliding-window layers keep a KV cache of the whole context (as llama.cpp's --swa-full) instead "
                   "of only the rows their window sees: rewinding a conversation (reuse of a prompt prefix) then "
                   "never falls back to a full prefill, for more memory")
@click.option("--verify-tokens", type=click.IntRange(0, 32), default=None, metavar="N",
              help="tokens per pass of the verify program speculative decoding runs (2..32; 0: none) [default: 8; "
                   "bench/verify_cost.py measures what each width costs here]")
@click.option("--kv-cache", default="f32", show_default=True, metavar="f32|f16|q8|q4|K,V",
              help="the K/V caches' element type: f16 halves what a context's cache takes; q8 (int8 codes, a scale "
                   "per head and row) takes about 27% of f32 at +0.5-0.8% perplexity, q4 (4-bit codes of rotated "
                   "heads, a scale per 32) 14% at +5% (SmolLM2); K,V gives keys and values their own (q8,q4: keys q8, "
                   "values q4, 20% of f32; both float or both quantized) (CPU targets; README \"The KV cache\")")
@click.option("--quiet", is_flag=True, help="no progress output")
def compile_cmd(model, target, quant, head_quant, gptq, calib, act_order, out, max_context, prefill_chunk, tune,
                npu_chunk, npu_quant, npu_act, soc, npu_weights, npu_residual, npu_outliers, layout, bundle_neurons,
                ffn_threshold, expert_prefetch_distance, expert_guesser, expert_guess_width, swa_full, verify_tokens,
                kv_cache, quiet):
    """Compile MODEL (a Hugging Face checkpoint directory, hub id or demo name) into a package."""
    from .compiler.driver import compile_model

    compile_model(model, target=target, quant=quant, out=out, max_context=max_context, prefill_chunk=prefill_chunk,
                  progress=not quiet, head_quant=head_quant, gptq=gptq, calib=calib, act_order=act_order, tune=tune,
                  npu_chunk=npu_chunk, npu_quant=npu_quant, soc=soc, npu_outliers=npu_outliers == "auto",
                  layout=layout, bundle_neurons=bundle_neurons, ffn_threshold=ffn_threshold,
                  expert_prefetch_distance=expert_prefetch_distance, expert_guesser=expert_guesser,
                  expert_guess_width=expert_guess_width, npu_weights=npu_weights, npu_residual=npu_residual,
                  npu_act=npu_act, swa_full=swa_full, verify_tokens=verify_tokens, kv_cache=kv_cache)


@cli.command("tune")
@click.option("--show", is_flag=True, help="print this CPU's tune cache (the default action)")
@click.option("--clear", is_flag=True, help="delete this CPU's tune cache (the next compile measures again)")
def tune_cmd(show, clear):
    """This CPU's identity and the kernel timings `edgellm compile --tune` measured on it."""
    from .compiler.tune.cache import TuneCache

    cache = TuneCache()
    if clear:
        cache.path.unlink(missing_ok=True)
        click.echo(f"removed {cache.path}")
        return
    from .compiler.tune.report import describe

    click.echo(describe(cache))


def _gen_options(front: str) -> list:
    """This command's generation options, from the one table (runtime/python/options.py)."""
    from .runtime.python.options import GEN_OPTIONS, click_options

    return click_options(front, table=GEN_OPTIONS)


def _load_options(front: str, skip: tuple[str, ...] = ()) -> list:
    """This command's load options, from the one table (runtime/python/options.py)."""
    from .runtime.python.options import click_options

    return click_options(front, skip)


def _spec_cli_options(front: str, shift: bool = False) -> list:
    """--speculate / --draft-max (and with shift, --context-shift / --shift-sinks / --shift-tokens) of a command whose
    generation rows are not its own flags (serve: requests carry them; bench): the default of the runtime it loads."""
    from .runtime.python.options import SHIFT_OPTIONS, SPEC_OPTIONS, click_options

    return click_options(front, table=SPEC_OPTIONS + (SHIFT_OPTIONS if shift else ()))


def _with(options):
    def deco(f):
        for o in reversed(options):
            f = o(f)
        return f
    return deco


def _store_note(rt) -> str | None:
    """One stderr line on the memory budget (as read: every front end reads sizes alike) and streamed weights (None
    with no budget and everything resident)."""
    m, s = rt.memory(), rt.stats()
    budget = f"memory budget {m['budget']:,} bytes, weight policy {m['policy']}" if m["budget"] else ""
    if not m["streamed_bytes"]:
        return f"[{budget}]" if budget else None
    return (f"[{budget + '; ' if budget else ''}"
            f"weights: {m['pinned_bytes'] / 1e6:.1f} MB pinned + {m['window_bytes'] / 1e6:.1f} MB window, "
            f"{m['streamed_bytes'] / 1e6:.1f} MB streamed per token from {m['storage']}"
            f"{' (modelled)' if m['storage_modelled'] else ''}; read {s['io_bytes_read'] / 1e6:.1f} MB, "
            f"{s['io_stall_seconds']:.2f} s waiting for reads]")


def _sampling_options(f):
    """edgellm run's generation and load options: the two tables (runtime/python/options.py), and --stop."""
    from .runtime.python.options import GEN_OPTIONS, click_options

    opts = [*click_options("run", table=GEN_OPTIONS),
            click.option("--stop", multiple=True, help="stop string (repeatable)"),
            *_load_options("run")]
    for o in reversed(opts):
        f = o(f)
    return f


DEMO_PROMPT = "def read_config(path):"
DEMO_CHAT_TOKENS = 96   # the demo models learned 256-token windows: longer replies (after the template) turn to junk
SAMPLING = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
            "frequency_penalty")   # the sampler's knobs, as runtime/python/options.py's SAMPLING (tests/test_options.py)
NEUTRAL = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0,
           "presence_penalty": 0.0, "frequency_penalty": 0.0}


def describe_sampling(defaults: dict, given: dict) -> str:
    """One line on the sampling in effect: what was given, else the package's defaults (generation_config.json)."""
    eff = {k: given[k] if given.get(k) is not None else defaults[k] for k in SAMPLING}
    mode = "greedy" if eff["temperature"] <= 0 else "sampled"
    shown = [k for k in SAMPLING if abs(eff[k] - NEUTRAL[k]) > 1e-6 and not (mode == "greedy" and k in
                                                                           ("temperature", "top_k", "top_p", "min_p"))]
    from_pkg = any(given.get(k) is None for k in shown + (["temperature"] if mode == "sampled" else []))
    desc = ", ".join(f"{k.replace('_', '-')} {eff[k]:g}" for k in shown)
    sep = " with " if mode == "sampled" else ", "
    return mode + (f"{sep}{desc}" if desc else "") + (" (package defaults from generation_config.json)" if from_pkg else "")


@cli.command("run")
@click.argument("package", type=click.Path(), required=False)
@click.option("-m", "--model", default=None,
              help="checkpoint dir, hub id or demo name to compile on first use into the cache [default: demo]")
@click.option("-p", "--prompt", default=None, help=f"prompt text [default with the demo model: {DEMO_PROMPT!r}]")
@click.option("--ids", default=None, help="the prompt as token ids, comma-separated (instead of -p: packages without "
              "a tokenizer, or exact ids)")
@click.option("--quant", "-q", default=None, help="scheme when compiling --model [default: f16; t2 for BitNet]")
@click.option("--quiet", is_flag=True, help="only the generated text: no compile progress, summary or notes on "
              "stderr (errors still go there)")
@click.option("--json", "json_out", is_flag=True, help="constrain the output to a JSON object")
@click.option("--json-schema", type=click.Path(dir_okay=False), default=None,
              help="constrain the output to JSON valid against the schema in this file")
@click.option("--grammar", type=click.Path(dir_okay=False), default=None,
              help="constrain the output to a grammar in this file: Lark (llguidance's), or GBNF if it ends in .gbnf")
@click.option("--prompt-cache", type=click.Path(dir_okay=False), default=None,
              help="a saved context: loaded first, so the start of the prompt it holds is not prefilled again, and "
              "saved after the run (created when missing; only from this package, with the same load settings)")
@_sampling_options
def run_cmd(package, model, prompt, ids, quant, quiet, json_out, json_schema, grammar, prompt_cache, max_new_tokens,
            temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty, seed, stop,
            ignore_eos, **load):
    """Generate text from PACKAGE (or --model, default: the bundled demo), streaming it to stdout; a tok/s summary
    goes to stderr. Sampling options not given come from the package (its generation_config.json), as in
    Runtime.generate and bin/edgellm-run: the same arguments and seed give the same tokens everywhere."""
    from .errors import InputError
    from .runtime import Runtime

    if any(s == "" for s in stop):
        raise InputError("--stop '' is invalid: a stop string needs at least one character")
    if package == "" or model == "":
        raise InputError("an empty package or model name: give a package directory, a checkpoint, or leave it out "
                         "for the demo")
    if package and model:
        raise click.UsageError("give a PACKAGE or --model, not both")
    if prompt is not None and ids is not None:
        raise click.UsageError("give -p or --ids, not both")
    if ids is not None:
        try:
            prompt = [int(x) for x in ids.split(",")]
        except ValueError:
            raise InputError(f"--ids {ids!r}: give token ids as comma-separated integers, e.g. --ids 1,2,3") from None
    model = model or package or "demo"
    package = _package_arg(model, quant, progress=not quiet)   # a package, or a model compiled into the cache
    echo = prompt is None and _is_demo_name(model)
    if echo:   # the default prompt is shown, so the output does not start mid-line
        prompt = DEMO_PROMPT
    if prompt is None:
        raise click.UsageError("give a prompt with -p (or token ids with --ids)")
    constrain = _constraint_args(json_out, json_schema, grammar)
    given = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p,
             "repetition_penalty": repetition_penalty, "presence_penalty": presence_penalty,
             "frequency_penalty": frequency_penalty}
    from .runtime.python.options import api_kwargs

    with Runtime.load(package, **api_kwargs(load)) as rt:
        r: dict = {}
        if echo:
            sys.stdout.write(prompt)
        if prompt_cache and os.path.exists(prompt_cache):
            rt.context.load(prompt_cache)
        for piece in rt.stream(prompt, max_new_tokens=max_new_tokens, seed=seed, stop=list(stop),
                               ignore_eos=ignore_eos, _result=r, reuse_prefix=bool(prompt_cache), **constrain, **given):
            sys.stdout.write(piece)
            sys.stdout.flush()
        click.echo()
        if prompt_cache:
            rt.context.save(prompt_cache)
        if quiet:
            return
        if prompt_cache:
            click.echo(f"[prompt cache {prompt_cache}: {r['cached_tokens']} of {r['prompt_tokens']} prompt tokens "
                       f"were in it; it now holds {rt.context.pos}]", err=True)
        pf = r["prompt_tokens"] / r["prefill_s"] if r["prefill_s"] else 0.0
        dc = r["n_decoded"] / r["decode_s"] if r["decode_s"] else 0.0
        click.echo(f"[{r['prompt_tokens']} prompt tokens, {len(r['ids'])} generated ({r['finish_reason']}); "
                   f"prefill {pf:.1f} tok/s, decode {dc:.1f} tok/s, "
                   f"{rt.device.split(' (')[0] if rt.device else f'{rt.threads} threads'}; "
                   f"{describe_sampling(rt.sampling_defaults(), given)}]", err=True)
        note = _store_note(rt)
        if note:
            click.echo(note, err=True)
        s = rt.context.stats()
        if s["context_shifts"]:
            click.echo(f"[context shift: {s['context_shifts']} times, {s['shift_tokens_run']} kept tokens run again]",
                       err=True)
        if s["spec_passes"]:
            click.echo(f"[speculative: {s['spec_passes']} passes carried {s['spec_drafted']} drafts, "
                       f"{s['spec_accepted']} taken: {(s['spec_passes'] + s['spec_accepted']) / s['spec_passes']:.2f} "
                       f"tokens per pass]", err=True)
        if s["spec_drafted_model"]:
            click.echo(f"[draft model: {s['spec_drafted_model']} of the drafts, {s['spec_accepted_model']} taken "
                       f"({s['spec_accepted_branch']} of them its second or third choice)]", err=True)


def _constraint_args(json_out: bool, json_schema: str | None, grammar: str | None) -> dict:
    """run's --json / --json-schema / --grammar as Runtime.stream's response_format / grammar."""
    import json
    from pathlib import Path

    from .errors import InputError

    if sum(map(bool, (json_out, json_schema, grammar))) > 1:
        raise click.UsageError("give one of --json, --json-schema and --grammar")

    def read(path: str, flag: str) -> str:
        try:
            return Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(f"{flag} {path}: {getattr(e, 'strerror', None) or e}") from None

    if json_out:
        return {"response_format": {"type": "json_object"}}
    if json_schema:
        try:
            schema = json.loads(read(json_schema, "--json-schema"))
        except ValueError as e:
            raise InputError(f"--json-schema {json_schema} is not JSON: {e}") from None
        return {"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}
    if grammar:
        kind = "gbnf" if grammar.endswith(".gbnf") else "lark"
        return {"grammar": {"type": kind, "value": read(grammar, "--grammar")}}
    return {}


def _is_demo_name(name: str) -> bool:
    from pathlib import Path

    from .models.demo import DEMO_MODELS

    return name in DEMO_MODELS and not Path(name).exists()


def _package_arg(package_or_model: str | None, quant: str | None, progress: bool = True) -> str:
    """A package directory as given, else a model (checkpoint dir, hub id, demo name) compiled into the cache."""
    from pathlib import Path

    from .errors import InputError

    if package_or_model == "":
        raise InputError("an empty package or model name: give a package directory, a checkpoint, or leave it out "
                         "for the demo")
    p = Path(package_or_model or "demo")
    from .models.gguf import gguf_in_dir, is_gguf_file

    gguf = is_gguf_file(p) or (p.is_dir() and not (p / "manifest.json").is_file() and gguf_in_dir(p) is not None)
    if p.exists() and not (p / "config.json").is_file() and not gguf:
        return str(p)   # a package (or what should be one: its loader says what is wrong), never compiled
    s = str(package_or_model or "")
    if not p.exists() and (p.is_absolute() or s.startswith((".", "~")) or s.count("/") > 1):
        raise InputError(f"{s} is not a package directory (nothing is there): give a package, a checkpoint folder, "
                         "a demo name or a Hugging Face id")
    from .compiler.cache import package_or_model as resolve

    return str(resolve(package_or_model or "demo", quant=quant, progress=progress))


@cli.command("serve")
@click.argument("package_or_model", required=False)
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on (other than loopback: "
              "needs --api-key)")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True, help="0: any free port")
@click.option("--parallel", "-np", type=click.IntRange(1, 64), default=1, show_default=True,
              help="slots: conversations generated at once (each its own KV cache); more requests queue")
@click.option("--api-key", default=None, envvar="EDGELLM_API_KEY",
              help="require 'Authorization: Bearer KEY' on the API [$EDGELLM_API_KEY]")
@click.option("--name", default=None, help="model id the API reports [default: the model's name]")
@click.option("--quant", "-q", default=None, help="scheme when compiling a model [default: f16; t2 for BitNet]")
@_with(_load_options("serve"))
@_with(_spec_cli_options("serve", shift=True))
@click.option("--allowed-hosts", default="", help="Host names the server answers to besides IP addresses, localhost "
              "and this machine's name, comma-separated ('*': any; DNS-rebinding protection)")
@click.option("--allowed-origins", default="", help="web origins whose pages may call the API (CORS), "
              "comma-separated, e.g. http://localhost:3000 ('*': any) [default: none but the server's own page]")
@click.option("--max-body", default="4MiB", show_default=True, help="largest request body (413 beyond it)")
@click.option("--prompt-cache-dir", type=click.Path(file_okay=False), default=None,
              help="keep the prompt prefixes requests share (a system prompt) in this folder across restarts: a "
              "request that starts with one prefills only the rest")
@click.option("--prompt-cache-size", default="1GiB", show_default=True,
              help="--prompt-cache-dir holds at most this much; the least recently used prefixes go first")
def serve_cmd(package_or_model, host, port, parallel, api_key, name, quant, allowed_hosts, allowed_origins, max_body,
              prompt_cache_dir, prompt_cache_size, **load):
    """Serve PACKAGE_OR_MODEL (default: the demo) over an OpenAI-compatible HTTP API with a chat page at /:
    /v1/chat/completions, /v1/completions, /v1/models, /health, /metrics. Bound to 127.0.0.1 unless told otherwise."""
    from pathlib import Path

    from .runtime.python.options import api_kwargs
    from .runtime.serve.server import serve

    load = api_kwargs(load)
    threads = load.pop("threads")
    if load.get("context_shift") is None:   # a conversation outgrowing the context goes on
        load["context_shift"] = "on"
    if package_or_model == "":
        _package_arg(package_or_model, quant)   # the one-line error
    serve(lambda: _package_arg(package_or_model, quant), host=host, port=port, parallel=parallel, api_key=api_key,
          threads=threads, model_id=name,
          load=load,
          allowed_hosts=[h for h in allowed_hosts.split(",") if h.strip()],
          allowed_origins=[o for o in allowed_origins.split(",") if o.strip()], max_body=max_body,
          prompt_cache_dir=prompt_cache_dir, prompt_cache_size=prompt_cache_size,
          aliases=[] if name or (package_or_model and Path(package_or_model).exists()) else [package_or_model or "demo"])


@cli.command("chat")
@click.argument("package_or_model", required=False)
@click.option("--system", default=None, help="system prompt")
@click.option("--tools", "tools_file", type=click.Path(dir_okay=False), default=None,
              help="JSON file of OpenAI function tools to offer the model; its calls are shown and you type each "
                   "result")
@click.option("--quant", "-q", default=None, help="scheme when compiling a model [default: f16; t2 for BitNet]")
@click.option("-n", "--max-new-tokens", type=click.IntRange(min=1), default=None,
              help="longest reply [default: 512; the demo models: 96, inside the 256-token windows they learned]")
@_with(_gen_options("chat"))
@_with(_load_options("chat"))
def chat_cmd(package_or_model, system, tools_file, quant, max_new_tokens, temperature, top_k, top_p,
             repetition_penalty, seed, **load):
    """Chat with PACKAGE_OR_MODEL (default: the demo) in the terminal: the package's chat template, streamed replies,
    the conversation kept in the KV cache (each turn prefills only its new tokens). /reset, /system TEXT, /quit.
    Reads one message per line from stdin when it is not a terminal."""
    from .runtime import Runtime
    from .runtime.python.chat_repl import chat_repl

    tools = _tools_file(tools_file) if tools_file else None
    pkg = _package_arg(package_or_model, quant)
    demo = _is_demo_name(package_or_model or "demo")
    if demo:
        click.echo("demo: a 6M-parameter model trained on the Python standard library, not a chat model; its "
                   "replies continue text. For a real chat: edgellm chat HuggingFaceTB/SmolLM2-135M-Instruct", err=True)
    max_new_tokens = max_new_tokens or (DEMO_CHAT_TOKENS if demo else 512)
    sampling = {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_k": top_k, "top_p": top_p,
                "repetition_penalty": repetition_penalty, "seed": seed}
    from .runtime.python.options import api_kwargs

    load = api_kwargs(load)
    if load.get("context_shift") is None:   # a conversation outgrowing the context goes on
        load["context_shift"] = "on"
    with Runtime.load(pkg, **load) as rt:
        chat_repl(rt, system=system, sampling=sampling, tools=tools)


def _tools_file(path: str) -> list:
    """chat --tools: a JSON list of OpenAI tools (or {"tools": [...]}, as in a request body), checked."""
    import json
    from pathlib import Path

    from .errors import InputError
    from .runtime.python.tools import check_tools

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"--tools {path}: {getattr(e, 'strerror', None) or e}") from None
    except ValueError as e:
        raise InputError(f"--tools {path} is not JSON: {e}") from None
    return check_tools(data.get("tools") if isinstance(data, dict) else data)


@cli.group("eval")
def eval_group():
    """Evaluate a package (or a model, compiled on first use)."""


@eval_group.command("ppl")
@click.argument("packages_or_models", nargs=-1, required=True)
@click.option("--text", "text_file", type=click.Path(), default=None,
              help="text file to score [default: the demo models' held-out text]")
@click.option("--context", type=int, default=None, callback=_positive("--context"),
              help="window length in tokens [default: min(max context, 1024)]")
@click.option("--stride", type=int, default=None, callback=_positive("--stride"), help="window step [default: context/2]")
@click.option("--max-tokens", type=int, default=None, callback=_positive("--max-tokens"),
              help="score only the first N tokens of the text")
@click.option("--quant", "-q", default=None, help="scheme when compiling a model [default: f16; t2 for BitNet]")
@click.option("--threads", type=click.IntRange(1, 256), default=None)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@click.option("--quiet", is_flag=True)
def eval_ppl_cmd(packages_or_models, text_file, context, stride, max_tokens, quant, threads, as_json, quiet):
    """Perplexity of a text file through the runtime (sliding window). Several packages: one comparison table."""
    import json
    from pathlib import Path

    from tqdm import tqdm

    from .compiler.cache import package_or_model as resolve
    from .errors import InputError
    from .models.demo import HELDOUT
    from .runtime import Runtime
    from .runtime.python.perplexity import perplexity

    path = Path(text_file) if text_file else HELDOUT
    if not path.is_file():
        raise InputError(f"text file {path} does not exist")
    text = path.read_text(encoding="utf-8", errors="replace")
    results = []
    for arg in packages_or_models:
        pkg = resolve(arg, quant=quant, progress=not quiet)
        with Runtime.load(pkg, threads=threads) as rt:
            n = len(rt.text.encode(text)) if max_tokens is None else max_tokens
            with tqdm(total=n, unit="tok", disable=quiet, leave=False, desc=f"ppl {Path(pkg).name}") as bar:
                r = perplexity(rt, text, context, stride, max_tokens, progress=lambda end: bar.update(end - bar.n))
            q = rt.manifest.get("quant", {})
        r.update(package=str(pkg), text=str(path), scheme=q.get("scheme"), bits_per_weight=q.get("bits_per_weight"))
        results.append(r)
    if as_json:
        click.echo(json.dumps(results[0] if len(results) == 1 else results))
    elif len(results) == 1:
        r = results[0]
        click.echo(f"perplexity {r['ppl']:.3f} (nll {r['nll']:.4f}/token) over {r['tokens']} tokens of {path.name}, "
                   f"context {r['context']}, stride {r['stride']}, package {r['package']}")
    else:
        base = results[0]["ppl"]
        click.echo(f"{results[0]['tokens']} tokens of {path.name}, context {results[0]['context']}, "
                   f"stride {results[0]['stride']}")
        click.echo(f"{'package':<40} {'scheme':<8} {'bits/w':>7} {'ppl':>10} {'vs first':>9}")
        for r in results:
            click.echo(f"{Path(r['package']).name:<40} {r['scheme'] or '-':<8} {r['bits_per_weight'] or 0:>7.2f} "
                       f"{r['ppl']:>10.3f} {100 * (r['ppl'] / base - 1):>+8.2f}%")


@cli.command("bench")
@click.argument("package", type=click.Path())
@click.option("--prompt-len", type=int, default=128, show_default=True, help="prompt tokens prefilled")
@click.option("--gen-len", type=int, default=64, show_default=True, help="tokens decoded (end-of-sequence ignored)")
@click.option("--threads", type=click.IntRange(1, 256), default=None, help="threads [default: one per CPU]")
@click.option("--reps", type=int, default=3, show_default=True, help="timed repetitions (the median is reported)")
@click.option("--seed", type=click.IntRange(min=0, max=2**32 - 1), default=0, show_default=True,
              help="seed of the random prompt ids")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@_with(_load_options("run", skip=("threads", "digest")))
@_with(_spec_cli_options("run"))
def bench_cmd(package, prompt_len, gen_len, threads, reps, seed, as_json, **load):
    """Prefill and decode speed of PACKAGE: tok/s, time to first token, peak RSS (one warm-up, median of --reps)."""
    import json

    from .runtime.python.bench import bench, format_bench

    package = _package_arg(package, None)
    from .runtime.python.options import api_kwargs

    r = bench(package, prompt_len=prompt_len, gen_len=gen_len, threads=threads, reps=reps, seed=seed,
              **api_kwargs(load))
    click.echo(json.dumps(r) if as_json else format_bench(r))


@cli.command("plan")
@click.argument("package", type=click.Path())
@_with(_load_options("plan"))
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def plan_cmd(package, as_json, **load):
    """How PACKAGE would use memory under a budget: what stays resident, what streams each token, and the decode
    speed the storage allows. Reads no weights."""
    import json

    from .runtime.python.memory_plan import format_plan, plan
    from .runtime.python.options import api_kwargs

    package = _package_arg(package, None)
    p = plan(package, **api_kwargs(load))
    click.echo(json.dumps(p) if as_json else format_plan(p))


@cli.command("info")
@click.argument("package", type=click.Path())
def info_cmd(package):
    """Describe a package: model, target, quantization, sizes."""
    package = _package_arg(package, None)
    from pathlib import Path

    from .runtime.python.package import package_digest, read_manifest

    from .models.rope import table_of as rope_table_of

    m = read_manifest(package)
    c = m["model"]["config"]
    n_params = m["quant"].get("n_params")
    if not isinstance(n_params, int) or isinstance(n_params, bool):
        n_params = sum(int(__import__("math").prod(t["shape"])) for t in m["tensors"] if not rope_table_of(t["name"]))
    size = sum(f.stat().st_size for f in Path(package).rglob("*") if f.is_file())
    sampling = m.get("sampling_defaults") if isinstance(m.get("sampling_defaults"), dict) else {}
    rows = [
        ("model", f"{m['model']['arch']} from {m['model']['source']}"),
        ("shape", f"{c['n_layers']} layers, dim {c['hidden_size']}, {c['n_heads']} heads / {c['n_kv_heads']} kv heads, "
                  f"head_dim {c['head_dim']}, ffn {c['intermediate_size']}, vocab {c['vocab_size']}"),
        ("parameters", f"{n_params / 1e6:.2f} M"),
        ("target", f"{m['target']['name']} (" + ("OpenCL kernels, any OpenCL 1.2 device; runner "
                                               f"{m['target']['arch']})" if "opencl" in m.get("files", {}) else
                                               f"{m['target']['arch']}; needs {', '.join(m['target']['features']) or '-'})")),
        ("quant", _quant_line(m["quant"])),
        *(("source", line) for line in _source_lines(m["quant"].get("source_types"))),
        ("context", f"max {m['max_context']} tokens, prefill chunk {m['prefill_chunk']}"
                    + (f" (prompt tails: {m['prefill_short_chunk']})" if m.get("prefill_short_chunk") else "")
                    + (f"; verifies {m['verify_tokens']} tokens per pass (--speculate)" if m.get("verify_tokens")
                       else "; no verify program (--speculate off)")),
        ("kernels", f"{len(m['kernels'])}"),
        ("tuning", _tuning_line(m.get("tuning"))),
        ("memory", f"weights {m['weights_bytes'] / 2**20:.1f} MiB, activations {m['arena_bytes'] / 2**20:.2f} MiB, "
                   + _kv_line(m, c)),
        ("package", f"{size / 2**20:.1f} MiB on disk, format {m['format_version']}, edgellm {m['edgellm_version']}"),
        ("tokenizer", m["files"].get("tokenizer") or "none (token ids only)"),
        ("sampling", (describe_sampling({**NEUTRAL, **sampling}, {}).replace(" (package defaults from "
                                                                          "generation_config.json)", "")
                      + (" (generation_config.json)" if sampling else ""))),
        *(("npu", line) for line in _npu_lines(m.get("npu"))),
        *((("ffn", f"neuron-bundled: {sorted(set(f['groups_per_ffn']))[0]} groups of {f['group']} neurons per FFN, "
                   f"default threshold {f['default_threshold']:g} (--ffn-threshold)"),)
          if isinstance(f := m.get("ffn"), dict) and f.get("groups_per_ffn") else ()),
        *(("experts", line) for line in _moe_lines(m.get("moe"))),
        ("digest", package_digest(package)),
    ]
    for k, v in rows:
        click.echo(f"{k:>11}: {v}")


def _npu_lines(npu) -> list[str]:
    """The NPU graphs of an android-npu package: one line for the graphs, one per SoC with prepared binaries."""
    if not isinstance(npu, dict) or not npu.get("groups"):
        return []
    g = npu["groups"]
    err = (npu.get("error_vs_f32") or {}).get("hidden_out")
    spans = ", ".join(f"layers {x['layers'][0]}-{x['layers'][1] - 1}" for x in g)
    line = f"{len(g)} prefill graph(s) of {npu['chunk']} tokens ({spans}), {npu.get('quant')}, "
    line += f"{sum(x['bytes'] for x in g) / 2**20:.1f} MiB"
    if isinstance(err, float):
        med = (npu.get("error_vs_f32") or {}).get("hidden_out_token_median")
        line += f", hidden-state error vs f32 {err:.2%}" + (f" (median token {med:.2%})" if isinstance(med, float) else "")
    out = [line]
    if npu.get("cpu_positions"):
        out.append(f"position 0 (the attention sink) prefills on the CPU; calibrated on "
                   f"{(npu.get('calibration') or {}).get('source', '?')}; weights {npu.get('weights', '?')}")
    for what, (how, why) in sorted((npu.get("precision") or {}).items()):
        out.append(f"{what}: {how} ({why})")
    for soc, v in sorted((npu.get("socs") or {}).items()):
        out.append(f"{soc} (Hexagon v{v.get('htp_arch')}): prepared, {v.get('bytes', 0) / 2**20:.1f} MiB")
    if not npu.get("socs"):
        out.append("no prepared SoC binaries: the ONNX graphs are prepared at load (slow first load)")
    return out


def _tuning_line(t) -> str:
    if not isinstance(t, dict) or t.get("mode") in (None, "off"):
        return "off (the target's default knobs)"
    knobs = [f"{c} prefetch {b} B" for c, b in sorted((t.get("prefetch_bytes") or {}).items())]
    if t.get("prefill_chunk"):
        knobs.append(f"prefill chunk {t['prefill_chunk']}")
    knobs += [f"prefill blocking {b} at {n} tokens" for n, b in sorted((t.get("prefill_blocking") or {}).items())]
    knobs += [f"GEMV rows {r} at K={k}" for k, r in sorted((t.get("gemv_rows") or {}).items())]
    return f"{t['mode']} on {t.get('cpu', '?')}: {', '.join(knobs) or '-'}"


def _moe_lines(moe) -> list[str]:
    """The expert table of an MoE package (manifest "moe"), as `edgellm info` prints it."""
    if not isinstance(moe, dict):
        return []
    try:
        shared = f" + a shared expert (ffn {moe['shared_expert']})" if moe.get("shared_expert") else ""
        return [f"{moe['experts']} per layer in {moe['moe_layers']} layers, top-{moe['top_k']}"
                f"{' (renormalized)' if moe.get('norm_topk_prob') else ''}{shared}",
                f"{moe['params_active'] / 1e6:.2f} M of {moe['params_total'] / 1e6:.2f} M parameters active per token; "
                f"{moe['weights_read_per_token'] / 2**20:.2f} MiB of weights read per decoded token",
                *_guess_lines(moe)]
    except (KeyError, TypeError, ValueError):
        return []


def _guess_lines(moe: dict) -> list[str]:
    """How decode guesses the experts ahead (--expert-prefetch-distance, --expert-guesser)."""
    d = moe.get("prefetch_distance")
    if not d:
        return ["no expert guesses (compiled with --expert-prefetch-distance 0)"] if d == 0 else []
    line = (f"guesses each layer's {moe.get('guess_width') or moe['top_k']} experts {d} layer{'s' if d > 1 else ''} "
            f"ahead with {'a fitted guesser' if moe.get('guesser') == 'fitted' else 'the routers'}")
    g = moe.get("guess")
    if isinstance(g, dict) and g.get("recall_fitted"):
        fitted = sum(g["recall_fitted"].values()) / len(g["recall_fitted"])
        router = sum(g["recall_router"].values()) / len(g["recall_router"])
        line += (f" (recall on {g['calibration_tokens']} calibration tokens, {g['calibration']}: {100 * fitted:.0f}%; "
                 f"the routers' {100 * router:.0f}%)")
    return [line]


KEPT_WORDS = {True: "kept exactly", "codes": "codes kept, each group's scale and minimum rounded to f16"}


def _source_lines(types) -> list[str]:
    """Per stored type of the checkpoint's matrices (a GGUF's block types): which scheme took them and whether their
    values were kept exactly or requantized."""
    if not isinstance(types, dict):
        return []
    out = []
    for t, row in sorted(types.items()):
        if isinstance(row, dict):
            out += [f"{t}: {r.get('tensors')} matrices -> {sch}, {KEPT_WORDS.get(r.get('kept'), 'requantized')}"
                    for sch, r in sorted(row.items()) if isinstance(r, dict)]
    return out


def _kv_line(m: dict, c: dict) -> str:
    """The KV cache of one context, and what the sliding-window layers' window caches save."""
    from types import SimpleNamespace

    from .compiler.kv_layout import kv_bits, kv_cache_bytes

    spec = SimpleNamespace(n_kv_heads=c["n_kv_heads"], head_dim=c["head_dim"])
    full = [(m["kv_rows"], 0)] * c["n_layers"]
    layers = [tuple(x) for x in m.get("kv_layers") or full]
    kind = m.get("kv_cache", "f32")
    bits = kv_bits(kind)
    have, whole = kv_cache_bytes(spec, layers, bits), kv_cache_bytes(spec, full, bits)
    n = sum(rows < m["kv_rows"] for rows, _ in layers)
    return f"KV cache {have / 2**20:.1f} MiB" + (f" ({kind})" if kind != "f32" else "") + (
        f" ({n} sliding-window layers keep {min(r for r, _ in layers)} of {m['kv_rows']} rows: "
        f"{(whole - have) / 2**20:.1f} MiB ({100 * (whole - have) / whole:.0f}%) less than {whole / 2**20:.1f} MiB)"
        if n else "")


def _quant_line(q: dict) -> str:
    head = f", embedding/head {q['head']}" if isinstance(q.get("head"), str) else ""
    method = f" ({q['method']})" if q.get("method") not in (None, "rtn") else ""
    mixed = q.get("matrix_schemes") if isinstance(q.get("matrix_schemes"), dict) else {}
    also = "".join(f" + {s} ({n} matrices)" for s, n in sorted(mixed.items()))
    return f"{q['scheme']}{also}{method}{head}: {q['bits_per_weight']} bits per weight over all weights"


@cli.group("cache")
def cache_group():
    """Packages compiled on first use (`edgellm run demo`, `--model`, `serve`, `chat`, `eval`): list and remove them."""


def _age(seconds: float) -> str:
    for unit, n in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= n:
            return f"{seconds / n:.0f} {unit} ago"
    return "just now"


@cache_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="print one JSON array")
def cache_list_cmd(as_json):
    """Name, source, target, scheme, size and last use of every cached package."""
    import json
    import time

    from .compiler.cache import cached_packages, packages_root

    rows = cached_packages()
    if as_json:
        click.echo(json.dumps(rows))
        return
    if not rows:
        click.echo(f"no cached packages ({packages_root()})")
        return
    now = time.time()
    click.echo(f"{'NAME':<48} {'SOURCE':<28} {'TARGET':<8} {'SCHEME':<7} {'SIZE':>9}  LAST USED")
    for r in rows:
        click.echo(f"{r['name']:<48} {str(r['source'] or '?')[-28:]:<28} {r['target'] or '?':<8} "
                   f"{r['scheme'] or '?':<7} {r['bytes'] / 2**20:>7.1f}MB  {_age(now - r['last_used'])}")
    click.echo(f"{len(rows)} package(s), {sum(r['bytes'] for r in rows) / 2**20:.1f} MB in {packages_root()}")


@cache_group.command("rm")
@click.argument("names", nargs=-1)
@click.option("--all", "everything", is_flag=True, help="remove every cached package")
def cache_rm_cmd(names, everything):
    """Remove cached packages by NAME (as `edgellm cache list` shows them), or --all."""
    from .compiler.cache import cached_packages, remove_cached
    from .errors import InputError

    if bool(names) == everything:
        raise InputError("give package names (see `edgellm cache list`) or --all")
    names = [r["name"] for r in cached_packages()] if everything else names
    freed = sum(remove_cached(n) for n in names)
    click.echo(f"removed {len(names)} package(s), {freed / 2**20:.1f} MB freed")


@cache_group.command("prune")
@click.option("--older-than", required=True, help="remove packages not used for this long: 30d, 12h, 90min")
def cache_prune_cmd(older_than):
    """Remove the cached packages not used for --older-than."""
    import re
    import time

    from .compiler.cache import cached_packages, remove_cached
    from .errors import InputError

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(d|h|min|m|s)\s*", older_than)
    if not m:
        raise InputError(f"--older-than {older_than!r}: give a number and a unit, e.g. 30d, 12h or 90min")
    age = float(m.group(1)) * {"d": 86400, "h": 3600, "min": 60, "m": 60, "s": 1}[m.group(2)]
    old = [r for r in cached_packages() if time.time() - r["last_used"] > age]
    freed = sum(remove_cached(r["name"]) for r in old)
    click.echo(f"removed {len(old)} package(s) not used for {older_than.strip()}, {freed / 2**20:.1f} MB freed")


@cli.command("schema")
@click.argument("schema", required=False, type=click.Path(dir_okay=False))
@click.option("--regex", help="a regular expression over the output text instead of a JSON schema")
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False), help="the automaton file to write")
def schema_cmd(schema, regex, out):
    """Compile a JSON schema (a file) or --regex into an automaton for `bin/edgellm-run --constraint FILE` and the
    Android library, which link no grammar engine. One file serves every package."""
    import json
    from pathlib import Path

    from .runtime.python import automaton

    if (schema is None) == (regex is None):
        raise EdgeLLMError("give a JSON schema file or --regex, one of them")
    if regex is not None:
        data = automaton.compile_regex(regex)
    else:
        try:
            text = Path(schema).read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise EdgeLLMError(f"cannot read the schema {schema}: {getattr(e, 'strerror', None) or e}") from None
        try:
            json.loads(text)
        except json.JSONDecodeError as e:
            raise EdgeLLMError(f"{schema} is not JSON: {e.msg} at line {e.lineno}") from None
        data = automaton.compile_schema(text)
    automaton.write(data, Path(out))
    a = automaton.Automaton(data)
    click.echo(f"wrote {out}: {a.n} nodes, {a.nc} byte classes, {len(data) / 1024:.1f} KiB", err=True)


@cli.command("targets")
def targets_cmd():
    """List compilation targets."""
    from .targets import list_targets

    for t in list_targets():
        click.echo(f"{t.name:<12} {t.description} [quant: {', '.join(t.quants)}]")


def main(argv=None) -> int:
    try:
        cli.main(args=argv, prog_name="edgellm", standalone_mode=False)
        return 0
    except EdgeLLMError as e:
        click.echo(f"error: {e}", err=True)
        return 1
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as e:  # bad usage: one line, not click's multi-line block
        click.echo(f"error: {e.format_message()} (see --help)", err=True)
        return e.exit_code
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    except BrokenPipeError:   # `edgellm run ... | head`
        sys.stderr.close()
        return 141


if __name__ == "__main__":
    sys.exit(main())
