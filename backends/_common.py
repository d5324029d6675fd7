"""Pieces every real backend shares: request metadata, cross-rank consistency checks and the
per-tensor timeline."""

from __future__ import annotations

import abc
import functools
import os
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ddpbench import trace
from ddpbench.api import Handle, KVStore, ReduceOp, is_cupy
from ddpbench.comm import Protocol, engine, world
from ddpbench.tensor_ops import BFLOAT16, HALF_DTYPES, byte_view, reduce_ufunc

SUPPORTED_KINDS = "fiu"


_DTYPE_NAMES: dict[Any, str] = {}
_GOOD_DTYPES: set[Any] = set()


def dtype_name(dtype: Any) -> str:
    """``dtype.name``, remembered: NumPy builds the name anew on every read (microseconds)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = np.dtype(dtype).name
    return name


def check_dtype(name: Any, dtype: Any) -> None:
    """Raise TypeError for a dtype no backend can reduce (bool, complex, object, ...)."""
    if dtype in _GOOD_DTYPES:
        return
    dt = np.dtype(dtype)
    if dt.kind in SUPPORTED_KINDS or dt == BFLOAT16:
        _GOOD_DTYPES.add(dtype)
        return
    raise TypeError(
        f"tensor {name!r} has dtype {dt}; supported: float16, bfloat16, float32, float64 "
        f"and integers"
    )


def device_of(tensor: Any) -> str:
    """Return "gpu" for a CuPy array, "cpu" otherwise."""
    return "gpu" if is_cupy(tensor) else "cpu"


@functools.cache
def _half_op(op: ReduceOp, dtype_name: str) -> tuple[Any, Any]:
    """Return (MPI datatype, MPI op) reducing ``dtype_name`` halves with ``op`` in that dtype.

    MPI has no predefined reduction for float16 or bfloat16 (Horovod registers its own
    float16 sum the same way, ``mpi_context.cc``); the op adds with NumPy in the half dtype.
    """
    from mpi4py import MPI

    dtype = np.dtype(dtype_name) if dtype_name != "bfloat16" else HALF_DTYPES[-1]
    ufunc = reduce_ufunc(op)

    def combine(inbuf: Any, inoutbuf: Any, _datatype: Any) -> None:
        src = np.frombuffer(inbuf, dtype=dtype)
        dst = np.frombuffer(inoutbuf, dtype=dtype)
        ufunc(src, dst, out=dst)

    mpitype = MPI.BYTE.Create_contiguous(dtype.itemsize).Commit()
    return mpitype, MPI.Op.Create(combine, commute=True)


half_op = _half_op  # the public name, for backends that post nonblocking calls themselves

_MPI_MODULE: list[Any] = []


def mpi_module() -> Any:
    """``mpi4py.MPI``, imported once (an import statement in a hot path costs a lookup)."""
    if not _MPI_MODULE:
        from mpi4py import MPI

        _MPI_MODULE.append(MPI)
    return _MPI_MODULE[0]


_MPI_OPS = {
    ReduceOp.SUM: "SUM", ReduceOp.AVERAGE: "SUM", ReduceOp.MIN: "MIN",
    ReduceOp.MAX: "MAX", ReduceOp.PRODUCT: "PROD",
}


_MPI_OP_OBJECTS: dict[Any, Any] = {}


def _mpi_op(op: ReduceOp | str) -> Any:
    """The predefined MPI op of a reduce op (or of its value string)."""
    found = _MPI_OP_OBJECTS.get(op)
    if found is None:
        found = _MPI_OP_OBJECTS[op] = getattr(mpi_module(), _MPI_OPS[ReduceOp(op)])
    return found


mpi_op = _mpi_op


ALLREDUCE_CHUNK_BYTES = 16 << 20
"""The largest single ``MPI_Allreduce`` :func:`mpi_allreduce` makes; a larger buffer is
reduced in equal consecutive chunks of at most this size (identical bits: every element
is reduced by the same algorithm in the same order; tested at 1-4 ranks).

