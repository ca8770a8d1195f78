"""`edgellm tune --show`: this CPU's identity and its cached kernel timings, one line per kernel shape with the
time of every variant relative to the best (1.00 = best; the variant is a prefetch distance in bytes for decode
GEMVs, a chunk length for prefill GEMMs, rows per task for the float GEMVs, "rowsxvectors" for the float prefill
GEMM's register blocking)."""
from __future__ import annotations

from ...targets.cpu_id import cpu_label


def describe(cache) -> str:
    lines = [f"CPU: {cpu_label(cache.ident)}", f"features: {' '.join(cache.ident.get('features', [])) or '-'}",
             f"caches: {', '.join(cache.ident.get('caches', [])) or '-'}", f"tune cache: {cache.path}"]
    if cache.ignored:
        lines.append(f"(the file there is ignored: {cache.ignored})")
    if not cache.entries:
        lines.append("nothing measured yet on this CPU: `edgellm compile MODEL` (--tune quick or full) measures")
        return "\n".join(lines)
    lines.append(f"{len(cache.entries)} kernel shapes measured:")
    for key in sorted(cache.entries):
        kind, op, params = (key.split("|") + ["", ""])[:3]
        t = cache.entries[key]
        if kind == "prefill":   # per token
            t = {v: s / int(v) for v, s in t.items()}
        best = min(t.values())
        unit = {"decode": "prefetch bytes", "prefill": "chunk", "blocking": "blocking"}.get(kind, "rows")
        rel = "  ".join(f"{v}:{t[v] / best:.2f}" for v in sorted(t, key=lambda x: [int(p) for p in x.split("x")]))
        pick = min(t, key=t.get)
        lines.append(f"  {kind:<7} {op:<14} {params:<40} best {unit} {pick:>5}   {rel}")
    return "\n".join(lines)
