"""The plan's program records, as compiler/plan_writer.py writes them: steps of kernel calls with their arguments,
routed (MoE) and predicted steps, and the programs they make up. A leaf: lower.py builds them, moe.py and
bundled_ffn.py add their steps, the writer serializes them."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..runtime.contract import BACKEND_TVM_CPU
from ..runtime.contract import DTYPES as _DT


@dataclass
class Arg:
    kind: int
    index: int
    dtype: str
    shape: tuple[int, ...]
    flags: int = 0
    offset: int = 0
    expert_stride: int = 0   # FLAG_EXPERT weights: expert e uses weight index + e * expert_stride

    @property
    def dl(self) -> tuple[int, int]:
        return _DT[self.dtype]


@dataclass
class Step:
    kernel: int
    args: list[Arg]


@dataclass
class Route:
    """Runs the n_body steps after it once per int32 id at arena byte ids_offset (n_select of them, < n_experts; -1
    ends the list early). It calls no kernel itself."""
    ids_offset: int
    n_select: int
    n_experts: int
    n_body: int
    kernel: int = -1
    args: list = field(default_factory=list)


@dataclass
class Predict:
    """A guess at a later route's selection: runs the n_body steps after it (they write n_select int32 ids at arena
    byte ids_offset, -1 ending them early), then hands the weight store the guessed experts' weights (args: FLAG_EXPERT
    weight views) to read ahead. A runtime that reads nothing ahead skips it and its body."""
    ids_offset: int
    n_select: int
    n_experts: int
    n_body: int
    args: list[Arg]
    kernel: int = -1


@dataclass
class Program:
    name: str
    tokens: int
    steps: list[Step]
    in_offset: int
    out_offset: int
    out_row_bytes: int
    arena_bytes: int
    backend: str = BACKEND_TVM_CPU   # the runtime backend (registry name) that runs it
    flags: int = 0                   # PROGRAM_* flags
