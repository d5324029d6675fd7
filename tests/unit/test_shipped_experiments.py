"""Every experiment file shipped in experiments/ validates and expands to uniquely named points."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpbench.experiments import kinds, naming, runner, schema

EXPERIMENTS = sorted((Path(__file__).resolve().parents[2] / "experiments").glob("*.y*ml"))


def test_experiments_are_shipped():
    assert len(EXPERIMENTS) >= 5, [p.name for p in EXPERIMENTS]


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.name)
def test_shipped_experiment_validates_and_expands(path):
    exp = schema.load_experiment(path)
    assert exp.name == path.stem, "the file name and the experiment's name (report folder) agree"
    points = runner.expand_points(exp)
    assert points, f"{path.name} expands to no point"
    assert len({p.key for p in points}) == len(points)
    # The spec round-trips through the saved form that `ddpbench report` re-renders from.
    kind = kinds.load_kind(exp.kind)
    assert kind.Spec.model_validate(exp.spec.model_dump(mode="json")) == exp.spec


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.name)
def test_shipped_report_was_written_from_the_experiment_as_it_is(path):
    # reports/NAME/experiment.json holds the spec the shipped report was run with: a new
    # axis or an edited file must come with the report re-run, or the README's first
    # command would change a committed file.
    import json

    exp = schema.load_experiment(path)
    saved = path.parents[1] / "reports" / exp.name / "experiment.json"
    assert saved.exists(), f"{path.name} has no shipped report"
    doc = json.loads(saved.read_text(encoding="utf-8"))
    assert doc["spec"] == exp.spec.model_dump(mode="json"), (
        f"reports/{exp.name} is older than {path.name}: run `ddpbench run {path.relative_to(path.parents[1])}`")


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.name)
def test_shipped_results_are_in_the_sweeps_order(path, tmp_path):
    # What a run leaves: rows and columns in the sweep's order (runner.put_in_order), so a
    # shipped experiment re-run changes no committed byte.
    import shutil

    exp = schema.load_experiment(path)
    shipped = path.parents[1] / "reports" / exp.name / "results.csv"
    copy = tmp_path / "results.csv"
    shutil.copy(shipped, copy)
    runner.ResultsStore(copy).put_in_order([p.key for p in runner.expand_points(exp)])
    assert copy.read_text() == shipped.read_text(), (
        f"reports/{exp.name}/results.csv is not in its sweep's order: run "
        f"`ddpbench run {path.relative_to(path.parents[1])}`")


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.name)
def test_shipped_results_hold_every_column_the_code_writes(path):
    # A simulated point run now brings no column the shipped results.csv lacks: a report
    # older than the code (a new cluster field, a new result) fails here, not on a user's
    # first re-run.
    import csv

    exp = schema.load_experiment(path)
    points = [p for p in runner.expand_points(exp) if p.mode != "real"]
    if not points:
        pytest.skip(f"{path.name} has real points only")
    kind = kinds.load_kind(exp.kind)
    cheapest = min(points, key=lambda p: (p.params.get("workers", 0), p.name))
    row = {**naming.public(cheapest.params), **naming.public(kind.run_point(cheapest.params))}
    with open(path.parents[1] / "reports" / exp.name / "results.csv", newline="") as f:
        header = next(csv.reader(f))
    missing = [c for c in row if c not in header]
    assert not missing, (f"reports/{exp.name}/results.csv lacks {missing}: run "
                         f"`ddpbench run {path.relative_to(path.parents[1])} --force`")
