"""``broadcast_parameters`` and ``broadcast_optimizer_state`` for torch, over any backend.

Horovod's ``horovod/torch/functions.py`` is the model: parameters (a model, a state_dict or
``named_parameters()``) and optimizer state (tensors and scalar hyperparameters) are
overwritten in place with root's values. Two additions:

- lazy modules (``nn.LazyLinear``, ...) whose parameters are still ``UninitializedParameter``
  get a forward pre-hook that broadcasts them the moment the module's own lazy hook has
  materialised them, inside the first forward (what ``ddpbench.broadcast_parameters`` does
  for deferred NumPy parameters and Horovod for deferred Gluon ones); torch's DDP refuses
  such modules outright;
- before moving any data, every rank's list of names, shapes and dtypes is compared through
  the store, so ranks whose models differ get an error that names the rank and the first
  tensor that differs, on every rank, instead of a hang or a silent mismatch.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch.nn.parameter import is_lazy

from ddpbench.api import KVStore
from ddpbench.torch._tensors import as_array, staging
from ddpbench.trainer import _store

__all__ = ["broadcast_optimizer_state", "broadcast_parameters", "check_same_on_every_rank",
           "resolve_store"]

Named = list[tuple[str, torch.Tensor]]
_CHECKS = itertools.count()


def resolve_store(kv: KVStore | str | None) -> KVStore:
    """Return ``kv``, the store a backend name creates, or the default ``mpi`` store."""
    return _store(kv)


# -- cross-rank consistency -----------------------------------------------------------------
def _describe(named: Named) -> list[str]:
    out = []
    for name, t in named:
        shape = "uninitialised" if is_lazy(t) else str(list(t.shape))
        out.append(f"{name} {str(t.dtype).removeprefix('torch.')}{shape}")
    return out


def _fingerprint(lines: list[str]) -> int:
    digest = hashlib.sha256("\n".join(lines).encode()).digest()
    return int.from_bytes(digest[:7], "little")  # < 2**56: exact in an int64 sum


def check_same_on_every_rank(kv: KVStore, named: Named, what: str = "model",
                             root_rank: int = 0) -> None:
    """Raise ValueError on every rank unless all ranks hold the same names, shapes, dtypes.

    Collective. The fingerprints of the ranks' lists are gathered with one SUM push_pull
    of one-hot slots (an op every backend has); only when they differ are the lists
    themselves exchanged, to name what differs.

    Raises:
        ValueError: some rank's list differs from root's (the message names the rank and
            the first tensor that differs).
    """
    lines = _describe(named)
    n, key = kv.num_workers, f"ddpbench.torch.check.{next(_CHECKS)}"
    slots = np.zeros(n, np.int64)
    slots[kv.rank] = _fingerprint(lines)
    kv.push_pull(key, slots, op="sum")
    odd = [r for r in range(n) if slots[r] != slots[root_rank]]
    if not odd:
        return
    lists = []
    for r in range(n):  # the error path only: every rank's list from every rank
        text = np.frombuffer("\n".join(lines).encode(), np.uint8) if r == kv.rank else None
        size = np.array([0 if text is None else text.size], np.int64)
        kv.broadcast(f"{key}.size.{r}", size, root_rank=r)
        buf = text.copy() if text is not None else np.zeros(int(size[0]), np.uint8)
        if buf.size:
            kv.broadcast(f"{key}.text.{r}", buf, root_rank=r)
        lists.append(buf.tobytes().decode().split("\n") if buf.size else [])
    details = [f"rank {r}: {_first_difference(lists[root_rank], lists[r], root_rank, r)}"
               for r in odd]
    raise ValueError(f"ranks {odd} hold a different {what} than root rank {root_rank} "
                     f"(names, shapes or dtypes): " + "; ".join(details))


def _first_difference(root: list[str], other: list[str], root_rank: int, r: int) -> str:
    by_name = {ln.split(" ", 1)[0]: ln for ln in root}
    mine = {ln.split(" ", 1)[0]: ln for ln in other}
    for name, line in mine.items():
        if name not in by_name:
            return f"{name!r} exists on rank {r} but not on rank {root_rank}"
        if line != by_name[name]:
            return f"{line.split(' ', 1)[1]} on rank {r} vs {by_name[name].split(' ', 1)[1]} " \
                   f"on rank {root_rank} for {name!r}"
    missing = [nm for nm in by_name if nm not in mine]
    if missing:
        return f"{missing[0]!r} exists on rank {root_rank} but not on rank {r}"
    return "the same tensors in another order"


# -- parameters ------------------------------------------------------------------------------
def _named(params: Any, prefix: str) -> tuple[Named, torch.nn.Module | None]:
    if isinstance(params, torch.nn.Module):
        items = list(params.state_dict(keep_vars=True).items())
        return [(prefix + k, v) for k, v in items], params
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, Iterable) and not isinstance(params, (str, torch.Tensor)):
        items = list(params)
    else:
        raise TypeError(f"broadcast_parameters takes a module, a state_dict or (name, tensor) "
                        f"pairs, got {type(params).__name__}")
    out: Named = []
    for i, item in enumerate(items):
        if isinstance(item, torch.Tensor):
            raise ValueError(f"parameter {i} (shape {list(item.shape)}) has no name: the name "
                             f"is the key it is communicated under; pass "
                             f"model.named_parameters() or model.state_dict(), not parameters()")
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], torch.Tensor)):
            raise TypeError(f"item {i} is {type(item).__name__}, expected a (name, tensor) pair")
        out.append((prefix + item[0], item[1]))
    names = [n for n, _ in out]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ValueError(f"parameter names must be unique (they are the keys communicated "
                         f"under); repeated: {dups}")
    return out, None


def _wire(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Return (tensor to send, its bytes or itself, staged?) for a broadcast of any dtype."""
    send, staged = staging(t.detach())
    flat = send.reshape(-1)
    if flat.dtype in (torch.bool, torch.complex64, torch.complex128):
        flat = flat.view(torch.uint8)  # a broadcast moves bytes: any dtype will do
    return send, flat, staged


