"""Token trees of the verify program (speculative decoding): the reference a pass's rows are checked against."""
from __future__ import annotations


def tree_paths(parents):
    """Each node's path from the root (node 0), as node indices."""
    out = []
    for i in range(len(parents)):
        path = [i]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        out.append(path[::-1])
    return out


def decoded_rows(ctx, n, ids, parents):
    """Each node's logits from decode steps along its path, after the context's first n tokens (rewound to each time);
    leaves the context at the last node's path."""
    rows = []
    for path in tree_paths(parents):
        ctx.rewind(n)
        for i in path:
            row = ctx.decode_step(ids[i])
        rows.append(row)
    return rows
