"""Array helpers shared by the real backends and the numerics emulator.

The scaling rules here are the ones the ``horovod`` backend applies to its fused buffer and
that :mod:`ddpbench.numerics` reproduces bit for bit; keep the two in one place.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ddpbench.api import ReduceOp

try:  # bfloat16 as a NumPy dtype; optional at import, required to use bf16
    import ml_dtypes

    BFLOAT16: np.dtype | None = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a declared dependency
    BFLOAT16 = None

HALF_DTYPES = tuple(d for d in (np.dtype(np.float16), BFLOAT16) if d is not None)

_UFUNCS = {
    ReduceOp.SUM: np.add,
    ReduceOp.AVERAGE: np.add,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.PRODUCT: np.multiply,
}


def reduce_ufunc(op: ReduceOp) -> np.ufunc:
    """Return the element-wise NumPy function that combines two partial results of ``op``."""
    return _UFUNCS[op]


def array_module(a: Any) -> Any:
    """Return ``cupy`` for a CuPy array and ``numpy`` otherwise."""
    mod = type(a).__module__
    if mod.startswith("cupy"):
        import cupy

        return cupy
    return np


def is_half(dtype: Any) -> bool:
    return np.dtype(dtype) in HALF_DTYPES


def scale_(buf: Any, factor: float) -> None:
    """Multiply ``buf`` by ``factor`` in place, as Horovod's ScaleBuffer does.

    Half precision is scaled in float32 and rounded once back to half: multiplying in half
    would round ``factor`` itself (1/3 is not a half) and flush small products early.
    Integers are scaled in float64 and truncated toward zero (C assignment semantics).
    A factor of exactly 1 is skipped: no pass over the buffer.
    """
    scale_into(buf, factor, buf)


def scale_into(src: Any, factor: float, out: Any) -> None:
    """Write ``src * factor`` into ``out``: the bits of copying ``src`` then :func:`scale_`.

    This is the copy into (or out of) a fusion buffer with the scaling folded in, one pass
    over the data instead of two. ``src`` and ``out`` have the same dtype and size.
    """
    if factor == 1.0:
        if out is not src:
            out[...] = src
        return
    xp = array_module(out)
    dt = np.dtype(out.dtype)
    if dt in HALF_DTYPES:
        out[...] = (src.astype(np.float32) * np.float32(factor)).astype(dt)
    elif dt == np.float32:
        xp.multiply(src, np.float32(factor), out=out)
    elif dt.kind == "f":
        xp.multiply(src, dt.type(factor), out=out)
    elif dt.kind in "iu":
        out[...] = xp.trunc(src.astype(np.float64) * factor).astype(dt)
    else:
        raise TypeError(f"cannot scale a {dt} tensor")


def adjacent_span(arrays: list[Any]) -> np.ndarray | None:
    """Return one flat view over ``arrays`` when they lie back to back in one buffer, in order.

    ``None`` unless every array is a C-contiguous NumPy array of the first one's dtype, each
    starts where the one before it ends, and all lie inside one contiguous base array (as
    gradients do that were allocated as views of one flat buffer, like PyTorch DDP's bucket
    views). A fused reduction over the span is then the fusion buffer itself: no copy in or
    out, and the same elements in the same order, so the same bits.
    """
    if not arrays or not all(isinstance(a, np.ndarray) for a in arrays):
        return None
    dtype = arrays[0].dtype
    if any(a.dtype != dtype for a in arrays):
        return None
    full = [a for a in arrays if a.size]  # an empty view's address means nothing
    if not full:
        return None
    root = full[0]
    while isinstance(root.base, np.ndarray):
        root = root.base
    if not root.flags.c_contiguous:
        return None
    start = ptr = full[0].__array_interface__["data"][0]
    for a in full:
        if not a.flags.c_contiguous or a.__array_interface__["data"][0] != ptr:
            return None
        ptr += a.nbytes
    lo = root.__array_interface__["data"][0]
    if start < lo or ptr > lo + root.nbytes:
        return None
    return root.reshape(-1).view(np.uint8)[start - lo:ptr - lo].view(dtype)


def byte_view(a: Any) -> Any:
    """Return a flat uint8 view of a C-contiguous array (the wire format of every backend)."""
    return a.reshape(-1).view(np.uint8)


def dtype_label(dtype: Any) -> str:
    """Return the short name used in messages and reports (float16, bfloat16, int32, ...)."""
    return np.dtype(dtype).name


class Arena:
    """Long-lived receive buffers carved from a few large arrays (a bump allocator).

    A server keeps one inbox per part and worker for the whole job. Allocated one by one,
    buffers under 4 MiB get ordinary pages (NumPy asks the kernel for huge pages from 4 MiB
    up), and MPICH's single-copy transfer between processes (CMA) runs slower out of such
    buffers than out of one large array. Carving the buffers out of chunks of
    ``chunk_bytes`` keeps every large message on the fast path. The same copy runs slower
    again between buffers that start at different offsets within a cache line, so a
    buffer can be placed ``offset`` bytes past
    a page boundary (a server places its inboxes where the pushing worker's array lies:
    ``backends/ps/wire.py``). Buffers are never returned; one smaller than ``min_bytes`` is
    an ordinary array.
    """

    ALIGN = 4096

    def __init__(self, chunk_bytes: int = 64 << 20, min_bytes: int = 64 << 10) -> None:
        self.chunk_bytes, self.min_bytes = chunk_bytes, min_bytes
        self._chunk: np.ndarray | None = None
        self._used = 0

    def empty(self, count: int, dtype: Any, offset: int = 0) -> np.ndarray:
        """Return an uninitialised array of ``count`` elements of ``dtype`` that starts
        ``offset`` bytes past a page boundary (``offset`` < :attr:`ALIGN`, a multiple of the
        itemsize; a buffer under ``min_bytes`` ignores it)."""
        dtype = np.dtype(dtype)
        nbytes = count * dtype.itemsize
        if nbytes < self.min_bytes:
            return np.empty(count, dtype)
        if not 0 <= offset < self.ALIGN or offset % dtype.itemsize:
            raise ValueError(f"offset {offset} is not a multiple of {dtype.itemsize} below "
                             f"{self.ALIGN}")
        chunk = self._chunk
        if chunk is None or self._used + offset + nbytes > chunk.size:
            chunk = self._chunk = np.empty(max(self.chunk_bytes, nbytes + 2 * self.ALIGN),
                                           np.uint8)
            self._used = (-chunk.ctypes.data) % self.ALIGN
        start = end = self._used + offset
        end += nbytes
        self._used = end + (-(chunk.ctypes.data + end)) % self.ALIGN  # the next one aligned
        return chunk[start:end].view(dtype)
