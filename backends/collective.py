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
"""

from __future__ import annotations

import collections
from collections.abc import Generator, Sequence
from typing import Any

import numpy as np

from ddpbench.api import ReduceOp, register
from ddpbench.backends._common import MismatchError, Request, RequestStore, mismatch_message
from ddpbench.comm import POLL_TESTS, Protocol
from ddpbench.contract import CollectiveKnobs
from ddpbench.rules.ring import Scratch, ring_steps
from ddpbench.tensor_ops import byte_view, reduce_ufunc, scale_

TAG_RING = 21
MODES = ("grad_allreduce", "local_sgd")


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


class _Ring:
    """One duplicated communicator and the FIFO of operations striped onto it."""

    def __init__(self, index: int, comm: Any) -> None:
        self.index, self.comm = index, comm
        self.queue: collections.deque[Request] = collections.deque()
        self.current: Request | None = None
        self.steps: _Steps | None = None
        self.reqs: list = []
        self.stats: dict[str, Any] = {"ops": 0, "bytes_sent": 0, "names": []}
        self.scratch = Scratch()  # the ring's receive buffer (one op at a time)


class _CollectiveProtocol(Protocol):
    """Stripes requests round-robin over the rings and advances all rings on every poll."""

    def __init__(self, comms: Sequence[Any], validate: bool) -> None:
        self.rings = [_Ring(i, c) for i, c in enumerate(comms)]
        self.validate = validate
        self.ring_of: dict[Any, int] = {}
        self.max_active = 0

    def accept(self, item: Request) -> None:
        # Paddle's transpiler gives each gradient its ring once, when it builds the program
        # (ring_id = (ring_id + 1) % nrings over the gradients): a name keeps its ring.
        index = self.ring_of.setdefault(item.meta.name, len(self.ring_of) % len(self.rings))
        self.rings[index].queue.append(item)

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
                    ring.current, ring.steps, ring.reqs = req, self._run(ring, req), []
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
        req, ring.current, ring.steps, ring.reqs = ring.current, None, None, []
        assert req is not None
        if error is None:
            req.handle.set_result(req.output)
        else:
            req.handle.set_error(error)

    def _run(self, ring: _Ring, req: Request) -> _Steps:
        from mpi4py import MPI

        meta, comm = req.meta, ring.comm
        ring.stats["ops"] += 1
        ring.stats["names"].append(meta.name)
        if self.validate and comm.size > 1:
            sig = meta.signature()
            pair = np.array([sig, -sig], dtype=np.int64)
            yield [comm.Iallreduce(MPI.IN_PLACE, pair, op=MPI.MAX)]
            if pair[0] != -pair[1]:  # every rank sees this, so all reach the allgather
                message = mismatch_message(comm.allgather(meta))
                raise MismatchError(message or f"ranks disagree on the call for {meta.name!r}")
        if meta.kind == "broadcast":
            if comm.size > 1:
                yield [comm.Ibcast(byte_view(req.tensor), root=meta.root)]
            return
        buf = req.output
        if buf is not req.tensor:
            buf[...] = req.tensor
        flat = buf.reshape(-1)
        scale_(flat, meta.prescale)
        yield from _ring_steps(comm, flat, ReduceOp(meta.op), ring.stats, ring.scratch)
        scale_(flat, meta.postscale)

    def fail(self, error: BaseException) -> None:
        for ring in self.rings:
            if ring.current is not None:
                self._finish(ring, error)
            while ring.queue:
                ring.queue.popleft().handle.set_error(error)


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

    Example:
        >>> kv = ddpbench.create("collective", nrings=4)
        >>> kv.allreduce_max("loss_scale_overflow", flags)
    """

    Options = _Options
    options: _Options
    _proto: _CollectiveProtocol
    capabilities = frozenset({"broadcast", "push_pull", "reduce_kinds"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        comm, n = self._world.role_comm, self.options.nrings
        comms = self._engine.call(lambda: [comm.Dup() for _ in range(n)]).wait()
        self._proto = _CollectiveProtocol(comms, self.options.check_consistency)
        self._engine.register(self._proto)
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

    def _push_pull_async(self, name, tensor, output, *, priority, op, prescale, postscale):
        if op is ReduceOp.AVERAGE and self.options.average_scaling == "before_sum":
            # Paddle divides before the sum (it scales the loss gradient by 1/n); the size
            # is read at call time, as for AVERAGE everywhere.
            prescale, op = prescale / self.num_workers, ReduceOp.SUM
        return super()._push_pull_async(name, tensor, output, priority=priority, op=op,
                                        prescale=prescale, postscale=postscale)

    # -- plumbing ------------------------------------------------------------------------------
    def _release(self) -> None:
        self._engine.unregister(self._proto)
        rings = self._proto.rings
        self._engine.call(lambda: [r.comm.Free() for r in rings]).wait()
