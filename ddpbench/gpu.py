"""GPU support: CuPy arrays, NCCL communicators bootstrapped over MPI, scaling kernels.

Everything here imports without CuPy or a GPU; the first use raises an error that says
what to install. Backends call :func:`is_device_array` to route a tensor, then either

- ``transport="nccl"``: one NCCL communicator per backend (one per ring for ``collective``),
  its unique id broadcast from rank 0 over the backend's MPI communicator, one GPU per rank
  chosen by local rank. NCCL refuses two ranks on one GPU.
- ``transport="host"``: stage through pinned host memory and use the CPU (MPI) path, as
  BytePS does for its servers; this also runs several ranks on one GPU.

The scaling kernel multiplies while it copies into (or out of) a fusion buffer: one read
and one write per element instead of a copy followed by a separate in-place scale. Half
precision is computed in float32 and rounded once, like :func:`ddpbench.tensor_ops.scale_`,
so GPU and CPU results are the same bits.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ddpbench.api import ReduceOp
from ddpbench.staging import HostStage as HostStage  # the backends stage through gpu.HostStage

INSTALL_HINT = "install the GPU extra: pip install 'ddpbench[gpu]' (CuPy with NCCL)"


def cupy_or_raise() -> Any:
    """Return the ``cupy`` module, or raise an ImportError that says what to install."""
    try:
        import cupy
    except ImportError as err:
        raise ImportError(f"GPU tensors need CuPy: {INSTALL_HINT}") from err
    return cupy


def is_available() -> bool:
    """Return True when CuPy imports and at least one CUDA device is visible."""
    try:
        cupy = cupy_or_raise()
        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:
        return False


def is_device_array(a: Any) -> bool:
    """Return True for a CuPy array (without importing CuPy)."""
    return type(a).__module__.startswith("cupy")


def select_device(local_rank: int) -> int:
    """Make GPU ``local_rank % count`` current for this thread and return its id."""
    cupy = cupy_or_raise()
    count = cupy.cuda.runtime.getDeviceCount()
    if count < 1:
        raise RuntimeError("no CUDA device is visible to this process")
    dev = local_rank % count
    cupy.cuda.Device(dev).use()
    return dev


@functools.cache
def _scale_kernel(compute: str) -> Any:
    cupy = cupy_or_raise()
    # The product is formed in ``compute`` (float32 for half and float32, float64 for
    # float64) and rounded once into T. The factor's type is spelled out: CuPy 14 no longer
    # infers a placeholder type from a NumPy scalar.
    ctype = {"float32": "float", "float64": "double"}[compute]
    return cupy.ElementwiseKernel(
        f"T x, {compute} f", "T y", f"y = (T)(({ctype})x * f)", f"ddpbench_scale_copy_{compute}"
    )


@functools.cache
def _half_scale_kernel() -> Any:
    cupy = cupy_or_raise()
    # Horovod's CUDA rule: the factor is a half and the product of two halves is rounded
    # once to half (``__hmul``). That product is exact in float, so multiplying in float and
    # rounding once gives __hmul's bits on every architecture.
    return cupy.ElementwiseKernel(
        "T x, T f", "T y", "y = (T)((float)x * (float)f)", "ddpbench_scale_copy_half"
    )


_VECTOR_SOURCE = r"""
__device__ __forceinline__ unsigned short ddpb_scale_half(unsigned short h, float f) {
    float a, p;
    unsigned short r;
    asm("cvt.f32.f16 %0, %1;" : "=f"(a) : "h"(h));
    p = __fmul_rn(a, f);  /* one rounding to float (exact for half x half), one to half */
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(p));
    return r;
}

extern "C" __global__ void ddpb_scale_f16(const unsigned short* x, unsigned short* y, float f,
                                         long long n) {
    long long i0 = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    long long nvec = n / 8;
    const uint4* xv = (const uint4*)x;
    uint4* yv = (uint4*)y;
    for (long long i = i0; i < nvec; i += stride) {
        uint4 v = xv[i];
        unsigned int w[4] = {v.x, v.y, v.z, v.w};
        for (int k = 0; k < 4; ++k) {
            unsigned int lo = ddpb_scale_half((unsigned short)(w[k] & 0xffffu), f);
            unsigned int hi = ddpb_scale_half((unsigned short)(w[k] >> 16), f);
            w[k] = lo | (hi << 16);
        }
        yv[i] = make_uint4(w[0], w[1], w[2], w[3]);
    }
    for (long long i = nvec * 8 + i0; i < n; i += stride) y[i] = ddpb_scale_half(x[i], f);
}

