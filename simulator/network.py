"""The network: full-duplex host NICs on a non-blocking switch with output-port queues.

Optionally oversubscribed: racks of hosts whose links to the core carry less than the sum
of their hosts' NICs (see :class:`Network`); every hop is such a port.

A message (a slice, a partition, a ring chunk; there are no packets) leaves its sender's
uplink in ``nbytes / bandwidth`` and the sender moves on to its next message: the switch
buffers what the receiver cannot take yet, as a switch with large buffers does (or, given a
shallow buffer on a lossy transport, drops the windows of flows past what it holds:
:class:`IncastPort`). Each host's
uplink is a :class:`Sender` process serving a priority queue (larger priority first, then
FIFO). Each host's downlink is a :class:`Port`, the switch's output port towards that host:
it carries one message at a time for ``nbytes / bandwidth``, cut-through (a message can
start down as soon as it starts up), and when it frees it takes the best message waiting
there by (priority, arrival time, sequence number); there is no preemption inside a
message. A message is delivered ``latency`` after the port has carried it. Every tie breaks
on (time, priority, sequence number), so a run is deterministic. Where every message is
equal on the wire (the strategy says so: :meth:`Network.use_fifo_ports`), a port is plain
FIFO and messages that reach it in the same instant go in the order they reach it, which
is as deterministic and spares an event per contended message.

``backends/ps/transport.py`` paces the real transport with the same model (a token bucket per
uplink, a priority queue per downlink, latency after the downlink), so that simulated and
real runs of the parameter-server backends can be compared message for message.
"""

from __future__ import annotations

import collections
import heapq
from collections.abc import Callable
from typing import Any

import simpy

from ddpbench import contract
from ddpbench.rules.sockets import Sockets, Wire

__all__ = ["CountingEnvironment", "Gate", "IncastPort", "Link", "Message", "Network", "Port",
           "Sender", "call_later", "ecmp_path"]


class CountingEnvironment(simpy.Environment):
    """A simpy environment that counts the events it processes (for benchmarks and tests).

    Its heap holds ``(time, priority, id, function, value)``: a scheduled callback
    (:func:`call_later`, the network's per-message events) is a function and its value, no
    event object; a simpy event is ``_fire`` and the event, which runs its callbacks as
    :meth:`simpy.Environment.step` does (and crashes on an undefused failure). ``run()`` to
    exhaustion processes events in a loop of its own, without a method call per event.
    """

    def __init__(self) -> None:
        super().__init__()
        self.events = 0

    def schedule(self, event: simpy.Event, priority: int = simpy.core.NORMAL,
                 delay: float = 0) -> None:
        queue: Any = self._queue  # simpy declares 4-tuples; this heap holds 5-tuples
        heapq.heappush(queue, (self._now + delay, priority, next(self._eid), _fire, event))

    def step(self) -> None:
        try:
            entry: Any = heapq.heappop(self._queue)
        except IndexError:
            raise simpy.core.EmptySchedule() from None
        self.events += 1
        self._now = entry[0]
        entry[3](entry[4])

    def run(self, until: Any = None) -> Any:
        if until is not None:
            return super().run(until)
        queue: Any = self._queue
        pop, n = heapq.heappop, 0
        try:
            while queue:
                self._now, _, _, fn, value = pop(queue)
                n += 1
                fn(value)
        finally:
            # + 1: the counting step() also counted the final call that found the queue
            # empty; kept so event counts stay comparable with earlier runs and benchmarks.
            self.events += n + 1
        return None


def _fire(event: Any) -> None:
    """Process a simpy event: run its callbacks; raise its failure if nobody handled it."""
    callbacks, event.callbacks = event.callbacks, None
    for callback in callbacks:
        callback(event)
    if not event._ok and not hasattr(event, "_defused"):
        exc = type(event._value)(*event._value.args)
        exc.__cause__ = event._value
        raise exc


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


_heappush = heapq.heappush


def call_later(env: simpy.Environment, delay: float, callback: Callable[[Any], None],
               value: Any = None, priority: int = 1) -> None:
    """Run ``callback(value)`` ``delay`` from now (``env`` a :class:`CountingEnvironment`).

    ``priority`` orders events of one instant as simpy does (0 urgent, 1 normal); at 2 a
    port chooses only once every message that reaches it at that instant has arrived.
    A scheduled callback is a heap entry of its own, no event object: the network
    schedules a few per message.
    """
    e: Any = env  # simpy's own heap and counter, as Environment.schedule uses them
    _heappush(e._queue, (e._now + delay, priority, next(e._eid), callback, value))


