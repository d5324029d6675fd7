"""The ``horovod`` backend: negotiated, fused ring allreduce over MPI point-to-point.

How a ``push_pull`` travels (Horovod's controller design):

1. The caller's thread queues the request; the engine thread sends its metadata (name,
   shape, dtype, op, factors) to the coordinator, rank 0 of the workers.
2. The coordinator keeps a table of which ranks have submitted which names. When every
   rank has submitted a name it checks that all ranks agree (a disagreement becomes an
   error response that raises the same message on every rank) and plans the ready names
   into fused groups once submissions pause for ``cycle_time``/10, or at the latest
   ``cycle_time`` after the first became ready (Horovod waits a full cycle every time): tensors with equal dtype, op and
   factors share one buffer up to ``fusion_threshold`` bytes. Because only the coordinator
   plans, the fusion decision is the same on every rank even when tensors become ready in
   different orders or at different times on different ranks.
3. Every rank executes the coordinator's responses in the order sent: copy into the fusion
   buffer, prescale, ring allreduce (reduce-scatter then allgather, any world size),
   postscale, copy out.

CuPy tensors fuse in a GPU buffer, with prescale and postscale done by one kernel that
also copies in and out (:mod:`ddpbench.gpu`), and reduce through NCCL
(``gpu_transport="nccl"``, one rank per GPU) or through the CPU ring via pinned host
memory (``"host"``, which also runs several ranks on one GPU).

The ring's chunking and reduction order are fixed (see ``ddpbench.tensor_ops.ring_chunks``
and ``_ring_allreduce``) so that :mod:`ddpbench.numerics` can reproduce results bit for bit.
Knobs default to Horovod's and read ``HOROVOD_FUSION_THRESHOLD`` (bytes) and
``HOROVOD_CYCLE_TIME`` (ms) when not given.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

from ddpbench.api import Handle, ReduceOp, register
from ddpbench.backends._common import Meta, MismatchError, Request, RequestStore, mismatch_message
from ddpbench.comm import Protocol
from ddpbench.contract import HorovodKnobs
from ddpbench.tensor_ops import byte_view, reduce_ufunc, ring_chunks, scale_

TAG_REQUEST, TAG_RESPONSE, TAG_RING = 11, 12, 13


_Options = HorovodKnobs  # knobs, bounds and HOROVOD_* variables: ddpbench.contract


class StallWarning(UserWarning):
    """Some ranks submitted a tensor that others have not, for longer than stall_timeout."""


def _ring_allreduce(comm: Any, buf: np.ndarray, op: ReduceOp,
                    scratch: list[np.ndarray] | None = None) -> None:
    """Reduce the 1-D ``buf`` in place over ``comm`` with a ring: reduce-scatter, allgather.

    ``scratch``, a one-element list, keeps the receive buffer between calls.

    Reduce-scatter step s: rank r sends chunk (r - s) mod p right and combines chunk
    (r - s - 1) mod p from the left into its own, in the buffer's dtype. So chunk c is
    accumulated as x_c, then + x_{c+1}, ..., + x_{c-1}, and is complete on rank c - 1.
    """
    from mpi4py import MPI

    p, r = comm.size, comm.rank
    if p == 1:
        return
    chunks = ring_chunks(buf.size, p)
    right, left = (r + 1) % p, (r - 1) % p
    ufunc = reduce_ufunc(op)
    raw = buf.view(np.uint8)
    size = buf.itemsize
    # The receive buffer is reused across calls (``scratch`` holds it): a fresh one of
    # megabytes costs a page fault per 4 KiB on first touch, every call.
    need = chunks[0][1] * size
    if scratch is None:
        scratch = [np.empty(0, np.uint8)]
    if scratch[0].nbytes < need:
        scratch[0] = np.empty(need, np.uint8)
    tmp_raw = scratch[0][:need]
    tmp = tmp_raw.view(buf.dtype)

    def part(c: int) -> tuple[int, int]:
        off, cnt = chunks[c]
        return off, cnt

    for s in range(p - 1):
        so, sc = part((r - s) % p)
        ro, rc = part((r - s - 1) % p)
        comm.Sendrecv(
            [raw[so * size:(so + sc) * size], MPI.BYTE], right, TAG_RING,
            [tmp_raw[:rc * size], MPI.BYTE], left, TAG_RING,
        )
        ufunc(tmp[:rc], buf[ro:ro + rc], out=buf[ro:ro + rc])
    for s in range(p - 1):
        so, sc = part((r + 1 - s) % p)
        ro, rc = part((r - s) % p)
        comm.Sendrecv(
            [raw[so * size:(so + sc) * size], MPI.BYTE], right, TAG_RING,
            [raw[ro * size:(ro + rc) * size], MPI.BYTE], left, TAG_RING,
        )


class _HorovodProtocol(Protocol):
    """Negotiation, fusion planning (on the coordinator) and execution, on the engine thread."""

    def __init__(self, ctrl: Any, data: Any, options: _Options) -> None:
        self.ctrl, self.data = ctrl, data
        self.rank, self.size = ctrl.rank, ctrl.size
        self.is_coordinator = self.rank == 0
        self.threshold = options.fusion_threshold
        self.cycle_s = options.cycle_time / 1000.0
        self.stall_s = options.stall_timeout
        self.gpu_transport = options.gpu_transport
        self.nccl: Any = None  # made by the first GPU group, at the same point on every rank
        self.stage: Any = None
        self.gpu_fusion: Any = None
        self.pending: dict[Any, Request] = {}
        self.outbox: list[Meta] = []
        self.sends: list[Any] = []
        self.fusion = np.empty(0, np.uint8)
        self.scratch = [np.empty(0, np.uint8)]
        self.closed_handle: Handle | None = None
        # coordinator state
        self.table: dict[Any, dict[int, Meta]] = {}
        self.first_seen: dict[Any, float] = {}
        self.ready: list[Any] = []
        self.closing: set[int] = set()
        self.last_arrival = 0.0
        self.first_ready = 0.0
        self.last_plan = -1.0
        self.last_stall_check = time.monotonic()
        self.warned: set[Any] = set()
        # statistics, read by benchmarks and tests
        self.stats = {"groups": 0, "fused_tensors": 0, "bytes_sent": 0}

    # -- protocol ---------------------------------------------------------------------
    def accept(self, item: Request | Handle) -> None:
        if isinstance(item, Handle):  # close(): tell the coordinator this rank is done
            self.closed_handle = item
            self.outbox.append(Meta("shutdown", "", "", ()))
            return
        name = item.meta.name
        if name in self.pending:
            item.handle.set_error(ValueError(
                f"a tensor named {name!r} is already being reduced on rank {self.rank}; "
                f"names must be unique among operations in flight"
            ))
            return
        self.pending[name] = item
        self.outbox.append(item.meta)

    def busy(self) -> bool:
        # The coordinator must keep polling: other ranks' requests arrive unannounced.
        return bool(self.is_coordinator or self.pending or self.outbox or self.sends
                    or self.closed_handle)

    def progress(self) -> bool:
        from mpi4py import MPI

        did = False
        if self.outbox:
            metas, self.outbox = self.outbox, []
            if self.is_coordinator:
                self._collect(self.rank, metas)
            else:
                self.sends.append(self.ctrl.isend(metas, 0, TAG_REQUEST))
            did = True
        if self.is_coordinator:
            status = MPI.Status()
            while self.ctrl.iprobe(MPI.ANY_SOURCE, TAG_REQUEST, status):
                src = status.Get_source()
                self._collect(src, self.ctrl.recv(source=src, tag=TAG_REQUEST))
                did = True
            now = time.monotonic()
            if self._all_closing() or (self.ready and self._plan_due(now)):
                responses = self._plan()
                self.last_plan = now
                for dest in range(1, self.size):
                    self.sends.append(self.ctrl.isend(responses, dest, TAG_RESPONSE))
                self._execute(responses)
                did = True
            if now - self.last_stall_check > 1.0:
                self._check_stalls(now)
        else:
            while self.ctrl.iprobe(0, TAG_RESPONSE):
                self._execute(self.ctrl.recv(source=0, tag=TAG_RESPONSE))
                did = True
        if self.sends:
            self.sends = [r for r in self.sends if not r.Test()]
        return did

    def fail(self, error: BaseException) -> None:
        for req in self.pending.values():
            req.handle.set_error(error)
        self.pending.clear()
        if self.closed_handle is not None:
            self.closed_handle.set_error(error)

    # -- coordinator --------------------------------------------------------------------
    def _collect(self, src: int, metas: list[Meta]) -> None:
        now = time.monotonic()
        for m in metas:
            if m.kind == "shutdown":
                self.closing.add(src)
                continue
            self.last_arrival = now
            entry = self.table.setdefault(m.name, {})
            if not entry:
                self.first_seen[m.name] = now
            entry[src] = m
            if len(entry) == self.size:
                if not self.ready:
                    self.first_ready = now
                self.ready.append(m.name)

    def _plan_due(self, now: float) -> bool:
        """Plan once submissions pause, or at the latest one cycle after the first ready.

        Horovod plans every cycle_time, so even a lone small tensor waits up to a cycle.
        Here the first tensor after a quiet spell goes at once, the rest of a burst (a
        backward pass) waits for a pause of cycle_time/10 and fuses, and cycle_time still
        caps how long a ready tensor waits.
        """
        gap = self.cycle_s / 10
        if now - self.last_plan >= gap and self.first_ready - self.last_plan >= gap:
            return True  # the first tensor after a quiet spell: nothing to fuse it with yet
        quiet = now - self.last_arrival >= gap
        return quiet or now - self.first_ready >= self.cycle_s

    def _all_closing(self) -> bool:
        return len(self.closing) == self.size and not self.table

    def _plan(self) -> list[tuple]:
        """Turn the ready names into responses: fused allreduce groups, broadcasts, errors."""
        responses: list[list] = []
        open_group: dict[tuple, int] = {}  # fusion key -> index of its latest group
        for name in self.ready:
            metas = self.table.pop(name)
            self.first_seen.pop(name, None)
            self.warned.discard(name)
            message = mismatch_message([metas[r] for r in range(self.size)])
            if message is not None:
                responses.append(["error", [name], message])
                continue
            m = metas[0]
            if m.kind == "broadcast":
                responses.append(["broadcast", [name]])
                continue
            key = (m.dtype, m.op, m.prescale, m.postscale, m.device)
            idx = open_group.get(key)
            if idx is not None and responses[idx][2] + m.nbytes <= self.threshold:
                responses[idx][1].append(name)
                responses[idx][2] += m.nbytes
                continue
            responses.append(["allreduce", [name], m.nbytes])
            if m.nbytes < self.threshold:
                open_group[key] = len(responses) - 1
        self.ready = []
        if self._all_closing():
            responses.append(["shutdown", []])
        return [tuple(r[:2]) if r[0] != "error" else tuple(r) for r in responses]

    def _check_stalls(self, now: float) -> None:
        self.last_stall_check = now
        for name, since in self.first_seen.items():
            if now - since > self.stall_s and name not in self.warned:
                self.warned.add(name)
                have = sorted(self.table[name])
                missing = [r for r in range(self.size) if r not in self.table[name]]
                import warnings

                warnings.warn(
                    f"horovod: tensor {name!r} was submitted by ranks {have} but not by ranks "
                    f"{missing} for {now - since:.0f} s (stall_timeout {self.stall_s:g} s); "
                    f"those ranks may be stuck or may have skipped this tensor",
                    StallWarning, stacklevel=1,
                )
                sys.stderr.flush()

    # -- every rank ----------------------------------------------------------------------
    def _execute(self, responses: list[tuple]) -> None:
        for resp in responses:
            kind, names = resp[0], resp[1]
            if kind == "shutdown":
                if self.closed_handle is not None:
                    self.closed_handle.set_result(None)
                    self.closed_handle = None
                continue
            reqs = [self.pending.pop(n) for n in names]
            if kind == "error":
                for req in reqs:
                    req.handle.set_error(MismatchError(resp[2]))
            elif kind == "broadcast":
                req = reqs[0]
                if req.meta.device == "gpu":
                    self._reduce_gpu(req.tensor.reshape(-1), None, root=req.meta.root)
                else:
                    self.data.Bcast(byte_view(req.tensor), root=req.meta.root)
                req.handle.set_result(req.tensor)
            else:
                try:
                    self._allreduce(reqs)
                except Exception as err:  # e.g. a dtype the ufunc cannot handle
                    for req in reqs:
                        req.handle.set_error(err)
                else:
                    for req in reqs:
                        req.handle.set_result(req.output)

    def _allreduce(self, reqs: list[Request]) -> None:
        meta = reqs[0].meta
        dtype = reqs[0].tensor.dtype
        self.stats["groups"] += 1
        self.stats["fused_tensors"] += len(reqs)
        if meta.device == "gpu":
            self._allreduce_gpu(reqs)
            return
        if len(reqs) == 1:
            req = reqs[0]
            if req.output is not req.tensor:
                req.output[...] = req.tensor
            buf = req.output.reshape(-1)
        else:
            total = sum(r.tensor.size for r in reqs)
            if self.fusion.nbytes < total * dtype.itemsize:
                self.fusion = np.empty(total * dtype.itemsize, np.uint8)
            buf = self.fusion[: total * dtype.itemsize].view(dtype)
            off = 0
            for r in reqs:
                buf[off:off + r.tensor.size] = r.tensor.reshape(-1)
                off += r.tensor.size
        # Scaling happens on the fused buffer, halves in float32 (tensor_ops.scale_).
        scale_(buf, meta.prescale)
        _ring_allreduce(self.data, buf, ReduceOp(meta.op), self.scratch)
        scale_(buf, meta.postscale)
        if self.size > 1:
            # Rank r sends every chunk but (r+1) in the reduce-scatter, every chunk but
            # (r+2) in the allgather.
            chunks = ring_chunks(buf.size, self.size)
            unsent = chunks[(self.rank + 1) % self.size][1] + chunks[(self.rank + 2) % self.size][1]
            self.stats["bytes_sent"] += (2 * buf.size - unsent) * buf.itemsize
        if len(reqs) > 1:
            off = 0
            for r in reqs:
                r.output.reshape(-1)[...] = buf[off:off + r.tensor.size]
                off += r.tensor.size


    def _allreduce_gpu(self, reqs: list[Request]) -> None:
        """Fused GPU allreduce: prescale in the copy in, postscale in the copy out."""
        from ddpbench import gpu

        meta, dtype = reqs[0].meta, reqs[0].tensor.dtype
        if len(reqs) == 1:
            req = reqs[0]
            gpu.scale_copy(req.tensor, req.output, meta.prescale)
            self._reduce_gpu(req.output.reshape(-1), ReduceOp(meta.op))
            gpu.scale_(req.output, meta.postscale)
            return
        total = sum(r.tensor.size for r in reqs) * dtype.itemsize
        if self.gpu_fusion is None or self.gpu_fusion.nbytes < total:
            self.gpu_fusion = gpu.cupy_or_raise().empty(total, dtype="uint8")
        buf = self.gpu_fusion[:total].view(dtype)
        off = 0
        for r in reqs:
            gpu.scale_copy(r.tensor.reshape(-1), buf[off:off + r.tensor.size], meta.prescale)
            off += r.tensor.size
        self._reduce_gpu(buf, ReduceOp(meta.op))
        off = 0
        for r in reqs:
            gpu.scale_copy(buf[off:off + r.tensor.size], r.output.reshape(-1), meta.postscale)
            off += r.tensor.size

    def _reduce_gpu(self, buf: Any, op: ReduceOp | None, root: int = 0) -> None:
        """Allreduce (``op``) or broadcast (``op`` None, from ``root``) a flat GPU buffer."""
        from ddpbench import gpu

        if self.gpu_transport == "host":
            self.stage = self.stage or gpu.HostStage()
            host = self.stage.to_host(buf)
            if op is None:
                self.data.Bcast(byte_view(host), root=root)
            else:
                _ring_allreduce(self.data, host, op, self.scratch)
            gpu.HostStage.to_device(host, buf)
            return
        if self.nccl is None:
            self.nccl = gpu.NcclComm(self.data, buf.device.id)
        if op is None:
            self.nccl.bcast(buf, root)
        else:
            self.nccl.allreduce(buf, op)


@register("horovod")
class HorovodStore(RequestStore):
    """Ring allreduce with tensor fusion and cross-rank negotiation, after Horovod.

    Options:
        fusion_threshold: bytes a fused buffer may hold (default 128 MiB; 0 = no fusion).
        cycle_time: ms between the coordinator's planning rounds (default 1).
        stall_timeout: s before warning that ranks have not submitted a tensor (60).

    Example:
        >>> kv = ddpbench.create("horovod", fusion_threshold=64 << 20)
        >>> kv.push_pull("grad", g, op="average", prescale_factor=1 / 8, postscale_factor=8)
    """

    Options = _Options
    options: _Options
    _proto: _HorovodProtocol
    capabilities = frozenset({"broadcast", "push_pull", "fusion"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        comm = self._world.role_comm
        ctrl, data = self._engine.call(lambda: (comm.Dup(), comm.Dup())).wait()
        self._proto = _HorovodProtocol(ctrl, data, self.options)
        self._engine.register(self._proto)

    @property
    def stats(self) -> dict[str, int]:
        """Fusion statistics of this rank: groups executed and tensors they carried."""
        return dict(self._proto.stats)

    def _release(self) -> None:
        """Leave together with every other rank (the coordinator says when), then free."""
        done = Handle("close")
        self._engine.submit(self._proto, done)
        done.wait()
        self._engine.unregister(self._proto)
        proto = self._proto
        self._engine.call(
            lambda: (proto.nccl and proto.nccl.close(), proto.ctrl.Free(), proto.data.Free())
        ).wait()