extern "C" __global__ void ddpb_scale_f32(const float* x, float* y, float f, long long n) {
    long long i0 = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    long long nvec = n / 4;
    const float4* xv = (const float4*)x;
    float4* yv = (float4*)y;
    for (long long i = i0; i < nvec; i += stride) {
        float4 v = xv[i];
        yv[i] = make_float4(__fmul_rn(v.x, f), __fmul_rn(v.y, f), __fmul_rn(v.z, f),
                            __fmul_rn(v.w, f));
    }
    for (long long i = nvec * 4 + i0; i < n; i += stride) y[i] = __fmul_rn(x[i], f);
}
"""

_VECTOR_KERNELS = {"float16": ("ddpb_scale_f16", 8), "float32": ("ddpb_scale_f32", 4)}
"""dtype -> (kernel, elements per 16-byte load) of the vectorised scale+copy."""


@functools.cache
def _vector_module() -> Any:
    return cupy_or_raise().RawModule(code=_VECTOR_SOURCE)


def _vector_scale(src: Any, dst: Any, f: float) -> bool:
    """Scale contiguous, 16-byte aligned fp16 or fp32 ``src`` into ``dst`` with 16-byte loads
    and stores (a product in float32 rounded once into the dtype, as the element-wise kernels
    do); False, doing nothing, for any other layout or dtype."""
    spec = _VECTOR_KERNELS.get(np.dtype(src.dtype).name)
    if (spec is None or src.dtype != dst.dtype or src.size != dst.size
            or not (src.flags.c_contiguous and dst.flags.c_contiguous)
            or src.data.ptr % 16 or dst.data.ptr % 16):
        return False
    name, per_load = spec
    threads = 256
    blocks = max(1, min(-(-max(src.size // per_load, 1) // threads), 8192))
    _vector_module().get_function(name)(
        (blocks,), (threads,), (src, dst, np.float32(f), np.int64(src.size)))
    return True


def _factor(dtype: Any, factor: float) -> Any:
    return np.float64(factor) if np.dtype(dtype) == np.float64 else np.float32(factor)


HALF_RULES = ("half", "float")
"""fp16 scaling on the GPU: "half" is Horovod's CUDA kernel, "float" its CPU rule."""


def scale_copy(src: Any, dst: Any, factor: float, half_rule: str = "half") -> None:
    """Write ``src * factor`` into ``dst`` (same dtype, same size) in one pass on the GPU.

    fp16 follows ``half_rule``: "half" (default) is Horovod's ``ScaleBufferCudaImpl``, the
    factor rounded to half (``__float2half((float) f)``) and a half multiply; "float" scales
    in float32 with one rounding, as Horovod does on the CPU. Other float dtypes scale in
    float32 (float64 in float64); integers truncate the float64 product.
    """
    if half_rule not in HALF_RULES:
        raise ValueError(f"half_rule must be one of {', '.join(HALF_RULES)}, got {half_rule!r}")
    if factor == 1.0:
        dst[...] = src.reshape(dst.shape)
        return
    if np.dtype(src.dtype).kind != "f":
        cupy = cupy_or_raise()
        dst[...] = cupy.trunc(src.reshape(dst.shape).astype(np.float64) * factor).astype(dst.dtype)
        return
    if np.dtype(src.dtype) == np.float16 and half_rule == "half":
        from ddpbench.numerics import half_factor

        hf = half_factor(factor)
        if not _vector_scale(src, dst, float(hf)):
            _half_scale_kernel()(src.reshape(dst.shape), hf, dst)
        return
    f = _factor(src.dtype, factor)
    if not _vector_scale(src, dst, float(f)):  # float64 and other layouts: element-wise
        _scale_kernel(f.dtype.name)(src.reshape(dst.shape), f, dst)


def scale_(buf: Any, factor: float, half_rule: str = "half") -> None:
    """Scale a GPU buffer in place (:func:`scale_copy`'s rules)."""
    if factor != 1.0:
        scale_copy(buf, buf, factor, half_rule)


_NCCL_DTYPES = {
    "float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64",
    "int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32", "uint32": "NCCL_UINT32",
    "int64": "NCCL_INT64", "uint64": "NCCL_UINT64",
}
_NCCL_OPS = {
    ReduceOp.SUM: "NCCL_SUM", ReduceOp.AVERAGE: "NCCL_SUM", ReduceOp.MIN: "NCCL_MIN",
    ReduceOp.MAX: "NCCL_MAX", ReduceOp.PRODUCT: "NCCL_PROD",
}


class SharedGPUError(RuntimeError):
    """Two ranks of one NCCL communicator would use the same GPU (NCCL refuses it)."""


