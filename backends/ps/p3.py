"""The ``p3`` backend: Priority-based Parameter Propagation (Jayarajan et al., SysML 2019).

Every array is cut into slices of at most ``slice_params`` elements; slice i of all slices
seen so far (one counter across keys, in order of first use) lives on server ``i % S``.
Each slice is one merged push-pull message carrying the caller's priority (trainers pass
``-layer_index``). The engine drains a priority queue, larger priority first, with at most
``water_mark`` slices on the wire per destination (a server acknowledges each slice on
arrival), so a slice of an early layer that becomes ready late still overtakes the queued
slices of later layers; preemption happens only at slice boundaries. A server answers a
slice when all workers' copies have arrived.

P3 updates the weights on the workers: ``set_optimizer`` is not supported.
"""

from __future__ import annotations

from typing import Any

from ddpbench.api import NotSupportedError, register
from ddpbench.backends.ps.placement import Part, p3_parts
from ddpbench.backends.ps.transport import Gate
from ddpbench.backends.ps.worker import PSStore
from ddpbench.contract import P3Knobs

__all__ = ["P3Store"]


@register("p3")
class P3Store(PSStore):
    """Sliced, prioritised push-pull with a water mark per destination.

    Options:
        slice_params: elements per slice (default 40,000).
        water_mark: slices in flight per destination (default 10).
        servers, bandwidth_gbps, latency_us, trace: see :class:`ddpbench.contract.PSKnobs`.
    """

    Options = P3Knobs
    options: P3Knobs

    def split(self, key: int, declared: int, numel: int, itemsize: int) -> list[Part]:
        return p3_parts(key, numel, self.options.slice_params, self.num_servers)

    def schedule(self, priority: int, part: Part, nbytes: int) -> tuple[int, Gate | None, float]:
        return priority, self.gate(part.server, self.options.water_mark), 1.0

    def set_optimizer(self, optimizer: Any) -> None:
        """Raise: P3 updates on the workers.

        Raises:
            NotSupportedError: always.
        """
        raise NotSupportedError(
            "set_optimizer is not supported by backend 'p3': P3 servers only sum slices and "
            "the workers apply the update to the returned gradients; use 'kvstore' for "
            "server-side updates"
        )