def _broadcast_named(kv: KVStore, named: Named, root_rank: int) -> None:
    if not named:
        return
    sends = [_wire(t) for _, t in named]
    kv.broadcast([n for n, _ in named], [as_array(flat) for _, flat, _ in sends],
                 root_rank=root_rank)
    with torch.no_grad():
        for (_, t), (send, _, staged) in zip(named, sends):
            if staged:
                t.copy_(send)


def declare_keys(kv: KVStore, names: list[str]) -> None:
    """Declare ``names`` (definition order) to a store that places by declared key
    (``kv.declare``: the parameter servers), in the order its original's PyTorch front end
    declares them (BytePS: sorted; :func:`ddpbench.rules.placement.declaration_order`)."""
    declare = getattr(kv, "declare", None)
    if declare is None:
        return
    from ddpbench.rules.placement import declaration_order

    declare([names[i] for i in declaration_order(kv.type, names)])


def broadcast_parameters(params: Any, root_rank: int = 0, *, kv: KVStore | str | None = None,
                         prefix: str = "") -> None:
    """Overwrite every rank's parameters and buffers with root's, in place. Collective.

    Lazy modules are handled: a parameter or buffer still uninitialised is broadcast at the
    end of its module's lazy initialisation, inside the first forward, so ranks seeded
    differently hold identical values before any of them is used.

    Args:
        params: a module (its ``state_dict``: parameters and persistent buffers), a
            state_dict, or ``(name, tensor)`` pairs such as ``model.named_parameters()``.
        root_rank: whose values win.
        kv: the store (default: an ``mpi`` store made on first use), or a backend name.
        prefix: prepended to every name (keys must be unique per store).

    Raises:
        ValueError: a tensor without a name, repeated names, ranks whose models differ
            (names, shapes or dtypes; the message names the rank), root_rank out of range,
            or lazy tensors passed without their module.
        TypeError: something that is not a module, dict or pairs.
    """
    store = resolve_store(kv)
    if not 0 <= root_rank < store.num_workers:
        raise ValueError(f"root_rank {root_rank} is out of range for {store.num_workers} workers")
    named, module = _named(params, prefix)
    lazy = [n for n, t in named if is_lazy(t)]
    if lazy and module is None:
        raise ValueError(f"{lazy[0]!r} is uninitialised (a lazy module's): pass the module "
                         f"itself, so it is broadcast when the first forward materialises it")
    check_same_on_every_rank(store, named, "model", root_rank)
    declare_keys(store, [n for n, _ in named])
    _broadcast_named(store, [(n, t) for n, t in named if not is_lazy(t)], root_rank)
    if module is not None and lazy:
        _hook_lazy_modules(module, store, root_rank, prefix)


def _hook_lazy_modules(module: torch.nn.Module, kv: KVStore, root_rank: int,
                       prefix: str) -> None:
    for path, sub in module.named_modules():
        local = [k for k, t in itertools.chain(sub.named_parameters(recurse=False),
                                               sub.named_buffers(recurse=False)) if is_lazy(t)]
        if local:
            _LazyBroadcast(sub, f"{prefix}{path}." if path else prefix, kv, root_rank)