def shared_gpus(devices: list[tuple[str, str]]) -> list[list[int]]:
    """Return the groups of ranks (two or more) whose ``(host, GPU)`` is the same.

    ``devices[r]`` is rank r's host name and its GPU's identity (its PCI bus id, which
    does not depend on ``CUDA_VISIBLE_DEVICES``).
    """
    by: dict[tuple[str, str], list[int]] = {}
    for rank, dev in enumerate(devices):
        by.setdefault(dev, []).append(rank)
    return [ranks for ranks in by.values() if len(ranks) > 1]


def shared_gpu_message(devices: list[tuple[str, str]], gpus_on_host: int | None = None
                       ) -> str | None:
    """Return what to say when ranks share a GPU under NCCL, or None when none do."""
    groups = shared_gpus(devices)
    if not groups:
        return None
    ranks = groups[0]
    host, gpu = devices[ranks[0]]
    count = f" (this host has {gpus_on_host} visible)" if gpus_on_host is not None else ""
    return (f"ranks {ranks} on host {host!r} would all use GPU {gpu}: NCCL cannot run two "
            f"ranks of one communicator on one GPU and would fail with a bare 'NcclError: "
            f"invalid usage'. Either pass gpu_transport='host' (stage through pinned host "
            f"memory and reduce with MPI; several ranks may share a GPU) or start at most "
            f"one rank per GPU{count}")


def _device_identity(device: int) -> str:
    cupy = cupy_or_raise()
    try:
        return str(cupy.cuda.Device(device).pci_bus_id)
    except Exception:  # pragma: no cover - a runtime without the query: the ordinal
        return f"cuda:{device}"


class NcclComm:
    """An NCCL communicator over the ranks of an MPI communicator. Collective to create.

    Rank 0 makes the unique id and broadcasts it over ``mpi_comm``; every rank then joins
    with the GPU its tensors live on (pick it with :func:`select_device` by local rank). Calls are stream-ordered; by default they return once
    the result is ready, so a handle completed afterwards is safe to read; with
    ``sync=False`` they return once enqueued, and :meth:`record`'s event marks completion.
    """

    def __init__(self, mpi_comm: Any, device: int) -> None:
        cupy = cupy_or_raise()
        from cupy.cuda import nccl

        if not nccl.available:
            raise ImportError(f"CuPy was built without NCCL: {INSTALL_HINT}")
        # The engine thread works on the device the tensors live on. Everything runs on the
        # legacy null stream, which orders the user's kernels, the scale kernels and NCCL
        # without extra events.
        cupy.cuda.Device(device).use()
        self.device = device
        # Before NCCL sees them: ranks sharing a GPU would end in "invalid usage" there.
        import socket

        devices = mpi_comm.allgather((socket.gethostname(), _device_identity(device)))
        message = shared_gpu_message(devices, int(cupy.cuda.runtime.getDeviceCount()))
        if message is not None:
            raise SharedGPUError(message)  # on every rank: all gathered the same list
        uid = nccl.get_unique_id() if mpi_comm.rank == 0 else None
        uid = mpi_comm.bcast(uid, root=0)
        self._nccl = nccl
        self.comm = nccl.NcclCommunicator(mpi_comm.size, uid, mpi_comm.rank)
        self.stream = cupy.cuda.Stream.null

    def _dtype(self, a: Any) -> int:
        name = np.dtype(a.dtype).name
        if name not in _NCCL_DTYPES:
            raise TypeError(f"NCCL cannot reduce {name} arrays; supported: {sorted(_NCCL_DTYPES)}")
        return getattr(self._nccl, _NCCL_DTYPES[name])

    def allreduce(self, buf: Any, op: ReduceOp, sync: bool = True) -> None:
        """Reduce the contiguous GPU array ``buf`` in place over all ranks (``sync=False``:
        return once enqueued on the stream; wait on :meth:`record` instead)."""
        self.comm.allReduce(buf.data.ptr, buf.data.ptr, buf.size, self._dtype(buf),
                            getattr(self._nccl, _NCCL_OPS[op]), self.stream.ptr)
        if sync:
            self.stream.synchronize()

    def bcast(self, buf: Any, root: int, sync: bool = True) -> None:
        """Broadcast ``buf`` from ``root`` in place (``sync`` as for :meth:`allreduce`)."""
        raw = buf.reshape(-1).view(np.uint8)
        self.comm.bcast(raw.data.ptr, raw.size, self._nccl.NCCL_UINT8, root, self.stream.ptr)
        if sync:
            self.stream.synchronize()

    def record(self) -> Any:
        """Record and return an event after everything enqueued on the stream so far (its
        ``synchronize()`` returns once that work is done: Horovod's completion marker)."""
        event = cupy_or_raise().cuda.Event(block=True, disable_timing=True)
        event.record(self.stream)
        return event

    def close(self) -> None:
        self.comm.destroy()
