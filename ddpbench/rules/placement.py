"""Where each part of an array goes: the placement rules of the parameter-server backends.

These functions are the rules themselves, free of MPI: the real backends
(:mod:`ddpbench.backends.ps.kvstore`, :mod:`~ddpbench.backends.ps.p3`,
:mod:`~ddpbench.backends.ps.byteps`) and the simulator's strategies both call them, so a
simulated point places every byte where the real backend does.

- MXNet's KVStore (src/kvstore/kvstore_dist.h, ``EncodeDefaultKey``): an array below
  ``bigarray_bound`` elements goes whole to server ``(key * 9973) % S``, a larger one is
  split over all servers in shares bounded by ``round(n / S * i)``.
- P3 (its MXNet fork's kvstore_dist.h): the same hash below ``slice_params`` elements,
  else slices of ``slice_params`` elements round-robin from server 0.
- BytePS (byteps/common/global.cc, operations.cc): partitions of ``partition_bytes``, each
  on server ``djb2(key) % S`` of its own key.
- TensorFlow (tensorflow/python/training/device_setter.py): whole variables round-robin.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["P3_HASH", "Part", "byteps_parts", "declaration_order", "declared_keys", "djb2",
           "even_split", "hashed_server", "kvstore_parts", "mxnet_split", "p3_parts",
           "part_count", "tensorflow_parts", "bytescheduler_keys", "bytescheduler_partitions"]


@dataclass(frozen=True)
class Part:
    """One part of an array: elements ``[offset, offset + count)`` go to server ``server``."""

    offset: int
    count: int
    server: int


def even_split(numel: int, servers: int) -> list[Part]:
    """``np.array_split`` shares: part i, on server i."""
    base, extra = divmod(numel, servers)
    parts, off = [], 0
    for i in range(servers):
        cnt = base + (1 if i < extra else 0)
        parts.append(Part(off, cnt, i))
        off += cnt
    return parts


def _c_round(x: float) -> int:
    """C's ``round`` of a non-negative double: halves away from zero (Python's ``round``
    goes to even)."""
    whole = int(x)
    return whole + (1 if x - whole >= 0.5 else 0)


def mxnet_split(numel: int, servers: int) -> list[Part]:
    """MXNet's shares of a big array: share i, on server i, holds
    ``round(n / S * (i + 1)) - round(n / S * i)`` elements, computed in double and rounded
    half away from zero (``EncodeDefaultKey``, src/kvstore/kvstore_dist.h). They differ
    from ``np.array_split``'s where ``n % S`` is not 0: 10 over 3 servers is 3, 4, 3."""
    bounds = [_c_round(float(numel) / servers * i) for i in range(servers + 1)]
    return [Part(bounds[i], bounds[i + 1] - bounds[i], i) for i in range(servers)]


# -- the originals' rules -------------------------------------------------------------------
P3_HASH = 9973
"""MXNet's and P3's hash multiplier for a small array's server: ``(key * 9973) % S``."""


def hashed_server(key: int, servers: int) -> int:
    """Return MXNet's server for a whole small array: ``(key * 9973) % servers``.

    MXNet's and P3's ``EncodeDefaultKey`` (src/kvstore/kvstore_dist.h) compute it on an
    unsigned 64-bit key; keys here are small non-negative integers, so no wrap-around.
    """
    return (key * P3_HASH) % servers


def kvstore_parts(key: int, numel: int, bigarray_bound: int, servers: int) -> list[Part]:
    """MXNet's placement: below ``bigarray_bound`` elements whole to :func:`hashed_server`,
    else :func:`mxnet_split`'s shares, share i on server i (src/kvstore/kvstore_dist.h)."""
    if numel < bigarray_bound:
        return [Part(0, numel, hashed_server(key, servers))]
    return mxnet_split(numel, servers)


def p3_parts(key: int, numel: int, slice_params: int, servers: int) -> list[Part]:
    """P3's placement (P3's MXNet fork, src/kvstore/kvstore_dist.h, ``EncodeDefaultKey``).

    An array below ``slice_params`` elements goes whole to :func:`hashed_server`; a larger
    one is cut into slices of ``slice_params`` elements (the last one shorter), slice i on
    server ``i % S``: the count restarts at server 0 for every key.
    """
    if numel < slice_params:
        return [Part(0, numel, hashed_server(key, servers))]
    return [Part(lo, min(slice_params, numel - lo), i % servers)
            for i, lo in enumerate(range(0, numel, slice_params))]


_U64 = (1 << 64) - 1


def djb2(key: int) -> int:
    """Return BytePS's ``Hash_DJB2`` of a key: djb2 over its decimal digits, in uint64.

    (byteps/common/global.cc: ``hash = hash * 33 + c`` for each character of
    ``std::to_string(key)``, starting from 5381.)
    """
    h = 5381
    for c in str(key).encode():
        h = (h * 33 + c) & _U64
    return h


def byteps_parts(declared_key: int, numel: int, partition_elems: int,
                 servers: int) -> list[Part]:
    """BytePS's placement (byteps/common/operations.cc and global.cc).

    The tensor declared ``declared_key``-th (0, 1, ... in order of first use) is cut into
    partitions of ``partition_elems`` elements (the last one shorter); partition i has the
    key ``(declared_key << 16) + i`` and lives on server ``djb2(key) % S``
    (``BYTEPS_KEY_HASH_FN=djb2``, the default).
    """
    return [Part(lo, min(partition_elems, numel - lo), djb2((declared_key << 16) + i) % servers)
            for i, lo in enumerate(range(0, numel, partition_elems))]


