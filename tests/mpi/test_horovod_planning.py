"""Horovod's planning is one rule: a real burst and a simulated one fuse the same tensors."""

from __future__ import annotations

import json

import pytest
from mpiutil import SCRIPTS, one, run_mpi

from ddpbench.simulator import Workload, simulate

# float32 sizes in elements; with a 4,000-byte buffer Horovod's look-ahead gives
# [t0 t1] [t2] [t3 t4] [t5]: t3 does not fit beside t2 and stops the look-ahead, so the
# small t4 and t5 never overtake it (a first-fit packer would put them beside t2).
SIZES = [300, 700, 200, 900, 100, 50]
THRESHOLD = 4000
EXPECTED = [["t0", "t1"], ["t2"], ["t3", "t4"], ["t5"]]


def simulated_groups() -> list[list[str]]:
    burst = Workload.from_dict({
        "name": "burst", "batch_size": 1,
        "layers": [{"name": "all", "fwd_ms": 1.0, "bwd_ms": 1.0,
                    "tensors": [{"name": f"t{i}", "numel": n} for i, n in enumerate(SIZES)]}],
    })
    res = simulate(burst, "horovod", workers=2, bandwidth_gbps=10, iterations=2, warmup=1,
                   fusion_threshold=THRESHOLD, cycle_time=200.0)
    first = res.fusion_groups[0][0]
    return [names for start, names in res.fusion_groups if start == first]


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3])
def test_real_and_simulated_bursts_fuse_the_same_tensors(n):
    assert simulated_groups() == EXPECTED
    out = run_mpi(n, SCRIPTS / "horovod_burst.py", json.dumps(SIZES), str(THRESHOLD), "200",
                  timeout=90)
    assert one(out, "burst")["groups"] == EXPECTED
