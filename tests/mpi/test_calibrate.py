"""``ddpbench calibrate`` on real processes: the profile it writes fits its own runs through
the simulator, and paced real runs honour the pacing (a closed-form lower bound)."""

import statistics
import subprocess
import sys

import pytest
import yaml

from ddpbench.calibration.machine import load_machine

pytestmark = pytest.mark.mpi


def test_calibrate_writes_a_profile_whose_fits_reproduce_its_runs(tmp_path):
    out = tmp_path / "machine.yaml"
    cmd = [sys.executable, "-m", "ddpbench", "calibrate", "-n", "2", "--backends",
           "mpi,kvstore", "--iterations", "4", "--step-processes", "2,3",
           "--step-repeats", "1", "--rounds", "2", "--bind", "core", "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "machine profile ->" in proc.stdout
    m = load_machine(out)
    assert set(m.backends) == {"mpi", "kvstore"} and m.workers == 2 and m.servers == 2
    assert m.bind == "core"
    assert set(m.ring_step_us) == {"blocking", "polled"}
    assert all(set(t) == {2, 3} for t in m.ring_step_us.values())
    assert m.handoff_us is not None and set(m.handoff_us) == {2, 3}
    assert yaml.safe_load(out.read_text())["kind"] == "ddpbench-machine"
    for name, fit in m.backends.items():
        # Each fitted constant reproduces its own measurement through the simulator
        # (unless it sits at a bound of its search: then the simulator cannot go further).
        assert fit.small_sim_ms == pytest.approx(fit.small_ms, rel=0.02) or \
            fit.per_message_us == 0.0, name
        assert fit.large_sim_ms == pytest.approx(fit.large_ms, rel=0.02) or \
            not fit.bandwidth_fitted, name
        assert fit.workload_sim_ms == pytest.approx(fit.workload_ms, rel=0.02) or \
            fit.compute_factor in (0.5, 10.0), name
    # Two rounds: each run keeps both launches' iteration times (2 x 4 timed iterations of
    # the synthetic runs, 6 of the workload's, per launch), and the fit meets the median of
    # the two launches' medians (the workload's: lower quartiles).
    its = m.measurements["iteration_ms"]["mpi"]
    assert [len(v) for v in its["small"]] == [len(v) for v in its["large"]] == [8, 8]
    assert [len(v) for v in its["resnet50"]] == [6, 6]
    fit = m.backends["mpi"]
    for name, ms in (("small", fit.small_ms), ("large", fit.large_ms)):
        assert ms == pytest.approx(
            statistics.median(statistics.median(v) for v in its[name]), rel=1e-3)
    assert fit.workload_ms == pytest.approx(
        statistics.median(sorted(v)[len(v) // 4] for v in its["resnet50"]), rel=1e-3)
    # The compute rule's prediction of the workload's own sequence of sleeps is the closed
    # form of the profile's fitted rate and overhead; what the sequence took is measured
    # (how close the two come is this machine's property, not asserted: a slow phase of a
    # shared VM stretches it), and a sleep never ends before its time.
    comp = m.measurements["compute"]
    assert comp["rule_ms"] == pytest.approx(  # (the profile keeps 5 and 2 decimals)
        comp["requested_ms"] * m.compute_rate + comp["calls"] * m.compute_overhead_us / 1e3,
        rel=1e-3)
    assert comp["measured_ms"] >= comp["requested_ms"]


@pytest.mark.parametrize("backend,workers,servers", [("kvstore", 3, 2), ("horovod", 2, 0)])
def test_one_job_runs_phases_each_with_its_own_store(tmp_path, backend, workers, servers):
    # calibrate's launches: three runs in one job, a store each (dedicated server ranks
    # serve one after another); every phase's sums are checked by the worker itself.
    from ddpbench.calibration.run import real_phases, synthetic_profile

    paths = []
    for name in ("small", "large"):
        paths.append(tmp_path / f"{name}.yaml")
        paths[-1].write_text(yaml.safe_dump(synthetic_profile(name)))
    knobs = {"fusion_threshold": 0, "cycle_time": 0.0} if backend == "horovod" else {}
    got = real_phases(backend, [
        {"workload": str(paths[0]), "iterations": 3, "knobs": knobs},
        {"workload": str(paths[1]), "iterations": 2, "warmup": 1},
        {"workload": "resnet50", "iterations": 4, "compute_scale": 0.01, "size_scale": 0.01}],
        workers, servers or workers, timeout_s=120)
    assert [len(t) for t in got] == [3, 2, 4]
    assert all(x > 0 for t in got for x in t)


def test_a_bad_phase_is_refused_on_every_rank(tmp_path):
    cmd = [sys.executable, "-m", "ddpbench", "launch", "-n", "2", "--timeout", "60", "--",
           sys.executable, "-m", "ddpbench.emulation", "--workload",
           "resnet50", "--backend", "mpi", "--then", '[{"workload": "vgg19", "iter": 2}]']
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert proc.returncode != 0
    assert proc.stderr.count("phase 2 has unknown key(s) ['iter']") >= 2, proc.stderr[-2000:]


def test_calibrate_refuses_bad_arguments(tmp_path):
    for args, message in [(["-n", "1"], "at least 2 worker processes"),
                          (["--backends", "gloo"], "unknown backend(s) ['gloo']"),
                          (["--step-processes", "1,2"], "counts >= 2"),
                          (["--rounds", "0"], "rounds: expected >= 1"),
                          (["--bind", "socket"], "argument --bind: invalid choice")]:
        proc = subprocess.run([sys.executable, "-m", "ddpbench", "calibrate", *args, "-o",
                               str(tmp_path / "m.yaml")], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)
        assert "step/s" not in proc.stderr  # no progress bar for a run that never starts
        assert not (tmp_path / "m.yaml").exists()
    # An output that cannot be written is refused before minutes of measuring, not after.
    for out, message in [(tmp_path / "no" / "m.yaml", "does not exist"),
                         (tmp_path, "is a folder")]:
        proc = subprocess.run([sys.executable, "-m", "ddpbench", "calibrate", "-o", str(out)],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and message in proc.stderr, (out, proc.stderr)
        assert "step/s" not in proc.stderr


def test_paced_real_run_takes_at_least_its_bytes_over_the_pacing_rate(tmp_path):
    from ddpbench.calibration.run import synthetic_profile
    from ddpbench.experiments.throughput.points import run_point

    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(synthetic_profile("small")))
    base = {"mode": "real", "backend": "kvstore", "workload": str(path), "workers": 2,
            "servers": "colocated", "iterations": 3, "warmup": 1, "compute_scale": 1.0,
            "size_scale": 1.0, "compute": "sleep", "timeout_s": 120,
            "bandwidth_gbps": 0.05, "latency_us": 0.0}
    paced = run_point({**base, "paced": True})
    # 64 tensors of 1 KiB go out (push) and come back (pull) through each worker's NIC.
    nbytes = 64 * 256 * 4
    assert paced["iteration_time_s"] >= nbytes * 8 / 0.05e9
    with pytest.raises(ValueError, match="backend 'mpi' cannot be paced"):
        run_point({**base, "backend": "mpi", "paced": True})
