"""The programs behind ``ddpbench bench``: each prints its figure as a ratio against a
baseline measured in the same run (allreduce, ps, sim, trainer, scale-kernel)."""

from typing import Any


def allreduce_scalar(comm: Any, value: float, op: str) -> float:
    """Return ``value`` reduced over ``comm`` by ``op`` ("max" or "sum").

    A buffer collective: it releases the GIL while it waits, so this rank's engine keeps
    serving what the other ranks still wait for while a store is open (a colocated server's
    parts). The pickling ``comm.allreduce`` kept the GIL: byteps at 3 ranks hung in
    ``bench trainer`` in about half the runs.
    """
    import numpy as np
    from mpi4py import MPI

    buf = np.array([value], np.float64)
    comm.Allreduce(MPI.IN_PLACE, buf, op={"max": MPI.MAX, "sum": MPI.SUM}[op])
    return float(buf[0])
