"""What the parameter-server backends (``kvstore``, ``p3``, ``byteps``) share.

The three backends differ only in how an array is cut into parts, where each part goes and
in which order parts leave the worker (each backend's placement rule, docs/fidelity.md). Everything else lives here:

- :class:`Transport`: the process's one :class:`~ddpbench.comm.Protocol`. It owns the
  process's uplink (a priority queue of data messages drained in order of (-priority,
  sequence), with optional gates: P3's water mark per destination, BytePS's credit), the
  optional pacing (``bandwidth_gbps``) and the send trace. Pacing is the simulator's
  network model (``simulator/network.py``): a data message holds the sender's uplink for
  ``bytes / bandwidth`` (a token bucket), then the sender moves on; it enters the
  receiver's downlink, the switch's output port, when it starts (cut-through), and the port
  carries one message at a time for ``bytes / bandwidth``, taking the best waiting one by
  (priority, arrival, sequence); delivery is ``latency`` after the port has carried it.
  Control messages (acknowledgements, pull requests, shutdown) bypass the queue and the
  pacing and arrive ``latency`` after they are sent; except acknowledgements, they never
  overtake earlier messages from the same sender (a kvstore pull stays behind its push).
- :class:`Server`: the summation server. A server rank runs it on its engine thread until
  every worker has closed (:func:`serve`), then exits; in colocated mode every worker process
  also runs one, and a part whose server is the local process costs no MPI message.
- :class:`PSStore`: the worker side (a :class:`~ddpbench.api.KVStore`); a subclass supplies
  its options, its split of an array into parts and its send policy.

Wire format: one MPI message per request, a 48-byte header (:data:`HEADER`) followed by the
payload (the part's elements, or UTF-8 JSON for control data), on a duplicate of
``COMM_WORLD`` (dedicated servers) or of the workers' communicator (colocated).

Server semantics: a part's pushes from all workers are combined in worker-rank order
(deterministic, whatever the arrival order), scaled by the postscale factor, and then either
sent back (merged push-pull: ``p3``, ``byteps``) or stored, where separate pull requests read
it (``kvstore``; with an optimizer the stored weights are updated instead). ``broadcast``
goes through the server too: the root's value is stored as the part's weights (MXNet's
``init``) and sent to every other worker.
"""

from __future__ import annotations

import abc
import atexit
import collections
import heapq
import itertools
import json
import os
import struct
import sys
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ddpbench.api import BackendOptions, Handle, ReduceOp
from ddpbench.backends._common import EngineStore, check_dtype
from ddpbench.comm import Protocol, engine, world
from ddpbench.tensor_ops import BFLOAT16, reduce_ufunc, scale_

__all__ = [
    "SGD",
    "Part",
    "PSOptions",
    "PSStore",
    "SendRecord",
    "Server",
    "Transport",
    "chrome_trace",
    "merge_chrome_traces",
    "serve",
]

TAG = 7305
# kind, dtype code, op code, flags, priority, key, part, root, count, postscale, t_start
HEADER = struct.Struct("<BBBBiqiiqdd")
assert HEADER.size == 48  # keeps the payload 8-byte aligned

# Message kinds. Data kinds carry array elements and go through the paced priority queue.
PUSH, PULL, PUSHPULL, BCAST, REPLY, ACK, DONE, ERROR, CONFIG, OPT, OPT_DONE, BYE = range(12)
KIND_NAMES = ["push", "pull-request", "push", "broadcast", "pull", "ack", "done", "error",
              "config", "optimizer", "optimizer-done", "bye"]
FLAG_GATED = 1  # the sender waits for an arrival acknowledgement (water mark, credit)
FLAG_DATA = 2  # the message carries array elements

_DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64",
           "uint8", "uint16", "uint32", "uint64"]
_OPS = [op.value for op in ReduceOp]


def _np_dtype(name: str) -> np.dtype:
    return BFLOAT16 if name == "bfloat16" else np.dtype(name)


# ------------------------------------------------------------------------------ options
class PSOptions(BackendOptions):
    """Options every parameter-server backend takes (:mod:`ddpbench.contract`).

    Attributes:
        servers: None = the launch's server ranks if it has any, else colocated;
            "colocated" = one server inside each worker process (P3's setup); an int must
            equal the launch's ``--servers``.
        bandwidth_gbps: pace data messages at this many Gbit/s per direction per process
            (None = as fast as memory copies go).
        latency_us: one-way delay added to each data message when pacing.
        trace: record every data message this process sends; a str is a directory where
            each process also writes its Chrome trace at close.
    """

    servers: int | Literal["colocated"] | None = None
    bandwidth_gbps: float | None = Field(None, gt=0, allow_inf_nan=False)
    latency_us: float = Field(0.0, ge=0, allow_inf_nan=False)
    trace: bool | str = False


