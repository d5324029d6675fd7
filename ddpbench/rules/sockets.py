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

__all__ = ["FifoHeap", "StlHeap", "Sockets", "TIES", "Wire"]

TIES = ("heap", "fifo")
"""How the sending thread orders equal priorities: ``"heap"`` as P3's ps-lite's
``std::priority_queue`` with its ``<=`` comparator (:class:`StlHeap`), ``"fifo"`` in the
order queued (:class:`FifoHeap`, ddpbench's own)."""


class _Addressed(Protocol):
    dst: int

    @property
    def nbytes(self) -> float: ...


M = TypeVar("M", bound=_Addressed)


class _Heap:
    """A list of entries kept as a heap; subclasses say how equal priorities come out."""

    __slots__ = ("a",)

    def __init__(self) -> None:
        self.a: list[tuple[Any, ...]] = []

    def __len__(self) -> int:
        return len(self.a)

    def __bool__(self) -> bool:
        return bool(self.a)


class StlHeap(_Heap):
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


class FifoHeap(_Heap):
    """Best first, equal priorities in the order queued (ddpbench's own ``ties="fifo"``).

    Entries are tuples ``(-priority, sequence, ..., message)`` ordered as tuples (heapq).
    """

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


class Wire(Generic[M]):
    """A host's uplink: messages in the order they entered their connections' kernel buffers.

    Every process of the host (a worker and its colocated server, each a ps-lite process of
    its own) feeds the one NIC; the sockets of each (:class:`Sockets`) put a message here
    when it enters the connection's kernel send buffer (or, without a buffer, when the
    thread hands it over). :meth:`take` starts the next on the wire; :meth:`finish` says it
    has left the host, which frees its bytes in the kernel buffer.
    """

    __slots__ = ("q", "air")

    def __init__(self) -> None:
        # (time it entered, message, its sockets or None for a reply outside them)
        self.q: collections.deque[tuple[float, M, Sockets[M] | None]] = collections.deque()
        self.air: dict[int, Sockets[M]] = {}  # id(message) -> its sockets, while sent

    def head_time(self) -> float | None:
        """Return when the next message entered (None: nothing to send)."""
        return self.q[0][0] if self.q else None

    def take(self, now: float = 0.0) -> M | None:
        """Start the next message at ``now``; without a kernel buffer its socket frees a place."""
        if not self.q:
            return None
        _, msg, owner = self.q.popleft()
        if owner is not None:
            if owner.sndbuf:
                self.air[id(msg)] = owner
            else:
                owner._taken(msg, now)
        return msg

    def finish(self, msg: M, now: float = 0.0) -> None:
        """Say ``msg`` (from :meth:`take`) has left at ``now``: its kernel bytes are free."""
        owner = self.air.pop(id(msg), None)
        if owner is not None:
            owner._finished(msg, now)


