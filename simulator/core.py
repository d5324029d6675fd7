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

import gc
import math
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import simpy

from ddpbench import contract, hardware, trace
from ddpbench.simulator import sharded  # noqa: F401 - registers zero and fsdp
from ddpbench.simulator.context import Span, new_span
from ddpbench.simulator.network import (
    CountingEnvironment,
    Message,
    Network,
    call_later,
    ecmp_path,
)
from ddpbench.simulator.strategies import (
    Strategy,
    hierarchical_allreduce,
    ring_allreduce,
    strategy_class,
)
from ddpbench.simulator.workload import ITEMSIZE, Layer, Tensor, Workload, load_workload

__all__ = ["SimResult", "Span", "simulate", "simulate_collective"]

DEFAULT_SUMMATION_GBPS: float = contract.Cluster.model_fields["server_sum_gbps"].default
"""Server summation throughput, Gbit/s of incoming gradient (the contract's
``server_sum_gbps``: 10 GB/s, a few CPU cores with SIMD adding fp32 arrays, as BytePS's CPU
summation servers do)."""


@dataclass(frozen=True)
class SimResult:
    """What :func:`simulate` measured.

    Attributes:
        iteration_time_s: steady-state seconds per iteration (after the warm-up ones).
        throughput: samples per second of the whole job (workers x batch / iteration time).
        bytes_sent: host -> bytes its NIC sends per iteration (hosts are ``worker<i>`` with
            one GPU per host, ``host<i>`` with several; then ``server<j>``).
        bytes_received: host -> bytes its NIC receives per iteration.
        nic_utilisation: host -> fraction of the iteration its uplink is busy sending.
        events: simpy events processed.
        timeline: every compute span and transfer. Allreduce strategies are symmetric, so
            their timeline shows worker 0 only (every worker does the same; with jitter,
            the compute spans are those of the slowest GPU).
        iteration_end_s: when each simulated iteration ended.
        hosts: worker hosts.
        gpus_per_host: GPUs (worker processes) per host.
        batch_size: samples per worker per iteration.
        fusion_groups: the fused buffers a fusing strategy (``horovod``) planned, in order:
            (cycle start in seconds, tensor names).
        timeouts: messages that waited TCP's retransmission timeout at a switch port over
            the whole run, warm-up included (incast: a cluster's ``switch_buffer_kb``; 0
            without it).
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
    hosts: int = 0
    gpus_per_host: int = 1
    batch_size: int = 0
    fusion_groups: list[tuple[float, list[str]]] = field(default_factory=list, repr=False)
    timeouts: int = 0

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


_CLUSTER = frozenset(contract.Cluster.model_fields)
_SCHEDULE = frozenset(contract.Schedule.model_fields)


def _validate(cluster: contract.Cluster | None, schedule: contract.Schedule | None,
              summation_gbps: float | None, **values: Any) -> _Point:
    """Return the point checked against the contract's bounds, naming the field on error."""
    values = {k: v for k, v in values.items() if v is not None}
    if cluster is not None:
        values = {k: v for k, v in values.items() if k not in _CLUSTER}
        values.update(cluster.model_dump())
    if schedule is not None:
        values = {k: v for k, v in values.items() if k not in _SCHEDULE}
        values.update(schedule.model_dump())
    checked = {k: contract.check_axis(k, v) for k, v in values.items() if v is not None}
    checked.setdefault("iterations", 1)
    checked.setdefault("warmup", 0)
    c = contract.Cluster.from_point(checked)
    if summation_gbps is None:
        summation_gbps = c.server_sum_gbps
    elif not (summation_gbps > 0):
        raise ValueError(f"summation_gbps: must be > 0, got {summation_gbps!r}")
    point = _Point(c, contract.Schedule.from_point(checked), summation_gbps)
    if point.schedule.warmup >= point.schedule.iterations:
        raise ValueError(f"warmup: must be < iterations ({point.schedule.iterations}) so that "
                         f"at least one iteration is measured, got {point.schedule.warmup}")
    return point


def _rescaled(wl: Workload, c: contract.Cluster, sched: contract.Schedule) -> Workload:
    """Return ``wl`` with compute times for the point's device, batch and precision (the
    hardware rules); ``mixed`` divides by the profile's measured speedup instead."""
    wl = wl.resized(sched.size_scale)
    factor = sched.compute_scale
    target = None if sched.precision == "mixed" else sched.precision
    if c.device is not None or sched.batch_size is not None \
            or target not in (None, wl.precision):
        factor *= wl.compute_factor(c.device, sched.batch_size, target)
    if sched.precision == "mixed":
        if wl.mixed_precision_speedup is None:
            raise ValueError(f"precision: workload {wl.name!r} records no "
                             f"mixed_precision_speedup (a measured one), so mixed precision "
                             f"cannot be simulated for it; precision fp16 or bf16 runs its "
                             f"compute at that precision by the precision rule "
                             f"(ddpbench.hardware.precision_factor)")
        measured_on = hardware.DEVICES[wl.device].like if wl.device in hardware.DEVICES else None
        if c.device is not None and c.device not in (wl.device, measured_on):
            raise ValueError(f"precision: workload {wl.name!r}'s mixed-precision speedup was "
                             f"measured on {measured_on or wl.device}, not {c.device}; "
                             f"precision fp16 or bf16 runs its compute on {c.device} by the "
                             f"precision rule (ddpbench.hardware.precision_factor)")
        factor /= wl.mixed_precision_speedup
        wl = wl.resized(0.5)  # fp16 gradients: half the bytes
    wl = wl.scaled(factor)
    return wl.recomputed(sched.activation_checkpointing)


