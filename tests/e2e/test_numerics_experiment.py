"""The ``kind: numerics`` runner plugin and the ``ddpbench numerics`` command."""

from __future__ import annotations

import math
import textwrap

import pandas as pd
import pytest

from ddpbench import cli
from ddpbench import numerics as nm
from ddpbench.experiments import numerics as ne
from ddpbench.experiments import runner, schema

TINY = {
    "world_sizes": [1, 3, 16],
    "factors": {"max_exp": 8, "step": 4},
    "dtypes": ["float16"],
    "distributions": [{"name": "correlated", "scales": [1e-3, 3000.0]}],
    "elements": 64,
    "training": None,
}


def test_spec_rejects_bad_values_with_their_names():
    with pytest.raises(ValueError, match="world size must be >= 1"):
        ne.Spec.model_validate({**TINY, "world_sizes": [0, 2]})
    with pytest.raises(ValueError, match="must be a finite number > 0"):
        ne.Spec.model_validate({**TINY, "factors": {"extra": [-1.0]}})
    with pytest.raises(ValueError, match="dtypes"):
        ne.Spec.model_validate({**TINY, "dtypes": ["int8"]})
    with pytest.raises(ValueError, match="Extra inputs are not permitted"):
        ne.Spec.model_validate({**TINY, "colour": "red"})
    spec = ne.Spec.model_validate(TINY)
    assert ne.Spec.model_validate(spec.model_dump(mode="json")) == spec


def test_expand_names_and_rows_match_the_engine():
    spec = ne.Spec.model_validate(TINY)
    points = ne.expand(spec)
    # factors at N: 1, 16, 256 plus sqrt(N), N (deduplicated)
    per_n = {n: len(spec.factors.for_world(n)) for n in spec.world_sizes}
    assert per_n == {1: 3, 3: 5, 16: 4}
    assert len(points) == 2 * sum(per_n.values())
    names = [ne.point_name(p) for p in points]
    assert len(set(names)) == len(names)
    assert "float16[N=16,dist=correlated,f=4,scale=0.001]" in names
    p = next(p for p in points if p["world_size"] == 16 and p["factor"] == 1.0
             and p["scale"] == 3000.0)
    row = ne.run_point(p)
    ref = {r["factor"]: r for r in nm.sweep_cell("float16", "correlated", 3000.0, 16,
                                                  spec.factors.for_world(16), 64)}
    assert row["overflow"] == ref[1.0]["overflow"] > 0  # 16 x 3000 x |m + z| > 65504
    assert row["rel_l2_err"] == ref[1.0]["rel_l2_err"] or math.isnan(row["rel_l2_err"])


TINY_YAML = textwrap.dedent("""\
        name: tiny_numerics
        kind: numerics
        world_sizes: [1, 3, 16]
        factors: {max_exp: 8, step: 4}
        dtypes: [float16]
        distributions:
          - {name: correlated, scales: [0.001, 3000]}
        elements: 64
        training: {world_size: 8, scale: 100, factors: [1, 8], steps: 5, dim: 4}
        """)


def test_runner_runs_and_renders_the_numerics_kind(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_YAML)
    exp = schema.load_experiment(path)
    summary = runner.run_experiment(exp, tmp_path / "out", jobs=1, progress=False)
    assert summary.failed == 0 and summary.ok == len(ne.expand(exp.spec))
    out = tmp_path / "out"
    for name in ("report.md", "error_float16.png", "range_float16.png", "training.png"):
        assert (out / name).stat().st_size > 0
    md = (out / "report.md").read_text()
    safe = pd.read_csv(out / "safe.csv")
    big = safe[(safe["scale"] == 3000) & (safe["world_size"] == 16)]
    # 16 ranks x 3000: f = 1 overflows, f = 16 keeps the sum in range
    assert not big[big["factor"] == 1.0]["safe"].iloc[0]
    assert big[big["factor"] == 16.0]["safe"].iloc[0]
    assert "| 16 |" in md and "Reading for users" in md


def test_cells_run_as_batches_in_the_pool_give_the_rows_of_an_in_line_run(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_YAML)
    exp = schema.load_experiment(path)
    for jobs in (1, 2):
        runner.run_experiment(exp, tmp_path / f"j{jobs}", jobs=jobs, progress=False,
                              render_report=False)
    one, two = (runner.read_results(tmp_path / f"j{j}" / "results.csv")
                .set_index("point").sort_index() for j in (1, 2))
    pd.testing.assert_frame_equal(one, two[one.columns])


def test_numerics_sweep_writes_what_the_runner_resumes(tmp_path, capsys):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_YAML)
    out = tmp_path / "out"
    assert cli.main(["numerics", "sweep", str(path), "--out", str(out), "--jobs", "1"]) == 0
    exp = schema.load_experiment(path)
    summary = runner.run_experiment(exp, out, jobs=1, progress=False)
    assert summary.ok == 0 and summary.skipped == len(ne.expand(exp.spec))
    df = runner.read_results(out / "results.csv")
    row = df[df["point"] == "float16[N=16,dist=correlated,f=1,scale=3000]"].iloc[0]
    ref = nm.sweep_cell("float16", "correlated", 3000.0, 16,
                        exp.spec.factors.for_world(16), 64)
    assert row["overflow"] == next(r["overflow"] for r in ref if r["factor"] == 1.0) > 0
    assert runner.load_saved_experiment(out).spec == exp.spec


def test_query_command_prints_the_safe_range(capsys):
    assert cli.main(["numerics", "query", "-N", "64", "--scale", "1e3", "--dist",
                     "correlated", "--elements", "512"]) == 0
    out = capsys.readouterr().out
    assert "for N=64 and gradients near 1000, factors between 4 and" in out
    assert "sqrt(N)" in out


@pytest.mark.parametrize("argv, words", [
    (["query", "-N", "0", "--scale", "1"], "world size must be >= 1"),
    (["query", "-N", "8", "--scale", "1", "--dtype", "fp8"], "unknown dtype 'fp8'"),
    (["query", "-N", "8", "--scale", "1", "--factors", "0,2"], "> 0"),
    (["query", "-N", "8", "--scale", "-1"], "gradient scale"),
    (["bench", "-N", "8", "--factor", "0"], "> 0"),
    (["sweep", "--world-sizes", "0,4", "--out", "/nonexistent"], "world size must be >= 1"),
    (["sweep", "--dist", "normal", "--out", "/nonexistent"], "NAME:S1,S2"),
])
def test_bad_command_input_exits_2_with_a_message(argv, words, capsys):
    assert cli.main(["numerics", *argv]) == 2
    assert words in capsys.readouterr().err


def test_numerics_sweep_into_a_file_or_an_unmakeable_folder_is_a_clear_error(tmp_path):
    import subprocess
    import sys

    afile = tmp_path / "f"
    afile.write_text("")
    for out, rc, words in [(afile, 2, "is a file, not a folder"),
                           (afile / "sub", 2, "cannot be created")]:
        proc = subprocess.run([sys.executable, "-m", "ddpbench", "numerics", "sweep", "--out",
                               str(out)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == rc and words in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
