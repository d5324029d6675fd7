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
    for words in ("p3_resnet50_4g", "26% at 4 Gbps", "Median |error|", "a note the report prints",
                  "Constants and how they were chosen", "transport tcp: efficiency",
                  "byteps_osdi_vs_ps"):
        assert words in md, words
    for name in ("published_vs_simulated.png", "errors.png", "peak_gain_sweep.png", "report.html"):
        assert (out / name).stat().st_size > 0
