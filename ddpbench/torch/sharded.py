"""Sharded data parallelism for torch modules: FSDP's and ZeRO's front end over ``zero``/``fsdp``.

:class:`FullyShardedDataParallel` wraps a module the way
``torch.distributed.fsdp.FullyShardedDataParallel`` does (``wrap="layer"``: every module
that owns parameters is one unit, as ``transformer_auto_wrap_policy`` wraps each block)
and keeps its parameters in a ``zero`` or ``fsdp`` store, which holds the optimizer too
(:class:`ddpbench.SGD`; each rank keeps the state of the elements it owns):

- construction broadcasts rank 0's parameters (the store registers them) and sets the
  optimizer; with parameters held sharded (``zero`` stage 3, FSDP's FULL_SHARD and
  HYBRID_SHARD) every parameter is then freed (an empty tensor);
- before a unit's forward, a pre-forward hook all-gathers its parameters (and, as
  DeepSpeed's prefetch of ``prefetch_bucket_size`` elements or FSDP's ``forward_prefetch``,
  the next units' in the same call): ``partitioned_param_coordinator.py``'s
  ``fetch_sub_module``, FSDP's ``_pre_forward_unshard`` (``_runtime_utils.py``);
- after the forward the unit is freed where the store's plan says
  (:meth:`~ddpbench.backends.zero.ZeroStore.front_end_plan`: FSDP's FULL_SHARD and
  HYBRID_SHARD always, ``_post_forward_reshard``; ZeRO-3 once more than
  ``max_live_parameters`` elements are gathered, ``release_sub_module``), and gathered
  again in a pre-backward hook (FSDP's BACKWARD_PRE prefetches the next unit in backward
  order in the same call; BACKWARD_POST gathers it once this unit's gradients are all
  accumulated); when they are, the unit is freed by the same rule
  (``_post_backward_reshard``);
- gradients go to the store (``push_pull``: it reduce-scatters in its buckets, updates its
  shard and, below stage 3, all-gathers the new weights into the parameters) from
  post-accumulate-grad hooks where the original reduces during backward: FSDP every unit's
  at the end of its backward, asynchronously (``_post_backward_hook``); ZeRO stage 2 and
  3, and any stage with ``overlap_comm``, each parameter's into a bucket of
  ``reduce_bucket_size`` elements that goes when the next would overflow it, asynchronously
  with ``overlap_comm`` (``stage_1_and_2.py``, ``stage3.py``); otherwise (stages 0 and 1)
  all of them at :meth:`step`;
- :meth:`step` sends what is left, waits for every reduction, then frees the sharded
  parameters again.

A freed parameter is an empty tensor; autograd saved the parameter objects, not their
data, so a unit gathered again before its backward computes with its whole values.
An asynchronous reduction runs on the engine thread while backward goes on (the
parameters it updates are those whose gradients are complete); every rank issues the same
calls in the same order, the order autograd runs the hooks. ``stats`` counts the gather
calls, the units freed, the reductions and the peak of gathered elements. N ranks on batch/N equal one process on the whole batch
(tests/mpi/test_zero.py). CPU tensors are shared with the store without copies; CUDA
tensors are staged through host memory by the store.

Example:
    >>> kv = ddpbench.create("zero", stage=3, param_persistence_threshold=0)
    >>> model = dt.FullyShardedDataParallel(net, ddpbench.SGD(lr=0.1, momentum=0.9), kv=kv)
    >>> for x, y in loader:                           # this rank's shard of the batch
    ...     model.zero_grad()
    ...     F.mse_loss(model(x), y).backward()
    ...     model.step()
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ddpbench.api import KVStore, create
from ddpbench.optim import SGD
from ddpbench.rules.unshard import UnitSchedule
from ddpbench.torch._tensors import as_array, check_reducible

__all__ = ["FullyShardedDataParallel"]


def _units(module: torch.nn.Module) -> list[list[tuple[str, torch.nn.Parameter]]]:
    """Each module that owns parameters, in ``named_modules`` order, with its parameters."""
    out = []
    for path, sub in module.named_modules():
        own = [(f"{path}.{n}" if path else n, p) for n, p in sub.named_parameters(recurse=False)]
        if own:
            out.append(own)
    return out


class FullyShardedDataParallel(torch.nn.Module):
    """Wrap ``module``; its parameters live in a sharding store (see the module docstring).

    Args:
        module: the model (every rank builds the same one; rank 0's values win).
        optimizer: the update the store applies (:class:`ddpbench.SGD` or a dict of it).
        kv: a ``zero`` or ``fsdp`` store; default: ``ddpbench.create(backend, **knobs)``.
        backend: ``"zero"`` or ``"fsdp"`` when ``kv`` is not given.
        root_rank: whose initial parameters every rank takes.
        **knobs: the backend's knobs (``stage=3``, ``sharding_strategy="SHARD_GRAD_OP"``).

    Raises:
        ValueError: a store that does not shard (no ``gather``), or a bad knob.
        TypeError: a parameter dtype no backend reduces.
    """

    def __init__(self, module: torch.nn.Module, optimizer: SGD | dict, *,
                 kv: KVStore | None = None, backend: str = "zero", root_rank: int = 0,
                 **knobs: Any) -> None:
        super().__init__()
        store: Any = kv if kv is not None else create(backend, **knobs)
        if not store.is_capable("gather"):
            raise ValueError(f"FullyShardedDataParallel needs a sharding store ('zero' or "
                             f"'fsdp'), got {store.type!r}")
        self.module = module
        self.kv: Any = store
        self._units = _units(module)
        self._named = [item for unit in self._units for item in unit]
        for name, p in self._named:
            check_reducible(name, p)
        self._shapes = {name: tuple(p.shape) for name, p in self._named}
        names = [n for n, _ in self._named]
        with torch.no_grad():
            self.kv.broadcast(names, [as_array(p.data) for _, p in self._named],
                              root_rank=root_rank)
        self.kv.set_optimizer(optimizer)
        self.sharded = bool(self.kv.holds_sharded_params)
        self.plan = self.kv.front_end_plan()
        index = {name: k for k, (name, _) in enumerate(self._named)}
        self.schedule = UnitSchedule(
            self.plan, [[index[name] for name, _ in unit] for unit in self._units],
            [math.prod(self._shapes[name]) for name, _ in self._named], self.sharded,
            self._gather_units, self._free_units, self._reduce)
        self.stats = self.schedule.stats
        if self.sharded:
            self.schedule.free()
        for i, sub in enumerate(self._owners()):
            self._hook(i, sub, [index[name] for name, _ in self._units[i]])

    def _owners(self) -> list[torch.nn.Module]:
        """The modules of :func:`_units`, in the same order."""
        return [sub for _, sub in self.module.named_modules()
                if any(True for _ in sub.parameters(recurse=False))]

    def _hook(self, i: int, sub: torch.nn.Module, own: list[int]) -> None:
        """Unit ``i``'s events to the schedule: its forward, its backward, each of its
        parameters' (``own``) accumulated gradients."""
        s = self.schedule
        sub.register_forward_pre_hook(lambda _m, _a: s.pre_forward(i))
        for k, (_, p) in zip(own, self._units[i]):
            p.register_post_accumulate_grad_hook(lambda _p, k=k: s.grad_ready(i, k))
        if self.sharded:
            sub.register_forward_hook(lambda _m, _a, _o: s.post_forward(i))
            sub.register_full_backward_pre_hook(lambda _m, _g: s.pre_backward(i))

    def _gather_units(self, units: list[int]) -> None:
        """All-gather the parameters of ``units`` into whole tensors, in one call."""
        named = [item for j in units for item in self._units[j]]
        with torch.no_grad():
            for name, p in named:
                p.data = torch.empty(self._shapes[name], dtype=p.dtype, device=p.device)
            self.kv.gather([n for n, _ in named], [as_array(p.data) for _, p in named])

    def _free_units(self, units: list[int]) -> None:
        """Drop the whole parameters of ``units``; the store keeps this rank's shard.
        Autograd saved the parameter objects, not their data, so a unit gathered again
        before its backward computes with its whole values."""
        with torch.no_grad():
            for j in units:
                for _, p in self._units[j]:
                    p.data = torch.empty(0, dtype=p.dtype, device=p.device)

    def _reduce(self, ks: list[int], asynchronous: bool) -> Any:
        """One ``push_pull`` of gradients ``ks`` (a parameter without a gradient sends
        zeros); the handle where ``asynchronous``."""
        names, grads, outs = [], [], []
        for k in ks:
            name, p = self._named[k]
            g = p.grad
            if g is None:
                g = torch.zeros(self._shapes[name], dtype=p.dtype, device=p.device)
            names.append(name)
            grads.append(as_array(g.detach().contiguous()))
            outs.append(as_array(g.detach().clone()) if self.sharded else as_array(p.data))
        if asynchronous:
            return self.kv.push_pull_async(names, grads, output=outs, op="average")
        self.kv.push_pull(names, grads, output=outs, op="average")
        return None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def step(self) -> None:
        """Reduce every gradient not reduced during backward, wait for all, update
        (collective: every rank calls it), then free the sharded parameters."""
        self.schedule.step()

    def gather_parameters(self) -> None:
        """Make every parameter whole now (e.g. to evaluate or save). Collective."""
        self.schedule.gather_all()
