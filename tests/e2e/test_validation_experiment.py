"""The ``kind: validation`` runner plugin: spec errors, and a small run that renders."""

from __future__ import annotations

import textwrap

import pandas as pd
import pytest

from ddpbench.experiments import runner, schema
from ddpbench.experiments import validation as va


@pytest.mark.parametrize("body, words", [
    ("only: [no_such_point]\n", "unknown point id 'no_such_point'"),
    ("sources: [wikipedia]\n", "unknown source 'wikipedia'"),
    ("bandwidths_gbps: [10, 0]\n", "not > 0"),
    ("iterations: 0\n", "iterations"),
    ("iterations: 2\nwarmup: 2\n", "warmup"),
    ("colour: red\n", "colour"),
    ("published: /nonexistent/pub.yaml\n", "published"),
    ("sensitivity: [{field: transport, values: [1], points: [p3_resnet50_4g], why: w}]\n",
     "sensitivity field 'transport' cannot be varied"),
    ("sensitivity: [{field: socket_gbps, values: [0], points: [p3_resnet50_4g], why: w}]\n",
     "socket_gbps"),
    ("sensitivity: [{field: socket_gbps, values: [8], points: [nope], why: w}]\n",
     "unknown point id 'nope'"),
    ("sensitivity: [{field: socket_gbps, values: [8], points: [byteps_osdi_vs_ps], why: w}]\n",
     "is not simulated"),
    ("sensitivity: [{field: socket_gbps, values: [], points: [p3_resnet50_4g], why: w}]\n",
     "values"),
])
def test_spec_errors_name_the_field(tmp_path, body, words):
    path = tmp_path / "v.yaml"
    path.write_text("name: v\nkind: validation\n" + body)
    with pytest.raises(ValueError, match=words):
        schema.load_experiment(path)


def test_spec_round_trips():
    spec = va.Spec.model_validate({"only": ["p3_resnet50_4g"], "bandwidths_gbps": [4, 1, 4]})
    assert spec.bandwidths_gbps == (1.0, 4.0)
    assert va.Spec.model_validate(spec.model_dump(mode="json")) == spec


SMALL = textwrap.dedent("""\
    name: small_validation
    kind: validation
    only: [p3_resnet50_4g, p3_resnet50_peak, p3_resnet50_peak_bw, hvd_inception3_128,
           byteps_osdi_vs_ps]
    bandwidths_gbps: [2, 4, 30]
    iterations: 2
    notes: ["a note the report prints"]
    """)


def test_a_small_validation_run_renders(tmp_path):
    path = tmp_path / "small_validation.yaml"
    path.write_text(SMALL)
    exp = schema.load_experiment(path)
    out = tmp_path / "out"
    summary = runner.run_experiment(exp, out, jobs=1, progress=False)
    assert summary.failed == 0 and summary.ok == 5
    df = pd.read_csv(out / "results.csv")
    row = df.set_index("id").loc
    # The relative error is simulated / published - 1, and a point the sources leave
    # unpinned is shown without a simulated value.
    r = row["p3_resnet50_4g"]
    assert r["rel_error"] == pytest.approx(r["simulated"] / 1.26 - 1)
    assert pd.isna(row["byteps_osdi_vs_ps"]["simulated"])
    # The peak of the sweep is its largest speedup, at one of the swept bandwidths.
    peak = row["p3_resnet50_peak"]
    assert peak["peak_bandwidth_gbps"] in (2.0, 4.0, 30.0)
    assert row["p3_resnet50_peak_bw"]["simulated"] == peak["peak_bandwidth_gbps"]
    assert peak["simulated"] >= r["simulated"] - 1e-12  # 4 Gbps is in the sweep
    assert 0 < row["hvd_inception3_128"]["simulated"] <= 1.0 + 1e-9
    md = (out / "report.md").read_text()
    for words in ("p3_resnet50_4g", "26% at 4 Gbps", "median abs. error", "a note the report prints",
                  "Constants and how they were chosen", "transport tcp: efficiency",
                  "byteps_osdi_vs_ps"):
        assert words in md, words
    for name in ("published_vs_simulated.png", "errors.png", "peak_gain_sweep.png", "report.html"):
        assert (out / name).stat().st_size > 0


