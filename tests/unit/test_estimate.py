"""The simulation cost estimate: from the point's sizes, close to the events a run processes,
and a clear refusal naming the one flag that overrides it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ddpbench import sizes
from ddpbench.rules import placement
from ddpbench.simulator import estimate, simulate
from ddpbench.simulator.workload import load_workload


@pytest.mark.parametrize(("workload", "backend", "kwargs"), [
    ("vgg19", "kvstore", {"workers": 32}),   # parts grow with the servers: events ~ hosts^2
    ("resnet50", "horovod", {"workers": 64}),  # fused buffers counted by a pilot
    ("resnet50", "byteps", {"workers": 48}),
    ("resnet50", "mpi", {"workers": 24}),
    ("bert_base", "p3", {"hosts": 6, "transport": "tcp"}),
    ("resnet50", "collective", {"hosts": 4, "gpus_per_host": 4, "nrings": 4}),
    ("vgg19", "byteps", {"workers": 8, "servers": 2, "scheduler": "credit"}),
    ("resnet50", "p3", {"workers": 4, "slice_params": 4000}),  # small knob, many parts
    ("resnet50", "kvstore", {"workers": 4, "system": "tensorflow"}),
])
def test_estimate_is_within_a_factor_two_of_the_events(workload, backend, kwargs):
    est = estimate.estimate(workload, backend, bandwidth_gbps=10, iterations=2, **kwargs)
    assert est is not None
    real = simulate(workload, backend, bandwidth_gbps=10, iterations=2, warmup=1,
                    **kwargs).events
    assert real / 2 <= est.events <= 2 * real, (est.events, real)
    assert est.memory_bytes == (est.events * estimate.BYTES_PER_EVENT
                                + est.parts * estimate.BYTES_PER_PART)
    assert est.seconds == est.events / estimate.EVENTS_PER_SECOND


def test_part_counts_are_the_placement_rules_own():
    for numel in (1, 7, 39_999, 40_000, 40_001, 1_000_003):
        for servers in (1, 3, 16):
            assert placement.part_count("p3", numel, slice_params=40_000) == len(
                placement.p3_parts(0, numel, 40_000, servers))
            assert placement.part_count("kvstore", numel, servers=servers,
                                        bigarray_bound=1000) == len(
                [p for p in placement.kvstore_parts(0, numel, 1000, servers) if p.count])
            assert placement.part_count("byteps", numel, partition_elems=1000) == len(
                placement.byteps_parts(0, numel, 1000, servers))
    with pytest.raises(ValueError, match="unknown placement rule 'x'"):
        placement.part_count("x", 1)


@pytest.mark.parametrize(("workload", "backend", "knob"), [
    ("gpt2_xl", "p3", {"slice_params": 1}),       # 1.5 G slices
    ("gpt2_xl", "byteps", {"partition_bytes": 4}),  # 1.5 G partitions
])
def test_a_small_knob_is_estimated_from_its_parts_at_any_host_count(workload, backend, knob):
    # Four hosts: a host-count threshold alone let these through (memory grew unbounded).
    est = estimate.estimate(workload, backend, workers=4, bandwidth_gbps=10, **knob)
    parts = sum(t.numel for t in load_workload(workload).tensors)
    assert est is not None and est.parts == parts
    with pytest.raises(sizes.TooLarge, match=r"this simulation would take about .* events "
                                             r".*Refused before any work: .* --allow-large"):
        estimate.check(est)
    estimate.check(est, allow=True)


def test_a_huge_tensor_is_estimated_from_its_parts():
    wl = load_workload("resnet50")
    big = wl.model_copy(update={"tensors": (wl.tensors[0].model_copy(
        update={"numel": 94 * 10**12}), *wl.tensors[1:])})  # 376 TB of fp32
    est = estimate.estimate(big, "p3", workers=4, bandwidth_gbps=10)
    assert est is not None and est.parts > 94 * 10**12 // 40_000
    with pytest.raises(sizes.TooLarge):
        estimate.check(est)


def test_past_the_limit_is_refused_with_the_estimate_and_the_flag(monkeypatch):
    est = estimate.Estimate(events=2e8, seconds=1200, memory_bytes=1e6)
    with pytest.raises(ValueError, match=r"about 200,000,000 events .*more than the limit of "
                                         r"50,000,000 events \(DDPBENCH_MAX_EVENTS\)\. "
                                         r"Refused before any work: .*add --allow-large"):
        estimate.check(est)
    monkeypatch.setenv("DDPBENCH_MAX_EVENTS", "3e9")
    estimate.check(est)
    monkeypatch.setenv("DDPBENCH_MAX_EVENTS", "lots")
    with pytest.raises(ValueError, match="DDPBENCH_MAX_EVENTS must be a number"):
        estimate.check(est)
    monkeypatch.delenv("DDPBENCH_MAX_EVENTS")
    huge = estimate.Estimate(events=1e6, seconds=6, memory_bytes=1e15)  # memory alone
    with pytest.raises(ValueError, match=r"more memory than this machine can give it"):
        estimate.check(huge)


def test_simulate_cli_refuses_a_million_workers_at_once():
    proc = subprocess.run(
        [sys.executable, "-m", "ddpbench", "simulate", "--workload", "resnet50", "--backend",
         "p3", "--workers", "1000000"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "this simulation would take about" in proc.stderr
    assert "add --allow-large to run it anyway" in proc.stderr
