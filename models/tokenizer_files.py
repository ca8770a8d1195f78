"""Checks of a checkpoint's tokenizer and generation files at compile time, before they are copied into a package:
each failure is one CompileError line that names the file (and key) and says what to do.

Files that are present but not regular files (a FIFO, a device) are refused without being opened: opening a FIFO
for reading blocks until a writer appears."""
from __future__ import annotations

import json
import math
from pathlib import Path

from ..errors import CompileError, first_line, short_repr

REDOWNLOAD = "re-download the checkpoint"






def _present(path: Path) -> bool:
    """True for a regular file; False when absent; CompileError for anything else that sits at the path."""
    if path.is_file():
        return True
    if path.exists() or path.is_symlink():
        what = "a dangling link" if not path.exists() else "not a regular file"
        raise CompileError(f"{path} is {what}; {REDOWNLOAD}")
    return False


def _read_json_object(path: Path) -> dict:
    try:
        obj = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as e:
        raise CompileError(f"{path} cannot be read ({e.strerror or e})") from e
    except UnicodeDecodeError as e:
        raise CompileError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}); {REDOWNLOAD}") from e
    except (ValueError, RecursionError) as e:   # JSONDecodeError, over-long integer literals, absurd nesting
        raise CompileError(f"{path} is not valid JSON ({first_line(e)}); {REDOWNLOAD}") from e
    if not isinstance(obj, dict):
        raise CompileError(f"{path} is not a JSON object (it holds a {type(obj).__name__}); {REDOWNLOAD}")
    return obj


def _check_token(path: Path, key: str, v) -> None:
    """bos_token/eos_token: a string, null, or an AddedToken object {"content": str, ...}."""
    if v is None or isinstance(v, str):
        return
    if isinstance(v, dict) and isinstance(v.get("content"), str):
        return
    raise CompileError(f"{path}: {key} must be a string, null or an object with a string \"content\", got {short_repr(v)}; "
                       f"fix the file or {REDOWNLOAD}")


def _check_chat_template(path: Path, key: str, v) -> None:
    """A Jinja string, or a list of named templates [{"name": str, "template": str}, ...] (null: none)."""
    if v is None or isinstance(v, str):
        return
    if isinstance(v, list) and all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                   and isinstance(t.get("template"), str) for t in v):
        return
    raise CompileError(f"{path}: {key} must be a string or a list of {{\"name\": str, \"template\": str}}, got "
                       f"{short_repr(v)}; fix the file or {REDOWNLOAD}")


def _load_tokenizer(path: Path) -> None:
    try:
        from tokenizers import Tokenizer
    except ImportError as e:  # pragma: no cover - dependency of the package
        raise CompileError(f"the tokenizers package is not installed ({e}); pip install tokenizers") from e
    from ..errors import rust_panics_silenced

    try:
        with rust_panics_silenced():
            Tokenizer.from_file(str(path))
    except BaseException as e:   # tokenizers raises plain Exception; a Rust panic is a BaseException (PanicException)
        if isinstance(e, (KeyboardInterrupt, SystemExit, GeneratorExit)):
            raise
        raise CompileError(f"tokenizer.json is corrupt: {first_line(e)}; {REDOWNLOAD}") from None


def check_tokenizer_files(model_dir: Path) -> None:
    """tokenizer.json loads with `tokenizers`; tokenizer_config.json / special_tokens_map.json are JSON objects whose
    chat_template and bos/eos tokens have the types transformers reads; chat_template.json / .jinja (the newer
    transformers' separate template files) are well-formed. Absent files are fine."""
    model_dir = Path(model_dir)
    tj = model_dir / "tokenizer.json"
    if _present(tj):
        _load_tokenizer(tj)
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        p = model_dir / name
        if not _present(p):
            continue
        obj = _read_json_object(p)
        for key in ("bos_token", "eos_token"):
            if key in obj:
                _check_token(p, key, obj[key])
        if name == "tokenizer_config.json" and "chat_template" in obj:
            _check_chat_template(p, "chat_template", obj["chat_template"])
    p = model_dir / "chat_template.json"
    if _present(p):
        _check_chat_template(p, "chat_template", _read_json_object(p).get("chat_template"))
    p = model_dir / "chat_template.jinja"
    if _present(p):
        try:
            p.read_bytes().decode("utf-8")
        except OSError as e:
            raise CompileError(f"{p} cannot be read ({e.strerror or e})") from e
        except UnicodeDecodeError as e:
            raise CompileError(f"{p} is not UTF-8 text ({e.reason} at byte {e.start}); {REDOWNLOAD}") from e


# transformers' GenerationConfig defaults for the sampling keys, used when do_sample is true and the file omits them
HF_SAMPLING_DEFAULTS = {"temperature": 1.0, "top_k": 50, "top_p": 1.0}


def _bad(path: Path, key: str, what: str, v) -> CompileError:
    return CompileError(f"{path}: {key} must be {what}, got {short_repr(v)}; fix or delete generation_config.json")


def _number(path: Path, key: str, v, what: str, ok) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _bad(path, key, what, v)
    try:
        f = float(v)
    except OverflowError:
        raise _bad(path, key, what, v) from None
    if not math.isfinite(f) or not ok(f):
        raise _bad(path, key, what, v)
    return f


def generation_defaults(model_dir: Path) -> dict:
    """The sampling defaults generation_config.json implies, as transformers' generate() reads them: keys among
    temperature, top_k, top_p, min_p, repetition_penalty.

    do_sample true: temperature/top_k/top_p from the file, transformers' defaults (1.0, 50, 1.0) for those it omits,
    min_p when the file sets it. do_sample false or absent: greedy, {"temperature": 0.0} (top_k/top_p/min_p do not
    matter then). repetition_penalty, when set, applies in both cases. No file: {}. Null values count as unset.
    Every key is validated whether or not it matters; a bad one is a one-line CompileError naming it."""
    path = Path(model_dir) / "generation_config.json"
    if not _present(path):
        return {}
    g = _read_json_object(path)
    v = {k: g[k] for k in ("do_sample", "temperature", "top_k", "top_p", "min_p", "repetition_penalty")
         if g.get(k) is not None}
    if "do_sample" in v and not isinstance(v["do_sample"], bool):
        raise _bad(path, "do_sample", "true or false", v["do_sample"])
    if "temperature" in v:
        v["temperature"] = _number(path, "temperature", v["temperature"], "a finite number >= 0", lambda f: f >= 0)
    if "top_k" in v:
        k = v["top_k"]
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise _bad(path, "top_k", "an integer >= 0", k)
    if "top_p" in v:
        v["top_p"] = _number(path, "top_p", v["top_p"], "a number in (0, 1]", lambda f: 0 < f <= 1)
    if "min_p" in v:
        v["min_p"] = _number(path, "min_p", v["min_p"], "a number in [0, 1]", lambda f: 0 <= f <= 1)
    if "repetition_penalty" in v:
        v["repetition_penalty"] = _number(path, "repetition_penalty", v["repetition_penalty"],
                                          "a finite number > 0", lambda f: f > 0)
    if v.get("do_sample"):
        out = {k: v.get(k, d) for k, d in HF_SAMPLING_DEFAULTS.items()}
        out["temperature"] = float(out["temperature"])
        out["top_p"] = float(out["top_p"])
        if "min_p" in v:
            out["min_p"] = v["min_p"]
    else:
        out = {"temperature": 0.0}
    if "repetition_penalty" in v:
        out["repetition_penalty"] = v["repetition_penalty"]
    return out
