"""Report rendering from rows alone: tables hold the right ratios, HTML is escaped."""

from __future__ import annotations

import pandas as pd

from ddpbench.experiments import report
from ddpbench.experiments.throughput import report as throughput_report
from ddpbench.experiments.throughput.aggregate import per_point, series_columns
from ddpbench.experiments.throughput.spec import ThroughputSpec


def synthetic_rows() -> pd.DataFrame:
    rows = []
    # kvstore: 100 samples/s everywhere; p3: 200 at 1 Gbps, 150 at 10, 100 at 30.
    for bw, p3 in ((1.0, 200.0), (10.0, 150.0), (30.0, 100.0)):
        for backend, thr in (("kvstore", 100.0), ("p3", p3)):
            rows.append({"experiment": "s", "kind": "throughput", "mode": "simulate",
                         "point": f"{backend}[bandwidth_gbps={bw:g}]", "repetition": 0,
                         "status": "ok", "error": None, "backend": backend, "workload": "w<1>",
                         "workers": 4, "servers": "colocated", "bandwidth_gbps": bw,
                         "latency_us": 5.0, "iterations": 3, "warmup": 1,
                         "compute_scale": 1.0, "size_scale": 1.0,
                         "iteration_time_s": 1.0 / thr, "throughput": thr})
    rows.append({**rows[0], "point": "p3[broken]", "backend": "p3", "status": "failed",
                 "error": "RuntimeError: <boom> | pipe", "throughput": None,
                 "iteration_time_s": None, "bandwidth_gbps": 2.0})
    return pd.DataFrame(rows)


def test_speedup_highlights_and_tables(tmp_path):
    spec = ThroughputSpec(workloads=["resnet50"], backends=["kvstore", "p3"],
                                 bandwidth_gbps=[1, 10, 30],
                                 report={"baseline": "kvstore"})
    paths = throughput_report.render(synthetic_rows(), tmp_path, spec)
    md = (tmp_path / "report.md").read_text()
    assert "p3 on w<1>: 1.50x at 10 Gbps; peak 2.00x at 1 Gbps" in md
    assert "| w<1> | 30 | 1 |" in md  # speedup table: p3 / kvstore at 30 Gbps
    assert "RuntimeError: <boom> \\| pipe" in md  # failed point listed, pipe escaped
    page = (tmp_path / "report.html").read_text()
    assert "&lt;boom&gt;" in page and "<boom>" not in page and "w&lt;1&gt;" in page
    names = sorted(p.name for p in paths)
    assert names == ["report.html", "report.md", "speedup.png", "throughput_vs_bandwidth.png"]
    for p in paths:
        assert p.stat().st_size > 0


def test_document_markdown_and_html():
    doc = report.Document("T & <t>")
    doc.heading("Section")
    doc.text("see `a<b`")
    doc.table(pd.DataFrame({"x": [1.0, 2.5], "y": ["a|b", None]}))
    md = doc.markdown()
    assert md.splitlines()[0] == "# T & <t>"
    assert "| 1 | a\\|b |" in md and "| 2.5 |  |" in md
    page = doc.html()
    assert "<title>T &amp; &lt;t&gt;</title>" in page and "<code>a&lt;b</code>" in page


def test_a_table_cell_is_one_point_never_an_average_of_two_settings(tmp_path):
    """Points that differ in an axis the tables do not name by default (here ``paced`` for
    p3 only, and ``device``) get rows of their own; rows written before ``paced`` existed
    read as unpaced."""
    base = synthetic_rows()
    base = base[base["status"] == "ok"]
    paced = base[base["backend"] == "p3"].assign(
        paced=True, throughput=base[base["backend"] == "p3"]["throughput"] / 4,
        point=lambda d: d["point"] + "+paced")
    old = base.drop(columns=[])  # written before the column existed: NaN after concat
    rows = pd.concat([old, paced], ignore_index=True)
    spec = ThroughputSpec(workloads=["resnet50"], backends=["kvstore", "p3"],
                          bandwidth_gbps=[1, 10, 30], report={"baseline": "kvstore"})
    throughput_report.render(rows, tmp_path, spec)
    md = (tmp_path / "report.md").read_text()
    table = md.split("## Throughput (samples/s, whole job)")[1].split("##")[0]
    assert "| workload | bandwidth_gbps | paced | kvstore | p3 |" in table
    assert "| w<1> | 1 | False | 100.0 | 200.0 |" in table  # not (200 + 50) / 2
    assert "| w<1> | 1 | True |  | 50 |" in table
    # The speedups compare like with like: kvstore ran unpaced only.
    assert "p3 on w<1>: 1.50x at 10 Gbps; peak 2.00x at 1 Gbps" in md


