"""Simulator: profiles, closed forms, behaviour, determinism, validation, full traces."""

from __future__ import annotations

import csv
import math

import pytest

from ddpbench import simulator
from ddpbench.simulator import load_workload, simulate, simulate_collective
from ddpbench.simulator.workload import PROFILE_DIR, Workload

B10 = 10e9 / 8  # bytes/s at 10 Gbit/s


def flat(numel: int, layers: int = 1) -> Workload:
    """A workload with no compute: iteration time is communication time."""
    return Workload.from_dict({"name": "flat", "batch_size": 1, "layers": [
        {"name": f"l{i}", "fwd_ms": 0, "bwd_ms": 0,
         "tensors": [{"name": f"t{i}", "numel": numel // layers}]} for i in range(layers)]})


# ------------------------------------------------------------------ profiles

@pytest.mark.parametrize("name,ntensors,params", [
    ("resnet50", 161, 25_557_032), ("vgg19", 38, 143_667_240), ("bert_base", 199, 109_482_240)])
def test_profile_counts(name, ntensors, params):
    wl = load_workload(name)
    assert len(wl.tensors) == ntensors
    assert wl.total_params == params
    assert wl.model_bytes == 4 * params
    assert wl.batch_size > 0 and wl.gpu


@pytest.mark.parametrize("name", ["resnet50", "vgg19"])
def test_profile_tensors_match_reference_tables(name):
    with open(PROFILE_DIR / f"{name}_tensors.tsv") as f:
        ref = [(r["name"].split("(")[0], int(r["params"])) for r in csv.DictReader(f, delimiter="\t")]
    assert [(t.name, t.numel) for t in load_workload(name).tensors] == ref


def test_seq2seq_parameter_count():
    v, h = 32_000, 512

    def lstm(n_in, hid):
        return 4 * hid * (n_in + hid) + 2 * 4 * hid

    expected = (2 * v * h + 2 * lstm(h, h // 2) + lstm(h, h) + lstm(2 * h, h) + lstm(h, h)
                + 2 * h * h + h + 2 * h * h + h + h * v + v)
    assert load_workload("seq2seq_lstm").total_params == expected


def test_profiles_backward_slower_and_resnet_ratio():
    wl = load_workload("resnet50")
    fwd, bwd = sum(x.fwd_s for x in wl.layers), sum(x.bwd_s for x in wl.layers)
    assert bwd / fwd == pytest.approx(1.43, abs=0.02)
    for name in simulator.WORKLOADS:
        wl = load_workload(name)
        assert sum(x.bwd_s for x in wl.layers) > sum(x.fwd_s for x in wl.layers)


def test_compute_scale_scales_compute_only():
    wl = load_workload("resnet50")
    compute = sum(x.fwd_s + x.bwd_s for x in wl.layers)
    for scale in (0.5, 2.0):
        r = simulate(wl, "horovod", workers=1, bandwidth_gbps=10, compute_scale=scale,
                     cycle_time=0)
        assert r.iteration_time_s == pytest.approx(scale * compute, rel=1e-9)
        assert r.throughput == pytest.approx(wl.batch_size / (scale * compute), rel=1e-9)


def test_yaml_workload_roundtrip(tmp_path):
    p = tmp_path / "tiny.yaml"
    p.write_text("name: tiny\nbatch_size: 8\nlayers:\n  - {name: a, fwd_ms: 1, bwd_ms: 2, "
                 "tensors: [{name: w, numel: 10}]}\n")
    wl = load_workload(str(p))
    assert (wl.name, wl.total_params, wl.layers[0].bwd_s) == ("tiny", 10, 0.002)
    p.write_text("name: tiny\nbatch_size: 8\nlayers:\n  - {name: a, fwd_ms: -1, bwd_ms: 2}\n")
    with pytest.raises(ValueError, match="fwd_ms"):
        load_workload(str(p))
    p.write_text("name: tiny\nbatch_size: 8\nlayers:\n  - {name: a, fwd_ms: 1, bwd_ms: 2, "
                 "tensors: [{name: w, numel: 0}]}\n")
    with pytest.raises(ValueError, match="numel"):
        load_workload(str(p))


# ------------------------------------------------------------------ closed forms

@pytest.mark.parametrize("p", [2, 3, 4, 5, 7, 8, 16, 31, 64])
@pytest.mark.parametrize("nbytes", [1024, 1_000_003, 2**20, 2**30])
def test_ring_allreduce_closed_form(p, nbytes):
    a, b = 5e-6, 1 / B10
    expected = 2 * (p - 1) * a + 2 * (p - 1) / p * nbytes * b
    got = simulate_collective("allreduce", nbytes, workers=p, bandwidth_gbps=10, latency_us=5)
    assert got == pytest.approx(expected, rel=1e-3)


def test_broadcast_and_tree_closed_forms():
    a, b, n = 5e-6, 1 / B10, 2**24
    got = simulate_collective("broadcast", n, workers=8, bandwidth_gbps=10)
    assert got == pytest.approx(3 * a + 7 / 8 * n * b + 7 * a + 7 / 8 * n * b, rel=1e-6)
    got = simulate_collective("allreduce", n, workers=8, algorithm="tree", bandwidth_gbps=10)
    assert got == pytest.approx(2 * 3 * (a + n * b), rel=1e-9)


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_ring_all_gather_and_reduce_scatter_closed_form(op, p):
    # p - 1 steps, each moving ceil(n / p) bytes: half an allreduce's ring
    a, b, n = 5e-6, 1 / B10, 1_000_003
    got = simulate_collective(op, n, workers=p, bandwidth_gbps=10, latency_us=5)
    assert got == pytest.approx((p - 1) * (a + -(-n // p) * b), rel=1e-6)
    with pytest.raises(ValueError, match="runs as a ring"):
        simulate_collective(op, n, workers=p, algorithm="tree", bandwidth_gbps=10)


def busiest_server_bytes(wl, partition_bytes, servers):
    """Bytes of one worker's gradients on the busiest server under BytePS's hashing."""
    from ddpbench.rules.placement import byteps_parts

    load = [0] * servers
    for key, t in enumerate(wl.tensors):
        for p in byteps_parts(key, t.numel, partition_bytes // 4, servers):
            load[p.server] += p.count * 4
    return max(load)


@pytest.mark.parametrize("n,k", [(4, 2), (3, 1), (2, 4), (4, 4)])
def test_byteps_dedicated_servers_closed_form(n, k):
    wl = flat(25_000_000)
    m = wl.model_bytes
    r = simulate(wl, "byteps", workers=n, servers=k, bandwidth_gbps=10,
                 partition_bytes=200_000, summation_gbps=math.inf)
    # BytePS hashes partitions onto servers (djb2), so the busiest server bounds the time.
    # The bound is reached up to the moments when the workers' FIFO queues happen to
    # point at the same server.
    bound = max(m / B10, n * busiest_server_bytes(wl, 200_000, k) / B10)
    assert bound * (1 - 1e-9) <= r.iteration_time_s <= bound * 1.03
    assert r.bytes_sent["worker0"] == m
    assert sum(v for h, v in r.bytes_received.items() if h.startswith("server")) == n * m


@pytest.mark.parametrize("ov", [1, 2, 4, 8, 16])
def test_ring_allreduce_over_oversubscribed_racks_closed_form(ov):
    # 16 hosts in racks of 4: a ring sends one flow per rack link and direction, so the
    # rack link (4 B / ov) limits each step only when it is slower than one NIC.
    p, n, a = 16, 64 << 20, 5e-6
    bw = min(B10, 4 * B10 / ov)
    want = 2 * (p - 1) * a + 2 * (p - 1) / p * n / bw
    got = simulate_collective("allreduce", n, workers=p, bandwidth_gbps=10, latency_us=5,
                              oversubscription=ov, rack_size=4)
    assert got == pytest.approx(want, rel=1e-3)


@pytest.mark.parametrize("ov", [1, 2, 4])
def test_byteps_servers_in_another_rack_closed_form(ov):
    # n workers fill rack 0, k servers sit in rack 1: every push crosses rack 0's uplink and
    # every pull rack 1's, each n B / ov, so the bound becomes max(M/B, nM/(kB), ov M/B).
    n, k = 4, 2
    wl = flat(25_000_000)
    m = wl.model_bytes
    r = simulate(wl, "byteps", workers=n, servers=k, bandwidth_gbps=10, rack_size=n,
                 oversubscription=ov, partition_bytes=200_000, summation_gbps=math.inf)
    want = max(m / B10, n * busiest_server_bytes(wl, 200_000, k) / B10, ov * m / B10)
    assert r.iteration_time_s == pytest.approx(want, rel=0.01)
    assert r.bytes_sent["worker0"] == m


def test_oversubscription_is_validated():
    with pytest.raises(ValueError, match="oversubscription"):
        simulate("resnet50", "p3", workers=4, bandwidth_gbps=10, oversubscription=0.5)
    with pytest.raises(ValueError, match="rack_size"):
        simulate("resnet50", "p3", workers=4, bandwidth_gbps=10, oversubscription=2,
                 rack_size=0)


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_byteps_colocated_closed_form(n):
    wl = flat(25_000_000)
    m = wl.model_bytes
    r = simulate(wl, "byteps", workers=n, bandwidth_gbps=10, partition_bytes=200_000,
                 summation_gbps=math.inf)
    # Host h sends its pushes to the others (M - L_h) and the sums of what it serves to
    # n - 1 workers ((n - 1) L_h): M + (n - 2) L_h, 2 (n - 1) M / n when balanced.
    bound = (m + (n - 2) * busiest_server_bytes(wl, 200_000, n)) / B10
    assert bound * (1 - 1e-9) <= r.iteration_time_s <= bound * 1.03


@pytest.mark.parametrize("backend", ["horovod", "mpi", "collective"])
def test_allreduce_bytes_per_host(backend):
    wl, p = load_workload("resnet50"), 4
    r = simulate(wl, backend, workers=p, bandwidth_gbps=10)
    assert set(r.bytes_sent) == {f"worker{i}" for i in range(p)}
    for rank in range(p):
        sent = r.bytes_sent[f"worker{rank}"]
        assert sent == pytest.approx(2 * (p - 1) / p * wl.model_bytes, rel=1e-6)
        if backend != "horovod":  # one ring per tensor: the ring's chunking
            def chunk(n, i):
                return n // p + (1 if i < n % p else 0)
            exact = sum(4 * (2 * t.numel - chunk(t.numel, (rank + 1) % p)
                             - chunk(t.numel, (rank + 2) % p)) for t in wl.tensors)
            assert sent == exact


def test_colocated_ps_bytes_equal_ring_bytes_when_balanced():
    wl = flat(4 * 1_000_000, layers=4)
    r = simulate(wl, "p3", workers=4, bandwidth_gbps=10, slice_params=10_000)
    for h, v in r.bytes_sent.items():
        assert v == 2 * 3 / 4 * wl.model_bytes, h
