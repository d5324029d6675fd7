"""Ring steps through an engine thread: the cost of one message as the process count grows.

Every rank's engine thread (:class:`ddpbench.comm.Engine`, the thread every backend's MPI
calls run on) exchanges 1 KiB with its ring neighbours while the main thread waits for each
step's handle, as a trainer waits for its gradients, in each way a backend makes a step
(:data:`STYLES`). Run by ``ddpbench calibrate`` under ``ddpbench launch -n P`` for several
P: one job measures both styles in alternating blocks; rank 0 writes, per style, the median
over blocks of the median over ranks of each rank's mean step time (the slowest 5% of
steps left out) to ``--out``. On a machine with fewer cores than processes the step time
grows with P: the calibration's software costs are stretched by its ratio
(:meth:`ddpbench.calibration.machine.Machine.contention`).

The same job also times a hand-off with the engines idle (:func:`_handoff`): each rank's main
thread sleeps 0.2 ms, as the trainer's compute emulation does, then has its engine run an
empty call and waits for it, while no engine has anything in flight, as the ``mpi`` and
``horovod`` engines sit between their calls (on a condition variable, or asleep until the
next cycle). The hand-off runs in blocks of its own after the ring steps', since
interleaved with them it would slow the steps. Its mean excess over the sleep is written as
``handoff_us``: how a worker's compute beside an idle engine stretches as processes
outnumber cores (:meth:`~ddpbench.calibration.machine.Machine.compute_contention`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ddpbench.api import Handle
from ddpbench.comm import Protocol

STYLES = ("blocking", "polled")
"""How the engine thread makes a step: one blocking ``MPI_Sendrecv`` (the ``mpi`` and
``horovod`` backends' calls), or nonblocking requests it polls (``collective`` and the
parameter-server backends)."""


class _PolledStep(Protocol):
    """One ring step as the polling backends make it: ``Isend``/``Irecv``, then ``Test``.

    It does not declare :meth:`~ddpbench.comm.Protocol.moving`: its 1 KiB completes at
    once unless a rank is descheduled, and spinning through that at 2 processes only (the
    engine spins where every rank has a core) would put two polling regimes into one
    contention ratio, which then overprices the polled backends at more processes.
    """

    def __init__(self, comm: Any, right: int, left: int) -> None:
        self.comm, self.right, self.left = comm, right, left
        self.send, self.recv = np.zeros(1024, np.uint8), np.zeros(1024, np.uint8)
        self.reqs: list[Any] = []
        self.handle: Handle | None = None

    def accept(self, item: Any) -> None:
        self.handle = item
        self.reqs = [self.comm.Irecv(self.recv, self.left, 1),
                     self.comm.Isend(self.send, self.right, 1)]

    def progress(self) -> bool:
        if self.handle is None or not self.reqs[0].Test() or not self.reqs[1].Test():
            return False
        handle, self.handle = self.handle, None
        handle.set_result(None)
        return True

    def busy(self) -> bool:
        return self.handle is not None


def _trimmed_mean(times: list[float]) -> float:
    # The mean cost of a step (what throughput pays), without the slowest 5% of steps that
    # a descheduled process adds; a median would flip between the engine's spin and sleep
    # regimes from run to run.
    kept = sorted(times)[:max(1, int(len(times) * 0.95))]
    return statistics.fmean(kept)


HANDOFF_SLEEP_S = 2e-4
"""The sleep before each timed hand-off (a layer's compute, as the trainer emulates it)."""


def _handoff(eng: Any, loops: int) -> list[float]:
    """Return ``loops`` times of (sleep, empty engine call, wait) less the sleep asked."""
    times = []
    for _ in range(loops):
        t0 = time.perf_counter()
        time.sleep(HANDOFF_SLEEP_S)
        eng.call(_noop).wait()
        times.append(time.perf_counter() - t0 - HANDOFF_SLEEP_S)
    return times


def _noop() -> None:
    return None


def main(argv: list[str] | None = None) -> int:
    """Run the ring steps on this rank; return the exit code."""
    p = argparse.ArgumentParser(prog="python -m ddpbench.calibration.ringstep")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=150, help="steps per block")
    p.add_argument("--blocks", type=int, default=5, help="blocks per style, interleaved")
    args = p.parse_args(argv)
    from mpi4py import MPI

    from ddpbench.comm import engine, precise_timers  # noqa: PLC0415 - MPI starts here

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    send, recv = np.zeros(1024, np.uint8), np.zeros(1024, np.uint8)
    eng = engine()

    def step() -> None:
        comm.Sendrecv(send, right, 0, recv, left, 0)

    polled = _PolledStep(comm, right, left)
    eng.register(polled)  # idle (not busy) while the blocking style runs

    def run(style: str, steps: int) -> list[float]:
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            if style == "polled":
                handle = Handle("step")
                eng.submit(polled, handle)
                handle.wait()
            else:
                eng.call(step).wait()
            times.append(time.perf_counter() - t0)
        return times

    precise_timers()  # the main thread sleeps as the trainer's worker does
    comm.Barrier()
    for style in STYLES:
        run(style, 30)  # warm-up steps
    # Blocks of the two styles alternate, so that drift of a shared machine during the job
    # falls on both alike; each block gives the median over ranks of the ranks' trimmed
    # means, and the job the median over its blocks.
    blocks: dict[str, list[float]] = {s: [] for s in (*STYLES, "handoff")}
    for _ in range(max(1, args.blocks)):
        for style in STYLES:
            comm.Barrier()
            means = comm.gather(_trimmed_mean(run(style, args.steps)), root=0)
            if means is not None:
                blocks[style].append(statistics.median(means))
    for _ in range(max(1, args.blocks)):
        comm.Barrier()
        means = comm.gather(_trimmed_mean(_handoff(eng, args.steps)), root=0)
        if means is not None:
            blocks["handoff"].append(statistics.median(means))
    if rank == 0:
        Path(args.out).write_text(json.dumps({
            "processes": size,
            "step_us": {s: statistics.median(blocks[s]) * 1e6 for s in STYLES},
            "handoff_us": statistics.median(blocks["handoff"]) * 1e6,
            "blocks_us": {s: [round(x * 1e6, 2) for x in v] for s, v in blocks.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