class SGD(BaseModel):
    """MXNet's SGD, run by the servers of ``kvstore`` (plain data: sent as a dict).

    One step on weights ``w`` with the summed gradient ``g`` (all in ``w``'s dtype)::

        g = rescale_grad * g, clipped to [-clip_gradient, clip_gradient] if set
        mom = momentum * mom - lr * (g + wd * w)      (mom starts at 0)
        w = w + mom
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    lr: float = Field(0.01, ge=0, allow_inf_nan=False)
    momentum: float = Field(0.0, ge=0, allow_inf_nan=False)
    wd: float = Field(0.0, ge=0, allow_inf_nan=False)
    rescale_grad: float = Field(1.0, allow_inf_nan=False)
    clip_gradient: float | None = Field(None, gt=0, allow_inf_nan=False)

    def step(self, weight: np.ndarray, grad: np.ndarray, mom: np.ndarray | None) -> np.ndarray | None:
        """Update ``weight`` in place; return the momentum buffer to keep (None without)."""
        t = weight.dtype.type
        g = grad * t(self.rescale_grad)
        if self.clip_gradient is not None:
            np.clip(g, -t(self.clip_gradient), t(self.clip_gradient), out=g)
        if self.wd:
            g += t(self.wd) * weight
        if self.momentum == 0.0:
            weight -= t(self.lr) * g
            return None
        if mom is None:
            mom = np.zeros_like(weight)
        mom *= t(self.momentum)
        mom -= t(self.lr) * g
        weight += mom
        return mom


# ------------------------------------------------------------------------------ messages
class Msg:
    """One message, outgoing or delivered."""

    __slots__ = ("kind", "src", "dst", "key", "part", "priority", "root", "count", "dtype",
                 "op", "postscale", "flags", "payload", "t_start", "t_enq", "gate", "cost",
                 "after_send", "seq", "label")

    def __init__(self, kind: int, dst: int, key: int = 0, part: int = 0, *, priority: int = 0,
                 payload: Any = None, dtype: str = "uint8", op: str = "sum",
                 postscale: float = 1.0, root: int = -1, flags: int = 0) -> None:
        self.kind, self.dst, self.key, self.part = kind, dst, key, part
        self.priority, self.payload, self.dtype, self.op = priority, payload, dtype, op
        self.postscale, self.root, self.flags = postscale, root, flags
        self.count = 0 if payload is None else int(payload.size)
        self.src = -1
        self.t_start = self.t_enq = 0.0
        self.gate: Gate | None = None
        self.cost = 1.0
        self.after_send: Callable[[], None] | None = None
        self.seq = 0
        self.label = KIND_NAMES[kind]  # what the trace calls it

    @property
    def nbytes(self) -> int:
        """Payload bytes of a data message (what pacing, traces and byte counts see)."""
        if not self.flags & FLAG_DATA or self.payload is None:
            return 0
        return int(self.payload.nbytes)

    def encode(self) -> np.ndarray:
        payload = self.payload
        raw = None if payload is None else payload.reshape(-1).view(np.uint8)
        buf = np.empty(HEADER.size + (0 if raw is None else raw.size), np.uint8)
        HEADER.pack_into(buf, 0, self.kind, _DTYPES.index(self.dtype), _OPS.index(self.op),
                         self.flags, self.priority, self.key, self.part, self.root, self.count,
                         self.postscale, self.t_start)
        if raw is not None:
            buf[HEADER.size:] = raw
        return buf

    @classmethod
    def decode(cls, buf: np.ndarray, src: int, dst: int) -> Msg:
        (kind, dt, op, flags, prio, key, part, root, count, post, t_start) = HEADER.unpack_from(buf)
        msg = cls(kind, dst, key, part, priority=prio, dtype=_DTYPES[dt], op=_OPS[op],
                  postscale=post, root=root, flags=flags)
        body = buf[HEADER.size:]
        msg.count = count
        if flags & FLAG_DATA:
            msg.payload = body.view(_np_dtype(msg.dtype))
        elif len(body):
            msg.payload = body
        msg.src, msg.t_start = src, t_start
        return msg


def _json_payload(obj: Any) -> np.ndarray:
    return np.frombuffer(json.dumps(obj, sort_keys=True).encode(), np.uint8)


def _json_of(msg: Msg) -> Any:
    return json.loads(bytes(msg.payload).decode()) if msg.payload is not None else None


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
        self.ready: list[tuple[int, int, Msg]] = []
        # Data messages not yet offered to the uplink, by the time they were queued: when
        # pacing, the link chooses only among those queued by the time it came free.
        self.queued: list[tuple[float, int, tuple[int, int, Msg]]] = []
        self.sends: list[tuple[Any, np.ndarray]] = []
        self.recvs: dict[int, collections.deque] = collections.defaultdict(collections.deque)
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
        self.configure(bandwidth_gbps, latency_us, trace)

    def configure(self, bandwidth_gbps: float | None, latency_us: float, trace: bool) -> None:
        self.bytes_per_s = None if bandwidth_gbps is None else bandwidth_gbps * 1e9 / 8
        self.latency_s = latency_us * 1e-6 if bandwidth_gbps is not None else 0.0
        self.trace = bool(trace)

    # -- sending ------------------------------------------------------------------------
    def send(self, msg: Msg) -> None:
        """Send ``msg``: data through the priority queue, control at once (engine thread)."""
        msg.src = self.me
        msg.seq = next(self.seq)
        if msg.dst == self.me:
            self.local.append(msg)  # a part on the local server: no MPI message, no bytes
            if msg.after_send is not None:
                msg.after_send()
        elif msg.flags & FLAG_DATA:
            msg.t_enq = time.monotonic()
            heapq.heappush(self.queued, (msg.t_enq, msg.seq, (-msg.priority, msg.seq, msg)))
        else:
            msg.t_start = time.monotonic()
            self._isend(msg)

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

    def _drain_ready(self, now: float) -> bool:
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
            nbytes = msg.nbytes
            start = t if bw is not None else now
            end = start + nbytes / bw if bw is not None else start
            if bw is not None:
                self.up_free = end
            msg.t_start = start
            self.bytes_sent += nbytes
            if self.trace:
                self.records.append(SendRecord(start, end, msg.label, msg.key,
                                               msg.part, msg.priority, nbytes,
                                               self.host_of(self.me), self.host_of(msg.dst)))
            self._isend(msg)
            if msg.after_send is not None:
                msg.after_send()
            did = True
        return did

    def _isend(self, msg: Msg) -> None:
        buf = msg.encode()
        self.sends.append((self.comm.Isend(buf, msg.dst, TAG), buf))

    # -- receiving ----------------------------------------------------------------------
    def _receive(self, now: float) -> bool:
        from mpi4py import MPI

        did = False
        status = MPI.Status()
        while True:
            m = self.comm.Improbe(MPI.ANY_SOURCE, TAG, status)
            if m is None:
                break
            buf = np.empty(status.Get_count(MPI.BYTE), np.uint8)
            self.recvs[status.Get_source()].append((m.Irecv(buf), buf))
            did = True
        for src, queue in self.recvs.items():
            # Complete in posting order per source: MPI's non-overtaking order is what keeps
            # a kvstore pull behind its push.
            while queue and queue[0][0].Test():
                _, buf = queue.popleft()
                self._arrive(Msg.decode(buf, src, self.me), now)
                did = True
        return did

    def _arrive(self, msg: Msg, now: float) -> None:
        if msg.kind == ACK:  # no order to keep: the ack handler looks the part up by key
            heapq.heappush(self.arrived, (now + self.latency_s, next(self.seq), msg))
            return
        if self.bytes_per_s is not None and msg.flags & FLAG_DATA:
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

    def busy(self) -> bool:
        return bool(self.keep_polling or self.ready or self.queued or self.sends or self.arrived
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
        if self.sends:
            n = len(self.sends)
            self.sends = [s for s in self.sends if not s[0].Test()]
            did |= len(self.sends) != n
        return did

    def idle(self) -> bool:
        """True when nothing is queued, in flight or waiting for delivery."""
        return not (self.ready or self.queued or self.sends or self.arrived or self.local
                    or self.port_new or self.port_queue
                    or any(self.recvs.values()))

    def fail(self, error: BaseException) -> None:
        for fn in list(getattr(self, "on_fail", [])):
            fn(error)


# ------------------------------------------------------------------------------ server
class _Slot:
    """A server's state for one part: this round's pushes, stored weights, pulls waiting."""

    __slots__ = ("pushes", "store", "mom", "waiting", "bcast")

    def __init__(self) -> None:
        self.pushes: dict[int, Msg] = {}
        self.store: np.ndarray | None = None
        self.mom: np.ndarray | None = None
        self.waiting: list[Msg] = []
        self.bcast: dict[int, Msg] = {}


class Server:
    """A summation server on ``transport``, for ``num_workers`` workers (comm ranks 0..W-1).

    Args:
        transport: the process's transport (shared with the worker side when colocated).
        num_workers: workers it waits for in every round.
        name: host name used in messages ("server0", or "worker0" when colocated).
        dedicated: True on a server rank: the first CONFIG message sets pacing and tracing.
    """

    def __init__(self, transport: Transport, num_workers: int, name: str,
                 dedicated: bool) -> None:
        self.t, self.w, self.name, self.dedicated = transport, num_workers, name, dedicated
        self.slots: dict[tuple[int, int], _Slot] = {}
        self.config: dict[str, Any] | None = None
        self.optimizer: SGD | None = None
        self.optimizer_from: dict[int, dict] = {}
        self.byes: set[int] = set()
        self.done = Handle(f"{name} shutdown")
        for kind, fn in ((PUSH, self._on_push), (PUSHPULL, self._on_push),
                         (PULL, self._on_pull), (BCAST, self._on_bcast),
                         (CONFIG, self._on_config), (OPT, self._on_opt), (BYE, self._on_bye)):
            transport.handlers[kind] = fn

    def _slot(self, msg: Msg) -> _Slot:
        slot = self.slots.get((msg.key, msg.part))
        if slot is None:
            slot = self.slots[(msg.key, msg.part)] = _Slot()
        return slot

    def _reply(self, dst: int, like: Msg, kind: int, payload: Any = None,
               label: str | None = None) -> None:
        flags = FLAG_DATA if kind == REPLY else 0
        if kind == ERROR:
            payload = np.frombuffer(str(payload).encode(), np.uint8)
        elif kind == REPLY and dst == self.t.me:
            payload = payload.copy()  # the local worker copies it out later; rounds move on
        msg = Msg(kind, dst, like.key, like.part, priority=like.priority, payload=payload,
                  dtype=like.dtype if kind == REPLY else "uint8", flags=flags)
        if label is not None:
            msg.label = label
        self.t.send(msg)

    def _mismatch(self, msgs: dict[int, Msg]) -> str | None:
        ranks = sorted(msgs)
        ref = msgs[ranks[0]]
        for r in ranks[1:]:
            m = msgs[r]
            for label, a, b in (("dtype", ref.dtype, m.dtype), ("element count", ref.count,
                                m.count), ("reduce op", ref.op, m.op),
                                ("postscale factor", ref.postscale, m.postscale)):
                if a != b:
                    return (f"Mismatched {label} for key {ref.key} part {ref.part} on {self.name}: "
                            f"worker {ranks[0]} sent {a}, worker {r} sent {b}")
        return None

    # -- handlers -----------------------------------------------------------------------
    def _on_push(self, msg: Msg) -> None:
        if msg.flags & FLAG_GATED and msg.src != self.t.me:
            self.t.send(Msg(ACK, msg.src, msg.key, msg.part))
        slot = self._slot(msg)
        if msg.src in slot.pushes:
            self._reply(msg.src, msg, ERROR, f"worker {msg.src} pushed key {msg.key} part "
                        f"{msg.part} twice in one round")
            return
        slot.pushes[msg.src] = msg
        if len(slot.pushes) < self.w:
            return
        pushes, slot.pushes = slot.pushes, {}
        order = list(pushes)  # arrival order: replies go out in it, as in the simulator
        error = self._mismatch(pushes)
        if error is None:
            try:
                merged = self._combine(pushes)
                if msg.kind == PUSH:
                    self._store(slot, msg, merged)
            except Exception as err:  # a bad dtype/op must reach the workers, not kill us
                error = f"{type(err).__name__} on {self.name} for key {msg.key}: {err}"
        for w in order:
            if error is not None:
                self._reply(w, pushes[w], ERROR, error)
            elif msg.kind == PUSHPULL:
                self._reply(w, pushes[w], REPLY, merged)
        if msg.kind == PUSH:
            waiting, slot.waiting = slot.waiting, []
            for pull in waiting:
                self._answer_pull(slot, pull, error)

    def _combine(self, pushes: dict[int, Msg]) -> np.ndarray:
        ref = pushes[min(pushes)]
        ufunc = reduce_ufunc(ReduceOp(ref.op))
        acc = np.array(pushes[0].payload, copy=True)
        for w in range(1, self.w):
            ufunc(acc, pushes[w].payload, out=acc)
        scale_(acc, ref.postscale)
        return acc

    def _store(self, slot: _Slot, msg: Msg, merged: np.ndarray) -> None:
        if self.optimizer is None:
            slot.store = merged
            return
        if slot.store is None:
            raise RuntimeError(
                f"key {msg.key} part {msg.part} has no weights on the server to update; "
                f"broadcast the initial weights first (MXNet's kv.init)"
            )
        if slot.store.shape != merged.shape or slot.store.dtype != merged.dtype:
            raise ValueError(
                f"gradient {merged.dtype}[{merged.size}] does not match the stored weights "
                f"{slot.store.dtype}[{slot.store.size}]"
            )
        slot.mom = self.optimizer.step(slot.store, merged, slot.mom)

    def _on_pull(self, msg: Msg) -> None:
        slot = self._slot(msg)
        if msg.src in slot.pushes:  # this worker's push of the open round: wait for the rest
            slot.waiting.append(msg)
        else:
            self._answer_pull(slot, msg, None)

    def _answer_pull(self, slot: _Slot, pull: Msg, error: str | None) -> None:
        if error is None and slot.store is None:
            error = f"key {pull.key} part {pull.part} was pulled before anything was pushed"
        if error is not None:
            self._reply(pull.src, pull, ERROR, error)
        else:
            pull.dtype = slot.store.dtype.name
            self._reply(pull.src, pull, REPLY, slot.store)

    def _on_bcast(self, msg: Msg) -> None:
        slot = self._slot(msg)
        slot.bcast[msg.src] = msg
        if len(slot.bcast) < self.w:
            return
        got, slot.bcast = slot.bcast, {}
        roots = {m.root for m in got.values()}
        root = msg.root
        error = None
        if len(roots) != 1:
            error = f"Mismatched root rank for key {msg.key}: workers sent {sorted(roots)}"
        else:
            value = got[root].payload
            odd = [w for w, m in got.items() if (m.count, m.dtype) != (value.size, value.dtype.name)]
            if odd:
                m = got[odd[0]]
                error = (f"Mismatched shape or dtype for broadcast of key {msg.key}: root "
                         f"{root} sent {value.dtype.name}[{value.size}], worker {odd[0]} "
                         f"expects {m.dtype}[{m.count}]")
            else:
                slot.store, slot.mom = np.array(value, copy=True), None
        for w, m in got.items():
            if error is not None:
                self._reply(w, m, ERROR, error)
            elif w == root:
                self._reply(w, m, DONE)
            else:
                m.dtype = slot.store.dtype.name
                self._reply(w, m, REPLY, slot.store, label="broadcast")

    def _on_config(self, msg: Msg) -> None:
        cfg = _json_of(msg)
        if self.config is None:
            self.config = cfg
            if self.dedicated:
                self.t.configure(cfg["bandwidth_gbps"], cfg["latency_us"], bool(cfg["trace"]))
        elif cfg != self.config:
            raise RuntimeError(f"workers disagree on the parameter-server options: {self.config} "
                               f"vs worker {msg.src}'s {cfg}")

    def _on_opt(self, msg: Msg) -> None:
        spec = _json_of(msg)
        self.optimizer_from[msg.src] = spec
        if len(self.optimizer_from) == self.w:
            specs = self.optimizer_from
            self.optimizer_from = {}
            if any(s != specs[0] for s in specs.values()):
                odd = next(w for w, s in specs.items() if s != specs[0])
                raise RuntimeError(f"Mismatched optimizer: worker 0 sent {specs[0]}, worker "
                                   f"{odd} sent {specs[odd]}")
            self.optimizer = None if spec is None else SGD(**spec)
            for w in range(self.w):
                self._reply(w, msg, OPT_DONE)

    def _on_bye(self, msg: Msg) -> None:
        self.byes.add(msg.src)
        if len(self.byes) == self.w:
            self.done.set_result(None)


# ------------------------------------------------------------------------------ server ranks
_SERVED = False


def serve() -> None:
    """Run this server rank until every worker has closed, then exit the process (code 0).

    Called by ``ddpbench.create`` and ``ddpbench.init`` on a server rank. The workers'
    CONFIG messages tell the server how to pace and trace.
    """
    global _SERVED
    w = world()
    if not w.is_server:
        raise RuntimeError("serve() runs on server ranks only (ddpbench launch --servers)")
    if _SERVED:
        sys.exit(0)
    _SERVED = True
    eng = engine()
    comm = eng.call(w.comm.Dup).wait()
    j = w.rank - w.num_workers
    transport = Transport(comm, _dedicated_host_name(w.num_workers))
    server = Server(transport, w.num_workers, f"server{j}", dedicated=True)
    eng.register(transport)
    server.done.wait()
    _wait_idle(eng, transport)
    eng.unregister(transport)
    if server.config and isinstance(server.config.get("trace"), str):
        _write_trace(server.config["trace"], f"server{j}", transport.records)
    eng.call(comm.Free).wait()
    sys.stdout.flush()
    sys.exit(0)


def _dedicated_host_name(num_workers: int) -> Callable[[int], str]:
    return lambda r: f"worker{r}" if r < num_workers else f"server{r - num_workers}"


def _wait_idle(eng: Any, transport: Transport) -> None:
    while not eng.call(transport.idle).wait():
        time.sleep(1e-3)


def _write_trace(directory: str, host: str, records: list[SendRecord]) -> None:
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    (path / f"sends.{host}.json").write_text(json.dumps(chrome_trace(records)))


def chrome_trace(records: list[SendRecord], t0: float | None = None,
                 layer_of: Callable[[int], int] | None = None) -> dict[str, Any]:
    """Return ``records`` as Chrome-trace JSON, laid out like the simulator's timeline.

    Hosts are processes (``pid``), sends go to lane 1 ("send"), names read "push L3" as in
    :meth:`simulator.SimResult.to_chrome_trace`; ``layer_of(key)`` maps keys to layers
    (default: the key). ``t0`` (default: the first send) becomes time zero.
    """
    if t0 is None:
        t0 = min((r.start for r in records), default=0.0)
    layer_of = layer_of or (lambda k: k)
    hosts = sorted({r.src for r in records}, key=_host_order)
    pid = {h: i for i, h in enumerate(hosts)}
    events: list[dict[str, Any]] = []
    for h, p in pid.items():
        events.append({"ph": "M", "name": "process_name", "pid": p, "tid": 0,
                       "args": {"name": h}})
        events.append({"ph": "M", "name": "thread_name", "pid": p, "tid": 1,
                       "args": {"name": "send"}})
    for r in records:
        layer = layer_of(r.key)
        events.append({"ph": "X", "name": f"{r.kind} L{layer}", "cat": r.kind, "pid": pid[r.src],
                       "tid": 1, "ts": (r.start - t0) * 1e6, "dur": (r.end - r.start) * 1e6,
                       "args": {"layer": layer, "bytes": r.bytes, "peer": r.dst, "key": r.key,
                                "part": r.part, "priority": r.priority,
                                "t_monotonic": r.start}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _host_order(h: str) -> tuple[int, int]:
    return (0 if h.startswith("worker") else 1, int("".join(c for c in h if c.isdigit()) or 0))


def merge_chrome_traces(directory: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Merge the per-process ``sends.*.json`` files in ``directory`` into one trace at ``out``.

    Every process stamps its sends with the host's monotonic clock, so one host's traces
    line up; the earliest send becomes time zero.
    """
    records = []
    for path in sorted(Path(directory).glob("sends.*.json")):
        for e in json.loads(path.read_text())["traceEvents"]:
            if e["ph"] != "X":
                continue
            a = e["args"]
            host = path.stem.split(".", 1)[1]
            start = a["t_monotonic"]
            records.append(SendRecord(start, start + e["dur"] / 1e6, e["cat"], a["key"],
                                      a["part"], a["priority"], a["bytes"], host, a["peer"]))
    target = Path(out)
    target.write_text(json.dumps(chrome_trace(records)))
    return target


