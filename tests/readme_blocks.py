"""README.md's code blocks, as tests/test_readme.py runs them.

Every ```bash and ```python block runs unless the line just above its fence says why it cannot:

    <!-- not run: needs a phone (adb) -->

A block that needs a running server says so with `<!-- run with: serve demo -->`; the test starts
`edgellm serve demo` on a free port for it and points the block's 127.0.0.1:8080 there. Usage synopses (option
lists with [brackets]) are ```text blocks: read, not run."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
RUN = ("bash", "python")
_MARK = re.compile(r"<!--\s*(not run|run with):\s*(.*?)\s*-->")


@dataclass(frozen=True)
class Block:
    line: int            # the opening fence's line number (1-based)
    lang: str
    code: str
    skip: str | None     # why it does not run here
    server: bool         # run with `edgellm serve demo`

    @property
    def id(self) -> str:
        return f"README.md:{self.line}:{self.lang}"


def blocks(path: Path = README) -> list[Block]:
    lines = path.read_text().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        mark = _MARK.search(lines[i - 1]) if i else None
        out.append(Block(i + 1, m.group(1), "\n".join(lines[i + 1:j]) + "\n",
                         mark.group(2) if mark and mark.group(1) == "not run" else None,
                         bool(mark and mark.group(1) == "run with")))
        i = j + 1
    return out
