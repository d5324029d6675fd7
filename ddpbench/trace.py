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

A span with a ``name`` is an event named as its writer chose (Horovod's timeline names
its events ``NEGOTIATE_ALLREDUCE``, ``MPI_ALLREDUCE``, ...), on the ``lane`` it gives.
:class:`TraceFile` writes spans as they come: the file is valid Chrome-trace JSON after
every :meth:`TraceFile.flush`, so a process killed between two flushes leaves a file that
opens, holding what was flushed (Horovod's writer keeps its file valid the same way,
``horovod/common/timeline.cc``, ``TimelineWriter::DoWriteEvent``).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol

__all__ = ["LANES", "Span", "SpanLike", "TraceFile", "chrome_trace", "merge_chrome_traces",
           "write"]

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
    name: str = ""  # the event's name; empty: "KIND L<layer>"
    lane: int | None = None  # the thread (tid) it goes on; None: LANES[kind]


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
        events += process_events(host, p)
    for s in spans:
        events.append(span_event(s, pid[s.host], t0))
    out: dict[str, Any] = {"traceEvents": events, "displayTimeUnit": "ms"}
    if meta is not None:
        out["otherData"] = dict(meta)
    return out


def process_events(host: str, pid: int, lanes: Mapping[int, str] | None = None,
                   sort_index: bool = False) -> list[dict[str, Any]]:
    """Return the metadata events that name process ``pid`` ``host`` and its lanes."""
    events: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                                     "args": {"name": host}}]
    if sort_index:
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                       "args": {"sort_index": pid}})
    for tid, lane in (LANE_NAMES if lanes is None else lanes).items():
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                       "args": {"name": lane}})
    return events


def span_event(s: SpanLike, pid: int, t0: float) -> dict[str, Any]:
    """Return span ``s`` as a complete ("X") event of process ``pid``, times from ``t0``."""
    name = getattr(s, "name", "")
    args: dict[str, Any] = {} if name else {"layer": s.layer}
    if s.bytes or not name:
        args["bytes"] = s.bytes
    if s.peer:
        args["peer"] = s.peer
    args.update(getattr(s, "args", None) or {})
    lane = getattr(s, "lane", None)
    return {"ph": "X", "name": name or f"{s.kind} L{s.layer}", "cat": s.kind, "pid": pid,
            "tid": LANES.get(s.kind, 1) if lane is None else lane,
            "ts": (s.start - t0) * 1e6, "dur": (s.end - s.start) * 1e6, "args": args}


def write(path: str | os.PathLike[str], trace: Mapping[str, Any]) -> Path:
    """Write ``trace`` (from :func:`chrome_trace`) as JSON to ``path``; return the path.

    The file appears whole or not at all (written beside it, then renamed over it).
    """
    out = Path(path)
    _replace(out, json.dumps(trace).encode())
    return out


def _replace(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: a temporary file beside it, then a rename."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class TraceFile:
    """A Chrome trace on disk that grows as spans come, valid JSON after every flush.

    The file is made whole at once (``{"otherData": ..., "traceEvents": []}``, renamed into
    place); each :meth:`flush` then writes the spans added since the last one over the
    closing ``]}`` together with a new ``]}``, in one ``pwrite``. A process is named the
    first time a span of its host comes. Not thread-safe: one writer at a time.

    Args:
        path: the file (its folder is made if missing).
        t0: the time that becomes zero (seconds, the spans' clock).
        lanes: tid -> name of each process's lanes (default: compute, send, server sum).
        meta: put under ``otherData``.
    """

    def __init__(self, path: str | os.PathLike[str], *, t0: float,
                 lanes: Mapping[int, str] | None = None,
                 meta: Mapping[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.t0 = t0
        self.lanes = LANE_NAMES if lanes is None else dict(lanes)
        head = json.dumps({"displayTimeUnit": "ms", "otherData": dict(meta or {}),
                           "traceEvents": []}).encode()
        if not head.endswith(b"]}"):  # pragma: no cover - json.dumps keeps key order
            raise RuntimeError("unexpected trace header")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _replace(self.path, head)
        self._fd: int | None = os.open(self.path, os.O_WRONLY)
        self._end = len(head) - 2  # where the closing "]}" starts
        self._first = True
        self._pid: dict[str, int] = {}
        self._pending: list[dict[str, Any]] = []

    def add(self, span: SpanLike) -> None:
        """Queue one span for the next flush."""
        pid = self._pid.get(span.host)
        if pid is None:
            pid = self._pid[span.host] = len(self._pid)
            self._pending += process_events(span.host, pid, self.lanes, sort_index=True)
        self._pending.append(span_event(span, pid, self.t0))

    def flush(self) -> None:
        """Write what was added since the last flush; the file stays valid JSON."""
        if not self._pending or self._fd is None:
            return
        body = ",".join(json.dumps(e) for e in self._pending)
        data = (("" if self._first else ",") + body + "]}").encode()
        os.pwrite(self._fd, data, self._end)
        self._end += len(data) - 2
        self._first = False
        self._pending.clear()

    def close(self) -> None:
        """Flush and close the file; idempotent."""
        if self._fd is None:
            return
        try:
            self.flush()
        finally:
            os.close(self._fd)
            self._fd = None


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
