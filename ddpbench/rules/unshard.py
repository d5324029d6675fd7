"""When a sharded front end gathers, frees and reduces: FSDP's and ZeRO-3's hooks as one rule.

A model is a list of units (FSDP's wrapped modules, ZeRO-3's submodules), each holding
parameters; :class:`UnitSchedule` is told when a unit's forward and backward start and when a
parameter's gradient is complete, and decides from the store's :class:`FrontEndPlan`
(:meth:`ddpbench.backends.zero.ZeroStore.front_end_plan`) which units to all-gather in one
call, which to free, and when a bucket of gradients goes to the store:

- before a unit's forward: it and the next units in forward order, up to
  ``forward_units`` units and ``forward_elements`` elements (the first always), that are
  not whole (FSDP's ``_pre_forward_unshard`` with ``forward_prefetch``; DeepSpeed's
  ``fetch_sub_module`` with its ``prefetch_bucket_size``);
- after a unit's forward, and after its backward: the unit is freed once more than
  ``max_live_elements`` elements are gathered (FSDP's ``_post_forward_reshard`` and
  ``_post_backward_reshard`` with 0, DeepSpeed's ``release_sub_module`` with
  ``max_live_parameters``);
- before a unit's backward: it and the next units in backward order, as before a forward
  (FSDP's BACKWARD_PRE); with ``backward_post_prefetch`` the next one once this unit's
  gradients are complete (BACKWARD_POST);
- gradients: where the plan reduces during backward, each parameter's (DeepSpeed) or each
  unit's (FSDP) into a bucket of ``reduce_bucket_elements`` that goes when the next would
  overflow it (DeepSpeed's ``reduce_independent_p_g_buckets_and_remove_grads``),
  asynchronously with ``reduce_async``; otherwise all at :meth:`UnitSchedule.step`, which
  then waits for every reduction and frees every unit of a sharded store.

Sources: torch/distributed/fsdp/_runtime_utils.py, deepspeed/runtime/zero/
partitioned_param_coordinator.py and stage3.py, stage_1_and_2.py. The torch front end
(:class:`ddpbench.torch.FullyShardedDataParallel`) and the real-mode worker
(:mod:`ddpbench.emulation`) both drive it; what "gather", "free" and "reduce" do to tensors
is theirs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ANY", "FrontEndPlan", "UnitSchedule"]

ANY = 1 << 62
"""No bound (elements or units)."""


@dataclass(frozen=True)
class FrontEndPlan:
    """When a front end gathers and frees a sharded unit: at most ``*_elements`` elements and
    ``*_units`` units per gather call before a forward and a backward, a prefetch after a
    unit's backward, the gathered elements beyond which a unit is freed after its forward
    and after its backward (0: always), and whether gradients are reduced during backward
    (in buckets of ``reduce_bucket_elements``, filled by parameter or by unit,
    asynchronously with ``reduce_async``) or all at the step."""

    forward_elements: int
    forward_units: int
    backward_elements: int
    backward_units: int
    backward_post_prefetch: bool
    max_live_elements: int
    reduce_in_backward: bool = False
    reduce_async: bool = False
    reduce_bucket_elements: int = ANY
    reduce_per_parameter: bool = False


class UnitSchedule:
    """The gathers, frees and gradient buckets of one sharded model (see the module docstring).

    Args:
        plan: the store's plan.
        units: each unit's parameters, as indices into ``param_sizes``, in forward order.
        param_sizes: each parameter's elements.
        sharded: whether the store holds parameters sharded between steps (else nothing is
            gathered or freed, and only the gradient rule applies).
        gather: called with unit indices to make whole, in one collective call.
        free: called with unit indices to drop.
        reduce: called with parameter indices to reduce in one call and whether it may
            return before the reduction is done; returns a handle to wait on, or None.

    ``stats`` counts gather calls, gathered elements, the peak of gathered elements, the
    units freed after forward and after backward, and the reductions.
    """

    def __init__(self, plan: FrontEndPlan, units: Sequence[Sequence[int]],
                 param_sizes: Sequence[int], sharded: bool,
                 gather: Callable[[list[int]], None], free: Callable[[list[int]], None],
                 reduce: Callable[[list[int], bool], Any]) -> None:
        self.plan = plan
        self.units = [list(u) for u in units]
        self.param_sizes = list(param_sizes)
        self.sharded = sharded
        self._gather_fn, self._free_fn, self._reduce_fn = gather, free, reduce
        self.sizes = [sum(self.param_sizes[k] for k in u) for u in self.units]
        self.live: set[int] = set()
        self._waiting = [0] * len(self.units)  # gradients of a unit not yet complete
        self._pending: list[int] = []
        self._pending_elements = 0
        self._sent: set[int] = set()
        self._handles: list[Any] = []
        self.stats = {"gathers": 0, "gathered_elements": 0, "max_live_elements": 0,
                      "freed_after_forward": 0, "freed_after_backward": 0, "reductions": 0}

    # -- the model's events ---------------------------------------------------------------
    def pre_forward(self, i: int) -> None:
        """Unit ``i``'s forward is about to run."""
        if self.sharded:
            self.gather(range(i, len(self.units)), self.plan.forward_elements,
                        self.plan.forward_units)
        self._waiting[i] = len(self.units[i])

    def post_forward(self, i: int) -> None:
        """Unit ``i``'s forward has run."""
        if self.sharded:
            self._release(i, "freed_after_forward")

    def pre_backward(self, i: int) -> None:
        """Unit ``i``'s backward is about to run."""
        if self.sharded:
            self.gather(range(i, -1, -1), self.plan.backward_elements,
                        self.plan.backward_units)

    def grad_ready(self, i: int, k: int) -> None:
        """Parameter ``k`` of unit ``i`` has its whole gradient."""
        plan = self.plan
        if plan.reduce_in_backward and plan.reduce_per_parameter:
            self._bucket([k])
        self._waiting[i] -= 1
        if self._waiting[i]:
            return
        if self.sharded and plan.backward_post_prefetch and i > 0:
            self.gather(range(i - 1, -1, -1), plan.backward_elements, 1)
        if plan.reduce_in_backward and not plan.reduce_per_parameter:
            self._bucket(self.units[i])
        if self.sharded:
            self._release(i, "freed_after_backward")

    def step(self) -> None:
        """Reduce every gradient not reduced yet, wait for every reduction, then free every
        unit of a sharded store."""
        if self._pending:
            self._send_pending()
        rest = [k for k in range(len(self.param_sizes)) if k not in self._sent]
        if rest:
            self._send(rest, wait=True)
        handles, self._handles = self._handles, []
        for h in handles:
            h.wait()
        self._sent = set()
        if self.sharded:
            self.free()

    def gather_all(self) -> None:
        """Make every unit whole (in the forward's calls; the peak is not recorded)."""
        for i in range(len(self.units)):
            self.gather(range(i, len(self.units)), self.plan.forward_elements,
                        self.plan.forward_units, count=False)

    # -- the rules ------------------------------------------------------------------------
    def gather(self, order: range, budget: int, units: int, count: bool = True) -> None:
        """All-gather, in one call, the units among the first ``units`` of ``order`` (the
        one about to run, then the prefetch) that are not whole, within ``budget``
        elements (the first always); ``count``: record the live peak."""
        todo: list[int] = []
        held = 0
        for n, j in enumerate(order):
            if n >= units:
                break
            if j in self.live:
                continue
            if todo and held + self.sizes[j] > budget:
                break
            todo.append(j)
            held += self.sizes[j]
        if not todo:
            return
        self._gather_fn(todo)
        self.live.update(todo)
        self.stats["gathers"] += 1
        self.stats["gathered_elements"] += held
        if count:
            self.stats["max_live_elements"] = max(self.stats["max_live_elements"],
                                                  self.live_elements())

    def free(self, units: list[int] | None = None) -> None:
        """Drop ``units`` (default: every one)."""
        chosen = list(range(len(self.units))) if units is None else units
        self._free_fn(chosen)
        self.live.difference_update(chosen)

    def live_elements(self) -> int:
        """Elements of the units now whole."""
        return sum(self.sizes[j] for j in self.live)

    def _release(self, i: int, counter: str) -> None:
        """Free unit ``i`` once more than the plan's live elements are gathered."""
        if i in self.live and self.live_elements() > self.plan.max_live_elements:
            self.free([i])
            self.stats[counter] += 1

    def _bucket(self, ks: list[int]) -> None:
        """Add gradients ``ks`` (a parameter's, or a unit's) to the bucket being filled: a
        bucket they would overflow goes first, a full one at once."""
        limit = self.plan.reduce_bucket_elements
        size = sum(self.param_sizes[k] for k in ks)
        if self._pending and self._pending_elements + size > limit:
            self._send_pending()
        self._pending.extend(ks)
        self._pending_elements += size
        if self._pending_elements >= limit:
            self._send_pending()

    def _send_pending(self) -> None:
        """Send the bucket being filled and start an empty one."""
        self._send(self._pending)
        self._pending, self._pending_elements = [], 0

    def _send(self, ks: list[int], wait: bool = False) -> None:
        """One reduction of gradients ``ks`` (asynchronous where the plan says, unless
        ``wait``)."""
        self._sent.update(ks)
        self.stats["reductions"] += 1
        handle = self._reduce_fn(list(ks), self.plan.reduce_async and not wait)
        if handle is not None:
            self._handles.append(handle)
