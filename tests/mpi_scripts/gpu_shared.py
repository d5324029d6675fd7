"""Run on N ranks that all see one GPU: a ``mpi`` store with NCCL must refuse before the
first collective, on every rank, with what happened and what to do.

Usage: CUDA_VISIBLE_DEVICES=0 python gpu_shared.py
"""

import cupy
from _results import result

import ddpbench
from ddpbench import gpu

kv = ddpbench.create("mpi")  # gpu_transport="nccl", the default
try:
    kv.push_pull("x", cupy.ones(4, cupy.float32))
except gpu.SharedGPUError as err:
    result("refused", rank=kv.rank, message=str(err))
else:
    raise AssertionError("two ranks on one GPU were not refused")
