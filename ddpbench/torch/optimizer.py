"""Horovod's ``DistributedOptimizer`` for torch, on any ddpbench backend.

Follows ``horovod/torch/optimizer.py``: the returned object is an instance of a subclass of
the wrapped optimizer's class, sharing its param groups and state; a hook on every
parameter sends its gradient the moment autograd has accumulated it (here torch's
post-accumulate-grad hook) with ``push_pull_async``, so communication of the last layers
overlaps the backward pass of the first; ``step()`` (or ``synchronize()``) waits for every
handle, then the wrapped optimizer updates. What differs from Horovod:

- any store from ``ddpbench.create`` carries the gradients; the priority of a gradient is
  ``-index`` in ``named_parameters`` order (forward order), so ``p3`` and ``byteps`` send
  the first layers first, which the next forward needs first;
- ``compression`` also takes ``bf16``; ``op`` is a :class:`ddpbench.ReduceOp`;
- a parameter of a lazy module gets its hook once materialised: in the first step its
  gradient is sent by ``synchronize()``;
- a parameter that got no gradient in a backward pass sends zeros, so every rank makes the
  same calls (Horovod would fail on ``grad=None``);
- the store decides where the update runs, as in :class:`ddpbench.DistributedTrainer`:

=========================================  =================================================
store                                      update
=========================================  =================================================
``collective`` in mode ``local_sgd``       the wrapped optimizer steps locally; every
                                           ``local_sgd_period`` steps the store averages the
                                           parameters (no gradient is communicated)
``update_on_kvstore=True`` (``kvstore``)   on the servers: gradients pushed at ``step()``,
                                           the pull returns the new weights; the wrapped
                                           optimizer must be plain ``torch.optim.SGD``
otherwise                                  locally, from the reduced gradients
=========================================  =================================================
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.nn.parameter import is_lazy

from ddpbench.api import Handle, KVStore, NotSupportedError, ReduceOp
from ddpbench.torch._tensors import as_array, check_reducible, staging
from ddpbench.torch.compression import Compression, Compressor
from ddpbench.torch.functions import check_same_on_every_rank, declare_keys, resolve_store

__all__ = ["DistributedOptimizer"]


class _Pending:
    """One gradient in flight: its handle, the tensor on the wire and how to restore it."""

    __slots__ = ("handle", "wire", "ctx", "staged", "out")

    def __init__(self, handle: Handle, wire: torch.Tensor, ctx: Any, staged: bool,
                 out: np.ndarray | None = None) -> None:
        self.handle, self.wire, self.ctx, self.staged, self.out = handle, wire, ctx, staged, out


class _DistributedOptimizer(torch.optim.Optimizer):
    """The methods a distributed optimizer adds; mixed in before the wrapped class."""

    _kv: KVStore
    _compression: type[Compressor]
    _parameter_names: dict[torch.Tensor, str]

    def _setup(self, named_parameters: Any, compression: Any, backward_passes_per_step: int,
               op: ReduceOp | str, gradient_predivide_factor: float, kv: Any,
               update_on_kvstore: bool | None) -> None:
        self._kv = resolve_store(kv)
        self.op = ReduceOp.parse(op)
        f = gradient_predivide_factor
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not np.isfinite(f) or f <= 0:
            raise ValueError(f"gradient_predivide_factor must be a finite number > 0, got {f!r}")
        if f != 1.0 and self.op is not ReduceOp.AVERAGE:
            raise ValueError(f"gradient_predivide_factor={f} needs op=AVERAGE, got "
                             f"op={self.op.value}: it splits an average into prescale 1/f "
                             f"and postscale f/size")
        self.gradient_predivide_factor = float(f)
        self._compression = Compression.parse(compression)
        if isinstance(backward_passes_per_step, bool) or not isinstance(
                backward_passes_per_step, int) or backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be an integer >= 1, got "
                             f"{backward_passes_per_step!r}")
        self.backward_passes_per_step = backward_passes_per_step
        self._parameter_names = self._names(named_parameters)
        self._params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        self._priority = {p: -i for i, p in enumerate(self._parameter_names)}
        for p in self._params:
            check_reducible(self._parameter_names[p], p)
        self._local_sgd = self._kv.is_capable("local_sgd")
        capable = self._kv.is_capable(KVStore.OPTIMIZER)
        if update_on_kvstore and not capable:
            raise NotSupportedError(
                f"update_on_kvstore=True but backend {self._kv.type!r} cannot update on "
                f"servers (not capable of 'optimizer'); use update_on_kvstore=False")
        self._on_servers = bool(capable if update_on_kvstore is None else update_on_kvstore)
        if self._local_sgd and self._compression not in (Compression.none, Compression.fp16):
            raise ValueError(f"local SGD averages parameters with compression 'none' or "
                             f"'fp16', got {self._compression.name!r}")
        if self._on_servers and self._compression is not Compression.none:
            raise ValueError("compression with update_on_kvstore: the servers update the "
                             "weights in their dtype from the pushed gradients; push them "
                             "uncompressed")
        named = [(n, p) for p, n in self._parameter_names.items()]
        check_same_on_every_rank(self._kv, named, "model")
        # BytePS-PyTorch declares the gradients' keys up front, sorted (placement follows)
        declare_keys(self._kv, [n for n, _ in named])
        self._handles: dict[torch.Tensor, _Pending | None] = {}
        self._delay = {p: backward_passes_per_step for p in self._params}
        self._hooked: set[torch.Tensor] = set()
        self._hook_handles: list[Any] = []
        self._synchronized = False
        self._should_synchronize = True
        self._steps = 0
        self._server_spec: dict[str, float] | None = None
        if self._on_servers:
            self._server_spec = self._spec()
            ready = [p for p in self._params if not is_lazy(p)]
            self._init_on_servers(ready)
            self._kv.set_optimizer(self._server_spec)
        if not self._local_sgd and not self._on_servers:
            self._register_hooks()

    def _names(self, named_parameters: Any) -> dict[torch.Tensor, str]:
        params = [p for g in self.param_groups for p in g["params"]]
        if named_parameters is None:
            # Horovod's fallback: names by position, the same on ranks built alike.
            return {p: f"allreduce.noname.{i}" for i, p in enumerate(params)}
        named = list(named_parameters)
        for i, item in enumerate(named):
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
                raise ValueError(f"named_parameters item {i} is {type(item).__name__}; expected "
                                 f"(name, parameter) tuples, as model.named_parameters() gives")
        names = [n for n, _ in named]
        dups = sorted({n for n in names if names.count(n) > 1})
        if dups:
            raise ValueError(f"parameter names in named_parameters must be unique (they are "
                             f"the keys gradients travel under); repeated: {dups}")
        by_id = {id(p): n for n, p in named}
        unnamed = [(gi, i, p) for gi, g in enumerate(self.param_groups)
                   for i, p in enumerate(g["params"]) if id(p) not in by_id]
        if unnamed:
            gi, i, p = unnamed[0]
            shape = "uninitialised" if is_lazy(p) else list(p.shape)
            raise ValueError(f"{len(unnamed)} optimizer parameter(s) have no name in "
                             f"named_parameters, first: param group {gi} index {i} (shape "
                             f"{shape}); pass the model's named_parameters() covering every "
                             f"parameter the optimizer updates")
        # Forward (registration) order, which the priorities follow.
        return {p: by_id[id(p)] for p in sorted(params, key=lambda q: names.index(by_id[id(q)]))}

    # -- hooks and sends ------------------------------------------------------------------
    def _register_hooks(self) -> None:
        for p in self._params:
            if p not in self._hooked and not is_lazy(p):
                self._hook_handles.append(p.register_post_accumulate_grad_hook(self._hook))
                self._hooked.add(p)

    def _hook(self, p: torch.Tensor) -> None:
        pending = self._handles.get(p)
        if pending is not None and self._delay[p] <= 0:
            raise RuntimeError(
                f"the gradient of {self._parameter_names[p]!r} was computed more than "
                f"backward_passes_per_step={self.backward_passes_per_step} times before "
                f"step(); raise backward_passes_per_step to accumulate gradients locally")
        self._delay[p] -= 1
        self._handles[p] = self._send(p) if self._delay[p] == 0 else None

    def _send(self, p: torch.Tensor) -> _Pending:
        if p.grad is None:
            p.grad = torch.zeros_like(p)  # unused in this pass: every rank still sends
        grad = p.grad
        if grad.is_cuda:
            # The backends read the memory from another stream: let autograd's work finish.
            torch.cuda.current_stream(grad.device).synchronize()
        wire, ctx = self._compression.compress(grad)
        wire, staged = staging(wire)
        name = self._parameter_names[p]
        if wire.dtype != p.dtype:
            # Parameter servers fix a key's dtype at first use (broadcast_parameters may
            # have used this name for the weights): the compressed gradient gets its own.
            name = f"{name}/{self._compression.name}"
        f = self.gradient_predivide_factor
        pre, post = (1.0 / f, f) if self.op is ReduceOp.AVERAGE else (1.0, 1.0)
        handle = self._kv.push_pull_async(name, as_array(wire), priority=self._priority[p],
                                          op=self.op, prescale_factor=pre, postscale_factor=post)
        return _Pending(handle, wire, ctx, staged or wire is not grad)

    def synchronize(self) -> None:
        """Wait for every gradient's reduction, sending those not sent yet (in order)."""
        if self._local_sgd:
            return
        if self._on_servers:
            self._step_on_servers()
            return
        for p in self._params:
            if self._handles.get(p) is None:
                self._handles[p] = self._send(p)
        try:
            for p in self._params:
                pending = self._handles[p]
                assert pending is not None
                pending.handle.wait()
                if pending.staged:
                    with torch.no_grad():
                        p.grad.copy_(self._compression.decompress(pending.wire, pending.ctx))
        finally:
            self._handles.clear()
            for p in self._params:
                self._delay[p] = self.backward_passes_per_step
        self._register_hooks()  # lazy parameters materialised since the last step
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Make ``step()`` skip the wait (after an explicit ``synchronize()``)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        """Wait for the reduced gradients (unless skipped), then update."""
        if self._local_sgd:
            return self._step_local_sgd(closure)
        if self._on_servers:
            loss = closure() if closure is not None else None
            self._step_on_servers()
            self._steps += 1
            return loss
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "after optimizer.synchronize(): the gradients were waited for "
                              "twice", stacklevel=2)
            self.synchronize()
        self._synchronized = False
        self._steps += 1
        return self._base_step(closure)

    def _base_step(self, closure: Callable[[], float] | None = None) -> Any:
        """Run the wrapped optimizer's own step (no communication)."""
        return super().step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients; refused while reductions are in flight (they write into them)."""
        if any(h is not None for h in self._handles.values()):
            raise RuntimeError("optimizer.zero_grad() was called after loss.backward() but "
                               "before optimizer.step() or optimizer.synchronize(): the "
                               "reductions in flight write into these gradients")
        super().zero_grad(set_to_none)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load state as the wrapped optimizer does; forget gradients in flight."""
        self._handles.clear()
        self._synchronized = False
        for p in self._params:
            self._delay[p] = self.backward_passes_per_step
        super().load_state_dict(state_dict)

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes accumulate before a reduction."""
        self.backward_passes_per_step = passes
        for p in self._params:
            self._delay[p] = passes

    # -- local SGD -----------------------------------------------------------------------
    def _step_local_sgd(self, closure: Callable[[], float] | None) -> Any:
        kv: Any = self._kv  # the local-SGD calls of the 'collective' store
        params = [p for p in self._params if not is_lazy(p)]
        names = [self._parameter_names[p] for p in params]
        arrays = [as_array(p) for p in params]
        kv.snapshot_parameters(names, arrays, reset=self._steps == 0)
        loss = self._base_step(closure)
        kv.sync_parameters(names, arrays, compression=None if self._compression is
                           Compression.none else self._compression.name)
        self._steps += 1
        return loss

    # -- updates on the servers ------------------------------------------------------------
    def _spec(self) -> dict[str, float]:
        """Return the server optimizer (MXNet's SGD) equal to the wrapped torch SGD."""
        if not isinstance(self, torch.optim.SGD):
            raise NotSupportedError(f"update_on_kvstore runs MXNet's SGD on the servers; the "
                                    f"wrapped optimizer is {type(self).__name__}, not SGD")
        specs = []
        for g in self.param_groups:
            if g.get("dampening", 0) or g.get("nesterov") or g.get("maximize"):
                raise NotSupportedError("update_on_kvstore: the servers' SGD has no "
                                        "dampening, nesterov or maximize")
            # the servers sum the workers' (batch-mean) gradients and rescale the sum to
            # their mean, as MXNet's rescale_grad does on the servers
            specs.append({"lr": float(g["lr"]), "momentum": float(g.get("momentum", 0.0)),
                          "wd": float(g.get("weight_decay", 0.0)),
                          "rescale_grad": 1.0 / self._kv.num_workers})
        if any(s != specs[0] for s in specs):
            raise NotSupportedError("update_on_kvstore: the servers run one optimizer; the "
                                    "param groups have different hyperparameters")
        return specs[0]

    def _init_on_servers(self, params: list[torch.Tensor]) -> None:
        # MXNet's kv.init: root's weights become the servers' copy (and every replica's).
        if params:
            self._kv.broadcast([self._parameter_names[p] for p in params],
                               [as_array(p) for p in params], root_rank=0)
        self._server_ready = getattr(self, "_server_ready", set()) | set(params)

    def _step_on_servers(self) -> None:
        late = [p for p in self._params if p not in self._server_ready]
        if late:  # lazy parameters materialised since: the optimizer off while they init
            self._kv.set_optimizer(None)
            self._init_on_servers(late)
            self._kv.set_optimizer(self._server_spec)
        spec = self._spec()
        if spec != self._server_spec:  # a new learning rate: collective, like Gluon's
            self._kv.set_optimizer(spec)
            self._server_spec = spec
        pending = []
        for p in self._params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grad, _ = staging(p.grad)
            out = np.empty(tuple(p.shape), as_array(grad).dtype)
            # The servers sum and update once, rescaling the sum (rescale_grad = 1/size).
            h = self._kv.push_pull_async(self._parameter_names[p], as_array(grad), out,
                                         priority=self._priority[p], op=ReduceOp.SUM)
            pending.append((p, h, out))
        with torch.no_grad():
            for p, h, out in pending:
                h.wait()
                p.copy_(torch.from_numpy(out))

    def close(self) -> None:
        """Remove the gradient hooks (the store stays open)."""
        for h in self._hook_handles:
            h.remove()
        self._hook_handles, self._hooked = [], set()


def DistributedOptimizer(  # noqa: N802 - Horovod's name for a factory
    optimizer: torch.optim.Optimizer,
    named_parameters: Any = None,
    compression: Any = Compression.none,
    backward_passes_per_step: int = 1,
    op: ReduceOp | str = ReduceOp.AVERAGE,
    gradient_predivide_factor: float = 1.0,
    *,
    kv: KVStore | str | None = None,
    update_on_kvstore: bool | None = False,
) -> Any:
    """Wrap ``optimizer`` so that ``step()`` applies gradients reduced over every worker.

    Collective: every worker must construct it (it compares the parameter names, shapes
    and dtypes across ranks), then run the same backward passes and steps.

    Args:
        optimizer: the ``torch.optim.Optimizer`` to wrap; the result shares its param
            groups and state and is an instance of its class.
        named_parameters: ``model.named_parameters()``: the names gradients travel under.
            None names them by position (Horovod's fallback).
        compression: ``Compression.none`` / ``.fp16`` / ``.bf16``, or the name.
        backward_passes_per_step: backward passes accumulated locally before a reduction.
        op: the reduction (default AVERAGE; SUM gives summed gradients).
        gradient_predivide_factor: f; gradients are scaled by 1/f before the sum and by
            f/size after it (Horovod's definition; op must be AVERAGE).
        kv: a store from ``ddpbench.create``, a backend name, or None for a default ``mpi``.
        update_on_kvstore: True runs the update on the servers (``kvstore``; plain SGD
            only); None does so when the store can; False (default) updates locally.

    Returns:
        The distributed optimizer.

    Raises:
        ValueError: a parameter without a name, repeated names, ranks whose models differ,
            f <= 0 or f != 1 with another op than AVERAGE, an unknown compression.
        TypeError: a parameter whose dtype the backends cannot reduce (bool, complex).
        NotSupportedError: ``update_on_kvstore=True`` with a store or optimizer that cannot.

    Example:
        >>> kv = ddpbench.create("p3")
        >>> opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
        ...                            model.named_parameters(), kv=kv)
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    base = type(optimizer)
    cls: Any = type(base.__name__, (_DistributedOptimizer, base), {"__module__": __name__})
    dist = cls.__new__(cls)
    dist.__dict__.update(optimizer.__dict__)  # the same param groups, state and hooks
    dist._setup(named_parameters, compression, backward_passes_per_step, op,
                gradient_predivide_factor, kv, update_on_kvstore)
    return dist
