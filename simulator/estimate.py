"""How much work a simulation will be, before it runs: events, seconds, memory.

A simulation's cost is its number of simpy events, which grows with the hosts in ways that
differ by backend (a ring's steps linearly, MXNet's kvstore messages with the square of the
workers). Rather than one formula per strategy, :func:`estimate` runs the same point at
4, 8 and 16 hosts for two iterations (pilots that take at most a few seconds), fits
``events = a + b h + c h^2`` (c >= 0) through them and scales by the iterations asked for.
Seconds follow from the pilots' own events per CPU second, memory from
:data:`BYTES_PER_EVENT`. Small points (at most :data:`PILOT_HOSTS`\\[-1] hosts) are not
estimated: they finish in seconds.

:func:`check` refuses a point past the limit (``DDPBENCH_MAX_EVENTS`` or the caller's),
saying how to raise it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["BYTES_PER_EVENT", "DEFAULT_MAX_EVENTS", "Estimate", "check", "estimate",
           "max_events"]

PILOT_HOSTS = (4, 8, 16)
BYTES_PER_EVENT = 150
"""Memory per simulated event: the timeline's spans and messages (a 64-host VGG-19 P3 run:
2.72 M events in 326 MB, 120 B each, rounded up)."""
DEFAULT_MAX_EVENTS = 50_000_000
"""About five minutes of simulation on one core of this project's 2-core machine."""


@dataclass(frozen=True)
class Estimate:
    """The expected cost of one simulation."""

    events: float
    seconds: float
    memory_bytes: float

    def describe(self) -> str:
        """Return ``about N events (~T, ~M of memory)``."""
        return (f"about {self.events:,.0f} events (~{_duration(self.seconds)} on this "
                f"machine, ~{self.memory_bytes / 2**30:,.1f} GiB of memory)")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:,.1f} h"


def max_events() -> float:
    """Return the limit: ``DDPBENCH_MAX_EVENTS`` if set, else :data:`DEFAULT_MAX_EVENTS`."""
    raw = os.environ.get("DDPBENCH_MAX_EVENTS")
    if raw is None:
        return DEFAULT_MAX_EVENTS
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"DDPBENCH_MAX_EVENTS must be a number, got {raw!r}") from None
    if not value > 0:
        raise ValueError(f"DDPBENCH_MAX_EVENTS must be > 0, got {raw!r}")
    return value


def estimate(workload: Any, backend: str, **kwargs: Any) -> Estimate | None:
    """Return the cost of ``simulate(workload, backend, **kwargs)``, or None when it is small.

    Raises:
        ValueError: a bad value, as ``simulate`` would raise it.
    """
    from ddpbench import contract
    from ddpbench.simulator.core import simulate

    fields = {k: v for k, v in kwargs.items() if k in contract.Cluster.model_fields}
    fields.setdefault("workers", kwargs.get("workers") or 4)
    if fields.get("servers") is None:
        fields["servers"] = "colocated"
    try:
        cluster = contract.Cluster(**fields)
    except ValueError:
        return None  # a bad value: simulate itself reports it, naming the field
    hosts = cluster.hosts or cluster.workers // cluster.gpus_per_host
    if hosts <= PILOT_HOSTS[-1]:
        return None
    iterations = int(kwargs.get("iterations", 3))
    pilot = {k: v for k, v in kwargs.items() if k not in ("workers", "hosts", "iterations",
                                                            "warmup", "trace")}
    events, cpu = [], 0.0
    for h in PILOT_HOSTS:
        start = time.process_time()
        res = simulate(workload, backend, hosts=h, workers=h * cluster.gpus_per_host,
                       iterations=2, warmup=1, trace=False, **pilot)
        cpu += time.process_time() - start
        events.append(float(res.events))
    a, b, c = _quadratic(PILOT_HOSTS, events)
    total = max(events[-1], a + b * hosts + c * hosts * hosts) * iterations / 2
    # Large runs process fewer events per second than the pilots (memory, garbage
    # collection), so the pilots' rate is halved.
    rate = 0.5 * sum(events) / cpu if cpu > 0 else 5e4
    return Estimate(events=total, seconds=total / rate, memory_bytes=total * BYTES_PER_EVENT)


def _quadratic(xs: tuple[int, ...], ys: list[float]) -> tuple[float, float, float]:
    """Return a, b, c of the parabola through three points, with c clipped at 0."""
    (x0, x1, x2), (y0, y1, y2) = xs, ys
    d1 = (y1 - y0) / (x1 - x0)
    d2 = (y2 - y1) / (x2 - x1)
    c = max(0.0, (d2 - d1) / (x2 - x0))
    b = d2 - c * (x1 + x2)
    if c == 0.0:
        b = max(d1, d2, 0.0)  # a line through the steeper pair: never underestimate
    a = y2 - b * x2 - c * x2 * x2
    return a, b, c


def check(est: Estimate | None, limit: float | None = None, *, flag: str = "--max-events"
          ) -> None:
    """Raise ValueError when ``est`` passes ``limit`` events (default :func:`max_events`)."""
    if est is None:
        return
    limit = max_events() if limit is None else limit
    if est.events > limit:
        raise ValueError(
            f"this simulation would process {est.describe()}; the limit is {limit:,.0f} "
            f"events: raise it with {flag} N (or DDPBENCH_MAX_EVENTS=N) if this machine can "
            f"take it, or simulate fewer workers or iterations")
