"""The one Chrome-trace writer, for real parameter-server runs and for simulations alike.

Both sides describe what happened as spans: a host did ``kind`` (forward, backward,
allreduce, push, pull, broadcast, sum) for ``layer`` from ``start`` to ``end`` seconds,
moving ``bytes`` to ``peer``. :func:`chrome_trace` lays them out the same way whichever side
made them, so a real run's trace and the simulator's prediction open side by side in
https://ui.perfetto.dev: a host is a process, and each host has the lanes "compute",
"send" and "server sum"; a span is named "push L3".

The simulator's timeline spans (:class:`ddpbench.simulator.core.Span`) already have these
fields; the real transport's send records become :class:`Span` with their key, part,
priority and monotonic start time as extra ``args`` (:func:`merge_chrome_traces` reads
those back to put several processes' files on one time axis).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol

__all__ = ["LANES", "Span", "SpanLike", "chrome_trace", "merge_chrome_traces", "write"]

LANES = {"forward": 0, "backward": 0, "allreduce": 1, "push": 1, "pull": 1, "broadcast": 1,
         "sum": 2}
"""Span kind -> lane (Chrome-trace thread) of its host."""
LANE_NAMES = {0: "compute", 1: "send", 2: "server sum"}


class SpanLike(Protocol):
    """What :func:`chrome_trace` reads of a span (the simulator's spans are such)."""

    @property
    def host(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def layer(self) -> int: ...
    @property
    def start(self) -> float: ...
    @property
    def end(self) -> float: ...
    @property
    def bytes(self) -> int: ...
    @property
    def peer(self) -> str: ...


class Span(NamedTuple):
    """One span with optional extra ``args`` for the trace (times in seconds)."""

    host: str
    kind: str
    layer: int
    start: float
    end: float
    bytes: int
    peer: str = ""
    args: Mapping[str, Any] | None = None


def host_order(host: str) -> tuple[int, int]:
    """Sort key of a host name: workers first, then servers, each by number."""
    digits = "".join(c for c in host if c.isdigit())
    return (0 if host.startswith("worker") else 1, int(digits or 0))


def chrome_trace(spans: Iterable[SpanLike], *, hosts: Sequence[str] | None = None,
                 t0: float | None = None, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Return ``spans`` as Chrome-trace JSON (a dict ready for ``json.dumps``).

    Args:
        spans: the spans; a span with an ``args`` mapping adds it to the event's args.
        hosts: every host to show, in order (default: the spans' hosts, workers first);
            hosts named by spans but missing here are added after them.
        t0: the time that becomes zero (default: the earliest start).
        meta: put under ``otherData`` (the simulator's workload, backend, workers).
    """
    spans = list(spans)
    if t0 is None:
        t0 = min((s.start for s in spans), default=0.0)
    order = list(hosts) if hosts is not None else []
    seen = set(order)
    order += sorted({s.host for s in spans} - seen, key=host_order)
    pid = {h: i for i, h in enumerate(order)}
    events: list[dict[str, Any]] = []
    for host, p in pid.items():
        events.append({"ph": "M", "name": "process_name", "pid": p, "tid": 0,
                       "args": {"name": host}})
        for tid, lane in LANE_NAMES.items():
            events.append({"ph": "M", "name": "thread_name", "pid": p, "tid": tid,
                           "args": {"name": lane}})
    for s in spans:
        args: dict[str, Any] = {"layer": s.layer, "bytes": s.bytes}
        if s.peer:
            args["peer"] = s.peer
        args.update(getattr(s, "args", None) or {})
        events.append({"ph": "X", "name": f"{s.kind} L{s.layer}", "cat": s.kind,
                       "pid": pid[s.host], "tid": LANES.get(s.kind, 1),
                       "ts": (s.start - t0) * 1e6, "dur": (s.end - s.start) * 1e6,
                       "args": args})
    out: dict[str, Any] = {"traceEvents": events, "displayTimeUnit": "ms"}
    if meta is not None:
        out["otherData"] = dict(meta)
    return out


def write(path: str | os.PathLike[str], trace: Mapping[str, Any]) -> Path:
    """Write ``trace`` (from :func:`chrome_trace`) as JSON to ``path``; return the path."""
    out = Path(path)
    out.write_text(json.dumps(trace))
    return out


def merge_chrome_traces(directory: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Merge the per-process ``sends.HOST.json`` files in ``directory`` into one trace.

    Every process stamps its spans with the host's monotonic clock (``args.t_monotonic``),
    so one machine's files line up; the earliest span becomes time zero.
    """
    spans = []
    for path in sorted(Path(directory).glob("sends.*.json")):
        host = path.stem.split(".", 1)[1]
        for e in json.loads(path.read_text())["traceEvents"]:
            if e["ph"] != "X":
                continue
            args = dict(e["args"])
            layer, nbytes, peer = args.pop("layer"), args.pop("bytes"), args.pop("peer", "")
            start = args["t_monotonic"]
            spans.append(Span(host, e["cat"], layer, start, start + e["dur"] / 1e6, nbytes,
                              peer, args))
    return write(out, chrome_trace(spans))
