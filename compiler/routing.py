"""The routing table: the arena block a MoE router step writes and its routed steps read (compiler/ops/moe.py's
kernels, compiler/moe.py's lowering, compiler/trace.py's nodes). A leaf, so each of them can import it."""
from __future__ import annotations

from dataclasses import dataclass

CNT = 16   # int32 per slot in cnt (one 64-byte row, so every slot's view stays aligned)


@dataclass(frozen=True)
class RoutingTable:
    """The arena block moe_route writes for T tokens, E experts, top-k: ids int32[S] (S = min(E, T*k) slots), cnt
    int32[S, 16], tok int32[S, TP] and wt f32[S, TP] (TP = T rounded up to 16), each view 64-byte aligned."""
    T: int
    E: int
    k: int

    @property
    def S(self) -> int:
        return min(self.E, self.T * self.k)

    @property
    def TP(self) -> int:
        return -(-self.T // 16) * 16

    @property
    def cnt_at(self) -> int:
        return 4 * (-(-self.S // 16) * 16)

    @property
    def tok_at(self) -> int:
        return self.cnt_at + 4 * CNT * self.S

    @property
    def wt_at(self) -> int:
        return self.tok_at + 4 * self.S * self.TP

    @property
    def words(self) -> int:
        return (self.wt_at + 4 * self.S * self.TP) // 4