class Port:
    """A host's downlink: the switch's output port towards ``host``, a priority queue.

    A message arrives when its sender starts sending it. An idle port starts carrying it at
    once; a busy one queues it, and when it frees takes the best message that has reached
    it by then (higher priority first, then earliest arrival, then sequence number). Only
    a contended port costs an event of its own: a free port's message needs just its
    delivery event. A FIFO port (``fifo``, every message of priority 0) fixes each
    message's turn when it arrives and never needs one.
    """

    __slots__ = ("net", "host", "bandwidth", "free_at", "_queue", "_deciding", "fifo",
                 "_due", "_head", "_tail", "large", "fault")

    def __init__(self, net: Network, host: int, bandwidth: float | None = None) -> None:
        self.net, self.host = net, host
        self.bandwidth = net.bandwidth if bandwidth is None else bandwidth
        self.free_at = 0.0
        self._queue: list[tuple[float, float, int, Message]] = []
        self._deciding = False
        self.fifo = False  # see Network.use_fifo_ports
        # A FIFO port's deliveries, (time, event id, message) in the order they happen:
        # only the first is on the simulation's heap, so that the heap stays small.
        self._due: collections.deque[tuple[float, int, Message]] = collections.deque()
        self._head = False
        self._tail = 0.0  # the time of the last delivery taken into that order
        # A receiving socket's messages of more than ``large`` bytes cost ``fault`` s per
        # byte besides (Network's ``large_message``); -1: none do.
        self.large = -1
        self.fault = 0.0

    def arrive(self, msg: Message) -> None:
        env: Any = self.net.env
        now = env._now  # (simpy's ``now`` without its property call: a few per message)
        if self.fifo:
            # In arrival order: nothing that reaches the port later can go before this
            # message, so its turn (when the port frees) is known now and needs no event.
            # (_carry inlined, without routes: once per message)
            if msg.priority:
                raise RuntimeError(f"a FIFO port got a message of priority {msg.priority}")
            free = self.free_at
            start = free if free > now else now
            tx = msg.nbytes / self.bandwidth
            delay = tx if msg.not_before <= start + tx else msg.not_before - start
            self.free_at = start + delay
            due = start + (delay + self.net.latency)
            if msg.arrive_at is not None:
                msg.arrive_at(msg, due)
            elif not self._head:
                self._head, self._tail = True, due
                _heappush(env._queue, (due, 1, next(env._eid), self._deliver, msg))
            elif due >= self._tail:
                # Its event id is taken now, as if it went on the heap now: it runs in the
                # same order among all events when _deliver puts it there, after the one
                # before it (whose time is not later, whose id is smaller).
                self._tail = due
                self._due.append((due, next(env._eid), msg))
            else:  # (an earlier time than the last delivery's, by rounding: on the heap)
                _heappush(env._queue, (due, 1, next(env._eid), msg.on_arrive, msg))
            return
        if not self._deciding and now >= self.free_at:
            self._carry(msg, now)
            return
        heapq.heappush(self._queue, (-msg.priority, now, msg.seq, msg))
        if not self._deciding:
            self._deciding = True
            call_later(env, self.free_at - now, self._decide, None, 2)

    def _carry(self, msg: Message, now: float) -> None:
        net = self.net
        # Cut-through: this stage starts as the previous one does, but cannot finish before
        # it (``not_before``: the previous stage's end, the sender's uplink for the first).
        tx = msg.nbytes / self.bandwidth
        if msg.nbytes > self.large >= 0:
            tx += msg.nbytes * self.fault
        # (compared, not max()ed, so that an unbound stage keeps exactly tx: no rounding)
        delay = tx if msg.not_before <= now + tx else msg.not_before - now
        self.free_at = now + delay
        if msg.route:
            nxt, msg.route = msg.route[0], msg.route[1:]
            msg.not_before = now + delay
            nxt.arrive(msg)
        else:  # call_later(env, delay + latency, msg.on_arrive, msg), inlined: once a message
            env: Any = net.env
            _heappush(env._queue, (now + (delay + net.latency), 1, next(env._eid),
                                   msg.on_arrive, msg))

    def _deliver(self, msg: Message) -> None:
        """Deliver the FIFO port's first message; the next one goes on the heap."""
        dq = self._due
        if dq:
            due, eid, nxt = dq.popleft()
            env: Any = self.net.env
            _heappush(env._queue, (due, 1, eid, self._deliver, nxt))
        else:
            self._head = False
        msg.on_arrive(msg)

    def _decide(self, _value: Any) -> None:
        env: Any = self.net.env
        now = env._now
        self._carry(heapq.heappop(self._queue)[3], now)
        if self._queue:
            call_later(env, self.free_at - now, self._decide, None, 2)
        else:
            self._deciding = False


