"""Simulator: ZeRO and FSDP against closed forms, prefetch overlap, grids, units, memory."""

from __future__ import annotations

import math

import pytest

from ddpbench.simulator import simulate
from ddpbench.simulator.sharded import (
    Unit,
    fsdp_units,
    model_state_bytes,
)
from ddpbench.simulator.workload import Workload

B10 = 10e9 / 8  # bytes/s at 10 Gbit/s
A = 5e-6  # latency, s
S = 4  # bytes per element


def flat(numel: int, layers: int, fwd_ms: float = 0.0, bwd_ms: float = 0.0) -> Workload:
    """``layers`` layers of ``numel`` elements each (one tensor), ``fwd_ms``/``bwd_ms`` each."""
    return Workload.from_dict({"name": "flat", "batch_size": 1, "layers": [
        {"name": f"l{i}", "fwd_ms": fwd_ms, "bwd_ms": bwd_ms,
         "tensors": [{"name": f"t{i}", "numel": numel}]} for i in range(layers)]})


def half(p: int, n: int) -> float:
    """A ring reduce-scatter or all-gather of ``n`` elements over ``p`` ranks, one GPU per
    host on the ideal network: ``(p-1) (a + ceil(n/p) s / b)``."""
    return (p - 1) * (A + math.ceil(n / p) * S / B10)


def allreduce(p: int, n: int) -> float:
    return 2 * half(p, n)


def run(wl: Workload, backend: str, p: int, **knobs) -> float:
    return simulate(wl, backend, workers=p, bandwidth_gbps=10, latency_us=5, iterations=4,
                    warmup=1, **knobs).iteration_time_s


N, L = 1_000_003, 4


@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_full_shard_is_two_all_gathers_and_a_reduce_scatter_per_unit(p):
    assert run(flat(N, L), "fsdp", p) == pytest.approx(3 * L * half(p, N), rel=1e-9)


@pytest.mark.parametrize("p", [2, 3, 5])
def test_shard_grad_op_gathers_once(p):
    got = run(flat(N, L), "fsdp", p, sharding_strategy="SHARD_GRAD_OP")
    assert got == pytest.approx(2 * L * half(p, N), rel=1e-9)


@pytest.mark.parametrize("p", [2, 3, 4])
def test_no_shard_is_ddp_allreduce(p):
    wl = flat(N, L)
    got = run(wl, "fsdp", p, sharding_strategy="NO_SHARD")
    assert got == pytest.approx(L * allreduce(p, N), rel=1e-9)
    assert got == pytest.approx(run(wl, "mpi", p), rel=1e-9)


@pytest.mark.parametrize("p", [2, 3, 4])
def test_zero2_is_bucket_allreduce_then_parameter_all_gather(p):
    # DeepSpeed's average_tensor allreduces each bucket (multi-rank bucket allreduce), then
    # one all_gather_into_tensor of the flat group after the step
    wl = flat(N, L)
    one_bucket = run(wl, "zero", p, stage=2)
    assert one_bucket == pytest.approx(allreduce(p, L * N) + half(p, L * N), rel=1e-9)
    per_layer = run(wl, "zero", p, stage=2, reduce_bucket_size=N)
    assert per_layer == pytest.approx(L * allreduce(p, N) + half(p, L * N), rel=1e-9)
    assert run(wl, "zero", p, stage=1) == pytest.approx(one_bucket, rel=1e-9)


def test_zero0_is_bucketed_allreduce():
    assert run(flat(N, L), "zero", 3) == pytest.approx(allreduce(3, L * N), rel=1e-9)


@pytest.mark.parametrize("p", [2, 3, 4])
def test_zero3_gathers_each_layer_and_reduce_scatters_buckets(p):
    wl = flat(N, L)  # under stage3_max_reuse_distance: no layer is released before backward
    got = run(wl, "zero", p, stage=3)
    assert got == pytest.approx(L * half(p, N) + half(p, L * N), rel=1e-9)
    got = run(wl, "zero", p, stage=3, reduce_bucket_size=N)
    assert got == pytest.approx((L + L) * half(p, N), rel=1e-9)


def test_zero3_persistent_parameters_are_not_gathered():
    wl = flat(1000, L)  # under param_persistence_threshold (1e5): never partitioned
    assert run(wl, "zero", 3, stage=3) == pytest.approx(half(3, L * 1000), rel=1e-9)


