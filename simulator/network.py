"""The network: full-duplex host NICs on a non-blocking switch, one message at a time per link.

A transfer occupies the sender's uplink and the receiver's downlink for ``nbytes / bandwidth``
and arrives ``latency`` later (cut-through switching: the switch adds no store-and-forward
delay). The unit of transfer is one message (a slice, a partition, a ring chunk); there are
no packets. Each host's uplink is a :class:`Sender` process serving a priority queue; a
receiver's downlink is a :class:`Port`, granted to waiting senders by (priority, sequence).
Every tie breaks on ``(time, priority, sequence number)``, so a run is deterministic.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

import simpy

__all__ = ["CountingEnvironment", "Gate", "Link", "Message", "Network", "Port", "Sender"]


class CountingEnvironment(simpy.Environment):
    """A simpy environment that counts the events it processes (for benchmarks and tests)."""

    def __init__(self) -> None:
        super().__init__()
        self.events = 0

    def step(self) -> None:
        self.events += 1
        super().step()


class Link:
    """A resource that carries one message at a time; waiters queue by (priority, sequence).

    ``acquire`` returns ``None`` when the link was free (taken at once, no event) or an event
    that fires when the link is handed over. ``release`` hands it to the best waiter.
    """

    __slots__ = ("env", "busy", "_waiters")

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.busy = False
        self._waiters: list[tuple[float, int, simpy.Event]] = []

    def acquire(self, prio: float, seq: int) -> simpy.Event | None:
        if not self.busy:
            self.busy = True
            return None
        ev = self.env.event()
        heapq.heappush(self._waiters, (prio, seq, ev))
        return ev

    def release(self) -> None:
        if self._waiters:
            heapq.heappop(self._waiters)[2].succeed()
        else:
            self.busy = False


class Port:
    """A host's downlink: granted to one sender at a time.

    Idle senders whose best message for this host found it busy register here with that
    message's priority and the sequence number of when it started waiting; on release the
    port goes straight to the best sender still waiting (higher priority first, then the one
    waiting longest: round robin among equals, as fair switch arbitration gives), so a freed
    downlink never idles while someone has data for it.
    """

    __slots__ = ("host", "busy", "_waiters")

    def __init__(self, host: int) -> None:
        self.host = host
        self.busy = False
        self._waiters: list[tuple[float, int, int, Sender]] = []

    def register(self, key: float, seq: int, sender: Sender) -> None:
        heapq.heappush(self._waiters, (key, seq, sender.gen, sender))

    def release(self) -> None:
        waiters = self._waiters
        while waiters:
            _, _, gen, sender = heapq.heappop(waiters)
            if sender.gen == gen:
                if sender.waiting:
                    sender.wake(self)
                else:  # busy sending: the port waits for it (at most one message time)
                    sender._reserved.append(self)
                return
        self.busy = False


class Gate:
    """A limit on what one sender may have in flight (P3's water mark, BytePS's credit).

    A message with ``cost`` passes when ``used + cost <= limit`` or nothing is in flight (so a
    message larger than the limit still goes, alone). The receiver side calls :meth:`release`
    when the message's round trip is over.
    """

    __slots__ = ("limit", "used", "blocked", "sender")

    def __init__(self, limit: float, sender: Sender) -> None:
        self.limit = limit
        self.used = 0.0
        self.blocked: list[tuple[float, int, Message]] = []
        self.sender = sender

    def fits(self, cost: float, extra: float = 0.0) -> bool:
        used = self.used + extra
        return used == 0 or used + cost <= self.limit

    def release(self, cost: float) -> None:
        self.used -= cost
        moved = 0.0
        while self.blocked and self.fits(self.blocked[0][2].cost, moved):
            entry = heapq.heappop(self.blocked)
            moved += entry[2].cost
            self.sender.requeue(entry)


class Message:
    """One transfer: ``on_arrive(msg)`` runs at the receiver when it has fully arrived."""

    __slots__ = ("src", "dst", "nbytes", "priority", "seq", "kind", "layer", "gate", "cost",
                 "on_arrive", "data", "waiting_since")

    def __init__(self, src: int, dst: int, nbytes: int, priority: float, kind: str, layer: int,
                 on_arrive: Callable[[Message], None], data: Any = None,
                 gate: Gate | None = None, cost: float = 1.0) -> None:
        self.src, self.dst, self.nbytes, self.priority = src, dst, nbytes, priority
        self.kind, self.layer, self.on_arrive, self.data = kind, layer, on_arrive, data
        self.gate, self.cost = gate, cost
        self.seq = 0
        self.waiting_since = 0


class Sender:
    """A host's uplink: a generator process sending its queued messages one at a time.

    Messages wait in one priority queue per destination (virtual output queues, as one
    connection per peer gives), so a busy receiver does not hold up traffic to others. The
    sender sends the best message (larger ``priority`` first, then oldest) among those whose
    receiver's downlink is free; when every receiver it has data for is busy, it registers
    at each of their ports and the first one freed is granted to it. A message more urgent
    than the one being sent registers too, reserving its receiver's next turn.
    """

    def __init__(self, net: Network, host: int) -> None:
        self.net, self.host = net, host
        self._voq: dict[int, list[tuple[float, int, Message]]] = {}
        self.waiting = False
        self.gen = 0
        self._ev: simpy.Event | None = None
        self._reserved: list[Port] = []
        net.env.process(self._run())

    def send(self, msg: Message) -> None:
        """Queue ``msg``; larger ``priority`` goes first, equal priorities in FIFO order."""
        msg.seq = self.net.next_seq()
        self.requeue((-msg.priority, msg.seq, msg))

    def requeue(self, entry: tuple[float, int, Message]) -> None:
        heap = self._voq.get(entry[2].dst)
        if heap is None:
            heap = self._voq[entry[2].dst] = []
        heapq.heappush(heap, entry)
        if self.waiting:
            self.wake(None)

    def wake(self, port: Port | None) -> None:
        """Resume the idle sender, granting it ``port`` (or None: a new message came)."""
        self.waiting = False
        self.gen += 1
        ev, self._ev = self._ev, None
        ev.succeed(port)

    @staticmethod
    def _head(heap: list[tuple[float, int, Message]]) -> tuple[float, int, Message] | None:
        while heap:
            entry = heap[0]
            msg = entry[2]
            gate = msg.gate
            if gate is not None and not gate.fits(msg.cost):
                heapq.heappop(heap)
                heapq.heappush(gate.blocked, entry)
                continue
            return entry
        return None

    def _run(self):
        net = self.net
        env, down, voq = net.env, net.down, self._voq
        while True:
            self.gen += 1  # registrations made before this choice are stale from now on
            best = port = None
            if self._reserved:
                reserved, self._reserved = self._reserved, []
                for p in reserved:
                    entry = self._head(voq[p.host])
                    if entry is not None and (best is None or entry < best):
                        if port is not None:
                            port.release()
                        best, port = entry, p
                    else:
                        p.release()
            if best is None:
                heads = []
                for heap in voq.values():
                    entry = self._head(heap)
                    if entry is not None:
                        heads.append(entry)
                        if not down[entry[2].dst].busy and (best is None or entry < best):
                            best = entry
                if best is None:
                    for entry in heads:
                        self._register(entry)
                    self.waiting = True
                    self._ev = env.event()
                    port = yield self._ev
                    if port is None:
                        continue
                    best = self._head(voq[port.host])
                    if best is None:
                        port.release()
                        continue
                else:
                    port = down[best[2].dst]
                    port.busy = True
                    for entry in heads:
                        # A strictly more urgent message waits for a busy receiver: reserve
                        # that receiver's next turn (P3's priorities hold across senders).
                        if entry[0] < best[0] and down[entry[2].dst].busy:
                            self._register(entry)
            heapq.heappop(voq[port.host])
            msg = best[2]
            if msg.gate is not None:
                msg.gate.used += msg.cost
            start = env.now
            yield env.timeout(msg.nbytes / net.bandwidth)
            port.release()
            net.record(msg, start, env.now)
            env.timeout(net.latency, msg).callbacks.append(_deliver)
            # Choose the next message only after every transmission ending now has released
            # its port; otherwise the first sender to finish sees ports as busy that are
            # free at this same instant and skips ahead to another receiver.
            yield env.timeout(0)

    def _register(self, entry: tuple[float, int, Message]) -> None:
        msg = entry[2]
        if not msg.waiting_since:
            msg.waiting_since = self.net.next_seq()
        self.net.down[msg.dst].register(entry[0], msg.waiting_since, self)


def _deliver(ev: simpy.Event) -> None:
    msg = ev.value
    msg.on_arrive(msg)


class Network:
    """Hosts 0..nhosts-1 with NICs of ``bandwidth`` bytes/s per direction and ``latency`` s.

    Args:
        env: the simulation environment.
        nhosts: number of hosts.
        bandwidth: bytes per second per direction, > 0.
        latency: seconds from the end of a transmission to its arrival, >= 0.
        record: ``record(msg, start, end)`` is called for each finished transmission.
    """

    def __init__(self, env: simpy.Environment, nhosts: int, bandwidth: float, latency: float,
                 record: Callable[[Message, float, float], None]) -> None:
        if bandwidth <= 0:
            raise ValueError(f"bandwidth must be > 0 bytes/s, got {bandwidth}")
        if latency < 0:
            raise ValueError(f"latency must be >= 0 s, got {latency}")
        self.env, self.bandwidth, self.latency, self.record = env, bandwidth, latency, record
        self._seq = 0
        self.down = [Port(h) for h in range(nhosts)]
        self.senders = [Sender(self, h) for h in range(nhosts)]

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def send(self, msg: Message) -> None:
        self.senders[msg.src].send(msg)
