"""The tokenizer a GGUF file describes (`tokenizer.ggml.*`), rebuilt as a Hugging Face tokenizer.json plus the
tokenizer_config.json beside it (special tokens, add_bos_token, chat template).

Two vocabulary kinds: "gpt2" (byte-level BPE with the file's merges; the pre-tokenizer regex comes from
`tokenizer.ggml.pre`, as llama.cpp's own tokenizer picks it) and "llama" (SentencePiece-style BPE with byte
fallback; merges from the file or, when it has none, recovered from the pieces' ranks). Control tokens become special
added tokens, user-defined ones plain added tokens, as llama.cpp matches both whole."""
from __future__ import annotations

from ...errors import ModelLoadError, short_repr
from ..chat_families import INFERRED_KEY, detect
from ..tokenizer_patterns import LLAMA3_PATTERN, O200K_PATTERN, QWEN2_PATTERN
from .file import GGUFFile

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
META = "\u2581"

# tokenizer.ggml.pre -> (normalizer, splits before ByteLevel, ignore_merges); llama.cpp's names (llama-vocab.cpp)
_LLAMA3 = (None, ("split", LLAMA3_PATTERN), True)
_QWEN2 = ("nfc", ("split", QWEN2_PATTERN), False)
_DIGITS = (None, ("digits",), False)
_O200K = (None, ("split", O200K_PATTERN), False)
_GPT2 = (None, (), False)
PRE = {
    "llama3": _LLAMA3, "llama-v3": _LLAMA3, "llama-bpe": _LLAMA3, "falcon3": _LLAMA3, "dbrx": _LLAMA3,
    "smaug-bpe": _LLAMA3, "pixtral": _LLAMA3,
    "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2,
    "smollm": _DIGITS, "starcoder": _DIGITS, "refact": _DIGITS, "codeshell": _DIGITS,
    "default": _GPT2, "gpt-2": _GPT2, "gpt2": _GPT2, "olmo": _GPT2, "phi-2": _GPT2, "mpt": _GPT2,
    "gpt-4o": _O200K, "llama4": _O200K,
}


def _byte_alphabet() -> set[str]:
    from tokenizers.pre_tokenizers import ByteLevel

    return set(ByteLevel.alphabet())


def _byte_level(f: GGUFFile, tokens: list[str], types: list[int]):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    pre = f.get("tokenizer.ggml.pre", "default")
    if pre not in PRE:
        raise ModelLoadError(f"{f.path.name}: tokenizer.ggml.pre {short_repr(pre)} is not supported (supported: "
                             f"{', '.join(sorted(PRE))})")
    norm, split, ignore_merges = PRE[pre]
    merges = f.get("tokenizer.ggml.merges", None)
    if not isinstance(merges, list):
        raise ModelLoadError(f"{f.path.name}: a gpt2 tokenizer without tokenizer.ggml.merges; re-convert the model")
    pairs = []
    for m in merges:
        a, sep, b = m.partition(" ")
        if not sep:
            raise ModelLoadError(f"{f.path.name}: tokenizer.ggml.merges holds {short_repr(m)}, not 'left right'")
        pairs.append((a, b))
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=ignore_merges))
    if norm == "nfc":
        tok.normalizer = normalizers.NFC()
    if split and split[0] == "split":
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split[1]), "isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    elif split and split[0] == "digits":
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    alphabet = _byte_alphabet()
    # a control token spelled outside the byte alphabet is a converter's mislabel: llama.cpp cannot match it either
    _add_specials(tok, tokens, types, lambda t: set(t) <= alphabet)
    return tok, False


def _merges_from_ranks(tokens: list[str], rank: list[float]) -> list[tuple[str, str]]:
    """SentencePiece BPE merges recovered from its pieces: every split of a piece into two pieces, best piece first
    (rank: lower is better), and within one piece the longer left part first."""
    vocab = {t: i for i, t in enumerate(tokens)}
    out = []
    for i in sorted(range(len(tokens)), key=lambda i: rank[i]):
        t = tokens[i]
        local = [(t[:k], t[k:]) for k in range(len(t) - 1, 0, -1) if t[:k] in vocab and t[k:] in vocab]
        out.extend(local)
    return out


