"""The process's uplink and downlink for the parameter-server backends.

:class:`Transport` is the process's one :class:`~ddpbench.comm.Protocol` (it runs on the
engine thread). It owns the uplink: a priority queue of data messages drained in order of
(-priority, sequence), with optional gates (:class:`Gate`), the optional pacing
(``bandwidth_gbps``) and the send trace. Pacing is the simulator's network model
(``simulator/network.py``): a data message holds the sender's uplink for
``bytes / bandwidth`` (a token bucket), then the sender moves on; it enters the receiver's
downlink, the switch's output port, when it starts (cut-through), and the port carries one
message at a time for ``bytes / bandwidth``, taking the best waiting one by (priority,
arrival, sequence); delivery is ``latency`` after the port has carried it. Control messages
(acknowledgements, pull requests, shutdown) bypass the queue and the pacing and arrive
``latency`` after they are sent; except acknowledgements, they never overtake earlier
messages from the same sender (a kvstore pull stays behind its push).
"""

from __future__ import annotations

import collections
import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ddpbench import trace
from ddpbench.backends._common import mpi_module
from ddpbench.backends.ps.wire import ACK, FLAG_DATA, HEADER, TAG, TAG_DATA, Msg, np_dtype
from ddpbench.comm import Protocol, test_all
from ddpbench.rules.sockets import Sockets, Wire

__all__ = ["Gate", "SendRecord", "Transport"]

# How long one poll keeps receiving a burst of data messages (unpaced).
BATCH_S = 5e-4
# Empty probes allowed right after a data message before the poll gives up: MPI shows the
# header that followed it a probe or two later.
MISSES = 3


class Gate:
    """A limit on what one sender has in flight (P3's water mark, BytePS's credit).

    A message of ``cost`` passes when nothing is in flight or ``used + cost <= limit`` (so a
    message larger than the limit still goes, alone); its arrival acknowledgement releases
    it. The same rule as the simulator's gate, so both schedule alike.
    """

    __slots__ = ("limit", "used", "blocked")

    def __init__(self, limit: float) -> None:
        self.limit, self.used = limit, 0.0
        self.blocked: list[tuple[int, int, Msg]] = []

    def fits(self, cost: float, extra: float = 0.0) -> bool:
        used = self.used + extra
        return used == 0 or used + cost <= self.limit


@dataclass(frozen=True)
class SendRecord:
    """One data message as sent: times are ``time.monotonic()`` seconds.

    ``end`` is ``start + bytes / bandwidth`` when pacing (else equal to ``start``); ``kind``
    is "push" (worker to server), "pull" (server to worker) or "broadcast" (root to server,
    server to the other workers).
    """

    start: float
    end: float
    kind: str
    key: int
    part: int
    priority: int
    bytes: int
    src: str
    dst: str

    def span(self, layer_of: Callable[[int], int] | None = None) -> trace.Span:
        """Return this send as a trace span (``layer_of(key)``, default: the key)."""
        layer = layer_of(self.key) if layer_of is not None else self.key
        return trace.Span(self.src, self.kind, layer, self.start, self.end, self.bytes,
                          self.dst, {"key": self.key, "part": self.part,
                                     "priority": self.priority, "t_monotonic": self.start})


