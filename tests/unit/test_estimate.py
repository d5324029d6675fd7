"""The simulation cost estimate: close to the events a run processes, and a clear refusal."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ddpbench.simulator import estimate, simulate


def test_small_points_are_not_estimated():
    assert estimate.estimate("resnet50", "horovod", workers=16, bandwidth_gbps=10) is None


@pytest.mark.parametrize(("workload", "backend", "workers"), [
    ("vgg19", "kvstore", 32),   # events grow with the square of the workers
    ("resnet50", "horovod", 64),  # linearly
    ("resnet50", "byteps", 48),
])
def test_estimate_is_within_a_factor_two_of_the_events(workload, backend, workers):
    est = estimate.estimate(workload, backend, workers=workers, bandwidth_gbps=10,
                            iterations=2)
    assert est is not None
    real = simulate(workload, backend, workers=workers, bandwidth_gbps=10, iterations=2,
                    warmup=1).events
    assert real / 2 <= est.events <= 2 * real, (est.events, real)
    assert est.memory_bytes == est.events * estimate.BYTES_PER_EVENT and est.seconds > 0


def test_past_the_limit_is_refused_with_how_to_raise_it(monkeypatch):
    est = estimate.Estimate(events=2e9, seconds=9e4, memory_bytes=3e11)
    with pytest.raises(ValueError, match=r"about 2,000,000,000 events .*the limit is "
                                         r"50,000,000 events: raise it with --max-events N"):
        estimate.check(est)
    monkeypatch.setenv("DDPBENCH_MAX_EVENTS", "3e9")
    estimate.check(est)
    monkeypatch.setenv("DDPBENCH_MAX_EVENTS", "lots")
    with pytest.raises(ValueError, match="DDPBENCH_MAX_EVENTS must be a number"):
        estimate.check(est)


def test_simulate_cli_refuses_ten_million_workers_at_once():
    proc = subprocess.run(
        [sys.executable, "-m", "ddpbench", "simulate", "--workload", "resnet50", "--backend",
         "p3", "--workers", "10000000"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "this simulation would process about" in proc.stderr
    assert "raise it with --max-events N" in proc.stderr
