"""``simulate``: a training job on a simulated network, and ``simulate_collective``.

The training loop (one generator process per simulated worker):

- iteration t runs forward over layers 0..L-1, then backward over L-1..0 on one compute
  stream; compute and communication overlap;
- after the backward of layer i its gradients go to the strategy; the forward of layer i in
  iteration t+1 waits until every unit (tensor, slice, partition) of layer i from iteration
  t is back, updated, on that worker;
- iteration t ends when the last unit of iteration t is back on every worker, and the
  steady-state iteration time is ``(end[N-1] - end[warmup-1]) / (N - warmup)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ddpbench import contract, trace
from ddpbench.simulator.network import CountingEnvironment, Message, Network
from ddpbench.simulator.strategies import ring_allreduce, strategy_class
from ddpbench.simulator.workload import ITEMSIZE, Workload, load_workload

__all__ = ["SimResult", "Span", "simulate", "simulate_collective"]

DEFAULT_SUMMATION_GBPS = 80.0
"""Server summation throughput, Gbit/s of incoming gradient (10 GB/s: a few CPU cores with
SIMD adding fp32 arrays, as BytePS's CPU summation servers do)."""


class Span(NamedTuple):
    """One compute span or transfer on the timeline (times in seconds)."""

    host: str
    kind: str  # forward | backward | allreduce | push | pull | sum
    layer: int
    start: float
    end: float
    bytes: int
    peer: str = ""  # receiver of a transfer, or the worker whose push a sum adds


@dataclass(frozen=True)
class SimResult:
    """What :func:`simulate` measured.

    Attributes:
        iteration_time_s: steady-state seconds per iteration (after the warm-up ones).
        throughput: samples per second of the whole job (workers x batch / iteration time).
        bytes_sent: host -> bytes its NIC sends per iteration.
        bytes_received: host -> bytes its NIC receives per iteration.
        nic_utilisation: host -> fraction of the iteration its uplink is busy sending.
        events: simpy events processed.
        timeline: every compute span and transfer. Allreduce strategies are symmetric, so
            their timeline shows worker 0 only (every worker does the same).
        iteration_end_s: when each simulated iteration ended.
    """

    workload: str
    backend: str
    workers: int
    servers: int | str
    knobs: dict[str, Any]
    iteration_time_s: float
    throughput: float
    bytes_sent: dict[str, float]
    bytes_received: dict[str, float]
    nic_utilisation: dict[str, float]
    events: int
    timeline: list[Span] = field(repr=False)
    iteration_end_s: list[float] = field(repr=False)

    def to_chrome_trace(self, path: str | Path) -> Path:
        """Write the timeline as Chrome-trace JSON (:mod:`ddpbench.trace`, the writer real
        runs use too; open it in https://ui.perfetto.dev)."""
        return trace.write(path, trace.chrome_trace(
            self.timeline, hosts=list(self.bytes_sent), t0=0.0,
            meta={"workload": self.workload, "backend": self.backend, "workers": self.workers}))


class _Point(NamedTuple):
    """A simulated point: the contract's cluster and schedule, and the servers' speed."""

    cluster: contract.Cluster
    schedule: contract.Schedule
    summation_gbps: float


def _validate(cluster: contract.Cluster | None, schedule: contract.Schedule | None,
              summation_gbps: float, **values: Any) -> _Point:
    """Return the point checked against the contract's bounds, naming the field on error."""
    if values.get("servers") is None:
        values["servers"] = "colocated"
    if cluster is not None:
        values.update(cluster.model_dump())
    if schedule is not None:
        values.update(schedule.model_dump())
    checked = {k: contract.check_axis(k, v) for k, v in values.items()}
    checked.setdefault("iterations", 1)
    checked.setdefault("warmup", 0)
    if not (summation_gbps > 0):
        raise ValueError(f"summation_gbps: must be > 0, got {summation_gbps!r}")
    point = _Point(
        contract.Cluster(**{k: checked[k] for k in contract.Cluster.model_fields}),
        contract.Schedule(**{k: checked[k] for k in contract.Schedule.model_fields
                             if k in checked}),
        summation_gbps)
    if point.schedule.warmup >= point.schedule.iterations:
        raise ValueError(f"warmup: must be < iterations ({point.schedule.iterations}) so that "
                         f"at least one iteration is measured, got {point.schedule.warmup}")
    return point


class _Sim:
    """The state of one simulation run, shared by the training loop and the strategy."""

    def __init__(self, workload: Workload | None, workers: int, bandwidth: float,
                 latency: float, *, dedicated_servers: int = 0, summation: float = math.inf,
                 symmetric: bool = True, trace: bool = True, oversubscription: float = 1.0,
                 rack_size: int = contract.DEFAULT_RACK_SIZE) -> None:
        self.env = CountingEnvironment()
        self.workload = workload
        self.workers = workers
        self.bandwidth, self.latency, self.summation = bandwidth, latency, summation
        self.itemsize = ITEMSIZE
        self.dedicated = dedicated_servers
        self.num_servers = dedicated_servers or workers
        nhosts = workers + dedicated_servers
        self.hosts = [f"worker{i}" for i in range(workers)]
        self.hosts += [f"server{j}" for j in range(dedicated_servers)]
        self.sent = np.zeros(nhosts)
        self.received = np.zeros(nhosts)
        self.timeline: list[Span] = []
        self.trace_steps = self.trace_sums = trace
        self.symmetric = symmetric
        self._seq = 0
        self.net = None if symmetric else Network(
            self.env, nhosts, bandwidth, latency, self._record,
            oversubscription=oversubscription, rack_size=rack_size)
        # A ring over racks of consecutive hosts sends one flow over each rack's link to
        # the core per direction, so that link limits a ring step only below one NIC.
        racks = -(-workers // rack_size)
        self.ring_bandwidth = (min(bandwidth, rack_size * bandwidth / oversubscription)
                               if racks > 1 else bandwidth)

    # -- helpers used by strategies
    def host_name(self, h: int) -> str:
        return self.hosts[h]

    def server_host(self, j: int) -> int:
        return self.workers + j if self.dedicated else j

    def net_seq(self) -> int:
        self._seq += 1
        return self._seq

    def span(self, host: int, kind: str, layer: int, start: float, end: float, nbytes: int,
             peer: int | str = "") -> Span:
        if isinstance(peer, int):
            peer = self.hosts[peer]
        return Span(self.hosts[host], kind, layer, start, end, int(nbytes), peer)

    def add_sent_all(self, per_rank: np.ndarray) -> None:
        p = self.workers
        self.sent[:p] += per_rank
        self.received[:p] += np.roll(per_rank, 1)

    def _record(self, msg: Message, start: float, end: float) -> None:
        self.sent[msg.src] += msg.nbytes
        self.received[msg.dst] += msg.nbytes
        self.timeline.append(Span(self.hosts[msg.src], msg.kind, msg.layer, start, end,
                                  msg.nbytes, self.hosts[msg.dst]))

    # -- training loop
    def run_training(self, strategy, iterations: int) -> list[float]:
        wl = self.workload
        nlayers = len(wl.layers)
        nsim = 1 if self.symmetric else self.workers
        self.strategy = strategy
        self._units = [strategy.units(i) for i in range(nlayers)]
        self._remaining = [[0] * nlayers for _ in range(nsim)]
        self._updated = [[0] * nlayers for _ in range(nsim)]
        self._waiters: list[list[Any]] = [[None] * nlayers for _ in range(nsim)]
        self._iter_left = [nsim * nlayers] * iterations
        self._iter_end = [math.nan] * iterations
        strategy.start()
        for w in range(nsim):
            self.env.process(self._compute(w, iterations))
        self.env.run()
        if any(math.isnan(t) for t in self._iter_end):
            raise RuntimeError(f"simulation of {strategy.name!r} stalled: iterations ended at "
                               f"{self._iter_end}")
        return self._iter_end

    def _compute(self, w: int, iterations: int):
        env, layers = self.env, self.workload.layers
        timeline, host = self.timeline, self.hosts[w]
        updated, waiters = self._updated[w], self._waiters[w]
        for t in range(iterations):
            for i, layer in enumerate(layers):
                if updated[i] < t:
                    waiters[i] = env.event()
                    yield waiters[i]
                if layer.fwd_s > 0:
                    start = env.now
                    yield env.timeout(layer.fwd_s)
                    timeline.append(Span(host, "forward", i, start, env.now, 0))
            for i in range(len(layers) - 1, -1, -1):
                if layers[i].bwd_s > 0:
                    start = env.now
                    yield env.timeout(layers[i].bwd_s)
                    timeline.append(Span(host, "backward", i, start, env.now, 0))
                self._remaining[w][i] = self._units[i]
                if self._units[i] == 0:
                    self._layer_done(w, i)
                else:
                    self.strategy.grad_ready(w, i)

    def unit_done(self, w: int, layer: int) -> None:
        """One unit of ``layer`` is back, updated, on worker ``w``."""
        rem = self._remaining[w]
        rem[layer] -= 1
        if rem[layer] == 0:
            self._layer_done(w, layer)

    def _layer_done(self, w: int, layer: int) -> None:
        t = self._updated[w][layer]
        self._updated[w][layer] = t + 1
        ev = self._waiters[w][layer]
        if ev is not None:
            self._waiters[w][layer] = None
            ev.succeed()
        self._iter_left[t] -= 1
        if self._iter_left[t] == 0:
            self._iter_end[t] = self.env.now


def simulate(workload: str | Path | Workload, backend: str, *, workers: int | None = None,
             servers: int | str | None = None, bandwidth_gbps: float | None = None,
             latency_us: float = 5.0,
             iterations: int = 3, warmup: int = 1, compute_scale: float = 1.0,
             summation_gbps: float = DEFAULT_SUMMATION_GBPS, trace: bool = True,
             oversubscription: float = 1.0, rack_size: int = contract.DEFAULT_RACK_SIZE,
             cluster: contract.Cluster | None = None,
             schedule: contract.Schedule | None = None, **knobs: Any) -> SimResult:
    """Simulate data-parallel training of ``workload`` with ``backend`` on an idle cluster.

    Args:
        workload: a shipped profile name (:data:`simulator.WORKLOADS`), a profile YAML path
            or a :class:`~simulator.workload.Workload`.
        backend: one of :data:`simulator.STRATEGIES`.
        workers: worker hosts, one GPU each (required unless ``cluster`` is given).
        servers: parameter-server backends only: ``None`` or ``"colocated"`` puts one server
            on each worker host; an int is that many dedicated server hosts. Ignored by the
            allreduce backends.
        bandwidth_gbps: NIC bandwidth per direction, Gbit/s (required unless ``cluster``).
        latency_us: one-way latency per message, microseconds.
        iterations: iterations simulated in all, including the warm-up ones.
        warmup: leading iterations left out of the steady-state iteration time.
        compute_scale: multiplies every compute time (2.0 = a GPU twice as slow).
        summation_gbps: server summation throughput, Gbit/s of incoming gradient
            (``math.inf`` = free).
        trace: record ring steps and server sums on the timeline (compute spans and
            network transfers are always recorded).
        oversubscription: 1 (default) is one non-blocking switch; above 1, racks of
            ``rack_size`` hosts (workers first, then dedicated servers) reach the core over
            links of ``rack_size * bandwidth / oversubscription``.
        rack_size: hosts per rack (only used when oversubscribed).
        cluster: a :class:`ddpbench.contract.Cluster`; when given, its fields replace
            ``workers``, ``servers``, ``bandwidth_gbps``, ``latency_us``,
            ``oversubscription`` and ``rack_size`` (an experiment point passes this: the
            same value reaches the launcher of a real run).
        schedule: a :class:`ddpbench.contract.Schedule`; when given, its fields replace
            ``iterations``, ``warmup`` and ``compute_scale``, and its ``size_scale``
            resizes the workload's tensors.
        **knobs: the backend's knobs (see :data:`simulator.STRATEGIES`).

    Returns:
        The :class:`SimResult`.

    Raises:
        ValueError: an unknown workload, backend or knob, or a bad value, naming the field.

    Example:
        >>> r = simulate("resnet50", "horovod", workers=8, bandwidth_gbps=10)
        >>> round(r.iteration_time_s, 3) > 0
        True
    """
    cls = strategy_class(backend)
    parsed = cls.parse_knobs(knobs)
    if cluster is None and (workers is None or bandwidth_gbps is None):
        raise TypeError("simulate() needs workers= and bandwidth_gbps=, or cluster=")
    point = _validate(cluster, schedule, summation_gbps, workers=workers, servers=servers,
                      bandwidth_gbps=bandwidth_gbps, latency_us=latency_us,
                      iterations=iterations, warmup=warmup, compute_scale=compute_scale,
                      oversubscription=oversubscription, rack_size=rack_size)
    c, sched = point.cluster, point.schedule
    wl = load_workload(workload).resized(sched.size_scale).scaled(sched.compute_scale)
    dedicated = 0 if cls.symmetric else c.dedicated_servers()
    bandwidth = c.bandwidth_gbps * 1e9 / 8
    sim = _Sim(wl, c.workers, bandwidth, c.latency_us * 1e-6,
               dedicated_servers=dedicated, summation=point.summation_gbps * 1e9 / 8,
               symmetric=cls.symmetric, trace=trace,
               oversubscription=c.oversubscription, rack_size=c.rack_size)
    ends = sim.run_training(cls(sim, parsed), sched.iterations)
    base = ends[sched.warmup - 1] if sched.warmup > 0 else 0.0
    iter_time = (ends[-1] - base) / (sched.iterations - sched.warmup)
    n = sched.iterations
    sent = {h: float(b) / n for h, b in zip(sim.hosts, sim.sent)}
    recv = {h: float(b) / n for h, b in zip(sim.hosts, sim.received)}
    util = {h: b / (bandwidth * iter_time) if iter_time > 0 else 0.0 for h, b in sent.items()}
    servers_out: int | str = dedicated if dedicated else "colocated"
    return SimResult(workload=wl.name, backend=backend, workers=c.workers,
                     servers=servers_out if not cls.symmetric else 0,
                     knobs={k: getattr(parsed, k) for k in contract.sweep_knobs(backend, "sim")},
                     iteration_time_s=iter_time,
                     throughput=c.workers * wl.batch_size / iter_time if iter_time else math.inf,
                     bytes_sent=sent, bytes_received=recv, nic_utilisation=util,
                     events=sim.env.events, timeline=sim.timeline, iteration_end_s=list(ends))


def _ring_broadcast(sim: _Sim, n: int):
    """Generator: MPICH's long-message broadcast, a binomial scatter then a ring allgather."""
    p, env = sim.workers, sim.env
    base, extra = divmod(n, p)
    chunk = (base + (extra > 0)) / sim.bandwidth
    m = p
    while m > 1:  # the root keeps the larger half, so its path is the critical one
        yield env.timeout(sim.latency + (m // 2) * chunk)
        m -= m // 2
    for _ in range(p - 1):
        yield env.timeout(sim.latency + chunk)


def _tree(sim: _Sim, n: int, passes: int):
    rounds = math.ceil(math.log2(sim.workers)) if sim.workers > 1 else 0
    for _ in range(passes * rounds):
        yield sim.env.timeout(sim.latency + n / sim.bandwidth)


def simulate_collective(op: str, nbytes: int, *, workers: int, algorithm: str = "ring",
                        bandwidth_gbps: float, latency_us: float = 5.0,
                        oversubscription: float = 1.0, rack_size: int = contract.DEFAULT_RACK_SIZE) -> float:
    """Return the seconds one collective takes on an idle network of ``workers`` hosts.

    Args:
        op: ``"allreduce"`` or ``"broadcast"``.
        nbytes: message size in bytes (> 0).
        workers: hosts taking part.
        algorithm: ``"ring"`` (allreduce: reduce-scatter + allgather, 2(p-1) steps;
            broadcast: binomial scatter + ring allgather) or ``"tree"`` (binomial:
            allreduce = reduce + broadcast, each ceil(log2 p) rounds of the whole message).
        bandwidth_gbps: per direction, Gbit/s.
        latency_us: per message, microseconds.

    Raises:
        ValueError: an unknown op or algorithm, or a bad value, naming the field.
    """
    if op not in ("allreduce", "broadcast"):
        raise ValueError(f"op: unknown collective {op!r}; available: ['allreduce', 'broadcast']")
    if algorithm not in ("ring", "tree"):
        raise ValueError(f"algorithm: unknown algorithm {algorithm!r}; available: ['ring', 'tree']")
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 1:
        raise ValueError(f"nbytes: expected an integer >= 1, got {nbytes!r}")
    c = _validate(None, None, DEFAULT_SUMMATION_GBPS, workers=workers, bandwidth_gbps=bandwidth_gbps,
                  latency_us=latency_us, oversubscription=oversubscription,
                  rack_size=rack_size).cluster
    sim = _Sim(None, c.workers, c.bandwidth_gbps * 1e9 / 8, c.latency_us * 1e-6,
               trace=False, oversubscription=c.oversubscription, rack_size=c.rack_size)
    if algorithm == "tree":
        gen = _tree(sim, int(nbytes), 2 if op == "allreduce" else 1)
    elif op == "allreduce":
        gen = ring_allreduce(sim, int(nbytes), 1, 0)
    else:
        gen = _ring_broadcast(sim, int(nbytes))
    sim.env.process(gen)
    sim.env.run()
    return float(sim.env.now)