class IncastPort(Port):
    """A switch output port with a shallow buffer on a lossy transport (TCP incast).

    It takes at most ``senders`` TCP flows at once (:func:`ddpbench.hardware.incast_senders`:
    the buffer and the path hold four segments for each); a message that arrives while that
    many other senders have messages at the port (queued or on the wire) loses its window
    and reaches the port again ``rto`` seconds later, Linux's minimum retransmission
    timeout, when it goes through whatever the port holds: the timer desynchronises the
    flows. Messages of one sender are one flow. So the first ``senders`` flows of a fan-in
    keep the port busy and every later one waits ``rto`` once per message, the goodput
    collapse of barrier-synchronised reads (Phanishayee et al., FAST 2008).
    """

    __slots__ = ("senders", "rto", "_ends", "timeouts")

    def __init__(self, net: Network, host: int, senders: int, rto: float,
                 bandwidth: float | None = None) -> None:
        super().__init__(net, host, bandwidth)
        self.senders, self.rto = senders, rto
        self._ends: dict[int, float] = {}  # sender -> when its last carried message ends here
        self.timeouts = 0

    def _others(self, src: int, now: float) -> int:
        busy = {s for s, end in self._ends.items() if end > now}
        busy.update(entry[3].src for entry in self._queue)
        busy.discard(src)
        return len(busy)

    def arrive(self, msg: Message) -> None:
        env: Any = self.net.env
        now = env._now
        if not msg.timed_out and self._others(msg.src, now) >= self.senders:
            msg.timed_out = True
            self.timeouts += 1
            call_later(env, self.rto, self.arrive, msg)
            return
        super().arrive(msg)
        if self.fifo:
            self._ends[msg.src] = self.free_at

    def _carry(self, msg: Message, now: float) -> None:
        super()._carry(msg, now)
        self._ends[msg.src] = self.free_at


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
    """One transfer: ``on_arrive(msg)`` runs at the receiver when it has fully arrived.

    Or, with ``arrive_at`` set and through a FIFO port (:meth:`Network.use_fifo_ports`),
    ``arrive_at(msg, time)`` runs as soon as the delivery time is known, and the receiver
    schedules what it needs itself (a worker collecting a layer's pulls needs one event for
    the last of them, not one per message).
    """

    __slots__ = ("src", "dst", "nbytes", "priority", "seq", "kind", "layer", "gate", "cost",
                 "on_arrive", "data", "route", "not_before", "arrive_at", "timed_out")

    def __init__(self, src: int, dst: int, nbytes: int, priority: float, kind: str, layer: int,
                 on_arrive: Callable[[Message], None], data: Any = None,
                 gate: Gate | None = None, cost: float = 1.0) -> None:
        self.src, self.dst, self.nbytes, self.priority = src, dst, nbytes, priority
        self.kind, self.layer, self.on_arrive, self.data = kind, layer, on_arrive, data
        self.gate, self.cost = gate, cost
        self.seq = 0
        self.route: tuple[Port, ...] = ()  # switch ports still to cross after the current
        self.not_before = 0.0
        self.arrive_at: Callable[[Message, float], None] | None = None
        self.timed_out = False  # it has waited a retransmission timeout (IncastPort)


