"""``ddpbench tune`` end to end: a small tune, its resume, its determinism, its refusals."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from ddpbench import contract
from ddpbench.cli import main

# ResNet-50 on 4 hosts of one GPU: each simulation takes well under a second.
SMALL = ["tune", "-w", "resnet50", "--workers", "4", "--bandwidth-gbps", "1",
         "--no-progress", "--no-report"]


def _rows(folder: Path) -> list[dict[str, str]]:
    with open(folder / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tune") / "out"
    assert main([*SMALL, "--trials", "12", "-o", str(folder)]) == 0
    return folder


def test_a_row_per_trial_with_every_backend_default(tuned: Path):
    rows = _rows(tuned)
    assert [int(r["trial"]) for r in rows] == list(range(12))
    assert all(r["status"] == "ok" for r in rows)
    defaults = {r["backend"] for r in rows if r["is_default"] == "True"}
    assert defaults == set(contract.BACKENDS)
    hv = next(r for r in rows if r["backend"] == "horovod" and r["is_default"] == "True")
    assert int(hv["fusion_threshold"]) == contract.defaults("horovod")["fusion_threshold"]
    assert (tuned / "study.db").exists() and (tuned / "tune.json").exists()


def test_the_best_is_never_slower_than_a_default(tuned: Path):
    rows = _rows(tuned)
    best = min(float(r["iteration_time_s"]) for r in rows)
    assert all(best <= float(r["iteration_time_s"]) for r in rows if r["is_default"] == "True")


def test_every_trial_measures_a_steady_state_no_faster_than_its_compute(tuned: Path):
    from ddpbench.commands.tune import ITERATIONS, WARMUP
    from ddpbench.tune import answer

    request, _ = answer.load(tuned)
    assert (request["schedule"]["iterations"], request["schedule"]["warmup"]) == (
        ITERATIONS, WARMUP)
    compute = answer.compute_only_time(request)
    rows = [r for r in _rows(tuned) if r["status"] == "ok"]
    assert rows and all(float(r["iteration_time_s"]) >= compute * (1 - 1e-9) for r in rows)


def test_an_aperiodic_schedule_is_not_predicted_faster_than_its_compute():
    """BytePS's window scheduler on 16 x 8 V100: simulate's 3 iterations (1 warm-up) end
    early in its window, below the compute alone; tune's defaults measure the steady state."""
    from ddpbench.commands.tune import ITERATIONS, WARMUP
    from ddpbench.tune import answer, search

    cluster = contract.Cluster(hosts=16, gpus_per_host=8, device="V100", intra_link="nvlink",
                               transport="tcp", bandwidth_gbps=25.0).model_dump()
    compute = answer.compute_only_time({"workload": "resnet50", "cluster": cluster})
    knobs = {"scheduler": "window", "partition_bytes": 13614330, "credit_bytes": 11025373}

    def predicted(iterations: int, warmup: int) -> float:
        res = search.evaluate("resnet50", "byteps", knobs, cluster,
                              {"iterations": iterations, "warmup": warmup})
        return float(res["iteration_time_s"])

    assert predicted(3, 1) < compute
    assert predicted(6, 2) < compute  # four measured intervals are not enough either
    assert predicted(ITERATIONS, WARMUP) >= compute


def test_a_larger_budget_adds_only_the_difference(tuned: Path, capsys: pytest.CaptureFixture):
    capsys.readouterr()
    assert main([*SMALL, "--trials", "15", "-o", str(tuned)]) == 0
    assert "3 new trial(s)" in capsys.readouterr().out
    rows = _rows(tuned)
    assert len(rows) == 15
    assert sum(r["is_default"] == "True" for r in rows) == len(contract.BACKENDS)
    # a budget already met adds nothing
    assert main([*SMALL, "--trials", "10", "-o", str(tuned)]) == 0
    assert len(_rows(tuned)) == 15


def test_the_same_seed_gives_the_same_trials(tmp_path: Path):
    def trials(folder: Path) -> list[tuple[str, ...]]:
        assert main([*SMALL, "--trials", "9", "--backends", "horovod,p3",
                     "--search-seed", "3", "-o", str(folder)]) == 0
        timing = ("seconds", "cpu_s")
        return [tuple(v for k, v in r.items() if k not in timing) for r in _rows(folder)]

    assert trials(tmp_path / "a") == trials(tmp_path / "b")


