"""A tiny experiment end to end: simulated in parallel processes, and real at 2 ranks."""

from __future__ import annotations

import csv
import json
import os
import textwrap
from pathlib import Path

import pytest

from ddpbench import simulator
from ddpbench.cli import main as cli_main
from ddpbench.experiments import runner, schema
from ddpbench.experiments.throughput.timeline import timeline_file

TINY = """\
name: tiny
description: "<b>tiny</b> & co"
workloads: [seq2seq_lstm]
workers: 2
bandwidth_gbps: [5, 20]
latency_us: 5
iterations: 2
backends:
  kvstore: {}
  horovod: {fusion_threshold: [1000000, 134217728]}
report:
  baseline: kvstore
  gantt: {backend: horovod, bandwidth_gbps: 20, fusion_threshold: 1000000}
"""


def rows_of(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_tiny_simulated_experiment_end_to_end(tmp_path, capsys):
    exp_file = tmp_path / "tiny.yaml"
    exp_file.write_text(TINY)
    out = tmp_path / "reports" / "tiny"
    assert cli_main(["run", str(exp_file), "--outdir", str(out), "--jobs", "2",
                     "--no-progress"]) == 0
    assert "6 ran ok, 0 failed" in capsys.readouterr().out
    rows = rows_of(out / "results.csv")
    assert len(rows) == 6 and all(r["status"] == "ok" for r in rows)
    by_name = {r["point"]: r for r in rows}
    # Every row is the simulator's own answer for that point (reference: a direct call).
    for r in rows:
        knobs = {"fusion_threshold": int(r["fusion_threshold"])} if r["fusion_threshold"] else {}
        ref = simulator.simulate("seq2seq_lstm", r["backend"], workers=2, servers="colocated",
                                 bandwidth_gbps=float(r["bandwidth_gbps"]), latency_us=5.0,
                                 iterations=2, warmup=1, **knobs)
        assert float(r["iteration_time_s"]) == ref.iteration_time_s
        assert float(r["throughput"]) == ref.throughput
        assert float(r["bytes_sent_max"]) == max(ref.bytes_sent.values())
    gantt_point = ("horovod[bandwidth_gbps=20,fusion_threshold=1000000,iterations=2,latency_us=5,"
                   "servers=colocated,workers=2,workload=seq2seq_lstm]")
    assert gantt_point in by_name
    timeline = json.loads((out / "timelines" / timeline_file(gantt_point)).read_text())
    assert timeline["point"] == gantt_point and timeline["spans"]

    md = (out / "report.md").read_text()
    for name in by_name:
        assert f"| {name} |" in md
    kv = {r["bandwidth_gbps"]: float(r["throughput"]) for r in rows if r["backend"] == "kvstore"}
    hv = {r["bandwidth_gbps"]: float(r["throughput"]) for r in rows
          if r["backend"] == "horovod" and r["fusion_threshold"] == "134217728"}
    assert f"{hv['5.0'] / kv['5.0']:.4g}" in md  # the speedup table holds the ratio
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == sorted(["throughput_vs_bandwidth.png", "speedup.png",
                           f"gantt_{Path(timeline_file(gantt_point)).stem}.png"])
    page = (out / "report.html").read_text()
    assert "&lt;b&gt;tiny&lt;/b&gt; &amp; co" in page and "<b>tiny</b>" not in page

    # Re-running does nothing; `ddpbench report` re-renders from results.csv alone.
    before = (out / "results.csv").read_text()
    assert cli_main(["run", str(exp_file), "--outdir", str(out), "--no-progress"]) == 0
    assert "0 ran ok, 0 failed, 6 already finished" in capsys.readouterr().out
    for p in out.glob("*.png"):
        p.unlink()
    (out / "report.md").unlink()
    assert cli_main(["report", str(out)]) == 0
    assert sorted(p.name for p in out.glob("*.png")) == pngs
    assert (out / "report.md").read_text() == md
    assert (out / "results.csv").read_text() == before


def test_unavailable_real_backend_becomes_a_failed_row(tmp_path, monkeypatch):
    import ddpbench

    monkeypatch.setattr(ddpbench, "available", lambda: ["mpi"])
    exp = schema.parse_experiment(textwrap.dedent("""\
        name: r
        mode: real
        workloads: resnet50
        workers: 2
        backends: [p3]
        """))
    summary = runner.run_experiment(exp, tmp_path / "r", progress=False)
    assert summary.failed == 1
    (row,) = rows_of(tmp_path / "r" / "results.csv")
    assert row["status"] == "failed" and row["mode"] == "real"
    assert "backend 'p3' is not available for real runs" in row["error"]
    assert "available: ['mpi']" in row["error"]
    assert cli_main(["report", str(tmp_path / "r")]) == 0
    assert "Failed points" in (tmp_path / "r" / "report.md").read_text()


@pytest.mark.mpi
def test_tiny_real_experiment_at_two_ranks_beside_simulation(tmp_path):
    exp = schema.parse_experiment(textwrap.dedent("""\
        name: tinyreal
        mode: both
        workloads: resnet50
        workers: 2
        compute_scale: 0.02
        size_scale: 0.01
        iterations: 3
        backends: [mpi, horovod]
        real: {timeout_s: 60}
        report: {baseline: mpi}
        """))
    out = tmp_path / "tinyreal"
    summary = runner.run_experiment(exp, out, jobs=1, progress=False)
    assert summary.failed == 0, summary.failures
    rows = rows_of(out / "results.csv")
    assert sorted((r["mode"], r["backend"]) for r in rows) == [
        ("real", "horovod"), ("real", "mpi"), ("simulate", "horovod"), ("simulate", "mpi")]
    from ddpbench.experiments.throughput.worker import scale_sizes

    workload = scale_sizes(simulator.load_workload("resnet50"), 0.01)
    for r in rows:
        if r["mode"] != "real":
            continue
        samples = json.loads(r["samples_s"])
        assert len(samples) == 3 and float(r["iteration_time_s"]) == sorted(samples)[1]
        # What each worker pushed: the scaled profile's fp32 gradients, all of them.
        assert int(float(r["bytes_sent_max"])) == 4 * sum(t.numel for t in workload.tensors)
        # Compute alone takes 0.02 x the profile's time: an iteration can't be shorter.
        compute = 0.02 * sum(x.fwd_s + x.bwd_s for x in workload.layers)
        assert float(r["iteration_time_s"]) >= compute
        assert float(r["throughput"]) == pytest.approx(
            2 * workload.batch_size / float(r["iteration_time_s"]))
    assert (out / "sim_vs_real.png").exists()
    assert "real/sim" in (out / "report.md").read_text()


@pytest.mark.mpi
def test_a_real_point_past_its_timeout_is_a_failed_row_and_the_run_goes_on(tmp_path):
    exp = schema.parse_experiment(textwrap.dedent("""\
        name: slowreal
        mode: real
        workloads: resnet50
        workers: 2
        compute_scale: 0.05
        size_scale: 0.01
        iterations: [100000, 2]
        backends: [mpi]
        real: {timeout_s: 10}
        """))
    out = tmp_path / "slowreal"
    summary = runner.run_experiment(exp, out, jobs=1, progress=False)
    rows = {r["iterations"]: r for r in rows_of(out / "results.csv")}
    assert summary.failed == 1
    assert rows["100000"]["status"] == "failed"
    assert rows["100000"]["error"].startswith(
        "TimeoutError: real run did not finish in 10 s (timeout_s); the job was killed")
    assert rows["2"]["status"] == "ok"


@pytest.mark.mpi
def test_mpi_executor_gives_the_same_rows_as_local(tmp_path):
    import subprocess
    import sys

    exp = tmp_path / "ex.yaml"
    exp.write_text(textwrap.dedent("""\
        name: ex
        workloads: seq2seq_lstm
        workers: 2
        bandwidth_gbps: [5, 20]
        backends: [horovod, kvstore]
        """))
    from mpiutil import mpiexec

    for executor, jobs in (("local", "1"), ("mpi", "2")):
        cmd = [sys.executable, "-m", "ddpbench", "run", str(exp), "--outdir",
               str(tmp_path / executor), "--executor", executor, "--jobs", jobs,
               "--no-progress", "--no-report"]
        if executor == "mpi":
            # The pool is started up front, as on a cluster (mpiexec -n 1+jobs python -m
            # mpi4py.futures ...): no MPI_Comm_spawn from a singleton, which MPICH makes
            # fragile inside a test process.
            cmd = [mpiexec(), "-n", str(1 + int(jobs)), sys.executable, "-m", "mpi4py.futures",
                   *cmd[1:]]
        # An MPI initialised earlier in this pytest process leaves PMI_* variables that
        # would make the child join it instead of starting its own singleton.
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPIR_", "OMPI_"))}
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL, env=env)
        assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}{proc.stderr}"
        assert "4 ran ok, 0 failed" in proc.stdout

    def table(d):
        return sorted((r["point"], r["iteration_time_s"], r["throughput"])
                      for r in rows_of(d / "results.csv"))

    assert table(tmp_path / "local") == table(tmp_path / "mpi")


