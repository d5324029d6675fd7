"""Sharded data parallelism in the simulator: DeepSpeed's ZeRO (``zero``) and PyTorch FSDP
(``fsdp``), with the knobs of :class:`ddpbench.contract.ZeroKnobs` and
:class:`ddpbench.contract.FsdpKnobs`.

| scheme | per step (every rank alike) |
| --- | --- |
| ``zero`` stage 0 | gradients allreduced after backward in buckets of 5e8 elements (the engine's ``buffered_allreduce_fallback``) |
| ``zero`` stages 1, 2 | gradients allreduced in buckets of ``reduce_bucket_size`` (overlapping backward with ``overlap_comm``; stage 1 without it after backward, stage 2 without it blocking compute), then the updated parameters all-gathered |
| ``zero`` stage 3 | each layer's parameters all-gathered before its forward and backward (prefetched by ``prefetch_bucket_size``), gradients reduce-scattered in buckets of ``reduce_bucket_size`` |
| ``fsdp`` FULL_SHARD | each unit all-gathered before its forward and (BACKWARD_PRE: prefetched) before its backward, its gradients reduce-scattered |
| ``fsdp`` SHARD_GRAD_OP | as FULL_SHARD, no all-gather in backward |
| ``fsdp`` HYBRID_SHARD | FULL_SHARD within a host, the gradient shards allreduced across hosts |
| ``fsdp`` NO_SHARD | each unit's gradients allreduced (DDP) |

Every rank does the same, so rank 0 alone is simulated (one event per collective, as the
allreduce strategies keep 1024 ranks cheap). The host's CPU runs ahead of its GPU, as
PyTorch's does: a collective enters its communicator's stream when the CPU issues it, in the
CPU's program order, and starts when what it waits for on the GPU is done; the CPU blocks
only where the original synchronises (FSDP's rate limiter, DeepSpeed's fetch events), so it
is a process of its own (:meth:`_GatherStrategy._cpu`). All collectives of one process
group run one after another on that group's stream: ProcessGroupNCCL enqueues each on the
one NCCL stream of its communicator and device (pytorch/pytorch
torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, ``ncclStreams_``); compute goes on
alongside, slowed by the device's overlap slowdown while a collective runs.
"""

from __future__ import annotations

import abc
import collections
from collections.abc import Callable, Generator
from typing import Any, NamedTuple

import simpy
from pydantic import BaseModel

from ddpbench import contract, hardware
from ddpbench.simulator.context import SimContext
from ddpbench.simulator.strategies import Strategy, _ring_step, register, ring_allreduce

__all__ = ["FsdpStrategy", "Unit", "ZeroStrategy", "fsdp_units", "item_bytes",
           "ring_collective_s"]

DS_SOURCE = "microsoft/DeepSpeed@38327e07f6cd39b63418f60cedd1651b0be3e7c3"
"""The DeepSpeed commit whose sources these rules follow (deepspeed/runtime/...)."""

DS_ALLREDUCE_BUCKET = 500_000_000
"""Elements per allreduce of ZeRO stage 0 (no ZeRO): ``MEMORY_OPT_ALLREDUCE_SIZE`` that
``DeepSpeedEngine.allreduce_gradients`` hands ``buffered_allreduce_fallback``
(deepspeed/runtime/engine.py at :data:`DS_SOURCE`)."""

DS_MAX_REUSE_DISTANCE = 1_000_000_000
"""Stage 3 keeps a gathered parameter after use if its next use comes within this many
parameter elements of fetches: ``stage3_max_reuse_distance`` 1e9 (deepspeed/runtime/zero/
config.py, ``max_reuse_distance``; partitioned_param_coordinator.py ``__params_to_release``)."""

DS_MAX_ONGOING_FETCH_EVENTS = 2
"""Stage 3's CPU waits for the oldest fetch event when more than this many are outstanding
(partitioned_param_coordinator.py, ``__max_ongoing_fetch_events = 2``)."""

FSDP_MAX_INFLIGHT_ALL_GATHERS = 2
"""FSDP's rate limiter: before an all-gather the CPU waits for the oldest free event once
this many are queued (torch/distributed/fsdp/_limiter_utils.py, ``_FreeEventQueue``
``_max_num_inflight_all_gathers = 2``; _runtime_utils.py ``_unshard``)."""


def item_bytes(sim: SimContext) -> int:
    """Return the bytes of one gradient or parameter element on the wire (the one accessor
    the sharded strategies use, so a per-precision item size plugs in here)."""
    return sim.itemsize


# ---------------------------------------------------------------- collectives


