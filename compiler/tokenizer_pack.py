"""tokenizer.json -> tokenizer.bin: the compact form of a Hugging Face tokenizer that the C tokenizer
(runtime/tokenizer/tokenizer.c, format documented in runtime/tokenizer/tokenizer.h) reads on the device, where there is no Python.

Two families are supported, each reproducing `tokenizers` exactly (encoding and decoding); a BPE tokenizer whose
normalizer or pre-tokenizer is outside them but whose decoder is one of theirs (ByteLevel, or SentencePiece's "▁"
spaces) gets a decode-only tokenizer.bin (the generation loop's text and stop strings work; encoding is refused);
anything else raises CompileError:
  * byte-level BPE (GPT-2, Llama-3, Qwen2/3, SmolLM/SmolLM3, Granite, OLMo 2, Phi-4-mini, the demo models):
    normalizer none or NFC; pre-tokenizer ByteLevel (its own GPT-2 regex, or use_regex=false after a Split with the
    GPT-2, Llama-3, Qwen2 or o200k pattern),
    optionally after Digits;
  * SentencePiece-style BPE (Llama-2, TinyLlama, Mistral v0.1, Gemma): normalizer Prepend("▁") / Replace(" ", "▁")
    and/or a Metaspace("▁") pre-tokenizer (or Gemma's Split(" "), a no-op after that Replace); byte_fallback with
    <0xXX> tokens, unk (fused or not).
"""
from __future__ import annotations

import json
import struct
import unicodedata
import zlib
from collections.abc import Callable
from pathlib import Path

from ..errors import CompileError
from ..models.tokenizer_patterns import GPT2_PATTERN, LLAMA3_PATTERN, O200K_PATTERN, QWEN2_PATTERN
from ..runtime import contract as K

MAGIC, VERSION = K.TOKENIZER_MAGIC, K.TOKENIZER_VERSION   # runtime/contract.h
FAMILY_BYTE_LEVEL, FAMILY_SENTENCEPIECE = 1, 2
PRE_NONE, PRE_GPT2, PRE_LLAMA3, PRE_QWEN2, PRE_O200K = 0, 1, 2, 3, 4

PATTERNS = {GPT2_PATTERN: PRE_GPT2, LLAMA3_PATTERN: PRE_LLAMA3, QWEN2_PATTERN: PRE_QWEN2, O200K_PATTERN: PRE_O200K}

# header flags: keep in sync with EL_TOKF_* in runtime/tokenizer/tokenizer.c
F_IGNORE_MERGES, F_BYTE_FALLBACK, F_FUSE_UNK, F_NFC = 1 << 0, 1 << 1, 1 << 2, 1 << 3
F_PREPEND, F_REPLACE_SPACE, F_METASPACE, F_MS_SPLIT = 1 << 4, 1 << 5, 1 << 6, 1 << 7
F_MS_ALWAYS, F_MS_FIRST, F_PREFIX_SPACE, F_DIGITS_EACH, F_DIGITS_RUNS = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
F_DECODE_ONLY = 1 << 13
F_SPACE_SPLIT = 1 << 30   # compile-time only (never written): a Split(" ") that finds nothing after Replace(" ", "▁")
TOK_KEY, TOK_SPECIAL, TOK_ADDED = 1, 2, 4
ADD_SPECIAL, ADD_NORMALIZED, ADD_LSTRIP, ADD_RSTRIP = 1, 2, 4, 8
MAX_AFFIX = 16
META = "\u2581"


def _fail(what: str) -> CompileError:
    return CompileError(f"tokenizer.json: {what}; edgellm's C tokenizer (tokenizer.bin) supports byte-level BPE "
                        f"(GPT-2, Llama-3, Qwen2 style) and SentencePiece-style BPE only")


def byte_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted: the character a byte-level vocabulary uses for each byte."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _flatten(node: dict | None, key: str) -> list[dict]:
    if node is None:
        return []
    if node.get("type") == "Sequence":
        return [x for sub in node.get(key) or [] for x in _flatten(sub, key)]
    return [node]


def _normalizer_flags(norm: dict | None) -> int:
    flags = 0
    for n in _flatten(norm, "normalizers"):
        t = n.get("type")
        if t == "NFC":
            flags |= F_NFC
        elif t == "Prepend" and n.get("prepend") == META:
            flags |= F_PREPEND
        elif t == "Replace" and n.get("pattern") == {"String": " "} and n.get("content") == META:
            flags |= F_REPLACE_SPACE
        else:
            raise _fail(f"normalizer {t} {json.dumps({k: v for k, v in n.items() if k != 'type'})} is not supported")
    return flags


