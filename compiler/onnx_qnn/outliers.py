"""Which FFN down-projection inputs take llm.npu's shadow outlier path, from calibration.

A few channels of a layer's down-projection input reach magnitudes tens of times the others' (LLMs grow them). A
16-bit activation range wide enough for them leaves the ordinary values little resolution. Per layer, the channels
whose calibrated maximum |a| exceeds RATIO x the median channel's (at most MAX_FRACTION of them) are the outlier
channels; the threshold is the largest maximum among the other channels, so on calibration text only outlier
channels cross it. The graph clips at the threshold; the CPU adds back what was clipped, in float."""
from __future__ import annotations

import numpy as np

from .npu_chunks import Outliers
from .graph import DOWN_PROJ

RATIO = 6.0
MAX_FRACTION = 1 / 64


def choose(act_max: dict[int, np.ndarray], ratio: float = RATIO, max_fraction: float = MAX_FRACTION
           ) -> dict[int, tuple[float, list[int]]]:
    """layer -> (threshold, outlier channels), for the layers that have any."""
    out = {}
    for layer, m in sorted(act_max.items()):
        med = float(np.median(m))
        order = np.argsort(-m, kind="stable")
        cap = max(1, int(len(m) * max_fraction))
        chans = [int(c) for c in order[:cap] if m[c] > ratio * med]
        if chans and len(chans) < len(m):
            rest = np.delete(m, chans)
            out[layer] = (float(rest.max()), sorted(chans))
    return out


def specs(chosen: dict[int, tuple[float, list[int]]], weight) -> dict[int, Outliers]:
    """The CPU side of each chosen layer: threshold, channels and W_down[:, channels].T in float32."""
    res = {}
    for layer, (t, chans) in chosen.items():
        w = np.asarray(weight(f"model.layers.{layer}.{DOWN_PROJ}"), np.float32)   # [hidden, ffn]
        res[layer] = Outliers(layer, t, np.asarray(chans, np.int32), np.ascontiguousarray(w[:, chans].T))
    return res


def split_groups(groups: list[tuple[int, int]], layers) -> list[tuple[int, int]]:
    """Groups cut after every layer in `layers`: its CPU part must land before the next layer runs."""
    cuts = {layer + 1 for layer in layers}
    out = []
    for l0, l1 in groups:
        start = l0
        for b in range(l0 + 1, l1):
            if b in cuts:
                out.append((start, b))
                start = b
        out.append((start, l1))
    return out
