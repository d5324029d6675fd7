"""The ``byteps`` backend: push-pull to summation servers with ByteScheduler's credits.

Every array is cut into partitions of ``partition_bytes`` bytes (rounded down to whole
elements, the last one shorter), placed round-robin over the servers by one counter across
keys in order of first use. Each partition is one merged push-pull. With ``credit_bytes``
> 0, partitions leave in priority order (the caller's priority, larger first) with at most
``credit_bytes`` bytes on the wire (a partition larger than the credit goes alone);
``credit_bytes=0`` turns scheduling off: FIFO, no limit. ``push_pull(..., average=True)``
is ``op=AVERAGE``.
"""

from __future__ import annotations

from typing import Any

from ddpbench.api import Handle, ReduceOp, register
from ddpbench.backends.ps.placement import Part, byteps_parts
from ddpbench.backends.ps.transport import Gate
from ddpbench.backends.ps.worker import PSStore
from ddpbench.contract import BytepsKnobs

__all__ = ["BytePSStore"]


@register("byteps")
class BytePSStore(PSStore):
    """Partitioned push-pull with credit-based priority scheduling (0 = FIFO).

    Options:
        partition_bytes: bytes per partition (default 4,096,000).
        credit_bytes: bytes in flight per worker; 0 (default) = no scheduling, FIFO.
        servers, bandwidth_gbps, latency_us, trace: see :class:`ddpbench.contract.PSKnobs`.
    """

    Options = BytepsKnobs
    options: BytepsKnobs

    def split(self, key: int, declared: int, numel: int, itemsize: int) -> list[Part]:
        size = max(1, self.options.partition_bytes // itemsize)
        return byteps_parts(declared, numel, size, self.num_servers)

    def schedule(self, priority: int, part: Part, nbytes: int) -> tuple[int, Gate | None, float]:
        credit = self.options.credit_bytes
        if credit == 0:
            return 0, None, 1.0
        return priority, self.gate("credit", credit), float(nbytes)

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
