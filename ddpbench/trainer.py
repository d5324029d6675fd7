"""Data-parallel training on any backend: ``DistributedTrainer`` and ``broadcast_parameters``.

The user code is the same for every backend; only the name passed to ``ddpbench.create``
changes::

    kv = ddpbench.create(backend)                   # "mpi", "horovod", "collective", "p3", ...
    model = ddpbench.nn.mlp(seed=rank)              # ranks may be seeded differently
    ddpbench.broadcast_parameters(model.parameters(), root_rank=0, kv=kv)
    trainer = ddpbench.DistributedTrainer(model.parameters(), ddpbench.SGD(lr=0.1), kv=kv)
    for x, y in loader:
        loss, dlogits = ddpbench.nn.softmax_cross_entropy(model(x), y)
        model.backward(dlogits)                     # gradients go out while backward runs
        trainer.step(batch_size=len(x))

Gradient flow (Horovod's DistributedOptimizer): each parameter's ``on_grad`` hook sends
its gradient with ``push_pull_async(priority=-layer)`` the moment backward produced it, so
communication of the last layers overlaps the backward pass of the first; ``step`` waits
for every handle, then updates. Which update runs where:

=========================================  =================================================
case                                       update
=========================================  =================================================
``distributed=True`` parameter             locally, from its own gradient (never reduced)
``kv`` in local-SGD mode (``collective``)  locally every step; parameters averaged every
                                           ``local_sgd_period`` steps by the store
``update_on_kvstore`` and capable store    on the servers (``kv.set_optimizer``); the pull
                                           returns the new weights
otherwise                                  locally, from the reduced gradient
=========================================  =================================================
"""

from __future__ import annotations

import atexit
from typing import Any

import numpy as np
from pydantic import BaseModel

from ddpbench.api import Handle, KVStore, NotSupportedError, ReduceOp, create
from ddpbench.nn import Parameter
from ddpbench.tensor_ops import array_module

__all__ = ["DistributedTrainer", "broadcast_parameters"]

COMPRESSIONS = (None, "none", "fp16")
_DEFAULT_KV: KVStore | None = None


def _params(params: Any) -> list[Parameter]:
    if hasattr(params, "parameters"):
        params = params.parameters()
    if isinstance(params, dict):
        params = list(params.values())
    out = list(params)
    bad = [type(p).__name__ for p in out if not isinstance(p, Parameter)]
    if bad:
        raise TypeError(f"expected ddpbench.nn.Parameter objects, got {bad[0]}")
    names = [p.name for p in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"parameter names must be unique (they are the keys communicated "
                         f"under); repeated: {dup}")
    return out


def _store(kv: KVStore | str | None) -> KVStore:
    global _DEFAULT_KV
    if isinstance(kv, KVStore):
        return kv
    if isinstance(kv, str):
        return create(kv)
    if kv is None:
        if _DEFAULT_KV is None:
            _DEFAULT_KV = create("mpi")
            atexit.register(_DEFAULT_KV.close)
        return _DEFAULT_KV
    raise TypeError(f"kv must be a KVStore or a backend name, got {type(kv).__name__}")


def broadcast_parameters(params: Any, root_rank: int = 0, *, kv: KVStore | str | None = None
                         ) -> None:
    """Give every worker root's parameter values; deferred ones when they get a shape.

    Initialised parameters are broadcast now. A deferred parameter (shape known only at
    the first forward) gets a hook that broadcasts it the moment it is initialised, inside
    that forward pass (Horovod's approach for Gluon's deferred initialisation), so ranks
    seeded differently hold identical values before any of them is used. Collective: every
    worker must call it with the same parameters, and run the first forward.
    ``distributed=True`` parameters are left alone (they differ per rank by design).

    Args:
        params: Parameters, a dict of them, or a model with ``parameters()``.
        root_rank: whose values win.
        kv: the store to broadcast through (default: an ``mpi`` store made on first use).
    """
    plist = [p for p in _params(params) if not p.distributed]
    store = _store(kv)
    if not 0 <= root_rank < store.num_workers:
        raise ValueError(f"root_rank {root_rank} is out of range for {store.num_workers} workers")
    ready = [p for p in plist if p.initialised]
    if ready:
        store.broadcast([p.name for p in ready], [p.data for p in ready], root_rank=root_rank)
    for p in plist:
        if not p.initialised:
            p.on_initialised(lambda q: store.broadcast(q.name, q.data, root_rank=root_rank))


