"""Tensors a checkpoint stores fused (Phi-3's qkv_proj, gate_up_proj), read as row ranges of the stored one."""
from __future__ import annotations

from ..errors import ModelLoadError


def derived_entry(e: dict, rows: tuple[int, int] | None) -> dict:
    """A tensor entry as seen through a row range of it (a fused tensor's part), or e itself (rows None)."""
    if rows is None:
        return e
    shape = list(e["shape"])
    if not shape or not 0 <= rows[0] < rows[1] <= shape[0]:
        raise ModelLoadError(f"a fused tensor of shape {shape} has no rows {rows[0]}..{rows[1]}: config and weights "
                             "do not belong together")
    return {"dtype": e["dtype"], "shape": [rows[1] - rows[0]] + shape[1:]}


class LastFused:
    """The last fused tensor read whole, so that its parts (q, k, v; gate, up), read one after another, convert or
    dequantize it once instead of once per part. Only fused tensors pass through it: it holds one at a time."""

    def __init__(self):
        self.key, self.arr = None, None

    def read(self, key, load):
        if key != self.key:
            self.key, self.arr = None, None   # drop the old one before loading the next
            self.arr, self.key = load(), key
            if hasattr(self.arr, "setflags"):
                self.arr.setflags(write=False)   # shared by the parts handed out: never changed in place
        return self.arr
