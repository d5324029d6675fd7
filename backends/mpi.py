"""The ``mpi`` backend: one native ``MPI_Allreduce`` / ``MPI_Bcast`` per tensor.

This is the baseline every real number is compared to: no fusion, no scheduling, the MPI
library's own algorithm. CuPy tensors go through NCCL (``gpu_transport="nccl"``, one rank
per GPU) or are staged through pinned host memory (``"host"``). Half precision (float16, bfloat16), which MPI has no predefined
reduction for, goes through a user-defined MPI op that adds in the tensor's dtype.

Calls are collective and must be made in the same order on every rank. With ``check_consistency``
(default) each call first compares a fingerprint of (name, shape, dtype, op, factors, root)
across ranks — one tiny extra allreduce — so a disagreement raises the same error on every
rank instead of hanging or corrupting memory; ``check_consistency=False`` is the bare baseline.
"""

from __future__ import annotations

import collections
import functools
from typing import Any

import numpy as np

from ddpbench.api import ReduceOp, register
from ddpbench.backends._common import Meta, MismatchError, Request, RequestStore, mismatch_message
from ddpbench.comm import Protocol
from ddpbench.contract import MpiKnobs
from ddpbench.tensor_ops import HALF_DTYPES, byte_view, reduce_ufunc, scale_

_Options = MpiKnobs  # knobs and bounds: ddpbench.contract


@functools.cache
def _half_op(op: ReduceOp, dtype_name: str) -> tuple[Any, Any]:
    """Return (MPI datatype, MPI op) reducing ``dtype_name`` halves with ``op`` in that dtype."""
    from mpi4py import MPI

    dtype = np.dtype(dtype_name) if dtype_name != "bfloat16" else HALF_DTYPES[-1]
    ufunc = reduce_ufunc(op)

    def combine(inbuf: Any, inoutbuf: Any, _datatype: Any) -> None:
        src = np.frombuffer(inbuf, dtype=dtype)
        dst = np.frombuffer(inoutbuf, dtype=dtype)
        ufunc(src, dst, out=dst)

    mpitype = MPI.BYTE.Create_contiguous(dtype.itemsize).Commit()
    return mpitype, MPI.Op.Create(combine, commute=True)


_MPI_OPS = {
    ReduceOp.SUM: "SUM", ReduceOp.AVERAGE: "SUM", ReduceOp.MIN: "MIN",
    ReduceOp.MAX: "MAX", ReduceOp.PRODUCT: "PROD",
}


def check_consistent(comm: Any, meta: Meta) -> None:
    """Raise MismatchError on every rank unless all ranks of ``comm`` submitted ``meta``."""
    from mpi4py import MPI

    sig = meta.signature()
    pair = np.array([sig, -sig], dtype=np.int64)
    comm.Allreduce(MPI.IN_PLACE, pair, op=MPI.MAX)
    if pair[0] != -pair[1]:  # max(sig) != min(sig): someone differs; find out who and how
        message = mismatch_message(comm.allgather(meta))
        raise MismatchError(message or f"ranks disagree on the call for {meta.name!r}")


class _MPIProtocol(Protocol):
    """Executes requests FIFO on the engine thread, one blocking collective each."""

    def __init__(self, comm: Any, validate: bool, gpu_transport: str) -> None:
        self.comm = comm
        self.validate = validate
        self.gpu_transport = gpu_transport
        self.nccl: Any = None  # made on the first GPU tensor (same point on every rank)
        self.stage: Any = None
        self.queue: collections.deque[Request] = collections.deque()

    def accept(self, item: Request) -> None:
        self.queue.append(item)

    def busy(self) -> bool:
        return bool(self.queue)

    def progress(self) -> bool:
        if not self.queue:
            return False
        req = self.queue.popleft()
        try:
            if self.validate:
                check_consistent(self.comm, req.meta)
            if req.meta.device == "gpu":
                self._gpu(req)
            elif req.meta.kind == "broadcast":
                self.comm.Bcast(byte_view(req.tensor), root=req.meta.root)
            else:
                if req.output is not req.tensor:
                    req.output[...] = req.tensor
                self._reduce_host(req.output, req.meta)
        except Exception as err:
            req.handle.set_error(err)
        else:
            req.handle.set_result(req.output)
        return True

    def _gpu(self, req: Request) -> None:
        """NCCL on the device, or the host path through pinned memory."""
        from ddpbench import gpu

        meta, op = req.meta, ReduceOp(req.meta.op)
        if self.gpu_transport == "host":
            self.stage = self.stage or gpu.HostStage()
            host = self.stage.to_host(req.tensor)
            if meta.kind == "broadcast":
                self.comm.Bcast(byte_view(host), root=meta.root)
            else:
                self._reduce_host(host, meta)
            gpu.HostStage.to_device(host, req.output)
            return
        if self.nccl is None:
            self.nccl = gpu.NcclComm(self.comm, req.tensor.device.id)
        if meta.kind == "broadcast":
            self.nccl.bcast(req.tensor, meta.root)
            return
        gpu.scale_copy(req.tensor, req.output, meta.prescale)
        self.nccl.allreduce(req.output.reshape(-1), op)
        gpu.scale_(req.output, meta.postscale)

    def _reduce_host(self, buf: np.ndarray, meta: Meta) -> None:
        from mpi4py import MPI

        op = ReduceOp(meta.op)
        scale_(buf, meta.prescale)
        if buf.dtype in HALF_DTYPES:
            mpitype, mpiop = _half_op(op, buf.dtype.name)
            self.comm.Allreduce(MPI.IN_PLACE, [byte_view(buf), buf.size, mpitype], op=mpiop)
        else:
            self.comm.Allreduce(MPI.IN_PLACE, buf.reshape(-1), op=getattr(MPI, _MPI_OPS[op]))
        scale_(buf, meta.postscale)

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
    capabilities = frozenset({"broadcast", "push_pull"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._comm = self._engine.call(self._world.role_comm.Dup).wait()
        self._proto = _MPIProtocol(self._comm, self.options.check_consistency,
                                   self.options.gpu_transport)
        self._engine.register(self._proto)

    def _release(self) -> None:
        self._engine.unregister(self._proto)
        nccl = self._proto.nccl
        self._engine.call(lambda: (nccl and nccl.close(), self._comm.Free())).wait()