def _compressed(wl: Workload, parsed: Any, sched: contract.Schedule) -> Workload:
    """Return ``wl`` as a backend's ``compression`` sends it: ``fp16`` casts floating-point
    gradients to float16 before they travel and back after (horovod/torch/compression.py,
    byteps/torch/compression.py), half the bytes; under mixed precision, and where the
    point's precision already sends 16-bit gradients (fp16, bf16, fp8), the cast changes
    nothing. The casts' GPU time is not charged (an
    element-wise kernel over the gradients, far below a millisecond per iteration)."""
    if getattr(parsed, "compression", "none") != "fp16" or sched.precision == "mixed" \
            or hardware.gradient_bytes(sched.precision) <= 2:
        return wl
    return wl.resized(0.5)


class _Sim:
    """The state of one simulation run, shared by the training loop and the strategy.

    Allreduce strategies ring over every GPU (``workers`` = hosts x gpus_per_host);
    parameter-server strategies push and pull per host (``workers`` = hosts), because a
    host first reduces its GPUs' gradients over its intra-host link (MXNet's local
    reduction in kvstore_dist, BytePS's intra-machine reduce) and broadcasts the pulled
    parameters back to them.
    """

    def __init__(self, workload: Workload | None, cluster: contract.Cluster, *,
                 symmetric: bool = True, summation: float = math.inf,
                 trace: bool = True, transport: hardware.Transport | None = None,
                 itemsize: int = ITEMSIZE) -> None:
        c = cluster
        tr = transport or hardware.transport(c.transport)
        link = hardware.intra_link(c.intra_link)
        self.env = CountingEnvironment()
        self.workload = workload if workload is not None else _EMPTY
        self.cluster = c
        self.symmetric = symmetric
        self.gpus = c.gpus_per_host
        self.num_hosts = c.num_hosts
        self.workers = c.workers if symmetric else self.num_hosts
        self._init_links(c, tr, link)
        self._init_servers(c, tr, summation)
        self._init_hosts(c, symmetric, itemsize)
        self.timeline: list[Span] = []
        self.trace_steps = self.trace_sums = trace
        self._seq = 0
        # Compute slows by this fraction for the time a GPU collective runs beside it.
        self.overlap_slowdown = c.compute_overlap_slowdown
        self._busy: list[_Busy] = [_Busy()]  # one per group once training runs
        # One connection's ceiling (the cluster's socket_gbps, else the transport's), where
        # it binds: what one ps-lite process receives, and a ring's step to the next host.
        cap = tr.binding_socket_gbps(c.bandwidth_gbps, c.socket_gbps)
        # Colocated servers over a transport without a local shortcut: a worker's parts on
        # its own host's server cross that server's socket too, so the ceiling can bind
        # below the NIC's rate.
        self.loopback = tr.loopback and not self.dedicated
        self.net = None if symmetric else self._network(c, tr, cap)
        self._init_rings(c, tr, link, cap)
        self.negotiation = self._negotiation(c, tr)
        self._bcast: list[list[tuple[int, float, bool]]] | None = None
        self._reduce_stages: list[list[tuple[int, float, bool]]] = []

    def _init_links(self, c: contract.Cluster, tr: hardware.Transport,
                    link: hardware.IntraLink) -> None:
        """Set the NIC's and the intra-host link's rates and latencies, and NCCL's model."""
        self.line_bandwidth = c.bandwidth_gbps * 1e9 / 8
        self.bandwidth = self.line_bandwidth * tr.efficiency * tr.duplex
        self.latency = c.latency_us * 1e-6
        self.per_message = (tr.per_message_us if c.per_message_us is None
                            else c.per_message_us) * 1e-6
        # A ring over the host's GPUs (it may cross PCIe switches); each GPU's own path to
        # the host's memory, which a parameter-server host's local reduction uses.
        self.intra_bandwidth = link.ring_gbps(c.gpus_per_host) * 1e9 / 8
        self.local_bandwidth = link.bandwidth_gbps * 1e9 / 8
        self.intra_latency = link.latency_us * 1e-6
        self.intra_link = link.name
        # A named GPU's rings run NCCL, priced by NCCL's own model (hardware.nccl_ring) on a
        # real transport; the ideal transport keeps the closed forms' latency per step.
        dev = hardware.DEVICES.get(c.device) if c.device else None
        self.nccl: float | None = (dev.compute_capability if dev is not None
                                   and tr.name != "ideal" else None)
        self.nccl_release = hardware.nccl_release(c.nccl_version)
        # A network plugin that sets NCCL_PROTO=simple where its network cannot order a
        # write's bytes (aws-ofi-nccl on p4d, p4de, p3dn), unless the user set it.
        cc = dev.compute_capability if dev is not None else None
        forced = (c.nccl_proto is None and cc is not None
                  and tr.nccl_simple_below_cc is not None
                  and cc < tr.nccl_simple_below_cc
                  and self.nccl_release >= hardware.NCCL_PLUGIN_SIMPLE_SINCE)
        self.nccl_proto = hardware.nccl_protocols("Simple" if forced else c.nccl_proto)
        self.nccl_algo = hardware.nccl_algorithms(c.nccl_algo, self.nccl_release)
        # What NCCL's tuner knows of the network: its own latency per step between hosts
        # (the plugin's, and the cost of posting a message), the host's NICs, SHARP.
        self.nics = c.nics_per_host
        self.nccl_fabric = hardware.NcclFabric(
            hardware.nccl_net_latency_us(tr, c.per_message_us), c.nics_per_host,
            c.bandwidth_gbps / 8, c.collnet,
            self.intra_bandwidth / 1e9 if tr.nccl_net_us is not None else 0.0)
        self.nvls_bandwidth = (link.nvls_gbps or 0.0) * 1e9 / 8
        # Rail-optimised NICs: each GPU reaches its own through its PCIe path, so a host's
        # NICs together take at most what min(GPUs, NICs) such paths carry.
        self.nic_path_bandwidth = (min(c.gpus_per_host, c.nics_per_host) * link.host_gbps
                                   * 1e9 / 8)
        # MPI_Allreduce as MPICH runs it over a real transport; the ideal network and a
        # calibrated machine (its fitted cost is a call's) keep the ring's closed form.
        self.mpich = tr.name not in ("ideal", "machine")

    def _init_servers(self, c: contract.Cluster, tr: hardware.Transport,
                      summation: float) -> None:
        """Set the parameter servers' summation and update rates and their thread's budget."""
        self.summation = summation
        self.update = math.inf if c.server_update_gbps is None else c.server_update_gbps * 1e9 / 8
        # MXNet's server thread (kvstore, p3) on a real transport: bytes of memory traffic
        # per second, which its copies, sums, updates and pull replies all draw on
        # (hardware.MXNET_SERVER_BYTES); 0 = servers only sum, as the closed forms have them.
        update_gbps = (hardware.MXNET_SERVER_UPDATE_GBPS if c.server_update_gbps is None
                       else c.server_update_gbps)
        self.server_thread = (update_gbps * 1e9 / 8 * hardware.MXNET_SERVER_BYTES["update"]
                              if tr.server_cpu and summation < math.inf else 0.0)

    def _init_hosts(self, c: contract.Cluster, symmetric: bool, itemsize: int = ITEMSIZE) -> None:
        """Name the hosts (workers', then dedicated servers') and zero their byte counts;
        ``itemsize`` is the bytes per gradient element every strategy sends."""
        self.itemsize = itemsize
        self.dedicated = 0 if symmetric else c.dedicated_servers()
        self.num_servers = self.dedicated or self.num_hosts
        nhosts = self.num_hosts + self.dedicated
        prefix = "worker" if self.gpus == 1 else "host"
        self.hosts = [f"{prefix}{i}" for i in range(self.num_hosts)]
        self.hosts += [f"server{j}" for j in range(self.dedicated)]
        self.sent = np.zeros(nhosts)
        self.received = np.zeros(nhosts)
        # Per-message counts (the network's): plain lists, added to the arrays at the end.
        self._sent_msgs = [0] * nhosts
        self._received_msgs = [0] * nhosts

    def _network(self, c: contract.Cluster, tr: hardware.Transport,
                 cap: float | None) -> Network:
        """Return the parameter servers' network: every host's NIC, racks, sockets, and
        the page faults of large received messages."""
        socket_gbps = c.socket_gbps if c.socket_gbps is not None else tr.socket_gbps
        fault_us = tr.page_fault_us if c.page_fault_us is None else c.page_fault_us
        large = (None if tr.large_message_bytes is None or not fault_us
                 else (tr.large_message_bytes, fault_us * 1e-6 / 4096))
        sock = socket_gbps if self.loopback or large is not None else cap
        return Network(
            self.env, self.num_hosts + self.dedicated, self.bandwidth, self.latency, self._record,
            oversubscription=c.oversubscription, rack_size=c.rack_size,
            per_message=self.per_message,
            socket_bandwidth=None if sock is None else sock * 1e9 / 8,
            loopback=self.loopback, large_message=large, ecmp_paths=c.ecmp_paths,
            incast=self._incast(c, tr))

    def _incast(self, c: contract.Cluster, tr: hardware.Transport) -> tuple[int, float] | None:
        """Return the network's incast limit, ``(senders, rto)``, where the cluster gives its
        switches' buffer on a lossy transport: the senders a port holds four segments each
        for over its buffer and the path's round trip (two latencies), and the
        transport's minimum retransmission timeout; None without."""
        if c.switch_buffer_kb is None or tr.rto_min_ms is None:
            return None
        senders = hardware.incast_senders(c.switch_buffer_kb * 1024, self.bandwidth,
                                          2 * self.latency)
        return senders, tr.rto_min_ms * 1e-3

    def _init_rings(self, c: contract.Cluster, tr: hardware.Transport,
                    link: hardware.IntraLink, cap: float | None) -> None:
        """Set what a ring's step to the next host moves: over its connections, across
        racks, at the slowest connection's share of the NIC."""
        # A ring's step to the next host travels over connections: over tcp one kernel TCP
        # connection carries at most the transport's socket figure, however fast the NIC.
        # MPI over TCP sends it over one; NCCL's rings over as many as it opens channels
        # through the NIC, each split over its socket flows (NCCL runs at the slowest
        # socket times their number: NVIDIA/nccl-tests issue #83).
        flows = 1
        self.nccl_channels = (c.nccl_channels
                              or hardware.nccl_channels(self.nccl_release, link.name,
                                                        c.gpus_per_host))
        if self.nccl is not None:
            flows = self.nccl_channels * (c.nccl_socket_flows or 1)
        self.flow_bandwidth = math.inf if cap is None else flows * cap * 1e9 / 8
        # A ring over racks of consecutive hosts crosses each rack's links to the core once
        # per direction: those links limit a ring step only below one NIC, or where the
        # step's flows collide on one of the rack's equal-cost paths.
        self.ring_bandwidth = min(self.bandwidth, self._cross_rack(flows))
        # Connections sharing the NIC split it unevenly, and a ring's step, striped evenly
        # over them, waits for the slowest.
        share = hardware.slowest_share(flows, tr.flow_spread)
        self.ring_bandwidth *= share
        self.flow_bandwidth *= share

    def _negotiation(self, c: contract.Cluster, tr: hardware.Transport) -> float:
        """Return the seconds Horovod's coordinator spends agreeing on ready tensors a cycle.

        Every cycle it runs one bitwise AND allreduce of its response-cache bit vector, a
        second (OR) only when some rank invalidated a cached entry
        (horovod/common/response_cache.cc, ``CacheCoordinator::sync``: CrossRankBitwiseAnd,
        then CrossRankBitwiseOr if INVALID_IN_QUEUE), ceil(log2 p) rounds of small messages;
        the ideal transport has no control plane. On one host those messages stay in the host
        (MPI's shared memory): the intra-host link's latency.
        """
        rounds = math.ceil(math.log2(c.workers)) if c.workers > 1 else 0
        hop = self.latency + self.per_message if self.num_hosts > 1 else self.intra_latency
        return rounds * hop if tr.control_plane else 0.0

    def _cross_rack(self, flows: int) -> float:
        """Return what a ring's step moves from one rack to the next, bytes/s: ``flows``
        flows over the rack's links to the core (``rack_size`` NICs' worth over the
        oversubscription, split into ``ecmp_paths`` paths); each flow hashes onto a path
        (:func:`ddpbench.simulator.network.ecmp_path`), flows on one path share it, and the
        step, striped evenly over its flows, moves at their number times the slowest; the
        slowest rack boundary of the ring sets it. Unbounded with one rack."""
        c = self.cluster
        h, rs, m = self.num_hosts, c.rack_size, c.ecmp_paths
        racks = -(-h // rs)
        if racks <= 1 or (m == 1 and c.oversubscription == 1):
            return math.inf  # (one full rack link: never below a NIC)
        path = rs * self.bandwidth / c.oversubscription / m
        worst = math.inf
        for r in range(racks):
            src, dst = min((r + 1) * rs, h) - 1, ((r + 1) * rs) % h
            load = [0] * m
            for i in range(flows):  # one flow per connection: its own ports, its own hash
                load[ecmp_path(src + i * h, dst, m)] += 1
            worst = min(worst, flows * path / max(load))
        return worst

    # -- helpers used by strategies
    def host_name(self, h: int) -> str:
        return self.hosts[h]

    def server_host(self, j: int) -> int:
        return self.num_hosts + j if self.dedicated else j

    def net_seq(self) -> int:
        self._seq += 1
        return self._seq

    def span(self, host: int, kind: str, layer: int, start: float, end: float, nbytes: int,
             peer: int | str = "") -> Span:
        if isinstance(peer, int):
            peer = self.hosts[peer]
        return new_span(Span, (self.hosts[host], kind, layer, start, end, int(nbytes), peer))

    def add_sent_all(self, per_rank: np.ndarray) -> None:
        p = self.workers
        self.sent[:p] += per_rank
        self.received[:p] += np.roll(per_rank, 1)

    def add_sent_hosts(self, nbytes: float) -> None:
        h = self.num_hosts
        self.sent[:h] += nbytes
        self.received[:h] += nbytes

    def _record(self, msg: Message, start: float, end: float) -> None:
        self._sent_msgs[msg.src] += msg.nbytes
        self._received_msgs[msg.dst] += msg.nbytes
        # (new_span: a Span without the named tuple's Python-level constructor; one per
        # message)
        self.timeline.append(new_span(Span, (self.hosts[msg.src], msg.kind, msg.layer, start,
                                             end, msg.nbytes, self.hosts[msg.dst])))

    # -- training loop
    def _factors(self, iterations: int) -> np.ndarray | None:
        """Return each GPU's compute factor per iteration, or None when all are 1."""
        c = self.cluster
        if c.jitter == 0 and c.stragglers == 0:
            return None
        rng = np.random.default_rng(c.seed)
        f = np.ones((iterations, c.workers))
        if c.jitter > 0:  # log-normal of mean 1
            f = np.exp(c.jitter * rng.standard_normal((iterations, c.workers))
                       - c.jitter ** 2 / 2)
        if c.stragglers:
            f[:, rng.choice(c.workers, c.stragglers, replace=False)] *= c.straggler_slowdown
        return f

    def run_training(self, strategy: Strategy, iterations: int) -> list[float]:
        wl = self.workload
        nlayers = len(wl.layers)
        nsim = 1 if self.symmetric else self.workers
        self.strategy = strategy
        self.iterations = iterations
        self._units = [strategy.units(i) for i in range(nlayers)]
        self.remaining = [[0] * nlayers for _ in range(nsim)]
        self._updated = [[0] * nlayers for _ in range(nsim)]
        self._updated_at = [[0.0] * nlayers for _ in range(nsim)]
        self._waiters: list[list[Any]] = [[None] * nlayers for _ in range(nsim)]
        self._iter_left = [nsim * nlayers] * iterations
        self._iter_end = [math.nan] * iterations
        if not self.symmetric and self.gpus > 1:
            # The host's GPUs reduce a layer before its push and receive it after its pull,
            # in the stages the strategy's worker runs them (Strategy.host_stages).
            self._reduce_stages, self._bcast = strategy.host_stages()
            self._local_free = [[0.0] * 4 for _ in range(nsim)]
        self._busy = [_Busy() for _ in range(nsim)]
        strategy.start()
        factors = self._factors(iterations)
        for w in range(nsim):
            if factors is None:
                self.env.process(self._compute(w, iterations))
            else:
                group = factors if self.symmetric else factors[:, w * self.gpus:(w + 1) * self.gpus]
                self.env.process(self._compute_varied(w, iterations, group))
        self.env.run()
        if any(math.isnan(t) for t in self._iter_end):
            raise RuntimeError(f"simulation of {strategy.name!r} stalled: iterations ended at "
                               f"{self._iter_end}")
        return self._iter_end

    def _compute(self, w: int, iterations: int) -> Generator[simpy.Event, Any, None]:
        env, layers = self.env, self.workload.layers
        timeline, host = self.timeline, self.hosts[w]
        updated, waiters = self._updated[w], self._waiters[w]
        slow, busy = self.overlap_slowdown, self._busy[w]
        gated = self.strategy.gates_compute
        for t in range(iterations):
            for i, layer in enumerate(layers):
                if updated[i] < t:
                    waiters[i] = env.event()
                    yield waiters[i]
                if gated and (gate := self.strategy.forward_gate(w, i, t)) is not None:
                    yield gate
                if layer.fwd_s > 0:
                    start = env.now
                    yield env.timeout(layer.fwd_s)
                    if slow and (extra := slow * busy.overlap(start, env.now)) > 0:
                        yield env.timeout(extra)
                    timeline.append(Span(host, "forward", i, start, env.now, 0))
                if gated:
                    self.strategy.forward_done(w, i, t)
            for i in range(len(layers) - 1, -1, -1):
                if gated and (gate := self.strategy.backward_gate(w, i, t)) is not None:
                    yield gate
                if layers[i].bwd_s > 0:
                    start = env.now
                    yield env.timeout(layers[i].bwd_s)
                    if slow and (extra := slow * busy.overlap(start, env.now)) > 0:
                        yield env.timeout(extra)
                    timeline.append(Span(host, "backward", i, start, env.now, 0))
                self._grads(w, i)

    def _compute_varied(self, w: int, iterations: int,
                        factors: np.ndarray) -> Generator[simpy.Event, Any, None]:
        """Run the GPUs of group ``w`` (every GPU, or one host's), each at its own speed.

        Each GPU has its own clock: a forward layer starts when both its parameters and
        the GPU are ready, and a layer's gradients leave when the slowest GPU of the group
        has them (a collective waits for every rank; a host reduces its GPUs first). The
        process sleeps only until those moments, so the cost grows with layers, not GPUs.
        """
        env, layers = self.env, self.workload.layers
        timeline, host = self.timeline, self.hosts[w]
        updated, waiters, updated_at = self._updated[w], self._waiters[w], self._updated_at[w]
        slow, busy = self.overlap_slowdown, self._busy[w]
        clock = np.zeros(factors.shape[1])
        gated = self.strategy.gates_compute
        for t in range(iterations):
            f = factors[t]
            for i, layer in enumerate(layers):
                if updated[i] < t:
                    waiters[i] = env.event()
                    yield waiters[i]
                    ready = env.now
                else:
                    ready = updated_at[i]
                if gated:  # the GPUs reach the gate when the slowest has
                    ready = yield from self._gated(clock, ready, self.strategy.forward_gate(w, i, t))
                start = max(ready, float(clock.max()))
                clock = np.maximum(clock, ready) + f * layer.fwd_s
                if slow and layer.fwd_s > 0:
                    clock = yield from self._overlapped(clock, start, slow, busy)
                if layer.fwd_s > 0:
                    timeline.append(Span(host, "forward", i, start, float(clock.max()), 0))
                if gated:
                    end = float(clock.max())
                    if end > env.now:
                        yield env.timeout(end - env.now)
                    self.strategy.forward_done(w, i, t)
            for i in range(len(layers) - 1, -1, -1):
                if gated:
                    ready = yield from self._gated(clock, 0.0,
                                                   self.strategy.backward_gate(w, i, t))
                    clock = np.maximum(clock, ready)
                start = float(clock.max())
                clock = clock + f * layers[i].bwd_s
                if slow and layers[i].bwd_s > 0:
                    clock = yield from self._overlapped(clock, start, slow, busy)
                end = float(clock.max())
                if end > env.now:
                    yield env.timeout(end - env.now)
                if layers[i].bwd_s > 0:
                    timeline.append(Span(host, "backward", i, start, end, 0))
                self._grads(w, i)

    def _gated(self, clock: np.ndarray, ready: float,
               gate: simpy.Event | None) -> Generator[simpy.Event, Any, float]:
        """Return when a gated layer may start: once the group's slowest GPU reached the
        gate (``clock``) and ``gate`` (a strategy's event) has happened, not before
        ``ready``."""
        if gate is None:
            return ready
        env = self.env
        end = float(clock.max())
        if end > env.now:
            yield env.timeout(end - env.now)
        yield gate
        return max(ready, env.now)

    def _overlapped(self, clock: np.ndarray, start: float, slow: float,
                    busy: _Busy) -> Generator[simpy.Event, Any, np.ndarray]:
        """Return ``clock`` (a layer of the group computed from ``start``) stretched by the
        overlap slowdown for the time the group's collectives ran beside the layer."""
        env = self.env
        end = float(clock.max())
        if end > env.now:
            yield env.timeout(end - env.now)
        extra = slow * busy.overlap(start, end)
        return clock + extra if extra > 0 else clock

    def _grads(self, w: int, i: int) -> None:
        """Hand layer ``i``'s gradients of group ``w`` to the strategy."""
        self.remaining[w][i] = self._units[i]
        if self._units[i] == 0:
            self._layer_done(w, i)
        elif self._bcast is not None and self._reduce_stages[i]:
            self._local(w, i, self._reduced, self._reduce_stages[i])  # before the push
        else:
            self.strategy.grad_ready(w, i)

    def _local(self, w: int, layer: int, then: Any,
               stages: list[tuple[int, float, bool]]) -> None:
        """Run ``then`` once host ``w`` has passed ``layer`` through ``stages``.

        Each stage ``(queue, seconds, gpus_busy)`` holds one of the host's queues (its
        intra-host link, the copies up to and down from the host's memory, its CPU) for
        its seconds, after the stage before it; each queue serves the layers one after
        another in the order they were asked for, so a stage's turn is known when the
        layer is asked for. A stage with ``gpus_busy`` slows the GPUs' compute beside it.
        """
        free = self._local_free[w]
        t = self.env.now
        for queue, seconds, gpus_busy in stages:
            begin = t if t >= free[queue] else free[queue]
            t = begin + seconds
            free[queue] = t
            if gpus_busy:
                self._busy[w].add(begin, t)
        call_later(self.env, t - self.env.now, then, (w, layer))

    def _reduced(self, value: tuple[int, int]) -> None:
        w, i = value
        self.strategy.grad_ready(w, i)

    def comm_begin(self, w: int = 0) -> None:
        """A collective on group ``w``'s GPUs starts now (it slows their compute)."""
        self._busy[w].begin(self.env.now)

    def comm_end(self, w: int = 0) -> None:
        """The collective :meth:`comm_begin` announced ends now."""
        self._busy[w].end(self.env.now)

    def unit_done(self, w: int, layer: int) -> None:
        """One unit of ``layer`` is back, updated, on worker ``w``."""
        rem = self.remaining[w]
        rem[layer] -= 1
        if rem[layer] == 0:
            if self._bcast is not None and self._bcast[layer]:
                self._local(w, layer, self._broadcast_done, self._bcast[layer])  # to its GPUs
            else:
                self._layer_done(w, layer)

    def _broadcast_done(self, value: tuple[int, int]) -> None:
        w, layer = value
        self._layer_done(w, layer)

    def _layer_done(self, w: int, layer: int) -> None:
        t = self._updated[w][layer]
        self._updated[w][layer] = t + 1
        self._updated_at[w][layer] = self.env.now
        ev = self._waiters[w][layer]
        if ev is not None:
            self._waiters[w][layer] = None
            ev.succeed()
        self._iter_left[t] -= 1
        if self._iter_left[t] == 0:
            self._iter_end[t] = self.env.now


class _Busy:
    """When a group's GPUs ran collectives: closed intervals and the ones open now.

    Compute asks how much of ``[a, b]`` (``b`` not in the future, ``a`` never earlier than
    an earlier question's) overlapped them; intervals scheduled ahead (a host's intra-host
    reductions) count only up to ``b``.
    """

    __slots__ = ("_open", "_since", "_spans")

    def __init__(self) -> None:
        self._spans: list[tuple[float, float]] = []
        self._open = 0
        self._since = 0.0

    def begin(self, now: float) -> None:
        if self._open == 0:
            self._since = now
        self._open += 1

    def end(self, now: float) -> None:
        self._open -= 1
        if self._open == 0:
            self.add(self._since, now)

    def add(self, a: float, b: float) -> None:
        if b <= a:
            return
        spans = self._spans
        if spans and a <= spans[-1][1] and b >= spans[-1][0]:  # touches the last: merge
            spans[-1] = (min(a, spans[-1][0]), max(b, spans[-1][1]))
        else:
            spans.append((a, b))

    def overlap(self, a: float, b: float) -> float:
        """Return the time within ``[a, b]`` that a collective ran."""
        spans = self._spans
        while spans and spans[0][1] <= a:
            spans.pop(0)
        total = 0.0
        for s, e in spans:
            if s < b:
                total += max(0.0, min(e, b) - max(s, a))
        if self._open:
            total += max(0.0, b - max(a, self._since))
        return min(total, b - a)


def _without_gc(run: Any) -> Any:
    """Return ``run()`` with Python's cyclic garbage collector paused.

    A run creates millions of short-lived objects (events, messages) beside a growing
    timeline; every collection would walk the timeline again. The simulation's objects do
    not depend on cycle collection: an event drops its callbacks once processed, so memory
    stays the same.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        return run()
    finally:
        if enabled:
            gc.enable()


_EMPTY = Workload(name="none", batch_size=1, layers=(Layer(name="none", fwd_s=0, bwd_s=0),),
                  tensors=(Tensor(name="none", numel=1, layer=0),))


def simulate(workload: str | Path | Workload, backend: str, *, workers: int | None = None,
             servers: int | str | None = None, bandwidth_gbps: float | None = None,
             latency_us: float = 5.0,
             iterations: int = 3, warmup: int = 1, compute_scale: float = 1.0,
             summation_gbps: float | None = None, trace: bool = True,
             cluster: contract.Cluster | None = None,
             schedule: contract.Schedule | None = None, machine: Any = None,
             **options: Any) -> SimResult:
    """Simulate data-parallel training of ``workload`` with ``backend`` on an idle cluster.

    Args:
        workload: a shipped profile name (:data:`simulator.WORKLOADS`), a profile YAML path
            or a :class:`~simulator.workload.Workload`.
        backend: one of :data:`simulator.STRATEGIES`.
        workers: worker processes, one per GPU (required unless ``cluster`` or ``hosts``
            is given).
        servers: parameter-server backends only: ``None`` or ``"colocated"`` puts one server
            on each worker host; an int is that many dedicated CPU-only server hosts.
            Ignored by the allreduce backends.
        bandwidth_gbps: NIC line rate per direction, Gbit/s (required unless ``cluster``).
        latency_us: one-way latency per message, microseconds.
        iterations: iterations simulated in all, including the warm-up ones.
        warmup: leading iterations left out of the steady-state iteration time.
        compute_scale: multiplies every compute time (2.0 = a GPU twice as slow).
        summation_gbps: overrides the cluster's ``server_sum_gbps`` (``math.inf`` = free).
        trace: record ring steps and server sums on the timeline (compute spans and
            network transfers are always recorded).
        cluster: a :class:`ddpbench.contract.Cluster`; when given, its fields replace the
            cluster keywords (an experiment point passes this: the same value reaches the
            launcher of a real run).
        schedule: a :class:`ddpbench.contract.Schedule`; when given, its fields replace
            ``iterations``, ``warmup``, ``compute_scale``, ``size_scale`` and
            ``batch_size``.
        machine: a calibrated machine (:class:`ddpbench.calibration.Machine` or the path
            of its YAML), as the cluster's ``machine`` field: compute, messages, bandwidth
            and summation at that machine's measured costs.
        **options: any other field of :class:`~ddpbench.contract.Cluster` (``hosts``,
            ``gpus_per_host``, ``transport``, ``intra_link``, ``device``, ``jitter``,
            ``stragglers``, ``seed``, ``oversubscription``, ...) or
            :class:`~ddpbench.contract.Schedule` (``size_scale``, ``batch_size``), and the
            backend's knobs (see :data:`simulator.STRATEGIES`).

    Returns:
        The :class:`SimResult`.

    Raises:
        ValueError: an unknown workload, backend, knob, device or transport, or a bad
            value, naming the field.

    Example:
        >>> r = simulate("resnet50", "horovod", hosts=4, gpus_per_host=8,
        ...              bandwidth_gbps=25, transport="tcp", intra_link="nvlink",
        ...              hierarchical=True)
        >>> round(r.iteration_time_s, 3) > 0
        True
    """
    cls = strategy_class(backend)
    knobs = {k: v for k, v in options.items() if k not in _CLUSTER and k not in _SCHEDULE}
    parsed = cls.parse_knobs(knobs)
    if cluster is None and ((workers is None and options.get("hosts") is None)
                            or bandwidth_gbps is None):
        raise TypeError("simulate() needs workers= (or hosts=) and bandwidth_gbps=, or cluster=")
    point = _validate(cluster, schedule, summation_gbps, workers=workers, servers=servers,
                      bandwidth_gbps=bandwidth_gbps, latency_us=latency_us,
                      iterations=iterations, warmup=warmup, compute_scale=compute_scale,
                      **{k: v for k, v in options.items() if k not in knobs})
    c, sched = point.cluster, point.schedule
    wl = _compressed(_rescaled(load_workload(workload), c, sched), parsed, sched)
    batch = sched.batch_size or wl.batch_size
    micro = sched.grad_accumulation
    per_micro = communicates_every_micro_batch(backend, parsed)
    if not per_micro:
        wl = wl.accumulated(micro)  # itself at one micro-batch
    summation, transport = point.summation_gbps, None
    if machine is not None or c.machine is not None:
        c, wl, transport, summation = _on_machine(machine or c.machine, backend, c, wl)
    sim = _Sim(wl, c, symmetric=cls.symmetric, summation=summation * 1e9 / 8,
               trace=trace, transport=transport,
               itemsize=hardware.gradient_bytes(sched.precision))
    ends = _without_gc(lambda: sim.run_training(cls(sim, parsed), sched.iterations))
    return _result(sim, ends, sched, backend=backend, symmetric=cls.symmetric, parsed=parsed,
                   batch=batch * micro, repeat=micro if per_micro else 1)


def communicates_every_micro_batch(backend: str, knobs: Any) -> bool:
    """Return whether ``backend`` under ``knobs`` communicates after every micro-batch of an
    accumulating step: FSDP (outside ``no_sync``, torch/distributed/fsdp
    ``_post_backward_hook``) and ZeRO stages 2 and 3 (deepspeed/runtime/engine.py
    ``backward``: partitioned gradients are reduced at every micro-step). The others
    communicate at the accumulation boundary only (DDP's ``no_sync``, Horovod's
    ``backward_passes_per_step``, MXNet's ``grad_req='add'``, DeepSpeed stages 0 and 1)."""
    return backend == "fsdp" or (backend == "zero" and int(getattr(knobs, "stage", 0)) >= 2)


def _result(sim: _Sim, ends: list[float], sched: contract.Schedule, *, backend: str,
            symmetric: bool, parsed: Any, batch: int, repeat: int = 1) -> SimResult:
    """Return what the run measured: the steady-state iteration time (after the warm-up
    iterations), and each host's bytes per iteration and NIC utilisation. ``repeat``: a
    step is that many simulated iterations (micro-batches that each communicate), so its
    time and bytes are that many times an iteration's."""
    c, wl = sim.cluster, sim.workload
    base = ends[sched.warmup - 1] if sched.warmup > 0 else 0.0
    iter_time = (ends[-1] - base) / (sched.iterations - sched.warmup) * repeat
    n = sched.iterations / repeat
    sent = {h: (float(b) + m) / n for h, b, m in zip(sim.hosts, sim.sent, sim._sent_msgs)}
    recv = {h: (float(b) + m) / n
            for h, b, m in zip(sim.hosts, sim.received, sim._received_msgs)}
    util = {h: b / (sim.line_bandwidth * iter_time) if iter_time > 0 else 0.0
            for h, b in sent.items()}
    servers_out: int | str = sim.dedicated if sim.dedicated else "colocated"
    return SimResult(workload=wl.name, backend=backend, workers=c.workers,
                     servers=servers_out if not symmetric else 0,
                     knobs={k: getattr(parsed, k) for k in contract.sweep_knobs(backend, "sim")},
                     iteration_time_s=iter_time,
                     throughput=c.workers * batch / iter_time if iter_time else math.inf,
                     bytes_sent=sent, bytes_received=recv, nic_utilisation=util,
                     events=sim.env.events, timeline=sim.timeline, iteration_end_s=list(ends),
                     fusion_groups=list(getattr(sim.strategy, "plan_log", [])),
                     hosts=c.num_hosts, gpus_per_host=c.gpus_per_host, batch_size=batch,
                     timeouts=sim.net.timeouts if sim.net is not None else 0)


def _on_machine(machine: Any, backend: str, c: contract.Cluster, wl: Workload
                ) -> tuple[contract.Cluster, Workload, hardware.Transport, float]:
    """Return the cluster, workload, transport and summation rate of a point on ``machine``."""
    from ddpbench.calibration.machine import adjust, load_machine

    m = load_machine(machine)
    uses_servers = contract.backend(backend).uses_servers
    servers = (c.dedicated_servers() or c.workers) if uses_servers else 0
    a = adjust(m, backend, workers=c.workers, servers=servers, paced=c.paced,
               bandwidth_gbps=c.bandwidth_gbps, latency_us=c.latency_us)
    c = c.model_copy(update={"bandwidth_gbps": a["bandwidth_gbps"],
                             "latency_us": a["latency_us"]})
    transport = hardware.Transport("machine", 1.0, a["per_message_us"], 1.0, True,
                                   f"calibrated on {m.host} ({m.measured_at})")
    return c, wl.emulated(a["compute_rate"], a["compute_overhead_s"]), transport, a["sum_gbps"]


def _ring_broadcast(sim: _Sim, n: int) -> Generator[simpy.Event, Any, None]:
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


def _tree(sim: _Sim, n: int, passes: int) -> Generator[simpy.Event, Any, None]:
    rounds = math.ceil(math.log2(sim.workers)) if sim.workers > 1 else 0
    for _ in range(passes * rounds):
        yield sim.env.timeout(sim.latency + n / sim.bandwidth)


COLLECTIVE_OPS = ("allreduce", "broadcast", "all_gather", "reduce_scatter")
"""What :func:`simulate_collective` simulates."""


def simulate_collective(op: str, nbytes: int, *, workers: int | None = None,
                        algorithm: str = "ring", bandwidth_gbps: float,
                        latency_us: float = 5.0, hierarchical: bool = False,
                        **cluster: Any) -> float:
    """Return the seconds one collective takes on an idle network of ``workers`` hosts.

    Args:
        op: ``"allreduce"``, ``"broadcast"``, ``"all_gather"`` or ``"reduce_scatter"``
            (the last two: a ring of ``p - 1`` steps, NCCL's tuner on a named GPU over a
            real transport, as the sharded schemes run them:
            :func:`ddpbench.simulator.sharded.ring_collective_s`).
        nbytes: message size in bytes (> 0); for ``all_gather`` and ``reduce_scatter`` the
            whole buffer (every rank's part), as nccl-tests counts it.
        workers: ranks taking part (or give ``hosts`` and ``gpus_per_host``).
        algorithm: ``"ring"`` (allreduce: reduce-scatter + allgather, 2(p-1) steps;
            broadcast: binomial scatter + ring allgather) or ``"tree"`` (binomial:
            allreduce = reduce + broadcast, each ceil(log2 p) rounds of the whole message).
        bandwidth_gbps: per direction, Gbit/s.
        latency_us: per message, microseconds.
        hierarchical: allreduce only: Horovod's hierarchical allreduce (intra-host
            reduce-scatter, inter-host ring, intra-host all-gather).
        **cluster: other :class:`~ddpbench.contract.Cluster` fields (``hosts``,
            ``gpus_per_host``, ``intra_link``, ``transport``, ``oversubscription``,
            ``rack_size``).

    Raises:
        ValueError: an unknown op or algorithm, or a bad value, naming the field.
    """
    if op not in COLLECTIVE_OPS:
        raise ValueError(f"op: unknown collective {op!r}; available: {list(COLLECTIVE_OPS)}")
    if algorithm not in ("ring", "tree"):
        raise ValueError(f"algorithm: unknown algorithm {algorithm!r}; available: ['ring', 'tree']")
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 1:
        raise ValueError(f"nbytes: expected an integer >= 1, got {nbytes!r}")
    unknown = set(cluster) - _CLUSTER
    if unknown:
        raise TypeError(f"simulate_collective() got unknown keyword(s) {sorted(unknown)}")
    c = _validate(None, None, None, workers=workers, bandwidth_gbps=bandwidth_gbps,
                  latency_us=latency_us, **cluster).cluster
    sim = _Sim(None, c, trace=False)
    if op in ("all_gather", "reduce_scatter"):
        if algorithm != "ring" or hierarchical:
            raise ValueError(f"algorithm: {op} runs as a ring (NCCL's tuner on a named GPU); "
                             "give algorithm='ring' and hierarchical=False")
        from ddpbench.simulator.sharded import ring_collective_s

        return ring_collective_s(sim, op, int(nbytes), 1)
    gen: Generator[simpy.Event, Any, None]
    if algorithm == "tree":
        gen = _tree(sim, int(nbytes), 2 if op == "allreduce" else 1)
    elif op == "allreduce" and hierarchical:
        gen = hierarchical_allreduce(sim, int(nbytes), 1, 0)
    elif op == "allreduce":
        gen = ring_allreduce(sim, int(nbytes), 1, 0)
    else:
        gen = _ring_broadcast(sim, int(nbytes))
    sim.env.process(gen)
    sim.env.run()
    return float(sim.env.now)