PUBLISHED = textwrap.dedent("""\
    sources:
      t: {title: a test, url: nowhere}
    points:
      - id: tput
        source: t
        where: here
        quote: "a sentence"
        setting: {workload: resnet50, hosts: 2, transport: ideal, bandwidth_gbps: 10}
        metric: throughput
        backend: horovod
        value: 100
      - id: peak
        source: t
        where: here
        quote: "a sentence"
        setting: {workload: resnet50, hosts: 2, transport: ideal}
        metric: peak_speedup
        backend: horovod
        baseline: mpi
        value: 1.5
    """)


def test_simulated_values_equal_the_simulator_in_the_point_setting(tmp_path):
    from ddpbench.simulator import simulate

    (tmp_path / "pub.yaml").write_text(PUBLISHED)
    path = tmp_path / "v.yaml"
    path.write_text(f"name: v\nkind: validation\npublished: {tmp_path / 'pub.yaml'}\n"
                    "bandwidths_gbps: [1, 10]\niterations: 2\n")
    out = tmp_path / "out"
    summary = runner.run_experiment(schema.load_experiment(path), out, jobs=1, progress=False)
    assert summary.ok == 2
    rows = pd.read_csv(out / "results.csv").set_index("id")

    def thr(backend, bw):
        return simulate("resnet50", backend, workers=2, hosts=2, bandwidth_gbps=bw,
                        transport="ideal", iterations=2, warmup=1).throughput

    assert rows.loc["tput", "simulated"] == pytest.approx(thr("horovod", 10), rel=1e-12)
    assert rows.loc["tput", "rel_error"] == pytest.approx(thr("horovod", 10) / 100 - 1,
                                                          rel=1e-12)
    ratios = {bw: thr("horovod", bw) / thr("mpi", bw) for bw in (1.0, 10.0)}
    assert rows.loc["peak", "simulated"] == pytest.approx(max(ratios.values()), rel=1e-12)
    assert rows.loc["peak", "peak_bandwidth_gbps"] == max(ratios, key=ratios.get)


def test_simulated_values_at_a_sensitivity_are_the_simulator_with_that_field_and_unscored(
        tmp_path):
    from ddpbench.simulator import simulate

    (tmp_path / "pub.yaml").write_text(PUBLISHED.replace("transport: ideal", "transport: tcp"))
    path = tmp_path / "v.yaml"
    path.write_text(f"name: v\nkind: validation\npublished: {tmp_path / 'pub.yaml'}\n"
                    "bandwidths_gbps: [1, 40]\niterations: 2\n"
                    "sensitivity: [{field: socket_gbps, values: [1, 8], points: [tput, peak],\n"
                    "               why: a constant no setting states}]\n")
    out = tmp_path / "out"
    summary = runner.run_experiment(schema.load_experiment(path), out, jobs=1, progress=False)
    assert summary.ok == 6 and summary.failed == 0
    df = pd.read_csv(out / "results.csv")
    assert sorted(df["point"]) == ["peak", "peak[socket_gbps=1]", "peak[socket_gbps=8]", "tput",
                                   "tput[socket_gbps=1]", "tput[socket_gbps=8]"]

    def thr(**kw):
        return simulate("resnet50", "horovod", workers=2, hosts=2, bandwidth_gbps=10,
                        transport="tcp", iterations=2, warmup=1, **kw).throughput

    rows = df.set_index("point")
    assert rows.loc["tput", "simulated"] == pytest.approx(thr(), rel=1e-12)
    for cap in (1, 8):
        r = rows.loc[f"tput[socket_gbps={cap}]"]
        assert r["simulated"] == pytest.approx(thr(socket_gbps=float(cap)), rel=1e-12)
        assert r["rel_error"] == pytest.approx(r["simulated"] / 100 - 1, rel=1e-12)
    # At 1 Gbit/s one connection binds far below the 10 Gbit/s NIC: the ring slows.
    assert rows.loc["tput[socket_gbps=1]", "simulated"] < 0.8 * rows.loc["tput", "simulated"]
    # The scores count the published points only, once each.
    from ddpbench.experiments.validation.report import summary as score

    s = score(df, va.Spec.model_validate({"published": str(tmp_path / "pub.yaml")}))
    assert s["scored"] == 2 and s["points"] == 2
    md = (out / "report.md").read_text()
    assert "Sensitivity (shown, not scored)" in md and "a constant no setting states" in md
    assert "socket_gbps=1 on these points, every other point as shipped" in md
    assert md.count("| tput |") == 2  # in the table of every point and in the sensitivity's
    # A swept point's sensitivity rows get a sweep figure of their own.
    assert (out / "peak_gain_sweep_socket_gbps.png").stat().st_size > 0
    assert "peak_gain_sweep_socket_gbps.png" in md