Why: MPICH's allreduce allocates a temporary buffer of the message's size on every call
(``MPIR_CHKLMEM_MALLOC`` in its ``allreduce_intra_*`` algorithms). glibc serves a request
above its mmap threshold with a fresh ``mmap``, whose pages fault in again on every call,
and that threshold never rises above 32 MiB on 64-bit (``DEFAULT_MMAP_THRESHOLD_MAX``,
mallopt(3)); below it a freed buffer is reused from the heap. Measured on the build
machine (mpich wheel, 2 cores, a 97.5 MiB float32 buffer, best of 6): one call 48.8-49.1 ms
at 2 ranks and 162-205 ms at 3, in 16 MiB chunks 27.3-28.2 and 69-79 ms; chunks of 32 MiB
and above were as slow as one call, of 4 and 8 MiB in between (37 ms at 2 ranks). Horovod's
CPU path hands MPI the whole fused buffer in one call; the chunking is ddpbench's, for this
allocator effect alone."""


def mpi_allreduce(comm: Any, buf: np.ndarray, op: ReduceOp, source: np.ndarray | None = None,
                  chunk_bytes: int = ALLREDUCE_CHUNK_BYTES) -> None:
    """Reduce the contiguous ``buf`` over ``comm`` with the MPI library's own allreduce.

    In place when ``source`` is None, else ``buf`` receives the reduction of ``source``
    (out of place, which saves the copy of the input into the output). A buffer over
    ``chunk_bytes`` goes in equal chunks no larger (same bits, faster:
    :data:`ALLREDUCE_CHUNK_BYTES`); 0 makes one call whatever the size.
    """
    MPI = mpi_module()
    flat = buf.reshape(-1) if buf.ndim != 1 else buf
    src = None if source is None else source.reshape(-1)
    # Equal chunks (none of them small, so each goes by the large-message algorithm the
    # whole buffer would: a short tail could take another, with another summation order).
    chunks = (-(-flat.nbytes // chunk_bytes) or 1) if chunk_bytes > 0 else 1
    step = -(-flat.size // chunks) or 1
    half = flat.dtype in HALF_DTYPES
    mpitype, mpiop = _half_op(op, flat.dtype.name) if half else (None, _mpi_op(op))
    for start in range(0, max(flat.size, 1), step):
        out = flat[start:start + step] if chunks > 1 else flat
        into = None if src is None else (src[start:start + step] if chunks > 1 else src)
        if half:
            send: Any = MPI.IN_PLACE if into is None else [byte_view(into), into.size, mpitype]
            comm.Allreduce(send, [byte_view(out), out.size, mpitype], op=mpiop)
        else:
            comm.Allreduce(MPI.IN_PLACE if into is None else into, out, op=mpiop)



def split_counts(n: int, parts: int) -> list[int]:
    """Return how many of ``n`` elements each of ``parts`` chunks gets, as ``numpy.array_split``
    cuts them: ``n // parts`` each, one more for the first ``n % parts`` (the counts of
    :meth:`~ddpbench.api.KVStore.reduce_scatter`)."""
    base, extra = divmod(int(n), int(parts))
    return [base + (1 if r < extra else 0) for r in range(parts)]


def _offsets(counts: list[int]) -> list[int]:
    out, at = [], 0
    for c in counts:
        out.append(at)
        at += c
    return out


def mpi_allgatherv(comm: Any, tensor: np.ndarray, output: np.ndarray | None = None
                   ) -> np.ndarray:
    """Return every rank's ``tensor`` concatenated along axis 0 in rank order.

    One ``MPI_Allgather`` of the row counts (ranks may hold different numbers of rows, as
    Horovod's allgather allows; the trailing dimensions must agree, which the caller's
    consistency check compares), then one ``MPI_Allgatherv`` of the bytes (no reduction, so
    every dtype, halves included, moves as bytes). ``output``, if given, must have the
    gathered shape.

    Raises:
        ValueError: ``output`` has another shape or dtype.
    """
    MPI = mpi_module()
    send: np.ndarray = np.ascontiguousarray(tensor if tensor.ndim else tensor.reshape(1))
    rows = np.array([len(send)], dtype=np.int64)
    all_rows = np.empty(comm.size, dtype=np.int64)
    comm.Allgather(rows, all_rows)
    shape = (int(all_rows.sum()), *send.shape[1:])
    if output is None:
        output = np.empty(shape, dtype=send.dtype)
    elif tuple(output.shape) != shape or output.dtype != send.dtype:
        raise ValueError(f"allgather output is {output.dtype}{list(output.shape)}, expected "
                         f"{send.dtype}{list(shape)} (every rank's rows, in rank order)")
    row_bytes = int(np.prod(send.shape[1:], dtype=np.int64)) * send.dtype.itemsize
    counts = [int(r) * row_bytes for r in all_rows]
    comm.Allgatherv([byte_view(send), MPI.BYTE],
                    [byte_view(output), (counts, _offsets(counts)), MPI.BYTE])
    return output


def mpi_reduce_scatter(comm: Any, source: np.ndarray, output: np.ndarray, counts: list[int],
                       op: ReduceOp) -> None:
    """Reduce the flat ``source`` over ``comm``; rank r receives elements
    ``[sum(counts[:r]), sum(counts[:r+1]))`` of the result into ``output``
    (``MPI_Reduce_scatter`` with those receive counts; a count may be 0). Halves go through
    the same user-defined op as :func:`mpi_allreduce`."""
    src = np.ascontiguousarray(source).reshape(-1)
    out = output.reshape(-1)
    if src.size != sum(counts) or out.size != counts[comm.rank]:
        raise ValueError(f"reduce-scatter of {src.size} elements with counts {counts}: this "
                         f"rank's output holds {out.size}, expected {counts[comm.rank]}")
    if src.dtype in HALF_DTYPES:
        mpitype, mpiop = _half_op(op, src.dtype.name)
        comm.Reduce_scatter([byte_view(src), src.size, mpitype],
                            [byte_view(out), out.size, mpitype], list(counts), op=mpiop)
        return
    comm.Reduce_scatter(src, out, list(counts), op=_mpi_op(op))


GATHER_KINDS = {"allgather": "MPI_ALLGATHER", "reduce_scatter": "MPI_REDUCESCATTER"}
"""Each gather/scatter request kind and its timeline activity (Horovod's names,
``horovod/common/common.h``)."""


def run_gather_scatter(comm: Any, req: Any) -> None:
    """Run a queued ``allgather`` or ``reduce_scatter`` request on ``comm`` (blocking);
    its result is left in ``req.output``."""
    meta = req.meta
    if meta.kind == "allgather":
        req.output = mpi_allgatherv(comm, req.tensor, req.output)
        return
    counts = split_counts(int(np.prod(meta.shape, dtype=np.int64)), comm.size)
    mpi_reduce_scatter(comm, req.tensor, req.output, counts, ReduceOp(meta.op))
    if meta.postscale != 1.0:
        flat = req.output.reshape(-1)
        flat *= flat.dtype.type(meta.postscale)


@dataclass(frozen=True)
class Meta:
    """What every rank must agree on for one collective call."""

    kind: str  # "allreduce" | "broadcast" | "allgather" | "reduce_scatter"
    name: Any
    dtype: str
    shape: tuple[int, ...]
    op: str = ReduceOp.SUM.value
    prescale: float = 1.0
    postscale: float = 1.0
    root: int = -1
    device: str = "cpu"  # "cpu" or "gpu": tensors fuse only with tensors on the same side

    def signature(self) -> int:
        """A stable 63-bit fingerprint (the same on every rank, unlike ``hash``)."""
        return _signature(self)

    @functools.cached_property
    def nbytes(self) -> int:  # remembered: a cycle asks for it on every response
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@functools.lru_cache(maxsize=4096)
def _signature(meta: Meta) -> int:
    """:meth:`Meta.signature`, remembered: a training loop submits the same metas again."""
    text = repr((meta.kind, meta.name, meta.dtype, meta.shape, meta.op,
                 meta.prescale, meta.postscale, meta.root))
    return zlib.crc32(text.encode()) | (zlib.adler32(text.encode()) << 31)


_FIELDS = [
    ("kind", "operation", lambda v: v),
    ("name", "name", repr),
    ("shape", "shape", lambda v: str(tuple(v))),
    ("dtype", "dtype", lambda v: v),
    ("device", "device", lambda v: v),
    ("op", "reduce op", lambda v: v),
    ("root", "root rank", lambda v: v),
]


def mismatch_message(metas: list[Meta | None]) -> str | None:
    """Return a message naming both sides of the first disagreement, or None if all agree.

    ``metas[r]`` is what rank r submitted (None: nothing). The message reads like Horovod's
    controller: "Mismatched prescale and/or postscale factors for 'g': rank 0 sent
    (0.5, 1.0), rank 2 sent (1.0, 1.0)".
    """
    ref_rank = next((r for r, m in enumerate(metas) if m is not None), None)
    if ref_rank is None:
        return None
    ref = metas[ref_rank]
    assert ref is not None
    for r, m in enumerate(metas):
        if m is None:
            return f"rank {ref_rank} submitted {ref.kind} of {ref.name!r}, rank {r} submitted nothing"
        for field, label, fmt in _FIELDS:
            a, b = getattr(ref, field), getattr(m, field)
            if a != b:
                return (
                    f"Mismatched {label} for {ref.name!r}: rank {ref_rank} sent {fmt(a)}, "
                    f"rank {r} sent {fmt(b)}"
                )
        if (ref.prescale, ref.postscale) != (m.prescale, m.postscale):
            return (
                f"Mismatched prescale and/or postscale factors for {ref.name!r}: "
                f"rank {ref_rank} sent prescale {ref.prescale} postscale {ref.postscale}, "
                f"rank {r} sent prescale {m.prescale} postscale {m.postscale}"
            )
    return None


class MismatchError(ValueError):
    """Ranks disagreed on a collective call; raised on every rank with the same text."""


@dataclass
class Request:
    """One queued call: its metadata, the caller's arrays and the handle to complete.

    ``waited`` says that the caller waits on it at once (a synchronous call); ``queued_at``
    is when the engine took it (``time.monotonic()``; 0.0: run on the caller's thread at
    once), for the timeline.
    """

    meta: Meta
    tensor: Any
    output: Any
    handle: Handle
    priority: int = 0
    waited: bool = False
    queued_at: float = 0.0


def _tensor_label(name: Any) -> str:
    return name if isinstance(name, str) else repr(name)


class Timeline:
    """Horovod's timeline: per tensor, its negotiation, its operation and the operation's
    activities, as Chrome-trace spans (``horovod/common/timeline.cc``).

    Each tensor is a process of the trace, named by the tensor, as Horovod's writer lays it
    out. A tensor goes through Horovod's states: ``negotiate_start`` opens a
    ``NEGOTIATE_<KIND>`` span (a second call while it is open does nothing: the first
    takes precedence), ``negotiate_rank_ready`` marks a rank's request inside it as a
    zero-length span named by the rank, ``negotiate_end`` closes it; ``start`` opens the
    top-level span of the operation (``ALLREDUCE``, ``BROADCAST``, ``ERROR``: Horovod's
    response types), ``activity_start_all``/``activity_end_all`` nest the operation's
    steps in it (``MEMCPY_IN_FUSION_BUFFER``, ``MPI_ALLREDUCE``, ...: one span per tensor,
    the same times for every tensor of a fused group, as ``Timeline::ActivityStartAll``
    writes them), ``end`` closes the operation with the tensor's dtype and shape as args.
    Spans reach the file through :class:`ddpbench.trace.TraceFile` at each :meth:`flush`,
    so the file is valid JSON whenever the process stops between two flushes.

    Only the ranks that write a timeline make one (Horovod: the coordinator). Not
    thread-safe: the backend calls it from one thread at a time.
    """

    LANES = {0: "timeline"}

    def __init__(self, path: str | os.PathLike[str], meta: dict[str, Any]) -> None:
        self.t0 = time.monotonic()
        meta = {**meta, "start_time_since_epoch_in_micros": int(time.time() * 1e6)}
        self.file = trace.TraceFile(path, t0=self.t0, lanes=self.LANES, meta=meta)
        self._negotiating: dict[Any, tuple[str, float]] = {}
        self._top: dict[Any, tuple[str, float, int]] = {}
        self._activity: dict[Any, tuple[str, float]] = {}

    def _span(self, name: Any, kind: str, start: float, end: float, nbytes: int = 0,
              args: dict[str, Any] | None = None) -> None:
        self.file.add(trace.Span(_tensor_label(name), kind, 0, start, end, nbytes,
                                 args=args, name=kind, lane=0))

    # -- negotiation (Horovod's controller) ---------------------------------------------
    def negotiate_start(self, name: Any, kind: str, now: float | None = None) -> None:
        if name not in self._negotiating:
            label = f"NEGOTIATE_{kind.upper()}"
            self._negotiating[name] = (label, time.monotonic() if now is None else now)

    def negotiate_rank_ready(self, name: Any, rank: int, now: float | None = None) -> None:
        if name in self._negotiating:
            t = time.monotonic() if now is None else now
            self._span(name, str(rank), t, t)

    def negotiate_end(self, name: Any, now: float | None = None) -> None:
        opened = self._negotiating.pop(name, None)
        if opened is not None:
            label, start = opened
            self._span(name, label, start, time.monotonic() if now is None else now)

    # -- the operation (PerformOperation) and its activities ------------------------------
    def start(self, name: Any, kind: str, nbytes: int = 0, now: float | None = None) -> None:
        self._top[name] = (kind.upper(), time.monotonic() if now is None else now, nbytes)

    def activity_start_all(self, names: Iterable[Any], activity: str,
                           now: float | None = None) -> None:
        t = time.monotonic() if now is None else now
        for name in names:
            self._activity[name] = (activity, t)

    def activity_end_all(self, names: Iterable[Any], now: float | None = None,
                         args: dict[str, Any] | None = None) -> None:
        t = time.monotonic() if now is None else now
        for name in names:
            opened = self._activity.pop(name, None)
            if opened is not None:
                self._span(name, opened[0], opened[1], t, args=args)

    def end(self, name: Any, meta: Meta | None = None, now: float | None = None) -> None:
        t = time.monotonic() if now is None else now
        self.activity_end_all([name], t)
        opened = self._top.pop(name, None)
        if opened is None:
            return
        kind, start, nbytes = opened
        args = None if meta is None else {"dtype": meta.dtype, "shape": str(meta.shape)}
        self._span(name, kind, start, t, nbytes, args)

    def flush(self) -> None:
        """Write the finished spans to the file (it stays valid JSON)."""
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class Activity:
    """``with owner.act("MPI_ALLREDUCE"):`` records an activity of ``owner.group_names`` on
    ``owner.timeline`` (nothing while that is None); one object, reused, per owner."""

    __slots__ = ("owner", "name")

    def __init__(self, owner: Any) -> None:
        self.owner, self.name = owner, ""

    def __call__(self, name: str) -> Activity:
        self.name = name
        return self

    def __enter__(self) -> None:
        tl = self.owner.timeline
        if tl is not None:
            tl.activity_start_all(self.owner.group_names, self.name)

    def __exit__(self, *exc: object) -> None:
        tl = self.owner.timeline
        if tl is not None:
            tl.activity_end_all(self.owner.group_names)


class EngineStore(KVStore):
    """Base of the real backends: the process's World and engine, handles, close.

    Subclasses build their protocol after ``super().__init__()`` and implement
    ``_release()``, which ``close()`` calls once outstanding work has finished (or failed),
    exactly once. Backends that run servers set ``server_role`` and handle server ranks
    themselves; the others refuse to start on one.
    """

    server_role: ClassVar[bool] = False

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._world = world()
        if self._world.is_server and not self.server_role:
            raise RuntimeError(
                f"backend {self.type!r} has no server role; launch without --servers"
            )
        self._engine = engine()
        self._pending: list[Handle] = []
        self._closed = False

    @property
    def rank(self) -> int:
        return self._world.role_rank

    @property
    def num_workers(self) -> int:
        return self._world.num_workers

    def _track(self, handle: Handle) -> Handle:
        """Remember ``handle`` for ``synchronize``; refuse new work once closed."""
        if self._closed:
            raise RuntimeError(f"backend {self.type!r} is closed")
        if len(self._pending) >= 64:  # forget finished work now and then, not every call
            self._pending = [h for h in self._pending if not h.done()]
        self._pending.append(handle)
        return handle

    def synchronize(self) -> None:
        """Wait for every operation started here; raise the first error nobody has seen."""
        pending, self._pending = self._pending, []
        errors = [e for e in (h.join() for h in pending) if e is not None]
        if errors:
            raise errors[0]

    def close(self) -> None:
        """Finish outstanding work, then release communication resources; idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.synchronize()
        finally:
            self._release()

    @abc.abstractmethod
    def _release(self) -> None:
        """Release what this store holds (protocols, communicators); called once."""