# ------------------------------------------------------------------------------ transport
class Transport(Protocol):
    """The process's uplink and downlink: queue, gates, pacing, trace; runs on the engine.

    Args:
        comm: the communicator every message travels on.
        host_of: comm rank -> host name for traces ("worker0", "server1").
        bandwidth_gbps: pacing per direction, or None.
        latency_us: added one-way delay per data message when pacing.
        trace: record sends.
    """

    def __init__(self, comm: Any, host_of: Callable[[int], str],
                 bandwidth_gbps: float | None = None, latency_us: float = 0.0,
                 trace: bool = False) -> None:
        self.comm, self.me = comm, comm.rank
        self.host_of = host_of
        self.handlers: dict[int, Callable[[Msg], None]] = {}
        # kind -> where a data message of that kind is received (an array of its dtype
        # and count, or None for a new buffer): a worker's output, a server's inbox.
        self.sinks: dict[int, Callable[[Msg], np.ndarray | None]] = {}
        self.ready: list[tuple[int, int, Msg]] = []
        # Data messages not yet offered to the uplink, by the time they were queued: when
        # pacing, the link chooses only among those queued by the time it came free.
        self.queued: list[tuple[float, int, tuple[int, int, Msg]]] = []
        self.sends: list[tuple[Any, np.ndarray | bytes]] = []
        # Per source, in order: (element receive or None, its message).
        self.recvs: dict[int, collections.deque] = collections.defaultdict(collections.deque)
        self._status: Any = None
        self._head = np.empty(HEADER.size, np.uint8)  # a bare header is received here
        self.arrived: list[tuple[float, int, Msg]] = []
        self.local: collections.deque[Msg] = collections.deque()
        self.last_delivery: dict[int, float] = {}
        # The downlink (switch output port): paced data received but not yet carried, by
        # arrival time, and those waiting at the port at its next choice, by priority.
        self.port_new: list[tuple[float, int, list]] = []
        self.port_queue: list[tuple[int, float, int, list]] = []
        # Per source, in receive order: [msg, delivery time or None while the port has not
        # carried it yet, already scheduled]; keeps control messages behind earlier data.
        self.order: dict[int, collections.deque[list]] = collections.defaultdict(collections.deque)
        self.up_free = self.down_free = 0.0
        self.seq = itertools.count()
        self.records: list[SendRecord] = []
        self.bytes_sent = 0
        self.keep_polling = True
        # True while this process waits for a reply (the worker side sets it).
        self.expecting: Callable[[], bool] = lambda: False
        # True on a dedicated server rank: a push may come at any moment, as a reply may
        # to a worker, so its engine spins as long after activity as a worker's does.
        self.serving = False
        # Called with the error when the engine fails this protocol (the worker side
        # fails its pending handles).
        self.on_fail: list[Callable[[BaseException], None]] = []
        self.sockets: Sockets[Msg] | None = None  # P3's sockets (:meth:`use_sockets`)
        self.server_sockets: Sockets[Msg] | None = None  # (:meth:`use_server_sockets`)
        self.wire: Wire[Msg] | None = None  # the sockets' uplink
        self._on_air: Msg | None = None  # the wire's message until it has left (paced)
        self.configure(bandwidth_gbps, latency_us, trace)

    def use_sockets(self, hwm: int, ties: str = "heap", sndbuf: int = 0) -> None:
        """Send as P3's ps-lite does, with sockets of ``hwm`` messages per destination.

        One sending thread pops the best queued message and hands it to its destination's
        socket; when that socket already holds ``hwm`` messages not yet on the wire, the
        thread blocks and everything behind it waits (ps-lite/src/van.cc ``Van::Sending``,
        ps-lite/src/zmq_van.h ``ZMQ_SNDHWM``). The uplink carries messages in the order they
        were handed over. The simulator's :meth:`Sender.use_sockets
        <ddpbench.simulator.network.Sender.use_sockets>` is the same rule. ``ties``: how
        equal priorities leave the thread's queue (:data:`ddpbench.rules.sockets.TIES`);
        ``sndbuf``: bytes of each connection's kernel send buffer, which a message leaves
        when paced transmission has carried it (0: not modelled).
        """
        if self.wire is None:
            self.wire = Wire()
        self.sockets = Sockets(hwm, ties, sndbuf, self.wire)

    def use_server_sockets(self, hwm: int, sndbuf: int = 0) -> None:
        """Send this rank's server replies through sockets of their own (P3's ps-lite: a
        server is a process with its own DEALER sockets, ``KVServer::Response`` into
        ``Van::Send``): in the order answered, each connection's pipe of ``hwm`` messages
        and kernel buffer of ``sndbuf`` bytes counting them, a full one holding the
        replies behind it; on the same uplink as the rank's worker sockets."""
        if self.wire is None:
            self.wire = Wire()
        self.server_sockets = Sockets(hwm, "fifo", sndbuf, self.wire)

    def configure(self, bandwidth_gbps: float | None, latency_us: float, trace: bool) -> None:
        self.bytes_per_s = None if bandwidth_gbps is None else bandwidth_gbps * 1e9 / 8
        self.latency_s = latency_us * 1e-6 if bandwidth_gbps is not None else 0.0
        self.trace = bool(trace)

    # -- sending ------------------------------------------------------------------------
    def send(self, msg: Msg, direct: bool = False) -> None:
        """Send ``msg``: data through the priority queue, control at once (engine thread).

        ``direct``: a server's reply. With sockets it goes through the server's own
        (:meth:`use_server_sockets`, ps-lite's ``KVServer::Response``) or, without them,
        straight onto the wire behind what is there, not through the sending thread's
        queue. Unpaced, a reply for an empty queue goes out at once,
        with or without sockets, as the queue would send it: the link is free (MPI's
        ``Isend`` does not wait), so nothing could overtake it. (Queued instead, it waited
        for the end of the receive batch it was answered in, up to ``BATCH_S``.)
        """
        msg.src = self.me
        msg.direct = direct and self.wire is not None
        msg.seq = next(self.seq)
        if msg.dst == self.me:
            self.local.append(msg)  # a part on the local server: no MPI message, no bytes
            if msg.after_send is not None:
                msg.after_send()
        elif msg.flags & FLAG_DATA:
            msg.t_enq = time.monotonic()
            if (direct and self.bytes_per_s is None and msg.gate is None and not self.queued
                    and not self.ready and self._sockets_idle()):
                # On the wire every message is equal (sockets); a variant's prioritised
                # reply keeps its priority in the header.
                self._transmit(msg, msg.t_enq,
                               wire_priority=0 if self.wire is not None else None)
                return
            heapq.heappush(self.queued, (msg.t_enq, msg.seq, (-msg.priority, msg.seq, msg)))
        else:
            msg.t_start = time.monotonic()
            self._isend(msg)

    def kick(self) -> None:
        """Unpaced, hand what is queued to the wire now (engine thread), as the sending
        thread would while the caller is still queueing the rest of a sliced array."""
        if self.bytes_per_s is None:
            self._drain_ready(time.monotonic())

    def release(self, gate: Gate, cost: float) -> None:
        """Return ``cost`` to ``gate`` (an arrival was acknowledged); requeue what now fits."""
        gate.used -= cost
        moved = 0.0
        now = time.monotonic()
        while gate.blocked and gate.fits(gate.blocked[0][2].cost, moved):
            entry = heapq.heappop(gate.blocked)
            moved += entry[2].cost
            entry[2].t_enq = now  # it could not have started before the gate let it go
            heapq.heappush(self.queued, (now, entry[1], entry))

    def _pop(self) -> Msg | None:
        while self.ready:
            entry = heapq.heappop(self.ready)
            msg = entry[2]
            gate = msg.gate
            if gate is not None:
                if not gate.fits(msg.cost):
                    heapq.heappush(gate.blocked, entry)
                    continue
                gate.used += msg.cost
            return msg
        return None

    def _drain_sockets(self, wire: Wire[Msg], now: float) -> bool:
        """Replay the sending threads, the sockets and the uplink up to ``now`` (P3's)."""
        bw = self.bytes_per_s
        queued = self.queued
        inf = float("inf")
        did = False
        while True:
            t_queue = queued[0][0] if queued else inf
            air = self._on_air
            t_fin = inf if air is None else (now if bw is None else self.up_free)
            head = wire.head_time()
            if air is not None or head is None:
                t_wire = inf
            else:
                t_wire = now if bw is None else max(self.up_free, head)
            t = min(t_queue, t_fin, t_wire)
            if t > now:
                break
            if t_queue <= min(t_fin, t_wire):  # queued at the instant the link frees: it competes
                entry = heapq.heappop(queued)[2]
                msg = entry[2]
                if msg.direct and self.server_sockets is not None:
                    self.server_sockets.queue((0, msg.seq, msg), t)  # in the order answered
                elif msg.direct:
                    wire.q.append((t, msg, None))
                else:
                    sockets = self.sockets or self.server_sockets
                    assert sockets is not None
                    sockets.queue(entry, t)
                continue
            if air is not None:  # it has left: its kernel bytes free, its socket moves on
                self._on_air = None
                wire.finish(air, t)
                continue
            sent = wire.take(t)
            if sent is None:  # pragma: no cover - head_time said there was one
                break
            # Priority orders only the sending thread: on the wire (and at the switch) every
            # message is equal, as for TCP through a plain switch.
            self._transmit(sent, t, wire_priority=0)
            self._on_air = sent
            did = True
        return did

    def _transmit(self, msg: Msg, start: float, wire_priority: int | None = None) -> None:
        bw = self.bytes_per_s
        nbytes = msg.nbytes
        end = start + nbytes / bw if bw is not None else start
        if bw is not None:
            self.up_free = end
        msg.t_start = start
        self.bytes_sent += nbytes
        if self.trace:
            self.records.append(SendRecord(start, end, msg.label, msg.key, msg.part,
                                           msg.priority, nbytes, self.host_of(self.me),
                                           self.host_of(msg.dst)))
        if wire_priority is not None:
            msg.priority = wire_priority
        self._isend(msg)
        if msg.after_send is not None:
            msg.after_send()

    def _drain_ready(self, now: float) -> bool:
        if self.wire is not None:
            return self._drain_sockets(self.wire, now)
        did = False
        bw = self.bytes_per_s
        queued, ready = self.queued, self.ready
        while queued or ready:
            # The link chooses when it comes free (or, idle, when the next message is
            # queued) among the messages queued by then, as the simulator's sender does:
            # polling late must neither cost bandwidth nor let a message queued after that
            # instant overtake (P3 would starve a reply behind the next iteration's pushes).
            if bw is None:
                t = now
            elif ready:
                t = self.up_free
            else:
                t = max(self.up_free, queued[0][0])
            if t > now:
                break
            while queued and queued[0][0] <= t:
                heapq.heappush(ready, heapq.heappop(queued)[2])
            msg = self._pop()
            if msg is None:  # all gated: the link waits for what is queued next
                continue
            self._transmit(msg, t if bw is not None else now)
            did = True
        return did

    def _isend(self, msg: Msg) -> None:
        head = msg.encode()
        self.sends.append((self.comm.Isend(head, msg.dst, TAG), head))
        data = msg.data()
        if data is not None:  # straight from the array: the sender keeps it until sent
            self.sends.append((self.comm.Isend(data, msg.dst, TAG_DATA), data))

    # -- receiving ----------------------------------------------------------------------
    def _receive(self, now: float) -> bool:
        MPI = mpi_module()
        did = False
        status = self._status
        if status is None:
            status = self._status = MPI.Status()
        unpaced = self.bytes_per_s is None
        until = now + BATCH_S
        misses = MISSES  # only right after a data message is another poll worth it
        while True:
            m = self.comm.Improbe(MPI.ANY_SOURCE, TAG, status)
            if m is None:
                misses += 1
                if misses > MISSES:
                    break
                continue
            src = status.Get_source()
            size = status.Get_count(MPI.BYTE)
            # A bare header (every data message's) is decoded into fields, so its buffer
            # is reused; a control message's payload stays a view of its own.
            head = self._head if size == HEADER.size else np.empty(size, np.uint8)
            m.Recv(head)  # matched and small: already here
            msg = Msg.decode(head, src, self.me)
            did = True
            if unpaced:
                if msg.flags & FLAG_DATA:
                    # The elements were sent right behind the header, so this receive
                    # ends: MPI moves them at its own speed (on one host the receive
                    # itself copies them) instead of one chunk per poll, and it shows the
                    # sender's next header only once they are in. A burst of slices is
                    # received in one go, for up to BATCH_S, each handled as it comes (a
                    # server answers a slice while the next is on its way).
                    self.comm.Recv(self._sink(msg), src, TAG_DATA)
                    misses = 0
                self.handlers[msg.kind](msg)  # no latency, no port: in receive order
                if time.monotonic() > until:
                    break
                continue
            # Paced, the engine must keep its clock, so the receives complete by polling.
            req = (self.comm.Irecv(self._sink(msg), src, TAG_DATA) if msg.flags & FLAG_DATA
                   else None)
            self.recvs[src].append((req, msg))
        for queue in self.recvs.values():
            # Complete in order per source: MPI's non-overtaking order is what keeps a
            # kvstore pull behind its push.
            while queue and (queue[0][0] is None or queue[0][0].Test()):
                self._arrive(queue.popleft()[1], now)
                did = True
        return did

    def _sink(self, msg: Msg) -> np.ndarray:
        """Set ``msg.payload`` to where its elements go; return that memory as bytes."""
        dtype = np_dtype(msg.dtype)
        sink = self.sinks.get(msg.kind)
        out = sink(msg) if sink is not None else None
        if (out is None or out.size != msg.count or out.dtype != dtype
                or not ((flags := out.flags).c_contiguous and flags.writeable)):
            out = np.empty(msg.count, dtype)
        else:
            msg.sunk = True
        msg.payload = out
        return (out if out.ndim == 1 else out.reshape(-1)).view(np.uint8)

    def _arrive(self, msg: Msg, now: float) -> None:
        # Paced only (unpaced, :meth:`_receive` hands each message over as it comes).
        if msg.kind == ACK:  # no order to keep: the ack handler looks the part up by key
            heapq.heappush(self.arrived, (now + self.latency_s, next(self.seq), msg))
            return
        if msg.flags & FLAG_DATA:
            entry: list[Any] = [msg, None, True]
            # Cut-through: the message reached the port when its sender started it (the
            # MPI message itself may be received a little later).
            heapq.heappush(self.port_new, (min(msg.t_start, now), next(self.seq), entry))
        else:
            entry = [msg, now + self.latency_s, False]
        self.order[msg.src].append(entry)
        self._schedule_in_order(msg.src)

    def _serve_port(self, now: float) -> bool:
        """Let the downlink carry what it has chosen by ``now`` (the simulator's Port)."""
        bw = self.bytes_per_s
        new, queue = self.port_new, self.port_queue
        did = False
        while new or queue:
            # The port chooses when it is free and something has reached it; what reaches
            # it later, even at the same priority, waits for the next choice.
            t = self.down_free if queue else max(self.down_free, new[0][0])
            if t > now:
                break
            while new and new[0][0] <= t:
                avail, seq, entry = heapq.heappop(new)
                heapq.heappush(queue, (-entry[0].priority, avail, seq, entry))
            entry = heapq.heappop(queue)[3]
            msg = entry[0]
            self.down_free = t + msg.nbytes / bw
            entry[1] = self.down_free + self.latency_s
            heapq.heappush(self.arrived, (entry[1], next(self.seq), msg))
            self._schedule_in_order(msg.src)
            did = True
        return did

    def _schedule_in_order(self, src: int) -> None:
        # Data messages keep the port's order; a control message waits for every earlier
        # message from its sender.
        queue = self.order[src]
        last = self.last_delivery.get(src, 0.0)
        while queue and queue[0][1] is not None:
            msg, at, scheduled = queue.popleft()
            if not scheduled:
                at = max(at, last)
                heapq.heappush(self.arrived, (at, next(self.seq), msg))
            last = max(last, at)
        self.last_delivery[src] = last

    # -- Protocol -----------------------------------------------------------------------
    def accept(self, item: Callable[[], None]) -> None:
        item()

    def hot(self) -> bool:
        # A reply is awaited, a push may come (a server rank), or a transfer is under way
        # (MPI moves a large message only while both sides call into it).
        return (self.serving or bool(self.sends) or self.expecting()
                or any(self.recvs.values()))

    def moving(self) -> bool:
        # Sends, and paced receives, that MPI advances only while this process polls.
        return bool(self.sends) or any(self.recvs.values())

    def busy(self) -> bool:
        return bool(self.keep_polling or self.ready or self.queued or self.sends
                    or self.arrived or not self._sockets_idle()
                    or self.local or self.port_new or self.port_queue
                    or any(self.recvs.values()))

    def progress(self) -> bool:
        now = time.monotonic()
        did = self._receive(now)
        did |= self._serve_port(now)
        while self.arrived and self.arrived[0][0] <= now:
            msg = heapq.heappop(self.arrived)[2]
            self.handlers[msg.kind](msg)
            did = True
        while self.local:
            msg = self.local.popleft()
            msg.src = self.me
            self.handlers[msg.kind](msg)
            did = True
        did |= self._drain_ready(time.monotonic())
        sends = self.sends
        if sends:
            # Sends complete about in the order they were started: test from the oldest
            # and stop at the first still in flight (a burst has hundreds). While the
            # oldest is under way it is tested a few times more (test_all): each call into
            # MPI moves a piece of a large message where MPI has no single-copy path.
            n = 0
            while n < len(sends) and (sends[n][0].Test() or (n == 0 and test_all([sends[0][0]]))):
                n += 1
            if n:
                del sends[:n]
                did = True
        return did

    def idle(self) -> bool:
        """True when nothing is queued, in flight or waiting for delivery."""
        return not (self.ready or self.queued or self.sends or self.arrived
                    or not self._sockets_idle() or self.local
                    or self.port_new or self.port_queue
                    or any(self.recvs.values()))

    def _sockets_idle(self) -> bool:
        if self.wire is None:
            return True
        return (self._on_air is None and not self.wire.q
                and all(s is None or s.idle() for s in (self.sockets, self.server_sockets)))

    def fail(self, error: BaseException) -> None:
        for fn in list(self.on_fail):
            fn(error)


