"""Horovod's planning rules, shared by the ``horovod`` backend and the simulator.

Both sides plan the same way, so that a real run and a simulation of the same burst fuse
the same tensors:

- **Cycle grid.** The background loop starts a cycle at most every ``cycle_time``: it sleeps
  until ``last_cycle_start + cycle_time`` and, when the previous cycle's work ran longer,
  starts at once (Horovod's ``RunLoopOnce`` in ``horovod/common/operations.cc``). A tensor
  joins the first cycle that starts after every rank has submitted it.
- **Threshold rounding.** On a homogeneous cluster (every host runs as many ranks) the
  threshold used is rounded up to a multiple of ``local_size x 8 x 64`` bytes, so that the
  buffer holds a multiple of ``FUSION_BUFFER_ATOMIC_UNIT`` (64) float64 elements per local
  rank (``Controller::TensorFusionThresholdBytes``, ``horovod/common/controller.cc``;
  ``horovod/common/common.h``).
- **GPU padding.** A Horovod built with CUDA batches its device copies
  (``HOROVOD_BATCH_D2D_MEMCOPIES``, on by default) and counts every tensor rounded up to 16
  bytes (``BATCHED_D2D_PADDING``) against the threshold; its tensors lie at 16-byte offsets
  in the fusion buffer, and the NCCL allreduce covers the pads too
  (``FuseResponses`` in controller.cc, ``MemcpyInFusionBuffer`` in
  ``horovod/common/ops/gpu_operations.cc``).
- **Fusion look-ahead.** The responses of one cycle are fused in order: a response takes
  the following compatible ones (same kind, dtype, device, op and factors) while the fused
  size stays within the threshold. An incompatible response is skipped over, as long as the
  bytes skipped plus the fused bytes fit the threshold; the first compatible response that
  does not fit ends the look-ahead, so small tensors never overtake a large one
  (``Controller::FuseResponses`` in ``horovod/common/controller.cc``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

__all__ = ["BATCHED_D2D_PADDING", "FUSION_BUFFER_ATOMIC_UNIT", "fuse_responses",
           "fusion_threshold_bytes", "next_cycle_start", "padded_bytes", "padded_offsets"]

FUSION_BUFFER_ATOMIC_UNIT = 64
"""Elements (of the widest type, float64) a fusion buffer's size is a multiple of, per
local rank (horovod/common/common.h)."""

BATCHED_D2D_PADDING = 16
"""Bytes each GPU tensor is rounded up to in the fusion buffer
(horovod/common/ops/cuda/cuda_kernels.h)."""

T = TypeVar("T")


def next_cycle_start(last_start: float, now: float, cycle_s: float) -> float:
    """Return when the cycle after one that started at ``last_start`` begins, seen at ``now``.

    A cycle begins ``cycle_s`` after the previous one began, or at once when that moment has
    passed (the previous cycle's work ran past it).
    """
    return max(now, last_start + cycle_s)


def fusion_threshold_bytes(threshold: int, local_size: int, homogeneous: bool = True) -> int:
    """Return the fusion threshold Horovod uses for ``threshold`` (HOROVOD_FUSION_THRESHOLD).

    On a homogeneous cluster it is rounded up to a multiple of ``local_size x 8 x 64``
    bytes (``Controller::TensorFusionThresholdBytes``): 128 MiB stays 128 MiB at 1, 2, 4
    or 8 ranks per host and becomes 134,218,752 bytes at 3. Otherwise it is used as given.
    """
    if not homogeneous:
        return threshold
    div = max(1, local_size) * 8 * FUSION_BUFFER_ATOMIC_UNIT
    return -(-threshold // div) * div


def padded_bytes(nbytes: int, pad: int = BATCHED_D2D_PADDING) -> int:
    """Return ``nbytes`` rounded up to a multiple of ``pad`` (a GPU tensor's share of the
    fusion buffer; controller.cc ``FuseResponses``)."""
    return -(-nbytes // pad) * pad


def padded_offsets(sizes: Sequence[int], pad: int = BATCHED_D2D_PADDING) -> tuple[list[int], int]:
    """Return each tensor's byte offset in a GPU fusion buffer and the buffer's length:
    every tensor starts at a multiple of ``pad`` bytes (gpu_operations.cc
    ``MemcpyInFusionBuffer`` with batched copies)."""
    offsets, off = [], 0
    for n in sizes:
        offsets.append(off)
        off += padded_bytes(n, pad)
    return offsets, off


def fuse_responses(items: Sequence[T], threshold: int, nbytes: Callable[[T], int],
                   key: Callable[[T], Hashable | None]) -> list[list[T]]:
    """Group ``items`` (one cycle's responses, in order) into fused responses.

    Args:
        items: the responses in the order the cycle lists them.
        threshold: bytes a fused response may hold (0: no fusion).
        nbytes: a response's payload in bytes (0 for one that carries no fused payload,
            such as a broadcast or an error, as Horovod counts them).
        key: what must be equal for two responses to fuse; ``None`` for a response that
            never fuses.

    Returns:
        The fused groups, each a list of items, in execution order.
    """
    queue = deque(items)
    groups: list[list[T]] = []
    while queue:
        first = queue.popleft()
        group = [first]
        k = key(first)
        if k is not None:
            size = nbytes(first)
            skipped: list[T] = []
            skipped_size = 0
            while queue:
                nxt = queue[0]
                n = nbytes(nxt)
                if key(nxt) == k and size + n <= threshold:
                    size += n
                    group.append(queue.popleft())
                    continue
                # Look past a response that does not fuse only while what was skipped
                # would itself have fitted; a compatible one that is too big always stops.
                skipped_size += n
                if size + skipped_size > threshold:
                    break
                skipped.append(queue.popleft())
            queue.extendleft(reversed(skipped))
        groups.append(group)
    return groups
