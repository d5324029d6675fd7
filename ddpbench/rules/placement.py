"""Where each part of an array goes: the placement rules of the parameter-server backends.

These functions are the rules themselves, free of MPI: the real backends
(:mod:`ddpbench.backends.ps.kvstore`, :mod:`~ddpbench.backends.ps.p3`,
:mod:`~ddpbench.backends.ps.byteps`) and the simulator's strategies both call them, so a
simulated point places every byte where the real backend does.

- MXNet's KVStore (src/kvstore/kvstore_dist.h, ``EncodeDefaultKey``): an array below
  ``bigarray_bound`` elements goes whole to server ``(key * 9973) % S``, a larger one is
  split evenly over all servers.
- P3 (its MXNet fork's kvstore_dist.h): the same hash below ``slice_params`` elements,
  else slices of ``slice_params`` elements round-robin from server 0.
- BytePS (byteps/common/global.cc, operations.cc): partitions of ``partition_bytes``, each
  on server ``djb2(key) % S`` of its own key.
- TensorFlow (tensorflow/python/training/device_setter.py): whole variables round-robin.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["P3_HASH", "Part", "byteps_parts", "djb2", "even_split", "hashed_server",
           "kvstore_parts", "p3_parts", "part_count", "tensorflow_parts"]


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
    else ``np.array_split`` shares, share i on server i (src/kvstore/kvstore_dist.h)."""
    if numel < bigarray_bound:
        return [Part(0, numel, hashed_server(key, servers))]
    return even_split(numel, servers)


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
