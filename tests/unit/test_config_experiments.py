"""Experiment files: validation errors name file, line and field; sweeps expand as declared."""

from __future__ import annotations

import textwrap

import pytest

from ddpbench.cli import main as cli_main
from ddpbench.experiments import naming, runner, schema, throughput

GOOD = """\
name: tiny
workloads: [resnet50, vgg19]
workers: [2, 4]
bandwidth_gbps: [1, 10]
latency_us: [5, 50]
backends:
  kvstore:
  p3: {slice_params: [10000, 40000]}
p3.water_mark: 4
zip:
  - [bandwidth_gbps, latency_us]
report: {baseline: kvstore}
"""


def parse(text: str) -> schema.Experiment:
    return schema.parse_experiment(textwrap.dedent(text), "exp.yaml")


def error_of(text: str) -> schema.ExperimentError:
    with pytest.raises(schema.ExperimentError) as info:
        parse(text)
    return info.value


@pytest.mark.parametrize(
    "text, line, field, words",
    [
        # a wrong type
        ("name: x\nworkloads: [resnet50]\nbackends: [p3]\nworkers: many\n", 4, "workers",
         "valid integer"),
        ("name: x\nworkloads: [resnet50]\nbackends: [p3]\nworkers: [2,\n  many]\n", 5,
         "workers[1]", "valid integer"),
        # an unknown key, the valid ones listed
        ("name: x\nworkloads: [resnet50]\nbackends: [p3]\nbandwith_gbps: 10\n", 4,
         "bandwith_gbps", "valid keys: ['activation_checkpointing', 'backends', 'bandwidth_gbps'"),
        ("name: x\nworkloads: [resnet50]\nbackends: [p3]\nreal:\n  timeout: 3\n", 5,
         "real.timeout", "valid keys: ['bind', 'compute', 'timeout_s']"),
        # a missing workload: the key, or a name that does not exist
        ("name: x\nbackends: [p3]\n", 1, "workloads", "required key is missing"),
        ("name: x\nworkloads:\n  - resnet50\n  - resnet5\nbackends: [p3]\n", 4,
         "workloads[1]", "unknown workload 'resnet5'"),
        # an empty sweep
        ("name: x\nworkloads: [resnet50]\nbackends: [p3]\nbandwidth_gbps: []\n", 4,
         "bandwidth_gbps", "empty sweep"),
        ("name: x\nworkloads: [resnet50]\nbackends: {}\n", 3, "backends", "empty sweep"),
        # YAML syntax errors
        ("name: x\nworkloads: [resnet50\nbackends: [p3]\n", 3, "workloads", "YAML syntax"),
        ("name: x\nworkloads: [resnet50]\n  backends: [p3]\n", 3, "backends", "YAML syntax"),
        ("name: x\nname: y\n", 2, "name", "duplicate key"),
        # names checked against the registries
        ("name: x\nworkloads: [resnet50]\nbackends: {p3: {slice: 3}}\n", 3,
         "backends.p3.slice", "valid knobs: ['local_reduce', 'priority', 'send_hwm', 'server_sockets', 'slice_params', 'sndbuf_bytes', 'sum_order', 'ties', 'water_mark'] (or a common axis"),
        ("name: x\nworkloads: [resnet50]\nbackends: [p4]\n", 3, "backends.p4",
         "unknown backend 'p4'"),
        ("name: x\nworkloads: [resnet50]\nbackends: [p3]\nzip: [[workers, bandwidth_gbps]]\n"
         "workers: [2, 4]\n", 4, "zip[0]", "equal lengths"),
        ("name: x\nworkloads: [resnet50]\nbackends: [p3]\nreport: {baseline: kvstore}\n", 4,
         "report.baseline", "not one of the experiment's backends"),
        ("name: x\nkind: nonsense\n", 2, "kind", "valid kinds"),
        ("name: ../x\n", 1, "name", "names the report folder"),
    ],
)
def test_malformed_file_names_line_and_field(text, line, field, words):
    err = error_of(text)
    assert err.line == line, str(err)
    assert err.field == field, str(err)
    assert words in str(err)
    assert str(err).startswith(f"exp.yaml:{line}: field '{field}': ")