def test_hybrid_shard_on_one_host_equals_full_shard():
    wl = flat(N, L)
    kw = dict(hosts=1, gpus_per_host=4, intra_link="nvlink", bandwidth_gbps=100)
    full = simulate(wl, "fsdp", **kw).iteration_time_s
    hybrid = simulate(wl, "fsdp", sharding_strategy="HYBRID_SHARD", **kw).iteration_time_s
    assert hybrid == pytest.approx(full, rel=1e-12)


def test_prefetch_hides_communication_behind_compute():
    # compute 50 ms a layer each way, a unit's collective ~3 ms: the step is the compute
    # plus the first all-gather and the last reduce-scatter, which nothing hides
    wl = flat(N, L, fwd_ms=50, bwd_ms=50)
    c = half(4, N)
    compute = 2 * L * 0.05
    got = run(wl, "fsdp", 4)
    assert got == pytest.approx(compute + 2 * c, rel=1e-9)
    assert run(wl, "zero", 4, stage=3) == pytest.approx(compute + c + half(4, L * N), rel=1e-9)
    # without backward prefetch each unit's all-gather waits behind the previous unit's
    # reduce-scatter, which waits for that unit's gradients: exposed in every unit
    none = run(wl, "fsdp", 4, backward_prefetch="none")
    assert none == pytest.approx(compute + 2 * c + (L - 1) * 2 * c, rel=1e-9)


@pytest.mark.parametrize("hosts", [1, 2, 3, 4])
@pytest.mark.parametrize("gpus", [1, 2, 3, 8])
@pytest.mark.parametrize("backend,knobs", [
    ("fsdp", {}), ("fsdp", {"sharding_strategy": "HYBRID_SHARD"}),
    ("fsdp", {"sharding_strategy": "SHARD_GRAD_OP", "backward_prefetch": "BACKWARD_POST"}),
    ("fsdp", {"sharding_strategy": "NO_SHARD"}), ("fsdp", {"wrap": "size", "min_num_params": 2 * N}),
    ("fsdp", {"limit_all_gathers": False, "forward_prefetch": True}),
    ("zero", {"stage": 1}), ("zero", {"stage": 2, "reduce_bucket_size": N}),
    ("zero", {"stage": 3, "prefetch_bucket_size": 0}),
    ("zero", {"stage": 3, "overlap_comm": False, "reduce_bucket_size": N})])
def test_grids_finish_and_count_bytes(hosts, gpus, backend, knobs):
    wl = flat(N, L, fwd_ms=1, bwd_ms=2)
    r = simulate(wl, backend, hosts=hosts, gpus_per_host=gpus, bandwidth_gbps=100,
                 intra_link="nvlink", iterations=3, **knobs)
    compute = L * 0.003
    assert r.iteration_time_s >= compute - 1e-12
    p = hosts * gpus
    if backend == "fsdp" and not knobs and hosts > 1:
        assert r.bytes_sent["host0" if gpus > 1 else "worker0"] == pytest.approx(
            3 * (p - 1) / p * L * N * S, rel=1e-9)
    if p == 1:
        assert r.iteration_time_s == pytest.approx(compute, rel=1e-9)


def test_fsdp_units_follow_the_wrap_policy():
    numel = [10, 0, 30, 60, 5]
    assert [u.layers for u in fsdp_units(numel, "layer", 1)] == [(0,), (2,), (3,), (4,)]
    assert fsdp_units(numel, "size", 40) == [Unit(0, (0, 2), 40, 40), Unit(1, (3,), 60, 60),
                                             Unit(2, (4,), 5, 5)]
    with pytest.raises(ValueError, match="wrap"):
        fsdp_units(numel, "block", 1)


