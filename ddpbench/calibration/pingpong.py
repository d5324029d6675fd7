"""MPI ping-pong between ranks 0 and 1: half round-trip times by message size.

Run by ``ddpbench calibrate`` under ``ddpbench launch -n 2``; rank 0 writes
``{"sizes": [...], "seconds": [...]}`` to ``--out``: per size, the smallest of
:data:`BLOCKS` medians, each over one block of round trips, the blocks of all sizes taken in
turn, so that a block that lands in a slow phase of a shared machine does not become the
machine's latency.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

SIZES = (0, 1024, 16 * 1024, 256 * 1024, 4 << 20, 32 << 20)
"""Message sizes in bytes: latency at the small end, bandwidth at the large end."""

BLOCKS = 5
"""Blocks of round trips per size, interleaved across the sizes."""


def _reps(nbytes: int) -> int:
    return max(20, min(200, int(2e8 // max(nbytes, 1))))


def main(argv: list[str] | None = None) -> int:
    """Run the ping-pong on this rank; return the exit code."""
    p = argparse.ArgumentParser(prog="python -m ddpbench.calibration.pingpong")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if comm.Get_size() < 2:
        print("pingpong needs 2 ranks", file=sys.stderr)
        return 2
    blocks: list[list[float]] = [[] for _ in SIZES]
    bufs = [np.zeros(nbytes, np.uint8) for nbytes in SIZES]
    for _ in range(BLOCKS):
        for k, (nbytes, buf) in enumerate(zip(SIZES, bufs)):
            times = []
            for i in range(_reps(nbytes) + 2):
                comm.Barrier()
                t0 = time.perf_counter()
                if rank == 0:
                    comm.Send(buf, dest=1)
                    comm.Recv(buf, source=1)
                elif rank == 1:
                    comm.Recv(buf, source=0)
                    comm.Send(buf, dest=0)
                if i >= 2:  # the first two warm the connection and the buffers
                    times.append((time.perf_counter() - t0) / 2)
            blocks[k].append(statistics.median(times))
    seconds = [min(b) for b in blocks]
    if rank == 0:
        Path(args.out).write_text(json.dumps({"sizes": list(SIZES), "seconds": seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