class Sockets(Generic[M]):
    """One ps-lite process's sending side: its thread's queue and one socket per connection.

    Each connection (destination) has its own ZeroMQ pipe of ``hwm`` messages and, with
    ``sndbuf`` > 0, its own kernel send buffer of ``sndbuf`` bytes: ZeroMQ's I/O thread
    takes one message at a time out of the pipe (a place frees as it does) and writes it
    into the connection's TCP socket as the kernel buffer has room; the buffer drains onto
    the host's :class:`Wire`. So a connection holds ``hwm`` messages in its pipe, one in
    ZeroMQ's engine and as many whole messages in the kernel as fit in ``sndbuf`` bytes (a
    message larger than the buffer goes in alone when it is empty). A message's bytes stay
    in the buffer until it has left the wire (:meth:`Wire.finish`). With ``sndbuf`` = 0 the
    kernel buffer is not modelled: a message holds its pipe place until it starts on the
    wire (ddpbench's simpler model). The thread blocks on a connection without room, and
    every message behind it waits (head-of-line blocking), whatever its destination.

    Args:
        hwm: messages a socket's pipe holds before the thread blocks (ZMQ's send high-water
            mark).
        ties: how the thread's queue orders equal priorities (:data:`TIES`).
        sndbuf: bytes of each connection's kernel send buffer (0: not modelled).
        wire: the host's uplink, shared with the host's other processes (None: a new one).
    """

    def __init__(self, hwm: int, ties: str = "heap", sndbuf: int = 0,
                 wire: Wire[M] | None = None) -> None:
        if hwm < 1:
            raise ValueError(f"hwm must be >= 1 message, got {hwm}")
        if sndbuf < 0:
            raise ValueError(f"sndbuf must be >= 0 bytes (0: not modelled), got {sndbuf}")
        self.hwm, self.sndbuf = hwm, sndbuf
        self.wire: Wire[M] = Wire() if wire is None else wire
        # (-priority, sequence, ..., message), best first
        self.ready: StlHeap | FifoHeap = make_queue(ties)
        self.pipes: dict[int, int] = collections.defaultdict(int)  # sndbuf 0: not yet sent
        # sndbuf > 0: per connection, handed over but not yet in the kernel (engine, pipe)
        self.held: dict[int, collections.deque[M]] = collections.defaultdict(collections.deque)
        self.kbytes: dict[int, float] = collections.defaultdict(float)
        self.blocked: M | None = None

    def queue(self, entry: tuple[Any, ...], now: float = 0.0) -> None:
        """Queue ``entry`` (sort keys, then the message last); the thread goes on if it can."""
        if self.blocked is None and not self.ready:
            # (the thread is idle: it hands this message over at once, without the heap)
            msg = entry[-1]
            if self._room(msg.dst):
                self._put(msg, now)
            else:
                self.blocked = msg
            return
        self.ready.push(entry)
        self._hand_over(now)

    def direct(self, msg: M, now: float = 0.0) -> None:
        """Put a reply on the wire behind what is there, outside the sockets (a variant)."""
        self.wire.q.append((now, msg, None))

    def head_time(self) -> float | None:
        """Return when the wire's next message entered (None: nothing to send)."""
        return self.wire.head_time()

    def take(self, now: float = 0.0) -> M | None:
        """Start the wire's next message at ``now`` (:meth:`Wire.take`)."""
        return self.wire.take(now)

    def finish(self, msg: M, now: float = 0.0) -> None:
        """Say ``msg`` has left the wire (:meth:`Wire.finish`)."""
        self.wire.finish(msg, now)

    def idle(self) -> bool:
        """Return True when nothing is queued, held, buffered or waiting for the wire."""
        return not (self.ready or self.wire.q or self.blocked is not None
                    or any(self.held.values()) or any(self.kbytes.values()))

    def _room(self, dst: int) -> bool:
        if not self.sndbuf:
            return self.pipes[dst] < self.hwm
        return len(self.held[dst]) <= self.hwm  # the engine's one and the pipe's hwm

    def _put(self, msg: M, now: float) -> None:
        if not self.sndbuf:
            self.pipes[msg.dst] += 1
            self.wire.q.append((now, msg, self))
            return
        self.held[msg.dst].append(msg)
        self._to_kernel(msg.dst, now)

    def _to_kernel(self, dst: int, now: float) -> None:
        held, sndbuf = self.held[dst], self.sndbuf
        while held and (not self.kbytes[dst] or self.kbytes[dst] + held[0].nbytes <= sndbuf):
            msg = held.popleft()
            self.kbytes[dst] += msg.nbytes
            self.wire.q.append((now, msg, self))

    def _taken(self, msg: M, now: float) -> None:
        self.pipes[msg.dst] -= 1
        self._unblock(now)

    def _finished(self, msg: M, now: float) -> None:
        self.kbytes[msg.dst] -= msg.nbytes
        self._to_kernel(msg.dst, now)
        self._unblock(now)

    def _unblock(self, now: float) -> None:
        blocked = self.blocked
        if blocked is not None and self._room(blocked.dst):
            self.blocked = None
            self._put(blocked, now)
            self._hand_over(now)

    def _hand_over(self, now: float) -> None:
        # The sending thread: best message first into its socket; stop at a full socket.
        while self.blocked is None and self.ready:
            msg = self.ready.pop()[-1]
            if not self._room(msg.dst):
                self.blocked = msg
                return
            self._put(msg, now)
