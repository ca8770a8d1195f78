"""The built-in text: this Python's standard library sources and its language reference (one document per topic),
split by document into a training and a held-out part. The demo models were trained on the training part
(models/demo/train.py); GPTQ and the NPU compile calibrate on it when no --calib is given (quant/calibration.py)."""
from __future__ import annotations

import ast
import hashlib
import sysconfig
from pathlib import Path

EOT = "<|endoftext|>"          # the document separator (the demo tokenizer's end-of-text)
HELDOUT_FRACTION = 0.02
HELDOUT_MAX_BYTES = 280_000    # heldout.txt ships with the package: keep it small
HELDOUT_MAX_DOC = 32_000       # big files stay in training so the held-out set covers many documents
EXCLUDE_DIRS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "encodings", "__pycache__",
                "lib-dynload", "ensurepip", "turtledemo"}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def build_corpus() -> list[tuple[str, str]]:
    """(name, text) documents, sorted by name."""
    root = stdlib_root()
    docs = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root)
        parts = rel.parts
        if any(d in EXCLUDE_DIRS or d.startswith("config-") for d in parts[:-1]):
            continue
        name = rel.as_posix()
        if name == "pydoc_data/topics.py" or parts[-1].startswith("_sysconfigdata"):
            continue
        try:
            text = p.read_bytes().decode("utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        text = text.replace("\r\n", "\n")
        if text.strip():
            docs.append((name, text))
    # the language reference as English text: one document per topic
    topics_py = root / "pydoc_data" / "topics.py"
    tree = ast.parse(topics_py.read_text(encoding="utf-8"))
    topics = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "topics" for t in node.targets):
            topics = ast.literal_eval(node.value)
    for key in sorted(topics or {}):
        text = topics[key].replace("\r\n", "\n")
        if text.strip():
            docs.append((f"pydoc_data/topics.py#{key}", text))
    docs.sort(key=lambda d: d[0])
    return docs


def split_corpus(docs):
    """Deterministic held-out split by document: walk the documents in SHA-256(name) order and take small
    ones until ~2% of the corpus bytes (capped at HELDOUT_MAX_BYTES)."""
    total = sum(len(t.encode()) for _, t in docs)
    target = min(HELDOUT_FRACTION * total, HELDOUT_MAX_BYTES)
    order = sorted(docs, key=lambda d: hashlib.sha256(d[0].encode()).hexdigest())
    held, size = set(), 0
    for name, text in order:
        n = len(text.encode()) + len(EOT)
        if size >= target:
            break
        if n > HELDOUT_MAX_DOC or size + n > HELDOUT_MAX_BYTES:
            continue
        held.add(name)
        size += n
    train = [d for d in docs if d[0] not in held]
    heldout = [d for d in docs if d[0] in held]
    return train, heldout
