"""The unified data-parallel communication API: the KVStore, its registry and reduce ops.

Modelled on MXNet's KVStoreBase and its RFC for a unified data-parallel API: every backend,
whether a collective (``mpi``, ``horovod``, ``collective``) or a parameter server
(``kvstore``, ``p3``, ``byteps``), is used through the same object::

    kv = ddpbench.create("horovod")            # or "mpi", "p3", ... : user code stays the same
    kv.broadcast("w", weights, root_rank=0)      # every rank now holds rank 0's weights
    kv.push_pull("g", grad, op=ddpbench.ReduceOp.AVERAGE, priority=-layer)
    kv.close()

Which backend to pick when:

============  ===============================================================================
backend       pick it when
============  ===============================================================================
mpi           you want the baseline: one native MPI_Allreduce per tensor
horovod       many small tensors (fusion), fp16 gradients at scale (predivide factor)
kvstore       you compare against MXNet's parameter server, or want updates on servers
p3            large layers near the input (VGG) on slow networks: slices + priorities
byteps        you have spare CPU hosts to act as summation servers
collective    you need max/min/prod reductions, parallel rings or local SGD
zero          the model states do not fit one worker: DeepSpeed's ZeRO stages 0-3
fsdp          the same through PyTorch FSDP's sharding strategies (HYBRID_SHARD per host)
============  ===============================================================================
"""

from __future__ import annotations

import abc
import builtins
import enum
import importlib
import importlib.util
import threading
from _thread import allocate_lock as _allocate_lock
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import Any, ClassVar, TypeVar

import numpy as np
from pydantic import ValidationError

from ddpbench.contract import Knobs
from ddpbench.staging import HostStage, StagingPool

__all__ = [
    "GATHER_BACKENDS",
    "BackendOptions",
    "Handle",
    "KVStore",
    "NotSupportedError",
    "ReduceOp",
    "available",
    "create",
    "register",
]


class NotSupportedError(RuntimeError):
    """Raise when a backend is asked for a capability it does not have."""


class ReduceOp(str, enum.Enum):
    """Reduction applied by ``push_pull``.

    ``AVERAGE`` is ``SUM`` with the postscale factor divided by the world size read at call
    time (Horovod's definition, safe when the world size changes between calls).
    """

    SUM = "sum"
    AVERAGE = "average"
    MIN = "min"
    MAX = "max"
    PRODUCT = "product"

    @classmethod
    def parse(cls, value: ReduceOp | str) -> ReduceOp:
        """Return the op named by ``value`` (an op, or its name in any case)."""
        if isinstance(value, ReduceOp):
            return value
        if isinstance(value, str):
            try:
                return cls(value.lower())
            except ValueError:
                pass
            aliases = {"avg": cls.AVERAGE, "mean": cls.AVERAGE, "prod": cls.PRODUCT}
            if value.lower() in aliases:
                return aliases[value.lower()]
        valid = [op.value for op in cls]
        raise ValueError(f"unknown reduce op {value!r}; valid ops: {valid}")


BackendOptions = Knobs  # every backend's options model derives from the contract's base


_CALLBACKS = _allocate_lock()  # guards every handle's done flag against its callback list


