"""The ``kvstore`` backend: MXNet's distributed parameter server (``dist_sync``) over MPI.

As MXNet does it (src/kvstore/kvstore_dist.h, src/kvstore/kvstore_dist_server.h;
docs/fidelity/kvstore.md): an array of fewer than ``bigarray_bound`` elements goes whole to
server ``(key * 9973) % S``; a larger one is split into ``S`` parts, part i on server i,
bounded at ``round(n / S * i)`` (C's round, halves away from zero). Push and pull are
separate requests in FIFO order (the caller's priority is ignored): the server answers each push once every worker's push of
the round is in, and only then does the worker send its pull (MXNet's engine orders the
pull after the push on the same buffer). ``merged_push_pull=True`` is ddpbench's own
shortcut, one message each way, which saves that round trip.

``scheduler="bytescheduler"``: ByteScheduler over this kvstore (bytescheduler/mxnet/
kvstore.py, kvstore_task.py, common/bytecore.py; docs/fidelity/kvstore.md): every array is
cut into partitions of at most ``partition_params`` elements, each its own MXNet key
(:func:`~ddpbench.rules.placement.bytescheduler_keys`); rank 0 queues a ready partition by
priority (the caller's, larger first; then the partition's index) and starts the best one
while ``credit_params`` of credit is left, and gets its elements back once the partition's
push and pull are done; the other ranks start theirs at once. Every partition's push first
pushes a one-element barrier key, which the servers answer once every worker has pushed it,
so no worker pushes a partition before rank 0 has started it.

Server-side optimizer: after ``set_optimizer(SGD(...))`` the servers apply each round's
summed gradient to their copy of the weights and ``push_pull`` returns the updated weights.
The servers' weights are initialised by ``broadcast`` (MXNet's ``kv.init``: the root's
value is stored); a push to a key that was never broadcast is an error while an optimizer
is set. Without an optimizer, ``push_pull`` returns the reduction, as the other backends do.

Example:
    >>> kv = ddpbench.create("kvstore")          # ddpbench launch -n 4 --servers 2 -- ...
    >>> kv.broadcast(0, w)                       # init: every worker and server holds w
    >>> kv.set_optimizer(ddpbench.SGD(lr=0.1, momentum=0.9, rescale_grad=1 / kv.num_workers))
    >>> w = kv.push_pull(0, grad, output=w)      # w is now the servers' updated weights
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

import numpy as np

from ddpbench.api import ReduceOp, register
from ddpbench.backends.ps.transport import Gate
from ddpbench.backends.ps.wire import FLAG_ACK_ROUND, FLAG_DATA, PUSH, Msg
from ddpbench.backends.ps.worker import PSStore
from ddpbench.contract import KvstoreKnobs
from ddpbench.rules.placement import (
    Part,
    bytescheduler_keys,
    bytescheduler_partitions,
    kvstore_parts,
)

BARRIER_BASE = 1 << 40
"""Wire keys of ByteScheduler's barrier keys: this plus the barrier's MXNet key (arrays'
keys stay below it)."""


@dataclass
class _Partition:
    """One of ByteScheduler's partitions of an array: its parts' indices, its elements, its
    index in the array, and its barrier key's wire key and server."""

    parts: range
    numel: int
    index: int
    barrier: int
    barrier_server: int

__all__ = ["KVStoreBackend"]


