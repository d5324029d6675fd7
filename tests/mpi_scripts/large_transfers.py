"""Large tensors through every polled backend, for a run without single-copy shared memory.

Usage: large_transfers.py   (the test sets MPIR_CVAR_CH4_CMA_ENABLE=0: MPICH then moves a
large message through shared memory in chunks, each only while its sender calls into MPI,
so the engine must keep polling while a transfer is under way). Rank 0 reports each
backend's exact sums as a JSON line.
"""

from __future__ import annotations

import numpy as np
from _results import result

import ddpbench

N = 1 << 20  # 4 MiB of float32: above every eager limit, several ring chunks

for backend in ("collective", "kvstore", "p3", "byteps"):
    kv = ddpbench.create(backend)
    w, r = kv.num_workers, kv.rank
    base = (np.arange(N) % 9).astype(np.float32)
    want = base.astype(np.float64) * (w * (w + 1) // 2)
    for step in range(3):
        out = kv.push_pull("g", base * np.float32(r + 1))
        assert np.array_equal(out.astype(np.float64), want), (backend, step, out[:4], want[:4])
    kv.close()
    if r == 0:
        result("large", backend=backend, workers=w, steps=3)