def _sentencepiece(f: GGUFFile, tokens: list[str], types: list[int]):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    gemma = f.arch.startswith("gemma")
    if gemma:   # Gemma files store pieces of spaces as spaces; its tokenizer spells them with "▁"
        tokens = [META * len(t) if t and not t.strip(" ") else t for t in tokens]
    merges = f.get("tokenizer.ggml.merges", None)
    if isinstance(merges, list):
        pairs = [tuple(m.split(" ", 1)) for m in merges]
    else:
        scores = f.get("tokenizer.ggml.scores", None)
        if gemma or not isinstance(scores, list) or len(scores) != len(tokens):
            rank = list(range(len(tokens)))   # Gemma's merge order is its pieces' order in the file
        else:
            rank = [-float(s) for s in scores]
        pairs = _merges_from_ranks(tokens, rank)
    unk = f.get("tokenizer.ggml.unknown_token_id", None)
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, unk_token=tokens[unk] if isinstance(unk, int) and
                               0 <= unk < len(tokens) else None, fuse_unk=True, byte_fallback=True))
    prefix = f.get("tokenizer.ggml.add_space_prefix", not gemma)
    if prefix:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend(META), normalizers.Replace(" ", META)])
    else:
        tok.normalizer = normalizers.Replace(" ", META)
        if gemma:
            tok.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace(META, " "), decoders.ByteFallback(), decoders.Fuse(),
                                     *([decoders.Strip(" ", 1, 0)] if prefix else [])])
    _add_specials(tok, tokens, types, lambda t: True)
    return tok, True


def _add_specials(tok, tokens: list[str], types: list[int], spellable) -> None:
    from tokenizers import AddedToken

    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t, ty in zip(tokens, types)
                            if ty == CONTROL and t and spellable(t)])
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t, ty in zip(tokens, types)
                    if ty == USER_DEFINED and t])


def build(f: GGUFFile) -> tuple[str, dict]:
    """(tokenizer.json text, tokenizer_config.json object) of the file's tokenizer."""
    from tokenizers import processors

    kind = f.get("tokenizer.ggml.model", None)
    tokens = f.get("tokenizer.ggml.tokens", None)
    if kind is None or not isinstance(tokens, list) or not tokens:
        raise ModelLoadError(f"{f.path.name} carries no tokenizer (tokenizer.ggml.model/tokens); re-convert the model "
                             "with llama.cpp's convert_hf_to_gguf.py")
    types = f.get("tokenizer.ggml.token_type", None)
    if not isinstance(types, list) or len(types) != len(tokens):
        types = [NORMAL] * len(tokens)
    if kind == "gpt2":
        tok, spm = _byte_level(f, tokens, types)
    elif kind == "llama":
        tok, spm = _sentencepiece(f, tokens, types)
    else:
        raise ModelLoadError(f"{f.path.name}: tokenizer.ggml.model {short_repr(kind)} is not supported (supported: "
                             "gpt2, llama)")

    def special(key: str) -> str | None:
        i = f.get(f"tokenizer.ggml.{key}", None)
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    bos, eos = special("bos_token_id"), special("eos_token_id")
    add_bos = bool(f.get("tokenizer.ggml.add_bos_token", spm)) and bos is not None
    add_eos = bool(f.get("tokenizer.ggml.add_eos_token", False)) and eos is not None
    if add_bos or add_eos:
        single = " ".join([*([f"{bos}:0"] if add_bos else []), "$A:0", *([f"{eos}:0"] if add_eos else [])])
        ids = {t: tok.token_to_id(t) for t in (bos, eos) if t is not None}
        tok.post_processor = processors.TemplateProcessing(
            single=single, special_tokens=[(t, i) for t, i in ids.items() if (t == bos and add_bos) or
                                           (t == eos and add_eos)])
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
           "unk_token": special("unknown_token_id"), "pad_token": special("padding_token_id"),
           "add_bos_token": add_bos, "add_eos_token": add_eos}
    tmpl = f.get("tokenizer.chat_template", None)
    if isinstance(tmpl, str) and tmpl:
        cfg["chat_template"] = tmpl
    else:   # none in the file: its family's format, recognised by the vocabulary's turn markers
        family = detect(t for t, ty in zip(tokens, types) if ty == CONTROL)
        if family is not None:
            cfg["chat_template"] = family.template
            cfg[INFERRED_KEY] = family.name
    return tok.to_str(), cfg


def control_ids(f: GGUFFile, names) -> list[int]:
    """Ids of the file's control tokens spelled as one of names."""
    tokens, types = f.get("tokenizer.ggml.tokens", None), f.get("tokenizer.ggml.token_type", None)
    if not isinstance(tokens, list) or not isinstance(types, list) or len(types) != len(tokens):
        return []
    return [i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == CONTROL and t in names]
