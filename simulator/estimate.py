"""How much work a simulation will be, before it runs: events, seconds, memory.

A simulation's cost follows from its sizes, counted here without running it: the units a
backend cuts the gradients into (the parameter servers' parts from the real backends'
placement rules, :func:`ddpbench.rules.placement.part_count`; an allreduce's tensors or
fused buffers), the hosts that send them, the ring steps per unit (``2 (p - 1)``, or the
hierarchical ``2 (g - 1) + 2 (h - 1)``), the layers computed and the iterations. Per
iteration:

- parameter servers: ``hosts x (5 layers + parts x (0.7 + 4 f + 3 t))`` events, ``f`` the
  share of parts that cross a network (``1 - 1/hosts`` colocated over the ideal transport,
  else 1) and ``t`` = 1 over a real transport (its sockets and per-message costs);
- allreduce: ``3 layers + units x steps x k`` (``k`` = 2.6 for several rings sharing a NIC,
  else 1); ``zero``/``fsdp``: units are their collectives (:func:`_sharded_collectives`). Horovod's fused buffers depend on its cycle timing, so they are counted by a
  pilot of the same point on four workers (a few thousand events: buffers only get fewer
  as rings lengthen) when the tensors' count alone puts the point above
  :data:`PILOT_ABOVE` events.

The constants were fitted to 660 simulations (3 workloads x 6 backends x 2-24 hosts x
knobs x transports and dedicated servers: every estimate within 0.54-1.75 of the events
counted). Memory is :data:`BYTES_PER_EVENT` per event (the timeline) plus
:data:`BYTES_PER_PART` per part; seconds are events at :data:`EVENTS_PER_SECOND`.

:func:`check` refuses a point past the event limit (``DDPBENCH_MAX_EVENTS``, default
:data:`DEFAULT_MAX_EVENTS`) or past this machine's memory (:mod:`ddpbench.sizes`), naming
the estimate and the flag that runs it anyway (``--allow-large``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from ddpbench import sizes

__all__ = ["BYTES_PER_EVENT", "BYTES_PER_PART", "DEFAULT_MAX_EVENTS", "EVENTS_PER_SECOND",
           "Estimate", "check", "estimate", "max_events"]

BYTES_PER_EVENT = 150
"""Memory per simulated event: the timeline's spans and messages (a 64-host VGG-19 P3 run:
2.72 M events in 326 MB, 120 B each, rounded up)."""
BYTES_PER_PART = 700
"""Memory per parameter-server part (its object, its lists of arrivals and pulls: VGG-19
cut into 71,855 slices held 50 MB beside the timeline)."""
EVENTS_PER_SECOND = 170_000
"""Simulated events per CPU second on one core of this project's 2-core machine (large
runs; small ones run faster)."""
DEFAULT_MAX_EVENTS = 50_000_000
"""About five minutes of simulation on one core of this project's 2-core machine."""
PILOT_ABOVE = 20_000
"""A Horovod point estimated (with one buffer per tensor) above this many events has its
fused buffers counted by a pilot simulation (of about 2,000 events for ResNet-50)."""

# events per host per iteration: LAYER x layers + parts x (PART + REMOTE f + TRANSPORT t)
_PS_LAYER, _PS_PART, _PS_REMOTE, _PS_TRANSPORT = 5.0, 0.7, 4.0, 3.0
# events per iteration of an allreduce strategy: LAYER x layers + units x steps x k
_RING_LAYER, _RINGS_SHARING = 3.0, 2.6
# events per unit and iteration of a gathering sharded scheme (fsdp, zero stage 3): its
# collectives and the CPU's waits (Llama-7B FULL_SHARD at 16 x 8 and 128 x 8: 13 counted)
_SHARDED_PER_UNIT = 12


