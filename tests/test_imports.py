"""The package's imports run with the data flow and in no circle: checkpoints (models/) -> quantization (quant/) ->
the compiler (compiler/) -> a package on disk, whose format is the contract (runtime/contract.py) -> the runtime
(runtime/, offload/). Every import counts, also those inside functions (a lazy import is still a dependency)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = ("tests", "bench", "build", "android_app", ".ci")

# (importer prefix, imported prefix, allowed exceptions, why)
RULES = [
    ("edgellm.runtime", "edgellm.compiler", (), "the runtime never needs the compiler (or TVM)"),
    ("edgellm.runtime", "edgellm.models", (), "the runtime reads packages, not checkpoints"),
    ("edgellm.runtime", "edgellm.quant", (), "the runtime reads packages, not checkpoints"),
    ("edgellm.offload", "edgellm.compiler", (), "the weight store is runtime-side"),
    ("edgellm.offload", "edgellm.models", (), "the weight store is runtime-side"),
    ("edgellm.compiler", "edgellm.runtime", ("edgellm.runtime.contract", "edgellm.runtime.python.text"),
     "the compiler writes the contract; runtime.text reads a package's tokenizer and chat template exactly as a run "
     "does (calibration text in the chat format, the derived chat markers)"),
    ("edgellm.quant", "edgellm.models.demo.train", (), "the built-in text is quant/corpus.py, not the training script "
                                                       "(quant reads the demo's held-out files only to keep them out)"),
    ("edgellm.quant", "edgellm.compiler", (), "schemes come before the compiler"),
    ("edgellm.quant", "edgellm.runtime", (), "schemes come before the package"),
    ("edgellm.models", "edgellm.compiler", (), "checkpoints come first"),
    ("edgellm.models", "edgellm.quant", ("edgellm.quant.corpus",), "checkpoints come first (the demo's training "
                                                                    "script reads the built-in text)"),
    ("edgellm.models", "edgellm.runtime", ("edgellm.runtime.contract",), "checkpoints come first"),
    ("edgellm.errors", "edgellm.", (), "errors is the leaf every module imports"),
]


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        rel = p.relative_to(ROOT)
        if rel.parts[0] in SKIP or any(x.startswith(".") or x == "build" for x in rel.parts):
            continue
        parts = ["edgellm", *rel.with_suffix("").parts]
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _resolve(mods: dict, name: str) -> str | None:
    while name:
        if name in mods:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        package = m if p.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                r = _resolve(mods, t)
                if r and r != m and not m.startswith(r + "."):   # a module's own package __init__ is not an edge
                    graph[m].add(r)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_graph_is_read():
    g = import_graph()
    assert "edgellm.runtime.contract" in g["edgellm.compiler.plan_writer"]
    assert "edgellm.compiler.driver" in g["edgellm.cli"]   # a lazy import inside a function counts
    assert len(g) > 90


def test_no_import_cycles():
    assert _cycles(import_graph()) == []


def test_a_cycle_is_found():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_imports_follow_the_data_flow():
    bad = []
    for m, deps in import_graph().items():
        for importer, imported, allowed, why in RULES:
            if m == importer or m.startswith(importer + "."):
                bad += [f"{m} -> {d} ({why})" for d in sorted(deps)
                        if (d == imported or d.startswith(imported if imported.endswith(".") else imported + "."))
                        and d not in allowed]
    assert bad == [], "\n".join(bad)