def _pre_tokenizer(pre: dict | None) -> tuple[int, int, int]:
    """(family, pretok, flags) of the pre-tokenizer chain."""
    items = _flatten(pre, "pretokenizers")
    types = [p.get("type") for p in items]
    if "ByteLevel" in types:
        if types[-1] != "ByteLevel" or types.count("ByteLevel") != 1:
            raise _fail(f"pre-tokenizer chain {types} is not supported (ByteLevel must come last)")
        bl, before = items[-1], items[:-1]
        flags, pretok = 0, PRE_NONE
        for p in before:
            if p["type"] == "Digits" and not flags & (F_DIGITS_EACH | F_DIGITS_RUNS) and pretok == PRE_NONE:
                flags |= F_DIGITS_EACH if p.get("individual_digits") else F_DIGITS_RUNS
            elif p["type"] == "Split" and pretok == PRE_NONE:
                pattern = (p.get("pattern") or {}).get("Regex")
                if pattern not in PATTERNS:
                    raise _fail(f"Split pattern {p.get('pattern')!r} is not one of the known GPT-2/Llama-3/Qwen2/o200k regexes")
                # Isolated keeps the matches and the text between them; Removed + invert (how tiktoken-converted
                # tokenizers such as OLMo 2's spell it) keeps the matches only. Each known pattern matches every
                # character (its last alternatives take any whitespace, letters, digits or other), so nothing lies
                # between matches and the two are the same split.
                if (p.get("behavior"), bool(p.get("invert"))) not in (("Isolated", False), ("Removed", True)):
                    raise _fail(f"Split behavior {p.get('behavior')} invert={p.get('invert')} is not supported")
                pretok = PATTERNS[pattern]
            else:
                raise _fail(f"pre-tokenizer chain {types} is not supported")
        if bl.get("use_regex", True):
            if pretok != PRE_NONE:
                raise _fail("a Split followed by ByteLevel(use_regex=true) is not supported")
            pretok = PRE_GPT2
        if bl.get("add_prefix_space"):
            if before:
                raise _fail("ByteLevel(add_prefix_space=true) after other pre-tokenizers is not supported")
            flags |= F_PREFIX_SPACE
        return FAMILY_BYTE_LEVEL, pretok, flags
    if types == []:
        return FAMILY_SENTENCEPIECE, PRE_NONE, 0
    if types == ["Split"] and _is_space_split(items[0]):
        # Gemma: a split on " " after the normalizer turned every " " into "▁" finds nothing to split
        # (pack_tokenizer checks that Replace(" ", "▁") is there)
        return FAMILY_SENTENCEPIECE, PRE_NONE, F_SPACE_SPLIT
    if types == ["Metaspace"]:
        m = items[0]
        if m.get("replacement") != META:
            raise _fail(f"Metaspace replacement {m.get('replacement')!r} is not supported (only '▁')")
        scheme = m.get("prepend_scheme") or ("always" if m.get("add_prefix_space", True) else "never")
        flags = F_METASPACE | {"always": F_MS_ALWAYS, "first": F_MS_FIRST, "never": 0}[scheme]
        if m.get("split", True):
            flags |= F_MS_SPLIT
        return FAMILY_SENTENCEPIECE, PRE_NONE, flags
    raise _fail(f"pre-tokenizer chain {types} is not supported")


def _is_space_split(p: dict) -> bool:
    return (p.get("pattern") == {"String": " "} and not p.get("invert")
            and p.get("behavior") in ("MergedWithPrevious", "MergedWithNext", "Isolated", "Removed"))


def _decoder_family(dec: dict | None) -> int:
    """The token-to-text family of a decoder chain, for a decode-only tokenizer.bin."""
    items = _flatten(dec, "decoders")
    types = [x.get("type") for x in items]
    if "ByteLevel" in types:
        return FAMILY_BYTE_LEVEL
    if "Metaspace" in types or any(x.get("type") == "Replace" and x.get("pattern") == {"String": META} for x in items):
        return FAMILY_SENTENCEPIECE
    raise _fail(f"decoder chain {types} is not supported")


def _merges(model: dict, vocab: dict[str, int]) -> list[tuple[int, int, int, int]]:
    table: dict[tuple[int, int], tuple[int, int]] = {}
    for rank, m in enumerate(model.get("merges") or []):
        if isinstance(m, str):
            parts = m.split(" ")
            if len(parts) != 2:
                raise _fail(f"merge {m!r} is not two tokens")
            a, b = parts
        else:
            a, b = m
        try:
            table[(vocab[a], vocab[b])] = (rank, vocab[a + b])  # like tokenizers: a later duplicate wins
        except KeyError as e:
            raise _fail(f"merge {a!r} + {b!r} names a token outside the vocabulary ({e})") from None
    return [(a, b, r, n) for (a, b), (r, n) in sorted(table.items(), key=lambda kv: kv[1][0])]


