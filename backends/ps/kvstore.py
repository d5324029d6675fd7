"""The ``kvstore`` backend: MXNet's distributed parameter server (``dist_sync``) over MPI.

As MXNet does it (src/kvstore/kvstore_dist.h, src/kvstore/kvstore_dist_server.h;
docs/fidelity/kvstore.md): an array of fewer than ``bigarray_bound`` elements goes whole to
server ``(key * 9973) % S``; a larger one is split into ``S`` parts, part i on server i,
bounded at ``round(n / S * i)`` (C's round, halves away from zero). Push and pull are
separate requests in FIFO order (the caller's priority is ignored): the server answers each push once every worker's push of
the round is in, and only then does the worker send its pull (MXNet's engine orders the
pull after the push on the same buffer). ``merged_push_pull=True`` is ddpbench's own
shortcut, one message each way, which saves that round trip.

Server-side optimizer: after ``set_optimizer(SGD(...))`` the servers apply each round's
summed gradient to their copy of the weights and ``push_pull`` returns the updated weights.
The servers' weights are initialised by ``broadcast`` (MXNet's ``kv.init``: the root's
value is stored); a push to a key that was never broadcast is an error while an optimizer
is set. Without an optimizer, ``push_pull`` returns the reduction, as the other backends do.

Example:
    >>> kv = ddpbench.create("kvstore")          # ddpbench launch -n 4 --servers 2 -- ...
    >>> kv.broadcast(0, w)                       # init: every worker and server holds w
    >>> kv.set_optimizer(ddpbench.SGD(lr=0.1, momentum=0.9, rescale_grad=1 / kv.num_workers))
    >>> w = kv.push_pull(0, grad, output=w)      # w is now the servers' updated weights
"""

from __future__ import annotations

from typing import Any

from ddpbench.api import register
from ddpbench.backends.ps.worker import PSStore
from ddpbench.contract import KvstoreKnobs
from ddpbench.rules.placement import Part, kvstore_parts

__all__ = ["KVStoreBackend"]


@register("kvstore")
class KVStoreBackend(PSStore):
    """MXNet-style parameter server: hashed small arrays, split big ones, FIFO push then pull.

    Options:
        bigarray_bound: arrays with at least this many elements are split over all servers
            (default 1,000,000).
        servers, bandwidth_gbps, latency_us, trace: see :class:`ddpbench.contract.PSKnobs`.
    """

    Options = KvstoreKnobs
    options: KvstoreKnobs
    capabilities = frozenset({"broadcast", "push_pull", "optimizer"})

    def merged(self) -> bool:
        return self.options.merged_push_pull

    def split(self, key: int, declared: int, numel: int, itemsize: int) -> list[Part]:
        return kvstore_parts(key, numel, self.options.bigarray_bound, self.num_servers)

    def set_optimizer(self, optimizer: Any) -> None:
        """Make the servers run ``optimizer`` (a :class:`ddpbench.SGD`, its dict, or None).

        Collective: every worker must call it with the same optimizer (the servers compare).

        Raises:
            TypeError: not an SGD, a dict of its fields, or None.
            ValueError: a dict with unknown fields or bad values.
        """
        self._send_optimizer(self.optimizer_spec(optimizer))
