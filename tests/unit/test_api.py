"""Registry, options and argument checks of the unified API (single process, no MPI)."""

import contextlib

import numpy as np
import pydantic
import pytest

import ddpbench
from ddpbench.api import BackendOptions, Handle, KVStore


class _Echo(KVStore):
    """A local store for testing the base class: reduce over one worker is the identity."""

    type = "test-echo"

    class Options(BackendOptions):
        knob: int = 3

    @property
    def rank(self):
        return 0

    @property
    def num_workers(self):
        return 1

    def _broadcast(self, names, tensors, root_rank):
        pass

    def _push_pull_async(self, name, tensor, output, *, priority, op, prescale, postscale):
        h = Handle(name)
        np.multiply(tensor, prescale * postscale, out=output, casting="unsafe")
        h.set_result(output)
        return h

    def close(self):
        pass


ddpbench.register()(_Echo)


def test_unknown_backend_lists_available():
    with pytest.raises(ValueError, match=r"unknown backend 'nope'; available: \[.*'test-echo'"):
        ddpbench.create("nope")


def test_register_rejects_non_subclass_and_duplicates():
    with pytest.raises(TypeError, match="KVStore subclasses"):
        ddpbench.register("x")(object)

    class Other(_Echo):
        pass

    with pytest.raises(ValueError, match="already registered"):
        ddpbench.register("test-echo")(Other)


def test_options_are_validated_and_frozen():
    kv = ddpbench.create("test-echo", knob=5)
    assert kv.options.knob == 5
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        kv.options.knob = 6
    with pytest.raises(ValueError, match=r"unknown option 'nob'; valid options: \['knob'\]"):
        ddpbench.create("test-echo", nob=1)
    with pytest.raises(ValueError, match="option 'knob'"):
        ddpbench.create("test-echo", knob="many")
    # A fresh store gets the defaults: options never leak between calls.
    assert ddpbench.create("test-echo").options.knob == 3


def test_reduce_op_parse():
    assert ddpbench.ReduceOp.parse("AVG") is ddpbench.ReduceOp.AVERAGE
    assert ddpbench.ReduceOp.parse("prod") is ddpbench.ReduceOp.PRODUCT
    with pytest.raises(ValueError, match="unknown reduce op 'median'"):
        ddpbench.ReduceOp.parse("median")


def test_names_and_lists():
    kv = ddpbench.create("test-echo")
    a, b = np.ones(3, np.float32), np.full(2, 2.0, np.float32)
    out = kv.push_pull([1, 2], [a, b], prescale_factor=2.0)
    assert [o.tolist() for o in out] == [[2, 2, 2], [4, 4]]
    with pytest.raises(TypeError, match="mixing int and str names"):
        kv.push_pull("x", a)
    with pytest.raises(ValueError, match="2 names given with 1 tensors"):
        kv.push_pull([3, 4], [a])
    with pytest.raises(TypeError, match="NumPy or CuPy array"):
        kv.push_pull(5, [1.0, 2.0])
    with pytest.raises(ValueError, match="output for 6 is float32\\[2\\], expected float32\\[3\\]"):
        kv.push_pull(6, a, output=b)


def test_set_optimizer_not_supported_names_backend():
    kv = ddpbench.create("test-echo")
    assert not kv.is_capable("optimizer")
    with pytest.raises(ddpbench.NotSupportedError, match="not supported by backend 'test-echo'"):
        kv.set_optimizer(object())


class _FakeCupy:
    """Looks like a cupy.ndarray where the API looks: its module, get/set, device, flags."""

    def __init__(self, values):
        self.a = np.array(values, dtype=np.float32)
        self.device = contextlib.nullcontext()

    shape = property(lambda self: self.a.shape)
    dtype = property(lambda self: self.a.dtype)
    flags = property(lambda self: self.a.flags)
    nbytes = property(lambda self: self.a.nbytes)

    def reshape(self, *shape):
        view = _FakeCupy.__new__(_FakeCupy)
        view.a, view.device = self.a.reshape(*shape), self.device
        return view

    def get(self, out=None):
        if out is None:
            return self.a.copy()
        out[...] = self.a
        return out

    def set(self, host):
        self.a[...] = host


_FakeCupy.__module__ = "cupy._fake"


