"""TVMScript without converting the same source again: while kernels are built, a source text's parsed document
(TVMScript's `doc` AST) is made once per process and reused.

TVMScript turns a function's source into its doc AST (Python's `ast`, then a node-by-node copy into its own classes)
for every `@T.prim_func` it parses and again for every *expansion* of a `@T.macro`: a kernel of the linear families
expands its macros dozens of times, and the copies were ~30% of the time to build a package's kernels (demo-llama
q8: 1.5 of 5.5 s). The parser reads the doc AST and never changes it (its one write, an absent slice step set to 1,
gives what an absent step means), so one document per source text gives the same PrimFuncs
(tests/test_kernels_build.py compares their scripts)."""
from __future__ import annotations

import contextlib
import threading

_lock = threading.RLock()
_docs: dict[str, object] = {}
MAX_SOURCES = 4096   # distinct kernel-building functions and macros: a few hundred


@contextlib.contextmanager
def sources_parsed_once():
    """Builds inside this reuse the doc AST of a source text already parsed (process-wide, for the duration; nested
    and concurrent uses are serialized)."""
    from tvm.script.parser.core import diagnostics, doc

    with _lock:
        saved = diagnostics.Source.as_ast

        def as_ast(source):
            tree = _docs.get(source.source)
            if tree is None:
                if len(_docs) >= MAX_SOURCES:
                    _docs.clear()
                tree = _docs[source.source] = doc.parse(source.source)
            return tree

        diagnostics.Source.as_ast = as_ast
        try:
            yield
        finally:
            diagnostics.Source.as_ast = saved
