"""The ``p3`` backend: Priority-based Parameter Propagation (Jayarajan et al., SysML 2019).

As P3's MXNet fork does it (docs/fidelity/p3.md):

- placement (src/kvstore/kvstore_dist.h, ``EncodeDefaultKey``): an array below
  ``slice_params`` elements goes whole to server ``(key * 9973) % S``; a larger one is cut
  into slices of ``slice_params`` elements, slice i on server ``i % S`` (restarting at
  server 0 for every key);
- each slice is one push carrying the caller's priority (P3's Gluon trainer and Module
  push parameter i with ``priority=-i``, python/mxnet/gluon/trainer.py, model.py; so do
  ddpbench's front ends), the slices of one parameter in slice order,
  answered by the server with the slice's sum (or, with ``set_optimizer``, the updated
  weights) once every worker's push is in;
- flow control (ps-lite/src/van.cc, src/zmq_van.h): one sending thread pops the best queued
  slice (equal priorities in the order P3's ``std::priority_queue`` with its ``<=``
  comparator leaves them, :class:`ddpbench.rules.sockets.StlHeap`) and hands it to its server's socket, which holds ``send_hwm`` (1) slices not yet
  on the wire; a full socket blocks the thread, and every slice behind it waits. Each
  connection has its own pipe, ZeroMQ's engine and its kernel send buffer
  (``sndbuf_bytes``), freed as paced transmission carries a slice. There are no
  acknowledgements; servers answer in the order their sums complete, without priority,
  through sockets of their own that count the replies the same way (a ps-lite server is a
  process of its own; here a dedicated server rank, or the colocated server's own sockets
  in the worker's rank, whose local part still goes over in memory).

``water_mark`` > 0 replaces the sockets with ddpbench's own scheme, which is not P3's: at
most ``water_mark`` slices in flight per server, each acknowledged on arrival, a slice whose
server's window is full skipped for the next, replies sent by priority.

Server-side optimizer: as in P3 (``KVStoreDistServer::ApplyUpdates``), after
``set_optimizer(ddpbench.SGD(...))`` the servers update their copy of the weights (set by
``broadcast``) with each round's sum and answer with the updated weights.
"""

from __future__ import annotations

from typing import Any

from ddpbench.api import register
from ddpbench.backends.ps.transport import Gate
from ddpbench.backends.ps.worker import PSStore
from ddpbench.contract import P3Knobs
from ddpbench.rules.placement import Part, p3_parts

__all__ = ["P3Store"]


@register("p3")
class P3Store(PSStore):
    """Sliced, prioritised push-pull through P3's sockets (or a water mark, a variant).

    Options:
        slice_params: elements per slice (default 40,000).
        send_hwm: slices a socket to one server holds (default 1, ZMQ_SNDHWM).
        ties: "heap" (default) = equal priorities leave the sending thread's queue as P3's
            ``std::priority_queue`` with its ``<=`` comparator leaves them; "fifo" = in the
            order queued (ddpbench's own).
        sndbuf_bytes: each connection's kernel send buffer (default 4 MiB, Linux's autotuned
            maximum; 0 = not modelled), paced runs only.
        server_sockets: "own" (default) = servers reply through sockets of their own;
            "host" = straight onto the wire (ddpbench's own).
        water_mark: 0 (default) = P3's sockets; > 0 = ddpbench's window per server.
        priority: True (default) = by priority; False = FIFO (the paper's ablation).
        servers, bandwidth_gbps, latency_us, trace: see :class:`ddpbench.contract.PSKnobs`.
    """

    Options = P3Knobs
    options: P3Knobs
    capabilities = frozenset({"broadcast", "push_pull", "optimizer"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        o = self.options
        if not o.water_mark:
            hwm, ties, sndbuf = o.send_hwm, o.queue_ties(), o.sndbuf_bytes
            own = o.server_sockets == "own"

            def sockets() -> None:
                self._transport.use_sockets(hwm, ties, sndbuf)
                if own:  # the colocated server's replies (dedicated ones: by CONFIG)
                    self._transport.use_server_sockets(hwm, sndbuf)

            self._engine.call(sockets).wait()

    def split(self, key: int, declared: int, numel: int, itemsize: int) -> list[Part]:
        return p3_parts(key, numel, self.options.slice_params, self.num_servers)

    def schedule(self, priority: int, part: Part, nbytes: int) -> tuple[int, Gate | None, float]:
        if not self.options.priority:  # the slicing-only ablation: FIFO, as pushed
            priority = 0
        if not self.options.water_mark:
            return priority, None, 1.0
        return priority, self.gate(part.server, self.options.water_mark), 1.0

    def prioritised_replies(self) -> bool:
        return bool(self.options.water_mark)

    def server_sockets(self) -> dict[str, int] | None:
        o = self.options
        if o.water_mark or o.server_sockets != "own":
            return None
        return {"hwm": o.send_hwm, "sndbuf": o.sndbuf_bytes}

    def set_optimizer(self, optimizer: Any) -> None:
        """Make the servers run ``optimizer`` (a :class:`ddpbench.SGD`, its dict, or None).

        Collective. The servers' weights come from ``broadcast`` (P3's ``kv.init``).
        """
        self._send_optimizer(self.optimizer_spec(optimizer))