class Handle:
    """The result of an asynchronous call; ``wait()`` blocks until it completes.

    The engine thread completes a handle with ``set_result`` or ``set_error``; the error is
    raised from ``wait()`` in the caller's thread. A handle is a bare lock held until it
    completes (a ``threading.Event`` costs a condition and two locks per call, which a
    4 KiB push_pull notices).
    """

    __slots__ = ("_lock", "_done", "_result", "_error", "name", "_callbacks", "_seen")

    def __init__(self, name: Any = None) -> None:
        self._lock = _allocate_lock()
        self._lock.acquire()
        self._done = False
        self._result: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Handle], None]] | None = None
        self._seen = False
        self.name = name

    def done(self) -> bool:
        """Return True when the operation has finished (successfully or not)."""
        return self._done

    def _block(self, timeout: float | None) -> bool:
        if self._done:
            return True
        if not self._lock.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            return False
        self._lock.release()  # let every other waiter through as well
        return True

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the operation finishes and return its result.

        Raises:
            TimeoutError: ``timeout`` seconds passed first.
            Exception: whatever the operation failed with, re-raised in this thread.
        """
        if not self._block(timeout):
            raise TimeoutError(f"operation on {self.name!r} did not finish in {timeout} s")
        self._seen = True
        if self._error is not None:
            raise self._error
        return self._result

    def join(self) -> BaseException | None:
        """Wait for completion; return an error nobody has seen through ``wait()`` yet."""
        self._block(None)
        if self._error is not None and not self._seen:
            self._seen = True
            return self._error
        return None

    def add_done_callback(self, fn: Callable[[Handle], None]) -> None:
        """Call ``fn(handle)`` on completion (at once when already done)."""
        with _CALLBACKS:  # not lost to a completion on another thread in between
            if not self._done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        fn(self)

    def set_result(self, result: Any) -> None:
        self._result = result
        self._finish()

    def set_error(self, error: BaseException) -> None:
        self._error = error
        self._finish()

    def _finish(self) -> None:
        with _CALLBACKS:
            if self._done:
                return
            self._done = True
            callbacks, self._callbacks = self._callbacks, None
        self._lock.release()
        if callbacks:
            for fn in callbacks:
                fn(self)


class _ListHandle(Handle):
    """Handle over several handles; its result is the list of their results."""

    __slots__ = ("_parts",)

    def __init__(self, parts: list[Handle]) -> None:
        super().__init__([p.name for p in parts])
        self._parts = parts
        self._finish()

    def done(self) -> bool:
        return all(p.done() for p in self._parts)

    def wait(self, timeout: float | None = None) -> Any:
        return [p.wait(timeout) for p in self._parts]


Name = int | str


class KVStore(abc.ABC):
    """Abstract base of every backend.

    Lifecycle: ``create()`` -> ``broadcast()`` of initial parameters -> many ``push_pull()``
    -> ``close()``. In collective backends (``mpi``, ``horovod``, ``collective``) every call
    that moves data is collective: every worker must make it, for the same names, shapes,
    dtypes, ops and scale factors; backends that negotiate (``horovod``) accept the calls in
    any order and report a disagreement on every rank instead of hanging. In
    parameter-server backends a push_pull completes when the servers have heard from every
    worker. ``close()`` waits for outstanding operations, releases communicators and, for
    the last worker, lets server ranks exit; it is idempotent.

    Subclasses set ``Options`` (a ``BackendOptions`` model), ``capabilities`` and implement
    ``rank``, ``num_workers``, ``_broadcast``, ``_push_pull_async`` and ``close``.
    """

    type: ClassVar[str] = "abstract"
    # builtins.type: inside this class body ``type`` is the backend's name attribute.
    Options: ClassVar[builtins.type[BackendOptions]] = BackendOptions
    capabilities: ClassVar[frozenset[str]] = frozenset()
    # True: the backend takes CuPy arrays itself (NCCL, or its own pinned staging). Else
    # CuPy arrays are staged through host memory here: copied to NumPy, reduced on the CPU
    # path, copied back into the caller's array before the handle completes.
    takes_cupy: ClassVar[bool] = False

    OPTIMIZER: ClassVar[str] = "optimizer"

    def __init__(self, **options: Any) -> None:
        self.options = self.parse_options(options)
        self._key_type: type | None = None
        self._stage_pool: StagingPool | None = None  # for CuPy tensors, made on first use

    @classmethod
    def parse_options(cls, options: dict[str, Any]) -> BackendOptions:
        """Validate ``options`` into this backend's frozen ``Options``.

        Raises:
            ValueError: an unknown option (the valid ones are listed) or a bad value.
        """
        valid = sorted(cls.Options.model_fields)
        unknown = sorted(set(options) - set(valid))
        if unknown:
            raise ValueError(
                f"backend {cls.type!r}: unknown option {unknown[0]!r}; valid options: {valid}"
            )
        try:
            return cls.Options(**options)
        except ValidationError as err:
            first = err.errors()[0]
            field = ".".join(str(p) for p in first["loc"])
            raise ValueError(
                f"backend {cls.type!r}: option {field!r}={first.get('input')!r} is invalid: "
                f"{first['msg']}"
            ) from None

    # -- identity ---------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def rank(self) -> int:
        """This worker's rank among the workers (servers are not counted)."""

    @property
    @abc.abstractmethod
    def num_workers(self) -> int:
        """The number of workers."""

    def is_capable(self, capability: str) -> bool:
        """Return whether this backend supports ``capability`` (e.g. ``'optimizer'``)."""
        return capability in self.capabilities

    # -- data movement ----------------------------------------------------------------
    def broadcast(
        self, name: Name | Sequence[Name], tensor: Any, root_rank: int = 0
    ) -> Any:
        """Overwrite ``tensor`` on every worker with root's value, in place. Collective.

        ``name`` and ``tensor`` may be lists of equal length. Returns the tensor(s).
        """
        names, tensors, single = self._as_lists(name, tensor)
        if not 0 <= root_rank < self.num_workers:
            raise ValueError(
                f"root_rank {root_rank} is out of range for {self.num_workers} workers"
            )
        for n, t in zip(names, tensors):
            self._check_tensor(n, t)
        pool = self._staging()
        stages = {i: pool.take((n, "in")) for i, (n, t) in enumerate(zip(names, tensors))
                  if is_cupy(t) and not self.takes_cupy}
        staged = [_to_host(stages[i], t) if i in stages else t for i, t in enumerate(tensors)]
        try:
            self._broadcast(names, staged, root_rank)
            for t, h in zip(tensors, staged):
                if h is not t:
                    _copy_back(h, t)
        finally:
            for i, stage in stages.items():
                pool.give((names[i], "in"), stage)
        return tensors[0] if single else tensors

    def push_pull(
        self,
        name: Name | Sequence[Name],
        tensor: Any,
        output: Any = None,
        *,
        priority: int = 0,
        op: ReduceOp | str = ReduceOp.SUM,
        prescale_factor: float = 1.0,
        postscale_factor: float = 1.0,
    ) -> Any:
        """Reduce ``tensor`` over all workers and return the result.

        result = postscale_factor * reduce_i(prescale_factor * tensor_i). In place when
        ``output`` is None. ``name``/``tensor``/``output`` may be lists. A larger
        ``priority`` is sent first where the backend schedules (trainers pass
        ``-layer_index``).

        Raises:
            ValueError: a bad op, factor or output shape, or a cross-rank mismatch.
            TypeError: a name of the wrong type, or a tensor that is not an array.
        """
        return self._start_push_pull(name, tensor, output, priority, op, prescale_factor,
                                     postscale_factor, now=True).wait()

    def push_pull_async(
        self,
        name: Name | Sequence[Name],
        tensor: Any,
        output: Any = None,
        *,
        priority: int = 0,
        op: ReduceOp | str = ReduceOp.SUM,
        prescale_factor: float = 1.0,
        postscale_factor: float = 1.0,
    ) -> Handle:
        """Start ``push_pull`` and return a handle whose ``wait()`` gives the result."""
        return self._start_push_pull(name, tensor, output, priority, op, prescale_factor,
                                     postscale_factor, now=False)

    def allgather(self, name: Name, tensor: Any, output: Any = None) -> Any:
        """Return every worker's ``tensor`` concatenated along axis 0, in rank order. Collective.

        Horovod's allgather (``horovod/common/ops/collective_operations.cc``, ``AllgatherOp``):
        workers may contribute different numbers of rows; the other dimensions and the
        dtype must agree (a 0-d tensor is one row). ``output``, if given, receives the
        result and must have its shape (the sum of the rows first).

        Raises:
            NotImplementedError: the backend has no allgather (the parameter servers).
            ValueError: ``output`` of the wrong shape, or workers that disagree.
        """
        self._check_name(name)
        self._check_tensor(name, tensor)
        if is_cupy(tensor):
            return _via_host(lambda t, o: self._allgather(name, t, o), tensor, output)
        return self._allgather(name, tensor, output)

    def reduce_scatter(self, name: Name, tensor: Any, output: Any = None, *,
                       op: ReduceOp | str = ReduceOp.SUM) -> Any:
        """Reduce ``tensor`` over all workers; return this worker's chunk of the result. Collective.

        The flattened result is cut into ``num_workers`` chunks as ``numpy.array_split``
        cuts it (``n // size`` elements each, one more for the first ``n % size``); worker
        r gets chunk r as a 1-D array, as ``MPI_Reduce_scatter`` with those counts gives it.
        ``AVERAGE`` is ``SUM`` divided by the number of workers. Every worker passes the
        same shape and dtype. ``output``, if given, must hold this worker's chunk.

        Raises:
            NotImplementedError: the backend has no reduce-scatter (the parameter servers).
            ValueError: ``output`` of the wrong size, or workers that disagree.
        """
        self._check_name(name)
        self._check_tensor(name, tensor)
        parsed = ReduceOp.parse(op)
        if is_cupy(tensor):
            return _via_host(lambda t, o: self._reduce_scatter(name, t, o, parsed), tensor,
                             output)
        return self._reduce_scatter(name, tensor, output, parsed)

    def _allgather(self, name: Name, tensor: Any, output: Any) -> Any:
        """Gather along axis 0 (backends that can override it)."""
        raise NotImplementedError(_missing(self.type, "allgather"))

    def _reduce_scatter(self, name: Name, tensor: Any, output: Any, op: ReduceOp) -> Any:
        """Reduce and scatter (backends that can override it)."""
        raise NotImplementedError(_missing(self.type, "reduce_scatter"))

    def _start_push_pull(self, name: Any, tensor: Any, output: Any, priority: int,
                         op: ReduceOp | str, prescale_factor: float, postscale_factor: float,
                         now: bool) -> Handle:
        """Check the arguments of a push_pull and start it (``now``: the caller waits on it
        at once, so a backend may run it on the caller's thread)."""
        names, tensors, single = self._as_lists(name, tensor)
        # A list goes to the engine whole (it may fuse); one tensor may run on this thread.
        start = self._push_pull_now if now and single else self._push_pull_async
        if output is None:
            outputs = list(tensors)
        else:
            outputs = [output] if single else list(output)
            if len(outputs) != len(tensors):
                raise ValueError(
                    f"{len(outputs)} outputs given for {len(tensors)} tensors"
                )
        op = ReduceOp.parse(op)
        for factor, label in ((prescale_factor, "prescale"), (postscale_factor, "postscale")):
            if type(factor) is not float and (not isinstance(factor, (int, float))
                                              or isinstance(factor, bool)):
                raise TypeError(f"{label}_factor must be a number, got {factor!r}")
        handles = []
        for n, t, o in zip(names, tensors, outputs):
            self._check_tensor(n, t)
            if o is not t:
                self._check_tensor(n, o)
                if o.shape != t.shape or o.dtype != t.dtype:
                    raise ValueError(
                        f"output for {n!r} is {o.dtype}{list(o.shape)}, expected "
                        f"{t.dtype}{list(t.shape)} like the input"
                    )
            kwargs: dict[str, Any] = {"priority": int(priority), "op": op,
                                      "prescale": float(prescale_factor),
                                      "postscale": float(postscale_factor)}
            if is_cupy(t) and not self.takes_cupy:
                handles.append(_staged(start, n, t, o, kwargs, self._staging()))
            else:
                handles.append(start(n, t, o, **kwargs))
        return handles[0] if single else _ListHandle(handles)

    def _staging(self) -> StagingPool:
        """This store's pinned staging buffers (allocated only once a CuPy tensor comes)."""
        if self._stage_pool is None:
            self._stage_pool = StagingPool()
        return self._stage_pool

    def set_optimizer(self, optimizer: Any) -> None:
        """Run ``optimizer`` on the servers, so ``push_pull`` returns updated weights.

        Raises:
            NotSupportedError: this backend has no servers that can update.
        """
        raise NotSupportedError(
            f"set_optimizer is not supported by backend {self.type!r}: it has no servers "
            f"that update weights; update locally, or use one of the backends capable of "
            f"'optimizer' (kvstore)"
        )

    def synchronize(self) -> None:  # noqa: B027 - a no-op is right for synchronous stores
        """Block until every operation this process started has finished."""

    @abc.abstractmethod
    def close(self) -> None:
        """Finish outstanding work and release communication resources; idempotent."""

    def __enter__(self) -> KVStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- for subclasses ----------------------------------------------------------------
    @abc.abstractmethod
    def _broadcast(self, names: list[Name], tensors: list[Any], root_rank: int) -> None:
        """Broadcast each tensor in place from ``root_rank``."""

    @abc.abstractmethod
    def _push_pull_async(
        self,
        name: Name,
        tensor: Any,
        output: Any,
        *,
        priority: int,
        op: ReduceOp,
        prescale: float,
        postscale: float,
    ) -> Handle:
        """Start one reduction; the handle's result is ``output``."""

    def _push_pull_now(self, name: Name, tensor: Any, output: Any, *, priority: int,
                       op: ReduceOp, prescale: float, postscale: float) -> Handle:
        """Start one reduction that the caller waits on at once. Backends that can run it on
        the caller's thread (no hand-off to the engine) override this."""
        return self._push_pull_async(name, tensor, output, priority=priority, op=op,
                                     prescale=prescale, postscale=postscale)

    def _as_lists(self, name: Any, tensor: Any) -> tuple[list[Name], list[Any], bool]:
        if isinstance(name, (list, tuple)):
            names = list(name)
            tensors = list(tensor) if isinstance(tensor, (list, tuple)) else None
            if tensors is None or len(tensors) != len(names):
                got = len(tensors) if tensors is not None else type(tensor).__name__
                raise ValueError(f"{len(names)} names given with {got} tensors")
            single = False
        else:
            names, tensors, single = [name], [tensor], True
        for n in names:
            self._check_name(n)
        return names, tensors, single

    def _check_name(self, name: Any) -> None:
        kind = type(name)
        if kind is self._key_type:  # the common case: the same kind as every name before
            return
        if isinstance(name, bool) or not isinstance(name, (int, str)):
            raise TypeError(f"a name must be an int or a str, got {type(name).__name__}")
        kind = int if isinstance(name, int) else str
        if self._key_type is None:
            self._key_type = kind
        elif kind is not self._key_type:
            raise TypeError(
                f"name {name!r} is a {kind.__name__} but this store already uses "
                f"{self._key_type.__name__} names; mixing int and str names is not allowed"
            )

    @staticmethod
    def _check_tensor(name: Name, tensor: Any) -> None:
        if type(tensor) is np.ndarray:
            fast = tensor.flags
            if fast.c_contiguous and fast.writeable:
                return
        if not hasattr(tensor, "dtype") or not hasattr(tensor, "shape"):
            raise TypeError(
                f"tensor for {name!r} must be a NumPy or CuPy array, got {type(tensor).__name__}"
            )
        flags = getattr(tensor, "flags", None)
        if _flag(flags, "C_CONTIGUOUS") is False:
            raise ValueError(f"tensor for {name!r} must be C-contiguous")
        if _flag(flags, "WRITEABLE") is False:
            raise ValueError(
                f"tensor for {name!r} is read-only ({type(tensor).__name__}); results are "
                f"written in place: pass a writable array (np.array(x) for a scalar)"
            )


