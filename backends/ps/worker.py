"""The worker side of the parameter-server backends: :class:`PSStore`.

A subclass (``kvstore``, ``p3``, ``byteps``) supplies its knobs model (from
:mod:`ddpbench.contract`), its placement of an array's parts on servers
(:mod:`ddpbench.rules.placement`) and its send policy; this module turns ``broadcast``
and ``push_pull`` into messages (:mod:`.wire`) on the process's
:class:`~.transport.Transport` and completes the caller's handles from the replies. In
colocated mode the same process also runs a :class:`~.server.Server` on that transport.
"""

from __future__ import annotations

import abc
import atexit
import sys
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ddpbench.api import Handle, ReduceOp
from ddpbench.backends._common import EngineStore, check_dtype
from ddpbench.backends.ps.server import (
    Server,
    dedicated_host_name,
    serve,
    wait_idle,
    write_trace,
)
from ddpbench.backends.ps.transport import Gate, SendRecord, Transport
from ddpbench.backends.ps.wire import (
    ACK,
    ALIGN,
    BCAST,
    BYE,
    CONFIG,
    DONE,
    ERROR,
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
    json_payload,
    np_dtype,
)
from ddpbench.contract import PSKnobs
from ddpbench.optim import SGD
from ddpbench.rules.placement import Part
from ddpbench.tensor_ops import scale_

KICK_EVERY = 8
"""Unpaced, the queued parts of one push go to the wire every this many parts."""

__all__ = ["PSStore"]


def _address(array: Any) -> int:
    """The address of a NumPy array's first element (0 for anything else)."""
    return array.ctypes.data if isinstance(array, np.ndarray) else 0


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
    divide: int = 0  # BytePS's average: the worker divides the pulled sum by this


