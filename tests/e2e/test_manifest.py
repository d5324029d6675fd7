"""An output folder belongs to one experiment: resume, changed specs, foreign folders, --fresh."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from ddpbench.experiments import manifest, runner, schema

REPO = Path(__file__).resolve().parents[2]

SPEC = """\
name: {name}
mode: simulate
workloads: [{workload}]
workers: 2
bandwidth_gbps: [{bandwidths}]
iterations: 2
warmup: 1
backends:
  horovod: {{}}
report:
  plots: []
"""


def experiment(tmp_path: Path, name: str = "tiny", bandwidths: str = "10, 20",
               workload: str = "resnet50") -> schema.Experiment:
    path = tmp_path / f"{name}.yaml"
    path.write_text(SPEC.format(name=name, bandwidths=bandwidths, workload=workload))
    return schema.load_experiment(path)


def run(exp: schema.Experiment, out: Path, **kw) -> runner.RunSummary:
    return runner.run_experiment(exp, out, jobs=1, progress=False, render_report=False, **kw)


def rows(out: Path) -> dict[str, dict[str, str]]:
    with open(out / "results.csv", newline="") as f:
        return {r["point"]: r for r in csv.DictReader(f)}


def test_same_spec_resumes_and_changed_spec_moves_only_changed_points(tmp_path):
    out = tmp_path / "out"
    first = run(experiment(tmp_path), out)
    assert (first.ok, first.skipped) == (2, 0)
    again = run(experiment(tmp_path), out)
    assert (again.ok, again.skipped, again.archived) == (0, 2, 0)
    kept = rows(out)["horovod[bandwidth_gbps=10,iterations=2,latency_us=5,servers=colocated,workers=2,workload=resnet50]"]

    changed = run(experiment(tmp_path, bandwidths="10, 40"), out)
    assert (changed.ok, changed.skipped, changed.archived) == (1, 1, 1)
    now = rows(out)
    assert sorted(now) == ["horovod[bandwidth_gbps=10,iterations=2,latency_us=5,servers=colocated,workers=2,workload=resnet50]",
                           "horovod[bandwidth_gbps=40,iterations=2,latency_us=5,servers=colocated,workers=2,workload=resnet50]"]
    assert now["horovod[bandwidth_gbps=10,iterations=2,latency_us=5,servers=colocated,workers=2,workload=resnet50]"] == kept
    # The row of the point that left the sweep is kept in history, with its manifest.
    (hist,) = (out / "history").iterdir()
    with open(hist / "results.csv", newline="") as f:
        old = [r["point"] for r in csv.DictReader(f)]
    assert old == ["horovod[bandwidth_gbps=20,iterations=2,latency_us=5,servers=colocated,workers=2,workload=resnet50]"]
    assert json.loads((hist / "experiment.json").read_text())["spec"]["bandwidth_gbps"] == [
        10.0, 20.0]
    keys = json.loads((out / "experiment.json").read_text())["points"]
    assert len(keys) == 2 and all(len(k) == 20 for k in keys.values())
    # Wall times and timestamps go to the untracked run log, not into results.csv.
    assert "wall_s" not in next(iter(now.values()))
    assert len((out / runner.RUN_LOG).read_text().splitlines()) == 3


def test_an_edited_input_file_runs_its_points_again(tmp_path):
    profile = tmp_path / "mine.yaml"
    shutil.copy(REPO / "simulator" / "profiles" / "resnet50.yaml", profile)
    out = tmp_path / "out"
    exp = experiment(tmp_path, bandwidths="10", workload=str(profile))
    assert run(exp, out).ok == 1
    assert run(exp, out).skipped == 1
    profile.write_text(profile.read_text() + "\n# edited\n")
    again = run(exp, out)
    assert (again.ok, again.archived) == (1, 1)


def test_another_experiments_folder_is_refused_and_left_untouched(tmp_path):
    out = tmp_path / "out"
    run(experiment(tmp_path), out)
    before = (out / "results.csv").read_bytes()
    with pytest.raises(manifest.FolderError, match=r"holds the results of experiment 'tiny'.*"
                       r"--outdir reports/other.*--fresh"):
        run(experiment(tmp_path, name="other"), out)
    assert (out / "results.csv").read_bytes() == before
    with pytest.raises(manifest.FolderError, match="holds the results of experiment 'tiny'"):
        run(experiment(tmp_path, name="other"), out, dry_run=True)


def test_fresh_keeps_the_old_folder_beside_the_new_one(tmp_path):
    out = tmp_path / "out"
    run(experiment(tmp_path), out)
    summary = run(experiment(tmp_path, name="other"), out, fresh=True)
    assert summary.ok == 2 and summary.moved_aside is not None
    assert summary.moved_aside.parent == tmp_path
    assert summary.moved_aside.name.startswith("out.")
    assert json.loads((summary.moved_aside / "experiment.json").read_text())["name"] == "tiny"
    assert json.loads((out / "experiment.json").read_text())["name"] == "other"
    assert len(rows(summary.moved_aside)) == 2 and len(rows(out)) == 2


def test_bad_outdir_and_only_matching_nothing_are_clear_errors(tmp_path):
    exp = experiment(tmp_path)
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(manifest.FolderError, match="is a file, not a folder"):
        run(exp, afile)
    with pytest.raises(manifest.FolderError, match="cannot be created: .* is a file"):
        run(exp, afile / "sub")
    with pytest.raises(ValueError, match=r"--only 'p3\[\*' matches none of the 2 points"):
        run(exp, tmp_path / "out", only="p3[*")
    assert not (tmp_path / "out").exists()


def test_results_without_a_manifest_are_not_adopted(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.csv").write_text("experiment,kind,mode,point,repetition,status,error\n"
                                     "x,throughput,simulate,p,0,ok,\n")
    with pytest.raises(manifest.FolderError, match="no experiment.json"):
        run(experiment(tmp_path), out)
