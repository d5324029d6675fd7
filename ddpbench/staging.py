"""Page-locked host buffers for staging CuPy arrays through a CPU data path.

Apart from :mod:`ddpbench.gpu` so that the API's staging of CuPy tensors (for backends
without a GPU path) imports nothing of ddpbench; CuPy itself is imported on first use, by
which time the caller has handed over a CuPy array.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np


def _cupy() -> Any:
    import cupy

    return cupy


class HostStage:
    """Pinned host buffers for staging GPU tensors through the CPU path (reused, grown)."""

    def __init__(self) -> None:
        self._mem: Any = None
        self._nbytes = 0

    def host(self, nbytes: int) -> np.ndarray:
        cupy = _cupy()
        if self._mem is None or nbytes > self._nbytes:  # (an empty array gets 1 byte)
            self._mem = cupy.cuda.alloc_pinned_memory(max(nbytes, 1))
            self._nbytes = nbytes
        return np.frombuffer(self._mem, np.uint8, nbytes)

    def to_host(self, dev: Any) -> np.ndarray:
        """Copy a GPU array into pinned memory; return a host view of the same dtype."""
        out = self.host(dev.nbytes).view(dev.dtype)
        dev.reshape(-1).get(out=out)
        return out

    @staticmethod
    def to_device(host: np.ndarray, dev: Any) -> None:
        dev.reshape(-1).set(host)


class StagingPool:
    """Pinned host buffers for the CuPy tensors of a backend that moves host memory: one
    per name, kept between calls and reused, as BytePS keeps one CPU buffer per tensor name,
    made once and registered with CUDA (byteps/common/operations.cc, ``InitTensor``: the
    name's context's ``cpubuff``). A name staged again while its buffer is still in flight
    gets a buffer of its own."""

    def __init__(self) -> None:
        self._idle: dict[Any, HostStage] = {}
        self._lock = threading.Lock()

    def take(self, key: Any) -> HostStage:
        with self._lock:
            stage = self._idle.pop(key, None)
        return stage if stage is not None else HostStage()

    def give(self, key: Any, stage: HostStage) -> None:
        with self._lock:
            self._idle[key] = stage

