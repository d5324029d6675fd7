"""``mpi_allreduce`` in chunks gives the bits of one ``MPI_Allreduce`` of the whole buffer.

Run on N ranks: for each dtype, a buffer just over one chunk (so two chunks) and a small
one, in place and out of place, through ``backends._common.mpi_allreduce`` and through the
``mpi`` and ``horovod`` backends, each compared byte for byte with one bare call.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from _results import result
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import ddpbench  # noqa: E402
from backends import _common  # noqa: E402
from ddpbench.api import ReduceOp  # noqa: E402

comm = MPI.COMM_WORLD


def bare(a: np.ndarray) -> np.ndarray:
    out = np.empty_like(a)
    if a.dtype == np.float16:
        mpitype, op = _common._half_op(ReduceOp.SUM, "float16")
        comm.Allreduce([_common.byte_view(a), a.size, mpitype],
                       [_common.byte_view(out), out.size, mpitype], op=op)
    else:
        comm.Allreduce(a, out)
    return out


def main() -> None:
    stores = {name: ddpbench.create(name) for name in ("mpi", "horovod")}
    compared = differ = 0
    for dtype in (np.float32, np.float64, np.float16, np.int32):
        size = np.dtype(dtype).itemsize
        for n in (_common.ALLREDUCE_CHUNK_BYTES // size + 3, 1000):
            rng = np.random.default_rng(comm.rank * 1009 + n)
            a = (rng.standard_normal(n) * 100).astype(dtype)
            ref = bare(a).view(np.uint8)
            out = np.empty_like(a)
            _common.mpi_allreduce(comm, out, ReduceOp.SUM, a)
            inplace = a.copy()
            _common.mpi_allreduce(comm, inplace, ReduceOp.SUM)
            got = [out, inplace]
            for name, kv in stores.items():
                got.append(kv.push_pull(f"{name}{dtype.__name__}{n}", a.copy()))
            for g in got:
                compared += 1
                differ += int(not np.array_equal(np.asarray(g).view(np.uint8), ref))
    for kv in stores.values():
        kv.close()
    result("chunked", rank=comm.rank, size=comm.size, compared=compared, differ=differ,
           chunks=-(-(_common.ALLREDUCE_CHUNK_BYTES + 12) // _common.ALLREDUCE_CHUNK_BYTES))


if __name__ == "__main__":
    main()