def test_backends_without_gpu_paths_get_cupy_arrays_staged_through_host_memory(monkeypatch):
    from ddpbench import staging

    allocated = []  # stands in for page-locked memory: the staging buffers, one per allocation

    def host(stage, nbytes):
        if nbytes > stage._nbytes:
            stage._mem, stage._nbytes = np.empty(nbytes, np.uint8), nbytes
            allocated.append(stage._mem)
        return stage._mem[:nbytes]

    monkeypatch.setattr(staging.HostStage, "host", host)
    seen = []
    buffers = []

    class Recording(_Echo):
        type = "test-echo-recording"

        def _push_pull_async(self, name, tensor, output, **kw):
            seen.append((type(tensor), type(output), output is tensor))
            buffers.append(tensor)
            return super()._push_pull_async(name, tensor, output, **kw)

        def _broadcast(self, names, tensors, root_rank):
            seen.append(tuple(type(t) for t in tensors))
            for k, t in enumerate(tensors):
                t[...] = 7 + k

    kv = Recording()
    x = _FakeCupy([1, 2, 3])
    assert kv.push_pull("a", x, prescale_factor=2.0) is x  # in place: the caller's array
    assert x.a.tolist() == [2, 4, 6] and seen[-1] == (np.ndarray, np.ndarray, True)
    y = _FakeCupy([0, 0, 0])
    h = kv.push_pull_async("b", x, output=y, postscale_factor=0.5)
    assert h.wait() is y and y.a.tolist() == [1, 2, 3] and x.a.tolist() == [2, 4, 6]
    assert seen[-1] == (np.ndarray, np.ndarray, False)
    kv.broadcast(["c"], [y])
    assert y.a.tolist() == [7, 7, 7] and seen[-1] == (np.ndarray,)
    # One pinned buffer per name (and one for an output apart from the input), reused: a
    # second push_pull of "a" stages through the memory the first one used.
    assert len(allocated) == 4
    assert kv.push_pull("a", x) is x and x.a.tolist() == [2, 4, 6]
    assert len(allocated) == 4 and np.shares_memory(buffers[-1], buffers[0])
    # One name given twice in one call: each tensor is staged through a buffer of its own.
    z = _FakeCupy([0, 0, 0])
    kv.broadcast(["d", "d"], [y, z])
    assert y.a.tolist() == [7, 7, 7] and z.a.tolist() == [8, 8, 8]


def test_host_stage_grows_reuses_and_takes_empty_arrays(monkeypatch):
    import types

    from ddpbench import staging

    allocations = []

    def alloc_pinned_memory(nbytes):  # stands in for cudaHostAlloc
        allocations.append(nbytes)
        return bytearray(nbytes)

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(
        alloc_pinned_memory=alloc_pinned_memory))
    monkeypatch.setattr(staging, "_cupy", lambda: fake)
    stage = staging.HostStage()
    assert stage.host(0).size == 0 and allocations == [1]  # an empty tensor on a new stage
    assert stage.host(64).size == 64 and allocations == [1, 64]
    assert stage.host(16).size == 16 and allocations == [1, 64]  # reused, not shrunk
    pool = staging.StagingPool()
    a = pool.take("w")
    assert pool.take("w") is not a  # "w" in flight twice: a buffer of its own
    pool.give("w", a)
    assert pool.take("w") is a



def test_ranks_sharing_a_gpu_under_nccl_are_named_with_what_to_do():
    """Two ranks on one GPU would end in NCCL's bare 'invalid usage': the check before
    the communicator names them and the two ways out (device ids given as data; no GPU
    needed)."""
    from ddpbench import gpu

    one_each = [("a", "0000:01:00.0"), ("a", "0000:02:00.0"), ("b", "0000:01:00.0")]
    assert gpu.shared_gpus(one_each) == []
    assert gpu.shared_gpu_message(one_each) is None
    shared = [("a", "0000:01:00.0"), ("b", "0000:01:00.0"), ("a", "0000:01:00.0"),
              ("a", "0000:02:00.0"), ("a", "0000:02:00.0")]
    assert gpu.shared_gpus(shared) == [[0, 2], [3, 4]]
    msg = gpu.shared_gpu_message(shared, gpus_on_host=2)
    assert msg is not None
    for needle in ("ranks [0, 2]", "host 'a'", "0000:01:00.0", "invalid usage",
                   "gpu_transport='host'", "one rank per GPU (this host has 2 visible)"):
        assert needle in msg, (needle, msg)
    assert issubclass(gpu.SharedGPUError, RuntimeError)
