"""``ddpbench bench backtest``: stored real runs re-read from git history and re-simulated."""

import argparse
import json
import shutil
import statistics
import subprocess

import pytest
import yaml
from machines import BASE

from ddpbench import simulator
from ddpbench.benchmarks import backtest as B
from ddpbench.calibration.machine import launch_time
from ddpbench.experiments.naming import make_name

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

MACHINE = BASE
AXES = {"workload": "resnet50", "workers": 3, "bandwidth_gbps": 1, "latency_us": 20,
        "iterations": 4, "warmup": 1, "compute_scale": 0.05, "size_scale": 0.01,
        "machine": "reports/r/machine.yaml"}
NAME = make_name("mpi", AXES)
HEADER = "point,mode,repetition,status,iteration_time_s,samples_s\n"


def results(stored_sim: float, reps: list[list[float]]) -> str:
    rows = [f'"{NAME}",simulate,0,ok,{stored_sim},"[{stored_sim}]"']
    rows += [f'"{NAME}",real,{i},ok,{max(s)},"{json.dumps(s)}"' for i, s in enumerate(reps)]
    rows.append(f'"{NAME}",real,9,failed,,')  # a failed repetition counts for nothing
    return HEADER + "\n".join(rows) + "\n"


def git(repo, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                   check=True, capture_output=True)


def test_a_point_name_reads_back_as_its_parameters():
    assert B.parse_point(NAME) == ("mpi", AXES)
    assert B.parse_point("p3[paced=true,workers=2]") == ("p3", {"paced": True, "workers": 2})
    for bad in ("mpi", "mpi[workers=2", "[workers=2]", "mpi[workers]"):
        with pytest.raises(ValueError, match="point"):
            B.parse_point(bad)


def test_a_real_point_is_the_median_of_its_repetitions_lower_quartiles():
    reps = [[0.04, 0.01, 0.03, 0.02], [0.05, 0.06, 0.07, 0.08], [0.2, 0.3, 0.1, 0.4]]
    got = B.real_points(results(0.05, reps))
    assert got == {NAME: statistics.median(launch_time(r) for r in reps)}
    assert got[NAME] == 0.06


def test_every_stored_run_is_scored_as_shipped_and_on_todays_simulator(tmp_path, capsys,
                                                                       monkeypatch):
    repo = tmp_path / "repo"
    folder = repo / "reports" / "r"
    folder.mkdir(parents=True)
    git(repo, "init", "-q")
    (folder / "results.csv").write_text(results(0.05, [[0.07, 0.08]]))
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "a run without a profile")
    (folder / "machine.yaml").write_text(yaml.safe_dump(MACHINE))
    reps = [[0.06, 0.09, 0.07, 0.08], [0.05, 0.05, 0.06, 0.09]]
    (folder / "results.csv").write_text(results(0.04, reps))
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "a calibrated run")

    runs = B.stored_runs("reports/r", cwd=repo)
    assert [r.machine is not None for r in runs] == [True, False]  # newest first
    assert len(B.stored_runs("reports/r", limit=1, cwd=repo)) == 1

    real = statistics.median(launch_time(r) for r in reps)
    profile = tmp_path / "m.yaml"
    profile.write_text(yaml.safe_dump(MACHINE))
    today = simulator.simulate(
        "resnet50", "mpi", machine=str(profile),
        **{k: v for k, v in AXES.items() if k not in ("workload", "machine")}).iteration_time_s
    shipped, now = B.backtest(runs[0], tmp_path)
    assert shipped.errors == [pytest.approx(abs(real / 0.04 - 1))]
    assert now.errors == [pytest.approx(abs(real / today - 1), rel=1e-12)]
    assert now.inside == [False]  # 3 workers against the profile's 2: out of sample
    assert B.backtest(runs[1], tmp_path) == "no machine profile stored with it"
    assert B.backtest(runs[0], tmp_path, refit=True).startswith(
        "cannot refit it (the profile stores no launches")

    monkeypatch.chdir(repo)
    assert B.main(argparse.Namespace(folder="reports/r", since=None, limit=None, jobs=1,
                                     points=True, run=[], no_history=False, refit=False)) == 0
    out = capsys.readouterr().out
    label = make_name("mpi", {k: v for k, v in AXES.items() if k != "machine"})
    beyond = int(abs(real / today - 1) > 0.25)
    assert (f"  {label}: {real / today:.2f} ({real / today:.2f}-{real / today:.2f}), "
            f"{beyond} of 1") in out
    assert f"{abs(real / 0.04 - 1):.1%}" in out and f"{abs(real / today - 1):.1%}" in out
    assert "1 runs: points beyond 25%" in out
    assert "no machine profile stored with it" in out


def test_since_a_bare_date_takes_the_whole_day(tmp_path, monkeypatch):
    folder = tmp_path / "reports" / "r"
    folder.mkdir(parents=True)
    git(tmp_path, "init", "-q")
    (folder / "results.csv").write_text(results(0.05, [[0.06]]))
    git(tmp_path, "add", ".")
    monkeypatch.setenv("GIT_COMMITTER_DATE", "2026-01-02T00:30:00+00:00")
    git(tmp_path, "commit", "-qm", "a run just after midnight")
    assert len(B.stored_runs("reports/r", since="2026-01-02", cwd=tmp_path)) == 1
    with pytest.raises(ValueError, match="no committed version since 2026-01-03"):
        B.stored_runs("reports/r", since="2026-01-03", cwd=tmp_path)


def test_a_folder_without_history_is_a_clear_error(tmp_path):
    git(tmp_path, "init", "-q")
    git(tmp_path, "commit", "-q", "--allow-empty", "-m", "nothing stored")
    with pytest.raises(ValueError, match="has no committed version"):
        B.stored_runs("reports/none", cwd=tmp_path)
    with pytest.raises(ValueError, match="cannot read the git history"):
        B.stored_runs("x", cwd=tmp_path / "missing")


def test_a_run_kept_in_a_folder_is_scored_like_a_stored_one(tmp_path, capsys):
    from ddpbench.cli import UsageError

    (tmp_path / "results.csv").write_text(results(0.05, [[0.06, 0.07]]))
    (tmp_path / "machine.yaml").write_text(yaml.safe_dump(MACHINE))
    run = B.folder_run(tmp_path)
    assert (run.date, run.machine is not None) == ("2026-11-25T00:00:00Z", True)
    shipped, _ = B.backtest(run, tmp_path)
    assert shipped.errors == [pytest.approx(abs(0.06 / 0.05 - 1))]
    args = dict(folder="reports/r", since=None, limit=None, jobs=1, points=False, refit=False,
                no_history=True)
    assert B.main(argparse.Namespace(**args, run=[str(tmp_path)])) == 0
    assert "1 runs: points beyond 25%" in capsys.readouterr().out
    with pytest.raises(UsageError, match="--no-history needs --run DIR"):
        B.main(argparse.Namespace(**args, run=[]))
    with pytest.raises(UsageError, match="cannot read its results.csv"):
        B.main(argparse.Namespace(**args, run=[str(tmp_path / "none")]))