class _LazyBroadcast:
    """A forward pre-hook that broadcasts a lazy module's tensors once they exist.

    Registered after the module's own lazy pre-hook, so it runs once that one has
    materialised the tensors; all ranks run the same first forward, so every rank makes
    this collective call at the same point. It removes itself after the broadcast.
    """

    def __init__(self, module: torch.nn.Module, prefix: str, kv: KVStore,
                 root_rank: int) -> None:
        self.prefix, self.kv, self.root_rank = prefix, kv, root_rank
        self.handle = module.register_forward_pre_hook(self)

    def __call__(self, module: torch.nn.Module, args: Any) -> None:
        tensors = list(itertools.chain(module.named_parameters(recurse=False),
                                       module.named_buffers(recurse=False)))
        if any(is_lazy(t) for _, t in tensors):
            return
        self.handle.remove()
        named = [(self.prefix + k, t) for k, t in tensors]
        check_same_on_every_rank(self.kv, named, "model", self.root_rank)
        _broadcast_named(self.kv, named, self.root_rank)


# -- optimizer state -------------------------------------------------------------------------
def _cast_back(value: np.ndarray, like: Any) -> Any:
    if isinstance(like, (tuple, list)):
        return type(like)(_cast_back(v, x) for v, x in zip(value, like))
    return type(like)(value.item())


def _is_number_tree(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return len(value) > 0 and all(_is_number_tree(v) for v in value)
    return isinstance(value, (bool, int, float))


def _initialise_state(optimizer: torch.optim.Optimizer) -> None:
    """Create the optimizer's state by one step on zero gradients, leaving weights alone.

    Horovod steps on zero gradients too; the weights and gradients are restored here so that
    weight decay (which moves weights even on zero gradients) leaves no trace.
    """
    params = [p for g in optimizer.param_groups for p in g["params"]
              if p.requires_grad and not is_lazy(p)]
    saved = [(p.detach().clone(), p.grad) for p in params]
    for p in params:
        p.grad = torch.zeros_like(p)
    base_step = getattr(optimizer, "_base_step", optimizer.step)
    base_step()
    with torch.no_grad():
        for p, (data, grad) in zip(params, saved):
            p.copy_(data)
            p.grad = grad


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0, *,
                              kv: KVStore | str | None = None, prefix: str = "opt.") -> None:
    """Overwrite every rank's optimizer state and hyperparameters with root's. Collective.

    State tensors (momentum buffers, Adam's moments and step) are broadcast in place;
    numeric hyperparameters of every param group (lr, momentum, betas, ...) travel as
    float64 and are cast back to their types. An optimizer without state yet gets it
    first (one step on zero gradients, weights restored), as Horovod does.

    Args:
        optimizer: a ``torch.optim.Optimizer`` or a :func:`DistributedOptimizer`.
        root_rank: whose state wins.
        kv: the store (default: an ``mpi`` store made on first use), or a backend name.
        prefix: prepended to every key.

    Raises:
        ValueError: L-BFGS (its nested state cannot be broadcast tensor by tensor), or
            ranks whose optimizers differ.
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state: its state is nested "
                         "history, not per-parameter tensors")
    store = resolve_store(kv)
    if not optimizer.state:
        _initialise_state(optimizer)
    names = getattr(optimizer, "_parameter_names", {})
    named: Named = []
    scalars: list[tuple[str, np.ndarray, Any, Any]] = []  # key, buffer, owner dict, field
    for gi, group in enumerate(optimizer.param_groups):
        for key in sorted(k for k in group if k != "params"):
            if _is_number_tree(group[key]):
                buf = np.array(group[key], np.float64).reshape(-1)
                scalars.append((f"{prefix}group{gi}.{key}", buf, group, key))
        for pi, p in enumerate(group["params"]):
            pname = names.get(p, f"group{gi}.param{pi}")
            state = optimizer.state.get(p, {})
            for key in sorted(state):
                value = state[key]
                if isinstance(value, torch.Tensor):
                    named.append((f"{prefix}{pname}.{key}", value))
                elif _is_number_tree(value):
                    buf = np.array(value, np.float64).reshape(-1)
                    scalars.append((f"{prefix}{pname}.{key}", buf, state, key))
    as_tensors = [(k, torch.from_numpy(buf)) for k, buf, _, _ in scalars]
    check_same_on_every_rank(store, named + as_tensors, "optimizer", root_rank)
    _broadcast_named(store, named + as_tensors, root_rank)
    for _, buf, owner, key in scalars:
        like = owner[key]
        owner[key] = _cast_back(buf if isinstance(like, (tuple, list)) else buf[0], like)