GATHER_BACKENDS = ("mpi", "horovod", "collective", "zero", "fsdp")
"""The built-in backends that have ``allgather`` and ``reduce_scatter``."""


def _missing(backend: str, what: str) -> str:
    return (f"backend {backend!r} has no {what}: a parameter server pushes and pulls whole "
            f"keys; use one of the backends that have it: {list(GATHER_BACKENDS)}")


def _via_host(run: Callable[[Any, Any], Any], tensor: Any, output: Any) -> Any:
    """Run a gather/scatter ``run(host_tensor, None)`` on a host copy of CuPy ``tensor``;
    return the result on the tensor's device (copied into ``output`` when given)."""
    import cupy

    result = run(tensor.get(), None)
    if output is None:
        with tensor.device:
            return cupy.asarray(result)
    _copy_back(np.ascontiguousarray(result).reshape(output.shape), output)
    return output


def is_cupy(array: Any) -> bool:
    """Return True for a CuPy array (without importing CuPy)."""
    return type(array) is not np.ndarray and type(array).__module__.startswith("cupy")


def _copy_back(host: np.ndarray, device_array: Any) -> None:
    """Copy a staged result into the caller's CuPy array (on that array's device)."""
    with device_array.device:
        device_array.set(host)


def _to_host(stage: HostStage, tensor: Any) -> np.ndarray:
    """Copy CuPy ``tensor`` into ``stage``'s pinned buffer; a host array of its shape."""
    return stage.to_host(tensor).reshape(tensor.shape)


