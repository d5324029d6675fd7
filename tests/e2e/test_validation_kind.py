"""The validation kind: published figures checked at load, simulated, compared and rendered."""

from __future__ import annotations

import csv

import pytest

from ddpbench.experiments import runner, schema
from ddpbench.simulator import simulate

POINT = """\
  - id: {id}
    source: a test
    quote: "a sentence"
    metric: {metric}
    workload: resnet50
    backend: horovod
    {baseline}
    bandwidth_gbps: {bandwidths}
    cluster: {{workers: 2}}
    published: {published}
"""


def write(tmp_path, *points: str) -> schema.Experiment:
    path = tmp_path / "v.yaml"
    path.write_text("name: v\nkind: validation\niterations: 2\npoints:\n" + "".join(points))
    return schema.load_experiment(path)


def point(id="a", metric="throughput", baseline="", bandwidths="[10]", published=100.0):
    baseline = f"baseline: {baseline}" if baseline else ""
    return POINT.format(id=id, metric=metric, baseline=baseline, bandwidths=bandwidths,
                        published=published)


@pytest.mark.parametrize(("text", "message"), [
    (point(metric="speedup", bandwidths="[1, 10]", baseline="mpi"), "at one bandwidth"),
    (point(metric="peak_speedup", bandwidths="[1, 10]"), "needs a baseline"),
    (point(baseline="nccl2", metric="speedup"), "unknown backend 'nccl2'"),
    (point(published=-1), "published"),
    (point() + point(), "point ids must be unique"),
    (point().replace("{workers: 2}", "{workers: 2, gpus: 8}"), "unknown cluster key"),
])
def test_bad_points_are_refused_at_load(tmp_path, text, message):
    with pytest.raises(schema.ExperimentError, match=message):
        write(tmp_path, text)


def test_a_point_is_simulated_and_its_error_computed(tmp_path):
    exp = write(tmp_path, point(id="tput", published=100.0),
                point(id="peak", metric="peak_speedup", baseline="mpi", bandwidths="[1, 10]",
                      published=1.5))
    out = tmp_path / "out"
    summary = runner.run_experiment(exp, out, jobs=1, progress=False)
    assert summary.ok == 2
    with open(out / "results.csv", newline="") as f:
        rows = {r["id"]: r for r in csv.DictReader(f)}
    tput = simulate("resnet50", "horovod", workers=2, bandwidth_gbps=10, iterations=2,
                    warmup=1).throughput
    assert float(rows["tput"]["simulated"]) == pytest.approx(tput, rel=1e-12)
    assert float(rows["tput"]["rel_error"]) == pytest.approx(tput / 100.0 - 1, rel=1e-12)
    ratios = {bw: simulate("resnet50", "horovod", workers=2, bandwidth_gbps=bw, iterations=2,
                           warmup=1).throughput
              / simulate("resnet50", "mpi", workers=2, bandwidth_gbps=bw, iterations=2,
                         warmup=1).throughput for bw in (1, 10)}
    assert float(rows["peak"]["simulated"]) == pytest.approx(max(ratios.values()), rel=1e-12)
    assert float(rows["peak"]["at_gbps"]) == max(ratios, key=ratios.get)
    report = (out / "report.md").read_text()
    assert "median |error|" in report and "published_vs_simulated.png" in report
    assert (out / "published_vs_simulated.png").exists()
