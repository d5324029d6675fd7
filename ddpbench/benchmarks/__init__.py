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


def init_gloo(comm: Any) -> None:
    """Start torch.distributed on gloo over ``comm``'s ranks (one host).

    Rank 0 opens the rendezvous store on a port the kernel picks while it listens (port 0),
    then tells the others which: probing for a free port and listening on it later let
    another process take it in between (EADDRINUSE, seen once in CI).
    """
    import torch.distributed as dist

    if dist.is_initialized():
        return
    store = None
    if comm.rank == 0:
        # wait_for_workers=False: the others learn the port only after this returns.
        store = dist.TCPStore("127.0.0.1", 0, comm.size, True, wait_for_workers=False)
    port = comm.bcast(store.port if store is not None else None, root=0)
    if store is None:
        store = dist.TCPStore("127.0.0.1", port, comm.size, False)
    dist.init_process_group("gloo", store=store, rank=comm.rank, world_size=comm.size)
