"""The ``byteps`` backend: BytePS's push and pull to summation servers.

As BytePS does it (docs/fidelity/byteps.md): every array is cut into partitions of
``partition_bytes`` bytes (rounded down to whole elements, the last one shorter); partition
i of the d-th declared array (order of first use) has the key ``(d << 16) + i`` and lives
on server ``djb2(key) % S`` (byteps/common/operations.cc, global.cc). A partition is pushed,
the server acknowledges the push on arrival, the worker then pulls, and the server answers
the pull once every worker's push is in. ``push_pull(..., average=True)`` is
``op=AVERAGE``: the servers sum, and the worker divides the pulled sum by the number of
workers (byteps/torch/ops.cc: ``output.div_(size)``; integers ``floor_divide_``).

Scheduling (``scheduler``):

- ``"byteps"`` (default): partitions go to the network in the order they are ready.
  BytePS's own credit (``BYTEPS_SCHEDULING_CREDIT``, byteps/common/scheduled_queue.cc)
  orders only the local reduce stage of a multi-GPU host, which one process per host
  does not have; the network queue stays FIFO.
- ``"credit"``: ddpbench's own: ByteScheduler's core loop (bytescheduler/common/bytecore.py)
  on every worker over BytePS's partitions: a priority queue (the caller's priority, larger
  first) that starts the best partition while ``credit_params`` parameters of credit are
  left (never skipping it), and returns a partition's parameters to the credit when the
  server has acknowledged its push (BytePS's push response). ByteScheduler itself runs over
  MXNet's kvstore, rank 0 alone scheduling (``kvstore`` with ``scheduler="bytescheduler"``).
- ``"window"``: ddpbench's own, not an original's: at most ``credit_bytes`` bytes on the
  wire, released when a push arrives, priority order skipping what does not fit.

``merged_push_pull=True`` is ddpbench's own shortcut: one message each way.
"""

from __future__ import annotations

import heapq
from typing import Any

from ddpbench.api import Handle, ReduceOp, register
from ddpbench.backends.ps.transport import Gate
from ddpbench.backends.ps.wire import FLAG_ACK_ARRIVAL, Msg
from ddpbench.backends.ps.worker import PSStore
from ddpbench.contract import BytepsKnobs
from ddpbench.rules.placement import Part, byteps_parts

__all__ = ["BytePSStore"]


@register("byteps")
class BytePSStore(PSStore):
    """Partitioned push and pull, FIFO (BytePS) or scheduled (a credit loop, a window).

    Options:
        partition_bytes: bytes per partition (default 4,096,000).
        scheduler: "byteps" (default, FIFO), "credit" or "window" (ddpbench's own).
        credit_params: the credit loop's parameters in flight (default 4,000,000).
        credit_bytes: the window's bytes in flight (ddpbench's own).
        merged_push_pull: one merged message each way (ddpbench's own; default False).
        servers, bandwidth_gbps, latency_us, trace: see :class:`ddpbench.contract.PSKnobs`.
    """

    Options = BytepsKnobs
    options: BytepsKnobs
    ack_flag = FLAG_ACK_ARRIVAL
    average_on_worker = True  # byteps/torch/ops.cc: output.div_(size) after the pull

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._credit = float(self.options.credit_params)
        self._waiting: list[tuple[int, int, Msg, Part]] = []
        self._seq = 0

    def merged(self) -> bool:
        return self.options.merged_push_pull

    def split(self, key: int, declared: int, numel: int, itemsize: int) -> list[Part]:
        size = max(1, self.options.partition_bytes // itemsize)
        return byteps_parts(declared, numel, size, self.num_servers)

    def schedule(self, priority: int, part: Part, nbytes: int) -> tuple[int, Gate | None, float]:
        if self.options.scheduler == "byteps":
            return 0, None, 1.0
        if self.options.scheduler == "credit":
            return priority, None, 1.0  # the scheduler's queue order (:meth:`dispatch`)
        return priority, self.gate("credit", self.options.credit_bytes), float(nbytes)

    def prioritised_replies(self) -> bool:
        return self.options.scheduler == "window"

    def dispatch(self, msg: Msg, part: Part) -> None:
        if self.options.scheduler != "credit":
            super().dispatch(msg, part)
            return
        # ByteScheduler's core loop: queue by priority, start while the credit is positive.
        self._seq += 1
        heapq.heappush(self._waiting, (-msg.priority, self._seq, msg, part))
        msg.priority = 0  # on the wire a ps-lite push is FIFO
        self._run_scheduler()

    def pushed(self, part: Part) -> None:
        if self.options.scheduler == "credit":
            self._credit = min(self._credit + part.count, float(self.options.credit_params))
            self._run_scheduler()

    def _run_scheduler(self) -> None:
        while self._waiting and self._credit > 0:
            _, _, msg, part = heapq.heappop(self._waiting)
            self._credit -= part.count
            self._transport.send(msg)

    def push_pull_async(self, name: Any, tensor: Any, output: Any = None, *,
                        average: bool = False, **kwargs: Any) -> Handle:
        """BytePS's ``push_pull``: ``average=True`` means ``op=AVERAGE``."""
        if average:
            if kwargs.get("op", ReduceOp.SUM) not in (ReduceOp.SUM, "sum", ReduceOp.AVERAGE,
                                                      "average"):
                raise ValueError(f"average=True cannot be combined with op={kwargs['op']!r}")
            kwargs["op"] = ReduceOp.AVERAGE
        return super().push_pull_async(name, tensor, output, **kwargs)

    def push_pull(self, name: Any, tensor: Any, output: Any = None, *, average: bool = False,
                  **kwargs: Any) -> Any:
        """BytePS's ``push_pull``: ``average=True`` means ``op=AVERAGE``."""
        return self.push_pull_async(name, tensor, output, average=average, **kwargs).wait()