def _template(pp: dict | None, added_ids: dict[str, int]) -> tuple[list[int], list[int]]:
    """Ids the post-processor puts before and after a single sequence (HF add_special_tokens=True)."""
    prefix: list[int] = []
    suffix: list[int] = []
    for p in _flatten(pp, "processors"):
        t = p.get("type")
        if t == "ByteLevel":
            continue
        if prefix or suffix:
            raise _fail("more than one post-processor adds special tokens")
        if t == "TemplateProcessing":
            specials = p.get("special_tokens") or {}
            seen_a = False
            for item in p.get("single") or []:
                if "Sequence" in item:
                    seen_a = True
                elif "SpecialToken" in item:
                    ids = specials.get(item["SpecialToken"]["id"], {}).get("ids")
                    if ids is None:
                        raise _fail(f"template token {item['SpecialToken']['id']!r} has no ids")
                    (suffix if seen_a else prefix).extend(ids)
        elif t in ("RobertaProcessing", "BertProcessing"):
            prefix, suffix = [p["cls"][1]], [p["sep"][1]]
        else:
            raise _fail(f"post-processor {t} is not supported")
    if len(prefix) > MAX_AFFIX or len(suffix) > MAX_AFFIX:
        raise _fail("the post-processor template adds too many tokens")
    return prefix, suffix


def _normalize_like(flags: int, text: str) -> str:
    """The normalizer applied to an added token with normalized=true (what HF matches it against)."""
    if flags & F_NFC:
        text = unicodedata.normalize("NFC", text)
    if flags & F_REPLACE_SPACE:
        text = text.replace(" ", META)
    if flags & F_PREPEND and text:
        text = META + text
    return text


def _bos_from_config(path: Path, token_id: dict[str, int]) -> int:
    cfg = path.with_name("tokenizer_config.json")
    if not cfg.is_file():
        return -1
    try:
        bos = json.loads(cfg.read_text()).get("bos_token")
    except (OSError, ValueError):
        return -1
    if isinstance(bos, dict):
        bos = bos.get("content")
    return token_id.get(bos, -1) if isinstance(bos, str) else -1


