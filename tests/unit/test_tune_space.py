"""The search space of ``ddpbench tune``: built from the contract, pruned, narrowed, checked."""

from __future__ import annotations

import math

import pytest

from ddpbench import contract
from ddpbench.tune.space import build_space, parse_assignments, parse_value

ONE_GPU = contract.Cluster(hosts=4, gpus_per_host=1)
EIGHT_GPUS = contract.Cluster(hosts=2, gpus_per_host=8)


def test_every_tunable_knob_is_simulated_with_its_default_inside_its_range():
    for name in contract.BACKENDS:
        info = contract.knob_info(name)
        for knob, spec in contract.tunable(name).items():
            assert info[knob]["side"] in ("both", "sim"), (name, knob)
            assert spec["source"], (name, knob)
            if spec["kind"] in ("bool", "categorical"):
                assert spec["default"] in spec["choices"]
            else:
                assert spec["low"] <= spec["default"] <= spec["high"], (name, knob)
                for v in (spec["low"], spec["high"]):  # the range lies inside the bounds
                    contract.validate_knobs(name, {knob: v}, side="sim")
            for other, value in spec["when"].items():
                assert value in contract.tunable(name)[other]["choices"]


def test_real_only_knobs_cannot_be_tuned():
    with pytest.raises(ValueError, match="only real runs"):
        contract.knob(1, doc="x", side="real", tune=(1, 2, "log"))
    with pytest.raises(ValueError, match="low > 0"):
        contract.knob(1, doc="x", tune=(0, 2, "log"))
    for name in contract.BACKENDS:
        assert "check_consistency" not in contract.tunable(name)
        assert "gpu_transport" not in contract.tunable(name)


def test_the_space_follows_the_contract_and_the_cluster():
    s = build_space(list(contract.BACKENDS), EIGHT_GPUS)
    assert s.backends == tuple(contract.BACKENDS)
    assert [p.knob for p in s.of("horovod")] == ["fusion_threshold", "cycle_time",
                                                 "hierarchical", "compression",
                                                 "gradient_predivide_factor"]
    assert s.of("mpi") == []
    sched = next(p for p in s.of("byteps") if p.knob == "scheduler")
    assert sched.choices == ("byteps", "credit", "window")
    credit = next(p for p in s.of("byteps") if p.knob == "credit_params")
    assert credit.when == {"scheduler": "credit"}
    assert credit.name == "byteps.credit_params"
    # one GPU per host: hierarchical cannot change anything, and says so
    s1 = build_space(["horovod"], ONE_GPU)
    assert [p.knob for p in s1.params] == ["fusion_threshold", "cycle_time", "compression",
                                           "gradient_predivide_factor"]
    assert s1.dropped[0][:2] == ("horovod", "hierarchical")
    assert "hierarchical" in s1.describe() and "not searched" in s1.describe()
    # BytePS on one worker machine never pushes: nothing of it to search
    assert build_space(["byteps"], contract.Cluster(hosts=1, gpus_per_host=4)).empty


def test_compression_and_predivide_are_searched_where_the_original_offers_them():
    s = build_space(list(contract.BACKENDS), EIGHT_GPUS)
    assert [b for b in s.backends if any(p.knob == "compression" for p in s.of(b))] == [
        "horovod", "byteps"]
    comp = next(p for p in s.of("horovod") if p.knob == "compression")
    assert comp.choices == ("none", "fp16") and "horovod/torch/compression.py" in comp.source
    assert "byteps/torch/compression.py" in next(
        p for p in s.of("byteps") if p.knob == "compression").source
    # the predivide factor splits the 1/size average: 1 (all after) to the world size
    f = next(p for p in s.of("horovod") if p.knob == "gradient_predivide_factor")
    assert (f.low, f.high, f.scale) == (1.0, 16.0, "log")
    assert f.when == {"compression": "fp16"}  # fp32 sums: it changes neither time nor range
    assert "horovod/torch/optimizer.py" in f.source
    assert not any(p.knob == "gradient_predivide_factor" for p in s.of("byteps"))
    # under mixed precision every sum is float16: no cast to search, the factor always
    mixed = build_space(["horovod", "byteps"], EIGHT_GPUS,
                        schedule=contract.Schedule(precision="mixed"))
    assert [k for b, k, _ in mixed.dropped] == ["compression", "compression"]
    f = next(p for p in mixed.of("horovod") if p.knob == "gradient_predivide_factor")
    assert f.when == {}
    # so under bf16 (and fp16, fp8): the gradients travel in 16 bits already
    for precision in ("bf16", "fp16", "fp8"):
        half = build_space(["horovod", "byteps"], EIGHT_GPUS,
                           schedule=contract.Schedule(precision=precision))
        assert [k for b, k, _ in half.dropped] == ["compression", "compression"]
    tf32 = build_space(["horovod"], EIGHT_GPUS, schedule=contract.Schedule(precision="tf32"))
    assert "compression" not in [k for _, k, _ in tf32.dropped]
    # one worker sums nothing
    one = build_space(["horovod"], contract.Cluster(workers=1))
    assert ("horovod", "gradient_predivide_factor", "one worker sums nothing") in one.dropped