@dataclass(frozen=True)
class Estimate:
    """The expected cost of one simulation."""

    events: float
    seconds: float
    memory_bytes: float
    parts: int = 0

    def describe(self) -> str:
        """Return ``about N events (~T on this machine, ~M of memory)``."""
        return (f"about {self.events:,.0f} events (~{sizes.duration(self.seconds)} on this "
                f"machine, ~{sizes.gib(self.memory_bytes)} of memory)")

    def cost(self, limit: float | None = None) -> sizes.Cost:
        """Return this estimate as a :class:`ddpbench.sizes.Cost`, with the event limit."""
        limit = max_events() if limit is None else limit
        over = sizes.overs((self.events > limit, f"more than the limit of {limit:,.0f} "
                                                 f"events (DDPBENCH_MAX_EVENTS)"))
        return sizes.Cost("this simulation", f"about {self.events:,.0f} events",
                          self.memory_bytes, self.seconds, over)


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
    """Return the cost of ``simulate(workload, backend, **kwargs)`` from its sizes.

    Returns None for a point ``simulate`` would refuse (an unknown workload or backend, a
    value out of bounds): ``simulate`` itself then says what is wrong.
    """
    from ddpbench import contract
    from ddpbench.simulator.strategies import strategy_class
    from ddpbench.simulator.workload import load_workload

    fields = {k: v for k, v in kwargs.items() if k in contract.Cluster.model_fields
              and v is not None}
    if fields.get("hosts") is None:
        fields.setdefault("workers", 4)
    if fields.get("servers") is None:
        fields["servers"] = "colocated"
    knobs = {k: v for k, v in kwargs.items() if k not in contract.Cluster.model_fields
             and k not in contract.Schedule.model_fields
             and k not in ("trace", "summation_gbps", "cluster", "schedule")}
    try:
        cluster = contract.Cluster(**fields)
        sched = contract.Schedule(**{k: v for k, v in kwargs.items()
                                     if k in contract.Schedule.model_fields and v is not None})
        symmetric = strategy_class(backend).symmetric
        parsed = contract.validate_knobs(backend, knobs, side="sim").model_dump()
        wl = load_workload(workload).resized(sched.size_scale)
    except (ValueError, TypeError):
        return None
    layers, iterations = len(wl.layers), sched.iterations
    parts = 0
    if symmetric:
        p, g, h = cluster.workers, cluster.gpus_per_host, cluster.num_hosts
        hierarchical = backend == "horovod" and parsed.get("hierarchical") and g > 1
        steps = 2 * (g - 1) + 2 * (h - 1) if hierarchical else 2 * (p - 1)
        k = _RINGS_SHARING if backend == "collective" and parsed.get("nrings", 1) > 1 else 1.0
        units: float = len(wl.tensors)
        if backend in ("zero", "fsdp"):
            units, steps = _sharded_collectives(wl, backend, parsed, steps)
        per_iter = _RING_LAYER * layers + units * steps * k
        if backend == "horovod" and per_iter * iterations > PILOT_ABOVE:
            units = _horovod_buffers(wl, kwargs, units)
            per_iter = _RING_LAYER * layers + units * steps * k
        events = per_iter * iterations
    else:
        from ddpbench import hardware

        h = cluster.num_hosts
        servers = cluster.dedicated_servers() or h
        parts = _parts(wl, backend, parsed, servers, hardware.gradient_bytes(sched.precision))
        loopback = hardware.transport(cluster.transport).loopback and not cluster.dedicated_servers()
        f = 1.0 if cluster.dedicated_servers() or loopback else 1.0 - 1.0 / h
        t = 0.0 if cluster.transport == "ideal" else 1.0
        per_host = _PS_LAYER * layers + parts * (_PS_PART + _PS_REMOTE * f + _PS_TRANSPORT * t)
        events = per_host * h * iterations
    memory = events * BYTES_PER_EVENT + parts * BYTES_PER_PART
    return Estimate(events=events, seconds=events / EVENTS_PER_SECOND, memory_bytes=memory,
                    parts=parts)


def _sharded_collectives(wl: Any, backend: str, knobs: dict[str, Any],
                         ring_steps: int) -> tuple[float, int]:
    """Return (collectives, events each) per iteration of ``zero``/``fsdp``
    (:mod:`ddpbench.simulator.sharded`): a gathering scheme runs each collective as one event
    and its CPU process adds a few per unit (:data:`_SHARDED_PER_UNIT` in all); an
    allreduce (NO_SHARD, ZeRO 0-2's buckets) takes the ring's steps (NCCL's tree: fewer)."""
    from ddpbench.simulator.sharded import DS_ALLREDUCE_BUCKET

    units = len({t.layer for t in wl.tensors})
    stage = knobs.get("stage", 0)
    if backend == "fsdp" and knobs.get("sharding_strategy") != "NO_SHARD" or \
            backend == "zero" and stage == 3:
        return float(units), _SHARDED_PER_UNIT
    if backend == "fsdp":
        return float(units), ring_steps
    bucket = DS_ALLREDUCE_BUCKET if stage == 0 else knobs.get("reduce_bucket_size", 1)
    return float(min(units, math.ceil(wl.total_params / bucket)) + 1), ring_steps


def _parts(wl: Any, backend: str, knobs: dict[str, Any], servers: int, itemsize: int) -> int:
    """Return the parts one iteration pushes per host (the backend's placement rule), its
    gradients ``itemsize`` bytes per element."""
    from ddpbench.rules.placement import part_count

    if backend == "kvstore":
        rule = "tensorflow" if knobs.get("system") == "tensorflow" else "kvstore"
        opts = {"bigarray_bound": knobs["bigarray_bound"]}
    elif backend == "p3":
        rule, opts = "p3", {"slice_params": knobs["slice_params"]}
    elif backend == "byteps":
        rule = "byteps"
        opts = {"partition_elems": max(1, knobs["partition_bytes"] // itemsize)}
    else:  # a parameter-server strategy registered elsewhere: one part per tensor
        return len(wl.tensors)
    return sum(part_count(rule, t.numel, servers=servers, **opts) for t in wl.tensors)


def _horovod_buffers(wl: Any, kwargs: dict[str, Any], tensors: float) -> float:
    """Return Horovod's fused buffers per iteration, counted by a pilot on four workers
    (one GPU each, two iterations); the tensors' count where the pilot cannot run."""
    from ddpbench.simulator.core import simulate

    pilot = {k: v for k, v in kwargs.items()
             if k not in ("workers", "hosts", "gpus_per_host", "iterations", "warmup",
                          "trace", "stragglers", "hierarchical")}
    try:
        res = simulate(wl, "horovod", workers=4, iterations=2, warmup=1, trace=False,
                       **{"bandwidth_gbps": 10.0, **pilot})
    except (ValueError, TypeError):
        return tensors
    return max(1.0, min(tensors, math.ceil(len(res.fusion_groups) / 2)))


def check(est: Estimate | None, limit: float | None = None, *, allow: bool = False) -> None:
    """Raise :class:`ddpbench.sizes.TooLarge` when ``est`` passes ``limit`` events (default
    :func:`max_events`) or this machine's memory, unless ``allow``."""
    if est is None or allow:
        return
    sizes.check(est.cost(limit), advice="simulate fewer workers, iterations or parts "
                                         "(larger slices or partitions)")