def pack_tokenizer(tokenizer_json: Path) -> bytes:
    """The bytes of tokenizer.bin for a tokenizer.json (and the bos_token of a tokenizer_config.json beside it)."""
    tokenizer_json = Path(tokenizer_json)
    try:
        d = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CompileError(f"cannot read {tokenizer_json}: {e}") from None
    model = d.get("model") or {}
    if model.get("type", "BPE" if "merges" in model else None) != "BPE":
        raise _fail(f"model type {model.get('type')!r} is not supported")
    if model.get("dropout") not in (None, 0, 0.0):
        raise _fail("BPE dropout is not supported")
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise _fail("continuing_subword_prefix / end_of_word_suffix are not supported")
    decode_only = None
    try:
        family, pretok, flags = _pre_tokenizer(d.get("pre_tokenizer"))
        norm_flags = _normalizer_flags(d.get("normalizer"))
        flags |= norm_flags
        if family == FAMILY_BYTE_LEVEL and norm_flags & ~F_NFC:
            raise _fail("a byte-level tokenizer with a SentencePiece normalizer is not supported")
        if family == FAMILY_BYTE_LEVEL and model.get("byte_fallback"):
            raise _fail("byte_fallback in a byte-level tokenizer is not supported")
        if family == FAMILY_SENTENCEPIECE and not flags & (F_REPLACE_SPACE | F_METASPACE):
            raise _fail("a BPE without ByteLevel needs SentencePiece spaces (Replace ' ' -> '▁' or Metaspace)")
        if flags & F_SPACE_SPLIT and not norm_flags & F_REPLACE_SPACE:
            raise _fail("a Split on ' ' is supported only after a Replace(' ', '▁') normalizer (Gemma)")
        flags &= ~F_SPACE_SPLIT
    except CompileError as e:   # the encoder is out of reach; the decoder may not be
        decode_only = str(e)
        family, pretok, flags = _decoder_family(d.get("decoder")), PRE_NONE, F_DECODE_ONLY
    flags |= (F_IGNORE_MERGES if model.get("ignore_merges") else 0) | (F_BYTE_FALLBACK if model.get("byte_fallback") else 0)
    flags |= F_FUSE_UNK if model.get("fuse_unk") else 0

    vocab: dict[str, int] = model.get("vocab") or {}
    model_str = {i: s for s, i in vocab.items()}
    added = sorted((a for a in d.get("added_tokens") or [] if a.get("content")), key=lambda a: a["id"])
    added_by_id = {a["id"]: a for a in added}
    n_vocab = max([*model_str, *added_by_id, -1]) + 1
    if n_vocab == 0 or n_vocab > 1 << 26:
        raise _fail(f"vocabulary size {n_vocab} is out of range")
    decoder = byte_decoder()

    def raw(s: str) -> bytes:
        if family == FAMILY_BYTE_LEVEL and all(c in decoder for c in s):
            return bytes(decoder[c] for c in s)
        return s.encode("utf-8")

    strings: list[bytes] = []
    tok_flags = bytearray(n_vocab)
    for i in range(n_vocab):
        a = added_by_id.get(i)
        s = a["content"] if a else model_str.get(i, "")
        if i in model_str and model_str[i] == s and (family != FAMILY_BYTE_LEVEL or all(c in decoder for c in s)):
            tok_flags[i] |= TOK_KEY
        if a:
            tok_flags[i] |= TOK_ADDED | (TOK_SPECIAL if a.get("special") else 0)
        strings.append(raw(s))

    added_recs, added_blob = [], bytearray()
    for a in added:
        if a.get("single_word"):
            raise _fail(f"added token {a['content']!r} has single_word=true, which is not supported")
        normalized = bool(a.get("normalized", not a.get("special")))
        match = (_normalize_like(flags, a["content"]) if normalized else a["content"]).encode("utf-8")
        f = (ADD_SPECIAL if a.get("special") else 0) | (ADD_NORMALIZED if normalized else 0)
        f |= (ADD_LSTRIP if a.get("lstrip") else 0) | (ADD_RSTRIP if a.get("rstrip") else 0)
        added_recs.append((a["id"], f, len(added_blob), len(match)))
        added_blob += match

    token_id = {**vocab, **{a["content"]: a["id"] for a in added}}
    prefix, suffix = _template(d.get("post_processor"), token_id)
    bos = prefix[0] if prefix else _bos_from_config(tokenizer_json, token_id)
    unk = vocab.get(model.get("unk_token"), -1) if model.get("unk_token") is not None else -1
    merges = [] if decode_only else _merges(model, vocab)

    def pad(b: bytes) -> bytes:
        return bytes(b) + b"\0" * (-len(b) % 4)

    offsets, pos = [0], 0
    for s in strings:
        pos += len(s)
        offsets.append(pos)
    blob = b"".join(strings)
    body = b"".join([
        struct.pack(f"<{len(prefix)}i", *prefix), struct.pack(f"<{len(suffix)}i", *suffix),
        struct.pack(f"<{n_vocab + 1}I", *offsets), pad(tok_flags), pad(blob),
        struct.pack(f"<{4 * len(merges)}I", *(x for m in merges for x in m)),
        struct.pack(f"<{4 * len(added_recs)}I", *(x for r in added_recs for x in r)), pad(added_blob),
    ])
    header = MAGIC + struct.pack("<14I", VERSION, family, pretok, flags, n_vocab, len(merges), len(added_recs),
                                 unk & 0xFFFFFFFF, bos & 0xFFFFFFFF, len(prefix), len(suffix), len(blob),
                                 len(added_blob), 64 + len(body))
    return header + struct.pack("<I", zlib.crc32(body)) + body


def write_tokenizer_bin(tokenizer_json: Path, out: Path) -> bool:
    """Writes tokenizer.bin for the C tokenizer; CompileError (one line) for a tokenizer it cannot even decode.
    Returns False when the file decodes only (its encoder is outside the supported families)."""
    data = pack_tokenizer(tokenizer_json)
    Path(out).write_bytes(data)
    return not struct.unpack_from("<I", data, 16)[0] & F_DECODE_ONLY


def maybe_write_tokenizer_bin(package_dir: Path, log: Callable[[str], None] | None = None) -> bool:
    """The package writer's hook: package_dir/tokenizer.json -> package_dir/tokenizer.bin. True when written; False
    when there is no tokenizer.json, or (after a one-line warning to log) when the C tokenizer cannot reproduce it:
    the package still works from Python, and edgellm-run then takes token ids instead of text."""
    src = Path(package_dir) / "tokenizer.json"
    if not src.is_file():
        return False
    try:
        full = write_tokenizer_bin(src, Path(package_dir) / "tokenizer.bin")
    except CompileError as e:
        if log:
            log(f"warning: no tokenizer.bin, edgellm-run will take token ids only and stop strings need the Python "
                f"runtime's tokenizer: {e}")
        return False
    if not full and log:
        log("note: the C tokenizer decodes this tokenizer but cannot encode it (its pre-tokenizer or normalizer is "
            "not one it reproduces): edgellm-run takes token ids; Python encodes with tokenizer.json")
    return True
