"""The ``collective`` backend: reduce kinds as separate operations, striped over parallel rings.

What it offers beyond ``mpi`` and ``horovod``:

- Reduce kinds as operations of their own: ``allreduce_sum``, ``allreduce_max``,
  ``allreduce_min``, ``allreduce_prod`` (and the same through ``push_pull(op=...)``).
- ``nrings`` duplicated communicators driven concurrently: the k-th name first used goes
  to ring ``k % nrings`` and stays there (Paddle's transpiler assigns rings once, when it
  builds the program: python/paddle/fluid/transpiler/collective.py), and the engine thread
  advances every ring's current reduction with nonblocking point-to-point steps, so a
  small tensor on one ring is not stuck behind a large one on another.
- ``op=AVERAGE`` divides by the workers before the sum (``average_scaling="before_sum"``):
  Paddle's GradAllReduce scales the loss gradient by 1/n, so every gradient enters the
  ring sum already divided; ``"after_sum"`` is Horovod's order, not Paddle's.
- Two modes for trainers: ``grad_allreduce`` (gradients reduced every step) and
  ``local_sgd`` (workers step alone; the parameters are averaged, as the delta against a
  snapshot taken at the last average, on Paddle's schedule: every step up to
  ``local_sgd_begin_step`` (1), then every ``local_sgd_period`` (k_steps, 1) steps, i.e.
  at steps 1, 1 + k, 1 + 2k, ...; python/paddle/distributed/fleet/meta_optimizers/
  localsgd_optimizer.py).

Each reduction is the ring allreduce of :func:`ddpbench.rules.ring.ring_steps`, the driver
``horovod``'s ring runs with blocking ``Sendrecv``; here every step is an ``Isend``/``Irecv``
pair that the engine polls, so a tensor reduced here equals bit for bit the same tensor
reduced by unfused ``horovod`` with ``algorithm="ring"``. Prescale and postscale follow
``ddpbench.tensor_ops.scale_`` (halves scaled in float32).

Ordering: calls are collective and must be made in the same order on every rank (no
negotiation, unlike ``horovod``); priorities are accepted but not used for reordering,
which could differ between ranks. Paddle runs its ``c_allreduce_*`` operators as the
program was built, without a cross-rank check, and so does this backend by default;
``check_consistency=True`` (ddpbench's own) first compares a fingerprint of each
operation's metadata across the ranks (a nonblocking 16-byte allreduce on its ring), so a
disagreement raises the same error on every rank instead of hanging.

Buckets (``fuse_grad_size_mb`` > 0, mode ``grad_allreduce``): the gradients are fused into
Paddle fleet's buckets (:func:`ddpbench.rules.buckets.coalesce_buckets`: whole layers, a
layer being a name up to its last ``.``, until a bucket holds at least that many MB or more
than 50 gradients), one ring allreduce per bucket, the k-th bucket on ring ``k % nrings``.
Paddle plans its buckets from the program before the first step; ddpbench learns the
program from the first step: the names of the asynchronous calls in the order of their
first use, unfused, until a name comes again. From then on a bucket goes as soon as all of
its tensors are submitted; a synchronous ``push_pull`` (never fused itself),
``synchronize()`` and ``close()`` send an incomplete one as it is (a handle's ``wait()``
does not: it waits for the rest). A bucket whose tensors differ in
dtype, op, factors or device runs them one by one on its ring. Names first used after the
plan is made, and broadcasts, are not fused. The default, 0, is the transpiler's
``GradAllReduce``: one ``c_allreduce_sum`` per gradient.

``timeline`` makes rank 0 write a timeline in Horovod's layout and names
(:class:`ddpbench.backends._common.Timeline`): per tensor its operation (``ALLREDUCE``,
``BROADCAST``) holding ``QUEUE`` (waiting for its ring, or for the rest of its bucket),
``CONSISTENCY_CHECK`` (with ``check_consistency``), ``MEMCPY_IN_FUSION_BUFFER`` and
``MEMCPY_OUT_FUSION_BUFFER`` around a bucket's reduction, and the reduction under Paddle's
operator name (``c_allreduce_sum``, ``c_allreduce_max``, ``c_allreduce_min``,
``c_allreduce_prod``, ``c_broadcast``) with its ring as an argument.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Generator, Sequence
from typing import Any

import numpy as np

from ddpbench.api import Handle, ReduceOp, register
from ddpbench.backends._common import (
    GATHER_KINDS,
    MismatchError,
    Request,
    RequestStore,
    Timeline,
    half_op,
    mismatch_message,
    mpi_op,
    split_counts,
)
from ddpbench.comm import POLL_TESTS, Protocol
from ddpbench.contract import CollectiveKnobs
from ddpbench.rules.buckets import coalesce_buckets, layer_key
from ddpbench.rules.ring import Scratch, ring_steps
from ddpbench.tensor_ops import (
    HALF_DTYPES,
    adjacent_span,
    byte_view,
    reduce_ufunc,
    scale_,
    scale_into,
)

TAG_RING = 21
MODES = ("grad_allreduce", "local_sgd")
_PADDLE_OPS = {"sum": "c_allreduce_sum", "max": "c_allreduce_max", "min": "c_allreduce_min",
               "product": "c_allreduce_prod"}


_Options = CollectiveKnobs  # knobs and bounds: ddpbench.contract


_Steps = Generator[list, None, None]


def _ring_steps(comm: Any, buf: np.ndarray, op: ReduceOp, stats: dict[str, int],
                scratch: Scratch | None = None) -> _Steps:
    """Reduce the 1-D ``buf`` in place over ``comm``; yield the requests of each ring step.

    Each step of :func:`ddpbench.rules.ring.ring_steps` becomes an ``Irecv``/``Isend``
    pair, yielded for the engine to poll; the ring resumes once both complete. ``scratch``
    keeps the receive buffer between calls; its bytes sent are counted in ``stats``.
    """
    from mpi4py import MPI

    p, r = comm.size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    for send, recv in ring_steps(buf, r, p, reduce_ufunc(op), scratch):
        reqs = [comm.Irecv([recv, MPI.BYTE], left, TAG_RING),
                comm.Isend([send, MPI.BYTE], right, TAG_RING)]
        stats["bytes_sent"] += send.nbytes
        yield reqs


_PADDLE_GATHER = {"allgather": "c_allgather", "reduce_scatter": "c_reducescatter"}
"""Paddle's operators for the two (paddle/fluid/operators/collective/c_allgather_op.cc,
c_reducescatter_op.cc), as the timeline names them."""


def _gather_steps(comm: Any, req: Request) -> _Steps:
    """An allgather (``MPI_Iallgather`` of the row counts, then ``MPI_Iallgatherv`` of the
    bytes) or a reduce-scatter (``MPI_Ireduce_scatter``) on ``comm``, one step each, so the
    other rings advance meanwhile; the result is left in ``req.output``."""
    from mpi4py import MPI

    meta = req.meta
    if meta.kind == "allgather":
        send = req.tensor.reshape((-1, *req.tensor.shape[1:])) if req.tensor.ndim else \
            req.tensor.reshape(1)
        rows = np.array([send.shape[0]], dtype=np.int64)
        all_rows = np.empty(comm.size, dtype=np.int64)
        yield [comm.Iallgather(rows, all_rows)]
        shape = (int(all_rows.sum()), *send.shape[1:])
        out = req.output if req.output is not None else np.empty(shape, send.dtype)
        if tuple(out.shape) != shape or out.dtype != send.dtype:
            raise ValueError(f"allgather output is {out.dtype}{list(out.shape)}, expected "
                             f"{send.dtype}{list(shape)}")
        row = int(np.prod(send.shape[1:], dtype=np.int64)) * send.dtype.itemsize
        counts = [int(r) * row for r in all_rows]
        displs = [sum(counts[:i]) for i in range(len(counts))]
        req.output = out
        yield [comm.Iallgatherv([byte_view(send), MPI.BYTE],
                                [byte_view(out), (counts, displs), MPI.BYTE])]
        return
    counts = split_counts(int(np.prod(meta.shape, dtype=np.int64)), comm.size)
    src, out = req.tensor.reshape(-1), req.output.reshape(-1)
    if src.dtype in HALF_DTYPES:
        mpitype, mpiop = half_op(ReduceOp(meta.op), src.dtype.name)
        yield [comm.Ireduce_scatter([byte_view(src), src.size, mpitype],
                                    [byte_view(out), out.size, mpitype], counts, op=mpiop)]
    else:
        yield [comm.Ireduce_scatter(src, out, counts, op=mpi_op(ReduceOp(meta.op)))]
    scale_(out, meta.postscale)


class _Bucket:
    """The requests of one bucket that go as one fused allreduce (in the bucket's order)."""

    __slots__ = ("index", "reqs")

    def __init__(self, index: int, reqs: list[Request]) -> None:
        self.index, self.reqs = index, reqs


class _Flush:
    """Engine item: send every incomplete bucket as it is, then complete ``handle``."""

    __slots__ = ("handle",)

    def __init__(self) -> None:
        self.handle = Handle("flush")


class _Ring:
    """One duplicated communicator and the FIFO of operations striped onto it."""

    def __init__(self, index: int, comm: Any) -> None:
        self.index, self.comm = index, comm
        self.queue: collections.deque[Request | _Bucket] = collections.deque()
        self.current: Request | _Bucket | None = None
        self.steps: _Steps | None = None
        self.reqs: list = []
        self.stats: dict[str, Any] = {"ops": 0, "bytes_sent": 0, "names": []}
        self.scratch = Scratch()  # the ring's receive buffer (one op at a time)
        self.fusion = np.empty(0, np.uint8)  # a bucket's buffer, grown to the largest


class _CollectiveProtocol(Protocol):
    """Stripes requests round-robin over the rings and advances all rings on every poll."""

    def __init__(self, comms: Sequence[Any], validate: bool, fuse_mb: float = 0.0,
                 timeline: str | None = None) -> None:
        self.rings = [_Ring(i, c) for i, c in enumerate(comms)]
        self.validate = validate
        self.ring_of: dict[Any, int] = {}
        self.max_active = 0
        # Buckets: the program's names learnt from the first step, then Paddle's plan.
        self.fuse_mb = fuse_mb
        self.seen: dict[Any, Request] = {}  # first use of each name, in order
        self.bucket_of: dict[Any, int] | None = None  # None: still learning
        self.buckets: list[list[Any]] = []
        self.waiting: dict[int, dict[Any, Request]] = {}
        self.timeline = (Timeline(timeline, {"backend": "collective",
                                             "ranks": comms[0].size if comms else 1})
                         if timeline is not None and comms and comms[0].rank == 0 else None)

    def accept(self, item: Request | _Flush) -> None:
        if isinstance(item, _Flush):
            for b in sorted(self.waiting):
                self._launch(b)
            item.handle.set_result(None)
            return
        if self.timeline is not None:
            item.queued_at = time.monotonic()
        name = item.meta.name
        if self.fuse_mb > 0 and item.meta.kind == "allreduce" and not item.waited:
            if self.bucket_of is None:
                if name not in self.seen:
                    self.seen[name] = item
                else:
                    self._plan()
            k = None if self.bucket_of is None else self.bucket_of.get(name)
            if k is not None:
                waiting = self.waiting.setdefault(k, {})
                if name in waiting:
                    item.handle.set_error(RuntimeError(
                        f"collective: {name!r} was submitted again while its bucket still "
                        f"waits for {sorted(set(self.buckets[k]) - set(waiting), key=str)!r}; "
                        f"a bucket goes when all of its tensors are submitted (or at "
                        f"synchronize())"))
                    return
                waiting[name] = item
                if len(waiting) == len(self.buckets[k]):
                    self._launch(k)
                return
        # Paddle's transpiler gives each gradient its ring once, when it builds the program
        # (ring_id = (ring_id + 1) % nrings over the gradients): a name keeps its ring.
        index = self.ring_of.setdefault(name, len(self.ring_of) % len(self.rings))
        self.rings[index].queue.append(item)

    def _plan(self) -> None:
        """Make Paddle's buckets over the names of the first step, in their order."""
        plan = coalesce_buckets(list(self.seen.values()), self.fuse_mb,
                                nbytes=lambda r: r.meta.nbytes,
                                layer=lambda r: layer_key(r.meta.name),
                                dtype=lambda r: r.meta.dtype)
        self.buckets = [[r.meta.name for r in b] for b in plan]
        self.bucket_of = {n: i for i, b in enumerate(self.buckets) for n in b}
        self.seen.clear()

    def _launch(self, b: int) -> None:
        """Queue bucket ``b`` (what has come of it, in its order) on ring ``b % nrings``: as
        one fused allreduce when its tensors agree in dtype, op, factors and device, else
        one by one."""
        waiting = self.waiting.pop(b)
        reqs = [waiting[n] for n in self.buckets[b] if n in waiting]
        ring = self.rings[b % len(self.rings)]
        first = reqs[0].meta
        if len(reqs) > 1 and all(
                (r.meta.dtype, r.meta.op, r.meta.prescale, r.meta.postscale, r.meta.device)
                == (first.dtype, first.op, first.prescale, first.postscale, "cpu")
                for r in reqs):
            ring.queue.append(_Bucket(b, reqs))
        else:
            ring.queue.extend(reqs)

    def busy(self) -> bool:
        return any(r.current is not None or r.queue for r in self.rings)

    def moving(self) -> bool:
        return any(r.reqs for r in self.rings)  # a ring step's Isend/Irecv under way

    def progress(self) -> bool:
        # While every ring waits on a transfer, pass over them again a few times (each
        # test calls into MPI, which moves a large message only then where it has no
        # single-copy path: Engine); a pass that steps a ring ends the poll.
        for _ in range(POLL_TESTS):
            if self._pass():
                return True
            if not self.moving():
                break
        return False

    def _pass(self) -> bool:
        from mpi4py import MPI

        did = False
        for ring in self.rings:
            # Step this ring for as long as its requests complete at once (small messages
            # usually do), so a tensor does not wait one engine poll per ring step.
            while True:
                if ring.current is None:
                    if not ring.queue:
                        break
                    req = ring.queue.popleft()
                    ring.current, ring.reqs = req, []
                    ring.steps = (self._run_bucket(ring, req) if isinstance(req, _Bucket)
                                  else self._run(ring, req))
                    self.max_active = max(self.max_active,
                                          sum(r.current is not None for r in self.rings))
                if ring.reqs and not MPI.Request.Testall(ring.reqs):
                    break
                did = True
                try:
                    ring.reqs = next(ring.steps)  # type: ignore[arg-type]
                except StopIteration:
                    self._finish(ring, None)
                except Exception as err:
                    self._finish(ring, err)
        return did

    def _finish(self, ring: _Ring, error: BaseException | None) -> None:
        item, ring.current, ring.steps, ring.reqs = ring.current, None, None, []
        assert item is not None
        reqs = item.reqs if isinstance(item, _Bucket) else [item]
        tl = self.timeline
        if tl is not None:  # on disk before the handles complete
            for req in reqs:
                tl.end(req.meta.name, req.meta if error is None else None)
            tl.flush()
        for req in reqs:
            if error is None:
                req.handle.set_result(req.output)
            else:
                req.handle.set_error(error)

    def _start_timeline(self, ring: _Ring, reqs: list[Request]) -> list[Any]:
        """Open the reqs' operations on the timeline, with the time they queued."""
        names = [r.meta.name for r in reqs]
        tl = self.timeline
        if tl is not None:
            now = time.monotonic()
            for r in reqs:
                tl.start(r.meta.name, r.meta.kind, r.meta.nbytes, now=r.queued_at or now)
                tl.activity_start_all([r.meta.name], "QUEUE", r.queued_at or now)
            tl.activity_end_all(names, now)
        return names

    def _activity(self, names: list[Any], activity: str, ring: _Ring | None = None,
                  end: bool = False) -> None:
        tl = self.timeline
        if tl is None:
            return
        if end:
            tl.activity_end_all(names, args=None if ring is None else {"ring": ring.index})
        else:
            tl.activity_start_all(names, activity)

    def _check(self, ring: _Ring, meta: Any, names: list[Any]) -> _Steps:
        """ddpbench's consistency check: a 16-byte allreduce of ``meta``'s fingerprint."""
        from mpi4py import MPI

        comm = ring.comm
        self._activity(names, "CONSISTENCY_CHECK")
        sig = meta.signature()
        pair = np.array([sig, -sig], dtype=np.int64)
        yield [comm.Iallreduce(MPI.IN_PLACE, pair, op=MPI.MAX)]
        self._activity(names, "", end=True)
        if pair[0] != -pair[1]:  # every rank sees this, so all reach the allgather
            message = mismatch_message(comm.allgather(meta))
            raise MismatchError(message or f"ranks disagree on the call for {meta.name!r}")

    def _run(self, ring: _Ring, req: Request) -> _Steps:
        meta, comm = req.meta, ring.comm
        ring.stats["ops"] += 1
        ring.stats["names"].append(meta.name)
        names = self._start_timeline(ring, [req])
        if self.validate and comm.size > 1:
            yield from self._check(ring, meta, names)
        if meta.kind == "broadcast":
            if comm.size > 1:
                self._activity(names, "c_broadcast")
                yield [comm.Ibcast(byte_view(req.tensor), root=meta.root)]
                self._activity(names, "", ring, end=True)
            return
        if meta.kind in GATHER_KINDS:
            self._activity(names, _PADDLE_GATHER[meta.kind])
            yield from _gather_steps(comm, req)
            self._activity(names, "", ring, end=True)
            return
        buf = req.output
        if buf is not req.tensor:
            buf[...] = req.tensor
        flat = buf.reshape(-1)
        scale_(flat, meta.prescale)
        self._activity(names, _PADDLE_OPS[meta.op])
        yield from _ring_steps(comm, flat, ReduceOp(meta.op), ring.stats, ring.scratch)
        self._activity(names, "", ring, end=True)
        scale_(flat, meta.postscale)

    def _run_bucket(self, ring: _Ring, bucket: _Bucket) -> _Steps:
        """Reduce a bucket's tensors as one: back to back in the ring's buffer (or where
        they lie, when they already do), prescale in the copy in, postscale in the copy out."""
        reqs = bucket.reqs
        first = reqs[0].meta
        ring.stats["ops"] += 1
        ring.stats["names"].append([r.meta.name for r in reqs])
        names = self._start_timeline(ring, reqs)
        if self.validate and ring.comm.size > 1:
            yield from self._check(ring, first, names)
        dtype = reqs[0].tensor.dtype
        src = adjacent_span([r.tensor for r in reqs])
        out = adjacent_span([r.output for r in reqs]) if src is not None else None
        if src is not None and out is not None:  # already one buffer: reduce it there
            flat = out
            scale_into(src, first.prescale, flat)
        else:
            total = sum(r.tensor.size for r in reqs) * dtype.itemsize
            if ring.fusion.nbytes < total:
                ring.fusion = np.empty(total, np.uint8)
            flat = ring.fusion[:total].view(dtype)
            self._activity(names, "MEMCPY_IN_FUSION_BUFFER")
            off = 0
            for r in reqs:
                scale_into(r.tensor.reshape(-1), first.prescale, flat[off:off + r.tensor.size])
                off += r.tensor.size
            self._activity(names, "", end=True)
        self._activity(names, _PADDLE_OPS[first.op])
        yield from _ring_steps(ring.comm, flat, ReduceOp(first.op), ring.stats, ring.scratch)
        self._activity(names, "", ring, end=True)
        if out is not None:
            scale_(flat, first.postscale)
            return
        self._activity(names, "MEMCPY_OUT_FUSION_BUFFER")
        off = 0
        for r in reqs:
            scale_into(flat[off:off + r.tensor.size], first.postscale, r.output.reshape(-1))
            off += r.tensor.size
        self._activity(names, "", end=True)

    def fail(self, error: BaseException) -> None:
        for ring in self.rings:
            if ring.current is not None:
                self._finish(ring, error)
            while ring.queue:
                item = ring.queue.popleft()
                for req in item.reqs if isinstance(item, _Bucket) else [item]:
                    req.handle.set_error(error)
        for waiting in self.waiting.values():
            for req in waiting.values():
                req.handle.set_error(error)
        self.waiting.clear()


@register("collective")
class CollectiveStore(RequestStore):
    """Ring allreduce with separate reduce kinds, ``nrings`` parallel rings and local SGD.

    Options:
        nrings: communicators driven concurrently; each name gets ring k % nrings, k its
            order of first use, and keeps it (default 2).
        average_scaling: ``before_sum`` (default, Paddle) or ``after_sum`` (Horovod's).
        mode: ``grad_allreduce`` (default) or ``local_sgd``; read by
            :class:`ddpbench.DistributedTrainer` (capability ``'local_sgd'``).
        local_sgd_period: steps between parameter averages in ``local_sgd`` mode (1).
        local_sgd_begin_step: steps 1..this all average (1).
        check_consistency: compare each call's metadata across ranks first (False,
            as Paddle; True is ddpbench's check).
        fuse_grad_size_mb: fuse gradients into Paddle fleet's buckets of this many MB
            (fleet's default 32; 0, the default: the transpiler's one allreduce per
            gradient). Mode ``grad_allreduce`` only.
        timeline: a file for rank 0's timeline (Chrome-trace JSON), or None.

    Example:
        >>> kv = ddpbench.create("collective", nrings=4)
        >>> kv.allreduce_max("loss_scale_overflow", flags)
    """

    Options = _Options
    options: _Options
    _proto: _CollectiveProtocol
    capabilities = frozenset({"broadcast", "push_pull", "reduce_kinds", "allgather",
                              "reduce_scatter"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        comm, n = self._world.role_comm, self.options.nrings
        comms = self._engine.call(lambda: [comm.Dup() for _ in range(n)]).wait()
        fuse = self.options.fuse_grad_size_mb if self.options.mode == "grad_allreduce" else 0
        self._proto = _CollectiveProtocol(comms, self.options.check_consistency, fuse,
                                          self.options.timeline)
        self._engine.register(self._proto)
        self._released = False
        self._snapshots: dict[Any, np.ndarray] = {}
        self._local_steps = 0
        self._last_sync = self.options.local_sgd_begin_step
        self.syncs = 0

    def is_capable(self, capability: str) -> bool:
        """``'local_sgd'`` only in mode ``local_sgd``; otherwise as declared."""
        if capability == "local_sgd":
            return self.options.mode == "local_sgd"
        return super().is_capable(capability)

    @property
    def stats(self) -> dict[str, Any]:
        """Per-ring operation counts, bytes sent and names (in order), and how many rings
        were observed busy at the same time (``max_active_rings``)."""
        return {
            "rings": [dict(r.stats, names=list(r.stats["names"])) for r in self._proto.rings],
            "max_active_rings": self._proto.max_active,
            "syncs": self.syncs,
        }

    # -- reduce kinds as separate operations --------------------------------------------------
    def allreduce_sum(self, name: Any, tensor: Any, output: Any = None, **kw: Any) -> Any:
        """Sum ``tensor`` over the workers (see ``push_pull`` for the arguments)."""
        return self.push_pull(name, tensor, output, op=ReduceOp.SUM, **kw)

    def allreduce_max(self, name: Any, tensor: Any, output: Any = None, **kw: Any) -> Any:
        """Element-wise maximum over the workers."""
        return self.push_pull(name, tensor, output, op=ReduceOp.MAX, **kw)

    def allreduce_min(self, name: Any, tensor: Any, output: Any = None, **kw: Any) -> Any:
        """Element-wise minimum over the workers."""
        return self.push_pull(name, tensor, output, op=ReduceOp.MIN, **kw)

    def allreduce_prod(self, name: Any, tensor: Any, output: Any = None, **kw: Any) -> Any:
        """Element-wise product over the workers."""
        return self.push_pull(name, tensor, output, op=ReduceOp.PRODUCT, **kw)

    # -- local SGD ---------------------------------------------------------------------------
    def snapshot_parameters(self, names: Sequence[Any], tensors: Sequence[Any], *,
                            reset: bool = False) -> None:
        """Remember the values the next average's deltas are taken against. Local.

        Names already held keep their snapshot (``sync_parameters`` renews it at every
        average); ``reset=True`` (a new training run) forgets every snapshot and restarts
        the count of local steps.
        """
        if reset:
            self._snapshots.clear()
            self._local_steps = 0
            self._last_sync = self.options.local_sgd_begin_step
        for n, t in zip(names, tensors):
            if n not in self._snapshots:
                self._snapshots[n] = np.array(t, copy=True)

    def sync_parameters(self, names: Sequence[Any], tensors: Sequence[Any], *,
                        compression: str | None = None) -> bool:
        """Count one local step and average the parameters on Paddle's schedule.

        Step s (1, 2, ...) averages when ``s <= local_sgd_begin_step`` or when
        ``local_sgd_period`` steps have passed since the last average (Paddle's
        ``LocalSGDOptimizer``: ``step > begin_step`` and ``step - last_step == k_steps``).
        The average is ``snapshot - sum_i(snapshot - w_i) / n`` as Paddle computes it (sum
        first, then scale; the same bits as ``snapshot + mean_i(w_i - snapshot)``): the
        deltas are what travels (small numbers that fp16 carries far better than the
        weights themselves), and every rank ends with the same values. Collective on the
        steps that average. Returns True when this call communicated.

        Raises:
            RuntimeError: not in ``local_sgd`` mode, or no snapshot for a name.
        """
        if self.options.mode != "local_sgd":
            raise RuntimeError(f"sync_parameters needs mode='local_sgd'; this store has "
                               f"mode={self.options.mode!r}")
        self._local_steps += 1
        step = self._local_steps
        if (step > self.options.local_sgd_begin_step
                and step - self._last_sync != self.options.local_sgd_period):
            return False
        self._last_sync = step
        missing = [n for n in names if n not in self._snapshots]
        if missing:
            raise RuntimeError(f"no snapshot of {missing[:3]}: call snapshot_parameters first")
        wire = np.float16 if compression == "fp16" else None
        deltas, handles = [], []
        for n, t in zip(names, tensors):
            d = np.subtract(t, self._snapshots[n])
            d = d.astype(wire) if wire is not None else d
            deltas.append(d)
            # Paddle sums the deltas, then scales by 1/n (after the sum, unlike gradients)
            handles.append(self.push_pull_async(n, d, op=ReduceOp.SUM,
                                                postscale_factor=1.0 / self.num_workers))
        for n, t, d, h in zip(names, tensors, deltas, handles):
            h.wait()
            snap = self._snapshots[n]
            t[...] = snap + d.astype(snap.dtype, copy=False)
            snap[...] = t
        self.syncs += 1
        return True

    def synchronize(self) -> None:
        """Send incomplete buckets as they are, then wait for every operation started here."""
        self._flush()
        super().synchronize()

    def _flush(self) -> None:
        if self._proto.fuse_mb > 0 and not self._released:
            flush = _Flush()
            self._engine.submit(self._proto, flush)
            flush.handle.wait()

    def _start_push_pull(self, name: Any, tensor: Any, output: Any, priority: int,
                         op: ReduceOp | str, prescale_factor: float, postscale_factor: float,
                         now: bool) -> Handle:
        handle = super()._start_push_pull(name, tensor, output, priority, op, prescale_factor,
                                          postscale_factor, now)
        if now:  # the caller waits on it at once: its bucket cannot wait for the rest
            self._flush()
        return handle

    def _push_pull_async(self, name, tensor, output, *, priority, op, prescale, postscale,
                         waited=False):
        if op is ReduceOp.AVERAGE and self.options.average_scaling == "before_sum":
            # Paddle divides before the sum (it scales the loss gradient by 1/n); the size
            # is read at call time, as for AVERAGE everywhere.
            prescale, op = prescale / self.num_workers, ReduceOp.SUM
        return self._submit(self._allreduce_meta(name, tensor, op, prescale, postscale),
                            tensor, output, priority, inline=waited)

    def _push_pull_now(self, name, tensor, output, *, priority, op, prescale, postscale):
        """A synchronous call: marked as waited on, so it is never held for a bucket."""
        return self._push_pull_async(name, tensor, output, priority=priority, op=op,
                                     prescale=prescale, postscale=postscale, waited=True)

    # -- plumbing ------------------------------------------------------------------------------
    def _release(self) -> None:
        self._released = True
        self._engine.unregister(self._proto)
        rings, tl = self._proto.rings, self._proto.timeline

        def free() -> None:
            for r in rings:
                r.comm.Free()
            if tl is not None:
                tl.close()

        self._engine.call(free).wait()
