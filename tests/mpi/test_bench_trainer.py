"""``ddpbench bench trainer`` (NumPy) with colocated parameter servers at 3 ranks."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("attempt", [0, 1])
def test_trainer_bench_with_colocated_servers_ends_and_matches(attempt):
    """Each rank's main thread takes the step time's maximum with an MPI collective while
    its engine still serves the colocated server's parts: with the pickling ``allreduce``
    (which kept the GIL) about half of the byteps runs at 3 ranks hung. Two runs, each
    within a timeout; the trainer ends on the bare loop's parameters exactly."""
    cmd = [sys.executable, "-m", "ddpbench", "bench", "trainer", "-n", "3",
           "--backends", "byteps,kvstore", "--iters", "6", "--warmup", "2",
           "--format", "json", "--timeout", "60"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout)
    assert [r["backend"] for r in rows] == ["byteps", "kvstore"]
    for r in rows:
        assert r["ranks"] == 3 and r["tensors"] == 6
        assert r["max_param_diff"] == 0.0
