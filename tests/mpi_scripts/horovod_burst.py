"""Submit one burst of tensors to the ``horovod`` backend; report the fusion groups it ran.

Usage: python horovod_burst.py SIZES_JSON FUSION_THRESHOLD CYCLE_MS
Every rank submits tensors t0, t1, ... (float32, SIZES elements) back to back, so all join
one negotiation cycle; rank 0 reports the groups of that first cycle as a JSON line.
"""

from __future__ import annotations

import json
import sys

import numpy as np
from _results import result

import ddpbench

sizes = json.loads(sys.argv[1])
kv = ddpbench.create("horovod", fusion_threshold=int(sys.argv[2]), cycle_time=float(sys.argv[3]))
names = [f"t{i}" for i in range(len(sizes))]
handles = [kv.push_pull_async(n, np.ones(s, np.float32)) for n, s in zip(names, sizes)]
for h, s in zip(handles, sizes):
    assert np.array_equal(h.wait(), np.full(s, kv.num_workers, np.float32))
cycles = kv.fusion_groups()
first = min(c for c, _ in cycles)
if kv.rank == 0:
    result("burst", groups=[list(g) for c, g in cycles if c == first],
           cycles=len({c for c, _ in cycles}), threshold=kv.fusion_threshold_bytes,
           local_size=ddpbench.comm.world().local_size)
kv.close()
