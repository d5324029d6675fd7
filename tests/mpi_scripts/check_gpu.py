"""Run on N ranks with a GPU: every backend on CuPy arrays against float64 references.

mpi and horovod take CuPy arrays themselves (NCCL or pinned staging, TRANSPORT); the others
are staged through host memory by the API (``KVStore.takes_cupy``).

Usage: check_gpu.py TRANSPORT   (nccl: one rank per GPU; host: pinned-host staging, any N)
"""

import sys

import cupy
import numpy as np
from _results import result

import ddpbench
from ddpbench import gpu
from ddpbench.comm import world

TRANSPORT = sys.argv[1]
gpu.select_device(world().local_rank)
checks = 0


def inputs(n, dtype, q):
    return ((np.arange(n) % 5) + 2 * q - 3).astype(dtype)


def expect(name, got, want, exact=True):
    global checks
    checks += 1
    got = cupy.asnumpy(got).astype(np.float64)
    ok = np.array_equal(got, want) if exact else np.allclose(got, want, rtol=2e-3)
    if not ok:
        raise AssertionError(f"rank {world().rank} {name}: got {got[:8]}, want {want[:8]}")


for backend in ("mpi", "horovod"):
    kv = ddpbench.create(backend, gpu_transport=TRANSPORT)
    rank, size = kv.rank, kv.num_workers
    for dtype in (np.float16, np.float32, np.float64, np.int32):
        for n in (1, 7, 1000, 65537):
            allx = np.stack([inputs(n, dtype, q).astype(np.float64) for q in range(size)])
            x = cupy.asarray(inputs(n, dtype, rank))
            kv.push_pull(f"s{n}{np.dtype(dtype).name}", x)
            expect("sum", x, allx.sum(0))
            x = cupy.asarray(inputs(n, dtype, rank))
            kv.push_pull(f"m{n}{np.dtype(dtype).name}", x, op="max")
            expect("max", x, allx.max(0))
            if np.dtype(dtype).kind == "f":
                x = cupy.asarray(inputs(n, dtype, rank))
                y = cupy.empty_like(x)
                kv.push_pull(f"a{n}{np.dtype(dtype).name}", x, output=y, op="average",
                             prescale_factor=0.5, postscale_factor=2.0)
                expect("average scaled", y, allx.sum(0) / size, exact=size in (1, 2, 4))
                expect("input kept", x, inputs(n, dtype, rank).astype(np.float64))
    # Several tensors at once: horovod fuses them in a GPU buffer (scale fused with copies).
    xs = [cupy.asarray(inputs(n, np.float16, rank)) for n in (3, 100, 5000, 17)]
    hs = [kv.push_pull_async(f"f{i}", x, prescale_factor=0.25, postscale_factor=4.0)
          for i, x in enumerate(xs)]
    for i, (h, n) in enumerate(zip(hs, (3, 100, 5000, 17))):
        h.wait()
        want = sum(inputs(n, np.float16, q).astype(np.float64) for q in range(size))
        expect(f"fused {i}", xs[i], want)
    for root in range(size):
        t = cupy.full((4, 3), rank, dtype=cupy.float32)
        kv.broadcast(f"b{root}", t, root_rank=root)
        expect("broadcast", t, np.full((4, 3), float(root)))
    kv.close()
for backend in ("collective", "kvstore", "p3", "byteps"):
    kv = ddpbench.create(backend)
    rank, size = kv.rank, kv.num_workers
    for n in (1, 1000, 65537):
        allx = np.stack([inputs(n, np.float32, q).astype(np.float64) for q in range(size)])
        x = cupy.asarray(inputs(n, np.float32, rank))
        assert kv.push_pull(f"{backend}s{n}", x) is x
        expect(f"{backend} sum", x, allx.sum(0), exact=False)
        x = cupy.asarray(inputs(n, np.float32, rank))
        y = cupy.empty_like(x)
        kv.push_pull_async(f"{backend}a{n}", x, output=y, op="average").wait()
        expect(f"{backend} average", y, allx.mean(0), exact=False)
        expect(f"{backend} input kept", x, inputs(n, np.float32, rank).astype(np.float64))
    t = cupy.full((4, 3), rank, dtype=cupy.float32)
    kv.broadcast(f"{backend}b", t, root_rank=size - 1)
    expect(f"{backend} broadcast", t, np.full((4, 3), float(size - 1)))
    kv.close()
if TRANSPORT == "nccl":
    # Horovod's finalizer (gpu_operations.cc FinalizeGPUQueue): a GPU group behind a busy
    # stream hands its completion to the finalizer thread, and the cycle goes on to the CPU
    # group after it, which completes first.
    kv = ddpbench.create("horovod", gpu_transport="nccl")
    rank, size = kv.rank, kv.num_workers
    busy = cupy.ones((4096, 4096), cupy.float32)
    for _ in range(400):  # matrix products queued on the stream ahead of the allreduce
        busy = busy @ busy * (1.0 / 4096)
    late = cupy.asarray(inputs(1 << 20, np.float32, rank))
    h_gpu = kv.push_pull_async("late", late)
    h_cpu = kv.push_pull_async("host", np.full(10, rank + 1.0, np.float32))
    assert np.array_equal(h_cpu.wait(), np.full(10, size * (size + 1) / 2, np.float32))
    overtaken = not h_gpu.done()
    h_gpu.wait()
    allx = np.stack([inputs(1 << 20, np.float32, q).astype(np.float64) for q in range(size)])
    expect("deferred sum", late, allx.sum(0))
    kv.close()
    result("deferred", rank=world().rank, overtaken=overtaken)
result("done", transport=TRANSPORT, rank=world().rank, size=world().size, checks=checks)
