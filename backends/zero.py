"""The ``zero`` and ``fsdp`` backends: sharded data parallelism over MPI.

``zero`` follows DeepSpeed's ZeRO (``deepspeed/runtime/zero/stage_1_and_2.py``,
``stage3.py``, ``partitioned_param_coordinator.py``; knobs and defaults from
``config.py``, declared in :class:`ddpbench.contract.ZeroKnobs`); ``fsdp`` runs PyTorch
FSDP's sharding strategies (``torch/distributed/fsdp``; :class:`ddpbench.contract.FsdpKnobs`)
on the same engine. The KVStore API is kvstore's with a local optimizer in place of the
servers' (docs/fidelity/zero.md):

- ``broadcast(name, w)`` makes every rank hold the root's ``w`` and registers ``w`` as a
  parameter (MXNet's ``kv.init``); the store keeps a copy (stage 0-2: whole; stage 3: only
  this rank's shard);
- ``set_optimizer(ddpbench.SGD(...))`` (collective; every rank passes the same one); each
  rank keeps optimizer state for the elements it owns only (stages 1-3);
- ``push_pull(names, grads, output=weights, op=AVERAGE)`` with an optimizer set:

  * stage 0 (FSDP's NO_SHARD): gradients allreduced in buckets of ``reduce_bucket_size``
    elements, the step on whole weights on every rank, ``output`` gets the new weights;
  * stages 1 and 2: every bucket allreduced whole and each rank keeping the sum of the
    elements it owns (DeepSpeed's ``average_tensor`` under its default
    ``use_multi_rank_bucket_allreduce``: ``allreduce_and_scatter`` runs one allreduce per
    bucket, with ``reduce_scatter`` true or false; FSDP's SHARD_GRAD_OP reduce-scatters
    instead), the step on the owned elements
    with their state, then the updated elements all-gathered in buckets of
    ``allgather_bucket_size`` into ``output``. The two stages move the same bytes; stage 2
    differs in memory only (the other partitions' gradients are not kept), as in
    DeepSpeed's one class for both;
  * stage 3 (FULL_SHARD): the same reduce-scatter and step, but the parameters stay
    sharded: ``output`` is not written; ``gather(names, outs)`` all-gathers them (in
    buckets of ``prefetch_bucket_size`` elements, DeepSpeed's prefetch bucket) before
    they are used. Parameters of at most ``param_persistence_threshold`` elements
    are not partitioned (DeepSpeed's persistent parameters): whole on every rank, their
    gradients allreduced;
  * HYBRID_SHARD (fsdp): stage 3 within each host, the gradient shards then allreduced
    across the hosts (the ranks of the same local rank), as FSDP's intra- and inter-node
    process groups do (``_init_utils.py``, ``_runtime_utils.py``);

  without an optimizer, ``push_pull`` returns the reduction, as the other backends do
  (stages 1-3: the reduce-scatter, then the all-gather of the reduced shards).

Partitions: stages 1 and 2 cut the concatenation of every registered parameter (in
``broadcast`` order, fixed at ``set_optimizer``) into ``size`` partitions of
``ceil(total / size)`` elements, as DeepSpeed partitions its flat fp32 group (padding the
last one); stage 3 and every fsdp strategy cut each parameter on its own into chunks of
``ceil(numel / size)`` (DeepSpeed's ``ds_tensor``, FSDP's ``FlatParamHandle`` shard: the
last ranks' shards may be short or empty). Buckets hold whole parameters in call order
(DeepSpeed reduces its bucket before a parameter that would overflow it; one larger than
the bucket goes alone) and one dtype each.

Every call is collective and runs in call order on the process's engine thread (one
``MPI_Reduce_scatter``/``MPI_Allgatherv``/``MPI_Allreduce`` per bucket); a list given to
``push_pull`` is one call, bucketed as a whole; ``push_pull_async`` returns at once, so a
front end overlaps the reduction with its backward pass. With ``check_consistency``
(default) each call first compares the names, element counts and dtypes of every rank,
so a disagreement raises on every rank instead of hanging.

Example:
    >>> kv = ddpbench.create("zero", stage=2)     # ddpbench launch -n 4 -- ...
    >>> kv.broadcast(names, weights)               # every rank: rank 0's weights
    >>> kv.set_optimizer(ddpbench.SGD(lr=0.1, momentum=0.9))
    >>> kv.push_pull(names, grads, output=weights, op="average")   # weights now updated
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ddpbench.api import Handle, ReduceOp, is_cupy, register
from ddpbench.backends._common import (
    EngineStore,
    Meta,
    check_dtype,
    dtype_name,
    mpi_allgatherv,
    mpi_allreduce,
    mpi_module,
    mpi_reduce_scatter,
    split_counts,
)
from ddpbench.backends.mpi import check_consistent
from ddpbench.contract import FsdpKnobs, ZeroKnobs
from ddpbench.optim import SGD
from ddpbench.rules.unshard import ANY as _ANY
from ddpbench.rules.unshard import FrontEndPlan
from ddpbench.tensor_ops import byte_view

__all__ = ["RANKS_PER_HOST_ENV", "FrontEndPlan", "FsdpStore", "ZeroStore", "shard_counts"]

RANKS_PER_HOST_ENV = "DDPBENCH_RANKS_PER_HOST"
"""HYBRID_SHARD's host size when ``ranks_per_host`` is None and this variable is set (a
launcher that places ranks on hosts itself, or one machine standing in for several hosts
of ``gpus_per_host`` ranks); unset: the ranks sharing a node."""


def shard_counts(numel: int, size: int) -> list[int]:
    """Return the elements each of ``size`` ranks owns of a ``numel``-element parameter:
    chunks of ``ceil(numel / size)``, the last ones short or empty (DeepSpeed stage 3's
    ``ds_tensor`` and FSDP's flat-parameter shards, without their padding)."""
    chunk = -(-numel // size) if numel else 0
    return [max(0, min(chunk, numel - r * chunk)) for r in range(size)]


@dataclass
class _Param:
    """One registered parameter: its place in the partitions and what this rank keeps.

    ``counts[p]`` elements of the flattened parameter, starting at ``starts[p]``, belong to
    rank ``p`` (of the sharding group); ``full`` is the whole flat copy (None where the
    parameter is sharded and not kept whole), ``shard`` this rank's elements.
    """

    name: Any
    shape: tuple[int, ...]
    dtype: np.dtype
    numel: int
    counts: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    sharded: bool = True
    full: np.ndarray | None = None
    shard: np.ndarray | None = None
    state: Any = None

    def part(self, flat: np.ndarray, p: int) -> np.ndarray:
        """Rank ``p``'s elements of the flat array ``flat`` (this parameter's size)."""
        return flat[self.starts[p]:self.starts[p] + self.counts[p]]


@dataclass(frozen=True)
class _Plan:
    """How the engine runs: sharded stage, partition rule, knobs it reads."""

    stage: int  # 0..3
    per_param: bool  # partition each parameter (stage 3, fsdp) or the flat group (1/2)
    keep_full: bool  # parameters whole between steps (stages 0-2)
    hybrid: bool
    reduce_bucket: int
    gather_bucket: int
    prefetch_bucket: int
    persistence: int
    reduce_scatter: bool


def _host(a: Any) -> np.ndarray:
    """``a`` itself for a NumPy array, a host copy for a CuPy one."""
    return a.get() if is_cupy(a) else a


def _back(host: np.ndarray, a: Any) -> None:
    """Copy a host result into CuPy array ``a`` (nothing for a NumPy one: it was ``a``)."""
    if is_cupy(a):
        with a.device:
            a.set(host)


def _starts(counts: list[int]) -> list[int]:
    return [sum(counts[:p]) for p in range(len(counts))]


def _buckets(params: Sequence[_Param], limit: int) -> Iterator[list[int]]:
    """Yield index lists of whole parameters in order, each under ``limit`` elements (one
    larger parameter alone) and of one dtype, closing a bucket before a parameter that would
    overflow it (DeepSpeed's ``reduce_independent_p_g_buckets_and_remove_grads``)."""
    bucket: list[int] = []
    held = 0
    for i, p in enumerate(params):
        if bucket and (held + p.numel > limit or params[bucket[0]].dtype != p.dtype):
            yield bucket
            bucket, held = [], 0
        bucket.append(i)
        held += p.numel
    if bucket:
        yield bucket


class _Engine:
    """The sharding engine of one store: parameters, partitions, collectives (engine thread)."""

    def __init__(self, comm: Any, shard_comm: Any, cross_comm: Any, plan: _Plan,
                 validate: bool) -> None:
        self.comm, self.shard, self.cross = comm, shard_comm, cross_comm
        self.plan, self.validate = plan, validate
        self.params: dict[Any, _Param] = {}
        self.optimizer: SGD | None = None
        self.frozen = False
        self.stats = {"reduce_scatter": 0, "allgather": 0, "allreduce": 0, "elements_sent": 0}

    # -- registration -------------------------------------------------------------------
    def register(self, name: Any, tensor: np.ndarray) -> None:
        """Keep ``tensor`` (already broadcast) as parameter ``name``."""
        flat = tensor.reshape(-1)
        size, rank = self.shard.size, self.shard.rank
        p = _Param(name, tuple(tensor.shape), tensor.dtype, flat.size)
        # DeepSpeed persists a parameter of ds_numel <= the threshold (parameter_offload.py,
        # mark_persistent_parameters); 0 shards every non-empty one
        p.sharded = self.plan.stage > 0 and flat.size > self.plan.persistence
        if self.plan.per_param or not p.sharded:
            p.counts = shard_counts(flat.size, size) if p.sharded else [0] * size
            p.starts = _starts(p.counts)
        old = self.params.get(name)
        if old is not None and self.frozen:  # broadcast again: same place, same state
            if (old.shape, old.dtype) != (p.shape, p.dtype):
                raise ValueError(f"zero: parameter {name!r} was {old.dtype}{list(old.shape)} "
                                 f"when the partitions were made; got {tensor.dtype}"
                                 f"{list(tensor.shape)}")
            p.counts, p.starts, p.state = old.counts, old.starts, old.state
        elif self.frozen and not self.plan.per_param and p.sharded:
            raise RuntimeError(f"zero stage {self.plan.stage}: parameter {name!r} is new "
                               f"after set_optimizer made the partitions; broadcast every "
                               f"parameter first (DeepSpeed partitions at construction)")
        p.full = flat.copy() if self.plan.keep_full or not p.sharded else None
        if p.counts:
            p.shard = p.part(flat, rank).copy() if p.sharded else None
        self.params[name] = p

    def freeze(self) -> None:
        """Cut the flat group into the partitions (stages 1/2), once an optimizer is set."""
        if self.frozen or self.plan.per_param:
            self.frozen = True
            return
        group = [p for p in self.params.values() if p.sharded]
        total = sum(p.numel for p in group)
        size, rank = self.shard.size, self.shard.rank
        bounds = [min(r * (-(-total // size)), total) for r in range(size + 1)]
        at = 0
        for p in group:
            lo, hi = at, at + p.numel
            p.counts = [max(0, min(hi, bounds[r + 1]) - max(lo, bounds[r])) for r in range(size)]
            p.starts = [max(0, min(p.numel, bounds[r] - lo)) for r in range(size)]
            assert p.full is not None
            p.shard = p.part(p.full, rank).copy()
            at = hi
        self.frozen = True

    def param(self, name: Any, tensor: np.ndarray) -> _Param:
        """The registered parameter ``name`` (or a transient one for a plain reduction)."""
        p = self.params.get(name)
        if p is None or not p.counts or p.numel != tensor.size or p.dtype != tensor.dtype:
            if self.optimizer is not None:
                raise ValueError(f"zero: {name!r} is not a parameter of this store (or has "
                               f"another size or dtype): broadcast it before push_pull with "
                               f"an optimizer, as kv.init in MXNet")
            counts = shard_counts(tensor.size, self.shard.size)
            sharded = self.plan.stage > 0
            counts = counts if sharded else [0] * self.shard.size
            return _Param(name, tuple(tensor.shape), tensor.dtype, tensor.size, counts,
                          _starts(counts), sharded)
        return p

    # -- the collectives ----------------------------------------------------------------
    def check(self, kind: str, names: list[Any], tensors: list[np.ndarray]) -> None:
        """Raise MismatchError on every rank unless all ranks make this call with the same
        names, element counts and dtypes (one 16-byte allreduce of a fingerprint first)."""
        if self.validate and self.comm.size > 1:
            dtypes = ",".join(dtype_name(t.dtype) for t in tensors)
            sizes = tuple(int(t.size) for t in tensors)
            check_consistent(self.comm, Meta(kind, tuple(names), dtypes, sizes))

    def allreduce(self, bufs: list[np.ndarray], op: ReduceOp, comm: Any = None) -> None:
        """Allreduce flat arrays of one dtype as one buffer (a bucket)."""
        comm = comm or self.comm
        if comm.size == 1 or not bufs:
            return
        flat = bufs[0] if len(bufs) == 1 else np.concatenate(bufs)
        mpi_allreduce(comm, flat, op)
        self.stats["allreduce"] += 1
        self.stats["elements_sent"] += flat.size
        if len(bufs) > 1:
            at = 0
            for b in bufs:
                b[...] = flat[at:at + b.size]
                at += b.size

    def reduce_scatter(self, params: list[_Param], grads: list[np.ndarray], op: ReduceOp
                       ) -> list[np.ndarray]:
        """Reduce one bucket's gradients; return this rank's reduced elements of each."""
        size, rank = self.shard.size, self.shard.rank
        if not self.plan.reduce_scatter and self.plan.stage in (1, 2):
            whole = [g.copy() for g in grads]
            self.allreduce(whole, op, self.shard)
            mine = [p.part(w, rank).copy() for p, w in zip(params, whole)]
        else:
            send = np.concatenate([p.part(g, r) for r in range(size) for p, g in
                                   zip(params, grads)])
            counts = [sum(p.counts[r] for p in params) for r in range(size)]
            out = np.empty(counts[rank], dtype=send.dtype)
            mpi_reduce_scatter(self.shard, send, out, counts, op)
            self.stats["reduce_scatter"] += 1
            self.stats["elements_sent"] += send.size
            mine, at = [], 0
            for p in params:
                mine.append(out[at:at + p.counts[rank]])
                at += p.counts[rank]
        if self.plan.hybrid and self.cross.size > 1:  # replicas of the shard across hosts
            self.allreduce(mine, op, self.cross)
        return mine

    def allgather(self, params: list[_Param], shards: list[np.ndarray],
                  outs: list[np.ndarray]) -> None:
        """All-gather one bucket's shards into the flat ``outs`` (within the sharding group)."""
        size = self.shard.size
        send = (np.concatenate(shards) if len(shards) > 1 else shards[0]).reshape(-1)
        got = mpi_allgatherv(self.shard, send)
        self.stats["allgather"] += 1
        self.stats["elements_sent"] += send.size
        at = 0
        for r in range(size):
            for p, o in zip(params, outs):
                n = p.counts[r]
                p.part(o, r)[...] = got[at:at + n]
                at += n

    # -- the calls ----------------------------------------------------------------------
    def push_pull(self, names: list[Any], grads: list[np.ndarray], outs: list[np.ndarray],
                  op: ReduceOp, postscale: float) -> None:
        """Reduce ``grads`` and (with an optimizer) update; see the module docstring."""
        self.check("zero_push_pull", names, grads)
        params = [self.param(n, g) for n, g in zip(names, grads)]
        flats = [np.ascontiguousarray(g).reshape(-1) for g in grads]
        whole = [i for i, p in enumerate(params) if not p.sharded]
        parts = [i for i, p in enumerate(params) if p.sharded]
        # Unsharded (stage 0, NO_SHARD, persistent): bucketed allreduce, then the step.
        for bucket in _buckets([params[i] for i in whole], self.plan.reduce_bucket):
            idx = [whole[j] for j in bucket]
            red = [flats[i].copy() for i in idx]
            self.allreduce(red, op)
            for i, g in zip(idx, red):
                self._finish_whole(params[i], g, outs[i], postscale)
        # Sharded: bucketed reduce-scatter, the step on the owned elements, then gather.
        mine: dict[int, np.ndarray] = {}
        for bucket in _buckets([params[i] for i in parts], self.plan.reduce_bucket):
            idx = [parts[j] for j in bucket]
            got = self.reduce_scatter([params[i] for i in idx], [flats[i] for i in idx], op)
            mine.update(zip(idx, got))
        for i in parts:
            mine[i] = self._finish_shard(params[i], mine[i], postscale)
        if self.optimizer is not None and not self.plan.keep_full:
            return  # stage 3: parameters stay sharded until gathered
        for bucket in _buckets([params[i] for i in parts], self.plan.gather_bucket):
            idx = [parts[j] for j in bucket]
            full = [np.empty(params[i].numel, params[i].dtype) for i in idx]
            self.allgather([params[i] for i in idx], [mine[i] for i in idx], full)
            for i, f in zip(idx, full):
                p = params[i]
                if self.optimizer is not None and p.full is not None:
                    p.full[...] = f
                outs[i].reshape(-1)[...] = f

    def _finish_whole(self, p: _Param, g: np.ndarray, out: np.ndarray, postscale: float) -> None:
        if postscale != 1.0:
            g *= g.dtype.type(postscale)
        if self.optimizer is None:
            out.reshape(-1)[...] = g
            return
        assert p.full is not None
        if p.state is None:
            p.state = self.optimizer.create_state(p.full)
        self.optimizer.update(p.full, g, p.state)
        out.reshape(-1)[...] = p.full

    def _finish_shard(self, p: _Param, g: np.ndarray, postscale: float) -> np.ndarray:
        if postscale != 1.0:
            g = g * g.dtype.type(postscale)
        if self.optimizer is None:
            return g
        assert p.shard is not None
        if p.state is None:
            p.state = self.optimizer.create_state(p.shard)
        self.optimizer.update(p.shard, g, p.state)
        return p.shard

    def gather(self, names: list[Any], outs: list[np.ndarray]) -> None:
        """Write each parameter's current whole value into ``outs`` (stage 3: all-gathered
        in buckets of ``prefetch_bucket_size``; else copied from this rank's whole copy)."""
        self.check("zero_gather", names, outs)
        params = []
        for n, o in zip(names, outs):
            p = self.params.get(n)
            if p is None:
                raise ValueError(f"zero: {n!r} is not a parameter of this store; broadcast it "
                               f"first")
            if p.numel != o.size or p.dtype != o.dtype:
                raise ValueError(f"zero: gather of {n!r} into {o.dtype}{list(o.shape)}, the "
                                 f"parameter is {p.dtype}{list(p.shape)}")
            params.append(p)
        fetch = []
        for i, (p, o) in enumerate(zip(params, outs)):
            if p.full is not None:
                o.reshape(-1)[...] = p.full
            else:
                fetch.append(i)
        limit = max(self.plan.prefetch_bucket, 1)
        for bucket in _buckets([params[i] for i in fetch], limit):
            idx = [fetch[j] for j in bucket]
            ps = [params[i] for i in idx]
            self.allgather(ps, [p.shard for p in ps],  # type: ignore[misc]
                           [outs[i].reshape(-1) for i in idx])


def _plan_zero(o: ZeroKnobs) -> _Plan:
    return _Plan(stage=o.stage, per_param=o.stage == 3, keep_full=o.stage < 3, hybrid=False,
                 reduce_bucket=o.reduce_bucket_size, gather_bucket=o.allgather_bucket_size,
                 prefetch_bucket=o.prefetch_bucket_size,
                 persistence=o.param_persistence_threshold if o.stage == 3 else 0,
                 # DeepSpeed's stages 1/2 allreduce each bucket whole by default, whatever
                 # reduce_scatter says (use_multi_rank_bucket_allreduce, stage_1_and_2.py
                 # allreduce_and_scatter -> allreduce_bucket); stage 3 reduce-scatters.
                 reduce_scatter=o.stage == 3)


_FSDP_STAGE = {"NO_SHARD": 0, "SHARD_GRAD_OP": 2, "FULL_SHARD": 3, "HYBRID_SHARD": 3}
"""FSDP's strategies as ZeRO stages (api.py's ShardingStrategy docstrings say the same)."""

def _plan_fsdp(o: FsdpKnobs) -> _Plan:
    stage = _FSDP_STAGE[o.sharding_strategy]
    return _Plan(stage=stage, per_param=True, keep_full=stage < 3,
                 hybrid=o.sharding_strategy == "HYBRID_SHARD", reduce_bucket=1,
                 gather_bucket=1, prefetch_bucket=1, persistence=0, reduce_scatter=True)


@register("zero")
class ZeroStore(EngineStore):
    """DeepSpeed's ZeRO stages 0-3 over MPI (see the module docstring).

    Options: :class:`ddpbench.contract.ZeroKnobs`.
    """

    Options = ZeroKnobs
    options: Any
    capabilities = frozenset({"broadcast", "push_pull", "optimizer", "allgather",
                              "reduce_scatter", "gather"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        comms = self._engine.call(self._make_comms).wait()
        self._comms = comms
        self._zero = _Engine(comms[0], comms[1], comms[2], self._plan(),
                             self.options.check_consistency)

    def _plan(self) -> _Plan:
        return _plan_zero(self.options)

    def _make_comms(self) -> tuple[Any, Any, Any]:
        """(every worker, the sharding group, the replicas across groups)."""
        comm = self._world.role_comm.Dup()
        return comm, comm, comm

    @property
    def holds_sharded_params(self) -> bool:
        """True where parameters stay sharded between steps (stage 3, FULL_SHARD,
        HYBRID_SHARD): ``push_pull`` does not write them, :meth:`gather` does."""
        return not self._zero.plan.keep_full

    def front_end_plan(self) -> FrontEndPlan:
        """ZeRO-3's fetch and release (``partitioned_param_coordinator.py``): before a
        module's forward or backward its parameters and, ahead in execution order, the next
        modules' within ``prefetch_bucket_size`` elements; after its forward and after its
        backward a module is released once more than ``max_live_parameters`` elements are
        gathered (DeepSpeed
        also keeps one reused within ``stage3_max_reuse_distance``, 1e9 elements by
        default, which this rule does not model)."""
        o = self.options
        # stage_1_and_2.py: gradient hooks reduce buckets during backward at stage 2 or
        # with overlap_comm (asynchronously then), else all after backward; stage3.py
        # always from its hooks
        in_backward = o.stage == 3 or (o.stage == 2 or o.overlap()) and o.stage > 0
        return FrontEndPlan(o.prefetch_bucket_size, _ANY, o.prefetch_bucket_size, _ANY,
                            False, o.max_live_parameters, in_backward, o.overlap(),
                            o.reduce_bucket_size, True)

    @property
    def stats(self) -> dict[str, int]:
        """Collectives and elements this rank sent so far (reduce-scatter, all-gather,
        allreduce)."""
        return dict(self._zero.stats)

    def _run(self, fn: Any, name: Any) -> Handle:
        """Run ``fn`` on the engine thread behind this store's earlier calls."""
        handle = self._engine.call(fn)
        handle.name = name
        return self._track(handle)

    # -- KVStore ------------------------------------------------------------------------
    def _broadcast(self, names: list[Any], tensors: list[Any], root_rank: int) -> None:
        for n, t in zip(names, tensors):
            check_dtype(n, t.dtype)

        def run() -> None:
            MPI = mpi_module()
            self._zero.check("zero_broadcast", names, tensors)
            for n, t in zip(names, tensors):
                self._zero.comm.Bcast([byte_view(t), MPI.BYTE], root=root_rank)
                self._zero.register(n, t)

        self._run(run, names).wait()

    def set_optimizer(self, optimizer: Any) -> None:
        """Update locally with ``optimizer`` (a :class:`ddpbench.SGD` or a dict of its
        fields; None: reduce only). Collective: every rank passes the same one (compared).
        Stages 1/2 make their partitions here over the parameters broadcast so far.

        Raises:
            TypeError: not an SGD, a dict of its fields, or None.
            ValueError: ranks passed different optimizers.
        """
        if optimizer is not None and not isinstance(optimizer, SGD):
            if not isinstance(optimizer, dict):
                raise TypeError(f"{self.type} runs ddpbench.SGD (or a dict of its fields: "
                                f"{sorted(SGD.model_fields)}), got {type(optimizer).__name__}")
            optimizer = SGD(**optimizer)
        spec = None if optimizer is None else optimizer.model_dump()

        def run() -> None:
            specs = self._zero.comm.allgather(spec)
            if any(s != specs[0] for s in specs):
                bad = next(r for r, s in enumerate(specs) if s != specs[0])
                raise ValueError(f"{self.type}: rank 0 set optimizer {specs[0]}, rank {bad} "
                                 f"set {specs[bad]}")
            self._zero.optimizer = optimizer
            if optimizer is not None:
                self._zero.freeze()

        self._run(run, "set_optimizer").wait()

    def _push_pull_async(self, name, tensor, output, *, priority, op, prescale, postscale):
        return self._push_pull_list([name], [tensor], [output], op, prescale, postscale)

    def _start_push_pull(self, name: Any, tensor: Any, output: Any, priority: int,
                         op: ReduceOp | str, prescale_factor: float, postscale_factor: float,
                         now: bool) -> Handle:
        """A list of names is one call to the engine, bucketed as a whole (DeepSpeed's
        gradient buckets span parameters); one name is a call of its own."""
        if not isinstance(name, (list, tuple)):
            return super()._start_push_pull(name, tensor, output, priority, op,
                                            prescale_factor, postscale_factor, now)
        names, tensors, _ = self._as_lists(name, tensor)
        outputs = list(tensors) if output is None else list(output)
        if len(outputs) != len(tensors):
            raise ValueError(f"{len(outputs)} outputs given for {len(tensors)} tensors")
        for n, t, o in zip(names, tensors, outputs):
            self._check_tensor(n, t)
            self._check_tensor(n, o)
            check_dtype(n, t.dtype)
            if o.shape != t.shape or o.dtype != t.dtype:
                raise ValueError(f"output for {n!r} is {o.dtype}{list(o.shape)}, expected "
                                 f"{t.dtype}{list(t.shape)} like the input")
        if any(is_cupy(t) or is_cupy(o) for t, o in zip(tensors, outputs)):
            return self._push_pull_staged(names, tensors, outputs, ReduceOp.parse(op),
                                          float(prescale_factor), float(postscale_factor))
        return self._push_pull_list(names, tensors, outputs, ReduceOp.parse(op),
                                    float(prescale_factor), float(postscale_factor))

    def _push_pull_staged(self, names: list[Any], tensors: list[Any], outputs: list[Any],
                          op: ReduceOp, prescale: float, postscale: float) -> Handle:
        """CuPy arrays: reduce host copies, then copy the results back (synchronously)."""
        host = [_host(t) for t in tensors]
        outs = [h if o is t else _host(o) for h, t, o in zip(host, tensors, outputs)]
        self._push_pull_list(names, host, outs, op, prescale, postscale).wait()
        for h, o in zip(outs, outputs):
            _back(h, o)
        done = Handle(names)
        done.set_result(outputs)
        return done

    def _push_pull_list(self, names: list[Any], tensors: list[Any], outputs: list[Any],
                        op: ReduceOp, prescale: float, postscale: float) -> Handle:
        if op is ReduceOp.AVERAGE:
            op, postscale = ReduceOp.SUM, postscale / self.num_workers
        if self._zero.optimizer is not None and op is not ReduceOp.SUM:
            raise ValueError(f"{self.type}: with an optimizer, push_pull reduces gradients: "
                             f"op must be sum or average, got {op.value}")
        for n, t in zip(names, tensors):
            check_dtype(n, t.dtype)
        grads = [t if prescale == 1.0 else t * t.dtype.type(prescale) for t in tensors]

        def run() -> Any:
            self._zero.push_pull(names, grads, outputs, op, postscale)
            return outputs[0] if len(outputs) == 1 else outputs

        return self._run(run, names[0] if len(names) == 1 else names)

    def gather(self, name: Any, output: Any) -> Any:
        """Write the whole current value of parameter(s) ``name`` into ``output``. Collective.

        Stage 3 (FULL_SHARD, HYBRID_SHARD): all-gathers the shards, in buckets of
        ``prefetch_bucket_size`` elements (the parameters a forward needs before it runs);
        other stages copy this rank's whole copy without communication. Lists allowed.
        """
        names, outs, single = self._as_lists(name, output)
        for n, o in zip(names, outs):
            self._check_tensor(n, o)
        host = [_host(o) for o in outs]  # CuPy: gathered on the host, then copied back
        self._run(lambda: self._zero.gather(names, host), names).wait()
        for h, o in zip(host, outs):
            _back(h, o)
        return outs[0] if single else outs

    def _allgather(self, name: Any, tensor: Any, output: Any) -> Any:
        def run() -> Any:
            rows = tensor[:0] if tensor.ndim else tensor.reshape(1)[:0]
            self._zero.check("allgather", [name], [rows])  # the dimensions after the first
            return mpi_allgatherv(self._zero.comm, tensor, output)

        return self._run(run, name).wait()

    def _reduce_scatter(self, name: Any, tensor: Any, output: Any, op: ReduceOp) -> Any:
        scale = 1.0
        if op is ReduceOp.AVERAGE:
            op, scale = ReduceOp.SUM, 1.0 / self.num_workers
        count = split_counts(tensor.size, self.num_workers)[self.rank]
        out = np.empty(count, tensor.dtype) if output is None else output
        if out.size != count or out.dtype != tensor.dtype:
            raise ValueError(f"reduce_scatter output for {name!r} is {out.dtype}"
                             f"{list(out.shape)}, expected {count} elements of {tensor.dtype}")

        def run() -> Any:
            self._zero.check("reduce_scatter", [name], [tensor])
            counts = split_counts(tensor.size, self._zero.comm.size)
            mpi_reduce_scatter(self._zero.comm, tensor, out, counts, op)
            if scale != 1.0:
                out.reshape(-1)[...] *= out.dtype.type(scale)
            return out

        return self._run(run, name).wait()

    def _release(self) -> None:
        comms = self._comms

        def free() -> None:
            for c in {id(c): c for c in comms}.values():
                c.Free()

        self._engine.call(free).wait()


@register("fsdp")
class FsdpStore(ZeroStore):
    """PyTorch FSDP's sharding strategies on the ``zero`` engine (see the module docstring).

    Each name is one FSDP unit's flat parameter, sharded on its own and moved by one
    collective (FSDP has no buckets across units). HYBRID_SHARD shards within groups of
    ``ranks_per_host`` consecutive ranks (None: :data:`RANKS_PER_HOST_ENV` if set, else the
    ranks sharing a node) and allreduces the gradient shards across them.

    Options: :class:`ddpbench.contract.FsdpKnobs`.
    """

    Options = FsdpKnobs  # type: ignore[assignment]  # the same engine, FSDP's knobs

    def _plan(self) -> _Plan:
        return _plan_fsdp(self.options)

    def front_end_plan(self) -> FrontEndPlan:
        """FSDP's unshard and reshard (``_runtime_utils.py``): before a unit's forward its
        all-gather, with ``forward_prefetch`` the next unit's too (``_prefetch_handle``);
        FULL_SHARD and HYBRID_SHARD free a unit after its forward (``_post_forward_reshard``)
        and gather it again before its backward, BACKWARD_PRE with the next unit in
        backward order, BACKWARD_POST that one after the unit's gradients, ``none``
        neither; after its backward a unit is freed again (``_post_backward_reshard``)."""
        o = self.options
        prefetch = o.backward_prefetch
        # every strategy reduces a unit's gradient in its post-backward hook, on its own
        # stream (_post_backward_hook, _reduce_grad)
        return FrontEndPlan(_ANY, 2 if o.forward_prefetch else 1, _ANY,
                            2 if prefetch == "BACKWARD_PRE" else 1,
                            prefetch == "BACKWARD_POST", 0, True, True, 1)

    def _make_comms(self) -> tuple[Any, Any, Any]:
        comm = self._world.role_comm.Dup()
        if self.options.sharding_strategy != "HYBRID_SHARD":
            return comm, comm, comm
        per_host = self.options.ranks_per_host
        if per_host is None and os.environ.get(RANKS_PER_HOST_ENV):
            per_host = int(os.environ[RANKS_PER_HOST_ENV])
        if per_host is None:
            local = comm.Split_type(mpi_module().COMM_TYPE_SHARED, key=comm.rank)
            per_host = local.size
            local.Free()
        sizes = comm.allgather(per_host)
        if len(set(sizes)) != 1 or comm.size % per_host:
            comm.Free()
            raise ValueError(f"fsdp HYBRID_SHARD needs the same number of ranks on every "
                             f"host, dividing the {comm.size} workers; got ranks_per_host "
                             f"{sorted(set(sizes))}")
        host, local_rank = divmod(comm.rank, per_host)
        return comm, comm.Split(host, comm.rank), comm.Split(local_rank, comm.rank)
