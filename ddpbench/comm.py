"""The process layer: this process's place in the MPI job, and its communication engine.

One :class:`Engine` thread per process owns every MPI call of every backend (Horovod's
design): the caller's thread only queues requests and waits on handles, so backward
compute overlaps communication. Backends plug into the engine as :class:`Protocol`
objects; the engine hands each protocol the items queued for it and polls its progress.

Rule for user code: make no MPI calls of your own on other threads while a store is open.
MPI is initialised with MPI_THREAD_MULTIPLE, but a collective of yours (a gather, a
barrier) blocks its thread while this rank's engine may be serving other ranks' requests
(a colocated server, a coordinator) that those ranks need to reach the same collective;
two hangs of that kind were seen. Run such a call on the engine instead:
``engine().call(lambda: comm.allgather(x)).wait()``, or reduce through the store.

Roles: ``ddpbench launch -n W --servers S`` starts W + S ranks; world ranks 0..W-1 are
workers and W..W+S-1 servers (``DDPBENCH_NUM_WORKERS``/``DDPBENCH_NUM_SERVERS``). Under a
plain ``mpiexec`` every rank is a worker.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ddpbench.api import Handle

__all__ = ["Engine", "Finalizer", "Protocol", "World", "engine", "init", "precise_timers",
           "world"]


@dataclass(frozen=True)
class World:
    """This process's place in the job.

    Attributes:
        comm: MPI.COMM_WORLD.
        rank, size: world rank and size (workers and servers together).
        num_workers, num_servers: the launch's split of ranks into roles.
        role: ``"worker"`` or ``"server"``.
        role_comm: a communicator of the ranks sharing this role (the workers' one is what
            collective backends duplicate).
        role_rank: rank within ``role_comm`` (a worker's rank among workers).
        local_rank, local_size: rank and count on this host (picks the GPU).
    """

    comm: Any
    rank: int
    size: int
    num_workers: int
    num_servers: int
    role: str
    role_comm: Any
    role_rank: int
    local_rank: int
    local_size: int

    @property
    def is_server(self) -> bool:
        return self.role == "server"

    def server_ranks(self) -> list[int]:
        """World ranks of the server processes."""
        return list(range(self.num_workers, self.num_workers + self.num_servers))


_WORLD: World | None = None
_WORLD_LOCK = threading.Lock()


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} must be an integer") from None
    if value < 0:
        raise ValueError(f"environment variable {name}={value} must be >= 0")
    return value


def world() -> World:
    """Return this process's :class:`World`, initialising MPI on first use."""
    global _WORLD
    with _WORLD_LOCK:
        if _WORLD is None:
            from mpi4py import MPI

            comm = MPI.COMM_WORLD
            servers = _env_int("DDPBENCH_NUM_SERVERS", 0)
            workers = _env_int("DDPBENCH_NUM_WORKERS", comm.size - servers)
            if workers + servers != comm.size or workers < 1:
                raise RuntimeError(
                    f"the job has {comm.size} ranks but DDPBENCH_NUM_WORKERS={workers} and "
                    f"DDPBENCH_NUM_SERVERS={servers}; start it with "
                    f"'ddpbench launch -n WORKERS --servers SERVERS -- ...'"
                )
            role = "worker" if comm.rank < workers else "server"
            role_comm = comm.Split(0 if role == "worker" else 1, comm.rank)
            local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
            _WORLD = World(
                comm=comm, rank=comm.rank, size=comm.size, num_workers=workers,
                num_servers=servers, role=role, role_comm=role_comm,
                role_rank=role_comm.rank, local_rank=local.rank, local_size=local.size,
            )
            local.Free()
            _install_abort_hooks(comm)
        return _WORLD


# "module:function" that runs a server rank until the workers close, then exits the process;
# imported lazily, like the backends, so that the dependency stays backends -> ddpbench.
SERVER_LOOP = "ddpbench.backends.ps.server:serve"


def init() -> World:
    """Initialise MPI and the engine; return the :class:`World`. Idempotent.

    On a server rank (``ddpbench launch --servers``) this runs the server loop instead and
    exits the process when every worker has closed its store.
    """
    w = world()
    engine()
    if w.is_server:
        import importlib

        module, _, fn = SERVER_LOOP.partition(":")
        getattr(importlib.import_module(module), fn)()
    return w


def _install_abort_hooks(comm: Any) -> None:
    """End the whole job when any thread of this rank dies with an exception.

    Without this, one rank's uncaught error leaves the others blocked in communication
    until a timeout; with it, ``mpiexec`` ends every rank with this rank's message.
    """

    def abort(kind: str, exc_type: Any, exc: Any, tb: Any) -> None:
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        sys.stderr.write(f"[ddpbench rank {comm.rank}] {kind}:\n{text}")
        sys.stderr.flush()
        # mpiexec forwards our stderr from a pipe asynchronously, and MPI_Abort makes it
        # kill the job at once: without a moment's grace the message above can be lost,
        # leaving a failed job that does not say why. The job is ending anyway.
        time.sleep(0.5)
        comm.Abort(1)

    previous = sys.excepthook

    def excepthook(exc_type: Any, exc: Any, tb: Any) -> None:
        if issubclass(exc_type, (KeyboardInterrupt, SystemExit)):
            previous(exc_type, exc, tb)
            return
        abort("uncaught exception, ending the job", exc_type, exc, tb)

    sys.excepthook = excepthook
    threading.excepthook = lambda a: abort(
        f"uncaught exception in thread {a.thread.name if a.thread else '?'}",
        a.exc_type, a.exc_value, a.exc_traceback,
    )


class Protocol:
    """A backend's part of the engine loop. Every method runs on the engine thread.

    ``accept`` takes an item the caller queued with :meth:`Engine.submit`; ``progress``
    advances in-flight work and returns True when it did something; ``busy`` says whether
    it waits on the network (the engine then keeps polling instead of sleeping).
    ``deadline`` gives a ``time.monotonic()`` moment by which ``progress`` must run again
    even if nothing arrives (a backend that works on a clock, such as Horovod's cycle), or
    None. ``hot`` says that a message is due soon (a request of this process is out, or
    it is a server waiting for pushes): the engine then spins a little longer before it
    sleeps between polls, since on a virtual machine a timed wait overshoots what it asks
    for by tens of microseconds. ``moving`` says that this process has point-to-point
    transfers under way that it polls (``Isend``, ``Irecv``): the engine then never backs
    off (see :class:`Engine`). ``fail`` completes every outstanding handle with ``error``.
    """

    def accept(self, item: Any) -> None:
        raise TypeError(f"{type(self).__name__} takes no queued items, got {item!r}")

    def progress(self) -> bool:
        return False

    def busy(self) -> bool:
        return False

    def deadline(self) -> float | None:
        return None

    def hot(self) -> bool:
        return False

    def moving(self) -> bool:
        return False

    def fail(self, error: BaseException) -> None:
        """Complete every outstanding handle with ``error`` (default: nothing outstanding)."""


class _Call:
    __slots__ = ("fn", "handle")

    def __init__(self, fn: Callable[[], Any], handle: Handle) -> None:
        self.fn, self.handle = fn, handle


class Engine:
    """The single thread that runs every MPI call of this process.

    Callers use :meth:`submit` (an item for a protocol) and :meth:`call` (a function to run
    on the engine thread, for blocking collectives such as a communicator ``Dup``). While a
    protocol is busy the engine polls: it spins (yielding the GIL) for ``spin_s`` after
    its last progress (``hot_spin_s`` while a protocol is :meth:`~Protocol.hot`; :func:`engine`
    sets it to ``spin_s`` where this host has more ranks than cores, since a spinning rank
    would take the core of one that has work), then
    sleeps ``max_poll_s`` between polls, and 1 ms after 10 ms of quiet; when nothing is in
    flight it sleeps until work is queued or until the earliest protocol
    :meth:`~Protocol.deadline`.

    While a protocol is :meth:`~Protocol.moving` the engine keeps polling: it spins where
    every rank of this host has a core, else polls every ``max_poll_s``, never every 1 ms.
    Where the MPI library cannot copy a large message from one process's memory into the
    other's in one step (MPICH's cross-memory attach, CMA: off in MPICH before 5.0, and
    off where ``/proc/sys/kernel/yama/ptrace_scope`` is not 0, Ubuntu's default, or a
    container's seccomp forbids it), the message crosses shared memory in chunks, and a
    chunk moves only while the sender calls into MPI: a large transfer moves at the
    engine's polling rate.
    """

    def __init__(self, max_poll_s: float = 5e-5, spin_s: float = 1e-4,
                 hot_spin_s: float = 2e-3) -> None:
        self._cond = threading.Condition()
        self._queue: list[tuple[Protocol | None, Any]] = []
        self._protocols: list[Protocol] = []
        self._stopping = False
        self._error: BaseException | None = None
        self._max_poll_s = max_poll_s
        self._spin_s = spin_s
        self._hot_spin_s = hot_spin_s
        self._thread = threading.Thread(target=self._run, name="ddpbench-engine", daemon=True)
        self._thread.start()

    # -- caller side ------------------------------------------------------------------
    def register(self, protocol: Protocol) -> None:
        self.call(lambda: self._protocols.append(protocol)).wait()

    def unregister(self, protocol: Protocol) -> None:
        self.call(lambda: self._protocols.remove(protocol)).wait()

    def submit(self, protocol: Protocol, item: Any) -> None:
        """Queue ``item`` for ``protocol.accept`` on the engine thread."""
        with self._cond:
            self._check_alive()
            self._queue.append((protocol, item))
            self._cond.notify()

    def call(self, fn: Callable[[], Any]) -> Handle:
        """Run ``fn()`` on the engine thread; the handle's result is its return value."""
        handle = Handle(getattr(fn, "__name__", "call"))
        if threading.current_thread() is self._thread:
            handle.set_result(fn())
            return handle
        with self._cond:
            self._check_alive()
            self._queue.append((None, _Call(fn, handle)))
            self._cond.notify()
        return handle

    def wake(self) -> None:
        """Make the engine look at its protocols now (one changed outside the engine)."""
        with self._cond:
            self._cond.notify()

    def stop(self) -> None:
        """Finish queued work, then end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _check_alive(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"the communication engine has failed: {self._error}")
        if self._stopping or not self._thread.is_alive():
            raise RuntimeError("the communication engine is stopped (ddpbench shut down)")

    # -- engine thread ----------------------------------------------------------------
    def _run(self) -> None:
        precise_timers()
        last_active = 0.0
        while True:
            with self._cond:
                busy = any(p.busy() for p in self._protocols)
                now = time.monotonic()
                idle_s = now - last_active
                spin_s = self._spin_s
                moving = False
                if busy and idle_s > spin_s:
                    moving = any(p.moving() for p in self._protocols)
                    if moving or any(p.hot() for p in self._protocols):
                        spin_s = self._hot_spin_s
                if not self._queue:
                    if self._stopping and not busy:
                        return
                    due = min((d for d in (p.deadline() for p in self._protocols)
                               if d is not None), default=now + 0.5)
                    if not busy:
                        if due > now:
                            self._cond.wait(timeout=due - now)
                    elif moving and self._hot_spin_s > self._spin_s:
                        pass  # a core of its own: spin while transfers are under way
                    elif idle_s > spin_s:
                        # Right after activity a reply is likely soon: spin (below). Later,
                        # poll every max_poll_s, and after 10 ms every 1 ms (not while
                        # transfers are under way), so that an idle coordinator does not
                        # burn a core.
                        poll = self._max_poll_s if idle_s < 0.01 or moving else 1e-3
                        if due > now:
                            self._cond.wait(timeout=min(poll, due - now))
                items, self._queue = self._queue, []
            try:
                did = bool(items)
                for protocol, item in items:
                    if protocol is None:
                        try:
                            item.handle.set_result(item.fn())
                        except Exception as err:
                            item.handle.set_error(err)
                    else:
                        protocol.accept(item)
                for p in list(self._protocols):
                    did |= p.progress()
            except BaseException as err:  # a broken protocol must not hang its callers
                self._error = err
                for p in self._protocols:
                    p.fail(err)
                raise
            if did:
                last_active = time.monotonic()
            elif busy and (idle_s <= spin_s or moving):
                time.sleep(0)  # yield the GIL (and the core) between polls


class Finalizer:
    """One thread that completes work another thread has only enqueued, in order.

    Horovod's GPU operations return ``InProgress`` once the device work is enqueued and hand
    its completion to a finalizer thread pool (``horovod/common/ops/gpu_operations.cc``,
    ``GPUOpContext::FinalizeGPUQueue``; one thread per NCCL stream, ``HOROVOD_NUM_NCCL_STREAMS``
    = 1 by default, ``operations.cc``): the pool waits for the events recorded after the
    work, then ends the timeline and calls the entries' callbacks, while the background
    loop goes on planning the next cycle. :meth:`submit` queues ``(wait, done)``: the
    thread runs ``wait()`` (e.g. a CUDA event's ``synchronize``), then ``done(None)``, or
    ``done(error)`` when ``wait`` raised; jobs finish in the order submitted. It imports no
    GPU module, so its queue logic runs anywhere.
    """

    def __init__(self, name: str = "ddpbench-finalizer") -> None:
        self._cv = threading.Condition()
        self._jobs: list[tuple[Callable[[], Any], Callable[[BaseException | None], None]]] = []
        self._busy = 0  # submitted and not yet done
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, wait: Callable[[], Any],
               done: Callable[[BaseException | None], None]) -> None:
        """Queue one completion; returns at once."""
        with self._cv:
            if self._closed:
                raise RuntimeError("the finalizer is closed; no more work can be submitted")
            self._jobs.append((wait, done))
            self._busy += 1
            self._cv.notify_all()

    def pending(self) -> int:
        """Return how many submitted completions have not finished yet."""
        with self._cv:
            return self._busy

    def drain(self, timeout: float | None = None) -> bool:
        """Block until every submitted completion has finished (False: ``timeout`` first)."""
        with self._cv:
            return self._cv.wait_for(lambda: self._busy == 0, timeout)

    def close(self) -> None:
        """Finish what is queued, then stop the thread."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._jobs or self._closed)
                if not self._jobs:
                    return
                wait, done = self._jobs.pop(0)
            error: BaseException | None = None
            try:
                wait()
            except BaseException as err:  # handed to ``done``, which fails the handles
                error = err
            try:
                done(error)
            finally:
                with self._cv:
                    self._busy -= 1
                    self._cv.notify_all()


def _core_per_rank(local_size: int) -> bool:
    """True when this host has at least as many usable cores as it has ranks of the job."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return local_size <= cores


# Tests of a transfer under way per engine poll: without single-copy shared memory (see
# :class:`Engine`) each call into MPI moves about 8 KiB of a large message, and one pass of
# the engine loop costs far more Python than one test, so a poll tests a few times in a row.
POLL_TESTS = 16


def test_all(reqs: list, tries: int = POLL_TESTS) -> bool:
    """``MPI.Request.Testall(reqs)`` up to ``tries`` times; True once all have completed."""
    from mpi4py import MPI

    testall = MPI.Request.Testall
    return any(testall(reqs) for _ in range(tries))


def precise_timers() -> None:
    """Make the calling thread's short timed waits short: Linux stretches every timed wait
    of a thread by its timer slack (50 us by default), which would add that much to every
    polled reply of the engine, and to every ``time.sleep`` of a compute emulation; this
    sets the slack to 1 us (``prctl(PR_SET_TIMERSLACK)``, Linux only)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None).prctl(29, 1000, 0, 0, 0)  # PR_SET_TIMERSLACK, in ns
        except (OSError, AttributeError):
            pass


_ENGINE: Engine | None = None


def engine() -> Engine:
    """Return this process's engine, starting it (and MPI) on first use."""
    global _ENGINE
    w = world()
    with _WORLD_LOCK:
        if _ENGINE is None:
            # Spin longer while a reply is due only where every rank has a core.
            _ENGINE = Engine(hot_spin_s=2e-3 if _core_per_rank(w.local_size) else 1e-4)
            atexit.register(_shutdown)
        return _ENGINE


def _shutdown() -> None:
    # Runs before mpi4py's own atexit MPI_Finalize (registered earlier, run later).
    if _ENGINE is not None and _ENGINE._error is None:
        _ENGINE.stop()
