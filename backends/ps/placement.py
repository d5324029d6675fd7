"""Where each part of an array goes: the placement rules of the parameter-server backends.

These functions are the rules themselves, free of MPI: the real backends
(:mod:`.kvstore`, :mod:`.p3`, :mod:`.byteps`) and the simulator's strategies both call them,
so a simulated point places every byte where the real backend does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Part", "even_split", "round_robin"]


@dataclass(frozen=True)
class Part:
    """One part of an array: elements ``[offset, offset + count)`` go to server ``server``."""

    offset: int
    count: int
    server: int


def round_robin(numel: int, size: int, counter: Callable[[], int], servers: int) -> list[Part]:
    """Cut ``numel`` elements into pieces of ``size``, the server of each from ``counter``."""
    return [Part(lo, min(size, numel - lo), counter() % servers)
            for lo in range(0, numel, size)]


def even_split(numel: int, servers: int) -> list[Part]:
    """``np.array_split`` shares: part i, on server i."""
    base, extra = divmod(numel, servers)
    parts, off = [], 0
    for i in range(servers):
        cnt = base + (1 if i < extra else 0)
        parts.append(Part(off, cnt, i))
        off += cnt
    return parts
