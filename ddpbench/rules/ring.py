"""The ring allreduce: how a buffer is cut into chunks, and the steps every rank takes.

The rule is Baidu's ring allreduce (baidu-research/baidu-allreduce, collectives.cu,
``RingAllreduce``: the same chunks, the same send and receive chunk of every step):

- **Chunks.** An n-element buffer is cut into p chunks; chunk i holds n // p elements plus
  one for i < n % p (as ``np.array_split`` cuts), so chunk 0 is the largest and with
  n < p the trailing chunks are empty.
- **Reduce-scatter**, steps s = 0 .. p-2: rank r sends chunk (r - s) mod p to its right
  neighbour and combines the chunk (r - s - 1) mod p it receives from its left into its
  own, in the buffer's dtype. Chunk c is accumulated as x_c, then x_{c+1}, ..., x_{c-1},
  and is complete on rank c - 1.
- **Allgather**, steps s = 0 .. p-2: rank r sends chunk (r + 1 - s) mod p and stores the
  chunk (r - s) mod p it receives.

:func:`ring_steps` drives one rank through these steps without any transport: it yields
each step's (send, receive) byte views and combines a received chunk when it is resumed,
so a blocking caller (``horovod``: ``Sendrecv``) and a polled one (``collective``:
``Isend``/``Irecv`` advanced by the engine) run the same loop and send the same bytes.
:mod:`ddpbench.numerics` reproduces its sums bit for bit, and the simulated rings
(:mod:`ddpbench.simulator.strategies`) send the same chunks.
"""

from __future__ import annotations

from collections.abc import Callable, Generator

import numpy as np

__all__ = ["LINE", "Scratch", "bytes_per_rank", "chunk_sizes", "ring_chunks", "ring_steps",
           "send_chunk"]

LINE = 64
"""A cache line: a reduce-scatter step receives at the sender's offset within one."""


def ring_chunks(n: int, p: int) -> list[tuple[int, int]]:
    """Return (offset, count) of the p ring chunks of an n-element buffer.

    Chunk i holds n // p elements plus one for i < n % p, as ``np.array_split`` cuts; with
    n < p the trailing chunks are empty.
    """
    base, extra = divmod(n, p)
    out, off = [], 0
    for i in range(p):
        cnt = base + (1 if i < extra else 0)
        out.append((off, cnt))
        off += cnt
    return out


def chunk_sizes(n: int, p: int) -> np.ndarray:
    """Return the element count of each of the p ring chunks of ``n`` (:func:`ring_chunks`)."""
    base, extra = divmod(n, p)
    return base + (np.arange(p) < extra).astype(np.int64)


def send_chunk(rank: int, step: int, p: int) -> int:
    """Return the chunk ``rank`` sends in ``step`` (0 .. 2(p-1) - 1) of a ring of ``p``.

    Steps 0 .. p-2 are the reduce-scatter, (rank - step) mod p; the p - 1 after them the
    allgather, (rank + 1 - s) mod p in its own step s. A rank receives the chunk its left
    neighbour sends: ``send_chunk(rank - 1, step, p)``.
    """
    if step < p - 1:
        return (rank - step) % p
    return (rank + 1 - (step - (p - 1))) % p


def bytes_per_rank(n: int, p: int, itemsize: int) -> np.ndarray:
    """Return the bytes each rank sends in one ring allreduce of ``n`` elements.

    Rank r sends every chunk but (r + 1) mod p in the reduce-scatter and every chunk but
    (r + 2) mod p in the allgather.
    """
    sizes = chunk_sizes(n, p)
    r = np.arange(p)
    return (2 * n - sizes[(r + 1) % p] - sizes[(r + 2) % p]) * itemsize


class Scratch:
    """A receive buffer kept between ring allreduces, grown to the largest asked for.

    A fresh buffer of megabytes would cost a page fault per 4 KiB on first touch, and one
    over glibc's mmap threshold a new mapping, on every call. One ring uses it at a time.
    """

    def __init__(self) -> None:
        self._buf = np.empty(0, np.uint8)

    def __call__(self, nbytes: int) -> np.ndarray:
        """Return a uint8 buffer of exactly ``nbytes`` (a view of the kept one)."""
        if self._buf.size < nbytes:
            self._buf = np.empty(nbytes, np.uint8)
        return self._buf[:nbytes]


Steps = Generator[tuple[np.ndarray, np.ndarray], None, None]


def ring_steps(buf: np.ndarray, rank: int, size: int, combine: np.ufunc,
               scratch: Callable[[int], np.ndarray] | None = None) -> Steps:
    """Reduce the 1-D contiguous ``buf`` in place as rank ``rank`` of a ring of ``size``.

    Yields the 2(size - 1) steps in order, each as ``(send, recv)``: uint8 views of the
    bytes to send to the right neighbour, (rank + 1) mod size, and of where to receive the
    left neighbour's, (rank - 1) mod size. The caller completes the exchange, then resumes
    the generator, which first combines a reduce-scatter step's received chunk into
    ``buf`` as ``combine(received, own)``. A ring of one yields nothing.

    Args:
        buf: the rank's buffer; on return, the reduction of every rank's.
        rank: this rank's place in the ring.
        size: ranks in the ring.
        combine: the element-wise reduction (``np.add`` for a sum), applied in ``buf``'s
            dtype.
        scratch: ``scratch(nbytes)`` gives the reduce-scatter's receive buffer (a
            :class:`Scratch` keeps one between calls); None allocates one.
    """
    p, r = size, rank
    if p == 1:
        return
    chunks = ring_chunks(buf.size, p)
    raw, item = buf.view(np.uint8), buf.itemsize
    need = chunks[0][1] * item + LINE
    space = scratch(need) if scratch is not None else np.empty(need, np.uint8)
    at, there = raw.ctypes.data, space.ctypes.data

    def span(c: int) -> np.ndarray:
        off, cnt = chunks[c]
        return raw[off * item:(off + cnt) * item]

    for s in range(p - 1):
        ro, rc = chunks[send_chunk(r - 1, s, p)]
        # Received where the left neighbour's chunk lies within a cache line (its buffer is
        # laid out as this one): MPICH copies between processes at half speed otherwise.
        k = (at + ro * item - there) % LINE
        tmp = space[k:k + rc * item]
        yield span(send_chunk(r, s, p)), tmp
        combine(tmp.view(buf.dtype), buf[ro:ro + rc], out=buf[ro:ro + rc])
    for s in range(p - 1, 2 * (p - 1)):
        yield span(send_chunk(r, s, p)), span(send_chunk(r - 1, s, p))