def test_dedicated_servers_make_placement_a_parameter():
    s = build_space(["p3", "horovod"], contract.Cluster(hosts=4, servers=4))
    servers = next(p for p in s.of("p3") if p.knob == "servers")
    assert servers.choices == ("colocated", 1, 2, 4) and servers.default == 4
    assert all(p.knob != "servers" for p in s.of("horovod"))
    assert all(p.knob != "servers" for p in build_space(["p3"], ONE_GPU).params)


def test_defaults_are_a_configuration_of_the_space():
    s = build_space(["byteps", "horovod", "mpi"], EIGHT_GPUS)
    assert s.default_params("mpi") == {"backend": "mpi"}
    d = s.default_params("byteps")
    # the credit knobs are conditional: at the default scheduler they are not set
    assert d == {"backend": "byteps", "byteps.partition_bytes": 4_096_000,
                 "byteps.scheduler": "byteps", "byteps.compression": "none"}
    assert s.knobs_of(d) == ("byteps", {"partition_bytes": 4_096_000, "scheduler": "byteps",
                                        "compression": "none"})
    # the predivide factor is conditional on fp16: Horovod's default does not set it
    assert "horovod.gradient_predivide_factor" not in s.default_params("horovod")


def test_fix_holds_a_knob_for_every_backend_that_has_it_or_for_one():
    s = build_space(["horovod", "p3"], EIGHT_GPUS,
                    fix=["fusion_threshold=33554432", "p3.slice_params=80000"])
    assert "horovod.fusion_threshold" not in [p.name for p in s.params]
    assert s.fixed["horovod"] == {"fusion_threshold": 33554432}
    assert s.fixed["p3"] == {"slice_params": 80000}
    assert s.default_params("horovod")["horovod.cycle_time"] == 1.0
    assert s.knobs_of({"backend": "p3", "p3.send_hwm": 2}) == (
        "p3", {"slice_params": 80000, "send_hwm": 2})
    # a knob the simulator honours but tune does not search can be fixed too
    s = build_space(["horovod"], EIGHT_GPUS, fix=["coordinator=gather"])
    assert s.fixed["horovod"] == {"coordinator": "gather"}


@pytest.mark.parametrize("fix, message", [
    (["nosuch=1"], r"unknown knob 'nosuch'.*valid knobs: \{'horovod': \['fusion_threshold'"),
    (["horovod.slice_params=5"], r"unknown knob 'slice_params' for backend 'horovod'"),
    (["kvstore.bigarray_bound=5"], r"backend 'kvstore' is not searched"),
    (["tf.x=1"], r"unknown backend 'tf'"),
    (["fusion_threshold=-1"], r"fusion_threshold.*>= 0 bytes, got -1"),
    (["gpu_transport=host"], r"only applies to real runs"),
    (["fusion_threshold"], r"expects KNOB=VALUE"),
])
def test_fix_errors_name_the_knob_and_what_is_valid(fix, message):
    with pytest.raises(ValueError, match=message):
        build_space(["horovod", "p3"], EIGHT_GPUS, fix=fix)


def test_range_narrows_a_number_or_a_choice():
    s = build_space(["horovod", "byteps"], EIGHT_GPUS,
                    ranges=["cycle_time=2:10", "byteps.scheduler=byteps,window",
                            "fusion_threshold=1048576:4194304"])
    cycle = next(p for p in s.params if p.knob == "cycle_time")
    assert (cycle.low, cycle.high) == (2.0, 10.0)
    fusion = next(p for p in s.params if p.knob == "fusion_threshold")
    assert (fusion.low, fusion.high) == (1048576, 4194304)
    assert next(p for p in s.params if p.knob == "scheduler").choices == ("byteps", "window")


@pytest.mark.parametrize("ranges, message", [
    (["nrings=0:4"], r"outside the knob's bounds.*nrings.*>= 1, got 0"),
    (["nrings=2:100"], r"outside the knob's bounds.*nrings.*<= 64, got 100"),
    (["cycle_time=5:5"], r"the range is empty"),
    (["cycle_time=5"], r"expected LOW:HIGH"),
    (["nrings=1.5:4"], r"takes integers"),
    (["scheduler=fifo"], r"choices must come from \['byteps', 'credit', 'window'\]"),
    (["nosuch=1:2"], r"unknown knob 'nosuch'"),
    (["hierarchical=true"], r"not searched here \(needs several hosts"),
    (["coordinator=cache"], r"not a tunable knob"),
])
def test_range_errors(ranges, message):
    with pytest.raises(ValueError, match=message):
        build_space(["horovod", "byteps", "collective"], ONE_GPU, ranges=ranges)


