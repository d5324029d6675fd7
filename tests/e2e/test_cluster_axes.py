"""Cluster axes in an experiment file: same names as the API, checked with the line."""

from __future__ import annotations

import csv
import json
import textwrap

import pytest

from ddpbench import simulator
from ddpbench.cli import main as cli_main
from ddpbench.experiments import runner, schema

CLUSTER = """\
name: clusters
workloads: [resnet50]
hosts: 2
gpus_per_host: [1, 4]
bandwidth_gbps: 25
transport: tcp
intra_link: nvlink
device: V100
batch_size: 64
jitter: [0, 0.05]
iterations: 2
backends:
  horovod: {hierarchical: [false, true]}
  byteps: {}
"""


def test_cluster_axes_reach_the_simulator(tmp_path):
    exp_file = tmp_path / "clusters.yaml"
    exp_file.write_text(CLUSTER)
    points = runner.expand_points(schema.load_experiment(exp_file))
    assert len(points) == 2 * 2 * 2 + 2 * 2
    out = tmp_path / "out"
    assert cli_main(["run", str(exp_file), "--outdir", str(out), "--jobs", "1",
                     "--no-progress", "--no-report"]) == 0
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    hier = next(r for r in rows if "hierarchical=true" in r["point"]
                and "gpus_per_host=4" in r["point"] and "jitter" not in r["point"])
    assert "hosts=2" in hier["point"] and "workers=8" in hier["point"]
    ref = simulator.simulate("resnet50", "horovod", hosts=2, gpus_per_host=4,
                             bandwidth_gbps=25, transport="tcp", intra_link="nvlink",
                             device="V100", batch_size=64, iterations=2, warmup=1,
                             hierarchical=True)
    assert float(hier["iteration_time_s"]) == ref.iteration_time_s
    assert float(hier["throughput"]) == pytest.approx(8 * 64 / ref.iteration_time_s)


@pytest.mark.parametrize("line,text,field", [
    (3, "gpus_per_host: 0", "gpus_per_host must be a positive integer"),
    (3, "gpus_per_host: 2.5", "gpus_per_host"),
    (3, "device: Z80", "device must be one of"),
    (3, "transport: udp", "transport must be one of"),
    (3, "batch_size: 0", "batch_size must be a positive integer"),
    (3, "batch_size: -8", "batch_size"),
    (3, "intra_link: nvswitch", "intra_link must be one of"),
])
def test_bad_cluster_value_names_the_field_and_line(tmp_path, line, text, field):
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"name: bad\nworkloads: [resnet50]\n{text}\nbackends: [horovod]\n")
    with pytest.raises(ValueError, match=field) as err:
        schema.load_experiment(bad)
    assert f":{line}" in str(err.value) or f"line {line}" in str(err.value)


def test_simulate_command_takes_the_cluster_flags(capsys):
    assert cli_main(["simulate", "-w", "resnet50", "-b", "horovod", "--hosts", "4",
                     "--gpus-per-host", "8", "--transport", "rdma", "--intra-link", "nvlink",
                     "-k", "hierarchical=true", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["workers"], out["hosts"], out["gpus_per_host"]) == (32, 4, 8)
    assert cli_main(["simulate", "--gpus-per-host", "0"]) != 0
    assert "gpus_per_host must be a positive integer" in capsys.readouterr().err


def test_hosts_and_workers_that_disagree_name_both(tmp_path):
    exp_file = tmp_path / "both.yaml"
    exp_file.write_text(textwrap.dedent("""\
        name: both
        workloads: [resnet50]
        workers: 6
        gpus_per_host: 4
        backends: [horovod]
        """))
    exp = schema.load_experiment(exp_file)
    out = tmp_path / "out"
    assert cli_main(["run", str(exp_file), "--outdir", str(out), "--jobs", "1",
                     "--no-progress", "--no-report"]) == 1
    with open(out / "results.csv", newline="") as f:
        (row,) = list(csv.DictReader(f))
    assert "multiple of gpus_per_host" in row["error"]
    assert exp.name == "both"


@pytest.mark.parametrize("name", ["p3_vs_ring", "scaling", "real_local"])
def test_shipped_reports_stay_finished(name, capsys):
    """Fields at their neutral value leave a point's key: no shipped result goes stale."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    assert cli_main(["run", str(root / "experiments" / f"{name}.yaml"), "--outdir",
                     str(root / "reports" / name), "--dry-run"]) == 0
    assert "0 of " in capsys.readouterr().out
