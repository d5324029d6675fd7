"""Communication strategies: one per real backend, with the same names, knobs and defaults.

| strategy | model | when it wins |
| --- | --- | --- |
| ``mpi`` | one ring allreduce per tensor, in gradient order, no fusion | baseline |
| ``horovod`` | Horovod's cycle: every ``cycle_time`` ms the ready tensors fuse into buffers of up to ``fusion_threshold`` bytes, each ring-allreduced | many small tensors |
| ``collective`` | tensors striped round-robin over ``nrings`` rings that share the NICs | latency-bound rings |
| ``kvstore`` | MXNet PS: arrays < ``bigarray_bound`` elements whole to server ``(key*9973) % S``, larger ones split over all servers; push then pull, FIFO | dedicated servers |
| ``p3`` | slices of ``slice_params`` round-robin over servers, merged push-pull, priority ``-layer`` (FIFO with ``priority=False``), at most ``water_mark`` slices in flight per server | big early-forward layers (VGG) |
| ``byteps`` | partitions of ``partition_bytes`` round-robin over servers; with ``credit_bytes`` > 0, priority scheduling with that many bytes in flight, else FIFO | spare server bandwidth |

Allreduce strategies are symmetric: every worker computes the same and every link carries
the same traffic, so only worker 0 is simulated (one event per ring step, not one per link)
and the other workers' byte counts follow from the ring's chunking
(:mod:`ddpbench.rules.ring`, the real rings' own rule).
Parameter-server strategies simulate every worker and server host.
"""

from __future__ import annotations

import abc
import heapq
import math
from collections.abc import Callable, Generator
from typing import Any, ClassVar

import simpy
from pydantic import BaseModel

from ddpbench import contract, hardware
from ddpbench.rules import placement
from ddpbench.rules.buckets import coalesce_buckets
from ddpbench.rules.fusion import (
    fuse_responses,
    fusion_threshold_bytes,
    next_cycle_start,
    padded_bytes,
)
from ddpbench.rules.placement import Part
from ddpbench.rules.ring import bytes_per_rank, chunk_sizes, send_chunk
from ddpbench.simulator.context import SimContext, Span, new_span
from ddpbench.simulator.network import Gate, Link, Message, Network, call_later

__all__ = ["STRATEGIES", "Strategy", "register", "strategy_class"]

_REGISTRY: dict[str, type[Strategy]] = {}

STRATEGIES: dict[str, dict[str, Any]] = {}
"""Backend name -> the knobs a simulation honours and their defaults (from the contract),
for every registered strategy."""


def register(cls: type[Strategy]) -> type[Strategy]:
    """Register a strategy class under ``cls.name`` (a duplicate name is an error)."""
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise TypeError(f"{cls!r} is not a Strategy subclass")
    if cls.name in _REGISTRY:
        raise ValueError(f"strategy {cls.name!r} is already registered")
    _REGISTRY[cls.name] = cls
    STRATEGIES[cls.name] = contract.defaults(cls.name, "sim")
    return cls


def strategy_class(name: str) -> type[Strategy]:
    """Return the strategy registered as ``name``.

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"backend: unknown backend {name!r}; available: {sorted(_REGISTRY)}") from None


class Strategy(abc.ABC):
    """A communication scheme attached to a running simulation.

    The simulation calls :meth:`start` once, then :meth:`grad_ready` each time backward has
    produced the gradients of a layer on a worker; the strategy calls ``sim.unit_done(w,
    layer)`` once per unit of :meth:`units` when that unit's updated parameters are back on
    worker ``w``.
    """

    name: ClassVar[str]
    symmetric: ClassVar[bool] = False
    gates_compute: ClassVar[bool] = False
    """Whether compute asks :meth:`forward_gate`, :meth:`backward_gate` and tells
    :meth:`forward_done` (schemes that gather parameters before compute)."""

    def __init__(self, sim: SimContext, knobs: BaseModel) -> None:
        self.sim, self.knobs = sim, knobs

    @classmethod
    def parse_knobs(cls, knobs: dict[str, Any]) -> BaseModel:
        """Return ``knobs`` checked against the contract (knobs only real runs see refused)."""
        return contract.validate_knobs(cls.name, knobs, side="sim")

    @abc.abstractmethod
    def units(self, layer: int) -> int:
        """Return how many units (tensors, slices, partitions) layer ``layer`` sends."""

    def start(self) -> None:  # noqa: B027 - optional hook; most strategies need none
        """Set up processes before the first iteration."""

    @abc.abstractmethod
    def grad_ready(self, w: int, layer: int) -> None:
        """Worker ``w`` has produced layer ``layer``'s gradients: start sending them."""

    def forward_gate(self, w: int, layer: int, t: int) -> simpy.Event | None:
        """Return what the forward of ``layer`` in iteration ``t`` waits for (None: nothing
        beyond the layer's update), where :attr:`gates_compute`."""
        return None

    def forward_done(self, w: int, layer: int, t: int) -> None:  # noqa: B027 - optional
        """Worker ``w`` has computed ``layer``'s forward of iteration ``t``."""

    def backward_gate(self, w: int, layer: int, t: int) -> simpy.Event | None:
        """Return what the backward of ``layer`` in iteration ``t`` waits for (None:
        nothing), where :attr:`gates_compute`."""
        return None

    def host_stages(self) -> tuple[list[Stages], list[Stages]]:
        """Return, per layer, the stages a host of several GPUs runs to reduce the layer
        before its push and to hand the pulled layer back to its GPUs (empty: none), each
        ``(queue, seconds, gpus_busy)`` (see the simulator's ``_local``); by default
        :func:`link_host_stages`."""
        return link_host_stages(self.sim)


Stages = list[tuple[int, float, bool]]
"""A layer's stages on a host: ``(queue, seconds, gpus_busy)`` each (Strategy.host_stages)."""


def _layer_bytes(sim: SimContext) -> list[float]:
    """Return each layer's gradient bytes."""
    out = [0.0] * len(sim.workload.layers)
    for t in sim.workload.tensors:
        out[t.layer] += t.numel * sim.itemsize
    return out


def link_host_stages(sim: SimContext) -> tuple[list[Stages], list[Stages]]:
    """Return one pass each way over the intra-host link at each GPU's own path per layer,
    ``latency + (g-1)/g x bytes / link``, both on the link's one queue: BytePS reduces
    under each PCIe switch and sums across switches on the CPU, its PCIE_REDUCE stage
    (byteps/common/core_loops.cc); no ring crosses the switches."""
    g = sim.gpus
    stages: list[Stages] = []
    for b in _layer_bytes(sim):
        d = sim.intra_latency + (g - 1) / g * b / sim.local_bandwidth
        stages.append([(0, d, True)] if b else [])
    return stages, stages


def mxnet_host_stages(sim: SimContext, local_reduce: str) -> tuple[list[Stages], list[Stages]]:
    """Return the stages of an MXNet worker with several GPUs (kvstore ``dist_sync``, P3).

    ``local_reduce="cpu"`` (MXNet's ``dist_sync``, src/kvstore/comm.h ``CommCPU``): every
    GPU copies its gradient to pinned host memory, the GPUs under one PCIe switch sharing its
    uplink (``host_share`` of them at ``host_gbps``, the switches at once); then the CPU sums
    the copies, :func:`ddpbench.hardware.mxnet_cpu_sum_bytes` of memory traffic per byte at
    one MXNet CPU thread's rate (the server thread's, :data:`MXNET_SERVER_UPDATE_GBPS` x 5),
    times :data:`~ddpbench.hardware.MXNET_REDUCTION_THREADS` for an array of at least 10^6
    elements; the pulled value is copied back to every GPU the same way down. Up, CPU and
    down are queues of their own. ``"device"`` (``dist_device_sync``, ``CommDevice``): the
    GPUs reduce among themselves over the intra-host link (:func:`link_host_stages`).
    """
    if local_reduce == "device":
        return link_host_stages(sim)
    link = hardware.intra_link(sim.intra_link)
    g = sim.gpus
    share = min(g, link.host_share)
    uplink = link.host_gbps * 1e9 / 8
    thread = (hardware.MXNET_SERVER_UPDATE_GBPS * 1e9 / 8
              * hardware.MXNET_SERVER_BYTES["update"])
    traffic = hardware.mxnet_cpu_sum_bytes(g)
    nlayers = len(sim.workload.layers)
    layer_bytes = _layer_bytes(sim)
    sums = [0.0] * nlayers
    for t in sim.workload.tensors:
        threads = hardware.MXNET_REDUCTION_THREADS if t.numel >= 1_000_000 else 1
        sums[t.layer] += t.numel * sim.itemsize * traffic / (thread * threads)
    up: list[Stages] = []
    down: list[Stages] = []
    for i, b in enumerate(layer_bytes):
        copy = share * b / uplink
        up.append([(1, copy, True), (2, sums[i], False)] if b else [])
        down.append([(3, copy, True)] if b else [])
    return up, down


# ---------------------------------------------------------------- allreduce strategies


def _host_nics(sim: SimContext, procs: int | None = None) -> int:
    """Return the NICs a host's traffic spreads over: all of them for NCCL's collectives
    (its channels go rail-optimised through every NIC, ``nccl_channels`` through each),
    one per process for MPI's ``procs`` processes at once (each its nearest NIC; at most
    the host's), one for any other ring (one connection crosses each host boundary)."""
    if sim.nccl is not None and procs is None:
        return sim.nics
    return max(1, min(procs or 1, sim.nics))


