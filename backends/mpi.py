"""The ``mpi`` backend: one native ``MPI_Allreduce`` / ``MPI_Bcast`` per tensor.

``allgather`` and ``reduce_scatter`` are one ``MPI_Allgatherv`` (after an
``MPI_Allgather`` of the row counts) and one ``MPI_Reduce_scatter``, queued in call order
with the rest.

This is the baseline every real number is compared to: no fusion, no scheduling, the MPI
library's own algorithm. CuPy tensors go through NCCL (``gpu_transport="nccl"``, one rank
per GPU) or are staged through pinned host memory (``"host"``). Half precision (float16, bfloat16), which MPI has no predefined
reduction for, goes through a user-defined MPI op that adds in the tensor's dtype.

Calls are collective and must be made in the same order on every rank. With ``check_consistency``
(default) each call first compares a fingerprint of (name, shape, dtype, op, factors, root)
across ranks — one tiny extra allreduce — so a disagreement raises the same error on every
rank instead of hanging or corrupting memory; ``check_consistency=False`` is the bare baseline.

``timeline`` makes rank 0 write a timeline in Horovod's layout and names
(:class:`ddpbench.backends._common.Timeline`): per tensor its operation (``ALLREDUCE``,
``BROADCAST``) holding ``QUEUE`` (queued on the engine behind earlier calls; a call run
on the caller's thread has none), ``CONSISTENCY_CHECK`` (the fingerprint allreduce, with
``check_consistency``) and the call itself: ``MPI_ALLREDUCE``, ``MPI_BCAST``,
``NCCL_ALLREDUCE``, ``NCCL_BCAST`` (``INIT_NCCL`` once), or ``MEMCPY_IN_HOST_BUFFER`` and
``MEMCPY_OUT_HOST_BUFFER`` around the MPI call with pinned-host staging. No negotiation:
the calls run in program order.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

import numpy as np

from ddpbench.api import ReduceOp, register
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
from ddpbench.comm import Protocol
from ddpbench.contract import MpiKnobs
from ddpbench.tensor_ops import byte_view, scale_, scale_into

_Options = MpiKnobs  # knobs and bounds: ddpbench.contract
_OPS = {op.value: op for op in ReduceOp}



def check_consistent(comm: Any, meta: Meta) -> None:
    """Raise MismatchError on every rank unless all ranks of ``comm`` submitted ``meta``."""
    MPI = mpi_module()
    sig = meta.signature()
    pair = np.array([sig, -sig], dtype=np.int64)
    comm.Allreduce(MPI.IN_PLACE, pair, op=MPI.MAX)
    if pair[0] != -pair[1]:  # max(sig) != min(sig): someone differs; find out who and how
        message = mismatch_message(comm.allgather(meta))
        raise MismatchError(message or f"ranks disagree on the call for {meta.name!r}")


class _MPIProtocol(Protocol):
    """Executes requests FIFO, one blocking collective each.

    Asynchronous calls run on the engine thread. A synchronous ``push_pull`` made while
    nothing of this store is queued or running runs on the caller's thread instead
    (:meth:`run_inline`): the order of calls is the same either way, and a plain MPI
    program pays no thread hand-off for a call it waits on anyway.
    """

    def __init__(self, comm: Any, validate: bool, gpu_transport: str,
                 timeline: str | None = None) -> None:
        self.comm = comm
        self.validate = validate
        self.gpu_transport = gpu_transport
        self.timeline = (Timeline(timeline, {"backend": "mpi", "ranks": comm.size})
                         if timeline is not None and comm.rank == 0 else None)
        self.group_names: list[Any] = []
        self.act = Activity(self)
        self.nccl: Any = None  # made on the first GPU tensor (same point on every rank)
        self.stage: Any = None
        self.queue: collections.deque[Request] = collections.deque()
        # One collective at a time on ``comm``, whichever thread runs it; ``submitted`` and
        # ``finished`` count requests so that an inline call never overtakes a queued one.
        self.lock = threading.Lock()
        self.submitted = 0
        self.finished = 0

    def accept(self, item: Request) -> None:
        if self.timeline is not None:
            item.queued_at = time.monotonic()
        self.queue.append(item)

    def busy(self) -> bool:
        return bool(self.queue)

    def run_inline(self, req: Request) -> bool:
        """Run ``req`` on this thread if nothing is ahead of it; return whether it ran."""
        with self.lock:
            if self.submitted != self.finished:
                return False
            self.submitted += 1
            self._run(req)
        return True

    def progress(self) -> bool:
        if not self.queue or not self.lock.acquire(blocking=False):
            return False
        try:
            self._run(self.queue.popleft())
        finally:
            self.lock.release()
        return True

    def _run(self, req: Request) -> None:
        tl = self.timeline
        if tl is not None:
            self._start_timeline(tl, req)
        ok = False
        try:
            if self.validate:
                with self.act("CONSISTENCY_CHECK"):
                    check_consistent(self.comm, req.meta)
            if req.meta.device == "gpu":
                self._gpu(req)
            elif req.meta.kind == "broadcast":
                with self.act("MPI_BCAST"):
                    self.comm.Bcast(byte_view(req.tensor), root=req.meta.root)
            elif req.meta.kind in GATHER_KINDS:
                with self.act(GATHER_KINDS[req.meta.kind]):
                    run_gather_scatter(self.comm, req)
            else:
                self._reduce_host(req.tensor, req.output, req.meta)
            ok = True
        except Exception as err:
            self._end_timeline(req, ok)
            req.handle.set_error(err)
        else:
            self._end_timeline(req, ok)
            req.handle.set_result(req.output)
        finally:
            self.finished += 1

    def _start_timeline(self, tl: Timeline, req: Request) -> None:
        name = req.meta.name
        self.group_names = [name]
        now = time.monotonic()
        tl.start(name, req.meta.kind, req.meta.nbytes, now=req.queued_at or now)
        if req.queued_at:  # it waited on the engine behind earlier calls
            tl.activity_start_all(self.group_names, "QUEUE", req.queued_at)
            tl.activity_end_all(self.group_names, now)

    def _end_timeline(self, req: Request, ok: bool) -> None:
        if self.timeline is not None:
            self.timeline.end(req.meta.name, req.meta if ok else None)
            self.timeline.flush()

    def _gpu(self, req: Request) -> None:
        """NCCL on the device, or the host path through pinned memory."""
        from ddpbench import gpu

        meta, op = req.meta, ReduceOp(req.meta.op)
        if self.gpu_transport == "host":
            self.stage = self.stage or gpu.HostStage()
            with self.act("MEMCPY_IN_HOST_BUFFER"):
                host = self.stage.to_host(req.tensor)
            if meta.kind == "broadcast":
                with self.act("MPI_BCAST"):
                    self.comm.Bcast(byte_view(host), root=meta.root)
            else:
                self._reduce_host(host, host, meta)
            with self.act("MEMCPY_OUT_HOST_BUFFER"):
                gpu.HostStage.to_device(host, req.output)
            return
        if self.nccl is None:
            with self.act("INIT_NCCL"):
                self.nccl = gpu.NcclComm(self.comm, req.tensor.device.id)
        if meta.kind == "broadcast":
            with self.act("NCCL_BCAST"):
                self.nccl.bcast(req.tensor, meta.root)
            return
        gpu.scale_copy(req.tensor, req.output, meta.prescale)
        with self.act("NCCL_ALLREDUCE"):
            self.nccl.allreduce(req.output.reshape(-1), op)
        gpu.scale_(req.output, meta.postscale)

    def _reduce_host(self, src: np.ndarray, out: np.ndarray, meta: Meta) -> None:
        op = _OPS[meta.op]
        src, out = src.reshape(-1), out.reshape(-1)
        if meta.prescale == 1.0 and not np.may_share_memory(src, out):
            with self.act("MPI_ALLREDUCE"):
                mpi_allreduce(self.comm, out, op, source=src)  # out of place: no copy
        else:
            scale_into(src, meta.prescale, out)
            with self.act("MPI_ALLREDUCE"):
                mpi_allreduce(self.comm, out, op)
        scale_(out, meta.postscale)

    def fail(self, error: BaseException) -> None:
        while self.queue:
            self.queue.popleft().handle.set_error(error)


@register("mpi")
class MPIStore(RequestStore):
    """Native MPI collectives, one per tensor, in call order.

    Options:
        check_consistency: compare each call's metadata across ranks first (default True).
        gpu_transport: CuPy tensors through ``"nccl"`` (default) or ``"host"`` staging.
    """

    Options = _Options
    options: _Options
    _proto: _MPIProtocol
    capabilities = frozenset({"broadcast", "push_pull", "allgather", "reduce_scatter"})
    takes_cupy = True  # NCCL, or pinned host staging (gpu_transport)

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._comm = self._engine.call(self._world.role_comm.Dup).wait()
        self._proto = _MPIProtocol(self._comm, self.options.check_consistency,
                                   self.options.gpu_transport, self.options.timeline)
        self._engine.register(self._proto)

    _push_pull_now = RequestStore._push_pull_inline

    def _run_inline(self, req: Request) -> bool:
        """Reduce on this thread when nothing of this store is queued (see _MPIProtocol)."""
        return self._proto.run_inline(req)

    def _enqueue(self, req: Request) -> None:
        with self._proto.lock:
            self._proto.submitted += 1
        self._engine.submit(self._proto, req)

    def _release(self) -> None:
        self._engine.unregister(self._proto)
        nccl, tl = self._proto.nccl, self._proto.timeline

        def free() -> None:
            if nccl is not None:
                nccl.close()
            self._comm.Free()
            if tl is not None:
                tl.close()

        self._engine.call(free).wait()
