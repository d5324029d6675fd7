"""Timelines of simulated points: the spans the Gantt plot draws, stored compactly as JSON."""

from __future__ import annotations

from typing import Any

__all__ = ["SPAN_FIELDS", "compact_timeline", "span_dict", "timeline_file"]

SPAN_FIELDS = ("host", "kind", "layer", "start", "end", "bytes")


def compact_timeline(spans: list[dict[str, Any]], iteration_time_s: float) -> dict[str, Any]:
    """Keep the last iteration's spans, merged where the plot cannot tell them apart.

    The last iteration starts at the last forward span of layer 0 (on the first host that
    has one); spans of the same host, kind and layer closer than 1/2000 of an iteration
    are merged (below a pixel of the Gantt plot), so a P3 timeline of 10^5 slice
    transfers is stored in a few hundred kilobytes.
    """
    if not spans:
        return {"fields": list(SPAN_FIELDS), "spans": [], "t0": 0.0}
    starts = [float(s["start"]) for s in spans
              if s.get("kind") == "forward" and str(s.get("layer")) == "0"]
    t_end = max(float(s["end"]) for s in spans)
    t0 = max(starts) if starts else t_end - iteration_time_s
    gap = max(iteration_time_s, t_end - t0) / 2000
    groups: dict[tuple, list[list[float]]] = {}
    for s in sorted(spans, key=lambda s: float(s["start"])):
        if float(s["end"]) <= t0:
            continue
        key = (str(s["host"]), str(s["kind"]), s.get("layer"))
        cur = groups.setdefault(key, [])
        start, end, nbytes = float(s["start"]), float(s["end"]), float(s.get("bytes") or 0)
        if cur and start - cur[-1][1] <= gap:
            cur[-1][1] = max(cur[-1][1], end)
            cur[-1][2] += nbytes
        else:
            cur.append([start, end, nbytes])
    rows = []
    for (host, kind, layer), items in groups.items():
        for start, end, nbytes in items:
            rows.append([host, kind, layer, round(start - t0, 9), round(end - t0, 9),
                         int(nbytes)])
    rows.sort(key=lambda r: (r[3], r[0], r[1]))
    return {"fields": list(SPAN_FIELDS), "spans": rows, "t0": t0,
            "merged_below_s": gap}



def timeline_file(point: str) -> str:
    """Return the file name under ``timelines/`` that holds ``point``'s timeline."""
    # Plain characters only: '=' and ',' break shell globs, URLs and some file systems.
    text = point.rstrip("]").replace("[", "_").replace("=", "-").replace(",", "_")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in text)
    return f"{safe}.json"


def span_dict(span: Any) -> dict[str, Any]:
    if isinstance(span, dict):
        d = dict(span)
    elif isinstance(span, (tuple, list)):
        d = dict(zip(("host", "kind", "layer", "start", "end", "bytes"), span))
    else:
        d = {k: getattr(span, k, None) for k in ("host", "kind", "layer", "start", "end", "bytes")}
    return {k: (v if isinstance(v, (int, float, str)) or v is None else str(v))
            for k, v in d.items()}