class Sender:
    """A host's uplink: sends its queued messages one at a time.

    The best queued message (larger ``priority`` first, then oldest) whose gate lets it
    pass holds the uplink for ``nbytes / bandwidth`` (plus the transport's per-message
    cost); it enters its receiver's :class:`Port` when it starts (cut-through), and the
    sender goes on with its next message whether or not the receiver's downlink is free.
    An idle sender woken by a new message chooses at the wake-up event, after the other
    messages of that instant have been queued (the order of a simpy process's resume;
    written with callbacks, not a generator, for speed).

    With ``hwm`` set (:meth:`use_sockets`), the host sends as P3's ps-lite does instead
    (ps-lite/src/van.cc ``Van::Sending``, ps-lite/src/zmq_van.h ``ZMQ_SNDHWM``): one
    sending thread pops the best queued message and hands it to the socket of its
    destination, which holds at most ``hwm`` messages not yet on the wire; when that socket
    is full the thread blocks, and every message behind it waits (head-of-line blocking),
    whatever its priority or destination. With a kernel send buffer (``sndbuf``) each
    connection also holds the message in ZeroMQ's engine and as many as fit in the buffer.
    The uplink carries the messages in the order they entered their kernel buffers (or
    were handed over, without one). A colocated server is a process of its own with its own
    sockets (:meth:`use_server_sockets`) on the same uplink. No acknowledgements, no gates.
    """

    __slots__ = ("net", "host", "_queue", "_idle", "_msg", "_start", "sockets",
                 "server_sockets", "wire", "_fin")

    def __init__(self, net: Network, host: int) -> None:
        self.net, self.host = net, host
        self._queue: list[tuple[float, int, Message]] = []
        self._idle = False
        self._msg: Message | None = None
        self._start = 0.0
        self.sockets: Sockets[Message] | None = None
        self.server_sockets: Sockets[Message] | None = None
        self.wire: Wire[Message] | None = None
        self._fin: Message | None = None  # the wire's message to finish at the next _go
        call_later(net.env, 0, self._go, None, 0)  # as a process's Initialize (urgent)

    def use_sockets(self, hwm: int, ties: str = "heap", sndbuf: int = 0) -> None:
        """Send through per-destination sockets of ``hwm`` messages (P3's ps-lite,
        :class:`ddpbench.rules.sockets.Sockets`, the real transport's rule too); ``ties``
        orders equal priorities (:data:`ddpbench.rules.sockets.TIES`); ``sndbuf``: bytes
        of each connection's kernel send buffer (0: not modelled)."""
        if self.wire is None:
            self.wire = Wire()
        self.sockets = Sockets(hwm, ties, sndbuf, self.wire)

    def use_server_sockets(self, hwm: int, sndbuf: int = 0) -> None:
        """Give the host's server process its own sockets (P3's ps-lite): its replies
        (:meth:`send_direct`) go through them in the order answered, each connection's
        pipe of ``hwm`` messages and kernel buffer counting them, onto the host's uplink."""
        if self.wire is None:
            self.wire = Wire()
        self.server_sockets = Sockets(hwm, "fifo", sndbuf, self.wire)

    def send(self, msg: Message) -> None:
        """Queue ``msg``; larger ``priority`` goes first, equal priorities in FIFO order."""
        net = self.net
        net._seq += 1
        msg.seq = seq = net._seq
        # (requeue and _wake, inlined: once per message)
        sockets = self.sockets
        if sockets is not None:
            sockets.queue((-msg.priority, seq, msg))
        elif msg.dst == self.host:  # to its own host's server: not through the NIC
            env: Any = net.env
            net.loop(msg, env._now)
            return
        else:
            heapq.heappush(self._queue, (-msg.priority, seq, msg))
        if self._idle:
            self._idle = False
            call_later(net.env, 0, self._go)

    def send_direct(self, msg: Message) -> None:
        """Put ``msg`` on the wire behind what is already there, bypassing the queue.

        A ps-lite server answers from its receiving thread straight into the socket
        (``KVServer::Response`` calls ``Van::Send``), not through the priority queue: with
        the server's own sockets (:meth:`use_server_sockets`) in the order answered, a
        full socket blocking the replies behind it; else onto the wire (a variant).
        """
        server = self.server_sockets
        if server is None and self.sockets is None:
            self.send(msg)
            return
        net = self.net  # (next_seq and _wake inlined: once per server reply)
        net._seq += 1
        msg.seq = net._seq
        if server is not None:
            server.queue((0, msg.seq, msg))
        else:
            assert self.sockets is not None
            self.sockets.direct(msg)
        if self._idle:
            self._idle = False
            call_later(net.env, 0, self._go)

    def requeue(self, entry: tuple[float, int, Message]) -> None:
        if self.sockets is not None:
            self.sockets.queue(entry)
        else:
            heapq.heappush(self._queue, entry)
        self._wake()

    def _wake(self) -> None:
        if self._idle:
            self._idle = False
            call_later(self.net.env, 0, self._go)

    def _next(self) -> Message | None:
        """Pop the best queued message its gate lets pass (without sockets)."""
        queue = self._queue
        while queue:
            entry = heapq.heappop(queue)
            msg = entry[2]
            gate = msg.gate
            if gate is not None:
                if not gate.fits(msg.cost):
                    heapq.heappush(gate.blocked, entry)
                    continue
                gate.used += msg.cost
            return msg
        return None

    def _go(self, _value: Any = None) -> None:
        """Record the message that has just left the uplink, if any, and start the next.

        Scheduled when the uplink frees (``start + tx`` of the message on it) and when an
        idle sender is woken (nothing on the uplink then).
        """
        net = self.net
        env: Any = net.env
        sent = self._msg
        if sent is not None:
            self._msg = None
            net.record(sent, self._start, env._now)
        wire = self.wire
        if wire is not None:
            done = self._fin
            if done is not None:  # it has left: its kernel bytes free, its socket moves on
                self._fin = None
                wire.finish(done)
            msg = self._fin = wire.take()
            if msg is not None:
                # Priority orders only the sending thread: on the wire and at the switch
                # every message is equal (TCP through a plain switch).
                msg.priority = 0
            elif self._queue:  # (a host with only a server's sockets sent one plainly)
                msg = self._next()
        else:
            msg = self._next()
        if msg is None:
            self._idle = True
            return
        start = env._now
        if msg.dst == self.host:
            # Into the socket to its own host's server: the thread's turn costs the
            # message's CPU, the bytes go over the loopback (not recorded: no NIC bytes).
            tx = net.per_message
            net.loop(msg, start)
            _heappush(env._queue, (start + tx, 1, next(env._eid), self._go, None))
            return
        # The sender's CPU spends per_message on each message besides its bytes (the
        # transport's cost; 0 on the ideal network).
        tx = msg.nbytes / net.bandwidth + net.per_message
        msg.not_before = start + tx
        self._msg, self._start = msg, start
        if net.direct:
            net.down[msg.dst].arrive(msg)
        else:
            net.enter(msg)
        # call_later(env, tx, self._go), inlined: once per message
        _heappush(env._queue, (start + tx, 1, next(env._eid), self._go, None))