def _host_rate(sim: SimContext, rate: float, procs: int | None = None) -> float:
    """Return what a host's NICs carry at once, bytes/s, each at ``rate``: over
    :func:`_host_nics` of them, and with several NICs at most what the GPUs' own PCIe
    paths take to them (each GPU reaches its NICs through its own x16 path,
    :attr:`ddpbench.hardware.IntraLink.host_gbps`; ``sim.nic_path_bandwidth``). One NIC:
    ``rate`` itself, as before."""
    k = _host_nics(sim, procs)
    if k == 1:
        return rate
    return min(k * rate, sim.nic_path_bandwidth)


def _ring_step(sim: SimContext, chunk_bytes: float) -> tuple[float, float]:
    """Return (fixed, transfer) seconds of one ring step whose biggest chunk is ``chunk_bytes``.

    With one GPU per host every step crosses a NIC: latency plus the transport's
    per-message cost, then the bytes. With several GPUs per host the ring visits a host's
    GPUs one after another, so a step has intra-host edges and (with several hosts) one
    edge per host across its NIC, all at once; the slower kind sets the step. NCCL's
    rings spread a step's bytes over the host's NICs (:func:`_host_nics`).
    """
    nic = sim.latency + sim.per_message
    if sim.gpus == 1:
        return nic, chunk_bytes / _host_rate(sim, min(sim.ring_bandwidth, sim.flow_bandwidth))
    intra = (sim.intra_latency, chunk_bytes / sim.intra_bandwidth)
    if sim.num_hosts == 1:
        return intra
    cross = (nic, chunk_bytes / _host_rate(sim, min(sim.ring_bandwidth, sim.flow_bandwidth)))
    return cross if cross[0] + cross[1] >= intra[0] + intra[1] else intra


def ring_allreduce(sim: SimContext, n: int, itemsize: int, layer: int,
                   uplink: Link | None = None) -> Generator[simpy.Event, Any, None]:
    """Generator: one ring allreduce of ``n`` elements as seen by rank 0 (all ranks alike).

    Each of the 2(p-1) steps costs ``latency + per-message cost + largest_chunk /
    bandwidth`` (see :func:`_ring_step` for several GPUs per host; over tcp the bandwidth
    of a step is at most one connection's, ``sim.flow_bandwidth``): every rank sends one
    chunk to its right neighbour at once, so the step ends when the largest arrives. With
    ``uplink`` (several rings sharing the sender), a step first waits for the uplink and
    holds it for its per-message cost and bytes (the transport's per-message cost occupies
    the sender like bytes do), then the latency passes.

    The GPUs of a point that names its device reduce with NCCL: on a real transport
    (``sim.nccl``, not the ideal one) NCCL's tuner picks the algorithm and protocol
    (:func:`ddpbench.hardware.nccl_allreduce`). On its ring the fixed costs are NCCL's own
    model (the protocol's latency spread evenly over the steps, its share of the bandwidth
    stretching each step's bytes) instead of latency plus per-message cost per step; its
    tree is :func:`nccl_tree_allreduce`.
    """
    p = sim.workers
    if p == 1:
        return
    env = sim.env
    sizes = chunk_sizes(n, p)  # the real rings' chunks; chunk 0 is the largest
    largest = int(sizes[0]) * itemsize
    lat, tx = _ring_step(sim, largest)
    share = 1.0
    if sim.nccl is not None:  # NCCL's latency and protocol replace the per-step costs
        steps = 2 * (p - 1)
        choice = hardware.nccl_allreduce(n * itemsize, p, sim.num_hosts, sim.intra_link,
                                         sim.nccl, steps * tx, sim.nccl_proto,
                                         sim.nccl_release, sim.nccl_algo, sim.nccl_channels,
                                         sim.nccl_fabric)
        if choice.algorithm == "Tree":
            yield from nccl_tree_allreduce(sim, n * itemsize, layer, choice, uplink)
            return
        if choice.algorithm != "Ring":
            yield from nccl_switch_allreduce(sim, n * itemsize, layer, choice, uplink)
            return
        share = choice.share
        lat, tx = choice.latency_s / steps, tx / share
    held = tx
    if uplink is not None and sim.gpus == 1:  # the NIC step: the sender, then the wire
        # Rings share the NIC at its speed; each ring's own connection may be slower.
        nic_tx = largest / _host_rate(sim, sim.ring_bandwidth) / share
        if sim.nccl is not None:
            held, lat = nic_tx, lat + (tx - nic_tx)
        else:
            held, lat = nic_tx + sim.per_message, sim.latency + (tx - nic_tx)
    record = sim.timeline.append if sim.trace_steps else None
    right = (1 % p) // sim.gpus  # the host of rank 0's right neighbour, rank 1
    sim.comm_begin()
    for s in range(2 * (p - 1)):
        chunk = send_chunk(0, s, p)
        nbytes = int(sizes[chunk]) * itemsize
        start = env.now
        if uplink is None:
            yield env.timeout(lat + tx)
        else:
            ev = uplink.acquire(0, sim.net_seq())
            if ev is not None:
                yield ev
            start = env.now
            yield env.timeout(held)
            uplink.release()
            yield env.timeout(lat)
        if record is not None:
            record(sim.span(0, "allreduce", layer, start, env.now, nbytes, right))
    sim.comm_end()
    if sim.gpus == 1:
        sim.add_sent_all(bytes_per_rank(n, p, itemsize))
    elif sim.num_hosts > 1:
        sim.add_sent_hosts(2 * (p - 1) / p * n * itemsize)


MPICH_SHORT_MSG_BYTES = 2048
"""MPICH's ``MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE``: allreduces up to this many bytes go by
recursive doubling (src/mpi/coll/allreduce, the ch4 shared-memory and OFI selections)."""


def mpich_allreduce_steps(p: int, n: int, itemsize: int) -> list[tuple[int, float]]:
    """Return MPICH's ``MPI_Allreduce`` of ``n`` elements over ``p`` ranks as its steps, each
    ``(partner distance, bytes each rank sends)`` (see :func:`mpich_allreduce`)."""
    nbytes = n * itemsize
    pof2 = 1 << (p.bit_length() - 1)
    rem = p - pof2
    rounds = pof2.bit_length() - 1
    steps: list[tuple[int, float]] = [(1, nbytes)] if rem else []
    if nbytes <= MPICH_SHORT_MSG_BYTES or n < pof2:
        steps += [(1 << k, nbytes) for k in range(rounds)]
    else:
        halves = [(1 << k, nbytes / (2 << k)) for k in range(rounds)]
        steps += halves + halves[::-1]
    if rem:
        steps.append((1, nbytes))
    return steps