def test_cli_reports_malformed_file_without_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nworkloads: [resnet50]\nbackends: [p3]\nworkers: many\n")
    assert cli_main(["run", str(bad), "--outdir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:4: field 'workers'" in err
    assert "Traceback" not in err
    assert cli_main(["run", str(tmp_path / "missing.yaml")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_grid_zip_and_knob_axes_expand_with_sorted_names():
    exp = parse(GOOD)
    assert exp.spec.backends["p3"] == {"slice_params": (10000, 40000), "water_mark": (4,)}
    points = runner.expand_points(exp)
    # kvstore: 2 workloads x 2 workers x 2 zipped (bandwidth, latency) = 8; p3: x 2 slices
    assert len(points) == 8 + 16
    names = [p.name for p in points]
    assert len(set(names)) == len(names)
    assert names[0] == ("kvstore[bandwidth_gbps=1,latency_us=5,servers=colocated,workers=2,"
                        "workload=resnet50]")
    p3 = [p.params for p in points if p.params["backend"] == "p3"]
    assert {(p["bandwidth_gbps"], p["latency_us"]) for p in p3} == {(1, 5), (10, 50)}
    assert {p["slice_params"] for p in p3} == {10000, 40000}
    assert all(p["water_mark"] == 4 for p in p3)
    assert ("p3[bandwidth_gbps=10,latency_us=50,servers=colocated,slice_params=40000,"
            "water_mark=4,workers=4,workload=vgg19]") in names
    # Deterministic: the same file gives the same points in the same order.
    assert [p.name for p in runner.expand_points(parse(GOOD))] == names


def test_only_filters_by_glob_or_substring_and_knob_zip():
    exp = parse(GOOD)
    assert len(runner.expand_points(exp, only="p3[*")) == 16
    assert len(runner.expand_points(exp, only="slice_params=10000")) == 8
    zipped = parse("""\
        name: z
        workloads: resnet50
        backends: {p3: {slice_params: [1000, 2000, 3000]}, kvstore: {}}
        bandwidth_gbps: [1, 2, 3]
        zip: [[p3.slice_params, bandwidth_gbps]]
        """)
    pts = [p.params for p in runner.expand_points(zipped)]
    assert [(p["slice_params"], p["bandwidth_gbps"]) for p in pts if p["backend"] == "p3"] == [
        (1000, 1), (2000, 2), (3000, 3)]
    assert len([p for p in pts if p["backend"] == "kvstore"]) == 3


def test_modes_and_repetitions_share_point_names():
    exp = parse("""\
        name: both
        mode: both
        workloads: resnet50
        workers: 2
        repetitions: 2
        backends: [mpi]
        """)
    points = runner.expand_points(exp)
    assert [(p.mode, p.params["repetition"]) for p in points] == [
        ("simulate", 0), ("simulate", 1), ("real", 0), ("real", 1)]
    assert len({p.name for p in points}) == 1
    assert len({p.key for p in points}) == 4



def test_repetitions_go_round_every_point_in_turn():
    """Every point once, then every point again: a slow phase of a shared machine catches
    one repetition of several points, not all repetitions of one."""
    exp = parse("""\
        name: reps
        mode: real
        workloads: resnet50
        workers: [2, 3]
        repetitions: 2
        backends: [mpi, horovod]
        """)
    order = [(p.params["backend"], p.params["workers"], p.params["repetition"])
             for p in runner.expand_points(exp)]
    assert order == [("mpi", 2, 0), ("mpi", 3, 0), ("horovod", 2, 0), ("horovod", 3, 0),
                     ("mpi", 2, 1), ("mpi", 3, 1), ("horovod", 2, 1), ("horovod", 3, 1)]

def test_names_format_values_and_skip_defaults():
    assert naming.make_name("p3", {"b": 10.0, "a": 0.25, "c": "x"}) == "p3[a=0.25,b=10,c=x]"
    params = {"mode": "simulate", "backend": "mpi", "workload": "vgg19", "workers": 2,
              "iterations": 3, "compute_scale": 0.5, "repetition": 1, "_timeline": True}
    assert throughput.point_name(params) == "mpi[compute_scale=0.5,workers=2,workload=vgg19]"


def test_shipped_experiments_validate():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "experiments"
    mine = ["p3_vs_ring.yaml", "scaling.yaml", "real_local.yaml"]
    for name in mine:
        path = root / name
        if path.exists():
            exp = schema.load_experiment(path)
            assert runner.expand_points(exp), name
