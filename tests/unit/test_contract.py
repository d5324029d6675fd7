"""The knob contract is the one home of knobs: backends, simulator, schema and README agree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import ddpbench
from ddpbench import contract
from ddpbench.api import backend_class
from ddpbench.experiments import schema
from ddpbench.simulator.strategies import STRATEGIES, strategy_class

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", list(contract.BACKENDS))
def test_real_options_and_simulator_knobs_come_from_the_contract(name):
    assert backend_class(name).Options is contract.BACKENDS[name].knobs
    assert STRATEGIES[name] == contract.defaults(name, "sim")
    sim_knobs = strategy_class(name).parse_knobs({})
    assert isinstance(sim_knobs, contract.BACKENDS[name].knobs)
    assert set(contract.BACKENDS) == set(STRATEGIES)


def test_ps_backends_are_the_ones_with_servers():
    assert {"kvstore", "p3", "byteps"} == contract.PS_BACKENDS


@pytest.mark.parametrize(("name", "knobs", "message"), [
    ("p3", {"slice_params": 0},
     "knob 'slice_params' of backend 'p3' must be >= 1 elements, got 0"),
    ("p3", {"slice_params": -5}, "must be >= 1 elements, got -5"),
    ("collective", {"nrings": 65}, "knob 'nrings' of backend 'collective' must be <= 64"),
    ("horovod", {"fusion_threshold": True}, "must be an integer, got True (a boolean"),
    # strict types and physical bounds, with the unit
    ("horovod", {"cycle_time": 1e300}, "knob 'cycle_time' of backend 'horovod' must be "
                                       "<= 10000 ms, got 1e+300"),
    ("p3", {"slice_params": "4e4"}, "must be an integer, got the string '4e4' (YAML reads "
                                    "4e4 as text: write 40000)"),
    ("p3", {"priority": 1}, "knob 'priority' of backend 'p3' must be true or false, got 1"),
    ("horovod", {"fusion": 1}, "unknown knob 'fusion' of backend 'horovod'; valid knobs:"),
    ("nccl", {}, "unknown backend 'nccl'; available: ["),
])
def test_bad_knobs_name_knob_bound_and_value(name, knobs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        contract.validate_knobs(name, knobs)


def test_real_only_knobs_are_refused_by_the_simulator_and_accepted_by_real_runs():
    with pytest.raises(ValueError, match="only applies to real runs"):
        contract.validate_knobs("mpi", {"check_consistency": False}, side="sim")
    assert contract.validate_knobs("mpi", {"check_consistency": False}).check_consistency is False
    with pytest.raises(ValueError, match="only applies to real runs"):
        ddpbench.simulator.simulate("resnet50", "mpi", workers=2, bandwidth_gbps=10,
                                    check_consistency=False)


def test_same_bounds_in_the_simulator_the_schema_and_the_contract():
    with pytest.raises(ValueError, match="slice_params"):
        ddpbench.simulator.simulate("resnet50", "p3", workers=2, bandwidth_gbps=10,
                                    slice_params=0)
    with pytest.raises(schema.ExperimentError, match=r"x.yaml:3: field 'backends.p3.slice_params'"
                       r": knob 'slice_params' of backend 'p3' must be >= 1 elements, got -5"):
        schema.parse_experiment("name: x\nworkloads: [resnet50]\nbackends: {p3: "
                                "{slice_params: [40000, -5]}}\n", "x.yaml")
    for axis, bad in [("workers", 0), ("bandwidth_gbps", -1.0), ("size_scale", 2.0),
                      ("rack_size", 0), ("servers", 0)]:
        with pytest.raises(ValueError, match=axis):
            contract.check_axis(axis, bad)
        with pytest.raises(schema.ExperimentError, match=axis):
            schema.parse_experiment(f"name: x\nworkloads: [resnet50]\n{axis}: {bad}\n"
                                    f"backends: [p3]\n", "x.yaml")


def test_a_real_experiment_may_set_real_only_knobs():
    exp = schema.parse_experiment("name: x\nmode: real\nworkloads: [resnet50]\n"
                                  "backends: {mpi: {check_consistency: [true, false]}}\n")
    assert exp.spec.backends["mpi"]["check_consistency"] == (True, False)


def test_cluster_value_reaches_the_simulator():
    c = contract.Cluster(workers=3, servers=2, bandwidth_gbps=5, latency_us=1)
    a = ddpbench.simulator.simulate("resnet50", "kvstore", workers=99, bandwidth_gbps=1,
                                    cluster=c, iterations=2)
    b = ddpbench.simulator.simulate("resnet50", "kvstore", workers=3, servers=2,
                                    bandwidth_gbps=5, latency_us=1, iterations=2)
    assert a.iteration_time_s == b.iteration_time_s and a.workers == 3


def test_readme_backend_table_is_the_contracts():
    text = (REPO / "README.md").read_text()
    begin = text.index("<!-- backends table")
    start = text.index("\n", begin) + 1
    end = text.index("<!-- end of backends table -->")
    assert text[start:end].strip() == contract.markdown_table(), (
        "README's backend table is stale: paste `ddpbench list backends --markdown`")
