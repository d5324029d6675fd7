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
"""

from __future__ import annotations

import collections
import heapq
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["Sockets"]


class _Addressed(Protocol):
    dst: int


M = TypeVar("M", bound=_Addressed)


class Sockets(Generic[M]):
    """The sending thread's queue, the sockets' occupancy and the wire's order.

    Args:
        hwm: messages a socket holds before the thread blocks (ZMQ's send high-water mark).
    """

    def __init__(self, hwm: int) -> None:
        if hwm < 1:
            raise ValueError(f"hwm must be >= 1 message, got {hwm}")
        self.hwm = hwm
        self.ready: list[tuple[Any, ...]] = []  # (sort key..., message), best first
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
        heapq.heappush(self.ready, entry)
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
            msg = heapq.heappop(self.ready)[-1]
            if self.pipes[msg.dst] >= self.hwm:
                self.blocked = msg
                return
            self.pipes[msg.dst] += 1
            self.wire.append((now, msg, True))
