"""``ddpbench bench noise``: real launches of two backends, the floor recomputed from them."""

import re
import subprocess
import sys

import numpy as np
import pytest

from ddpbench.benchmarks.noise import sampling_floor

pytestmark = pytest.mark.mpi


def test_noise_bench_prints_the_floor_of_the_launches_it_made():
    cmd = [sys.executable, "-m", "ddpbench", "bench", "noise", "--backends", "mpi,kvstore",
           "--launches", "2", "--timeout", "60"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "2 launches per backend at 2 workers (lower quartile of 20 timed iterations" in out
    launches = dict(part.split(" ", 1) for part in
                    out.split("launch times (ms): ", 1)[1].strip().split("; "))
    assert sorted(launches) == ["kvstore", "mpi"]
    for backend, text in launches.items():
        times = [float(t) for t in text.split()]
        assert len(times) == 2 and all(t > 0 for t in times)
        # The row's figures are sampling_floor of those launches (printed to 0.1 ms).
        f = sampling_floor(np.array(times) / 1e3)
        row = re.search(rf"^{backend}\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%", out, re.M)
        assert row is not None, out
        assert float(row.group(1)) == pytest.approx(np.median(times), abs=0.06)
        assert float(row.group(2)) == pytest.approx(f["cv"], abs=0.01)
        assert float(row.group(3)) == pytest.approx(100 * f["median_error"], abs=0.3)


def test_noise_bench_refuses_an_unknown_backend():
    proc = subprocess.run([sys.executable, "-m", "ddpbench", "bench", "noise", "--backends",
                           "mpi,gloo"], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "unknown backend 'gloo'" in proc.stderr
