"""Sharded data parallelism on 1-4 ranks: allgather and reduce_scatter on every backend that
has them against NumPy references, and the ``zero``/``fsdp`` engines against one process on
the whole batch; the real-mode worker's gathers and reductions on both."""

import json

import pytest
from conftest import gpu_or_skip
from mpiutil import REPO, SCRIPTS, results, run_mpi

pytestmark = pytest.mark.mpi

GATHERING = ["mpi", "horovod", "collective", "zero", "fsdp"]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_allgather_and_reduce_scatter_match_numpy_on_every_backend_that_has_them(n):
    # uneven rows per rank (rank r sends r + 1), sizes not divisible by the ranks, 0 and
    # 0-d, four dtypes, sum/average/max/min
    out = run_mpi(n, SCRIPTS / "zero_check.py", "collectives", timeout=300)
    done = {r["backend"]: r["checks"] for r in results(out, "collectives", size=n)}
    assert sorted(done) == sorted(GATHERING), out[-3000:]
    assert set(done.values()) == {139}
    missing = results(out, "missing")
    assert sorted(r["backend"] for r in missing) == ["byteps"] * 2 + ["kvstore"] * 2 + ["p3"] * 2
    assert all("use one of the backends that have it: ['mpi', 'horovod'" in r["message"]
               for r in missing)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_every_stage_and_strategy_on_n_ranks_equals_one_process_on_the_whole_batch(n):
    out = run_mpi(n, SCRIPTS / "zero_check.py", "train", timeout=300)
    rows = results(out, "train", size=n)
    # 13 configurations (+ HYBRID_SHARD over 2-rank hosts, by knob and by environment,
    # and over 1-rank hosts) x 2 optimizers
    expected = 13 + 2 * (n % 2 == 0) + (n > 1)
    assert len(rows) == 2 * expected, out[-3000:]
    # each equals one process on the whole batch, and DDP (mpi's allreduce, a local step)
    assert all(r["max_abs_diff"] < 1e-5 and r["diff_to_ddp"] < 1e-5 for r in rows)
    by = {(r["backend"], tuple(sorted(r["knobs"].items())), r["momentum"]): r for r in rows}
    stage2 = by[("zero", (("stage", 2),), 0.9)]
    stage3 = by[("zero", (("param_persistence_threshold", 0), ("prefetch_bucket_size", 20),
                          ("reduce_bucket_size", 40), ("stage", 3)), 0.9)]
    total = 7 * 11 + 11 + 11 * 5 + 5  # the MLP's parameters
    # stage 2: one allreduce of the whole bucket (DeepSpeed's default multi-rank bucket
    # allreduce, no reduce-scatter) and one all-gather per step; this rank owns its
    # ceil(total / n) partition of the flat group
    assert stage2["stats"]["reduce_scatter"] == 0 and stage2["stats"]["allgather"] == 6
    assert stage2["stats"]["allreduce"] == (6 if n > 1 else 0)  # one rank: nothing to send
    assert stage2["shard_elements"] == min(-(-total // n), total)
    # stage 3 with 40-element gradient buckets: w1 (77), b1, w2 (55), b2 one bucket each;
    # gathers in 20-element prefetch buckets: 4 per gather, 7 gathers
    assert stage3["stats"]["reduce_scatter"] == 24 and stage3["stats"]["allgather"] == 28
    if n % 2 == 0:  # two hosts of 2 ranks (n = 4) or one (n = 2): shards across them too
        by_env = by[("fsdp", (("_env", "2"), ("sharding_strategy", "HYBRID_SHARD")), 0.9)]
        by_knob = by[("fsdp", (("ranks_per_host", 2), ("sharding_strategy", "HYBRID_SHARD")),
                      0.9)]
        assert by_env["stats"] == by_knob["stats"]
        assert (by_knob["stats"]["allreduce"] > 0) == (n == 4)
    # the default threshold (1e5 elements) keeps every parameter of this MLP whole
    persistent = by[("zero", (("stage", 3),), 0.9)]
    assert persistent["shard_elements"] == 0 and persistent["stats"]["reduce_scatter"] == 0


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_torch_fully_sharded_data_parallel_on_n_ranks_equals_one_process(n):
    pytest.importorskip("torch")
    out = run_mpi(n, SCRIPTS / "torch_sharded_check.py", timeout=300)
    rows = results(out, "torch_sharded", size=n)
    assert len(rows) == 17, out[-3000:]
    assert all(r["max_abs_diff"] < 1e-5 for r in rows)
    by = {(r["backend"], tuple(sorted(r["knobs"].items()))): r["stats"] for r in rows}
    # units: Linear(7, 11) 88, Linear(11, 9) 108, Linear(9, 5) 50 elements; 8 steps and a
    # final gather_parameters
    full = by[("fsdp", ())]
    # FULL_SHARD: every unit gathered before its forward, freed after it, gathered again
    # before its backward (BACKWARD_PRE: with the next unit in backward order, so the
    # first two of backward go in one call) and freed after it: 8 x (3 + 2) + 3 calls,
    # 8 x 6 + 3 unit gathers of two tensors each
    assert full["gathers"] == 43 and full["allgather"] == 102 and full["reduce_scatter"] == 48
    assert full["freed_after_forward"] == full["freed_after_backward"] == 24
    assert full["max_live_elements"] == 108 + 88  # the current unit and the prefetched one
    assert by[("fsdp", (("forward_prefetch", True),))]["gathers"] == 8 * (2 + 2) + 2
    none = by[("fsdp", (("backward_prefetch", "none"),))]
    assert none["gathers"] == 51 and none["max_live_elements"] == 108  # one unit at a time
    post = by[("fsdp", (("backward_prefetch", "BACKWARD_POST"),))]
    assert post["gathers"] == 51 and post["max_live_elements"] == 108 + 88
    # ZeRO-3 at the default prefetch bucket (5e7) and max_live_parameters (1e9): the whole
    # model in one all-gather before the first forward, kept until the step
    zero3 = by[("zero", (("param_persistence_threshold", 0), ("stage", 3)))]
    assert zero3["allgather"] == 9 and zero3["freed_after_forward"] == 0
    # max_live_parameters 100: a unit is released after its forward and backward while
    # more than 100 elements are gathered
    tight = by[("zero", (("max_live_parameters", 100), ("param_persistence_threshold", 0),
                         ("prefetch_bucket_size", 100), ("stage", 3)))]
    assert tight["freed_after_forward"] == tight["freed_after_backward"] == 16
    # gradients reduced from the backward hooks in 100-element buckets (backward order:
    # 50, then 108 overflows it: [50] goes, [108] is full and goes, [88] at the step) at
    # stage 2 (DeepSpeed's partition_gradients) and with overlap_comm (asynchronously);
    # stage 1 without overlap_comm reduces everything after backward in one call
    for knobs in ((("reduce_bucket_size", 100), ("stage", 2)),
                  (("overlap_comm", True), ("reduce_bucket_size", 100), ("stage", 1))):
        assert by[("zero", knobs)]["reductions"] == 24
        # each bucket allreduced whole (DeepSpeed's multi-rank bucket allreduce)
        assert by[("zero", knobs)]["reduce_scatter"] == 0
    assert by[("zero", (("reduce_bucket_size", 100), ("stage", 1)))]["reductions"] == 8
    # FSDP reduces every unit at the end of its backward: 3 a step
    assert full["reductions"] == 24


@pytest.mark.gpu
def test_cupy_arrays_go_through_the_sharding_stores_staged_on_the_host():
    gpu_or_skip()
    out = run_mpi(2, SCRIPTS / "zero_check.py", "gpu", timeout=180)
    assert len(results(out, "gpu", size=2)) == 3, out[-3000:]


@pytest.mark.parametrize("n", [2, 3])
def test_ranks_that_disagree_get_one_error_on_every_rank(n):
    out = run_mpi(n, SCRIPTS / "zero_check.py", "mismatch", timeout=120)
    rows = results(out, "mismatch")
    assert sorted(r["backend"] for r in rows) == ["fsdp", "zero"], out[-3000:]
    assert all("Mismatched shape for ('a',): rank 0 sent (4,), rank 1 sent (5,)" in r["message"]
               for r in rows)


def _sharded_phases(n: int, backend: str, phases: list[dict]) -> list[dict]:
    """The real-mode worker on ``n`` ranks: ResNet-50's tensors / 1000, no compute, one
    warm-up and two timed steps per phase; each phase's result."""
    then = json.dumps([{"knobs": k} for k in phases[1:]])
    out = run_mpi(n, REPO / "ddpbench" / "emulation.py", "--workload", "resnet50",
                  "--backend", backend, "--knobs", json.dumps(phases[0]), "--size-scale",
                  "0.001", "--compute-scale", "0", "--iterations", "2", "--then", then,
                  timeout=300)
    rows = [json.loads(line) for line in out.splitlines() if line.startswith('{"workload"')]
    assert len(rows) == 1, out[-3000:]
    return rows[0]["phases"]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_real_mode_worker_gathers_and_reduces_as_fsdp_and_zero_do(n):
    # the worker checks every gathered unit and every kept parameter against
    # t (W + 1) / 2 after t steps; here the calls the front end made, in closed form
    from ddpbench.simulator.workload import load_workload

    w = load_workload("resnet50").resized(0.001)
    units, elements, steps = len({t.layer for t in w.tensors}), sum(t.numel for t in w.tensors), 3
    full, grad_op, no_shard, hybrid = _sharded_phases(n, "fsdp", [
        {}, {"sharding_strategy": "SHARD_GRAD_OP"}, {"sharding_strategy": "NO_SHARD"},
        {"sharding_strategy": "HYBRID_SHARD", "ranks_per_host": 1}])
    for ph in (full, grad_op, no_shard, hybrid):
        assert len(ph["iteration_times_s"]) == 2 and ph["workers"] == n
        assert ph["collectives"]["reductions"] == units * steps  # one per unit's backward
    # FULL_SHARD: each unit gathered before its forward and again before its backward
    # (BACKWARD_PRE: the first two of backward in one call), freed after each
    c = full["collectives"]
    assert c["allgather"] == 2 * units * steps and c["gathers"] == (2 * units - 1) * steps
    assert c["gathered_elements"] == 2 * elements * steps
    assert c["freed_after_forward"] == c["freed_after_backward"] == units * steps
    assert c["reduce_scatter"] == units * steps and c["allreduce"] == 0
    # SHARD_GRAD_OP keeps the parameters from forward to backward: one all-gather a unit
    c = grad_op["collectives"]
    assert c["allgather"] == units * steps and c["gathers"] == 0
    c = no_shard["collectives"]
    assert c["allgather"] == c["reduce_scatter"] == 0
    assert c["allreduce"] == (units * steps if n > 1 else 0)
    # HYBRID_SHARD over hosts of one rank: the shards allreduced across them
    assert hybrid["collectives"]["allreduce"] == (units * steps if n > 1 else 0)
    zero3, zero1 = _sharded_phases(n, "zero", [
        {"stage": 3, "param_persistence_threshold": 0, "prefetch_bucket_size": 2000},
        {"stage": 1}])
    # ZeRO-3 keeps what it gathered (max_live_parameters, 1e9) until the step
    c = zero3["collectives"]
    assert c["gathered_elements"] == elements * steps and c["freed_after_forward"] == 0
    assert c["max_live_elements"] == elements
    # stage 1: every bucket (5e8 elements: the whole model) allreduced at the step, the
    # updated partitions all-gathered; the front end gathers nothing
    c = zero1["collectives"]
    assert c["gathers"] == 0 and c["reductions"] == steps