def test_a_compute_bound_tune_stops_once_the_best_is_within_the_bound(
        tmp_path: Path, capsys: pytest.CaptureFixture):
    """ResNet-50 on 4 hosts at 100 Gbit/s: every default is within 0.5% of the compute alone,
    so the tune stops after the defaults and says why; --stop-within 0 searches on."""
    import optuna

    from ddpbench.tune import answer, report

    folder = tmp_path / "out"
    fast = [*SMALL, "--bandwidth-gbps", "100", "-o", str(folder)]
    assert main([*fast, "--trials", "30"]) == 0
    out = capsys.readouterr().out
    assert "stopped: the fastest configuration within the original systems' mechanisms" in out
    assert "no further trial was asked" in out
    rows = _rows(folder)
    assert len(rows) == len(contract.BACKENDS) and all(r["is_default"] == "True" for r in rows)
    request, _ = answer.load(folder)
    compute = answer.compute_only_time(request)
    assert min(float(r["iteration_time_s"]) for r in rows) <= compute * 1.01
    stop = optuna.load_study(study_name=answer.STUDY_NAME,
                             storage=f"sqlite:///{folder / 'study.db'}").user_attrs["stop"]
    assert stop["within"] == 0.01 and stop["compute_s"] == pytest.approx(compute)
    assert report.stop_info(folder) == stop
    report.render(folder, numerics=False)
    assert ("The search stopped before its budget: the fastest configuration within the "
            "original systems' mechanisms") in (folder / "report.md").read_text()
    # a resumed run stops at once; without the rule the budget is spent
    assert main([*fast, "--trials", "30"]) == 0
    assert "0 new trial(s)" in capsys.readouterr().out
    more = len(contract.BACKENDS) + 2
    assert main([*fast, "--trials", str(more), "--stop-within", "0"]) == 0
    assert "2 new trial(s)" in capsys.readouterr().out
    assert len(_rows(folder)) == more and report.stop_info(folder) is None


def test_the_stop_rule_counts_the_originals_best_not_a_variant_of_ddpbenchs_own():
    """BytePS's window and credit schedulers within the bound do not stop the search: the
    setting a user can switch on (BytePS's own scheduler) must get there too."""
    import optuna

    from ddpbench.tune import search
    from ddpbench.tune.space import build_space

    space = build_space(["byteps"], contract.Cluster(hosts=4))
    study = optuna.create_study(direction="minimize")
    dist = {p.name: optuna.distributions.CategoricalDistribution(list(p.choices))
            for p in space.params if p.knob == "scheduler"}
    dist["backend"] = optuna.distributions.CategoricalDistribution(["byteps"])

    def add(scheduler: str, value: float) -> None:
        study.add_trial(optuna.trial.create_trial(
            params={"backend": "byteps", "byteps.scheduler": scheduler}, distributions=dist,
            value=value))

    state = search.TuneRun(Path("."), 0, compute_s=1.0, stop_within=0.01)
    add("window", 1.001)       # ddpbench's own, within 1% of the compute alone
    add("credit", 1.002)       # ddpbench's own too
    add("byteps", 1.05)
    assert not search._within_bound(study, state, space)
    add("byteps", 1.008)
    assert search._within_bound(study, state, space)
    assert state.stopped == "bound" and state.best_s == 1.008
    assert "1008.00 ms, is 0.80% above the 1000.00 ms" in state.stop_text()