def mpich_allreduce(sim: SimContext, n: int, itemsize: int,
                    layer: int) -> Generator[simpy.Event, Any, None]:
    """Generator: one ``MPI_Allreduce`` of ``n`` elements as MPICH runs it (all ranks alike).

    MPICH's choice (the ch4 selections of MPIR_Allreduce: ``count * size <=
    MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE`` (2048 bytes) or ``count < pof2`` -> recursive
    doubling, else reduce-scatter then allgather): with ``pof2`` the largest power of two up
    to the ranks and ``rem`` the rest, the first ``2 rem`` ranks fold pairwise into ``pof2``
    (one exchange of the whole message), then recursive doubling exchanges the whole message
    ``log2 pof2`` times, or Rabenseifner's reduce-scatter halves it ``log2 pof2`` times at
    partner distances 1, 2, 4, ... and the allgather doubles it back, then the folded ranks
    get the result (one more exchange). A step whose partner (rank 0's, at that distance)
    lies on the same host crosses the intra-host link; one across hosts pays the network's
    latency and per-message cost, every rank of the host exchanging at once through the NIC
    (each over one connection of its own). Not modelled: MPICH's SMP-aware compositions.
    """
    p = sim.workers
    if p == 1:
        return
    env = sim.env
    steps = mpich_allreduce_steps(p, n, itemsize)
    g = sim.gpus
    nic = sim.latency + sim.per_message
    record = sim.timeline.append if sim.trace_steps else None
    sent = 0.0
    sim.comm_begin()
    for distance, size in steps:
        start = env.now
        if distance < g or sim.num_hosts == 1:
            yield env.timeout(sim.intra_latency + size / sim.intra_bandwidth)
            peer: int | str = 0
        else:
            yield env.timeout(nic + max(g * size / _host_rate(sim, sim.ring_bandwidth, g),
                                        size / sim.flow_bandwidth))
            sent += g * size
            peer = (distance // g) % sim.num_hosts
        if record is not None:
            record(sim.span(0, "allreduce", layer, start, env.now, int(size), peer))
    sim.comm_end()
    if sent:
        sim.add_sent_hosts(sent)


def mpi_call_allreduce_cpu(sim: SimContext, n: int, itemsize: int,
                           layer: int) -> Generator[simpy.Event, Any, None]:
    """Generator: an ``MPI_Allreduce`` of host memory (Horovod's cross-host phase): MPICH's
    algorithm over a real transport, the ring's closed form otherwise."""
    if sim.mpich:
        yield from mpich_allreduce(sim, n, itemsize, layer)
    else:
        yield from ring_allreduce(sim, n, itemsize, layer)


def mpi_call_allreduce(sim: SimContext, n: int, itemsize: int,
                       layer: int) -> Generator[simpy.Event, Any, None]:
    """Generator: an allreduce through the MPI library (``mpi``, Horovod's CPU path): NCCL's
    on a named GPU over a real transport, MPICH's algorithm over a real transport
    (:func:`mpich_allreduce`), the ring of the closed forms on the ideal network and on a
    calibrated machine (whose fitted cost is a call's, spread over its ring steps)."""
    if sim.nccl is None and sim.mpich:
        yield from mpich_allreduce(sim, n, itemsize, layer)
    else:
        yield from ring_allreduce(sim, n, itemsize, layer)


def nccl_tree_allreduce(sim: SimContext, nbytes: int, layer: int, choice: hardware.NcclChoice,
                        uplink: Link | None = None) -> Generator[simpy.Event, Any, None]:
    """Generator: one allreduce of ``nbytes`` on NCCL's double binary trees (all ranks alike).

    As NCCL builds them (src/graph/trees.cc; its tree allreduce, src/device/all_reduce.h):
    a chain through each host's GPUs, and two binary trees over the hosts, each carrying
    half the data, reduced up and broadcast down in one pipeline. A GPU of a chain sends
    the whole message up (the reduction) and the whole message down (the broadcast) at
    once, twice the message through its links at the rate a ring's step takes them (the
    intra-host bus bandwidth); between hosts, on two hosts each NIC sends
    and receives the message once (each host is the other's child in one tree), on more
    the busiest host (inner in one tree: a parent and two children; a leaf in the other)
    sends and receives it twice. Each channel carries one of the trees: on two hosts a
    host's channels cross its NIC over as many connections as a ring's; on more, an inner
    host's channel has its parent and two children, so the tree's bytes spread over twice
    as many connections.
    The slowest of those sets the pipeline's pace, at the tuner's share of it
    (``choice.share``), after the tree's latency (``choice.latency_s``). Bytes counted per
    NIC: the average, 2 (h-1)/h of the message (each tree edge carries half of it both ways).
    """
    env = sim.env
    h, g = sim.num_hosts, sim.gpus
    t_nic = 0.0
    if h > 1:
        nic_bytes, conns = (nbytes, 1) if h == 2 else (2 * nbytes, 2)
        t_nic = nic_bytes / _host_rate(sim, min(sim.ring_bandwidth,
                                               conns * sim.flow_bandwidth)) / choice.share
    t_chain = 2 * nbytes / sim.intra_bandwidth / choice.share if g > 1 else 0.0
    sim.comm_begin()
    start = yield from _nic_then_rest(sim, uplink, t_nic, t_chain, choice.latency_s)
    if sim.trace_steps:
        sim.timeline.append(sim.span(0, "allreduce", layer, start, env.now, nbytes,
                                     1 % h if h > 1 else ""))
    sim.comm_end()
    if h > 1:
        sim.add_sent_hosts(2 * (h - 1) / h * nbytes)


def _nic_then_rest(sim: SimContext, uplink: Link | None, t_nic: float, t_local: float,
                   latency_s: float) -> Generator[simpy.Event, Any, float]:
    """Generator: one NCCL collective's time, its NIC part ``t_nic`` and its intra-host part
    ``t_local`` pipelined (the slower sets the pace) after ``latency_s``; with one GPU per
    host and a shared ``uplink`` the NIC's share holds the uplink first, then the rest
    follows. Return when the collective started (after waiting for the uplink)."""
    env = sim.env
    if uplink is None or sim.gpus != 1 or sim.num_hosts <= 1:
        start = env.now
        yield env.timeout(latency_s + max(t_nic, t_local))
        return start
    ev = uplink.acquire(0, sim.net_seq())
    if ev is not None:
        yield ev
    start = env.now
    yield env.timeout(t_nic)
    uplink.release()
    yield env.timeout(latency_s + max(0.0, t_local - t_nic))
    return start


def nccl_switch_allreduce(sim: SimContext, nbytes: int, layer: int,
                          choice: hardware.NcclChoice,
                          uplink: Link | None = None) -> Generator[simpy.Event, Any, None]:
    """Generator: one allreduce of ``nbytes`` on NCCL's NVLS, NVLSTree or CollNet algorithms.

    As NCCL runs them (src/device/all_reduce.h; ``NCCL_CURRENT_SOURCE``): inside a host,
    NVLS and NVLSTree reduce each GPU's shard in the NVSwitches and multicast it back
    (the host's NVLS bus bandwidth, :attr:`ddpbench.hardware.IntraLink.nvls_gbps`, over
    ``2 (g-1)/g`` of the message), CollNetDirect reduce-scatters to the heads and gathers
    back over the intra-host link (``2 (g-1)/g`` of it), CollNetChain chains through the
    host's GPUs (each GPU sends the message up and the result down: twice all of it, as
    a tree's chain does, :func:`nccl_tree_allreduce`); across hosts each NIC carries its
    head's share
    (:func:`ddpbench.hardware.nccl_link_bytes`): NVLSTree a tree's (on two hosts each NIC
    sends and receives its share once, on more an inner host twice), NVLS and CollNet the
    share sent once to the switch and back reduced. The parts run pipelined: the slower
    sets the pace, after the tuner's latency. Bytes counted per host as the NICs carry
    them.
    """
    env = sim.env
    h, g = sim.num_hosts, sim.gpus
    name = choice.algorithm
    # the busiest host's bytes across its NICs: an inner host of a tree (a parent and two
    # children) twice the message; otherwise the message once
    host_bytes = 2.0 * nbytes if name == "NVLSTree" and h > 2 else float(nbytes)
    rate = _host_rate(sim, min(sim.ring_bandwidth, sim.flow_bandwidth))
    t_nic = host_bytes / rate if h > 1 else 0.0
    if g == 1:
        t_intra = 0.0
    elif name in ("NVLS", "NVLSTree"):
        t_intra = 2 * (g - 1) / g * nbytes / sim.nvls_bandwidth
    elif name == "CollNetDirect":
        t_intra = 2 * (g - 1) / g * nbytes / sim.intra_bandwidth
    else:
        t_intra = 2 * nbytes / sim.intra_bandwidth
    sim.comm_begin()
    start = yield from _nic_then_rest(sim, uplink, t_nic, t_intra, choice.latency_s)
    if sim.trace_steps:
        sim.timeline.append(sim.span(0, "allreduce", layer, start, env.now, nbytes,
                                     1 % h if h > 1 else ""))
    sim.comm_end()
    if h > 1:
        sim.add_sent_hosts(hardware.nccl_link_bytes(name, nbytes, sim.workers, h)[0])


def hierarchical_allreduce(sim: SimContext, n: int, itemsize: int,
                           layer: int) -> Generator[simpy.Event, Any, None]:
    """Generator: Horovod's hierarchical allreduce of ``n`` elements (all ranks alike).

    As NCCLHierarchicalAllreduce does (horovod/common/ops/nccl_operations.cc): a
    reduce-scatter among a host's ``g`` GPUs over the intra-host link (g-1 steps of n/g),
    then each local rank allreduces its shard with the same local rank of every other host
    (``g`` rings of n/g elements over ``h`` hosts at once, sharing the host's NIC: a step
    carries ``g`` chunks of n/(g h); the ``g`` ranks pay their per-message cost ``c`` on
    their own CPU cores, at once), then an all-gather among the host's GPUs. Closed form::

        2 (g-1) (a_i + ceil(n/g) s / b_i) + 2 (h-1) (a + c + max(g ceil(n/(g h)) s / b,
                                                                 ceil(n/(g h)) s / f))

    where ``f`` is one connection's bandwidth (over tcp; unbounded otherwise): each of the
    ``g`` rings has its own.

    With one GPU per host this is the flat ring, step for step. On a named GPU over a real
    transport the intra-host phases are NCCL's (``ncclReduceScatter``, ``ncclAllGather`` on
    one host: :func:`ddpbench.hardware.nccl_ring`); the cross-host phase stays an MPI
    allreduce over the transport (Horovod copies the shard to host memory for
    ``MPI_Allreduce``), ``a + c`` a step: over a real transport as MPICH runs it
    (:func:`mpich_allreduce_steps` over ``h`` ranks, the ``g`` local ranks' allreduces
    sharing the NIC at once), the ring above on the ideal network and a calibrated machine.
    """
    g, h = sim.gpus, sim.num_hosts
    if g == 1:  # no local phases: the MPI allreduce alone
        yield from mpi_call_allreduce_cpu(sim, n, itemsize, layer)
        return
    env = sim.env
    record = sim.timeline.append if sim.trace_steps else None
    shard = -(-n // g) * itemsize
    local = (g - 1) * (sim.intra_latency + shard / sim.intra_bandwidth)
    if sim.nccl is not None:  # ncclReduceScatter and ncclAllGather on one host
        moved = (g - 1) * shard / sim.intra_bandwidth
        _, lat, share = hardware.nccl_ring("reduce_scatter", g * shard, g, 1, sim.intra_link,
                                           sim.nccl, moved, sim.nccl_proto,
                                           sim.nccl_release)
        local = lat + moved / share
    sim.comm_begin()
    start = env.now
    yield env.timeout(local)  # reduce-scatter: g-1 steps, one event
    if record is not None:
        record(sim.span(0, "reduce_scatter", layer, start, env.now, shard * (g - 1)))
    if h > 1 and sim.mpich:  # g MPI_Allreduces of a shard, one per local rank, at once
        nic = sim.latency + sim.per_message
        sent = 0.0
        for _, size in mpich_allreduce_steps(h, -(-n // g), itemsize):
            start = env.now
            yield env.timeout(nic + max(g * size / _host_rate(sim, sim.ring_bandwidth, g),
                                        size / sim.flow_bandwidth))
            sent += g * size
            if record is not None:
                record(sim.span(0, "allreduce", layer, start, env.now, int(g * size), 1 % h))
        sim.add_sent_hosts(sent)
    elif h > 1:
        chunk = -(-n // (g * h)) * itemsize
        step = sim.latency + sim.per_message + max(
            g * chunk / _host_rate(sim, sim.ring_bandwidth, g), chunk / sim.flow_bandwidth)
        for _ in range(2 * (h - 1)):
            start = env.now
            yield env.timeout(step)
            if record is not None:
                record(sim.span(0, "allreduce", layer, start, env.now, g * chunk, 1 % h))
        sim.add_sent_hosts(2 * (h - 1) / h * n * itemsize)
    start = env.now
    yield env.timeout(local)  # all-gather
    if record is not None:
        record(sim.span(0, "all_gather", layer, start, env.now, shard * (g - 1)))
    sim.comm_end()


class _AllreduceBase(Strategy):
    symmetric = True

    def __init__(self, sim: SimContext, knobs: BaseModel) -> None:
        super().__init__(sim, knobs)
        self._tensors = [[t for t in sim.workload.tensors if t.layer == i]
                         for i in range(len(sim.workload.layers))]

    def units(self, layer: int) -> int:
        return len(self._tensors[layer])


class _FifoComm:
    """A communication thread: a FIFO of tensors, each allreduced alone, one at a time
    (through the MPI library with ``mpi``, on the thread's own ring otherwise)."""

    def __init__(self, sim: SimContext, uplink: Link | None = None, mpi: bool = False) -> None:
        self.sim, self.uplink, self.mpi = sim, uplink, mpi
        self.queue: list = []
        self._wake = None
        sim.env.process(self._run())

    def put(self, tensor) -> None:
        self.queue.append(tensor)
        if self._wake is not None:
            self._wake.succeed()
            self._wake = None

    def _run(self):
        sim = self.sim
        i = 0
        while True:
            if i == len(self.queue):
                self._wake = sim.env.event()
                yield self._wake
            t = self.queue[i]
            i += 1
            if self.mpi:
                yield from mpi_call_allreduce(sim, t.numel, sim.itemsize, t.layer)
            else:
                yield from ring_allreduce(sim, t.numel, sim.itemsize, t.layer, self.uplink)
            if isinstance(t, _Bucket):
                for u in t.tensors:
                    sim.unit_done(0, u.layer)
            else:
                sim.unit_done(0, t.layer)


@register
class MpiStrategy(_AllreduceBase):
    """``mpi``: one blocking allreduce per tensor as its gradient becomes ready (no fusion),
    as the MPI library runs it (:func:`mpi_call_allreduce`)."""

    name = "mpi"

    def start(self) -> None:
        self._comm = _FifoComm(self.sim, mpi=True)

    def grad_ready(self, w: int, layer: int) -> None:
        for t in self._tensors[layer]:
            self._comm.put(t)


@register
class HorovodStrategy(_AllreduceBase):
    """``horovod``: Horovod's background loop.

    A cycle starts at most every ``cycle_time`` ms (right away when the previous cycle's
    allreduces took longer); the tensors ready at its start are fused, in readiness order,
    into buffers of at most ``fusion_threshold`` bytes, rounded up to a multiple of
    local_size x 8 x 64 bytes as Horovod's controller does (a larger tensor goes alone; on
    a named GPU over a real transport each tensor takes a multiple of 16 bytes), and the
    buffers are ring-allreduced one after the other (``hierarchical``: with
    :func:`hierarchical_allreduce`). Before its allreduces a cycle spends the coordination
    of the ready tensors (``coordinator``, the rule of Horovod's era: :meth:`_coordination`)
    and one message cost per ready tensor for its response (both free on the ideal
    transport).

    On a named GPU over a real transport the loop does not wait for its allreduces: it
    enqueues them on the GPU's stream, hands their completion to a finalizer thread and goes
    on to its next cycle (horovod/common/operations.cc since v0.13, the ``finalizer_thread``;
    ops/gpu_operations.cc ``FinalizeGPUQueue`` from v0.20), so tensors that become ready
    while a buffer is reduced go out one cycle later in a group of their own; the stream
    runs the buffers one after another.
    """

    name = "horovod"
    knobs: contract.HorovodKnobs

    def start(self) -> None:
        self._queue: list = []
        self._wake = None
        self.plan_log: list[tuple[float, list[str]]] = []  # (cycle start, fused tensor names)
        self._cached: set[str] = set()  # tensors the response cache holds
        # GPU: the allreduces go to the stream, the loop goes on (the finalizer's rule)
        self._stream = _BufferStream(self.sim, self.knobs.hierarchical) \
            if self.sim.nccl is not None else None
        self.sim.env.process(self._run())

    def grad_ready(self, w: int, layer: int) -> None:
        self._queue.extend(self._tensors[layer])
        if self._wake is not None:
            self._wake.succeed()
            self._wake = None

    def _buffers(self, tensors: list) -> list[list]:
        """Fuse one cycle's tensors with Horovod's look-ahead, the rule the real backend
        plans with (:func:`ddpbench.rules.fusion.fuse_responses`); simulated tensors share one
        dtype, so all are compatible and the first that does not fit starts a buffer."""
        itemsize = self.sim.itemsize
        threshold = fusion_threshold_bytes(self.knobs.fusion_threshold, self.sim.gpus)
        if self.sim.nccl is not None:  # GPU tensors start at 16-byte offsets in the buffer
            return fuse_responses(tensors, threshold,
                                  lambda t: padded_bytes(t.numel * itemsize),
                                  lambda t: "allreduce")
        return fuse_responses(tensors, threshold, lambda t: t.numel * itemsize,
                              lambda t: "allreduce")

    def _run(self):
        sim, env = self.sim, self.sim.env
        cycle = self.knobs.cycle_time / 1e3
        hierarchical = self.knobs.hierarchical
        gather, response = self._coordination()
        sleep_after = self.knobs.coordinator == "p2p"
        next_start = 0.0
        while True:
            if not self._queue:
                self._wake = env.event()
                yield self._wake
            if env.now < next_start:
                yield env.timeout(next_start - env.now)
            elif cycle > 0 and env.now > next_start and not sleep_after:
                # Idle cycles kept ticking: start at the first boundary at or after now.
                k = math.ceil((env.now - next_start) / cycle - 1e-9)
                boundary = next_start + k * cycle
                if boundary > env.now:
                    yield env.timeout(boundary - env.now)
            cycle_start = env.now
            ready, self._queue = self._queue, []
            if gather > 0 or sim.negotiation > 0:
                # The coordinator agrees on `ready`, then handles each tensor's response
                # (a cache lookup, a fusion-buffer entry) at the transport's message cost.
                yield env.timeout(gather + self._uncached(ready)
                                  + len(ready) * sim.per_message)
            for buf in self._buffers(ready):
                self.plan_log.append((cycle_start, [t.name for t in buf]))
                if response > 0:  # rank 0 sends this response to every rank first
                    yield env.timeout(response)
                n = self._buffer_elements(buf)
                if self._stream is not None:
                    self._stream.put(buf, n)
                    continue
                if hierarchical:
                    yield from hierarchical_allreduce(sim, n, sim.itemsize, buf[0].layer)
                elif self.knobs.algorithm == "mpi":
                    yield from mpi_call_allreduce(sim, n, sim.itemsize, buf[0].layer)
                else:
                    yield from ring_allreduce(sim, n, sim.itemsize, buf[0].layer)
                for t in buf:
                    sim.unit_done(0, t.layer)
            if sleep_after:  # v0.9-v0.13.3: a fixed sleep after each cycle's work
                next_start = env.now + cycle
            else:
                next_start = next_cycle_start(cycle_start, env.now, cycle)

    def _uncached(self, ready: list) -> float:
        """Return the extra coordination of a cycle whose tensors are not all in the response
        cache yet (``cache`` coordinator): their requests go the ``gather`` way, through
        rank 0 (horovod/common/controller.cc ``ComputeResponseList``: need_communication);
        from the second iteration on every tensor is cached."""
        if self.knobs.coordinator != "cache":
            return 0.0
        new = [t.name for t in ready if t.name not in self._cached]
        if not new:
            return 0.0
        self._cached.update(new)
        return 3 * self.sim.negotiation

    def _buffer_elements(self, buf: list) -> int:
        """Return the elements a fused buffer puts on the wire: its tensors', each padded
        to 16 bytes on a GPU (horovod/common/ops/gpu_operations.cc)."""
        if self.sim.nccl is None:
            return sum(t.numel for t in buf)
        itemsize = self.sim.itemsize
        return -(-sum(padded_bytes(t.numel * itemsize) for t in buf) // itemsize)

    def _coordination(self) -> tuple[float, float]:
        """Return the coordinator's time per cycle and per fused response (seconds).

        ``cache`` (Horovod v0.16.2 on): one bitwise allreduce, ``sim.negotiation`` (a cycle
        that holds a tensor not yet in the response cache, its first iteration's, also takes
        the ``gather`` path: :meth:`_uncached`).
        ``gather`` (v0.13.4-v0.16.1): MPI_Gather and MPI_Gatherv of the requests to rank 0
        and MPI_Bcast of the responses, ceil(log2 p) rounds each. ``p2p`` (v0.9-v0.13.3):
        rank 0 receives each other rank's request list in turn, one message cost each, and
        sends every fused response to each rank in turn before running it. Free where the
        transport has no control plane.
        """
        sim = self.sim
        if sim.negotiation == 0:
            return 0.0, 0.0
        coordinator = self.knobs.coordinator
        if coordinator == "cache":
            return sim.negotiation, 0.0
        if coordinator == "gather":
            return 3 * sim.negotiation, 0.0
        p = sim.workers
        hop = sim.negotiation / math.ceil(math.log2(p)) if p > 1 else 0.0
        serial = hop + (p - 1) * sim.per_message
        return serial, serial


class _BufferStream:
    """A GPU's stream of Horovod's fused buffers: each allreduced in turn, its tensors done
    when it completes (the finalizer thread's part)."""

    def __init__(self, sim: SimContext, hierarchical: bool) -> None:
        self.sim, self.hierarchical = sim, hierarchical
        self.queue: list[tuple[list, int]] = []
        self._wake: simpy.Event | None = None
        sim.env.process(self._run())

    def put(self, buf: list, n: int) -> None:
        self.queue.append((buf, n))
        if self._wake is not None:
            self._wake.succeed()
            self._wake = None

    def _run(self) -> Generator[simpy.Event, Any, None]:
        sim = self.sim
        i = 0
        while True:
            if i == len(self.queue):
                self._wake = sim.env.event()
                yield self._wake
            buf, n = self.queue[i]
            i += 1
            if self.hierarchical:
                yield from hierarchical_allreduce(sim, n, sim.itemsize, buf[0].layer)
            else:
                yield from ring_allreduce(sim, n, sim.itemsize, buf[0].layer)
            for t in buf:
                sim.unit_done(0, t.layer)


@register
class CollectiveStrategy(_AllreduceBase):
    """``collective``: each tensor on its own ring of ``nrings``, assigned once.

    Paddle's transpiler gives the gradients rings round-robin when it builds the program
    (python/paddle/fluid/transpiler/collective.py), so a tensor keeps its ring every
    iteration: the k-th tensor to become ready (in the first iteration) uses ring
    ``k % nrings``. Each ring is its own FIFO communication thread; the rings' steps share
    the NIC, so two rings in flight each get the link half the time. With
    ``fuse_grad_size_mb`` the gradients go in fleet's buckets instead
    (:func:`ddpbench.rules.buckets.coalesce_buckets`), each one allreduce once its last
    gradient is ready, the k-th bucket on ring ``k % nrings``.
    """

    name = "collective"
    knobs: contract.CollectiveKnobs

    def start(self) -> None:
        nrings = self.knobs.nrings
        uplink = Link(self.sim.env) if nrings > 1 else None
        self._rings = [_FifoComm(self.sim, uplink) for _ in range(nrings)]
        self._ring_of: dict[tuple[int, int], int] = {}
        self._bucket_of: dict[int, int] = {}
        if self.knobs.fuse_grad_size_mb > 0:
            # fleet's buckets, in the order backward makes the gradients (the real
            # backend's rule, ddpbench.rules.buckets)
            order = [t for tensors in reversed(self._tensors) for t in tensors]
            self._buckets = coalesce_buckets(order, self.knobs.fuse_grad_size_mb,
                                             nbytes=lambda t: t.numel * self.sim.itemsize,
                                             layer=lambda t: t.layer)
            self._bucket_of = {id(t): b for b, ts in enumerate(self._buckets) for t in ts}
            self._left = [len(ts) for ts in self._buckets]

    def grad_ready(self, w: int, layer: int) -> None:
        if self._bucket_of:
            for t in self._tensors[layer]:
                b = self._bucket_of[id(t)]
                self._left[b] -= 1
                if self._left[b] == 0:  # the bucket's last gradient: one fused allreduce
                    self._left[b] = len(self._buckets[b])
                    self._rings[b % len(self._rings)].put(_Bucket(self._buckets[b]))
            return
        for j, t in enumerate(self._tensors[layer]):
            ring = self._ring_of.setdefault((layer, j), len(self._ring_of) % len(self._rings))
            self._rings[ring].put(t)


class _Bucket:
    """Fused gradients as one allreduce (``numel``, the first's ``layer``) whose tensors
    are all done when it is."""

    __slots__ = ("tensors", "numel", "layer")

    def __init__(self, tensors: list) -> None:
        self.tensors = tensors
        self.numel = sum(t.numel for t in tensors)
        self.layer = tensors[0].layer


# ---------------------------------------------------------------- parameter servers


class _Part:
    __slots__ = ("layer", "numel", "server", "priority", "arrived", "index", "pulls", "summed",
                 "host", "nbytes", "tensor")

    def __init__(self, index: int, layer: int, numel: int, server: int, priority: float,
                 host: int, nbytes: int, tensor: int = 0) -> None:
        self.index, self.layer, self.numel = index, layer, numel
        self.tensor = tensor  # the index of the tensor (the key) it is a part of
        self.server, self.priority = server, priority
        self.host, self.nbytes = host, nbytes  # the server's host; numel * itemsize
        self.arrived: list[int] = []
        self.pulls: set[int] = set()  # pull requests waiting for this round's sum
        self.summed: set[int] = set()  # workers whose sum is ready, no pull request yet


class _BsTask:
    """One of ByteScheduler's push-pull tasks (a partition of a tensor, its own MXNet key):
    its parts on the servers, its size, its priority (smaller first) and its barrier key."""

    __slots__ = ("pid", "parts", "numel", "priority", "barrier")

    def __init__(self, pid: int, parts: list[_Part], numel: int, priority: int,
                 barrier: _Part) -> None:
        self.pid, self.parts, self.numel = pid, parts, numel
        self.priority, self.barrier = priority, barrier


_MX = hardware.MXNET_SERVER_BYTES


class _PSBase(Strategy):
    """Push-pull through summation servers (colocated on worker hosts, or dedicated hosts).

    A worker pushes each part of a ready layer to its server; a part whose server sits on
    the worker's own host costs no network transfer, unless the network carries it over the
    host's loopback (:meth:`Network.loop`: ps-lite's rule over a real transport), where
    it is a message like any other. The server adds each arriving push
    (``bytes / summation throughput``, one push after another) and, when all workers have
    pushed, sends the sum back to every worker in the order the pushes arrived. Backends
    whose servers run the optimizer (``server_update``: MXNet's KVStore and P3) then spend
    ``bytes / update throughput`` on the part before replying.
    """

    server_update: ClassVar[bool] = False

    def __init__(self, sim: SimContext, knobs: BaseModel) -> None:
        super().__init__(sim, knobs)
        nlayers = len(sim.workload.layers)
        self.parts: list[list[_Part]] = [[] for _ in range(nlayers)]
        for part in self.make_parts():
            self.parts[part.layer].append(part)
        self._sum_free = [0.0] * sim.num_servers
        self._gates: dict[Any, Gate] = {}
        if sim.net is None:
            raise RuntimeError(f"strategy {self.name!r} needs the simulated network")
        self.net: Network = sim.net
        # Parts on the worker's own host skip the network (False: they go over the loopback)
        self._local = not sim.net.loopback
        # With FIFO ports a pull's delivery time is known when its port takes it: each
        # worker then counts a layer's pulls (how many are on their way, the latest
        # arrival) and needs one event per layer instead of one per pull.
        self._count_pulls = False
        # Pushes without a gate at the part's own priority (set by a strategy that knows)
        self._plain_push = False
        # Replies straight into the server host's sockets (P3 as ps-lite answers)
        self._direct_replies = False
        self._due_n = [[0] * nlayers for _ in range(sim.workers)]
        self._due_t = [[0.0] * nlayers for _ in range(sim.workers)]
        # MXNet's server thread (kvstore, p3 on a real transport): seconds per byte of
        # memory traffic; every copy, sum, update and pull reply of a server queues on it.
        self._mx = (1.0 / sim.server_thread
                    if self.server_update and sim.server_thread else 0.0)

    def use_fifo_ports(self) -> None:
        """Every message of this strategy is equal on the wire (see
        :meth:`Network.use_fifo_ports`)."""
        self._count_pulls = self.net.use_fifo_ports()

    @abc.abstractmethod
    def make_parts(self) -> list[_Part]:
        """Cut every tensor into parts and place them on servers (the backend's rule,
        :mod:`ddpbench.rules.placement`; docs/fidelity/)."""

    def placed_parts(self, place: Callable[[int, int], list[Part]], *,
                     prioritised: bool, per_tensor: bool = False) -> list[_Part]:
        """Every tensor's parts from ``place(key, numel)`` (the real backend's placement
        rule, :mod:`ddpbench.rules.placement`; the key is the one the original's front end
        declares for the tensor, :func:`~ddpbench.rules.placement.declared_keys`, the
        real backend's key counter); ``prioritised`` gives each part its layer's priority,
        -layer (``per_tensor``: its tensor's, -index in definition order), else 0 (FIFO)."""
        sim = self.sim
        tensors = sim.workload.tensors
        keys = placement.declared_keys(self.name, [t.name for t in tensors])
        parts: list[_Part] = []
        for i, (key, t) in enumerate(zip(keys, tensors)):
            for p in place(key, t.numel):
                if p.count:
                    prio = (-i if per_tensor else -t.layer) if prioritised else 0
                    parts.append(_Part(len(parts), t.layer, p.count, p.server, prio,
                                       sim.server_host(p.server), p.count * sim.itemsize, i))
        return parts

    def units(self, layer: int) -> int:
        return len(self.parts[layer])

    def gate(self, w: int, part: _Part) -> tuple[Gate | None, float]:
        return None, 1.0

    round_trip: str = "merged"
    """How a part comes back: ``"merged"`` (the server answers the push with the sum),
    ``"ack_round"`` (MXNet: the server answers the push once every worker's is in, then
    the worker pulls) or ``"ack_arrival"`` (BytePS: the push is acknowledged on arrival,
    then the worker pulls; the pull is answered once the sum is ready). Acknowledgements
    and pull requests are control messages: ``latency`` each, no bandwidth."""

    def grad_ready(self, w: int, layer: int) -> None:
        if self._plain_push:  # (post's work without a gate, inlined: once per push)
            send, on_push = self.net.senders[w].send, self._on_push
            local = self._local
            for part in self.parts[layer]:
                if local and part.host == w:
                    self._arrive_push(part, w)
                else:
                    send(Message(w, part.host, part.nbytes, part.priority, "push", layer,
                                 on_push, (part, w)))
            return
        for part in self.parts[layer]:
            self.post(w, part)

    def post(self, w: int, part: _Part) -> None:
        """Hand ``part``'s push to the network (a scheduler may hold it back first)."""
        host = part.host
        if host == w and self._local:
            self._arrive_push(part, w)
            return
        # (over the loopback a push has no NIC window to count against)
        gate, cost = (None, 1.0) if host == w else self.gate(w, part)
        self.net.senders[w].send(Message(w, host, part.nbytes, self.push_priority(part),
                                         "push", part.layer, self._on_push, (part, w),
                                         gate, cost))

    def push_priority(self, part: _Part) -> float:
        """Return the priority a push carries on the worker's uplink."""
        return part.priority

    def pushed(self, w: int, part: _Part) -> None:  # noqa: B027 - optional hook
        """The server's answer to worker ``w``'s push of ``part`` has reached it."""

    def _later(self, delay: float, fn: Callable[[Any], None], value: Any) -> None:
        call_later(self.sim.env, delay, fn, value)

    def _on_push(self, msg: Message) -> None:
        part, w = msg.data
        if msg.gate is not None:
            # The server acknowledges each push on arrival (no payload): the window counts
            # pushes on the wire. Counting until the pull instead can deadlock when workers
            # fill their windows with different slices, each waiting for the others'.
            call_later(self.sim.env, self.sim.latency, self._acked, msg)
        if self.round_trip == "ack_arrival":
            # the acknowledgement reaches the worker, whose pull request comes back
            self._later(self.sim.latency, self._push_answered, (part, w))
        self._arrive_push(part, w)

    @staticmethod
    def _acked(msg: Message) -> None:
        assert msg.gate is not None
        msg.gate.release(msg.cost)

    def _arrive_push(self, part: _Part, w: int) -> None:
        sim = self.sim
        env: Any = sim.env
        now = env._now  # (simpy's ``now`` without its property call)
        nbytes = part.nbytes
        arrived = part.arrived
        mx = self._mx
        if mx:  # the round's first push is copied into the merge buffer, later ones added
            cost = nbytes * mx * _MX["add" if arrived else "copy"]
        else:
            cost = nbytes / sim.summation
        server = part.server
        free = self._sum_free[server]
        start = now if now >= free else free
        done = start + cost
        arrived.append(w)
        last = len(arrived) == sim.workers
        if self.server_update and last:
            # MXNet's server runs the optimizer on a key once every push has been summed.
            done += nbytes * mx * _MX["update"] if mx else nbytes / sim.update
        self._sum_free[server] = done
        if cost > 0 and sim.trace_sums:  # (sim.span inlined: once per push)
            hosts = sim.hosts
            sim.timeline.append(new_span(Span, (hosts[part.host], "sum", part.layer, start, done,
                                                nbytes, hosts[w])))
        if last:
            if done > now:
                call_later(env, done - now, self._reply, part)
            else:
                self._reply(part)

    def _reply(self, part: _Part) -> None:
        sim = self.sim
        host = part.host
        order, part.arrived = part.arrived, []
        if self._direct_replies and self._count_pulls and not self._mx:
            # (_send_sum and send_reply inlined: once per pull)
            send, layer, nbytes = self.net.senders[host].send_direct, part.layer, part.nbytes
            on_pull, counted = self._on_pull, self._pull_on_its_way
            local = self._local
            for w in order:
                if local and w == host:
                    self._local_unit(w, layer)
                else:
                    msg = Message(host, w, nbytes, 0, "pull", layer, on_pull, (part, w))
                    msg.arrive_at = counted
                    send(msg)
            return
        local = self._local
        for w in order:
            if local and w == host:
                if self._mx:  # the worker beside the server still pulls a copy
                    self._local_answer(part, w)
                else:
                    self._local_unit(w, part.layer)
            elif self.round_trip == "merged":
                self._send_sum(part, w)
            elif self.round_trip == "ack_arrival":
                if w in part.pulls:
                    part.pulls.discard(w)
                    self._send_sum(part, w)
                else:
                    part.summed.add(w)
            else:  # MXNet: the push's answer reaches the worker, which then pulls
                self._later(sim.latency, self._push_answered, (part, w))

    def _on_thread(self, part: _Part, w: int, then: Callable[[Any], None], value: Any) -> None:
        """Run ``then(value)`` once the server thread of ``part`` has copied it out for a
        pull (MXNet's ``DefaultStorageResponse``), behind whatever that thread has queued."""
        sim = self.sim
        env: Any = sim.env
        now = env._now
        server = part.server
        free = self._sum_free[server]
        start = now if now >= free else free
        done = start + part.nbytes * self._mx * _MX["pull"]
        self._sum_free[server] = done
        if sim.trace_sums:
            hosts = sim.hosts
            sim.timeline.append(new_span(Span, (hosts[part.host], "copy", part.layer, start,
                                                done, part.nbytes, hosts[w])))
        call_later(env, done - now, then, value)

    def _local_answer(self, part: _Part, w: int) -> None:
        """The push of ``part`` by worker ``w``, beside its MXNet server, is answered: the
        worker pulls a copy (:meth:`_on_thread`)."""
        self._on_thread(part, w, self._local_pulled, (w, part.layer))

    def _local_pulled(self, value: tuple[int, int]) -> None:
        w, layer = value
        self._local_unit(w, layer)

    def _local_unit(self, w: int, layer: int) -> None:
        """The sum of a part whose server is on worker ``w``'s host is back without a pull."""
        self.sim.unit_done(w, layer)
        n = self._due_n[w][layer]
        if n and n == self.sim.remaining[w][layer]:  # pulls on their way: all it misses now
            self._pulls_due(w, layer)

    def _push_answered(self, value: tuple[_Part, int]) -> None:
        part, w = value
        self.pushed(w, part)
        self._later(self.sim.latency, self._pull_request, (part, w))

    def _pull_request(self, value: tuple[_Part, int]) -> None:
        part, w = value
        if self.round_trip == "ack_round" or w in part.summed:
            part.summed.discard(w)
            self._send_sum(part, w)
        else:
            part.pulls.add(w)

    def _send_sum(self, part: _Part, w: int) -> None:
        if self._mx:
            self._on_thread(part, w, self._copied, (part, w))
            return
        self._send_copy(part, w)

    def _copied(self, value: tuple[_Part, int]) -> None:
        self._send_copy(*value)

    def _send_copy(self, part: _Part, w: int) -> None:
        msg = Message(part.host, w, part.nbytes, self.reply_priority(part), "pull",
                      part.layer, self._on_pull, (part, w))
        if self._count_pulls:
            msg.arrive_at = self._pull_on_its_way
        self.send_reply(msg)

    def _pull_on_its_way(self, msg: Message, due: float) -> None:
        """A pull for worker ``w`` will arrive at ``due`` (its port has taken it)."""
        w, layer = msg.dst, msg.layer
        due_n = self._due_n[w]
        due_n[layer] += 1
        if due > self._due_t[w][layer]:
            self._due_t[w][layer] = due
        if due_n[layer] == self.sim.remaining[w][layer]:  # all the layer still misses
            self._pulls_due(w, layer)

    def _pulls_due(self, w: int, layer: int) -> None:
        """Every unit of the layer still missing is a pull on its way: schedule one event
        at the latest arrival that counts them all in."""
        env: Any = self.sim.env
        call_later(env, self._due_t[w][layer] - env._now, self._pulls_in,
                   (w, layer, self._due_n[w][layer]))
        self._due_n[w][layer] = 0
        self._due_t[w][layer] = 0.0

    def _pulls_in(self, value: tuple[int, int, int]) -> None:
        w, layer, n = value
        for _ in range(n):
            self.sim.unit_done(w, layer)

    def reply_priority(self, part: _Part) -> float:
        """Return the priority of a server's answer (0: servers answer in FIFO order)."""
        return 0

    def send_reply(self, msg: Message) -> None:
        """Send a server's reply (the summed part) back to its worker."""
        self.net.send(msg)

    def _on_pull(self, msg: Message) -> None:
        part, w = msg.data
        self.sim.unit_done(w, part.layer)


@register
class KvstoreStrategy(_PSBase):
    """``kvstore``: MXNet's parameter server, FIFO push then pull.

    MXNet's round trip: the server answers each push once every worker's push is in, and
    the worker's pull request follows that answer; the server answers it with the sum
    (``merged_push_pull=True``: one merged message, ddpbench's own).

    A worker pulls a key once every part of its push is answered (MXNet's engine orders
    the pull after the whole push).

    ``system="tensorflow"``: TensorFlow's parameter servers instead. Every variable lies
    whole on one server, round-robin in creation order; each worker's gradient is applied to
    it as it arrives (gRPC copies it out of the byte stream, 2 bytes of memory traffic per
    byte, then SGD reads the weight and the gradient and writes the weight, 3 more), one
    after another on that variable and beside the server's other variables (TensorFlow's
    thread pool); the workers read the variable once every gradient is in (the round trip
    above); and every message crosses a gRPC connection that carries at most
    ``grpc_gbps``.
    """

    name = "kvstore"
    knobs: contract.KvstoreKnobs
    server_update = True

    def host_stages(self) -> tuple[list[Stages], list[Stages]]:
        """MXNet's worker (:func:`mxnet_host_stages`, ``local_reduce``); TensorFlow's
        parameter servers keep the link's rule."""
        if self.knobs.system == "tensorflow":
            return link_host_stages(self.sim)
        return mxnet_host_stages(self.sim, self.knobs.local_reduce)

    def start(self) -> None:
        self.round_trip = "merged" if self.knobs.merged_push_pull else "ack_round"
        self._plain_push = True
        self._tf = self.knobs.system == "tensorflow"
        # MXNet's round trip: a key's pull is an engine operation after its whole push
        # (src/kvstore/kvstore_dist.h, "pull always happens after the previous push").
        self._whole_key = self.round_trip == "ack_round" and not self._tf
        ntensors = 1 + max((p.tensor for x in self.parts for p in x), default=-1)
        self._key_parts: list[list[_Part]] = [[] for _ in range(ntensors)]
        for layer_parts in self.parts:
            for p in layer_parts:
                self._key_parts[p.tensor].append(p)
        # Answers each worker waits for per key: every part's, but a part beside a server
        # that only sums comes back without one (the ideal network).
        self._expect = [[sum(1 for p in parts
                             if not (self._local and p.host == w and not self._mx))
                         for parts in self._key_parts] for w in range(self.sim.workers)]
        self._answered = [[0] * ntensors for _ in range(self.sim.workers)]
        if self._bs:
            self._bs_start()
            return
        if self._tf:
            rate = self.sim.server_thread  # the server CPU's memory traffic, 0 = free
            self._tf_cost = (_TF_BYTES / rate) if rate else 0.0
            self._mx = 0.0
            self._var_free = [0.0] * sum(len(x) for x in self.parts)
            if self.sim.workers == 1 and self.sim.server_host(0) == 0:
                # One machine runs TensorFlow in one process: its variables are updated in
                # place, without gRPC (no cluster, no parameter-server task).
                self._local = True
            else:
                self.net.cap_receivers(self.knobs.grpc_gbps * 1e9 / 8)
        self.use_fifo_ports()  # pushes and replies alike carry priority 0

    # -- ByteScheduler over MXNet's kvstore (scheduler="bytescheduler") --------------------
    def _bs_parts(self) -> list[_Part]:
        """Cut every tensor into ByteScheduler's partitions, each its own MXNet key placed by
        MXNet's rule, with the one-element barrier key each partition's push waits for
        (:func:`~ddpbench.rules.placement.bytescheduler_keys`)."""
        sim = self.sim
        s, bound = sim.num_servers, self.knobs.bigarray_bound
        tensors = sim.workload.tensors
        sizes = [placement.bytescheduler_partitions(t.numel, self.knobs.partition_params)
                 for t in tensors]
        keys, barriers = placement.bytescheduler_keys(sizes)
        parts: list[_Part] = []
        self._bs_tasks: list[_BsTask] = []
        self._bs_of_layer: list[list[_BsTask]] = [[] for _ in sim.workload.layers]
        for ti, t in enumerate(tensors):
            for i, (n, key, bkey) in enumerate(zip(sizes[ti], keys[ti], barriers[ti])):
                pid = len(self._bs_tasks)
                mine = []
                for pp in placement.kvstore_parts(key, n, bound, s):
                    if pp.count:
                        part = _Part(len(parts), t.layer, pp.count, pp.server, 0,
                                     sim.server_host(pp.server), pp.count * sim.itemsize, pid)
                        parts.append(part)
                        mine.append(part)
                bserver = placement.kvstore_parts(bkey, 1, bound, s)[0].server
                barrier = _Part(-1, t.layer, 1, bserver, 0, sim.server_host(bserver),
                                sim.itemsize, -1 - pid)
                # ByteTask: a task's priority is its key index x 1000, a partition's + i
                task = _BsTask(pid, mine, n, ti * 1000 + i, barrier)
                self._bs_tasks.append(task)
                self._bs_of_layer[t.layer].append(task)
        return parts

    def _bs_start(self) -> None:
        self._bs_heap: list[tuple[int, int]] = []
        self._bs_credit = float(self.knobs.credit_params)
        self._bs_left = [0] * len(self._bs_tasks)  # rank 0's parts not yet back

    def grad_ready(self, w: int, layer: int) -> None:
        if not self._bs:
            super().grad_ready(w, layer)
            return
        if w != 0:  # the other ranks' tasks are immediate: their barriers go at once
            for task in self._bs_of_layer[layer]:
                self.post(w, task.barrier)
            return
        for task in self._bs_of_layer[layer]:
            heapq.heappush(self._bs_heap, (task.priority, task.pid))
        self._bs_run()

    def _bs_run(self) -> None:
        """Rank 0's ByteCore loop: start the best task while credit is left (bytecore.py
        ``_loop``: a task starts while the credit is positive, whatever its size)."""
        while self._bs_heap and self._bs_credit > 0:
            _, pid = heapq.heappop(self._bs_heap)
            task = self._bs_tasks[pid]
            self._bs_credit -= task.numel
            self._bs_left[pid] = len(task.parts)
            self.post(0, task.barrier)

    def _bs_back(self, part: _Part) -> None:
        """One of rank 0's parts is pushed and pulled: once its task's last one is, the
        task's parameters return to the credit (its end op), at most the limit."""
        pid = part.tensor
        self._bs_left[pid] -= 1
        if self._bs_left[pid] == 0:
            limit = float(self.knobs.credit_params)
            self._bs_credit = min(limit, self._bs_credit + self._bs_tasks[pid].numel)
            self._bs_run()

    def _reply(self, part: _Part) -> None:
        if part.index == -1:  # a barrier key: every worker has pushed it
            order, part.arrived = part.arrived, []
            latency = self.sim.latency
            for w in order:
                if self._local and w == part.host:
                    self._barrier_answered((part, w))
                else:
                    self._later(latency, self._barrier_answered, (part, w))
            return
        beside_rank0 = self._bs and self._local and not self._mx and part.host == 0
        super()._reply(part)
        if beside_rank0:  # rank 0's part beside its server that only sums is back
            self._bs_back(part)

    def _barrier_answered(self, value: tuple[_Part, int]) -> None:
        """Worker ``w``'s barrier push is answered: it pushes the task's partition."""
        barrier, w = value
        for part in self._bs_tasks[-1 - barrier.tensor].parts:
            self.post(w, part)

    def _on_pull(self, msg: Message) -> None:
        super()._on_pull(msg)
        if self._bs and msg.dst == 0:
            self._bs_back(msg.data[0])

    def _local_pulled_part(self, value: tuple[_Part, int]) -> None:
        part, w = value
        self._local_unit(w, part.layer)
        if self._bs and w == 0:
            self._bs_back(part)

    def _key_answered(self, part: _Part, w: int) -> bool:
        """Count ``part``'s answered push for worker ``w``; return whether every part of its
        key is now answered (MXNet pulls a key once its whole push has completed)."""
        n = self._answered[w][part.tensor] + 1
        if n < self._expect[w][part.tensor]:
            self._answered[w][part.tensor] = n
            return False
        self._answered[w][part.tensor] = 0
        return True

    def _push_answered(self, value: tuple[_Part, int]) -> None:
        part, w = value
        if not self._whole_key or (self._expect[w][part.tensor] == 1 and not self._bs):
            super()._push_answered(value)
            return
        self.pushed(w, part)
        if self._key_answered(part, w):
            self._pull_key(part, w)

    def _local_answer(self, part: _Part, w: int) -> None:
        if not self._whole_key or (self._expect[w][part.tensor] == 1 and not self._bs):
            super()._local_answer(part, w)
        elif self._key_answered(part, w):
            self._pull_key(part, w)

    def _pull_key(self, part: _Part, w: int) -> None:
        """Send worker ``w``'s pull requests for every part of ``part``'s key (the one
        beside its own host: a copy from the server thread)."""
        latency = self.sim.latency
        for p in self._key_parts[part.tensor]:
            if not (self._local and p.host == w):
                self._later(latency, self._pull_request, (p, w))
            elif self._mx:
                self._on_thread(p, w, self._local_pulled_part, (p, w))
            # (else: a part beside a server that only sums is back already)

    def make_parts(self) -> list[_Part]:
        s, bound = self.sim.num_servers, self.knobs.bigarray_bound
        self._bs = self.knobs.scheduler == "bytescheduler"
        if self._bs:
            return self._bs_parts()
        if self.knobs.system == "tensorflow":
            return self.placed_parts(lambda key, n: placement.tensorflow_parts(key, n, s),
                                     prioritised=False)
        return self.placed_parts(lambda key, n: placement.kvstore_parts(key, n, bound, s),
                                 prioritised=False)

    def _arrive_push(self, part: _Part, w: int) -> None:
        if not self._tf:
            super()._arrive_push(part, w)
            return
        sim = self.sim
        env: Any = sim.env
        now = env._now
        free = self._var_free[part.index]
        start = now if now >= free else free
        done = start + part.nbytes * self._tf_cost
        self._var_free[part.index] = done
        if done > start and sim.trace_sums:
            hosts = sim.hosts
            sim.timeline.append(new_span(Span, (hosts[part.host], "update", part.layer, start,
                                                done, part.nbytes, hosts[w])))
        part.arrived.append(w)
        if len(part.arrived) == sim.workers:  # the last gradient: the variable is ready
            call_later(env, done - now, self._reply, part)


_TF_BYTES = 2 + 3
"""Bytes of memory traffic per byte of a gradient a TensorFlow parameter server moves: gRPC's
receive copies it out of the byte stream (core/distributed_runtime/tensor_coding.cc,
``TensorResponse::ParseTensorSubmessage``) and SGD's ``ApplyGradientDescent`` reads the
weight and the gradient and writes the weight."""


@register
class P3Strategy(_PSBase):
    """``p3``: priority-based parameter propagation.

    Slices as P3 places them (:func:`~ddpbench.rules.placement.p3_parts`), each a
    merged push-pull with its parameter's priority, -index (P3's trainers). By default the
    worker sends as P3's ps-lite does: one sending thread pops the best slice (ties as
    P3's ``std::priority_queue`` leaves them, ``ties``) into its server's socket, which holds
    ``send_hwm`` slices, and blocks when that socket is full (:meth:`Sender.use_sockets`);
    servers answer in the order the sums complete, without priority, through their own
    sockets (a server is a process of its own, colocated or not: ``server_sockets``). Each
    connection has its own pipe and kernel send buffer (``sndbuf_bytes``), the host's
    processes one uplink. ``water_mark`` > 0 is ddpbench's own variant instead: at most that many
    slices in flight per server, acknowledged on arrival, gated slices skipped, replies
    by priority. ``priority=False`` keeps the slicing and sends every slice FIFO (the
    paper's slicing-only ablation).
    """

    name = "p3"
    knobs: contract.P3Knobs
    server_update = True

    def host_stages(self) -> tuple[list[Stages], list[Stages]]:
        """P3's fork of MXNet's worker (:func:`mxnet_host_stages`, ``local_reduce``)."""
        return mxnet_host_stages(self.sim, self.knobs.local_reduce)

    def make_parts(self) -> list[_Part]:
        s, size = self.sim.num_servers, self.knobs.slice_params
        # P3's front ends push parameter i with priority -i (python/mxnet/gluon/trainer.py,
        # python/mxnet/model.py), every slice of it alike
        return self.placed_parts(lambda key, n: placement.p3_parts(key, n, size, s),
                                 prioritised=self.knobs.priority, per_tensor=True)

    def start(self) -> None:
        k = self.knobs
        if not k.water_mark:
            # ps-lite's processes: each worker's sockets and, a process of its own on its
            # host, each server's (server_sockets='own'), on the host's one uplink
            for w in range(self.sim.workers):
                self.net.senders[w].use_sockets(k.send_hwm, k.queue_ties(), k.sndbuf_bytes)
            if k.server_sockets == "own":
                hosts = sorted({self.sim.server_host(j) for j in range(self.sim.num_servers)})
                for h in hosts:
                    self.net.senders[h].use_server_sockets(k.send_hwm, k.sndbuf_bytes)
        # (without the water mark: gate() is None, replies go straight into the sockets
        # at priority 0)
        self._plain_push = self._direct_replies = not self.knobs.water_mark
        if not self.knobs.water_mark or not self.knobs.priority:
            # (through sockets every message is equal on the wire; FIFO slices all are)
            self.use_fifo_ports()

    def gate(self, w: int, part: _Part) -> tuple[Gate | None, float]:
        if not self.knobs.water_mark:
            return None, 1.0
        key = (w, part.server)
        g = self._gates.get(key)
        if g is None:
            g = self._gates[key] = Gate(self.knobs.water_mark, self.net.senders[w])
        return g, 1.0

    def reply_priority(self, part: _Part) -> float:
        return part.priority if self.knobs.water_mark else 0

    def send_reply(self, msg: Message) -> None:
        if self.knobs.water_mark:
            self.net.send(msg)
        else:  # a ps-lite server answers straight into its socket
            self.net.senders[msg.src].send_direct(msg)


@register
class BytepsStrategy(_PSBase):
    """``byteps``: partitions placed by BytePS's hash, pushed, acknowledged, then pulled.

    ``scheduler="byteps"`` (BytePS's default): partitions go to the network in the order
    they are ready (FIFO). ``"credit"`` is ddpbench's own: ByteScheduler's core loop
    (bytescheduler/common/bytecore.py) on every worker over BytePS's partitions, a priority
    queue (-layer first) that starts the best one while its credit of ``credit_params``
    parameters is positive, never skipping it; a push's parameters return to the credit
    when the server has acknowledged it (BytePS's push response, on arrival). ByteScheduler
    itself runs over MXNet's kvstore (``kvstore`` with ``scheduler="bytescheduler"``).
    ``"window"`` is ddpbench's own too: at most ``credit_bytes`` bytes on the wire,
    released on arrival, priority order with skipping.
    """

    name = "byteps"
    knobs: contract.BytepsKnobs

    def start(self) -> None:
        k = self.knobs
        self.round_trip = "merged" if k.merged_push_pull else "ack_arrival"
        if k.scheduler == "credit":
            self._cores = [_ByteSchedulerCore(self, w, k.credit_params)
                           for w in range(self.sim.workers)]
        if k.scheduler != "window":  # only the window sends by priority on the wire
            self.use_fifo_ports()

    def make_parts(self) -> list[_Part]:
        s, size = self.sim.num_servers, max(1, self.knobs.partition_bytes // self.sim.itemsize)
        return self.placed_parts(lambda key, n: placement.byteps_parts(key, n, size, s),
                                 prioritised=self.knobs.scheduler != "byteps")

    def grad_ready(self, w: int, layer: int) -> None:
        if self.sim.workers == 1 and not self.knobs.force_distributed:
            # One worker machine is not a distributed job: BytePS reduces and broadcasts on
            # the host (and through the CPU across PCIe switches) and never pushes or pulls
            # (byteps/common/global.cc: distributed only with DMLC_NUM_WORKER > 1;
            # operations.cc: PUSH and PULL queued only then).
            for _ in self.parts[layer]:
                self.sim.unit_done(w, layer)
            return
        if self.knobs.scheduler != "credit":
            super().grad_ready(w, layer)
            return
        for part in self.parts[layer]:
            self._cores[w].add(part)

    def push_priority(self, part: _Part) -> float:
        return part.priority if self.knobs.scheduler == "window" else 0

    def reply_priority(self, part: _Part) -> float:
        return part.priority if self.knobs.scheduler == "window" else 0

    def pushed(self, w: int, part: _Part) -> None:
        if self.knobs.scheduler == "credit":
            self._cores[w].finished(part)  # the server acknowledged this worker's push

    def _arrive_push(self, part: _Part, w: int) -> None:
        if self.knobs.scheduler == "credit" and part.host == w and self._local:
            # the colocated server's answer comes back over loopback like any other
            self._later(self.sim.latency, self._pushed_local, (part, w))
        super()._arrive_push(part, w)

    def _pushed_local(self, value: tuple[_Part, int]) -> None:
        part, w = value
        self._cores[w].finished(part)

    def gate(self, w: int, part: _Part) -> tuple[Gate | None, float]:
        if self.knobs.scheduler != "window":
            return None, 1.0
        g = self._gates.get(w)
        if g is None:
            g = self._gates[w] = Gate(self.knobs.credit_bytes, self.net.senders[w])
        return g, float(part.nbytes)


class _ByteSchedulerCore:
    """ByteScheduler's scheduling loop for one worker (bytescheduler/common/bytecore.py).

    Tasks wait in a priority queue; the loop takes the best one when the credit is above
    zero (a task may take it below zero), and otherwise waits for credit without looking
    past that task. A task's size returns to the credit when it finishes.
    """

    def __init__(self, strategy: BytepsStrategy, w: int, credit: float) -> None:
        self.strategy, self.w = strategy, w
        self.credit = self.limit = float(credit)
        self.queue: list[tuple[float, int, _Part]] = []
        self.seq = 0

    def add(self, part: _Part) -> None:
        self.seq += 1
        heapq.heappush(self.queue, (-part.priority, self.seq, part))
        self._run()

    def finished(self, part: _Part) -> None:
        self.credit = min(self.credit + part.numel, self.limit)
        self._run()

    def _run(self) -> None:
        while self.queue and self.credit > 0:
            part = heapq.heappop(self.queue)[2]
            self.credit -= part.numel
            self.strategy.post(self.w, part)

