"""Write the timelines of horovod, mpi and collective; the test reads the files back.

Usage: python timeline_check.py DIR [kill]

Every rank runs the same calls and checks each result against its closed form (a rank's
tensor holds rank + 1, so a sum is n(n+1)/2); rank 0 writes DIR/horovod.json,
DIR/mpi.json and DIR/collective.json. With ``kill``, rank 0 sends itself SIGKILL after two
reductions of horovod: the file it leaves must still parse.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import numpy as np
from _results import result

import ddpbench

folder, kill = Path(sys.argv[1]), sys.argv[2:] == ["kill"]
# horovod_burst's sizes: a 6,144-byte buffer fuses them as [t0 t1] [t2] [t3 t4] [t5]
SIZES = [450, 1050, 300, 1350, 150, 75]


def burst(kv, names, sizes, steps=2):
    n = kv.num_workers
    for _ in range(steps):
        xs = [np.full(s, kv.rank + 1.0, np.float32) for s in sizes]
        handles = [kv.push_pull_async(name, x) for name, x in zip(names, xs)]
        for h, x in zip(handles, xs):
            h.wait()
            assert np.array_equal(x, np.full(x.size, n * (n + 1) / 2, np.float32))


kv = ddpbench.create("horovod", fusion_threshold=6144, cycle_time=200.0,
                     timeline=str(folder / "horovod.json"))
if kill:
    for name in ("a", "b"):
        x = np.ones(8, np.float32)
        kv.push_pull(name, x)
    if kv.rank == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    kv.push_pull("c", np.ones(8, np.float32))  # the others wait for rank 0 until killed
    raise SystemExit("rank 0 was not killed")

burst(kv, [f"t{i}" for i in range(len(SIZES))], SIZES)
w = np.full(4, 10.0 * kv.rank, np.float32)
kv.broadcast("w", w, root_rank=0)
assert np.array_equal(w, np.zeros(4, np.float32))
groups = kv.fusion_groups()
kv.close()
if kv.rank == 0:
    result("horovod", ranks=kv.num_workers, groups=[g for _, g in groups])

kv = ddpbench.create("mpi", timeline=str(folder / "mpi.json"))
burst(kv, ["m0", "m1", "m2"], [10, 20, 30], steps=1)
x = np.full(5, kv.rank + 1.0)
kv.push_pull("m3", x)  # synchronous: run on this thread, no queue
kv.close()

# Paddle's layers at 0.004 MB (4,194 bytes): [l2.w l2.b] reach it, [l1.w] alone does, [l0.w l0.b]
kv = ddpbench.create("collective", nrings=2, fuse_grad_size_mb=0.004,
                     timeline=str(folder / "collective.json"))
names = ["l2.w", "l2.b", "l1.w", "l0.w", "l0.b"]
burst(kv, names, [1000, 100, 1200, 10, 5])
stats = kv.stats
kv.close()
if kv.rank == 0:
    result("collective", rings=[r["names"] for r in stats["rings"]])

try:  # a timeline on rank 0 alone would change the length of its bit vector only
    ddpbench.create("horovod", timeline=str(folder / "only0.json") if kv.rank == 0 else None)
except ValueError as err:
    result("mismatch", rank=kv.rank, message=str(err))