def test_another_request_in_the_same_folder_is_refused(tuned: Path,
                                                       capsys: pytest.CaptureFixture):
    assert main([*SMALL, "--trials", "15", "--search-seed", "1", "-o", str(tuned)]) == 2
    assert "holds another tune" in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--trials", "0"], "--trials must be >= 1, got 0"),
    (["--fix", "nosuch=1"], "unknown knob 'nosuch'"),
    (["--range", "nrings=0:4"], "outside the knob's bounds"),
    (["--range", "cycle_time=3:3"], "the range is empty"),
    (["--backends", ","], "--backends is empty"),
    (["--backends", "nccl"], "unknown backend 'nccl'"),
    (["-w", "nosuch"], "unknown workload 'nosuch'"),
    (["--time", "0"], "--time must be"),
    (["--stop-within", "-1"], "--stop-within must be a percentage in [0, 100), got -1"),
    (["--stop-within", "nan"], "--stop-within must be a percentage"),
])
def test_bad_input_exits_2_before_any_trial(tmp_path: Path, capsys: pytest.CaptureFixture,
                                            extra: list[str], message: str):
    assert main([*SMALL, *extra, "-o", str(tmp_path / "x")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x" / "study.db").exists()


def test_a_cluster_file_with_errors_names_its_line(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture):
    bad = tmp_path / "cluster.yaml"
    bad.write_text("hosts: 4\ngpus_per_host: 2\ntransport: carrier-pigeon\n")
    assert main([*SMALL, "--cluster", str(bad), "-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:3: field 'transport'" in err
    bad.write_text("hosts: 4\nbandwith_gbps: 10\n")
    assert main([*SMALL, "--cluster", str(bad), "-o", str(tmp_path / "x")]) == 2
    assert f"{bad}:2: field 'bandwith_gbps': unknown key" in capsys.readouterr().err


def test_a_cluster_file_sets_the_cluster(tmp_path: Path, capsys: pytest.CaptureFixture):
    good = tmp_path / "cluster.yaml"
    good.write_text("hosts: 2\ngpus_per_host: 2\nbandwidth_gbps: 25\ntransport: tcp\n")
    assert main(["tune", "--cluster", str(good), "--space"]) == 0
    out = capsys.readouterr().out
    assert "2 hosts x 2 GPUs, 25 Gbit/s tcp" in out and "hierarchical" in out


def test_a_cluster_file_keeps_its_iterations_and_takes_tune_defaults_otherwise(
        tmp_path: Path):
    from ddpbench.commands.tune import ITERATIONS, WARMUP

    def schedule(text: str, *flags: str) -> tuple[int, int]:
        path = tmp_path / "cluster.yaml"
        path.write_text(text)
        folder = tmp_path / f"out{len(list(tmp_path.iterdir()))}"
        assert main([*SMALL, "--cluster", str(path), *flags, "--backends", "horovod",
                     "--fix", "fusion_threshold=67108864", "--fix", "cycle_time=5",
                     "--trials", "1", "-o", str(folder)]) == 0
        saved = json.loads((folder / "tune.json").read_text())["schedule"]
        return saved["iterations"], saved["warmup"]

    assert schedule("workers: 2\n") == (ITERATIONS, WARMUP)
    assert schedule("workers: 2\niterations: 4\nwarmup: 1\n") == (4, 1)
    assert schedule("workers: 2\niterations: 4\nwarmup: 1\n", "--iterations", "5") == (5, 1)


@pytest.mark.mpi
def test_the_mpi_executor_gives_the_trials_of_the_local_one(tmp_path: Path):
    """``--executor mpi`` (trials through mpi4py.futures) against local processes, same seed
    and --jobs: the same rows, timings aside."""
    import os
    import signal
    import subprocess
    import sys

    from mpiutil import mpiexec

    jobs = "2"
    tables = {}
    for executor in ("local", "mpi"):
        folder = tmp_path / executor
        cmd = [sys.executable, "-m", "ddpbench", *SMALL, "--trials", "8", "--backends",
               "horovod,p3", "--search-seed", "5", "--jobs", jobs, "--executor", executor,
               "-o", str(folder)]
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
        rerun = " ".join(cmd)
        # Its own session, so that a hang ends every rank of the job, not only mpiexec.
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            pytest.fail(f"hang: the {executor} tune did not finish in 180 s\nre-run: {rerun}"
                        f"\n{(out + err)[-4000:]}")
        assert proc.returncode == 0, f"re-run: {rerun}\n{out}{err}"
        assert "8 new trial(s)" in out
        timing = ("seconds", "cpu_s")
        tables[executor] = [tuple(v for k, v in r.items() if k not in timing)
                            for r in _rows(folder)]
    assert len(tables["local"]) == 8
    assert tables["mpi"] == tables["local"]