SPLIT_POINTS = textwrap.dedent("""\
    sources:
      t: {title: a test, url: nowhere}
    points:
      - id: eff_one_host
        source: t
        where: here
        quote: "a sentence"
        setting: {workload: resnet50, hosts: 4, gpus_per_host: 2, transport: ideal, bandwidth_gbps: 10}
        metric: scaling_efficiency
        reference: {hosts: 1, gpus_per_host: 2}
        backend: horovod
        curve: c1
        value: 0.8
      - id: eff_two_hosts
        source: t
        where: here
        quote: "a sentence"
        setting: {workload: resnet50, hosts: 2, gpus_per_host: 2, transport: ideal, bandwidth_gbps: 10}
        metric: scaling_efficiency
        reference: {hosts: 1, gpus_per_host: 2}
        backend: horovod
        curve: c1
        value: 0.9
      - id: busbw
        source: t
        where: here
        quote: "a sentence"
        setting: {workload: none, hosts: 2, gpus_per_host: 4, device: V100, transport: tcp, intra_link: nvlink, nccl_version: "2.3.7", bandwidth_gbps: 25, message_bytes: 134217728}
        metric: bus_bandwidth
        backend: mpi
        split: test
        value: 2.5
    """)


def _split_run(tmp_path, extra=""):
    (tmp_path / "pub.yaml").write_text(SPLIT_POINTS)
    path = tmp_path / "v.yaml"
    path.write_text(f"name: v\nkind: validation\npublished: {tmp_path / 'pub.yaml'}\n"
                    f"iterations: 2\n{extra}")
    out = tmp_path / "out"
    summary = runner.run_experiment(schema.load_experiment(path), out, jobs=1, progress=False)
    return summary, pd.read_csv(out / "results.csv").set_index("id"), out


def test_scaling_efficiency_against_a_reference_and_bus_bandwidth_closed_forms(tmp_path):
    from ddpbench.simulator import simulate, simulate_collective

    summary, rows, out = _split_run(tmp_path)
    assert summary.failed == 0 and summary.ok == 3

    def thr(hosts):
        return simulate("resnet50", "horovod", hosts=hosts, gpus_per_host=2, bandwidth_gbps=10,
                        transport="ideal", iterations=2, warmup=1).throughput

    # efficiency relative to one host of 2 GPUs: throughput / (hosts x that host's)
    assert rows.loc["eff_one_host", "simulated"] == pytest.approx(thr(4) / (4 * thr(1)))
    # nccl-tests' bus bandwidth: bytes / time x 2 (p-1) / p, in GB/s
    n, p = 134217728, 8
    t = simulate_collective("allreduce", n, hosts=2, gpus_per_host=4, bandwidth_gbps=25,
                            device="V100", transport="tcp", intra_link="nvlink",
                            nccl_version="2.3.7")
    assert rows.loc["busbw", "simulated"] == pytest.approx(n / t * 2 * (p - 1) / p / 1e9)
    md = (out / "report.md").read_text()
    # both splits side by side, and the curve's slope checked (0.9 -> 0.8 published)
    assert "| fit | 2 | 2 |" in md and "| test | 1 | 1 |" in md
    assert "Published curves: slopes" in md and "| c1 | fit |" in md


def test_a_validation_run_of_one_split_runs_only_its_points(tmp_path):
    summary, rows, _ = _split_run(tmp_path, "splits: [fit]\n")
    assert summary.ok == 2 and set(rows.index) == {"eff_one_host", "eff_two_hosts"}