def _staged(start: Callable[..., Handle], name: Any, tensor: Any, output: Any,
            kwargs: dict[str, Any], pool: StagingPool) -> Handle:
    """Run ``start`` on pinned host copies of CuPy ``tensor``/``output`` (buffers from
    ``pool``, one per name, reused); the returned handle completes once the result is back
    in ``output``."""
    stages = [((name, "in"), pool.take((name, "in")))]
    host = _to_host(stages[0][1], tensor)
    if output is tensor:
        host_out = host
    else:
        stages.append(((name, "out"), pool.take((name, "out"))))
        host_out = stages[1][1].host(host.nbytes).view(host.dtype).reshape(host.shape)
    try:
        inner = start(name, host, host_out, **kwargs)
    except BaseException:
        for key, stage in stages:
            pool.give(key, stage)
        raise
    outer = Handle(inner.name)

    def back(done: Handle) -> None:
        error = done._error
        if error is None:
            try:
                _copy_back(host_out, output)
            except Exception as err:  # a CUDA error must reach the caller, not the engine
                error = err
        for key, stage in stages:
            pool.give(key, stage)
        if error is not None:
            outer.set_error(error)
        else:
            outer.set_result(output)

    inner.add_done_callback(back)
    return outer


def _flag(flags: Any, key: str) -> bool | None:
    """Return an array flag, or None where the array type does not have it (CuPy)."""
    try:
        return bool(flags[key])
    except (KeyError, TypeError, IndexError):
        return None