def test_oversubscription_axes_reach_the_simulator_and_real_mode_refuses_them(tmp_path, capsys):
    exp_file = tmp_path / "over.yaml"
    exp_file.write_text(textwrap.dedent("""\
        name: over
        mode: both
        workloads: [seq2seq_lstm]
        workers: 2
        servers: 2
        bandwidth_gbps: 10
        oversubscription: [1, 4]
        rack_size: 2
        iterations: 2
        backends: [byteps]
        """))
    out = tmp_path / "over"
    assert cli_main(["run", str(exp_file), "--outdir", str(out), "--jobs", "1",
                     "--no-progress", "--no-report"]) == 1  # the real oversubscribed point fails
    rows = {(r["mode"], r["point"]): r for r in rows_of(out / "results.csv")}
    sim = {p: r for (m, p), r in rows.items() if m == "simulate"}
    # The default value stays out of the name (old results keep their names); others show.
    plain = next(r for p, r in sim.items() if "oversubscription" not in p)
    over = next(r for p, r in sim.items() if "oversubscription=4" in p and "rack_size=2" in p)
    for r, ov in ((plain, 1.0), (over, 4.0)):
        ref = simulator.simulate("seq2seq_lstm", "byteps", workers=2, servers=2,
                                 bandwidth_gbps=10, iterations=2, warmup=1,
                                 oversubscription=ov, rack_size=2)
        assert float(r["iteration_time_s"]) == ref.iteration_time_s
    assert float(over["iteration_time_s"]) > float(plain["iteration_time_s"])
    failed = [r for (m, p), r in rows.items() if m == "real" and "oversubscription=4" in p]
    assert failed and failed[0]["status"] == "failed"
    assert "oversubscription is simulated only" in failed[0]["error"]


def test_bad_oversubscription_names_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nworkloads: [resnet50]\noversubscription: 0.5\nbackends: [p3]\n")
    with pytest.raises(ValueError, match="oversubscription must be a finite number >= 1"):
        schema.load_experiment(bad)
