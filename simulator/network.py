"""The network: full-duplex host NICs on a non-blocking switch, one message at a time per link.

A transfer occupies the sender's uplink and the receiver's downlink for ``nbytes / bandwidth``
and arrives ``latency`` later (cut-through switching: the switch adds no store-and-forward
delay). The unit of transfer is one message (a slice, a partition, a ring chunk); there are
no packets. Each host's uplink is a :class:`Sender` process serving a priority queue; a
receiver's downlink is a :class:`Port`, granted to waiting senders by (priority, sequence).
Every tie breaks on ``(time, priority, sequence number)``, so a run is deterministic.

Oversubscription: hosts sit in racks of ``rack_size``; traffic between racks also holds one of
``rack_size / oversubscription`` full-rate slots of the source rack's uplink and of the
destination rack's downlink (1.0 = non-blocking, the default).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

import simpy

__all__ = ["CountingEnvironment", "Gate", "Message", "Network", "Port", "Sender"]


class CountingEnvironment(simpy.Environment):
    """A simpy environment that counts the events it processes (for benchmarks and tests)."""

    def __init__(self) -> None:
        super().__init__()
        self.events = 0

    def step(self) -> None:
        self.events += 1
        super().step()


class Port:
    """A link direction that carries one message at a time; waiters queue by priority.

    ``acquire`` returns ``None`` when the port was free (taken at once, no event) or an event
    that fires when the port is handed over. ``release`` hands the port to the best waiter.
    """

    __slots__ = ("env", "busy", "_waiters", "slots")

    def __init__(self, env: simpy.Environment, slots: int = 1) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.env = env
        self.slots = slots
        self.busy = 0
        self._waiters: list[tuple[float, int, simpy.Event]] = []

    def acquire(self, prio: float, seq: int) -> simpy.Event | None:
        if self.busy < self.slots:
            self.busy += 1
            return None
        ev = self.env.event()
        heapq.heappush(self._waiters, (prio, seq, ev))
        return ev

    def release(self) -> None:
        if self._waiters:
            heapq.heappop(self._waiters)[2].succeed()
        else:
            self.busy -= 1


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
                 "on_arrive", "data")

    def __init__(self, src: int, dst: int, nbytes: int, priority: float, kind: str, layer: int,
                 on_arrive: Callable[[Message], None], data: Any = None,
                 gate: Gate | None = None, cost: float = 1.0) -> None:
        self.src, self.dst, self.nbytes, self.priority = src, dst, nbytes, priority
        self.kind, self.layer, self.on_arrive, self.data = kind, layer, on_arrive, data
        self.gate, self.cost = gate, cost
        self.seq = 0


class Sender:
    """A host's uplink: a generator process that sends its queue, best priority first."""

    def __init__(self, net: Network, host: int) -> None:
        self.net, self.host = net, host
        self._ready: list[tuple[float, int, Message]] = []
        self._idle: simpy.Event | None = None
        net.env.process(self._run())

    def send(self, msg: Message) -> None:
        """Queue ``msg``; larger ``priority`` goes first, equal priorities in FIFO order."""
        msg.seq = self.net.next_seq()
        self.requeue((-msg.priority, msg.seq, msg))

    def requeue(self, entry: tuple[float, int, Message]) -> None:
        heapq.heappush(self._ready, entry)
        if self._idle is not None:
            self._idle.succeed()
            self._idle = None

    def _pop(self) -> Message | None:
        ready = self._ready
        while ready:
            entry = heapq.heappop(ready)
            msg = entry[2]
            gate = msg.gate
            if gate is not None:
                if not gate.fits(msg.cost):
                    heapq.heappush(gate.blocked, entry)
                    continue
                gate.used += msg.cost
            return msg
        return None

    def _run(self):
        net = self.net
        env = net.env
        while True:
            msg = self._pop()
            if msg is None:
                self._idle = env.event()
                yield self._idle
                continue
            ports = net.route(msg.src, msg.dst)
            for port in ports:
                ev = port.acquire(-msg.priority, msg.seq)
                if ev is not None:
                    yield ev
            start = env.now
            yield env.timeout(msg.nbytes / net.bandwidth)
            for port in ports:
                port.release()
            net.record(msg, start, env.now)
            env.timeout(net.latency, msg).callbacks.append(_deliver)


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
        oversubscription: core oversubscription ratio (>= 1; 1 = non-blocking).
        rack_size: hosts per rack (only used when oversubscription > 1).
    """

    def __init__(self, env: simpy.Environment, nhosts: int, bandwidth: float, latency: float,
                 record: Callable[[Message, float, float], None],
                 oversubscription: float = 1.0, rack_size: int = 16) -> None:
        if bandwidth <= 0:
            raise ValueError(f"bandwidth must be > 0 bytes/s, got {bandwidth}")
        if latency < 0:
            raise ValueError(f"latency must be >= 0 s, got {latency}")
        if oversubscription < 1:
            raise ValueError(f"oversubscription must be >= 1, got {oversubscription}")
        self.env, self.bandwidth, self.latency, self.record = env, bandwidth, latency, record
        self._seq = 0
        self.down = [Port(env) for _ in range(nhosts)]
        self.senders = [Sender(self, h) for h in range(nhosts)]
        self.rack_size = rack_size
        self._racks = None
        if oversubscription > 1 and nhosts > rack_size:
            slots = max(1, int(rack_size / oversubscription))
            nracks = -(-nhosts // rack_size)
            self._racks = ([Port(env, slots) for _ in range(nracks)],
                           [Port(env, slots) for _ in range(nracks)])

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def route(self, src: int, dst: int) -> list[Port]:
        """The ports a transfer from ``src`` to ``dst`` holds (besides the sender's uplink)."""
        if self._racks is not None:
            rs, rd = src // self.rack_size, dst // self.rack_size
            if rs != rd:
                return [self._racks[0][rs], self._racks[1][rd], self.down[dst]]
        return [self.down[dst]]

    def send(self, msg: Message) -> None:
        self.senders[msg.src].send(msg)