class RequestStore(EngineStore):
    """A store whose protocol takes one :class:`Request` per tensor (mpi, horovod,
    collective): broadcast and push_pull become metadata the protocol can check across
    ranks."""

    _proto: Protocol
    _metas: dict[tuple, Meta]

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._metas = {}

    def _submit(self, meta: Meta, tensor: Any, output: Any, priority: int = 0,
                inline: bool = False) -> Handle:
        """Queue one request for the engine; with ``inline`` (the caller waits on it at
        once) the backend may run it on this thread instead (:meth:`_run_inline`)."""
        check_dtype(meta.name, meta.dtype)
        handle = self._track(Handle(meta.name))
        req = Request(meta, tensor, output, handle, priority, inline)
        if not (inline and self._run_inline(req)):
            self._enqueue(req)
        return handle

    def _run_inline(self, req: Request) -> bool:
        """Run ``req`` on the caller's thread if the backend can now; return whether it did."""
        return False

    def _enqueue(self, req: Request) -> None:
        self._engine.submit(self._proto, req)

    def _push_pull_inline(self, name, tensor, output, *, priority, op, prescale, postscale):
        """A ``_push_pull_now`` for backends that override :meth:`_run_inline` (mpi,
        horovod): the request may run on the caller's thread."""
        return self._submit(self._allreduce_meta(name, tensor, op, prescale, postscale),
                            tensor, output, priority, inline=True)

    def _broadcast(self, names: list[Any], tensors: list[Any], root_rank: int) -> None:
        handles = [
            self._submit(Meta("broadcast", n, t.dtype.name, tuple(t.shape), root=root_rank,
                              device=device_of(t)), t, t)
            for n, t in zip(names, tensors)
        ]
        for h in handles:
            h.wait()

    def _push_pull_async(self, name, tensor, output, *, priority, op, prescale, postscale):
        return self._submit(self._allreduce_meta(name, tensor, op, prescale, postscale),
                            tensor, output, priority)

    def _allgather(self, name: Any, tensor: Any, output: Any) -> Any:
        """Queue an allgather behind this store's earlier calls (the protocol runs
        :func:`run_gather_scatter`); its Meta holds the dimensions after the first, which
        every rank must agree on."""
        meta = Meta("allgather", name, dtype_name(tensor.dtype), tuple(tensor.shape[1:]))
        return self._submit(meta, tensor, output).wait()

    def _reduce_scatter(self, name: Any, tensor: Any, output: Any, op: ReduceOp) -> Any:
        """Queue a reduce-scatter behind this store's earlier calls; AVERAGE is SUM with a
        postscale of 1/size read now (as push_pull's)."""
        postscale = 1.0
        if op is ReduceOp.AVERAGE:
            op, postscale = ReduceOp.SUM, 1.0 / self.num_workers
        count = split_counts(tensor.size, self.num_workers)[self.rank]
        if output is None:
            output = np.empty(count, dtype=tensor.dtype)
        elif output.size != count or output.dtype != tensor.dtype:
            raise ValueError(f"reduce_scatter output for {name!r} is {output.dtype}"
                             f"{list(output.shape)}, expected {count} elements of "
                             f"{tensor.dtype} (rank {self.rank}'s chunk)")
        meta = Meta("reduce_scatter", name, dtype_name(tensor.dtype), tuple(tensor.shape),
                    op.value, postscale=postscale)
        return self._submit(meta, tensor, output).wait()

    def _allreduce_meta(self, name: Any, tensor: Any, op: ReduceOp, prescale: float,
                        postscale: float) -> Meta:
        """The Meta of one push_pull; a training loop's repeated calls reuse the same one
        (building a frozen dataclass costs more than the rest of a small call's checks)."""
        key = (name, tensor.dtype, tensor.shape, op, prescale, postscale, type(tensor))
        meta = self._metas.get(key)
        if meta is None:
            if len(self._metas) >= 4096:
                self._metas.clear()
            meta = self._metas[key] = self._new_allreduce_meta(name, tensor, op, prescale,
                                                               postscale)
        return meta

    def _new_allreduce_meta(self, name: Any, tensor: Any, op: ReduceOp, prescale: float,
                            postscale: float) -> Meta:
        if op is ReduceOp.AVERAGE:
            # Horovod folds the division into the postscale, with the size read now.
            postscale = postscale / self.num_workers
            op = ReduceOp.SUM
        return Meta("allreduce", name, dtype_name(tensor.dtype), tuple(tensor.shape), op.value,
                    prescale, postscale, device=device_of(tensor))
