"""P3's sending thread and per-destination sockets, as one rule without a clock.

ps-lite as P3 runs it (ps-lite/src/van.cc ``Van::Sending``, ps-lite/src/zmq_van.h
``ZMQ_SNDHWM``): one sending thread pops the best queued message and hands it to the socket
of its destination, which holds at most ``hwm`` messages not yet on the wire; when that
socket is full the thread blocks on it, and every message behind it waits (head-of-line
blocking), whatever its priority or destination. The uplink takes the sockets' messages in
the order they were handed over. A server answers from its receiving thread straight into
its socket (``KVServer::Response`` calls ``Van::Send``): :meth:`Sockets.direct`.

The real transport (:mod:`ddpbench.backends.ps.transport`) and the simulator's sender
(:class:`ddpbench.simulator.network.Sender`) both drive this class, each with its own
clock (a time stamp travels with each handed-over message), so both send alike. It imports
nothing but the standard library.

The sending thread's queue is ps-lite's ``ThreadsafeQueue`` as P3's fork has it
(anandj91/p3, ps-lite/include/ps/internal/threadsafe_queue.h): a
``std::priority_queue<Message>`` whose comparator says ``l`` is below ``r`` when
``l.meta.priority <= r.meta.priority``. Priorities come out highest first; equal ones come
out in the order libstdc++'s binary heap leaves them (``std::push_heap`` moves a new
message above every equal one on its path to the root, ``std::pop_heap`` takes the left
child of two equal ones and sifts the last element back up above equal ones;
bits/stl_heap.h, ``__push_heap``, ``__adjust_heap``): not FIFO, but a deterministic order
that :class:`StlHeap` reproduces step for step. Five equal messages pushed 0..4 and then
popped come out 4, 2, 0, 1, 3. ``ties="fifo"`` (ddpbench's own variant) breaks ties by
the order they were queued instead.
"""

from __future__ import annotations

import collections
import heapq
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["FifoHeap", "StlHeap", "Sockets", "TIES"]

TIES = ("heap", "fifo")
"""How the sending thread orders equal priorities: ``"heap"`` as P3's ps-lite's
``std::priority_queue`` with its ``<=`` comparator (:class:`StlHeap`), ``"fifo"`` in the
order queued (:class:`FifoHeap`, ddpbench's own)."""


class _Addressed(Protocol):
    dst: int


M = TypeVar("M", bound=_Addressed)


class StlHeap:
    """libstdc++'s ``std::priority_queue`` under ps-lite's ``<=`` comparator, by priority only.

    Entries are tuples ``(-priority, ..., message)``; only ``entry[0]`` is compared. The
    comparator ``below(l, r)`` is P3's ``l.priority <= r.priority``, i.e. ``l[0] >= r[0]``,
    true for equal priorities both ways, which is what makes ties come out in heap order
    rather than FIFO. ``push`` is ``push_back`` then ``std::push_heap``; ``pop`` is
    ``std::pop_heap`` then ``pop_back`` (bits/stl_heap.h: ``__push_heap`` moves the hole
    up while the parent is below the value; ``__adjust_heap`` moves the hole from the root
    down to a leaf, taking the right child unless it is below the left, then pushes the
    former last element up from there).
    """

    __slots__ = ("a",)

    def __init__(self) -> None:
        self.a: list[tuple[Any, ...]] = []

    def __len__(self) -> int:
        return len(self.a)

    def __bool__(self) -> bool:
        return bool(self.a)

    def _sift_up(self, hole: int, top: int, value: tuple[Any, ...]) -> None:
        a = self.a
        key = value[0]
        parent = (hole - 1) // 2
        while hole > top and a[parent][0] >= key:  # below(parent, value)
            a[hole] = a[parent]
            hole = parent
            parent = (hole - 1) // 2
        a[hole] = value

    def push(self, entry: tuple[Any, ...]) -> None:
        """Add ``entry`` (``std::priority_queue::push``)."""
        self.a.append(entry)
        self._sift_up(len(self.a) - 1, 0, entry)

    def pop(self) -> tuple[Any, ...]:
        """Remove and return the top entry (``std::priority_queue::top`` and ``pop``)."""
        a = self.a
        n = len(a)
        if n == 0:
            raise IndexError("pop from an empty StlHeap")
        top = a[0]
        if n > 1:
            value = a[n - 1]
            a[n - 1] = top
            length, hole, child = n - 1, 0, 0
            while child < (length - 1) // 2:
                child = 2 * (child + 1)
                if a[child][0] >= a[child - 1][0]:  # below(right, left): take the left
                    child -= 1
                a[hole] = a[child]
                hole = child
            if length % 2 == 0 and child == (length - 2) // 2:
                child = 2 * (child + 1)
                a[hole] = a[child - 1]
                hole = child - 1
            self._sift_up(hole, 0, value)
        a.pop()
        return top