# ------------------------------------------------------------------------------ worker side
@dataclass(frozen=True)
class Part:
    """One part of an array: elements ``[offset, offset + count)`` go to server ``server``."""

    offset: int
    count: int
    server: int


@dataclass
class _Plan:
    key: int
    numel: int
    dtype: str
    parts: list[Part]


@dataclass
class _Op:
    handle: Handle
    flat: np.ndarray
    plan: _Plan
    remaining: int
    output: Any
    errors: list[str] = field(default_factory=list)


class PSStore(EngineStore):
    """Worker side of a parameter-server backend (subclasses: kvstore, p3, byteps).

    Lifecycle: ``create`` (collective over workers and servers; on a server rank it serves
    and exits) -> ``broadcast`` (initialises the servers' copy, MXNet's ``init``) ->
    ``push_pull`` (completes when every worker has pushed every part) -> ``close``
    (collective; when every worker has closed, server ranks exit). All workers must use
    names in the same order of first use: placement counters follow it.

    Colocated, this process's engine thread also serves the other workers: while the store
    is open, do not run blocking MPI calls on the engine (``engine().call(comm.Barrier)``);
    another worker may be waiting for this process's server. Synchronise through the store
    (a ``push_pull`` of a tiny array) or after ``close``.

    Subclasses set ``Options`` and implement :meth:`split` and :meth:`schedule`.
    """

    server_role = True
    Options = PSOptions
    capabilities = frozenset({"broadcast", "push_pull"})
    merged_push_pull = True  # False: separate push and pull requests (kvstore)

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        w = self._world
        if w.is_server:
            serve()  # exits the process when the workers have closed
        if w.num_servers and self.options.servers == "colocated":
            raise ValueError(
                f"backend {self.type!r}: servers='colocated' but the launch started "
                f"{w.num_servers} server ranks, which would wait forever; launch without "
                f"--servers or leave the servers option unset"
            )
        if isinstance(self.options.servers, int) and self.options.servers != w.num_servers:
            raise ValueError(
                f"backend {self.type!r}: servers={self.options.servers} but the launch has "
                f"{w.num_servers} server ranks; start it with 'ddpbench launch -n "
                f"{w.num_workers} --servers {self.options.servers} -- ...'"
            )
        if w.num_servers and _STATE["dedicated_closed"]:
            raise RuntimeError(
                f"backend {self.type!r}: the server ranks of this job exited when the "
                f"previous parameter-server store closed; launch a new job for another store"
            )
        self.dedicated = w.num_servers > 0
        self.num_servers = w.num_servers if self.dedicated else w.num_workers
        base = w.comm if self.dedicated else w.role_comm
        self._comm = self._engine.call(base.Dup).wait()
        host_of = (_dedicated_host_name(w.num_workers) if self.dedicated
                   else (lambda r: f"worker{r}"))
        o = self.options
        self._transport = Transport(self._comm, host_of, o.bandwidth_gbps, o.latency_us,
                                    bool(o.trace))
        self._transport.on_fail = [self._fail_all]
        self._server = (None if self.dedicated else
                        Server(self._transport, w.num_workers, f"worker{w.role_rank}", False))
        t = self._transport
        t.handlers.update({REPLY: self._on_reply, DONE: self._on_reply, ERROR: self._on_reply,
                           ACK: self._on_ack})
        self._keys: dict[Any, int] = {}
        self._plans: dict[int, _Plan] = {}
        self._inflight: dict[tuple[int, int], _Op] = {}
        self._gates: dict[Any, Gate] = {}
        self._engine.register(t)
        config = {"bandwidth_gbps": o.bandwidth_gbps, "latency_us": o.latency_us,
                  "trace": o.trace, "backend": self.type}
        self._engine.call(lambda: [t.send(Msg(CONFIG, self._server_rank(j),
                                              payload=_json_payload(config)))
                                   for j in range(self.num_servers)]).wait()
        _OPEN.add(self)

    # -- for subclasses -------------------------------------------------------------------
    @abc.abstractmethod
    def split(self, key: int, numel: int, itemsize: int) -> list[Part]:
        """Cut a new key's array into parts and place them (each backend's placement rule, docs/fidelity.md)."""

    def place_round_robin(self, numel: int, size: int) -> list[Part]:
        """Cut into parts of ``size`` elements, placed by one counter that continues across
        keys in order of first use (P3's and BytePS's placement, each backend's placement rule, docs/fidelity.md)."""
        counter = self.__dict__.setdefault("_placement", itertools.count())
        return round_robin(numel, size, counter.__next__, self.num_servers)

    def schedule(self, priority: int, part: Part, nbytes: int) -> tuple[int, Gate | None, float]:
        """Return (queue priority, gate or None, cost against the gate) for one push."""
        return 0, None, 1.0

    def gate(self, key: Any, limit: float) -> Gate:
        """Return the gate named ``key`` (created with ``limit`` on first use)."""
        g = self._gates.get(key)
        if g is None:
            g = self._gates[key] = Gate(limit)
        return g

    # -- identity -------------------------------------------------------------------------
    @property
    def trace_records(self) -> list[SendRecord]:
        """Every data message this worker has sent so far (needs ``trace=True``)."""
        return list(self._transport.records)

    @property
    def bytes_sent(self) -> int:
        """Payload bytes this process has sent over MPI (colocated: its server's too)."""
        return self._transport.bytes_sent

    def _server_rank(self, j: int) -> int:
        return self.num_workers + j if self.dedicated else j

    # -- placement ------------------------------------------------------------------------
    def _plan(self, name: Any, tensor: Any) -> _Plan:
        key = self._keys.get(name)
        if key is None:
            key = name if isinstance(name, int) else len(self._keys)
            self._keys[name] = key
        dtype = np.dtype(tensor.dtype)
        plan = self._plans.get(key)
        if plan is None:
            check_dtype(name, dtype)
            parts = [p for p in self.split(key, int(tensor.size), dtype.itemsize) if p.count]
            plan = self._plans[key] = _Plan(key, int(tensor.size), dtype.name, parts)
        elif plan.numel != tensor.size or plan.dtype != dtype.name:
            raise ValueError(
                f"tensor {name!r} is {dtype.name}[{tensor.size}] but was first used as "
                f"{plan.dtype}[{plan.numel}]; a name keeps its size and dtype (its parts are "
                f"placed on servers at first use)"
            )
        return plan

    # -- data movement ----------------------------------------------------------------------
    def _start(self, plan: _Plan, flat: np.ndarray, output: Any,
               send: Callable[[_Op], None]) -> Handle:
        handle = self._track(Handle(plan.key))
        op = _Op(handle, flat, plan, len(plan.parts), output)
        if not plan.parts:
            handle.set_result(output)
            return handle

        def begin() -> None:
            busy = [i for i in range(len(plan.parts)) if (plan.key, i) in self._inflight]
            if busy:
                handle.set_error(ValueError(
                    f"key {plan.key} is already in flight on worker {self.rank}; wait for "
                    f"it before reusing the name"))
                return
            for i in range(len(plan.parts)):
                self._inflight[(plan.key, i)] = op
            send(op)

        self._engine.submit(self._transport, begin)
        return handle

    def _broadcast(self, names: list[Any], tensors: list[Any], root_rank: int) -> None:
        handles = []
        me = self.rank
        for name, tensor in zip(names, tensors):
            plan = self._plan(name, tensor)
            flat = tensor.reshape(-1)

            def send(op: _Op, flat: np.ndarray = flat) -> None:
                for i, p in enumerate(op.plan.parts):
                    is_root = me == root_rank
                    msg = Msg(BCAST, self._server_rank(p.server), op.plan.key, i,
                              payload=flat[p.offset:p.offset + p.count] if is_root else None,
                              dtype=op.plan.dtype, root=root_rank,
                              flags=FLAG_DATA if is_root else 0)
                    msg.count = p.count
                    self._transport.send(msg)

            handles.append(self._start(plan, flat, tensor, send))
        for h in handles:
            h.wait()

    def _push_pull_async(self, name, tensor, output, *, priority, op, prescale, postscale):
        if not -(2**31) <= priority < 2**31:
            raise ValueError(f"priority {priority} for {name!r} must fit in 32 bits "
                             f"(trainers pass -layer_index)")
        plan = self._plan(name, tensor)
        if op is ReduceOp.AVERAGE:
            postscale, op = postscale / self.num_workers, ReduceOp.SUM
        if output is not tensor:
            output[...] = tensor
        flat = output.reshape(-1)
        if prescale != 1.0:
            scale_(flat, prescale)

        def send(o: _Op) -> None:
            for i, p in enumerate(o.plan.parts):
                dst = self._server_rank(p.server)
                chunk = flat[p.offset:p.offset + p.count]
                if self.merged_push_pull:
                    qprio, gate, cost = self.schedule(priority, p, chunk.nbytes)
                    msg = Msg(PUSHPULL, dst, o.plan.key, i, priority=qprio, payload=chunk,
                              dtype=o.plan.dtype, op=op.value, postscale=postscale,
                              flags=FLAG_DATA | (FLAG_GATED if gate is not None else 0))
                    msg.gate, msg.cost = gate, cost
                else:
                    msg = Msg(PUSH, dst, o.plan.key, i, payload=chunk, dtype=o.plan.dtype,
                              op=op.value, postscale=postscale, flags=FLAG_DATA)
                    # MXNet issues the pull right behind the push; the server answers it
                    # once every worker's push of this round is in.
                    msg.after_send = self._pull_after(dst, o.plan.key, i)
                self._transport.send(msg)

        return self._start(plan, flat, output, send)

    def _pull_after(self, dst: int, key: int, part: int) -> Callable[[], None]:
        return lambda: self._transport.send(Msg(PULL, dst, key, part))

    # -- engine-thread handlers ---------------------------------------------------------------
    def _on_reply(self, msg: Msg) -> None:
        op = self._inflight.pop((msg.key, msg.part), None)
        if op is None:
            raise RuntimeError(f"worker {self.rank} got a reply for key {msg.key} part "
                               f"{msg.part} that it did not ask for")
        if msg.kind == REPLY:
            p = op.plan.parts[msg.part]
            op.flat[p.offset:p.offset + p.count] = msg.payload
        elif msg.kind == ERROR:
            op.errors.append(bytes(msg.payload).decode())
        op.remaining -= 1
        if op.remaining == 0:
            if op.errors:
                op.handle.set_error(ValueError(op.errors[0]))
            else:
                op.handle.set_result(op.output)

    def _on_ack(self, msg: Msg) -> None:
        # The reply may come first (the port orders data by priority; acks keep no order).
        plan = self._plans.get(msg.key)
        if plan is None or not 0 <= msg.part < len(plan.parts):
            raise RuntimeError(f"worker {self.rank}: stray ack for key {msg.key} part {msg.part}")
        p = plan.parts[msg.part]
        _, gate, cost = self.schedule(0, p, p.count * _np_dtype(plan.dtype).itemsize)
        if gate is not None:
            self._transport.release(gate, cost)

    def _fail_all(self, error: BaseException) -> None:
        for op in list(self._inflight.values()):
            if not op.handle.done():
                op.handle.set_error(error)
        self._inflight.clear()

    # -- optimizer ----------------------------------------------------------------------------
    def _send_optimizer(self, spec: dict | None) -> None:
        """Send ``spec`` (SGD hyperparameters, or None to stop updating) to every server."""
        self.synchronize()
        done = Handle("set_optimizer")
        left = [self.num_servers]

        def on_done(msg: Msg) -> None:
            left[0] -= 1
            if left[0] == 0:
                done.set_result(None)

        def begin() -> None:
            self._transport.handlers[OPT_DONE] = on_done
            for j in range(self.num_servers):
                self._transport.send(Msg(OPT, self._server_rank(j), payload=_json_payload(spec)))

        self._engine.submit(self._transport, begin)
        done.wait()

    # -- lifecycle ------------------------------------------------------------------------------
    def _release(self) -> None:
        """Tell the servers this worker is done; collective over the workers.

        Colocated, the call returns once every worker has closed (its server must stay up
        until then). With server ranks, those exit when the last worker's goodbye arrives.
        """
        _OPEN.discard(self)
        t = self._transport
        self._engine.call(lambda: [t.send(Msg(BYE, self._server_rank(j)))
                                   for j in range(self.num_servers)]).wait()
        if self._server is not None:
            self._server.done.wait()
        _wait_idle(self._engine, t)
        t.keep_polling = False
        self._engine.unregister(t)
        if self.dedicated:
            _STATE["dedicated_closed"] = True
        if isinstance(self.options.trace, str):
            _write_trace(self.options.trace, f"worker{self.rank}", t.records)
        self._engine.call(self._comm.Free).wait()


_STATE = {"dedicated_closed": False}
_OPEN: weakref.WeakSet[PSStore] = weakref.WeakSet()


@atexit.register
def _close_open_stores() -> None:
    # A script that forgets close() must still release the servers, or they would wait
    # for its goodbye forever. Runs before the engine's own atexit shutdown.
    for store in list(_OPEN):
        try:
            store.close()
        except Exception as err:  # exiting anyway; say why the servers may complain
            sys.stderr.write(f"ddpbench: closing {store.type!r} at exit failed: {err}\n")


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