def ring_collective_s(sim: SimContext, coll: str, n: int, itemsize: int,
                      ranks: int | None = None, hosts: int | None = None) -> float:
    """Return the seconds of one ring ``coll`` (``"reduce_scatter"`` or ``"all_gather"``) of
    a buffer of ``n`` elements in all (the unsharded size) over ``ranks`` GPUs on ``hosts``
    hosts (default: every GPU of the cluster).

    ``ranks - 1`` steps, each moving one chunk of ``ceil(n / ranks)`` elements from every
    rank to the next: a step costs what a ring allreduce's step costs
    (:func:`ddpbench.simulator.strategies._ring_step`: across hosts each NIC carries one
    chunk per step, ``(ranks-1)/ranks`` of the buffer in all), on one host the intra-host
    link's. On a named GPU over a real transport NCCL's tuner prices it instead and picks
    among the algorithms it allows for the collective (ring, NVLS, CollNet Direct, PAT;
    :func:`ddpbench.hardware.nccl_collective`, with the cluster's ``nccl_algo``, network
    latency and NICs), as ProcessGroupNCCL's ``ncclReduceScatter``/``ncclAllGather`` leave
    the choice to NCCL.
    """
    p = sim.workers if ranks is None else ranks
    h = sim.num_hosts if hosts is None else hosts
    if p <= 1:
        return 0.0
    chunk = -(-n // p) * itemsize
    if h == 1:
        lat, tx = sim.intra_latency, chunk / sim.intra_bandwidth
    else:
        lat, tx = _ring_step(sim, chunk)
    steps = p - 1
    if sim.nccl is not None:
        return hardware.nccl_collective(coll, n * itemsize, p, h, sim.intra_link, sim.nccl,
                                        steps * tx, sim.nccl_proto, sim.nccl_release,
                                        sim.nccl_algo, sim.nccl_fabric,
                                        sim.nccl_channels).time_s
    return steps * (lat + tx)


def cross_host_allreduce_s(sim: SimContext, n: int, itemsize: int) -> float:
    """Return the seconds of HYBRID_SHARD's allreduce of the gradient shards across hosts:
    each of a host's ``g`` GPUs allreduces its shard (``ceil(n/g)`` elements) with the same
    local rank of the other ``h`` hosts, ``g`` rings at once sharing the NIC (a step carries
    ``g`` chunks of ``ceil(n/(g h))``), as Horovod's hierarchical phase
    (:func:`ddpbench.simulator.strategies.hierarchical_allreduce`); NCCL's ring model on a
    named GPU over a real transport."""
    g, h = sim.gpus, sim.num_hosts
    if h <= 1:
        return 0.0
    chunk = -(-n // (g * h)) * itemsize
    lat = sim.latency + sim.per_message
    tx = max(g * chunk / sim.ring_bandwidth, chunk / sim.flow_bandwidth)
    steps = 2 * (h - 1)
    if sim.nccl is not None:
        _, nlat, share = hardware.nccl_ring("allreduce", -(-n // g) * itemsize, h, h,
                                            sim.intra_link, sim.nccl, steps * tx,
                                            sim.nccl_proto, sim.nccl_release)
        return nlat + steps * tx / share
    return steps * (lat + tx)


def _timed(sim: SimContext, kind: str, layer: int, seconds: float, nbytes: float,
           nic_bytes: float) -> Generator[simpy.Event, Any, None]:
    """Generator: one collective of ``seconds`` on rank 0's GPU (slowing its compute), its
    span on the timeline and ``nic_bytes`` through every host's NIC each way."""
    env = sim.env
    sim.comm_begin()
    start = env.now
    yield env.timeout(seconds)
    sim.comm_end()
    if sim.trace_steps:
        sim.timeline.append(sim.span(0, kind, layer, start, env.now, int(nbytes)))
    if nic_bytes and sim.num_hosts > 1:
        sim.add_sent_hosts(nic_bytes)


def _ring(sim: SimContext, coll: str, n: int, layer: int) -> Generator[simpy.Event, Any, None]:
    """Generator: a reduce-scatter or all-gather of ``n`` elements over every GPU."""
    s = item_bytes(sim)
    p = sim.workers
    yield from _timed(sim, coll, layer, ring_collective_s(sim, coll, n, s), n * s,
                      (p - 1) / p * n * s)


class _Stream:
    """One communicator's stream: collectives in the order they were issued, each after the
    GPU event it waits for (``ready``); ``done`` succeeds when it ends."""

    def __init__(self, sim: SimContext) -> None:
        self.sim = sim
        self.queue: collections.deque[tuple[simpy.Event | None,
                                            Callable[[], Generator[simpy.Event, Any, None]],
                                            simpy.Event | None]] = collections.deque()
        self._wake: simpy.Event | None = None
        sim.env.process(self._run())

    def put(self, ready: simpy.Event | None,
            run: Callable[[], Generator[simpy.Event, Any, None]],
            done: simpy.Event | None = None) -> None:
        self.queue.append((ready, run, done))
        if self._wake is not None:
            self._wake.succeed()
            self._wake = None

    def _run(self) -> Generator[simpy.Event, Any, None]:
        while True:
            if not self.queue:
                self._wake = self.sim.env.event()
                yield self._wake
            ready, run, done = self.queue.popleft()
            if ready is not None:
                yield ready
            yield from run()
            if done is not None:
                done.succeed()


def _succeed(ev: simpy.Event) -> None:
    ev.succeed()


# ---------------------------------------------------------------- units


class Unit(NamedTuple):
    """A group of consecutive layers gathered and reduced together (an FSDP unit, a
    DeepSpeed submodule): ``layers`` in forward order, ``numel`` its parameter elements,
    ``gathered`` those it all-gathers (stage 3: without the persistent ones)."""

    position: int
    layers: tuple[int, ...]
    numel: int
    gathered: int


def _layer_numel(sim: SimContext) -> list[int]:
    out = [0] * len(sim.workload.layers)
    for t in sim.workload.tensors:
        out[t.layer] += t.numel
    return out


def fsdp_units(layer_numel: list[int], wrap: str, min_num_params: int) -> list[Unit]:
    """Return FSDP's units over layers of ``layer_numel`` parameters each.

    ``wrap="layer"``: one unit per layer with parameters, as ``transformer_auto_wrap_policy``
    wraps each block (torch/distributed/fsdp/wrap.py). ``"size"``: as
    ``size_based_auto_wrap_policy`` over the flat sequence of layers (children of the root):
    consecutive layers join a unit until it holds at least ``min_num_params``; the rest
    (fewer) stays with the root, here one last unit.
    """
    units: list[Unit] = []
    if wrap == "layer":
        for i, n in enumerate(layer_numel):
            if n:
                units.append(Unit(len(units), (i,), n, n))
        return units
    if wrap != "size":
        raise ValueError(f"wrap: unknown policy {wrap!r}; expected 'layer' or 'size'")
    group: list[int] = []
    numel = 0
    for i, n in enumerate(layer_numel):
        if not n:
            continue
        group.append(i)
        numel += n
        if numel >= min_num_params:
            units.append(Unit(len(units), tuple(group), numel, numel))
            group, numel = [], 0
    if group:
        units.append(Unit(len(units), tuple(group), numel, numel))
    return units


# ---------------------------------------------------------------- the gathering schemes


class _GatherStrategy(Strategy):
    """Shared machinery of the schemes that gather parameters before compute (ZeRO-3, FSDP).

    Rank 0's CPU walks each iteration's hooks in program order (:meth:`_cpu`): forward of
    the units 0..K-1, backward of K-1..0; the GPU's compute (the simulation's loop) waits at
    each unit's first forward layer and last backward layer for the all-gather the CPU
    issued for it, and tells the strategy when it finished a unit's forward and backward.
    An all-gather of the forward of iteration t starts after the optimizer step of t-1, which
    follows the last gradient reduction of t-1 on the GPU.
    """

    symmetric = True
    gates_compute = True

    def __init__(self, sim: SimContext, knobs: BaseModel) -> None:
        super().__init__(sim, knobs)
        self.units_: list[Unit] = self.make_units()
        self._first: dict[int, int] = {u.layers[0]: u.position for u in self.units_}
        self._last: dict[int, int] = {u.layers[-1]: u.position for u in self.units_}
        self._unit_of = {i: u.position for u in self.units_ for i in u.layers}
        self._events: dict[tuple, simpy.Event] = {}
        self._issued: set[tuple] = set()
        self._grads = collections.Counter[int]()
        self._left: dict[int, int] = {}

    @abc.abstractmethod
    def make_units(self) -> list[Unit]:
        """Return the units, in forward order."""

    def units(self, layer: int) -> int:
        return 1 if layer in self._unit_of else 0

    def event(self, key: tuple) -> simpy.Event:
        """Return the event named ``key`` (made on first use, by either side)."""
        ev = self._events.get(key)
        if ev is None:
            ev = self._events[key] = self.sim.env.event()
        return ev

    def start(self) -> None:
        self.comm = _Stream(self.sim)
        self.sim.env.process(self._cpu())

    # -- the GPU's side (the simulation's compute loop calls these)
    def forward_gate(self, w: int, layer: int, t: int) -> simpy.Event | None:
        k = self._first.get(layer)
        if k is None or not self.gathers(t, "f", k):
            return None
        return self._gate(t, "f", k)

    def backward_gate(self, w: int, layer: int, t: int) -> simpy.Event | None:
        k = self._last.get(layer)
        if k is None or not self.gathers(t, "b", k):
            return None
        return self._gate(t, "b", k)

    def _gate(self, t: int, phase: str, k: int) -> simpy.Event:
        ev = self.event(("ag", t, phase, k))
        began = self.event(("began", t, phase, k))  # the unit's compute may start
        if ev.callbacks is None:
            began.succeed()
        else:
            ev.callbacks.append(lambda _: _succeed(began))
        return ev

    def forward_done(self, w: int, layer: int, t: int) -> None:
        k = self._last.get(layer)
        if k is not None:
            self.event(("fwd", t, k)).succeed()

    def grad_ready(self, w: int, layer: int) -> None:
        t = self._grads[layer]
        self._grads[layer] = t + 1
        k = self._first.get(layer)
        if k is not None:
            self.event(("bwd", t, k)).succeed()

    # -- the CPU's side
    @abc.abstractmethod
    def gathers(self, t: int, phase: str, k: int) -> bool:
        """Return whether unit ``k`` is all-gathered before its ``phase`` (``"f"``/``"b"``)."""

    def _cpu(self) -> Generator[simpy.Event, Any, None]:
        K = len(self.units_)
        for t in range(self.sim.iterations):
            if t > 0:
                yield self.event(("step", t - 1))
            self._left[t] = K
            for k in range(K):
                yield from self.pre_forward(t, k)
                self.post_forward(t, k)
            for k in range(K - 1, -1, -1):
                yield from self.pre_backward(t, k)
                yield from self.post_backward(t, k)
            self.end_backward(t)

    @abc.abstractmethod
    def pre_forward(self, t: int, k: int) -> Generator[simpy.Event, Any, None]:
        """The CPU's hook before unit ``k``'s forward (may wait)."""

    @abc.abstractmethod
    def post_forward(self, t: int, k: int) -> None:
        """The CPU's hook after unit ``k``'s forward."""

    @abc.abstractmethod
    def pre_backward(self, t: int, k: int) -> Generator[simpy.Event, Any, None]:
        """The CPU's hook before unit ``k``'s backward (may wait)."""

    @abc.abstractmethod
    def post_backward(self, t: int, k: int) -> Generator[simpy.Event, Any, None]:
        """The CPU's hook after unit ``k``'s gradients (issues their reduction)."""

    def end_backward(self, t: int) -> None:  # noqa: B027 - optional hook
        """The CPU's last act of backward in iteration ``t`` (a final bucket)."""

    def issue_gather(self, t: int, phase: str, k: int) -> bool:
        """Put unit ``k``'s all-gather for ``phase`` of iteration ``t`` on the stream (once);
        return whether it was new."""
        key = (t, phase, k)
        if key in self._issued or not self.gathers(t, phase, k):
            return False
        self._issued.add(key)
        unit = self.units_[k]
        ready = self.event(("step", t - 1)) if phase == "f" and t > 0 else None
        self.comm.put(ready, lambda: _ring(self.sim, "all_gather", unit.gathered,
                                           unit.layers[0]),
                      self.event(("ag", t, phase, k)))
        return True

    def finish(self, t: int, k: int) -> None:
        """Unit ``k``'s gradients of iteration ``t`` are reduced: its layers are done; after
        the last unit the optimizer step (no GPU time) ends the iteration."""
        for layer in self.units_[k].layers:
            self.sim.unit_done(0, layer)
        self._left[t] -= 1
        if self._left[t] == 0:
            self.event(("step", t)).succeed()

    def finish_many(self, t: int, ks: list[int]) -> Generator[simpy.Event, Any, None]:
        for k in ks:
            self.finish(t, k)
        yield from ()


@register
class FsdpStrategy(_GatherStrategy):
    """``fsdp``: PyTorch FSDP as torch/distributed/fsdp/_runtime_utils.py runs its hooks.

    Units from ``wrap`` (:func:`fsdp_units`). Pre-forward: the unit's all-gather unless
    prefetched, then with ``forward_prefetch`` the next unit's (``_pre_forward_unshard``);
    post-forward: FULL_SHARD and HYBRID_SHARD free the gathered parameters
    (``_post_forward_reshard``; SHARD_GRAD_OP and NO_SHARD keep them). Pre-backward: a freed
    unit is gathered again, and with BACKWARD_PRE the next unit in backward order is
    prefetched before this unit's gradients are computed (``_pre_backward_hook``);
    post-backward: the unit is freed, with BACKWARD_POST the next unit is prefetched, and its
    gradients are reduce-scattered (``_post_backward_hook``, ``_reduce_grad``): over every
    rank, or for HYBRID_SHARD within the host, then the shard allreduced across hosts on the
    inter-node group's own stream (``_all_reduce_stream``); NO_SHARD allreduces the unit's
    gradients over every rank (:func:`ddpbench.simulator.strategies.ring_allreduce`).
    ``limit_all_gathers``: each free records an event; an all-gather first waits for the
    oldest once :data:`FSDP_MAX_INFLIGHT_ALL_GATHERS` are queued (_limiter_utils.py).
    Not modelled: the root unit's keeping its parameters after forward, the CPU's own time.
    """

    name = "fsdp"
    knobs: contract.FsdpKnobs

    def make_units(self) -> list[Unit]:
        return fsdp_units(_layer_numel(self.sim), self.knobs.wrap, self.knobs.min_num_params)

    def start(self) -> None:
        self._free: collections.deque[simpy.Event] = collections.deque()
        self._inter = _Stream(self.sim) if self.knobs.sharding_strategy == "HYBRID_SHARD" \
            else None
        super().start()

    def gathers(self, t: int, phase: str, k: int) -> bool:
        s = self.knobs.sharding_strategy
        if s == "NO_SHARD" or self.sim.workers == 1:
            return False
        if s == "HYBRID_SHARD" and self.sim.gpus == 1:
            return False  # one GPU per host: nothing to shard within it
        return phase == "f" or s in ("FULL_SHARD", "HYBRID_SHARD")

    def _unshard(self, t: int, phase: str, k: int) -> Generator[simpy.Event, Any, None]:
        if not 0 <= k < len(self.units_) or (t, phase, k) in self._issued \
                or not self.gathers(t, phase, k):
            return
        if self.knobs.limit_all_gathers and len(self._free) >= FSDP_MAX_INFLIGHT_ALL_GATHERS:
            yield self._free.popleft()
        self.issue_gather(t, phase, k)

    def pre_forward(self, t: int, k: int) -> Generator[simpy.Event, Any, None]:
        yield from self._unshard(t, "f", k)
        if self.knobs.forward_prefetch:
            yield from self._unshard(t, "f", k + 1)

    def post_forward(self, t: int, k: int) -> None:
        if self.gathers(t, "b", k) and self.knobs.limit_all_gathers:
            self._free.append(self.event(("fwd", t, k)))

    def pre_backward(self, t: int, k: int) -> Generator[simpy.Event, Any, None]:
        yield from self._unshard(t, "b", k)
        if self.knobs.backward_prefetch == "BACKWARD_PRE":
            yield from self._unshard(t, "b", k - 1)

    def post_backward(self, t: int, k: int) -> Generator[simpy.Event, Any, None]:
        if self.gathers(t, "f", k) and self.knobs.limit_all_gathers:
            self._free.append(self.event(("bwd", t, k)))
        if self.knobs.backward_prefetch == "BACKWARD_POST":
            yield from self._unshard(t, "b", k - 1)
        self._reduce(t, k)

    def _reduce(self, t: int, k: int) -> None:
        sim, unit = self.sim, self.units_[k]
        ready = self.event(("bwd", t, k))
        s = item_bytes(sim)
        strategy = self.knobs.sharding_strategy
        layer = unit.layers[0]
        if strategy == "NO_SHARD" or sim.workers == 1 or (
                strategy == "HYBRID_SHARD" and sim.gpus == 1):
            def run() -> Generator[simpy.Event, Any, None]:
                yield from ring_allreduce(sim, unit.numel, s, layer)
                self.finish(t, k)
            self.comm.put(ready, run)
        elif self._inter is None:
            def run() -> Generator[simpy.Event, Any, None]:
                yield from _ring(sim, "reduce_scatter", unit.numel, layer)
                self.finish(t, k)
            self.comm.put(ready, run)
        else:  # HYBRID_SHARD: within the host, then the shard across hosts
            g = sim.gpus
            shard_done = self.event(("rs", t, k))
            self.comm.put(ready, lambda: _timed(
                sim, "reduce_scatter", layer,
                ring_collective_s(sim, "reduce_scatter", unit.numel, s, g, 1),
                unit.numel * s, 0.0), shard_done)

            def cross() -> Generator[simpy.Event, Any, None]:
                h = sim.num_hosts
                yield from _timed(sim, "allreduce", layer,
                                  cross_host_allreduce_s(sim, unit.numel, s),
                                  unit.numel * s / g, 2 * (h - 1) / h * unit.numel * s)
                self.finish(t, k)
            self._inter.put(shard_done, cross)

    def issue_gather(self, t: int, phase: str, k: int) -> bool:
        if self.knobs.sharding_strategy != "HYBRID_SHARD":
            return super().issue_gather(t, phase, k)
        key = (t, phase, k)
        if key in self._issued or not self.gathers(t, phase, k):
            return False
        self._issued.add(key)
        unit, sim = self.units_[k], self.sim
        s, g = item_bytes(sim), sim.gpus
        ready = self.event(("step", t - 1)) if phase == "f" and t > 0 else None
        self.comm.put(ready, lambda: _timed(
            sim, "all_gather", unit.layers[0],
            ring_collective_s(sim, "all_gather", unit.gathered, s, g, 1),
            unit.gathered * s, 0.0), self.event(("ag", t, phase, k)))
        return True


@register
class ZeroStrategy(_GatherStrategy):
    """``zero``: DeepSpeed's ZeRO as its engine runs it (sources at :data:`DS_SOURCE`).

    Stage 0 (``DeepSpeedEngine.allreduce_gradients``): after backward the gradients are
    allreduced in buckets of :data:`DS_ALLREDUCE_BUCKET` elements.

    Stages 1 and 2 (stage_1_and_2.py): gradients fill buckets of ``reduce_bucket_size``
    elements in the order they become ready (a tensor that would overflow the bucket
    reduces it first, ``reduce_independent_p_g_buckets_and_remove_grads``); each bucket is
    reduced by ``average_tensor``, which with ``reduce_scatter`` (and DeepSpeed's default
    ``use_multi_rank_bucket_allreduce``) allreduces the bucket's slices together and each
    rank keeps its own, and without it allreduces the bucket: an allreduce either way. With
    ``overlap_comm`` the buckets go on the reduction stream while backward runs; without it
    stage 2 reduces on the compute stream (backward waits) and stage 1 reduces after
    backward (``reduce_gradients``). After the step the updated partitions are all-gathered,
    one ``all_gather_into_tensor`` of the flat parameter group (deepspeed/runtime/utils.py
    ``all_gather_dp_groups``: ``allgather_bucket_size`` only splits it where torch lacks
    ``all_gather_into_tensor``).

    Stage 3 (stage3.py, partitioned_param_coordinator.py): a unit per layer; tensors of at
    most ``param_persistence_threshold`` elements are never partitioned (parameter_offload.py
    ``_persistent_parameters``: ``ds_numel <= threshold``). ``fetch_sub_module``
    gathers the layer's parameters unless available or in flight, waits for them (the CPU
    first waits for the oldest fetch event while more than
    :data:`DS_MAX_ONGOING_FETCH_EVENTS` are outstanding), then prefetches the next layers of
    the trace (forward, then backward) while the elements being prefetched stay under
    ``min(max_live_parameters - available, prefetch_bucket_size)``. After use a layer is
    released unless its next use lies within :data:`DS_MAX_REUSE_DISTANCE` elements of
    fetches. Gradients fill ``reduce_bucket_size`` buckets in backward order, each
    reduce-scattered (``__reduce_and_partition_ipg_grads``) on the reduction stream with
    ``overlap_comm`` (DeepSpeed's default at stage 3), else on the compute stream.
    """

    name = "zero"
    knobs: contract.ZeroKnobs

    def make_units(self) -> list[Unit]:
        threshold = self.knobs.param_persistence_threshold
        numel = _layer_numel(self.sim)
        gathered = [0] * len(numel)
        for t in self.sim.workload.tensors:
            if t.numel > threshold:  # ds_numel <= threshold persists
                gathered[t.layer] += t.numel
        layers = [j for j, n in enumerate(numel) if n]
        return [Unit(i, (layer,), numel[layer], gathered[layer])
                for i, layer in enumerate(layers)]

    def start(self) -> None:
        self.comm = _Stream(self.sim)
        self._blocking: simpy.Event | None = None
        self._blocks: dict[tuple[int, int], simpy.Event] = {}
        self._bucket: list[int] = []  # stage 1/2/3: layers in the open bucket
        self._bucket_numel = 0
        self._reduced: list[simpy.Event] = []
        self._seen = 0
        if self.knobs.stage == 3:
            self._stage3_start()
            self.sim.env.process(self._cpu())

    # -- stages 0-2: driven by the GPU's gradients
    def forward_gate(self, w: int, layer: int, t: int) -> simpy.Event | None:
        return super().forward_gate(w, layer, t) if self.knobs.stage == 3 else None

    def backward_gate(self, w: int, layer: int, t: int) -> simpy.Event | None:
        if self.knobs.stage == 3:
            gate = super().backward_gate(w, layer, t)
            k = self._last.get(layer)
            block = None if k is None else self._blocks.pop((t, k), None)
        else:
            gate, block = None, self._blocking
        if block is None or block.processed:
            return gate
        return block if gate is None else self.sim.env.all_of([gate, block])

    def forward_done(self, w: int, layer: int, t: int) -> None:
        if self.knobs.stage == 3:
            super().forward_done(w, layer, t)

    def grad_ready(self, w: int, layer: int) -> None:
        if self.knobs.stage == 3:
            super().grad_ready(w, layer)
            return
        t = self._grads[layer]
        self._grads[layer] = t + 1
        stage, overlap = self.knobs.stage, self.knobs.overlap()
        if stage == 2 or (stage == 1 and overlap):
            self._add_grad(t, self._unit_of[layer], blocking=not overlap)
        self._seen += 1
        if self._seen % len(self.units_) == 0:  # the last gradient of backward
            if stage == 0 or (stage == 1 and not overlap):
                size = DS_ALLREDUCE_BUCKET if stage == 0 else self.knobs.reduce_bucket_size
                for k in range(len(self.units_)):  # in parameter order, after backward
                    self._add_grad(t, k, blocking=False, size=size)
            self._flush(t, blocking=not overlap and stage == 2)
            self._after_step(t)

    def _add_grad(self, t: int, k: int, *, blocking: bool, size: int | None = None) -> None:
        numel = self.units_[k].numel
        limit = self.knobs.reduce_bucket_size if size is None else size
        if self._bucket and self._bucket_numel + numel > limit:
            self._flush(t, blocking)
        self._bucket.append(k)
        self._bucket_numel += numel

    def _flush(self, t: int, blocking: bool, ready: simpy.Event | None = None,
               before: int | None = None) -> None:
        """Reduce the open bucket (stage 3: reduce-scatter; else allreduce). ``blocking``:
        on the compute stream, so compute waits for it (stage 3: the backward of unit
        ``before``, the next the CPU issues; stages 1/2: the next backward layer)."""
        if not self._bucket:
            return
        sim, n = self.sim, self._bucket_numel
        layer = self.units_[self._bucket[-1]].layers[0]
        done = sim.env.event()
        if self.knobs.stage == 3:
            self.comm.put(ready, lambda: _ring(sim, "reduce_scatter", n, layer), done)
        else:
            self.comm.put(ready, lambda: ring_allreduce(sim, n, item_bytes(sim), layer), done)
        self._reduced.append(done)
        if blocking and before is not None:
            self._blocks[t, before] = done
        elif blocking:
            self._blocking = done
        self._bucket, self._bucket_numel = [], 0

    def _after_step(self, t: int) -> None:
        """After the last reduction: the step, then (stages 1, 2) the all-gather of every
        updated parameter; then every layer of iteration ``t`` is done."""
        sim = self.sim
        reduced, self._reduced = self._reduced, []
        ready = sim.env.all_of(reduced) if reduced else None
        ks = list(range(len(self.units_)))
        total = sum(u.numel for u in self.units_)

        def run() -> Generator[simpy.Event, Any, None]:
            if self.knobs.stage in (1, 2) and sim.workers > 1:
                yield from _ring(sim, "all_gather", total, 0)
            for k in ks:
                for layer in self.units_[k].layers:
                    sim.unit_done(0, layer)
        self.comm.put(ready, run)

    # -- stage 3: the coordinator on the CPU
    def _stage3_start(self) -> None:
        K = len(self.units_)
        self._trace = [("f", k) for k in range(K)] + [("b", k) for k in range(K - 1, -1, -1)]
        self._pos = {step: i for i, step in enumerate(self._trace)}
        # before each step of the trace: elements of fetches since the first step
        self._fetched_before = [0]
        for _, k in self._trace:
            self._fetched_before.append(self._fetched_before[-1] + self.units_[k].gathered)
        self._keep = [self._fetched_before[self._pos["b", k]]
                      - self._fetched_before[self._pos["f", k] + 1] < DS_MAX_REUSE_DISTANCE
                      for k in range(K)]
        self._available: set[int] = set()  # units gathered or in flight
        self._n_available = 0
        self._ongoing: collections.deque[simpy.Event] = collections.deque()

    def gathers(self, t: int, phase: str, k: int) -> bool:
        if self.sim.workers == 1 or not self.units_[k].gathered:
            return False
        return phase == "f" or not self._keep[k]

    def _fetch(self, t: int, phase: str, k: int) -> Generator[simpy.Event, Any, None]:
        fetching = self.gathers(t, phase, k) and k not in self._available
        if fetching:
            self._gather(t, phase, k)
        if fetching or (t, phase, k) in self._issued:  # prefetched: its wait records one too
            ongoing = self._ongoing
            while ongoing and ongoing[0].triggered:
                ongoing.popleft()
            if len(ongoing) > DS_MAX_ONGOING_FETCH_EVENTS:
                yield ongoing.popleft()
            ongoing.append(self.event(("began", t, phase, k)))
        self._prefetch(t, self._pos[phase, k])

    def _gather(self, t: int, phase: str, k: int) -> None:
        if self.issue_gather(t, phase, k):
            self._available.add(k)
            self._n_available += self.units_[k].gathered

    def _prefetch(self, t: int, pos: int) -> None:
        budget = min(self.knobs.max_live_parameters - self._n_available,
                     self.knobs.prefetch_bucket_size)
        prefetching = 0
        for phase, k in self._trace[pos + 1:]:
            if prefetching >= budget:
                break
            if k in self._available or not self.gathers(t, phase, k):
                continue
            self._gather(t, phase, k)
            prefetching += self.units_[k].gathered

    def _release(self, k: int) -> None:
        if k in self._available:
            self._available.discard(k)
            self._n_available -= self.units_[k].gathered

    def pre_forward(self, t: int, k: int) -> Generator[simpy.Event, Any, None]:
        yield from self._fetch(t, "f", k)

    def post_forward(self, t: int, k: int) -> None:
        if not self._keep[k]:
            self._release(k)

    def pre_backward(self, t: int, k: int) -> Generator[simpy.Event, Any, None]:
        yield from self._fetch(t, "b", k)

    def post_backward(self, t: int, k: int) -> Generator[simpy.Event, Any, None]:
        self._release(k)
        numel = self.units_[k].numel
        overlap = self.knobs.overlap()
        ready = self.event(("bwd", t, k))
        if self._bucket and self._bucket_numel + numel > self.knobs.reduce_bucket_size:
            self._flush(t, not overlap, ready, before=k - 1)
        self._bucket.append(k)
        self._bucket_numel += numel
        yield from ()

    def end_backward(self, t: int) -> None:
        self._flush(t, not self.knobs.overlap(), self.event(("bwd", t, 0)))
        reduced, self._reduced = self._reduced, []
        ks = list(range(len(self.units_)))

        def run() -> Generator[simpy.Event, Any, None]:
            yield from self.finish_many(t, ks)
        self.comm.put(self.sim.env.all_of(reduced) if reduced else None, run)


# ---------------------------------------------------------------- memory

DEVICE_MEMORY_GB: dict[str, float] = {
    "H100": 80.0,  # NVIDIA H100 Tensor Core GPU datasheet: H100 SXM, 80 GB HBM3
    "A100": 40.0,  # NVIDIA A100 datasheet: the 40 GB HBM2 part (its 1,555 GB/s, as DEVICES)
    "V100": 16.0,  # NVIDIA Tesla V100 datasheet: SXM2 16 GB HBM2 (the DGX-1's)
    "P100": 16.0,  # NVIDIA Tesla P100 datasheet: SXM2 16 GB CoWoS HBM2
    "T4": 16.0,  # NVIDIA T4 datasheet: 16 GB GDDR6
}
"""Device memory, GB (10^9 bytes), of the devices of :data:`ddpbench.hardware.DEVICES`
whose datasheet figure is certain; others are not checked."""

ADAM_BYTES_PER_PARAM = (2, 2, 12)
"""Model-state bytes per parameter in mixed-precision Adam training: fp16 parameters, fp16
gradients, and fp32 parameters, momentum and variance (ZeRO paper, Rajbhandari et al.,
SC'20, section 3.1: 2 + 2 + K with K = 12)."""


def model_state_bytes(params: int, ranks: int, backend: str, knobs: dict[str, Any],
                      gpus_per_host: int = 1) -> float:
    """Return each rank's model-state bytes (parameters, gradients, optimizer states; no
    activations, no gathered working copies) as the ZeRO paper counts them (section 3:
    ``2 + 2 + 12`` bytes per parameter, :data:`ADAM_BYTES_PER_PARAM`): a replica holds all
    ``16 psi``; ZeRO-1 divides the optimizer states by the ``ranks`` (``4 psi + 12 psi /
    N``), ZeRO-2 the gradients too (``2 psi + 14 psi / N``), ZeRO-3 everything (``16 psi /
    N``). FSDP: FULL_SHARD as ZeRO-3, SHARD_GRAD_OP as ZeRO-2, HYBRID_SHARD as ZeRO-3 over
    a host's GPUs, NO_SHARD a replica; every other backend keeps a replica."""
    p, g, k = ADAM_BYTES_PER_PARAM
    psi, n = float(params), max(ranks, 1)
    if backend == "zero":
        stage = knobs.get("stage", 0)
    elif backend == "fsdp":
        strategy = knobs.get("sharding_strategy", "FULL_SHARD")
        stage = {"FULL_SHARD": 3, "HYBRID_SHARD": 3, "SHARD_GRAD_OP": 2}.get(strategy, 0)
        if strategy == "HYBRID_SHARD":
            n = max(min(gpus_per_host, n), 1)
    else:
        stage = 0
    if stage == 0:
        return (p + g + k) * psi
    if stage == 1:
        return (p + g) * psi + k * psi / n
    if stage == 2:
        return p * psi + (g + k) * psi / n
    return (p + g + k) * psi / n


def memory_note(params: int, ranks: int, backend: str, knobs: dict[str, Any],
                device: str | None, gpus_per_host: int = 1) -> str | None:
    """Return a warning when a rank's model states (:func:`model_state_bytes`) exceed the
    device's memory (:data:`DEVICE_MEMORY_GB`), else None (also for an unknown device)."""
    if device is None or device not in DEVICE_MEMORY_GB:
        return None
    need = model_state_bytes(params, ranks, backend, knobs, gpus_per_host)
    have = DEVICE_MEMORY_GB[device] * 1e9
    if need <= have:
        return None
    return (f"{backend}: model states need {need / 1e9:,.1f} GB per GPU, more than the "
            f"{device}'s {have / 1e9:,.0f} GB (ZeRO paper, section 3: 2 + 2 + 12 bytes per "
            f"parameter in mixed-precision Adam, divided by the ranks for what a ZeRO stage "
            f"or FSDP strategy shards): it would not fit")
