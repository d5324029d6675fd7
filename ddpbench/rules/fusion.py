"""Horovod's planning rules, shared by the ``horovod`` backend and the simulator.

Both sides plan the same way, so that a real run and a simulation of the same burst fuse
the same tensors:

- **Cycle grid.** The background loop starts a cycle at most every ``cycle_time``: it sleeps
  until ``last_cycle_start + cycle_time`` and, when the previous cycle's work ran longer,
  starts at once (Horovod's ``RunLoopOnce`` in ``horovod/common/operations.cc``). A tensor
  joins the first cycle that starts after every rank has submitted it.
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

__all__ = ["fuse_responses", "next_cycle_start"]

T = TypeVar("T")


def next_cycle_start(last_start: float, now: float, cycle_s: float) -> float:
    """Return when the cycle after one that started at ``last_start`` begins, seen at ``now``.

    A cycle begins ``cycle_s`` after the previous one began, or at once when that moment has
    passed (the previous cycle's work ran past it).
    """
    return max(now, last_start + cycle_s)


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