def test_curve_slopes_flag_a_step_of_the_wrong_sign():
    from ddpbench.experiments.validation.report import curve_slopes

    pub = va.data.Published.model_validate(__import__("yaml").safe_load(SPLIT_POINTS))
    by_id = {p.id: p for p in pub.points}
    # published: 0.9 at 4 GPUs, 0.8 at 8 (falling); simulated rising -> wrong sign
    df = pd.DataFrame({"id": ["eff_two_hosts", "eff_one_host"], "simulated": [0.7, 0.9]})
    (c,) = curve_slopes(df, by_id)
    assert c["curve"] == "c1" and c["agree"] == [False]
    df = pd.DataFrame({"id": ["eff_two_hosts", "eff_one_host"], "simulated": [0.95, 0.85]})
    assert curve_slopes(df, by_id)[0]["agree"] == [True]


def _throughput_point(pid, hosts, value, split="fit", bandwidth=10, curve="t1"):
    return {"id": pid, "source": "t", "where": "w", "quote": "q", "metric": "throughput",
            "setting": {"workload": "resnet50", "hosts": hosts, "gpus_per_host": 8,
                        "transport": "ideal", "bandwidth_gbps": bandwidth},
            "backend": "horovod", "curve": curve, "split": split, "value": value}


def test_curve_scaling_is_each_points_scaling_from_the_first_simulated_over_published():
    from ddpbench.experiments.validation.report import curve_scaling, curve_slopes, scaling_summary

    pub = va.data.Published.model_validate({"sources": {"t": {"title": "a", "url": "b"}},
                                            "points": [
        _throughput_point("one", 1, 1000.0),
        _throughput_point("two", 2, 1800.0),
        _throughput_point("four", 4, 3000.0, split="test"),
        # a bandwidth sweep is not a scaling curve
        _throughput_point("bw10", 2, 500.0, curve="sweep"),
        _throughput_point("bw25", 2, 900.0, bandwidth=25, curve="sweep"),
    ]})
    by_id = {p.id: p for p in pub.points}
    df = pd.DataFrame({"id": ["four", "two", "one", "bw10", "bw25"],
                       "simulated": [4400.0, 2000.0, 1100.0, 600.0, 700.0]})
    rows = {r["id"]: r for r in curve_scaling(curve_slopes(df, by_id))}
    assert set(rows) == {"two", "four"}
    # published 1.8x and 3.0x from one host; simulated 2000/1100 and 4400/1100
    assert rows["two"]["published"] == pytest.approx(1.8)
    assert rows["two"]["error"] == pytest.approx((2000 / 1100) / 1.8 - 1)
    assert rows["four"]["error"] == pytest.approx((4400 / 1100) / 3.0 - 1)
    assert (rows["two"]["split"], rows["four"]["split"]) == ("fit", "test")
    s = scaling_summary(list(rows.values()))
    assert s["fit"]["points"] == s["test"]["points"] == 1 and s["both"]["curves"] == 1
    assert s["both"]["median_abs_error"] == pytest.approx(
        (abs(rows["two"]["error"]) + abs(rows["four"]["error"])) / 2)
    assert s["test"]["beyond_25"] == 1 and s["fit"]["beyond_25"] == 0


@pytest.mark.parametrize("edit, words", [
    ({"reference": {"hosts": 1}, "metric": "throughput"}, "reference applies to"),
    ({"setting": {"workload": "resnet50", "bandwidth_gbps": 10, "message_bytes": 8}},
     "message_bytes is needed by, and only by"),
])
def test_reference_and_message_bytes_belong_to_their_metrics(edit, words):
    raw = {"id": "x", "source": "t", "where": "w", "quote": "q", "metric": "throughput",
           "setting": {"workload": "resnet50", "bandwidth_gbps": 10}, "backend": "horovod",
           "value": 1.0, **edit}
    with pytest.raises(ValueError, match=words):
        va.data.Point.model_validate(raw)


def test_the_report_lists_each_mechanism_with_its_split_and_effects(tmp_path):
    extra = ("mechanisms:\n  - {name: a rule, source: a file, chosen_on: fit,\n"
             "     fit: 'median 9% -> 8%', test: 'median 12% -> 13%'}\n")
    _, _, out = _split_run(tmp_path, extra)
    md = (out / "report.md").read_text()
    assert "| a rule | a file | fit | median 9% -> 8% | median 12% -> 13% |" in md
