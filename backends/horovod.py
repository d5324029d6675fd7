"""The ``horovod`` backend: Horovod's background loop, response cache and tensor fusion.

How a ``push_pull`` travels (``horovod/common/operations.cc``, ``controller.cc``,
``response_cache.cc``):

1. The caller's thread queues the request; the engine thread runs Horovod's cycle, at most
   every ``cycle_time`` ms on every rank (a cycle that starts late does not shift the
   ones after it by more than its own lateness; see :mod:`ddpbench.rules.fusion`). Idle ranks
   cycle too, as in Horovod (``idle="cycle"``); ``idle="wait"``, ddpbench's variant, lets an
   idle rank wait for work (up to 10 ms) and runs a synchronous call's cycles on the
   caller's thread when nothing else of this rank is queued (no engine hand-off).
2. Each cycle every rank sorts its queued requests against its **response cache**: a hit
   (a tensor negotiated before with the same shape, dtype, op, factors and device) sets
   its cache bit; a changed tensor invalidates its bit; a new one is "uncached". One
   bitwise-AND allreduce of the bit vector (plus status bits: uncached work somewhere,
   invalid bits somewhere, every rank closing) gives the hits common to all ranks, so
   every rank knows the same work without asking the coordinator. Invalidated bits are
   erased on every rank by a second (OR) allreduce. A hit not yet common stays queued.
3. When some rank has uncached work, the ranks send their uncached requests to the
   coordinator (rank 0 of the workers), which counts them; a name every rank submitted is
   checked for agreement (a disagreement becomes an error response that raises the same
   message on every rank) and becomes ready. The coordinator lists the common cached
   responses first, then the newly ready ones, and every rank caches the new ones.
4. The cycle's responses are fused with Horovod's look-ahead (:mod:`ddpbench.rules.fusion`) and
   executed in the same order on every rank: pack into the persistent fusion buffer by
   offset with the prescale folded into the copy, reduce, unpack with the postscale folded
   into the copy. A group whose tensors (and outputs) already lie back to back in one
   array, in response order (gradients allocated as views of one flat buffer), is reduced
   where it lies: no copies, the same bits (ddpbench's addition; Horovod always copies).
   ``algorithm="mpi"`` (default) reduces with the MPI library's own
   ``MPI_Allreduce``, as Horovod's CPU path does (``ops/mpi_operations.cc``);
   ``algorithm="ring"`` runs the point-to-point ring (reduce-scatter, allgather) of
   :mod:`ddpbench.rules.ring`, whose chunking :mod:`ddpbench.numerics` and the simulator
   model.

``cache_capacity=0`` turns the cache off: every cycle then goes through the coordinator,
as Horovod does with ``HOROVOD_CACHE_CAPACITY=0``.

CuPy tensors fuse in a GPU buffer, with prescale and postscale done by one kernel that
also copies in and out (:mod:`ddpbench.gpu`; fp16 by Horovod's CUDA rule, half factor and
half multiply, unless ``gpu_half_scaling="float"``), and reduce through NCCL
(``gpu_transport="nccl"``, one rank per GPU) or through the CPU path via pinned host
memory (``"host"``, which also runs several ranks on one GPU). Under NCCL the cycle does not
wait for a group: it enqueues the copies and the collective on the stream, records an event
and hands the group's completion to a finalizer thread (:class:`ddpbench.comm.Finalizer`),
as Horovod's ``FinalizeGPUQueue`` does (``horovod/common/ops/gpu_operations.cc``); with a
timeline it still waits.

:mod:`ddpbench.numerics` reproduces ``algorithm="ring"`` bit for bit (the ring's chunk
order); ``"mpi"`` reduces in the MPI library's own order, which the emulator does not
model (at 3 ranks MPICH's fp16 sums differ from the ring's in the last bit).
Knobs default to Horovod's and read ``HOROVOD_FUSION_THRESHOLD`` (bytes),
``HOROVOD_CYCLE_TIME`` (ms), ``HOROVOD_CACHE_CAPACITY`` and ``HOROVOD_TIMELINE`` when not
given.

``timeline`` (``HOROVOD_TIMELINE``) makes the coordinator write Horovod's timeline
(``horovod/common/timeline.cc`` and its callers): per tensor a ``NEGOTIATE_ALLREDUCE``
span from the coordinator's first sight of a request to the tensor being ready on every
rank, with a zero-length span per rank as its request is counted (``IncrementTensorCount``
in ``controller.cc``; for a cached tensor, from the cycle in which some rank has it queued
to the cycle in which all do, found as Horovod does with a second half of the bit vector,
``CacheCoordinator::sync``), then the operation (``ALLREDUCE``, ``BROADCAST``) holding its
activities: ``INIT_FUSION_BUFFER`` when the buffer grows, ``MEMCPY_IN_FUSION_BUFFER``,
``MPI_ALLREDUCE``, ``MEMCPY_OUT_FUSION_BUFFER`` for a fused group (a single tensor has the
allreduce alone, as ``MPIAllreduce::Execute``), ``MPI_BCAST``; on a GPU
``NCCL_ALLREDUCE``/``NCCL_BCAST`` (``INIT_NCCL`` once), or through pinned memory
``MEMCPY_IN_HOST_BUFFER``, ``MPI_ALLREDUCE``, ``MEMCPY_OUT_HOST_BUFFER``; GPU times are
taken on the host. ddpbench's own paths name their own activities: ``RING_ALLREDUCE``
(``algorithm="ring"``); a group reduced where it lies has no copies.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from typing import Any

import numpy as np

from ddpbench.api import Handle, ReduceOp, register
from ddpbench.backends._common import (
    GATHER_KINDS,
    Activity,
    Meta,
    MismatchError,
    Request,
    RequestStore,
    Timeline,
    mismatch_message,
    mpi_allreduce,
    mpi_module,
    run_gather_scatter,
)
from ddpbench.comm import Finalizer, Protocol
from ddpbench.contract import HorovodKnobs
from ddpbench.rules.fusion import (
    fuse_responses,
    fusion_threshold_bytes,
    padded_bytes,
    padded_offsets,
)
from ddpbench.rules.ring import Scratch, ring_steps
from ddpbench.tensor_ops import adjacent_span, byte_view, reduce_ufunc, scale_, scale_into

TAG_RING = 13


_Options = HorovodKnobs  # knobs, bounds and HOROVOD_* variables: ddpbench.contract


class StallWarning(UserWarning):
    """Some ranks submitted a tensor that others have not, for longer than stall_timeout."""


def _ring_allreduce(comm: Any, buf: np.ndarray, op: ReduceOp,
                    scratch: Scratch | None = None) -> int:
    """Reduce the 1-D ``buf`` in place over ``comm`` with the ring; return the bytes sent.

    Each step of :func:`ddpbench.rules.ring.ring_steps` is one blocking ``Sendrecv``;
    ``scratch`` keeps the receive buffer between calls.
    """
    from mpi4py import MPI

    p, r = comm.size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    sent = 0
    for send, recv in ring_steps(buf, r, p, reduce_ufunc(op), scratch):
        comm.Sendrecv([send, MPI.BYTE], right, TAG_RING, [recv, MPI.BYTE], left, TAG_RING)
        sent += send.nbytes
    return sent


class _ResponseCache:
    """Horovod's response cache: negotiated tensors by name, each at a bit position.

    Every rank makes the same calls in the same order (puts of the cycle's response list,
    gets of the common hits, erases of the agreed invalid bits), so the bit of a tensor is
    the same on every rank. Entries are kept least recently used first; at capacity the
    least recently used entry is evicted and its bit reused; after an erase the bits are
    renumbered in that order (``ResponseCache::update_cache_bits``).
    """

    HIT, INVALID, MISS = "hit", "invalid", "miss"

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.entries: dict[Any, Meta] = {}  # insertion order = least recently used first
        self.bit_of: dict[Any, int] = {}
        self.name_at: list[Any] = []
        self.outdated = False

    def state(self, meta: Meta) -> tuple[str, int]:
        """Return (HIT | INVALID | MISS, bit) of a request against the cache."""
        cached = self.entries.get(meta.name)
        if cached is None:
            return self.MISS, -1
        same = cached is meta or cached == meta
        return (self.HIT if same else self.INVALID), self.bit_of[meta.name]

    def num_bits(self) -> int:
        return len(self.name_at)

    def get(self, bit: int) -> Meta:
        """Return the response at ``bit`` and mark it most recently used."""
        name = self.name_at[bit]
        meta = self.entries.pop(name)
        self.entries[name] = meta
        return meta

    def peek(self, bit: int) -> Meta:
        return self.entries[self.name_at[bit]]

    def put(self, meta: Meta) -> None:
        if self.capacity == 0:
            return
        if meta.name in self.entries:  # a hit: move to most recently used
            self.entries.pop(meta.name)
            self.entries[meta.name] = meta
            return
        if len(self.entries) >= self.capacity:
            evicted = next(iter(self.entries))
            del self.entries[evicted]
            bit = self.bit_of.pop(evicted)
        else:
            bit = len(self.name_at)
            self.name_at.append(None)
        self.entries[meta.name] = meta
        self.bit_of[meta.name] = bit
        self.name_at[bit] = meta.name

    def erase(self, bit: int) -> None:
        name = self.name_at[bit]
        if name is None:
            return
        del self.entries[name]
        del self.bit_of[name]
        self.name_at[bit] = None
        self.outdated = True

    def update_bits(self) -> None:
        if not self.outdated:
            return
        self.name_at = list(self.entries)
        self.bit_of = {name: i for i, name in enumerate(self.name_at)}
        self.outdated = False


# Status bits at the head of the cycle's bit vector. A bit survives the AND only when it
# is set on every rank: "closing" when every rank is closing, the other two when no rank
# has uncached or invalidated work (Horovod's CacheCoordinator::sync).
_ALL_CLOSING, _NO_UNCACHED, _NO_INVALID = 0, 1, 2
_NUM_STATUS_BITS = 3


# idle="wait": the longest a rank without work goes without a cycle, so the coordinator's
# stall checks and a rank waiting for this one in its cycle's allreduce are never held up
# for long; also how often the engine looks again while the caller's thread is cycling
# (each look takes the GIL, which a caller returning from MPI then waits for).
_IDLE_WAIT_S = 1e-2


def _to_words(value: int, nbits: int) -> np.ndarray:
    """The bit set ``value`` as a little-endian vector of 64-bit words covering ``nbits``."""
    return np.frombuffer(value.to_bytes(-(-nbits // 64) * 8, "little"), np.uint64).copy()


def _from_words(words: np.ndarray) -> int:
    return int.from_bytes(words.tobytes(), "little")


def _bits(value: int) -> list[int]:
    """The positions set in ``value``, ascending."""
    out = []
    while value:
        low = value & -value
        out.append(low.bit_length() - 1)
        value ^= low
    return out


def _fusion_key(resp: tuple[str, Any]) -> tuple | None:
    """What two responses must share to fuse (Horovod: type, devices, dtype, factors)."""
    kind, meta = resp
    if kind != "allreduce":
        return None
    return (meta.dtype, meta.op, meta.prescale, meta.postscale, meta.device)


def _fusion_bytes(resp: tuple[str, Any]) -> int:
    """A response's bytes against the threshold: a GPU tensor's rounded up to 16, as a
    CUDA build of Horovod counts them (controller.cc ``FuseResponses``)."""
    if resp[0] != "allreduce":
        return 0
    meta = resp[1]
    return padded_bytes(meta.nbytes) if meta.device == "gpu" else meta.nbytes


class _HorovodProtocol(Protocol):
    """Horovod's cycle on the engine thread: cache, negotiation, fusion, execution."""

    def __init__(self, ctrl: Any, data: Any, options: _Options,
                 local_sizes: list[int] | None = None) -> None:
        self.ctrl, self.data = ctrl, data
        self.rank, self.size = ctrl.rank, ctrl.size
        self.is_coordinator = self.rank == 0
        # Every rank extends its bit vector while a timeline is on; the coordinator writes it
        # (operations.cc: HOROVOD_TIMELINE opens the file on the coordinator only).
        self.timeline_on = options.timeline is not None
        self.timeline: Timeline | None = None
        if self.timeline_on and self.is_coordinator:
            self.timeline = Timeline(str(options.timeline),
                                     {"backend": "horovod", "ranks": self.size})
        self.group_names: list[Any] = []  # the names of the group being executed
        self.act = Activity(self)
        # Horovod rounds the threshold up to local_size x 8 x 64 bytes on a homogeneous
        # cluster (Controller::TensorFusionThresholdBytes)
        local_sizes = local_sizes or [1]
        self.threshold = fusion_threshold_bytes(options.fusion_threshold, local_sizes[0],
                                                homogeneous=len(set(local_sizes)) == 1)
        self.cycle_s = options.cycle_time / 1000.0
        # idle="wait": a rank without work cycles when work arrives, or after this long
        self.idle_s = max(self.cycle_s, _IDLE_WAIT_S) if options.idle == "wait" else None
        self.stall_s = options.stall_timeout
        self.algorithm = options.algorithm
        self.gpu_transport = options.gpu_transport
        self.half_rule = options.gpu_half_scaling
        self.cache = _ResponseCache(options.cache_capacity)
        self.nccl: Any = None  # made by the first GPU group, at the same point on every rank
        # Horovod's finalizer thread (gpu_operations.cc FinalizeGPUQueue): completes NCCL
        # groups while the cycle goes on; made by the first deferred group
        self.finalizer: Finalizer | None = None
        self._defer = False  # set while a deferred group is enqueued
        self.stage: Any = None
        self.gpu_fusion: Any = None
        self.pending: dict[Any, Request] = {}
        self.queue: list[Request] = []  # requests not yet handled by a cycle, in order
        self.fusion = np.empty(0, np.uint8)  # persistent, grown to the largest group seen
        self.scratch = Scratch()
        self.closing = False
        self.closed_handle: Handle | None = None
        self.finished = False
        self.last_start = time.monotonic()
        # idle="wait": a synchronous push_pull on an idle rank runs the cycles itself, on the
        # caller's thread (run_inline); the lock keeps one cycle at a time, and items reach
        # the protocol through the inbox so that the engine never waits for that lock.
        self.lock = threading.Lock()
        self.inbox: collections.deque[Request | Handle] = collections.deque()
        # coordinator state: name -> {rank: meta} of uncached requests, and stall checks
        self.table: dict[Any, dict[int, Meta]] = {}
        self.first_seen: dict[Any, float] = {}
        self.last_stall_check = time.monotonic()
        self.warned: set[Any] = set()
        # statistics, read by benchmarks and tests; the last groups for the planning tests
        self.stats = {"groups": 0, "fused_tensors": 0, "bytes_sent": 0, "cycles": 0,
                      "cache_hits": 0, "negotiated": 0, "zero_copy_groups": 0}
        self.group_log: collections.deque[tuple[int, list[Any]]] = collections.deque(
            maxlen=4096)

    # -- protocol ---------------------------------------------------------------------
    def accept(self, item: Request | Handle) -> None:
        self.inbox.append(item)

    def _take(self, item: Request | Handle) -> None:
        if isinstance(item, Handle):  # close(): this rank is done; leave with the others
            self.closed_handle = item
            self.closing = True
            return
        name = item.meta.name
        if name in self.pending:
            item.handle.set_error(ValueError(
                f"a tensor named {name!r} is already being reduced on rank {self.rank}; "
                f"names must be unique among operations in flight"
            ))
            return
        self.pending[name] = item
        self.queue.append(item)

    def deadline(self) -> float | None:
        # Horovod's loop keeps cycling while the store is open, idle or not (idle="cycle").
        if self.finished:
            return None
        if self.lock.locked():  # the caller's thread is cycling: look again in a while
            return time.monotonic() + _IDLE_WAIT_S
        return self._due()

    def _due(self) -> float:
        """When this rank's next cycle may start."""
        return self.last_start + (self.cycle_s if self.idle_s is None or self._has_work()
                                  else self.idle_s)

    def _has_work(self) -> bool:
        return bool(self.inbox or self.queue or self.pending or self.closing)

    def progress(self) -> bool:
        if not self.lock.acquire(blocking=False):  # the caller's thread is cycling
            return False
        try:
            if self.finished:
                return False
            now = time.monotonic()
            if now < self._due():
                return False
            self._run_cycle(now)
            return True
        finally:
            self.lock.release()

    def run_inline(self, req: Request) -> bool:
        """With idle="wait", run the cycles of ``req`` on this (the caller's) thread when
        this rank has nothing else queued or in flight, as the engine would have run them;
        return whether it did (False: queue it for the engine instead)."""
        if self.idle_s is None or not self.lock.acquire(blocking=False):
            return False
        try:
            if self.finished or self._has_work():
                return False
            self._take(req)
            while not req.handle.done():
                wait = self.last_start + self.cycle_s - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                self._run_cycle(time.monotonic())
            return True
        except BaseException as err:  # as on the engine: fail what is outstanding
            self.fail(err)
            raise
        finally:
            self.lock.release()

    def _run_cycle(self, now: float) -> None:
        while self.inbox:
            self._take(self.inbox.popleft())
        self.last_start = now
        self.stats["cycles"] += 1
        self._cycle()

    def fail(self, error: BaseException) -> None:
        while self.inbox:
            self._take(self.inbox.popleft())
        for req in self.pending.values():
            req.handle.set_error(error)
        self.pending.clear()
        self.queue.clear()
        if self.closed_handle is not None:
            self.closed_handle.set_error(error)

    # -- one cycle (ComputeResponseList, then PerformOperation per response) -------------
    def _cycle(self) -> None:
        if self.is_coordinator and self.last_start - self.last_stall_check > 1.0:
            self._check_stalls(self.last_start)
        messages, self.queue = self.queue, []
        if self.cache.capacity > 0:
            messages, hits, all_closing, anyone_uncached = self._coordinate_cache(messages)
        else:
            hits, all_closing, anyone_uncached = [], False, True
        if anyone_uncached:
            responses, all_closing = self._negotiate(messages, hits)
            for kind, meta in responses:
                if kind == "allreduce":
                    self.cache.put(meta)
        else:
            responses = [("allreduce", self.cache.get(b)) for b in hits]
        self.cache.update_bits()
        self.stats["cache_hits"] += len(hits)
        groups = ([responses] if len(responses) == 1
                  else fuse_responses(responses, self.threshold, _fusion_bytes, _fusion_key))
        for group in groups:
            self._execute(group)
        if self.timeline is not None:
            self.timeline.flush()
        if all_closing and not self.pending:
            self.finished = True
            if self.closed_handle is not None:
                self.closed_handle.set_result(None)
                self.closed_handle = None

    def _coordinate_cache(self, messages: list[Request]) -> tuple[list[Request], list[int],
                                                                    bool, bool]:
        """Agree on cached work with one AND of the bit vector; return the uncached requests,
        the common hits (ascending bit order), whether all close and whether any rank has
        uncached work. Hits not common to all ranks go back on the queue for the next cycle."""
        MPI = mpi_module()
        states = [self.cache.state(req.meta) for req in messages]
        mine = invalid = 0
        uncached = False
        for state, bit in states:
            if state == _ResponseCache.HIT:
                mine |= 1 << bit
            else:
                uncached = True
                if state == _ResponseCache.INVALID:
                    invalid |= 1 << bit
        status = ((self.closing << _ALL_CLOSING) | ((not uncached) << _NO_UNCACHED)
                  | ((not invalid) << _NO_INVALID))
        nbits = _NUM_STATUS_BITS + self.cache.num_bits()
        hits = (mine & ~invalid) << _NUM_STATUS_BITS
        words = _to_words(status | hits, nbits)
        n = words.size
        if self.timeline_on:
            # Horovod's timeline section (CacheCoordinator::sync): all ones, a hit flips its
            # bit, so after the AND a zero marks a tensor that some rank has queued.
            words = np.concatenate([words, _to_words(((1 << 64 * n) - 1) ^ hits, nbits)])
        self.ctrl.Allreduce(MPI.IN_PLACE, words, op=MPI.BAND)
        agreed = _from_words(words[:n] if self.timeline_on else words)
        common = agreed >> _NUM_STATUS_BITS
        gone = 0
        if not agreed >> _NO_INVALID & 1:
            # Some rank saw a tensor change: erase its bit everywhere (a second, OR, vector).
            words = _to_words(invalid, self.cache.num_bits())
            self.ctrl.Allreduce(MPI.IN_PLACE, words, op=MPI.BOR)
            gone = _from_words(words)
            for bit in _bits(gone):
                self.cache.erase(bit)
            common &= ~gone
        if self.timeline is not None:
            some = ~_from_words(words[n:]) >> _NUM_STATUS_BITS & ((1 << self.cache.num_bits()) - 1)
            for bit in _bits(some & ~gone):  # negotiation starts once some rank has it queued
                self.timeline.negotiate_start(self.cache.peek(bit).name, "allreduce")
            for bit in _bits(common):  # and ends when all have
                self.timeline.negotiate_end(self.cache.peek(bit).name)
        uncached_reqs, requeue = [], []
        for req, (state, bit) in zip(messages, states):
            if state != _ResponseCache.HIT or gone >> bit & 1:  # erased now: negotiate
                uncached_reqs.append(req)
            elif not common >> bit & 1:
                requeue.append(req)
        if requeue:
            self.queue[:0] = requeue
        return (uncached_reqs, _bits(common), bool(agreed >> _ALL_CLOSING & 1),
                not agreed >> _NO_UNCACHED & 1)

    def _negotiate(self, messages: list[Request], hits: list[int]
                   ) -> tuple[list[tuple[str, Any]], bool]:
        """Send this rank's uncached requests to the coordinator; return its response list
        (common cached hits first, then newly ready tensors) and whether all ranks close."""
        metas = [r.meta for r in messages]
        gathered = self.ctrl.gather((metas, self.closing), root=0)
        reply = None
        if self.is_coordinator:
            now = time.monotonic()
            ready: list[Any] = []
            tl = self.timeline
            for src, (src_metas, _) in enumerate(gathered):
                for m in src_metas:
                    entry = self.table.setdefault(m.name, {})
                    if not entry:
                        self.first_seen[m.name] = now
                    if tl is not None:  # Controller::IncrementTensorCount
                        tl.negotiate_start(m.name, m.kind)
                        tl.negotiate_rank_ready(m.name, src)
                    entry[src] = m
                    if len(entry) == self.size:
                        ready.append(m.name)
                        if tl is not None:
                            tl.negotiate_end(m.name)
            responses: list[tuple[str, Any]] = [("allreduce", self.cache.peek(b)) for b in hits]
            for name in ready:
                responses.append(self._construct_response(name))
            all_closing = all(closing for _, closing in gathered) and not self.table
            reply = (responses, all_closing)
        responses, all_closing = self.ctrl.bcast(reply, root=0)
        self.stats["negotiated"] += len(responses) - len(hits)
        return responses, all_closing

    def _construct_response(self, name: Any) -> tuple[str, Any]:
        metas = self.table.pop(name)
        self.first_seen.pop(name, None)
        self.warned.discard(name)
        message = mismatch_message([metas[r] for r in range(self.size)])
        if message is not None:
            return ("error", (name, message))
        m = metas[0]
        return (m.kind, m)

    def _check_stalls(self, now: float) -> None:
        self.last_stall_check = now
        for name, since in self.first_seen.items():
            if now - since > self.stall_s and name not in self.warned:
                self.warned.add(name)
                have = sorted(self.table[name])
                missing = [r for r in range(self.size) if r not in self.table[name]]
                import warnings

                warnings.warn(
                    f"horovod: tensor {name!r} was submitted by ranks {have} but not by ranks "
                    f"{missing} for {now - since:.0f} s (stall_timeout {self.stall_s:g} s); "
                    f"those ranks may be stuck or may have skipped this tensor",
                    StallWarning, stacklevel=1,
                )
                sys.stderr.flush()

    # -- every rank ----------------------------------------------------------------------
    def _execute(self, group: list[tuple[str, Any]]) -> None:
        kind = group[0][0]
        tl = self.timeline
        if kind == "error":
            name, message = group[0][1]
            if tl is not None:
                tl.start(name, "error")
                tl.end(name)
            self.pending.pop(name).handle.set_error(MismatchError(message))
            return
        reqs = [self.pending.pop(meta.name) for _, meta in group]
        self.group_names = [r.meta.name for r in reqs]
        self.group_log.append((self.stats["cycles"], self.group_names))
        if tl is not None:  # PerformOperation: Timeline::Start per tensor
            for r in reqs:
                tl.start(r.meta.name, kind, r.meta.nbytes)
        if self._deferred(reqs[0].meta):
            self._execute_deferred(kind, reqs)
            return
        if kind == "broadcast":
            req = reqs[0]
            try:
                if req.meta.device == "gpu":
                    self._reduce_gpu(req.tensor.reshape(-1), None, root=req.meta.root)
                else:
                    with self.act("MPI_BCAST"):
                        self.data.Bcast(byte_view(req.tensor), root=req.meta.root)
            except Exception as err:
                self._end_timeline(reqs, ok=False)
                req.handle.set_error(err)
            else:
                self._end_timeline(reqs, ok=True)
                req.handle.set_result(req.tensor)
            return
        if kind in GATHER_KINDS:  # never fused (_fusion_key): one request per response
            req = reqs[0]
            try:
                with self.act(GATHER_KINDS[kind]):
                    run_gather_scatter(self.data, req)
            except Exception as err:
                self._end_timeline(reqs, ok=False)
                req.handle.set_error(err)
            else:
                self._end_timeline(reqs, ok=True)
                req.handle.set_result(req.output)
            return
        try:
            self._allreduce(reqs)
        except Exception as err:  # e.g. a dtype the reduction cannot handle
            self._end_timeline(reqs, ok=False)
            for req in reqs:
                req.handle.set_error(err)
        else:
            self._end_timeline(reqs, ok=True)
            for req in reqs:
                req.handle.set_result(req.output)

    def _deferred(self, meta: Meta) -> bool:
        """Return True when a group's completion goes to the finalizer thread: NCCL on GPU
        (Horovod's GPU ops return InProgress), without a timeline (ddpbench's timeline is
        written by the engine thread alone, so a timed run waits in the cycle)."""
        return meta.device == "gpu" and self.gpu_transport == "nccl" and self.timeline is None

    def _execute_deferred(self, kind: str, reqs: list[Request]) -> None:
        """Enqueue the group's kernels and NCCL call on the stream, record an event after
        them and hand its completion to the finalizer thread (FinalizeGPUQueue): it waits on
        the event and completes the handles; the cycle goes on at once. The next group's
        copies into the fusion buffer are ordered after this one's on the same stream."""
        self._defer = True
        try:
            if kind == "broadcast":
                self._reduce_gpu(reqs[0].tensor.reshape(-1), None, root=reqs[0].meta.root)
            else:
                self._allreduce(reqs)
            event = self.nccl.record()
        except Exception as err:
            for req in reqs:
                req.handle.set_error(err)
            return
        finally:
            self._defer = False
        if self.finalizer is None:
            self.finalizer = Finalizer("ddpbench-horovod-finalizer")
        results = [r.tensor if kind == "broadcast" else r.output for r in reqs]

        def done(error: BaseException | None) -> None:
            for req, result in zip(reqs, results):
                if error is not None:
                    req.handle.set_error(error)
                else:
                    req.handle.set_result(result)

        self.finalizer.submit(event.synchronize, done)

    def _end_timeline(self, reqs: list[Request], ok: bool) -> None:
        """Timeline::End per tensor (with its dtype and shape when it succeeded), on disk
        before the handles complete."""
        if self.timeline is not None:
            for r in reqs:
                self.timeline.end(r.meta.name, r.meta if ok else None)
            self.timeline.flush()

    def _reduce(self, buf: np.ndarray, op: ReduceOp, source: np.ndarray | None = None) -> None:
        """Allreduce the flat ``buf`` with the chosen algorithm (from ``source`` if given)."""
        if self.algorithm == "mpi":
            with self.act("MPI_ALLREDUCE"):
                mpi_allreduce(self.data, buf, op, source)
            return
        if source is not None:
            buf[...] = source
        with self.act("RING_ALLREDUCE"):
            self.stats["bytes_sent"] += _ring_allreduce(self.data, buf, op, self.scratch)

    def _allreduce(self, reqs: list[Request]) -> None:
        meta = reqs[0].meta
        dtype = reqs[0].tensor.dtype
        op = ReduceOp(meta.op)
        self.stats["groups"] += 1
        self.stats["fused_tensors"] += len(reqs)
        if meta.device == "gpu":
            self._allreduce_gpu(reqs)
            return
        if len(reqs) == 1:  # unfused: no fusion buffer
            src = reqs[0].tensor.reshape(-1)
            out = src if reqs[0].output is reqs[0].tensor else reqs[0].output.reshape(-1)
            self._reduce_run(src, out, meta, op)
            return
        src = adjacent_span([r.tensor for r in reqs])
        out = adjacent_span([r.output for r in reqs]) if src is not None else None
        if src is not None and out is not None:
            # The group already lies back to back, in response order: it is its own fusion
            # buffer (same elements, same order, same bits as packing it).
            self.stats["zero_copy_groups"] += 1
            self._reduce_run(src, out, meta, op)
            return
        total = sum(r.tensor.size for r in reqs)
        if self.fusion.nbytes < total * dtype.itemsize:
            with self.act("INIT_FUSION_BUFFER"):
                self.fusion = np.empty(total * dtype.itemsize, np.uint8)
        buf = self.fusion[: total * dtype.itemsize].view(dtype)
        off = 0
        with self.act("MEMCPY_IN_FUSION_BUFFER"):
            for r in reqs:  # copy in by offset, prescale folded into the copy
                scale_into(r.tensor.reshape(-1), meta.prescale, buf[off:off + r.tensor.size])
                off += r.tensor.size
        self._reduce(buf, op)
        off = 0
        with self.act("MEMCPY_OUT_FUSION_BUFFER"):
            for r in reqs:  # copy out, postscale folded into the copy
                scale_into(buf[off:off + r.tensor.size], meta.postscale, r.output.reshape(-1))
                off += r.tensor.size

    def _reduce_run(self, src: np.ndarray, out: np.ndarray, meta: Meta, op: ReduceOp) -> None:
        """Reduce one flat run (a tensor, or a group lying back to back) into ``out``: in
        place when ``out`` is ``src``, out of place when the input may stay untouched,
        scaled out of place otherwise (as MPIAllreduce::Execute does)."""
        shares = src is out or np.may_share_memory(src, out)
        if shares and (src is out or src.__array_interface__["data"][0]
                       == out.__array_interface__["data"][0]):
            scale_(out, meta.prescale)
            self._reduce(out, op)
        elif meta.prescale == 1.0 and not shares:
            self._reduce(out, op, source=src)
        else:
            scale_into(src, meta.prescale, out)
            self._reduce(out, op)
        scale_(out, meta.postscale)

    def _allreduce_gpu(self, reqs: list[Request]) -> None:
        """Fused GPU allreduce: prescale in the copy in, postscale in the copy out."""
        from ddpbench import gpu

        meta, dtype = reqs[0].meta, reqs[0].tensor.dtype
        if len(reqs) == 1:
            req = reqs[0]
            gpu.scale_copy(req.tensor, req.output, meta.prescale, self.half_rule)
            self._reduce_gpu(req.output.reshape(-1), ReduceOp(meta.op))
            gpu.scale_(req.output, meta.postscale, self.half_rule)
            return
        # Every tensor at a 16-byte offset; the allreduce covers the pads too (Horovod's
        # batched device copies, gpu_operations.cc MemcpyInFusionBuffer)
        offsets, total = padded_offsets([r.tensor.size * dtype.itemsize for r in reqs])
        if self.gpu_fusion is None or self.gpu_fusion.nbytes < total:
            with self.act("INIT_FUSION_BUFFER"):
                self.gpu_fusion = gpu.cupy_or_raise().empty(total, dtype="uint8")
        buf = self.gpu_fusion[:total].view(dtype)
        starts = [off // dtype.itemsize for off in offsets]
        with self.act("MEMCPY_IN_FUSION_BUFFER"):
            for r, at in zip(reqs, starts):
                gpu.scale_copy(r.tensor.reshape(-1), buf[at:at + r.tensor.size], meta.prescale,
                               self.half_rule)
        self._reduce_gpu(buf, ReduceOp(meta.op))
        with self.act("MEMCPY_OUT_FUSION_BUFFER"):
            for r, at in zip(reqs, starts):
                gpu.scale_copy(buf[at:at + r.tensor.size], r.output.reshape(-1),
                               meta.postscale, self.half_rule)

    def _reduce_gpu(self, buf: Any, op: ReduceOp | None, root: int = 0) -> None:
        """Allreduce (``op``) or broadcast (``op`` None, from ``root``) a flat GPU buffer."""
        from ddpbench import gpu

        if self.gpu_transport == "host":
            self.stage = self.stage or gpu.HostStage()
            with self.act("MEMCPY_IN_HOST_BUFFER"):
                host = self.stage.to_host(buf)
            if op is None:
                with self.act("MPI_BCAST"):
                    self.data.Bcast(byte_view(host), root=root)
            else:
                self._reduce(host.reshape(-1), op)
            with self.act("MEMCPY_OUT_HOST_BUFFER"):
                gpu.HostStage.to_device(host, buf)
            return
        if self.nccl is None:
            with self.act("INIT_NCCL"):
                self.nccl = gpu.NcclComm(self.data, buf.device.id)
        sync = not self._defer  # deferred: the finalizer waits on an event instead
        if op is None:
            with self.act("NCCL_BCAST"):
                self.nccl.bcast(buf, root, sync)
        else:
            with self.act("NCCL_ALLREDUCE"):
                self.nccl.allreduce(buf, op, sync)


@register("horovod")
class HorovodStore(RequestStore):
    """Ring allreduce with tensor fusion and cross-rank negotiation, after Horovod.

    Options:
        fusion_threshold: bytes a fused buffer may hold (default 128 MiB; 0 = no fusion).
        cycle_time: ms between the starts of two cycles (default 1; 0 cycles back to back).
        cache_capacity: tensors in the response cache (default 1024; 0 = no cache).
        algorithm: ``"mpi"`` (MPI_Allreduce, default) or ``"ring"`` (point-to-point ring).
        idle: ``"cycle"`` (Horovod: idle ranks cycle too) or ``"wait"`` (an idle rank's
            next cycle starts when it has work, or 10 ms after its last; ddpbench's variant).
        stall_timeout: s before warning that ranks have not submitted a tensor (60).

    Example:
        >>> kv = ddpbench.create("horovod", fusion_threshold=64 << 20)
        >>> kv.push_pull("grad", g, op="average", prescale_factor=1 / 8, postscale_factor=8)
    """

    Options = _Options
    options: _Options
    _proto: _HorovodProtocol
    capabilities = frozenset({"broadcast", "push_pull", "fusion", "allgather", "reduce_scatter"})
    takes_cupy = True  # NCCL, or pinned host staging (gpu_transport)

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        comm, local_size = self._world.role_comm, self._world.local_size
        mine = (local_size, self.options.timeline is not None)
        ctrl, data, gathered = self._engine.call(
            lambda: (comm.Dup(), comm.Dup(), comm.allgather(mine))).wait()
        on = [r for r, (_, t) in enumerate(gathered) if t]
        if on and len(on) != len(gathered):
            off = [r for r in range(len(gathered)) if r not in on]
            self._engine.call(lambda: (ctrl.Free(), data.Free())).wait()
            raise ValueError(f"horovod: ranks {on} asked for a timeline and ranks {off} did "
                             f"not; give timeline (HOROVOD_TIMELINE) on every rank, as the "
                             f"cycle's bit vector carries it on all of them")
        self._proto = _HorovodProtocol(ctrl, data, self.options, [ls for ls, _ in gathered])
        self._engine.register(self._proto)

    @property
    def fusion_threshold_bytes(self) -> int:
        """The threshold this store fuses up to: ``fusion_threshold`` rounded up to a
        multiple of local_size x 8 x 64 bytes on a homogeneous cluster (Horovod's)."""
        return self._proto.threshold

    @property
    def stats(self) -> dict[str, int]:
        """Statistics of this rank: groups executed and tensors they carried, cycles run,
        requests served from the response cache."""
        return dict(self._proto.stats)

    _push_pull_now = RequestStore._push_pull_inline

    def _run_inline(self, req: Request) -> bool:
        """idle="wait": run the cycles on this thread when this rank is idle (run_inline)."""
        if not self._proto.run_inline(req):
            return False
        if self._proto._has_work():  # queued by another thread meanwhile: start it now
            self._engine.wake()
        return True

    def fusion_groups(self) -> list[tuple[int, list[Any]]]:
        """Return the last groups executed (up to 4096): (cycle number, tensor names)."""
        return self._engine.call(lambda: list(self._proto.group_log)).wait()

    def _release(self) -> None:
        """Leave together with every other rank (the coordinator says when), then free."""
        done = Handle("close")
        self._engine.submit(self._proto, done)
        done.wait()
        self._engine.unregister(self._proto)
        proto = self._proto

        def free() -> None:
            if proto.finalizer is not None:  # every deferred group done before NCCL goes
                proto.finalizer.close()
            if proto.nccl is not None:
                proto.nccl.close()
            proto.ctrl.Free()
            proto.data.Free()
            if proto.timeline is not None:
                proto.timeline.close()

        self._engine.call(free).wait()
