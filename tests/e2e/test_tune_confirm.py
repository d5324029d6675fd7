"""``ddpbench tune --confirm``: Kendall's tau-b, the refusals, and a small real confirmation."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ddpbench.cli import main
from ddpbench.tune.confirm import kendall_tau_b

MACHINE = Path(__file__).resolve().parents[2] / "reports" / "real_local" / "machine.yaml"
# real_local's setting: ResNet-50 scaled down so that 2 workers run it on a 2-core machine.
REAL_LOCAL = ["tune", "-w", "resnet50", "--compute-scale", "0.05", "--size-scale", "0.01",
              "--workers", "2", "--bandwidth-gbps", "1", "--latency-us", "20",
              "--no-progress", "--no-report"]


@pytest.mark.parametrize("x, y, tau", [
    ([1, 2, 3, 4], [1, 2, 3, 4], 1.0),
    ([1, 2, 3, 4], [4, 3, 2, 1], -1.0),
    # Pairs: (0,1) (0,2) (0,3) concordant, (1,3) discordant, (1,2) tied in x, (2,3) tied
    # in y: (3 - 1) / sqrt((6 - 1) (6 - 1)) = 0.4.
    ([1, 2, 2, 3], [1, 3, 2, 2], 0.4),
    # A pair tied in both counts in both tie totals: (2 - 0) / sqrt((3 - 1) (3 - 1)) = 1.
    ([1, 2, 2], [5, 7, 7], 1.0),
    # (0,1) discordant, (2,3) tied in x, the other four concordant: 3 / sqrt(5 x 6).
    ([1, 2, 3, 3], [2, 1, 3, 4], 3 / math.sqrt(30)),
])
def test_kendall_tau_b_on_hand_cases(x: list[float], y: list[float], tau: float):
    got = kendall_tau_b(x, y)
    assert got is not None and math.isclose(got, tau, abs_tol=1e-12)
    assert kendall_tau_b(y, x) == got


def test_kendall_tau_b_is_undefined_without_an_ordered_pair():
    assert kendall_tau_b([1.0], [2.0]) is None
    assert kendall_tau_b([1, 1, 1], [1, 2, 3]) is None
    with pytest.raises(ValueError, match="3 values against 2"):
        kendall_tau_b([1, 2, 3], [1, 2])


def test_confirm_without_a_machine_is_refused_before_any_trial(
        tmp_path: Path, capsys: pytest.CaptureFixture):
    folder = tmp_path / "out"
    assert main([*REAL_LOCAL, "--backends", "mpi,horovod", "--trials", "4", "--confirm", "1",
                 "-o", str(folder)]) == 2
    assert "give --machine PROFILE" in capsys.readouterr().err
    assert not (folder / "study.db").exists()


def test_confirm_of_more_processes_than_the_profile_measured_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture):
    args = [a if a != "2" else "6" for a in REAL_LOCAL]  # --workers 6
    assert main([*args, "--backends", "kvstore", "--trials", "2", "--confirm", "1",
                 "--machine", str(MACHINE), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "runs 12 processes" in err and "Tune at fewer --workers" in err
    assert not (tmp_path / "out" / "study.db").exists()


def test_confirm_of_a_simulated_only_setting_is_refused(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture):
    assert main([*REAL_LOCAL, "--backends", "mpi", "--trials", "1", "--confirm", "1",
                 "--transport", "tcp", "--machine", str(MACHINE),
                 "-o", str(tmp_path / "out")]) == 2
    assert "simulated only" in capsys.readouterr().err


@pytest.mark.mpi
def test_a_small_confirmation_runs_for_real(tmp_path: Path, capsys: pytest.CaptureFixture):
    folder = tmp_path / "out"
    assert main([*REAL_LOCAL, "--iterations", "6", "--warmup", "2",
                 "--backends", "mpi,horovod", "--trials", "4", "--confirm", "1",
                 "--confirm-repetitions", "1", "--machine", str(MACHINE),
                 "-o", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "Kendall's tau-b" in out
    summary = json.loads((folder / "confirm" / "summary.json").read_text())
    rows = summary["configurations"]
    # The top configuration and both defaults (the top may be one of them).
    assert {"mpi default", "horovod default"} <= {r["configuration"] for r in rows}
    assert 2 <= len(rows) <= 3
    assert sum(r["tune_rank"] == 1 for r in rows) == 1
    for r in rows:
        assert r["predicted_s"] > 0 and r["real_s"] > 0 and r["repetitions"] == 1
        # The twin is the tune's own point: the same prediction.
        assert math.isclose(r["predicted_s"], r["predicted_tune_s"], rel_tol=1e-9)
        assert math.isclose(r["real_over_predicted"], r["real_s"] / r["predicted_s"])
    tau = summary["kendall_tau_b"]
    assert -1.0 <= tau <= 1.0
    assert tau == kendall_tau_b([r["predicted_s"] for r in rows], [r["real_s"] for r in rows])
    assert [r["predicted_rank"] for r in rows] == sorted(r["predicted_rank"] for r in rows)
    assert (folder / "confirm" / "experiment.yaml").exists()
    assert (folder / "confirm" / "results.csv").exists()
    # The folder's tune confirmed again with -o alone: the finished points are reused.
    assert main(["tune", "-o", str(folder), "--confirm", "1", "--confirm-repetitions", "1",
                 "--no-progress", "--no-report"]) == 0
    again = json.loads((folder / "confirm" / "summary.json").read_text())
    assert again["ran"] == 0 and again["kendall_tau_b"] == tau