def test_repetitions_aggregate_to_their_median_or_the_fastest(tmp_path):
    base = synthetic_rows()
    base = base[base["status"] == "ok"]
    # three repetitions of every point, at 1x, 0.5x and 0.8x its throughput
    reps = pd.concat([base.assign(repetition=i, throughput=base["throughput"] * f,
                                  iteration_time_s=base["iteration_time_s"] / f)
                      for i, f in enumerate((1.0, 0.5, 0.8))], ignore_index=True)
    for aggregate, factor, words in (("median", 0.8, "their median"),
                                     ("fastest", 1.0, "the fastest of them")):
        spec = ThroughputSpec(workloads=["resnet50"], backends=["kvstore", "p3"],
                              bandwidth_gbps=[1, 10, 30],
                              report={"baseline": "kvstore", "aggregate": aggregate})
        out = tmp_path / aggregate
        out.mkdir()
        throughput_report.render(reps, out, spec)
        md = (out / "report.md").read_text()
        assert f"repetitions (up to 3) shows {words}" in md
        table = md.split("## Throughput (samples/s, whole job)")[1].split("##")[0]
        row = next(line for line in table.splitlines() if line.startswith("| w<1> | 1 |"))
        cells = [float(c) for c in row.strip("|").split("|")[2:]]
        assert cells == [100 * factor, 200 * factor], table


def test_quartile_takes_each_real_runs_lower_quartile_and_the_median_of_them(tmp_path):
    """``aggregate: quartile``: a real run's time is the floor(n/4)-th smallest of its
    iterations (the calibration's estimator), the point's the median over its runs;
    simulated rows keep their time."""
    import json

    base = synthetic_rows()
    base = base[base["status"] == "ok"].reset_index(drop=True)
    sim = base.assign(samples_s=[json.dumps([t]) for t in base["iteration_time_s"]])
    # Three real runs of every point, 8 iterations each: the 2nd smallest (index 8 // 4 = 2,
    # counting from 0) of run 0 is 1.5x the simulated time, of run 1 1.2x, of run 2 1.3x.
    real = []
    for rep, factors in enumerate(([1.0, 1.4, 1.5, 2.0, 2.0, 2.0, 3.0, 3.0],
                                   [1.1, 1.2, 1.2, 2.5, 2.5, 2.5, 2.5, 2.5],
                                   [0.9, 1.0, 1.3, 1.3, 1.4, 2.0, 2.0, 2.0])):
        times = [[t * f for f in factors[::-1]] for t in base["iteration_time_s"]]
        medians = [sorted(x)[4] for x in times]
        real.append(base.assign(mode="real", repetition=rep, iteration_time_s=medians,
                                throughput=base["throughput"] * base["iteration_time_s"]
                                / medians, samples_s=[json.dumps(x) for x in times]))
    rows = pd.concat([sim, *real], ignore_index=True)
    spec = ThroughputSpec(workloads=["resnet50"], backends=["kvstore", "p3"],
                          bandwidth_gbps=[1, 10, 30], mode="both",
                          report={"baseline": "kvstore", "aggregate": "quartile"})
    agg = per_point(rows, "quartile")
    for _, row in agg.iterrows():
        point = base[(base["backend"] == row["backend"])
                     & (base["bandwidth_gbps"] == row["bandwidth_gbps"])].iloc[0]
        factor = 1.3 if row["mode"] == "real" else 1.0
        assert abs(row["iteration_time_s"] / (point["iteration_time_s"] * factor) - 1) < 1e-12
        assert abs(row["throughput"] / (point["throughput"] / factor) - 1) < 1e-12
    throughput_report.render(rows, tmp_path, spec)
    assert "shows the median of the real runs' lower quartiles" in (
        tmp_path / "report.md").read_text()