class PSStore(EngineStore):
    """Worker side of a parameter-server backend (subclasses: kvstore, p3, byteps).

    Lifecycle: ``create`` (collective over workers and servers; on a server rank it serves
    and exits) -> ``broadcast`` (initialises the servers' copy, MXNet's ``init``) ->
    ``push_pull`` (completes when every worker has pushed every part) -> ``close``
    (collective; when every worker has closed, server ranks exit). All workers must use
    names in the same order of first use: placement follows it.

    Colocated, this process's engine thread also serves the other workers: while the store
    is open, do not run blocking MPI calls on the engine (``engine().call(comm.Barrier)``);
    another worker may be waiting for this process's server. Synchronise through the store
    (a ``push_pull`` of a tiny array) or after ``close``.

    Subclasses set ``Options`` and implement :meth:`split` and :meth:`schedule`.
    """

    server_role = True
    Options = PSKnobs
    options: PSKnobs
    capabilities = frozenset({"broadcast", "push_pull"})
    ack_flag = FLAG_ACK_ROUND  # when the server answers a separate push (MXNet's rule)
    average_on_worker = False  # AVERAGE: the server scales the sum (False) or the worker

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
        host_of = (dedicated_host_name(w.num_workers) if self.dedicated
                   else (lambda r: f"worker{r}"))
        o = self.options
        self._transport = Transport(self._comm, host_of, o.bandwidth_gbps, o.latency_us,
                                    bool(o.trace))
        self._transport.on_fail.append(self._fail_all)
        self._server = (None if self.dedicated else
                        Server(self._transport, w.num_workers, f"worker{w.role_rank}", False))
        t = self._transport
        t.handlers.update({REPLY: self._on_reply, DONE: self._on_reply, ERROR: self._on_reply,
                           ACK: self._on_ack})
        t.sinks[REPLY] = self._reply_sink
        t.expecting = lambda: bool(self._inflight)
        self._keys: dict[Any, int] = {}
        self._declared: dict[Any, int] = {}  # name -> declared key (BytePS), init order
        self._plans: dict[int, _Plan] = {}
        self._inflight: dict[tuple[int, int], _Op] = {}
        self._gates: dict[Any, Gate] = {}
        self._engine.register(t)
        config = {"bandwidth_gbps": o.bandwidth_gbps, "latency_us": o.latency_us,
                  "trace": o.trace, "backend": self.type, "sum_order": o.sum_order,
                  "server_sockets": self.server_sockets()}

        def configure() -> None:
            for j in range(self.num_servers):
                t.send(Msg(CONFIG, self._server_rank(j), payload=json_payload(config)))

        self._engine.call(configure).wait()
        _OPEN.add(self)

    # -- for subclasses -------------------------------------------------------------------
    @abc.abstractmethod
    def split(self, key: int, declared: int, numel: int, itemsize: int) -> list[Part]:
        """Cut a new array into parts and place them (:mod:`ddpbench.rules.placement`).

        ``key`` is the name when it is an int, else its declared key; ``declared`` is always
        the declared key (0, 1, ... in the order of :meth:`declare`, then of first use),
        BytePS's declared key and MXNet's integer key of a string name.
        """

    def schedule(self, priority: int, part: Part, nbytes: int) -> tuple[int, Gate | None, float]:
        """Return (queue priority, gate or None, cost against the gate) for one push."""
        return 0, None, 1.0

    def prioritised_replies(self) -> bool:
        """Return True when servers answer with the push's priority (a ddpbench variant)."""
        return False

    def server_sockets(self) -> dict[str, int] | None:
        """Return the servers' own sockets (``{"hwm": ..., "sndbuf": ...}``, P3's ps-lite
        processes) or None: replies go out as the transport sends them otherwise."""
        return None

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
    def declare(self, names: Sequence[Any]) -> None:
        """Declare ``names`` in this order, before their first use: each new name gets the
        next declared key (0, 1, ...); a name already declared or used keeps its own.

        This is BytePS's ``declare`` (``IsTensorDeclared`` numbers tensors as they are
        declared, byteps/common/global.cc) and the order of MXNet's ``kv.init`` for string
        keys (src/kvstore/kvstore_local.h, ``str_key_dict_``). Placement follows the
        declared key, so every worker must declare the same names in the same order;
        :func:`ddpbench.rules.placement.declaration_order` gives the originals' front
        ends' orders. Names never declared are declared at their first use. Local.
        """
        for name in names:
            if name not in self._declared:
                self._declared[name] = len(self._declared)

    def placement(self, name: Any) -> list[Part]:
        """Return where the parts of ``name`` (used or broadcast before) live."""
        key = self._keys.get(name)
        if key is None:
            raise KeyError(f"{name!r} has not been used on worker {self.rank}")
        return list(self._plans[key].parts)

    def _plan(self, name: Any, tensor: Any) -> _Plan:
        key = self._keys.get(name)
        if key is None:
            declared = self._declared.setdefault(name, len(self._declared))
            key = name if isinstance(name, int) else declared
            self._keys[name] = key
        dtype = np.dtype(tensor.dtype)
        plan = self._plans.get(key)
        if plan is None:
            check_dtype(name, dtype)
            declared = self._declared[name]
            parts = [p for p in self.split(key, declared, int(tensor.size), dtype.itemsize)
                     if p.count]
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
               send: Callable[[_Op], None], divide: int = 0) -> Handle:
        handle = self._track(Handle(plan.key))
        op = _Op(handle, flat, plan, len(plan.parts), output, divide=divide)
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
        divide = 0
        if op is ReduceOp.AVERAGE:
            if self.average_on_worker:  # BytePS: sum on the servers, divide after the pull
                divide = self.num_workers
            else:
                postscale = postscale / self.num_workers
            op = ReduceOp.SUM
        flat = output.reshape(-1)
        source = flat
        if output is not tensor:
            if prescale == 1.0 and not np.may_share_memory(tensor, output):
                source = tensor.reshape(-1)  # push the input itself; replies land in output
            else:
                output[...] = tensor
        if prescale != 1.0:
            scale_(flat, prescale)

        def send(o: _Op) -> None:
            merged = self.merged()
            # Where each part lies and where its sum goes, modulo a cache line (the wire).
            size = source.itemsize
            src_at, dst_at = _address(source), _address(flat)
            for i, p in enumerate(o.plan.parts):
                dst = self._server_rank(p.server)
                chunk = source[p.offset:p.offset + p.count]
                qprio, gate, cost = self.schedule(priority, p, chunk.nbytes)
                flags = (FLAG_DATA | (FLAG_GATED if gate is not None else 0)
                         | (FLAG_PRIO_REPLY if self.prioritised_replies() else 0)
                         | (0 if merged else self.ack_flag))
                # Merged: the server answers the push with the sum. Otherwise the push is
                # acknowledged (on arrival, BytePS; once every worker's is in, MXNet) and
                # the worker then pulls (:meth:`_on_ack`).
                msg = Msg(PUSHPULL if merged else PUSH, dst, o.plan.key, i, priority=qprio,
                          payload=chunk, dtype=o.plan.dtype, op=op.value,
                          postscale=postscale, flags=flags)
                msg.gate, msg.cost = gate, cost
                msg.src_align = (src_at + p.offset * size) % ALIGN
                msg.dst_align = (dst_at + p.offset * size) % ALIGN
                self.dispatch(msg, p)
                if i % KICK_EVERY == KICK_EVERY - 1:
                    self._transport.kick()  # the wire starts while the rest are queued

        return self._start(plan, flat, output, send, divide)

    def merged(self) -> bool:
        """Return True when a push is answered with the sum (one merged message)."""
        return True

    def dispatch(self, msg: Msg, part: Part) -> None:
        """Send one part's push (engine thread); a scheduler may hold it back first."""
        self._transport.send(msg)

    def pushed(self, part: Part) -> None:
        """The server has acknowledged this worker's push of ``part`` (engine thread)."""

    # -- engine-thread handlers ---------------------------------------------------------------
    def _reply_sink(self, msg: Msg) -> np.ndarray | None:
        """Receive a reply's elements straight into the caller's output (engine thread).

        Safe while the part is in flight: the server answers only once it has received this
        worker's push of the part, so nothing still reads that memory.
        """
        op = self._inflight.get((msg.key, msg.part))
        if op is None or not isinstance(op.flat, np.ndarray):
            return None
        p = op.plan.parts[msg.part]
        return op.flat[p.offset:p.offset + p.count]

    def _on_reply(self, msg: Msg) -> None:
        op = self._inflight.pop((msg.key, msg.part), None)
        if op is None:
            raise RuntimeError(f"worker {self.rank} got a reply for key {msg.key} part "
                               f"{msg.part} that it did not ask for")
        if msg.kind == REPLY and not msg.sunk:
            p = op.plan.parts[msg.part]
            op.flat[p.offset:p.offset + p.count] = msg.payload
        elif msg.kind == ERROR:
            op.errors.append(bytes(msg.payload).decode())
        op.remaining -= 1
        if op.remaining == 0:
            if op.errors:
                op.handle.set_error(ValueError(op.errors[0]))
                return
            if op.divide > 1:
                # BytePS-PyTorch's average: output.div_(size), floor_divide_ for integers
                if op.flat.dtype.kind in "iu":
                    np.floor_divide(op.flat, op.divide, out=op.flat)
                else:
                    np.divide(op.flat, op.flat.dtype.type(op.divide), out=op.flat)
            op.handle.set_result(op.output)

    def _on_ack(self, msg: Msg) -> None:
        # The reply may come first (the port orders data by priority; acks keep no order).
        plan = self._plans.get(msg.key)
        if plan is None or not 0 <= msg.part < len(plan.parts):
            raise RuntimeError(f"worker {self.rank}: stray ack for key {msg.key} part {msg.part}")
        p = plan.parts[msg.part]
        dst = self._server_rank(p.server)
        _, gate, cost = self.schedule(0, p, p.count * np_dtype(plan.dtype).itemsize)
        if gate is not None and dst != self._transport.me:
            self._transport.release(gate, cost)
        if not self.merged():
            self.pushed(p)
            self._transport.send(Msg(PULL, dst, msg.key, msg.part))

    def _fail_all(self, error: BaseException) -> None:
        for op in list(self._inflight.values()):
            if not op.handle.done():
                op.handle.set_error(error)
        self._inflight.clear()

    # -- optimizer ----------------------------------------------------------------------------
    def optimizer_spec(self, optimizer: Any) -> dict | None:
        """Return ``optimizer`` (a :class:`ddpbench.SGD`, a dict of its fields, or None) as
        the plain hyperparameters the servers take.

        Raises:
            TypeError: anything else (the servers take hyperparameters, not code).
            ValueError: a dict with unknown fields or bad values.
        """
        if optimizer is None:
            return None
        if isinstance(optimizer, SGD):
            return optimizer.model_dump()
        if isinstance(optimizer, dict):
            try:
                return SGD(**optimizer).model_dump()
            except Exception as err:
                raise ValueError(f"bad optimizer {optimizer!r}: {err}") from None
        raise TypeError(
            f"{self.type} servers run ddpbench.SGD (or a dict of its fields: "
            f"{sorted(SGD.model_fields)}), got {type(optimizer).__name__}; the servers "
            f"take plain hyperparameters, not code"
        )

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
                self._transport.send(Msg(OPT, self._server_rank(j), payload=json_payload(spec)))

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

        def goodbye() -> None:
            for j in range(self.num_servers):
                t.send(Msg(BYE, self._server_rank(j)))

        self._engine.call(goodbye).wait()
        if self._server is not None:
            self._server.done.wait()
        wait_idle(self._engine, t)
        t.keep_polling = False
        self._engine.unregister(t)
        if self.dedicated:
            _STATE["dedicated_closed"] = True
        if isinstance(self.options.trace, str):
            write_trace(self.options.trace, f"worker{self.rank}", t.records)
        self._engine.call(self._comm.Free).wait()


_STATE = {"dedicated_closed": False}


def expect_another_store() -> None:
    """Declare that this job's dedicated server ranks serve another store after the one
    that has closed (they ran ``serve(last=False)``), so that a new store may be created.

    Without it a store created after a closed one fails at once: server ranks exit when
    their store's workers have closed, and a new store would wait for them forever.
    """
    _STATE["dedicated_closed"] = False
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