class DistributedTrainer:
    """Reduce gradients over the workers through any backend, then update the parameters.

    Args:
        params: Parameters, a dict of them, or a model with ``parameters()``.
        optimizer: an object with ``create_state(weight)`` and ``update(weight, grad,
            state)`` (e.g. :class:`ddpbench.SGD`).
        kv: a KVStore, or a backend name to create one (default ``"mpi"``).
        gradient_predivide_factor: f; gradients are multiplied by 1/f before the reduction
            and by f/size after it (Horovod's definition: AVERAGE with prescale 1/f and
            postscale f). f > 1 keeps fp16 sums of many ranks from overflowing.
        compression: None or ``'fp16'``: gradients travel as float16 and are cast back.
        update_on_kvstore: True: run the optimizer on the servers (a store capable of
            ``'optimizer'`` is required); False: update locally; None: on the servers
            when the store is capable, else locally.
        op: the reduction (default AVERAGE; SUM makes ``step`` see summed gradients).

    Raises:
        ValueError: f <= 0, f != 1 with an op other than AVERAGE, an unknown compression,
            or compression together with updates on the servers.
        NotSupportedError: ``update_on_kvstore=True`` with a store that cannot update.
    """

    def __init__(
        self,
        params: Any,
        optimizer: Any,
        kv: KVStore | str = "mpi",
        *,
        gradient_predivide_factor: float = 1.0,
        compression: str | None = None,
        update_on_kvstore: bool | None = False,
        op: ReduceOp | str = ReduceOp.AVERAGE,
    ) -> None:
        self.params = _params(params)
        self.optimizer = optimizer
        self.kv = _store(kv)
        self.op = ReduceOp.parse(op)
        f = gradient_predivide_factor
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not np.isfinite(f) or f <= 0:
            raise ValueError(f"gradient_predivide_factor must be a finite number > 0, got {f!r}")
        if f != 1.0 and self.op is not ReduceOp.AVERAGE:
            raise ValueError(
                f"gradient_predivide_factor={f} needs op=AVERAGE, got op={self.op.value}: the "
                f"factor is defined as prescale 1/f and postscale f/size of an average"
            )
        self.predivide = float(f)
        if compression not in COMPRESSIONS:
            raise ValueError(f"unknown compression {compression!r}; valid: [None, 'fp16']")
        self.compression = None if compression in (None, "none") else compression
        capable = self.kv.is_capable(KVStore.OPTIMIZER)
        if update_on_kvstore and not capable:
            raise NotSupportedError(
                f"update_on_kvstore=True but backend {self.kv.type!r} cannot update on servers "
                f"(not capable of 'optimizer'); use update_on_kvstore=False or a capable store"
            )
        self.update_on_kvstore = bool(capable if update_on_kvstore is None else update_on_kvstore)
        if self.update_on_kvstore and self.compression:
            raise ValueError("compression='fp16' with update_on_kvstore: the servers update "
                             "float32 weights from the pushed gradients; push float32")
        self.local_sgd = self.kv.is_capable("local_sgd")
        self._server_opt: Any = None  # what the servers run (rescale_grad per batch size)
        if self.update_on_kvstore:
            self.kv.set_optimizer(optimizer)  # a ddpbench.SGD: plain hyperparameters
        self._states: dict[str, Any] = {}
        self._handles: dict[str, Handle] = {}
        self._wire: dict[str, Any] = {}
        self._reduced = [p for p in self.params if not p.distributed]
        self._removers = [] if self.update_on_kvstore or self.local_sgd else [
            p.on_grad(self._on_grad) for p in self._reduced
        ]
        self.steps = 0

    # -- gradient flow -------------------------------------------------------------------------
    def _on_grad(self, p: Parameter) -> None:
        if p.name in self._handles:
            raise RuntimeError(
                f"gradient of {p.name!r} was produced twice before step(); call step() after "
                f"every backward (gradient accumulation is not supported)"
            )
        self._handles[p.name] = self._send(p)

    def _send(self, p: Parameter) -> Handle:
        buf = p.grad
        if self.compression == "fp16":
            wire = self._wire.get(p.name)
            if wire is None or wire.shape != p.grad.shape:
                xp = array_module(p.grad)
                wire = self._wire[p.name] = xp.empty(p.grad.shape, np.float16)
            wire[...] = p.grad
            buf = wire
        f = self.predivide
        return self.kv.push_pull_async(p.name, buf, priority=-p.layer, op=self.op,
                                       prescale_factor=1.0 / f, postscale_factor=f)

    def allreduce_grads(self) -> None:
        """Wait for every gradient's reduction (sending those not sent yet, in order)."""
        for p in self._reduced:
            if p.name not in self._handles:
                if p.grad is None:
                    raise RuntimeError(f"parameter {p.name!r} has no gradient: run forward and "
                                       f"backward before step()")
                self._handles[p.name] = self._send(p)
        handles, self._handles = self._handles, {}
        for p in self._reduced:
            handles[p.name].wait()
            if self.compression == "fp16":
                p.grad[...] = self._wire[p.name]

    def step(self, batch_size: int) -> None:
        """Finish the gradient reductions and update every parameter.

        Args:
            batch_size: samples this worker's gradients were summed over; gradients are
                divided by it (the reduction already averages over workers).
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
                or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        scale = np.float32(1.0 / batch_size)
        if self.update_on_kvstore:
            self._step_on_servers(batch_size)
        elif not self.local_sgd:
            self.allreduce_grads()
        local = [p for p in self.params if p.distributed or not self.update_on_kvstore]
        local_sgd_kv: Any = self.kv  # the local-SGD calls of the 'collective' store
        if self.local_sgd:
            names = [p.name for p in self._reduced]
            local_sgd_kv.snapshot_parameters(names, [p.data for p in self._reduced],
                                        reset=self.steps == 0)
        for p in local:
            state = self._states.get(p.name)
            if p.name not in self._states:
                state = self._states[p.name] = self.optimizer.create_state(p.data)
            self.optimizer.update(p.data, p.grad * scale.astype(p.grad.dtype), state)
        if self.local_sgd:
            local_sgd_kv.sync_parameters(names, [p.data for p in self._reduced],
                                    compression=self.compression)
        self.steps += 1

    @property
    def learning_rate(self) -> float:
        return float(self.optimizer.lr)

    def set_learning_rate(self, lr: float) -> None:
        """Use ``lr`` from the next step on (Gluon's ``Trainer.set_learning_rate``).

        With updates on the servers this sends the optimizer again, so it is collective.
        """
        if not lr > 0:
            raise ValueError(f"learning rate must be > 0, got {lr!r}")
        opt: Any = self.optimizer
        if isinstance(opt, BaseModel):  # frozen (ddpbench.SGD): a copy with the new rate
            self.optimizer = opt.model_copy(update={"lr": float(lr)})
        else:
            self.optimizer.lr = float(lr)
        if self.update_on_kvstore:
            self._server_opt = None  # sent with the batch's rescale at the next step

    def _step_on_servers(self, batch_size: int) -> None:
        # As Gluon with a distributed kvstore: the workers push their gradients as they are,
        # the servers sum them and the optimizer's rescale_grad (scale / batch, here over
        # the global batch) multiplies the sum on the servers (python/mxnet/gluon/
        # trainer.py step; src/kvstore/kvstore_dist_server.h ApplyUpdates).
        opt: Any = self.optimizer
        if isinstance(opt, BaseModel):
            rescale = float(getattr(opt, "rescale_grad", 1.0)) / (batch_size
                                                                  * self.kv.num_workers)
            server_opt: Any = opt.model_copy(update={"rescale_grad": rescale})
            if server_opt != self._server_opt:
                self.kv.set_optimizer(server_opt)  # collective, like the batch every worker uses
                self._server_opt = server_opt
        handles = [
            self.kv.push_pull_async(p.name, p.grad, output=p.data, priority=-p.layer,
                                    op=ReduceOp.SUM)
            for p in self._reduced
        ]
        for h in handles:
            h.wait()

    def close(self) -> None:
        """Remove the gradient hooks (the store stays open)."""
        for remove in self._removers:
            remove()
        self._removers = []