def test_model_state_bytes_follow_the_zero_paper():
    psi, n = 1_000_000, 8  # ZeRO paper, section 3: 2 + 2 + 12 bytes per parameter
    assert model_state_bytes(psi, n, "zero", {"stage": 0}) == 16 * psi
    assert model_state_bytes(psi, n, "zero", {"stage": 1}) == 4 * psi + 12 * psi / n
    assert model_state_bytes(psi, n, "zero", {"stage": 2}) == 2 * psi + 14 * psi / n
    assert model_state_bytes(psi, n, "zero", {"stage": 3}) == 16 * psi / n
    assert model_state_bytes(psi, n, "fsdp", {}) == 16 * psi / n
    assert model_state_bytes(psi, n, "fsdp", {"sharding_strategy": "HYBRID_SHARD"},
                             gpus_per_host=4) == 16 * psi / 4
    assert model_state_bytes(psi, n, "horovod", {}) == 16 * psi


@pytest.mark.parametrize("backend,knobs", [("fsdp", {}), ("zero", {"stage": 3}),
                                           ("fsdp", {"sharding_strategy": "HYBRID_SHARD"})])
def test_jittered_gpus_wait_at_the_gates_too(backend, knobs):
    # with jitter every GPU has its own clock; a unit starts when the slowest reached it
    wl = flat(N, L, fwd_ms=5, bwd_ms=10)
    kw = dict(hosts=2, gpus_per_host=4, bandwidth_gbps=100, intra_link="nvlink",
              iterations=4, **knobs)
    calm = simulate(wl, backend, **kw).iteration_time_s
    jittered = simulate(wl, backend, jitter=0.2, seed=1, **kw).iteration_time_s
    assert jittered > calm  # the slowest GPU of each layer sets the pace
    assert jittered < 3 * calm


def test_overlap_slowdown_stretches_compute_beside_collectives():
    wl = flat(N, L, fwd_ms=50, bwd_ms=50)
    free = run(wl, "fsdp", 4)
    slowed = run(wl, "fsdp", 4, overlap_slowdown=0.5)
    comm = (3 * L) * half(4, N)
    assert free < slowed <= free + 0.5 * comm + 1e-12


def test_the_estimate_counts_the_collectives():
    from ddpbench.simulator.estimate import estimate

    wl = flat(N, 6, fwd_ms=1, bwd_ms=2)
    for backend, knobs in [("fsdp", {}), ("fsdp", {"sharding_strategy": "NO_SHARD"}),
                           ("zero", {"stage": 2, "reduce_bucket_size": N}),
                           ("zero", {"stage": 3})]:
        kw = dict(hosts=4, gpus_per_host=2, bandwidth_gbps=100, iterations=3, **knobs)
        got = simulate(wl, backend, **kw).events
        assert 0.5 < estimate(wl, backend, **kw).events / got < 2, (backend, knobs)


def _llama7b() -> Workload:
    """The stand-in Llama-7B of tools/standin_llama7b.py: 32 blocks of 9 tensors."""
    d, ff, v = 4096, 11008, 32000
    block = [d * d] * 4 + [d * ff] * 3 + [d, d]
    layers = [{"name": "embed", "fwd_ms": 0.5, "bwd_ms": 1,
               "tensors": [{"name": "embed", "numel": v * d}]}]
    layers += [{"name": f"b{i}", "fwd_ms": 10, "bwd_ms": 20,
                "tensors": [{"name": f"b{i}.{j}", "numel": n} for j, n in enumerate(block)]}
               for i in range(32)]
    layers += [{"name": "norm", "fwd_ms": 0.1, "bwd_ms": 0.2,
                "tensors": [{"name": "norm", "numel": d}]},
               {"name": "head", "fwd_ms": 2, "bwd_ms": 4,
                "tensors": [{"name": "head", "numel": v * d}]}]
    return Workload.from_dict({"name": "llama7b", "batch_size": 4, "device": "H100",
                               "matmul_fraction": 0.9, "layers": layers})


def test_llama7b_full_shard_on_128_hosts_of_8_h100_is_one_event_per_collective():
    wl = _llama7b()
    assert wl.total_params == 6_738_415_616
    r = simulate(wl, "fsdp", hosts=128, gpus_per_host=8, device="H100", intra_link="nvlink",
                 transport="rdma", bandwidth_gbps=400)
    p = 1024
    assert r.bytes_sent["host0"] == pytest.approx(3 * (p - 1) / p * wl.total_params * S,
                                                  rel=1e-9)
    assert r.events == 1380  # pinned: a speed-up that drops work fails here
    compute = sum(x.fwd_s + x.bwd_s for x in wl.layers)
    assert r.iteration_time_s > compute
