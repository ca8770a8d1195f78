"""Perplexity of a text under a package, with the sliding-window scheme of the HF docs: windows of `context`
tokens advancing by `stride`; each token is scored once, with as much left context as its window gives."""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import numpy as np

from ...errors import InputError


def windows(n: int, context: int, stride: int) -> Iterator[tuple[int, int, int]]:
    """(begin, end, first_scored): score tokens first_scored..end-1 from logits of ids[begin:end]."""
    if context < 2 or not 1 <= stride <= context:
        raise InputError(f"need context >= 2 and 1 <= stride <= context (got context={context}, stride={stride})")
    prev_end = 0
    for begin in range(0, n, stride):
        end = min(begin + context, n)
        first = max(prev_end, begin + 1)   # the first token of a window has no prediction in it
        if first < end:
            yield begin, end, first
        prev_end = end
        if end == n:
            break


def nll_sum(logits_fn: Callable[[list[int]], np.ndarray], ids: list[int], context: int, stride: int,
            progress: Callable[[int], None] | None = None) -> tuple[float, int]:
    """Sum of -log p(token | left context) over all scored tokens, and their count."""
    total, count = 0.0, 0
    for begin, end, first in windows(len(ids), context, stride):
        lg = logits_fn(ids[begin:end]).astype(np.float64)       # [end-begin, vocab]
        rows = lg[first - 1 - begin:end - 1 - begin]              # predictions for tokens first..end-1
        m = rows.max(-1, keepdims=True)
        logz = (m[:, 0] + np.log(np.exp(rows - m).sum(-1)))
        tgt = np.asarray(ids[first:end])
        total += float((logz - rows[np.arange(len(tgt)), tgt]).sum())
        count += len(tgt)
        if progress:
            progress(end)
    return total, count


def perplexity(rt, text: str, context: int | None = None, stride: int | None = None, max_tokens: int | None = None,
               progress: Callable[[int], None] | None = None) -> dict:
    ids = rt.text.encode(text)
    if max_tokens:
        ids = ids[:max_tokens]
    if len(ids) < 2:
        raise InputError("the text has fewer than 2 tokens: nothing to score")
    context = int(context or min(rt.max_context, 1024))
    if context > rt.max_context:
        raise InputError(f"--context {context} exceeds the package's max context {rt.max_context}")
    stride = int(stride or max(1, context // 2))
    total, count = nll_sum(rt.logits, ids, context, stride, progress)
    return {"ppl": math.exp(total / count), "nll": total / count, "tokens": count, "context": context, "stride": stride}
