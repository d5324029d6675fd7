"""``ddpbench bench trainer --framework torch``: ddpbench.torch beside torch DDP on gloo."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.mpi


def test_torch_trainer_bench_matches_ddp_parameters():
    """Same start, same batches: every backend ends on DDP's parameters (summation order
    aside); the JSON rows carry both step times from the same block."""
    cmd = [sys.executable, "-m", "ddpbench", "bench", "trainer", "--framework", "torch",
           "-n", "2", "--backends", "horovod,kvstore", "--iters", "2", "--warmup", "1",
           "--batch", "2", "--input-shape", "3,32,32", "--format", "json", "--timeout", "200"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=260)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout)
    assert [r["variant"] for r in rows] == ["horovod", "kvstore"]
    for r in rows:
        assert r["ranks"] == 2 and r["params"] == 11_689_512 and r["tensors"] == 62
        assert r["max_param_diff"] <= 1e-5
        assert r["step_ms"] > 0 and r["ddp_ms"] > 0