@register("kvstore")
class KVStoreBackend(PSStore):
    """MXNet-style parameter server: hashed small arrays, split big ones, FIFO push then pull.

    Options:
        bigarray_bound: arrays with at least this many elements are split over all servers
            (default 1,000,000).
        scheduler: "none" (default) or "bytescheduler" (ByteScheduler over it).
        partition_params, credit_params: ByteScheduler's partition size and credit.
        servers, bandwidth_gbps, latency_us, trace: see :class:`ddpbench.contract.PSKnobs`.
    """

    Options = KvstoreKnobs
    options: KvstoreKnobs
    capabilities = frozenset({"broadcast", "push_pull", "optimizer"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._bs = self.options.scheduler == "bytescheduler"
        self._bs_next = 0  # MXNet keys initialised so far (ScheduledKVStore's order)
        self._bs_layout: dict[int, tuple[list[_Partition], list[int]]] = {}
        self._bs_collect: dict[tuple[int, int], list[Msg]] = {}
        self._bs_heap: list[tuple[int, int, int, int]] = []
        self._bs_seq = 0
        self._bs_credit = float(self.options.credit_params)
        self._bs_waiting: dict[int, list[Msg]] = {}  # barrier wire key -> partition's pushes
        self._bs_left: dict[tuple[int, int], int] = {}  # rank 0's started partitions

    def merged(self) -> bool:
        return self.options.merged_push_pull

    def split(self, key: int, declared: int, numel: int, itemsize: int) -> list[Part]:
        o = self.options
        if not self._bs:
            return kvstore_parts(key, numel, o.bigarray_bound, self.num_servers)
        if numel == 0:
            return []
        sizes = bytescheduler_partitions(numel, o.partition_params)
        (keys,), (barriers,) = bytescheduler_keys([sizes], start=self._bs_next)
        self._bs_next = max(keys[-1], barriers[-1]) + 1
        parts: list[Part] = []
        layout: list[_Partition] = []
        owner: list[int] = []
        offset = 0
        for i, (n, k, b) in enumerate(zip(sizes, keys, barriers)):
            first = len(parts)
            for pp in kvstore_parts(k, n, o.bigarray_bound, self.num_servers):
                parts.append(Part(offset + pp.offset, pp.count, pp.server))
                owner.append(i)
            server = kvstore_parts(b, 1, o.bigarray_bound, self.num_servers)[0].server
            layout.append(_Partition(range(first, len(parts)), n, i, BARRIER_BASE + b, server))
            offset += n
        self._bs_layout[key] = (layout, owner)
        return parts

    # -- ByteScheduler (engine thread) -----------------------------------------------------
    def schedule(self, priority: int, part: Part, nbytes: int) -> tuple[int, Gate | None, float]:
        return (priority if self._bs else 0), None, 1.0

    def dispatch(self, msg: Msg, part: Part) -> None:
        if not self._bs:
            super().dispatch(msg, part)
            return
        layout, owner = self._bs_layout[msg.key]
        partition = layout[owner[msg.part]]
        task = (msg.key, partition.index)
        batch = self._bs_collect.setdefault(task, [])
        batch.append(msg)
        if len(batch) < len(partition.parts):
            return
        del self._bs_collect[task]
        priority, msg.priority = msg.priority, 0
        for m in batch:
            m.priority = 0  # on the wire a ps-lite push is FIFO
        if self.rank != 0:  # an immediate task: its barrier goes at once
            self._send_barrier(partition, batch)
            return
        # ByteTask: a task's priority is -(the caller's) x 1000, a partition's + its index;
        # the smallest first
        self._bs_seq += 1
        heapq.heappush(self._bs_heap, (-priority * 1000 + partition.index, self._bs_seq,
                                       msg.key, partition.index))
        self._bs_collect[(msg.key, -1 - partition.index)] = batch
        self._bs_run()

    def _bs_run(self) -> None:
        """Rank 0's ByteCore loop: start the best task while the credit is positive."""
        while self._bs_heap and self._bs_credit > 0:
            _, _, key, index = heapq.heappop(self._bs_heap)
            partition = self._bs_layout[key][0][index]
            batch = self._bs_collect.pop((key, -1 - index))
            self._bs_credit -= partition.numel
            self._bs_left[(key, index)] = len(partition.parts)
            self._send_barrier(partition, batch)

    def _send_barrier(self, partition: _Partition, batch: list[Msg]) -> None:
        self._bs_waiting[partition.barrier] = batch
        msg = Msg(PUSH, self._server_rank(partition.barrier_server), partition.barrier, 0,
                  payload=np.zeros(1, np.float32), dtype="float32", op=ReduceOp.SUM.value,
                  flags=FLAG_DATA | FLAG_ACK_ROUND)
        self._transport.send(msg)

    def _on_ack(self, msg: Msg) -> None:
        if msg.key >= BARRIER_BASE:  # every worker has pushed the barrier: push the partition
            for m in self._bs_waiting.pop(msg.key):
                self._transport.send(m)
            return
        super()._on_ack(msg)

    def _on_reply(self, msg: Msg) -> None:
        super()._on_reply(msg)
        if not self._bs or self.rank != 0 or msg.key not in self._bs_layout:
            return
        layout, owner = self._bs_layout[msg.key]
        partition = layout[owner[msg.part]]
        task = (msg.key, partition.index)
        left = self._bs_left.get(task)
        if left is None:  # a broadcast's answer, not a started task's pull
            return
        if left > 1:
            self._bs_left[task] = left - 1
            return
        del self._bs_left[task]
        self._bs_credit = min(float(self.options.credit_params),
                              self._bs_credit + partition.numel)
        self._bs_run()

    def set_optimizer(self, optimizer: Any) -> None:
        """Make the servers run ``optimizer`` (a :class:`ddpbench.SGD`, its dict, or None).

        Collective: every worker must call it with the same optimizer (the servers compare).

        Raises:
            TypeError: not an SGD, a dict of its fields, or None.
            ValueError: a dict with unknown fields or bad values.
        """
        self._send_optimizer(self.optimizer_spec(optimizer))