def test_a_range_on_a_fixed_knob_says_it_is_fixed():
    with pytest.raises(ValueError, match=r"fixed by --fix"):
        build_space(["p3"], ONE_GPU, fix=["slice_params=1000"], ranges=["slice_params=1:9"])


def test_empty_or_unknown_backends_are_refused():
    with pytest.raises(ValueError, match="--backends is empty"):
        build_space([], ONE_GPU)
    with pytest.raises(ValueError, match=r"unknown backend 'nccl'; available"):
        build_space(["nccl"], ONE_GPU)


def test_every_fixed_knob_leaves_only_the_defaults():
    s = build_space(["collective", "mpi"], ONE_GPU, fix=["nrings=4"])
    assert s.empty and s.default_params("collective") == {"backend": "collective"}
    assert "its default configuration only" in s.describe()


def test_values_parse_as_simulate_reads_them():
    assert [parse_value(t) for t in ("true", "3", "2.5", "window")] == [True, 3, 2.5, "window"]
    assert parse_assignments(["p3.slice_params=5", "nrings=2"], "--fix") == [
        ("p3", "slice_params", "5"), (None, "nrings", "2")]


def test_the_space_records_log_scales_for_tune_json():
    d = build_space(["horovod"], ONE_GPU).to_dict()
    assert d["horovod.fusion_threshold"]["log"] is True
    assert d["horovod.fusion_threshold"]["low"] == 1 << 20
    assert math.isclose(d["horovod.cycle_time"]["high"], 100.0)


def test_originals_only_leaves_out_ddpbenchs_own_mechanisms():
    s = build_space(["p3", "byteps"], ONE_GPU, originals_only=True)
    assert "p3.water_mark" not in [p.name for p in s.params]
    assert next(p for p in s.params if p.knob == "scheduler").choices == ("byteps",)
    # credit_bytes is only searched under the 'window' scheduler, which is gone
    assert ("byteps", "credit_bytes") in [(b, k) for b, k, _ in s.dropped]
    full = build_space(["p3", "byteps"], ONE_GPU)
    assert full.own("byteps", {"scheduler": "window"}) == ["scheduler=window"]
    assert full.own("p3", {"water_mark": 0, "slice_params": 1}) == []
    assert full.own("p3", {"water_mark": 4}) == ["water_mark=4"]
    for name in contract.BACKENDS:  # every default is the original's
        for knob, spec in contract.tunable(name).items():
            assert spec["default"] in spec.get("original", [spec["default"]]), (name, knob)


def test_a_fixed_or_narrowed_condition_drops_its_conditional_knobs():
    s = build_space(["byteps"], ONE_GPU, fix=["scheduler=byteps"])
    assert [p.knob for p in s.params] == ["partition_bytes", "compression"]
    s = build_space(["byteps"], ONE_GPU, ranges=["scheduler=window"])
    assert [p.knob for p in s.params] == ["partition_bytes", "scheduler", "credit_bytes",
                                          "compression"]
    s = build_space(["horovod"], ONE_GPU, fix=["compression=none"])
    assert ("horovod", "gradient_predivide_factor") in [(b, k) for b, k, _ in s.dropped]


def test_the_bench_grid_is_two_backends_of_two_knobs_of_five_values_in_range():
    from ddpbench.benchmarks.tune import GRID, _grid_points

    points = _grid_points()
    assert len(points) == 2 * 5 * 5 and {b for b, _ in points} == set(GRID)
    for backend, knobs in points:
        spec = contract.tunable(backend)
        for knob in GRID[backend]:
            assert spec[knob]["low"] <= knobs[knob] <= spec[knob]["high"]
        contract.validate_knobs(backend, knobs, side="sim")


def test_sharded_schemes_are_searched_beside_the_allreduce_ones():
    s = build_space(["horovod", "zero", "fsdp"], EIGHT_GPUS)
    assert s.backends == ("horovod", "zero", "fsdp")
    zero = {p.knob: p for p in s.of("zero")}
    assert zero["stage"].choices == (0, 1, 2, 3)
    assert "reduce_bucket_size" in zero
    assert s.of("fsdp")[0].knob == "sharding_strategy"
    assert set(s.of("fsdp")[0].choices) == {"FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD",
                                            "NO_SHARD"}
    assert "zero" in build_space(list(contract.BACKENDS), EIGHT_GPUS).backends