def ecmp_path(src: int, dst: int, paths: int) -> int:
    """Return the path (0..paths-1) a switch's ECMP hash gives the flow ``src`` -> ``dst``.

    Switches hash a flow's header fields and take the result modulo the number of equal
    paths (RFC 2992, hash-threshold), so a flow keeps its path and two flows can share one
    while another path is idle. The hash here is a fixed 32-bit mix of the two host indices
    (Knuth's multiplicative hash), deterministic from run to run."""
    if paths <= 1:
        return 0
    h = ((src * 2654435761) ^ (dst * 40503 + 0x9E3779B9)) & 0xFFFFFFFF
    h ^= h >> 16
    return (h * 0x45D9F3B & 0xFFFFFFFF) % paths


class Network:
    """Hosts 0..nhosts-1 with NICs of ``bandwidth`` bytes/s per direction and ``latency`` s.

    Args:
        env: the simulation environment.
        nhosts: number of hosts.
        bandwidth: bytes per second per direction, > 0.
        latency: seconds from the end of a message on the receiver's downlink to its
            delivery, >= 0.
        record: ``record(msg, start, end)`` is called when a message has left its sender's
            uplink (``start`` to ``end``: the sender's transmission).
        oversubscription: 1 (default) is one non-blocking switch. Above 1, hosts form racks
            of ``rack_size`` consecutive hosts, and a message between racks also crosses
            its rack's uplink and the other rack's downlink to the core, each a port of
            ``rack_size * bandwidth / oversubscription`` bytes/s.
        rack_size: hosts per rack (used only when oversubscribed or with several paths).
        ecmp_paths: equal-cost paths a rack's links to the core are split into, each carrying
            its share of the rack's core bandwidth; a flow (a source and destination host)
            hashes onto one of them (:func:`ecmp_path`), so flows can collide on a path
            while another is idle. 1: one link per rack.
        per_message: seconds of sender time each message costs besides its bytes, >= 0.
        socket_bandwidth: bytes/s one receiving process takes in at most, or None (no
            limit). ps-lite's van receives everything for a process on one ZeroMQ socket,
            which tops out near one TCP connection's rate whatever the number of senders;
            a host's server process (pushes) and worker process (every other message)
            each have their own, behind the host's downlink.
        large_message: ``(bytes, seconds per byte)``: a message of more than that many
            bytes costs the receiving socket that much more per byte (ps-lite receives each
            message into a fresh allocation, which above glibc's largest mmap threshold is a
            fresh mapping whose pages fault as the bytes land: :mod:`ddpbench.hardware`,
            ``Transport.page_fault_us``); None: no such cost. Socket ports then exist
            wherever a socket rate is given, whatever the NIC's.
        incast: ``(senders, rto)``: every switch port (a host's downlink, a rack's links to
            the core) is an :class:`IncastPort` that takes at most ``senders`` TCP flows at
            once, a later one waiting ``rto`` seconds; None: ports drop nothing.
        loopback: a message to its sender's own host (a worker's push to the server beside
            it, that server's reply) goes through the stack over the host's loopback, as
            ps-lite sends it (see :meth:`loop`); False: the strategies keep a colocated
            server's parts off the network (no such message is sent).
    """

    def __init__(self, env: simpy.Environment, nhosts: int, bandwidth: float, latency: float,
                 record: Callable[[Message, float, float], None], *,
                 oversubscription: float = 1.0, rack_size: int = contract.DEFAULT_RACK_SIZE,
                 per_message: float = 0.0, socket_bandwidth: float | None = None,
                 loopback: bool = False,
                 large_message: tuple[int, float] | None = None, ecmp_paths: int = 1,
                 incast: tuple[int, float] | None = None) -> None:
        if bandwidth <= 0:
            raise ValueError(f"bandwidth must be > 0 bytes/s, got {bandwidth}")
        if latency < 0:
            raise ValueError(f"latency must be >= 0 s, got {latency}")
        if not oversubscription >= 1:
            raise ValueError(f"oversubscription must be >= 1, got {oversubscription}")
        if rack_size < 1:
            raise ValueError(f"rack_size must be >= 1, got {rack_size}")
        if not per_message >= 0:
            raise ValueError(f"per_message must be >= 0 s, got {per_message}")
        self.per_message = per_message
        self.env, self.bandwidth, self.latency, self.record = env, bandwidth, latency, record
        self._seq = 0
        if incast is not None and not (incast[0] >= 1 and incast[1] >= 0):
            raise ValueError(f"incast must be (senders >= 1, rto >= 0 s), got {incast}")

        def switch_port(host: int, rate: float | None = None) -> Port:
            if incast is None:
                return Port(self, host, rate)
            return IncastPort(self, host, incast[0], incast[1], rate)

        self.down = [switch_port(h) for h in range(nhosts)]
        self.senders = [Sender(self, h) for h in range(nhosts)]
        self.rack_size = rack_size
        nracks = -(-nhosts // rack_size)
        if ecmp_paths < 1:
            raise ValueError(f"ecmp_paths must be >= 1, got {ecmp_paths}")
        self.racked = (oversubscription > 1 or ecmp_paths > 1) and nracks > 1
        self.paths = ecmp_paths
        path = rack_size * bandwidth / oversubscription / ecmp_paths
        # rack r's links to the core: path k of rack r at index r * paths + k
        self.rack_up = ([switch_port(-1 - r, path) for r in range(nracks)
                         for _ in range(ecmp_paths)] if self.racked else [])
        self.rack_down = ([switch_port(-1 - r, path) for r in range(nracks)
                           for _ in range(ecmp_paths)] if self.racked else [])
        if socket_bandwidth is not None and not socket_bandwidth > 0:
            raise ValueError(f"socket_bandwidth must be > 0 bytes/s, got {socket_bandwidth}")
        self.loopback = loopback
        # (the server's socket, the worker's socket) per host, only where it can bind: below
        # the NIC's rate, wherever loopback traffic joins the NIC's, or where large messages
        # cost the receiver more than their bytes
        self.sockets_in: list[tuple[Port, Port]] = (
            [(Port(self, h, socket_bandwidth), Port(self, h, socket_bandwidth))
             for h in range(nhosts)]
            if socket_bandwidth is not None
            and (socket_bandwidth < bandwidth or loopback or large_message is not None)
            else [])
        if large_message is not None:
            for pair in self.sockets_in:
                for port in pair:
                    port.large, port.fault = large_message
        # every message goes straight to its receiver's port (no racks, no socket ports)
        self.direct = not self.racked and not self.sockets_in

    @property
    def timeouts(self) -> int:
        """Return how many messages have waited a retransmission timeout (incast) so far."""
        return sum(p.timeouts for p in (*self.down, *self.rack_up, *self.rack_down)
                   if isinstance(p, IncastPort))

    def cap_receivers(self, bandwidth: float) -> None:
        """Give every host's receiving processes (its server's and its worker's) a port of
        ``bandwidth`` bytes/s behind its downlink, in place of any they had: what one
        process takes in at most (TensorFlow's gRPC; a strategy calls it before it runs)."""
        if not bandwidth > 0:
            raise ValueError(f"bandwidth must be > 0 bytes/s, got {bandwidth}")
        self.sockets_in = [(Port(self, h, bandwidth), Port(self, h, bandwidth))
                           for h in range(len(self.down))]
        self.direct = False

    def enter(self, msg: Message) -> None:
        """Start ``msg`` into the switch: its receiver's port, through the core if between
        racks of an oversubscribed network."""
        socket: tuple[Port, ...] = ()
        if self.sockets_in:
            socket = (self.sockets_in[msg.dst][0 if msg.kind == "push" else 1],)
        if self.racked:
            src, dst = msg.src // self.rack_size, msg.dst // self.rack_size
            if src != dst:
                k = ecmp_path(msg.src, msg.dst, self.paths)  # one path per flow, both ways
                msg.route = (self.rack_down[dst * self.paths + k], self.down[msg.dst], *socket)
                self.rack_up[src * self.paths + k].arrive(msg)
                return
        if socket:
            msg.route = socket
        self.down[msg.dst].arrive(msg)

    def loop(self, msg: Message, now: float) -> None:
        """Carry ``msg`` from a process to another on its own host, starting at ``now``.

        ps-lite has no local shortcut: a worker's push to the server beside it, and that
        server's reply, go through ZeroMQ and the kernel's TCP stack over the loopback. The
        message costs its sender ``per_message`` (not ``nbytes / bandwidth``: the NIC
        carries none of it) and then enters the receiving process's socket port, where
        it queues with what the NIC brings (the one-socket ceiling takes both); it is
        delivered ``latency`` after that port has carried it, as every message is (the
        stack's share of a message's latency is the same over the loopback). Without
        socket ports it is delivered ``per_message + latency`` after ``now``.
        """
        msg.not_before = ready = now + self.per_message
        if self.sockets_in:  # (cut-through, as from the NIC: done no sooner than handed over)
            msg.route = ()
            self.sockets_in[msg.dst][0 if msg.kind == "push" else 1].arrive(msg)
            return
        due = ready + self.latency
        if msg.arrive_at is not None:
            msg.arrive_at(msg, due)
        else:
            call_later(self.env, due - now, msg.on_arrive, msg)

    def use_fifo_ports(self) -> bool:
        """Every message crosses the switch at priority 0 (the strategy's promise), so a
        port serves in arrival order, and messages that reach it in the same instant in
        the order they reach it (the order their senders' events run). A message's turn is
        then fixed on arrival, without an event when the port frees. Only on a direct
        network: a route through rack or socket ports hands a message on at the instant
        it is carried, which must stay an event. Returns whether the ports are FIFO."""
        if self.direct:
            for port in self.down:
                port.fifo = True
        return self.direct

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def send(self, msg: Message) -> None:
        self.senders[msg.src].send(msg)