# -- registry ------------------------------------------------------------------------------
_BUILTIN: dict[str, str] = {
    "mpi": "ddpbench.backends.mpi",
    "horovod": "ddpbench.backends.horovod",
    "kvstore": "ddpbench.backends.ps.kvstore",
    "p3": "ddpbench.backends.ps.p3",
    "byteps": "ddpbench.backends.ps.byteps",
    "collective": "ddpbench.backends.collective",
    "zero": "ddpbench.backends.zero",
    "fsdp": "ddpbench.backends.zero",
}
_REGISTRY: dict[str, type[KVStore]] = {}
_LOCK = threading.Lock()
K = TypeVar("K", bound=type[KVStore])


def register(name: str | None = None) -> Callable[[K], K]:
    """Register a KVStore subclass under ``name`` (default: its ``type``).

    Example:
        >>> @ddpbench.register("mine")
        ... class Mine(ddpbench.KVStore): ...

    Raises:
        TypeError: the class is not a KVStore subclass.
        ValueError: the name is taken by another class.
    """

    def decorate(cls: K) -> K:
        if not (isinstance(cls, type) and issubclass(cls, KVStore)):
            raise TypeError(f"only KVStore subclasses can be registered, got {cls!r}")
        key = name or cls.type
        if not key or key == "abstract":
            raise ValueError(f"{cls.__name__} needs a name: set its 'type' or pass one")
        with _LOCK:
            prior = _REGISTRY.get(key)
            if prior is not None and prior.__qualname__ != cls.__qualname__:
                raise ValueError(f"backend {key!r} is already registered to {prior!r}")
            _REGISTRY[key] = cls
        cls.type = key
        return cls

    return decorate