def test_a_point_left_at_an_axis_default_keeps_its_rows_and_its_own_plot_line(tmp_path):
    """``device: [null, V100]``: the points at None (the profile's device) are rows of their
    own, labelled "default", in both tables, and every varying axis is a plot series."""
    base = synthetic_rows()
    base = base[base["status"] == "ok"]
    v100 = base.assign(device="V100", throughput=base["throughput"] * 2,
                       point=lambda d: d["point"] + "+V100")
    rows = pd.concat([base.assign(device=None), v100], ignore_index=True)
    spec = ThroughputSpec(workloads=["resnet50"], backends=["kvstore", "p3"],
                          bandwidth_gbps=[1, 10, 30], device=[None, "V100"],
                          report={"baseline": "kvstore"})
    throughput_report.render(rows, tmp_path, spec)
    md = (tmp_path / "report.md").read_text()
    table = md.split("## Throughput (samples/s, whole job)")[1].split("##")[0]
    assert "| w<1> | 1 | default | 100.0 | 200.0 |" in table
    assert "| w<1> | 1 | V100 | 200.0 | 400.0 |" in table
    speedups = md.split("## Throughput (samples/s")[0]
    assert "| w<1> | 30 | default | 1 |" in speedups and "| w<1> | 30 | V100 | 1 |" in speedups
    sim = per_point(rows)
    assert series_columns(sim, "bandwidth_gbps") == ["variant", "device"]


def test_rerendering_with_the_edited_file_shows_its_description_if_the_points_are_the_same(
        tmp_path):
    from ddpbench.experiments import runner, schema

    path, out = tmp_path / "tiny.yaml", tmp_path / "out"
    base = ("name: tiny\nmode: simulate\nworkloads: [resnet50]\nbackends: {mpi: {}}\n"
            "iterations: 3\nwarmup: 1\n")
    path.write_text(f"description: first words\n{base}workers: [2]\n")
    runner.run_experiment(schema.load_experiment(path), out, progress=False)
    assert "first words" in (out / "report.md").read_text()
    # `ddpbench report out --experiment tiny.yaml` after the prose was edited: shown.
    path.write_text(f"description: second words\n{base}workers: [2]\n")
    runner.render(schema.load_experiment(path), out)
    assert "second words" in (out / "report.md").read_text()
    # A file with other points did not make these rows: the stored experiment stays.
    path.write_text(f"description: third words\n{base}workers: [2, 3]\n")
    runner.render(schema.load_experiment(path), out)
    assert "second words" in (out / "report.md").read_text()
    assert "third words" not in (out / "experiment.json").read_text()


def test_a_variant_names_only_its_own_backends_knobs():
    # Horovod's `hierarchical` swept beside byteps: byteps rows have no such knob, so the
    # neutral value filled into its empty cells must not label them.
    rows = []
    for backend, hier in (("horovod", False), ("horovod", True), ("byteps", None)):
        rows.append({"experiment": "s", "kind": "throughput", "mode": "simulate",
                     "point": f"{backend}[h={hier}]", "repetition": 0, "status": "ok",
                     "error": None, "backend": backend, "workload": "w", "workers": 4,
                     "servers": "colocated", "bandwidth_gbps": 10.0, "latency_us": 5.0,
                     "iterations": 3, "warmup": 1, "compute_scale": 1.0, "size_scale": 1.0,
                     "hierarchical": hier, "iteration_time_s": 0.01, "throughput": 100.0})
    variants = sorted(per_point(pd.DataFrame(rows))["variant"])
    assert variants == ["byteps", "horovod (hierarchical=false)", "horovod (hierarchical=true)"]


def test_tables_list_only_combinations_that_have_a_point():
    # hosts and workers as axes together: 2 workers on 1 host and 4 on 2, never 2 on 2.
    from ddpbench.experiments.throughput.text import _pivot

    df = pd.DataFrame({"workload": ["w"] * 4, "workers": [2, 4, 2, 4], "hosts": [1, 2, 1, 2],
                       "variant": ["a", "a", "b", "b"], "throughput": [1.0, 2.0, 3.0, 4.0]})
    table = _pivot(df, ["workload", "workers", "hosts"], "throughput")
    assert list(table.index) == [("w", 2, 1), ("w", 4, 2)]
    assert table.loc[("w", 4, 2), "b"] == 4.0