def tensorflow_parts(key: int, numel: int, servers: int) -> list[Part]:
    """TensorFlow's placement: every variable whole, on parameter server ``key % servers``
    in the order the variables are created (``replica_device_setter``'s default
    round-robin strategy, tensorflow/python/training/device_setter.py)."""
    return [Part(0, numel, key % servers)]


# -- the order keys are declared in ---------------------------------------------------------
FRONTENDS = ("torch", "mxnet")


def declaration_order(backend: str, names: Sequence[str], frontend: str = "torch") -> list[int]:
    """Return the indices of a model's gradients (``names`` in definition order) in the
    order the original's front end declares their keys, which placement follows.

    - ``byteps`` with ``frontend="torch"``: BytePS-PyTorch's ``DistributedOptimizer``
      declares ``"Gradient." + name`` for the sorted parameter names, then
      ``"Parameter." + name`` for the same (byteps/torch/__init__.py), so the gradient
      of the k-th name in sorted order is declared k-th.
    - ``byteps`` with ``frontend="mxnet"``: BytePS-MXNet's ``DistributedTrainer`` declares
      ``parameter_i`` then ``gradient_i`` for each parameter in turn (byteps/mxnet/
      __init__.py): gradients in the trainer's order (see :func:`declared_keys`).
    - every other backend (MXNet's and P3's ``kv.init``, a Gluon ``Trainer``'s
      parameters): definition order.
    """
    if frontend not in FRONTENDS:
        raise ValueError(f"unknown front end {frontend!r}; valid: {list(FRONTENDS)}")
    if backend == "byteps" and frontend == "torch":
        return sorted(range(len(names)), key=lambda i: names[i])
    return list(range(len(names)))


def declared_keys(backend: str, names: Sequence[str], frontend: str = "torch") -> list[int]:
    """Return each gradient's declared key, by definition index: BytePS places partition
    i of the gradient with declared key d on ``djb2((d << 16) + i) % S``
    (:func:`byteps_parts`); MXNet and P3 hash the key of a whole small array
    (:func:`hashed_server`).

    BytePS-MXNet interleaves the parameters' own keys with the gradients' (``parameter_i``
    is 2i, ``gradient_i`` 2i + 1); BytePS-PyTorch declares every gradient first (0 to
    P - 1, sorted by name). Elsewhere the key is the definition index.
    """
    order = declaration_order(backend, names, frontend)
    keys = [0] * len(names)
    for k, i in enumerate(order):
        keys[i] = k
    if backend == "byteps" and frontend == "mxnet":
        keys = [2 * k + 1 for k in keys]
    return keys


def part_count(rule: str, numel: int, *, servers: int = 1, bigarray_bound: int = 1,
               slice_params: int = 1, partition_elems: int = 1) -> int:
    """Return how many non-empty parts ``rule``'s placement cuts an array of ``numel``
    elements into, without building them (a size estimate's count: the parts of an array
    of 10^12 elements cut into slices of one would not fit in memory).

    ``rule`` is ``"kvstore"`` (:func:`kvstore_parts`), ``"p3"`` (:func:`p3_parts`),
    ``"byteps"`` (:func:`byteps_parts`) or ``"tensorflow"`` (:func:`tensorflow_parts`);
    the count is ``len`` of that function's parts with ``count > 0``.
    """
    if rule == "tensorflow":
        return 1
    if rule == "kvstore":
        return 1 if numel < bigarray_bound else min(numel, servers)
    if rule == "p3":
        return 1 if numel < slice_params else -(-numel // slice_params)
    if rule == "byteps":
        return -(-numel // partition_elems)
    raise ValueError(f"unknown placement rule {rule!r}; known: byteps, kvstore, p3, tensorflow")


# -- ByteScheduler over MXNet's kvstore -----------------------------------------------------
def bytescheduler_partitions(numel: int, partition: int) -> list[int]:
    """Return the sizes ByteScheduler cuts an array of ``numel`` elements into: one task up to
    ``partition`` elements, else ``ceil(numel / partition)`` partitions of nearly equal size,
    the last ones one element longer (ByteCore.post, KVStoreTask._partition_single_tensor,
    which cuts by rows; here by elements, the array taken as one row per element)."""
    if numel <= partition:
        return [numel]
    number = -(-numel // partition)
    base, extra = divmod(numel, number)
    return [base + (1 if i >= number - extra else 0) for i in range(number)]


def bytescheduler_keys(partitions: Sequence[Sequence[int]], start: int = 0
                       ) -> tuple[list[list[int]], list[list[int]]]:
    """Return MXNet's integer key of every partition and of its barrier key, for arrays whose
    partitions (:func:`bytescheduler_partitions`) come in declaration order.

    MXNet numbers string keys in the order they are initialised (KVStoreDist's string key
    map), and ScheduledKVStore.init initialises, per array: its own barrier key (the task's,
    in ``_additional_init``), then, for an array cut into several partitions, every
    partition's barrier key (each child task's ``_additional_init``) before the partitions'
    own keys (each child's init); an uncut array's barrier is its own
    (bytescheduler/mxnet/kvstore.py, kvstore_task.py). ``start`` is the number of keys
    initialised before the first of these arrays.
    """
    keys: list[list[int]] = []
    barriers: list[list[int]] = []
    k = start
    for sizes in partitions:
        own = k
        k += 1
        if len(sizes) == 1:
            barriers.append([own])
            keys.append([k])
            k += 1
            continue
        barriers.append(list(range(k, k + len(sizes))))
        k += len(sizes)
        keys.append(list(range(k, k + len(sizes))))
        k += len(sizes)
    return keys, barriers