class FifoHeap:
    """Best first, equal priorities in the order queued (ddpbench's own ``ties="fifo"``).

    Entries are tuples ``(-priority, sequence, ..., message)`` ordered as tuples (heapq).
    """

    __slots__ = ("a",)

    def __init__(self) -> None:
        self.a: list[tuple[Any, ...]] = []

    def __len__(self) -> int:
        return len(self.a)

    def __bool__(self) -> bool:
        return bool(self.a)

    def push(self, entry: tuple[Any, ...]) -> None:
        """Add ``entry``."""
        heapq.heappush(self.a, entry)

    def pop(self) -> tuple[Any, ...]:
        """Remove and return the best entry."""
        return heapq.heappop(self.a)


def make_queue(ties: str) -> StlHeap | FifoHeap:
    """Return the sending thread's queue for ``ties`` (one of :data:`TIES`)."""
    if ties == "heap":
        return StlHeap()
    if ties == "fifo":
        return FifoHeap()
    raise ValueError(f"ties must be one of {list(TIES)}, got {ties!r}")


class Sockets(Generic[M]):
    """The sending thread's queue, the sockets' occupancy and the wire's order.

    Args:
        hwm: messages a socket holds before the thread blocks (ZMQ's send high-water mark).
        ties: how the thread's queue orders equal priorities (:data:`TIES`).
    """

    def __init__(self, hwm: int, ties: str = "heap") -> None:
        if hwm < 1:
            raise ValueError(f"hwm must be >= 1 message, got {hwm}")
        self.hwm = hwm
        # (-priority, sequence, ..., message), best first
        self.ready: StlHeap | FifoHeap = make_queue(ties)
        self.pipes: dict[int, int] = collections.defaultdict(int)
        # (time handed over, message, counted against its socket)
        self.wire: collections.deque[tuple[float, M, bool]] = collections.deque()
        self.blocked: M | None = None

    def queue(self, entry: tuple[Any, ...], now: float = 0.0) -> None:
        """Queue ``entry`` (sort keys, then the message last); the thread goes on if it can."""
        if self.blocked is None and not self.ready:
            # (the thread is idle: it hands this message over at once, without the heap)
            msg = entry[-1]
            if self.pipes[msg.dst] >= self.hwm:
                self.blocked = msg
            else:
                self.pipes[msg.dst] += 1
                self.wire.append((now, msg, True))
            return
        self.ready.push(entry)
        self._hand_over(now)

    def direct(self, msg: M, now: float = 0.0) -> None:
        """Put a server's reply on the wire behind what is there (not through the queue)."""
        self.wire.append((now, msg, False))

    def head_time(self) -> float | None:
        """Return when the wire's next message was handed over (None: nothing to send)."""
        return self.wire[0][0] if self.wire else None

    def take(self, now: float = 0.0) -> M | None:
        """Start the wire's next message at ``now``; its socket frees a place."""
        if not self.wire:
            return None
        _, msg, counted = self.wire.popleft()
        if counted:
            self.pipes[msg.dst] -= 1
        blocked = self.blocked
        if blocked is not None and self.pipes[blocked.dst] < self.hwm:
            self.blocked = None
            self.pipes[blocked.dst] += 1
            self.wire.append((now, blocked, True))
            self._hand_over(now)
        return msg

    def idle(self) -> bool:
        """Return True when nothing is queued, held or waiting for the wire."""
        return not (self.ready or self.wire or self.blocked is not None)

    def _hand_over(self, now: float) -> None:
        # The sending thread: best message first into its socket; stop at a full socket.
        while self.blocked is None and self.ready:
            msg = self.ready.pop()[-1]
            if self.pipes[msg.dst] >= self.hwm:
                self.blocked = msg
                return
            self.pipes[msg.dst] += 1
            self.wire.append((now, msg, True))