def _entry_points() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group="ddpbench.backends")}


def available() -> list[str]:
    """Return the names of every backend that ``create`` accepts, sorted."""
    names = set(_REGISTRY)
    names.update(n for n, mod in _BUILTIN.items() if importlib.util.find_spec(mod) is not None)
    names.update(_entry_points())
    return sorted(names)


def backend_class(name: str) -> type[KVStore]:
    """Return the class registered as ``name``, importing its module on first use."""
    if not isinstance(name, str):
        raise TypeError(f"backend name must be a str, got {type(name).__name__}")
    if name not in _REGISTRY:
        if name in _BUILTIN and importlib.util.find_spec(_BUILTIN[name]) is not None:
            importlib.import_module(_BUILTIN[name])
        elif name in (eps := _entry_points()):
            register(name)(eps[name].load())
    if name not in _REGISTRY:
        raise ValueError(f"unknown backend {name!r}; available: {available()}")
    return _REGISTRY[name]


def create(name: str, **options: Any) -> KVStore:
    """Create the backend ``name`` with ``options``; on a server rank, serve instead.

    Args:
        name: a name from ``available()``.
        **options: the backend's options (see its ``Options``); unknown ones raise.

    Raises:
        ValueError: unknown backend, or a bad option (the valid ones are listed).
    """
    return backend_class(name)(**options)
