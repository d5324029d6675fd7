"""The summation server of the parameter-server backends, and the server ranks' loop.

A part's pushes from all workers are combined in the order they arrived, the first copied
and the others added to it (MXNet's ``DataHandleDefault``, P3's fork, BytePS's
``COPY_FIRST``/``SUM_RECV``), or in worker-rank order with ``sum_order="rank"``
(ddpbench's variant: the same bits whatever the arrival order), scaled by the postscale
factor, and then either sent back (merged
push-pull) or stored, where separate pull requests read it (``kvstore``); with an optimizer
(:class:`ddpbench.SGD`, ``set_optimizer``) the stored weights are updated instead.
``broadcast`` goes through the server too: the root's value is stored as the part's weights
(MXNet's ``init``) and sent to every other worker.

A server rank runs :func:`serve` until every worker has closed, then exits; in colocated
mode every worker process also runs a :class:`Server` on its own transport, and a part whose
server is the local process costs no MPI message.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ddpbench import trace
from ddpbench.api import Handle, ReduceOp
from ddpbench.backends.ps.transport import SendRecord, Transport
from ddpbench.backends.ps.wire import (
    ACK,
    ALIGN,
    BCAST,
    BYE,
    CONFIG,
    DONE,
    ERROR,
    FLAG_ACK_ARRIVAL,
    FLAG_ACK_ROUND,
    FLAG_DATA,
    FLAG_GATED,
    FLAG_PRIO_REPLY,
    OPT,
    OPT_DONE,
    PULL,
    PUSH,
    PUSHPULL,
    REPLY,
    Msg,
    json_of,
    np_dtype,
)
from ddpbench.comm import engine, world
from ddpbench.optim import SGD
from ddpbench.tensor_ops import Arena, reduce_ufunc, scale_

__all__ = ["Server", "dedicated_host_name", "serve", "wait_idle", "write_trace"]


def _offset(align: int, dtype: np.dtype) -> int:
    """``align`` where a ``dtype`` array can start there within a cache line, else 0."""
    return align if 0 <= align < ALIGN and align % dtype.itemsize == 0 else 0


class _Slot:
    """A server's state for one part: this round's pushes, stored weights, pulls waiting."""

    __slots__ = ("pushes", "store", "mom", "waiting", "bcast", "error", "inbox", "acc",
                 "moved", "kept")

    def __init__(self) -> None:
        self.pushes: dict[int, Msg] = {}
        # Per worker, the buffer its pushes of this part are received into, and the sum's
        # buffer: both reused every round. A worker pushes the part again only once it has
        # this round's answer, so no round overwrites what an earlier one still sends.
        self.inbox: dict[int, np.ndarray] = {}
        self.acc: np.ndarray | None = None
        # Who (a worker, -1 for the sum) once had a buffer re-placed to a new offset: not
        # again, so a worker whose arrays lie at changing offsets cannot grow the arena.
        self.moved: set[int] = set()
        # Who -> (buffer, count, dtype, offset) of the last request a buffer was kept for:
        # the same request again keeps it without reading its address again.
        self.kept: dict[int, tuple[np.ndarray, int, np.dtype, int]] = {}
        self.store: np.ndarray | None = None
        self.mom: np.ndarray | None = None
        self.waiting: list[Msg] = []
        self.bcast: dict[int, Msg] = {}
        self.error: str | None = None  # the last round's error, for its pulls


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
        self.arena = Arena()  # the parts' inboxes and sums
        for kind, fn in ((PUSH, self._on_push), (PUSHPULL, self._on_push),
                         (PULL, self._on_pull), (BCAST, self._on_bcast),
                         (CONFIG, self._on_config), (OPT, self._on_opt), (BYE, self._on_bye)):
            transport.handlers[kind] = fn
        transport.sinks[PUSH] = transport.sinks[PUSHPULL] = self._push_sink

    def _push_sink(self, msg: Msg) -> np.ndarray:
        """The buffer a worker's push of a part is received into (reused every round), at
        the push's own offset within a cache line (the wire's ``src_align``)."""
        slot = self._slot(msg)
        buf = slot.inbox.get(msg.src)
        dtype = np_dtype(msg.dtype)
        if buf is None or not self._keep(slot, msg.src, buf, msg.count, dtype, msg.src_align):
            buf = slot.inbox[msg.src] = self._buffer(msg.count, dtype, msg.src_align)
        return buf

    def _keep(self, slot: _Slot, who: int, buf: np.ndarray, count: int, dtype: np.dtype,
              align: int) -> bool:
        """True when ``buf`` can be reused: the right size and type, and at offset ``align``
        within a cache line where an arena buffer would be (re-placed once at most)."""
        last = slot.kept.get(who)
        if last is not None and last[0] is buf and last[1:] == (count, dtype, align):
            return True
        if buf.size != count or buf.dtype != dtype:
            return False
        if (who in slot.moved or buf.nbytes < self.arena.min_bytes
                or buf.ctypes.data % ALIGN == _offset(align, buf.dtype)):
            slot.kept[who] = (buf, count, dtype, align)
            return True
        slot.moved.add(who)
        return False

    def _buffer(self, count: int, dtype: np.dtype, align: int) -> np.ndarray:
        """A long-lived buffer at offset ``align`` within a cache line (where it can be)."""
        return self.arena.empty(count, dtype, _offset(align, dtype))

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
        # A ps-lite or BytePS server answers without priority, in the order sums complete,
        # straight into its socket; ddpbench's variants keep the push's priority.
        priority = like.priority if like.flags & FLAG_PRIO_REPLY else 0
        msg = Msg(kind, dst, like.key, like.part, priority=priority, payload=payload,
                  dtype=like.dtype if kind == REPLY else "uint8", flags=flags)
        if label is not None:
            msg.label = label
        self.t.send(msg, direct=True)

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
        # BytePS acknowledges a push on arrival (the worker then pulls); a gated push of
        # ddpbench's windows is acknowledged on arrival too (no local window to release).
        if msg.flags & FLAG_ACK_ARRIVAL or (msg.flags & FLAG_GATED and msg.src != self.t.me):
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
                merged = self._combine(slot, pushes)
                if msg.kind == PUSH or self.optimizer is not None:
                    self._store(slot, msg, merged)
                    if msg.kind == PUSHPULL and slot.store is not None:
                        merged = slot.store  # P3's ApplyUpdates: answer with the weights
            except Exception as err:  # a bad dtype/op must reach the workers, not kill us
                error = f"{type(err).__name__} on {self.name} for key {msg.key}: {err}"
        if msg.kind == PUSHPULL:
            for w in order:
                if error is not None:
                    self._reply(w, pushes[w], ERROR, error)
                else:
                    self._reply(w, pushes[w], REPLY, merged)
            return
        # Separate push and pull: errors reach the workers through their pulls.
        slot.error = error
        for w in order:
            if pushes[w].flags & FLAG_ACK_ROUND:  # MXNet answers every push of the round now
                self.t.send(Msg(ACK, w, msg.key, msg.part))
        waiting, slot.waiting = slot.waiting, []
        for pull in waiting:
            self._answer_pull(slot, pull, error)

    def _combine(self, slot: _Slot, pushes: dict[int, Msg]) -> np.ndarray:
        """Sum the round's pushes into the part's reused buffer: in arrival order (the
        originals'; ``pushes`` holds them as they came), or by worker rank."""
        ref = pushes[min(pushes)]
        if self.config is None or self.config.get("sum_order", "arrival") == "arrival":
            order = list(pushes)
        else:
            order = sorted(pushes)
        first = pushes[order[0]].payload
        if self.w == 1 and pushes[0].sunk:
            acc = first  # this server's inbox, rewritten only by the worker it answers
        else:
            # The sum is sent to every worker: placed where the lowest rank wants it.
            acc, align = slot.acc, pushes[min(pushes)].dst_align
            if acc is None or not self._keep(slot, -1, acc, first.size, first.dtype, align):
                acc = slot.acc = self._buffer(first.size, first.dtype, align)
            if self.w == 1:
                np.copyto(acc, first)
            else:
                ufunc = reduce_ufunc(ReduceOp(ref.op))
                ufunc(first, pushes[order[1]].payload, out=acc)
                for w in order[2:]:
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
        if slot.mom is None:
            slot.mom = self.optimizer.create_state(slot.store)
        self.optimizer.update(slot.store, merged, slot.mom)

    def _on_pull(self, msg: Msg) -> None:
        slot = self._slot(msg)
        if msg.src in slot.pushes:  # this worker's push of the open round: wait for the rest
            slot.waiting.append(msg)
        else:
            self._answer_pull(slot, msg, slot.error)

    def _answer_pull(self, slot: _Slot, pull: Msg, error: str | None) -> None:
        if error is None and slot.store is None:
            error = f"key {pull.key} part {pull.part} was pulled before anything was pushed"
        if error is not None:
            self._reply(pull.src, pull, ERROR, error)
        elif slot.store is not None:
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
                slot.store, slot.mom, slot.error = np.array(value, copy=True), None, None
        for w, m in got.items():
            if error is not None:
                self._reply(w, m, ERROR, error)
            elif w == root:
                self._reply(w, m, DONE)
            elif slot.store is not None:
                m.dtype = slot.store.dtype.name
                self._reply(w, m, REPLY, slot.store, label="broadcast")

    def _on_config(self, msg: Msg) -> None:
        cfg = json_of(msg)
        if self.config is None:
            self.config = cfg
            if self.dedicated:
                self.t.configure(cfg["bandwidth_gbps"], cfg["latency_us"], bool(cfg["trace"]))
                sockets = cfg.get("server_sockets")
                if sockets:  # P3's ps-lite: the server process's own sockets
                    self.t.use_server_sockets(int(sockets["hwm"]), int(sockets["sndbuf"]))
        elif cfg != self.config:
            raise RuntimeError(f"workers disagree on the parameter-server options: {self.config} "
                               f"vs worker {msg.src}'s {cfg}")

    def _on_opt(self, msg: Msg) -> None:
        spec = json_of(msg)
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


def serve(last: bool = True) -> None:
    """Run this server rank until every worker has closed, then exit the process (code 0).

    Called by ``ddpbench.create`` and ``ddpbench.init`` on a server rank. The workers'
    CONFIG messages tell the server how to pace and trace. With ``last`` False it returns
    instead of exiting, to serve the job's next store (the workers call
    :func:`ddpbench.backends.ps.worker.expect_another_store` before creating it).
    """
    global _SERVED
    w = world()
    if not w.is_server:
        raise RuntimeError("serve() runs on server ranks only (ddpbench launch --servers)")
    if _SERVED:
        sys.exit(0)
    _SERVED = last
    eng = engine()
    comm = eng.call(w.comm.Dup).wait()
    j = w.rank - w.num_workers
    transport = Transport(comm, dedicated_host_name(w.num_workers))
    transport.serving = True
    server = Server(transport, w.num_workers, f"server{j}", dedicated=True)
    eng.register(transport)
    server.done.wait()
    wait_idle(eng, transport)
    eng.unregister(transport)
    if server.config and isinstance(server.config.get("trace"), str):
        write_trace(server.config["trace"], f"server{j}", transport.records)
    eng.call(comm.Free).wait()
    sys.stdout.flush()
    if last:
        sys.exit(0)


def dedicated_host_name(num_workers: int) -> Callable[[int], str]:
    """Return comm rank -> host name when the servers are ranks W..W+S-1."""
    return lambda r: f"worker{r}" if r < num_workers else f"server{r - num_workers}"


def wait_idle(eng: Any, transport: Transport) -> None:
    """Return once ``transport`` has nothing queued, in flight or waiting for delivery."""
    while not eng.call(transport.idle).wait():
        time.sleep(1e-3)


def write_trace(directory: str, host: str, records: list[SendRecord]) -> None:
    """Write ``host``'s sends as ``directory/sends.HOST.json`` (:mod:`ddpbench.trace`)."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    trace.write(path / f"sends.{host}.json", trace.chrome_trace([r.span() for r in records]))


