"""Horovod's planning is one rule: a real burst and a simulated one fuse the same tensors."""

from __future__ import annotations

import json

import pytest
from mpiutil import SCRIPTS, one, run_mpi

from ddpbench.simulator import Workload, simulate

# float32 sizes in elements; with a 6,144-byte buffer Horovod's look-ahead gives
# [t0 t1] [t2] [t3 t4] [t5]: t3 does not fit beside t2 and stops the look-ahead, so the
# small t4 and t5 never overtake it (a first-fit packer would put them beside t2). 6,144
# is a multiple of local_size x 8 x 64 bytes at 1-3 ranks per host, so Horovod's rounding
# of the threshold leaves it as it is.
SIZES = [450, 1050, 300, 1350, 150, 75]
THRESHOLD = 6144
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


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_the_threshold_is_rounded_up_to_local_size_x_8_x_64_bytes(n):
    """Controller::TensorFusionThresholdBytes: 6,500 bytes becomes 7,168 at 2 ranks on one
    host (7 x 1,024) and 7,680 at 3 (5 x 1,536), and the burst fuses by the rounded one
    (6,500 itself would give [t0 t1] [t2] [t3 t4 t5])."""
    from ddpbench.rules.fusion import fusion_threshold_bytes

    out = run_mpi(n, SCRIPTS / "horovod_burst.py", json.dumps(SIZES), "6500", "200",
                  timeout=90)
    got = one(out, "burst")
    assert got["local_size"] == n
    assert got["threshold"] == fusion_threshold_bytes(6500, n) == {2: 7168, 3: 7680}[n]
    assert got["groups"] == {2: [["t0", "t1"], ["t2", "t3"], ["t4", "t5"]],
                             3: [["t0", "t1", "t2"], ["t3", "t4", "t5"]]}[n]
