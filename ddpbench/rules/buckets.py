"""Paddle's gradient buckets: which gradients one fused allreduce carries.

Paddle fleet's graph execution (``GraphExecutionOptimizer``, the default of
``fleet.distributed_optimizer`` in static mode) fuses gradient allreduces when
``DistributedStrategy.fuse_all_reduce_ops`` is on (the default), into buckets sized by
``fuse_grad_size_in_MB`` (default 32) and capped in count by ``fuse_grad_size_in_TFLOPS``
(default 50, which ``DistributedStrategy._enable_env`` passes on as
``FLAGS_fuse_parameter_groups_size``; paddle/fluid/framework/distributed_strategy.proto,
python/paddle/distributed/fleet/base/distributed_strategy.py). The grouping is
``CoalesceGradTensorPass::SetGroupParamsAndGrads``
(paddle/fluid/framework/ir/coalesce_grad_tensor_pass.cc):

1. **By layer.** The gradients, in the order the backward pass makes them, are gathered by
   layer: a parameter's layer is its name up to the first ``.`` (``fc_0.w_0`` and
   ``fc_0.b_0`` are layer ``fc_0``). A layer's gradients stay together, at the place of the
   layer's first gradient (``SetGroupAccordingToLayers``). Paddle names every parameter
   ``<layer>.<param>``; :func:`layer_key` takes the name up to its *last* ``.``, the same
   layer on Paddle's names, and a module of a dotted path (PyTorch's
   ``layer1.0.conv1.weight`` is in ``layer1.0.conv1``, where the first ``.`` would gather
   the whole stage ``layer1``).
2. **By size.** Whole layers go into a bucket one after another; after adding a layer the
   bucket closes when it holds more than ``max_tensors`` gradients or at least
   ``limit_mb`` MiB (1 MB = 1,048,576 bytes): the layer that crosses the limit is still in
   it, so a bucket may exceed the limit (``SetGroupAccordingToMemorySize``).
3. **By dtype.** A bucket holding several dtypes is split into one bucket per dtype, in
   the order each dtype first appears in it (``ReGroupByDtype``).

Each bucket is one ``coalesce_tensor`` (the gradients laid back to back) and one fused
allreduce, which runs once all of its gradients are ready.

The transpiler's ``GradAllReduce`` (python/paddle/fluid/transpiler/collective.py), whose
collective mode the ``collective`` backend follows, does not fuse: one ``c_allreduce_sum``
per gradient, which is ``limit_mb=0`` here.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

__all__ = ["FUSE_GRAD_SIZE_IN_MB", "FUSE_GROUPS_SIZE", "MB", "coalesce_buckets", "layer_key"]

FUSE_GRAD_SIZE_IN_MB = 32
"""fleet's default bucket size in MB (distributed_strategy.proto, ``fuse_grad_size_in_MB``)."""

FUSE_GROUPS_SIZE = 50
"""fleet's default cap on a bucket's gradients (``fuse_grad_size_in_TFLOPS`` = 50, set as
``FLAGS_fuse_parameter_groups_size``)."""

MB = 1048576
"""Bytes in Paddle's MB (``kMB`` in coalesce_grad_tensor_pass.cc)."""

T = TypeVar("T")


def layer_key(name: Any) -> Hashable:
    """Return the layer of a gradient named ``name``: a str up to its last ``.`` (Paddle's
    ``fc_0.w_0`` is in ``fc_0``, as ``SetGroupAccordingToLayers`` has it), any other name
    itself."""
    return name.rsplit(".", 1)[0] if isinstance(name, str) else name


def coalesce_buckets(items: Sequence[T], limit_mb: float, *, nbytes: Callable[[T], int],
                     layer: Callable[[T], Hashable],
                     dtype: Callable[[T], Hashable] | None = None,
                     max_tensors: int = FUSE_GROUPS_SIZE) -> list[list[T]]:
    """Group gradients into Paddle's fused-allreduce buckets.

    Args:
        items: the gradients in the order the backward pass makes them.
        limit_mb: the bucket size in MB (``fuse_grad_size_in_MB``); 0 or less: no fusion,
            one bucket per gradient (``fuse_all_reduce_ops`` off).
        nbytes: a gradient's size in bytes.
        layer: a gradient's layer (see :func:`layer_key`).
        dtype: a gradient's dtype (None: all alike).
        max_tensors: the cap on a bucket's gradients (``FLAGS_fuse_parameter_groups_size``;
            1 or less: no cap).

    Returns:
        The buckets, each a list of items, in the order their first gradients come.

    Example:
        >>> grads = [("fc_1.w_0", 24 * MB), ("fc_1.b_0", 1024), ("fc_0.w_0", 24 * MB)]
        >>> [[n for n, _ in b] for b in coalesce_buckets(
        ...     grads, 32, nbytes=lambda g: g[1], layer=lambda g: layer_key(g[0]))]
        [['fc_1.w_0', 'fc_1.b_0', 'fc_0.w_0']]
    """
    if limit_mb <= 0:
        return [[item] for item in items]
    layers: dict[Hashable, list[T]] = {}
    for item in items:
        layers.setdefault(layer(item), []).append(item)
    buckets: list[list[T]] = []
    groups = list(layers.values())
    j = 0
    while j < len(groups):
        bucket: list[T] = []
        size = 0
        while j < len(groups):
            bucket += groups[j]
            size += sum(nbytes(item) for item in groups[j])
            j += 1
            if max_tensors > 1 and len(bucket) > max_tensors:
                break
            if size >= limit_mb * MB:
                break
        buckets.append(bucket)
    if dtype is None:
        return buckets
    out: list[list[T]] = []
    for bucket in buckets:
        by_dtype: dict[Hashable, list[T]] = {}
        for item in bucket:
            by_dtype.setdefault(dtype(item), []).append(item)
        out += by_dtype.values()
    return out
