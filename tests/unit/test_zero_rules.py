"""The sharding rules of the ``zero``/``fsdp`` backends and their contract entries, without
MPI: partitions, buckets, knob defaults and errors (the multi-rank checks are in
tests/mpi/test_zero.py)."""

import re

import numpy as np
import pytest

from ddpbench import contract
from ddpbench.api import GATHER_BACKENDS, backend_class
from ddpbench.backends._common import split_counts
from ddpbench.backends.zero import _buckets, _Param, shard_counts


@pytest.mark.parametrize("n", [0, 1, 5, 7, 13, 64])
@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_reduce_scatter_counts_are_numpy_array_split_sizes(n, size):
    assert split_counts(n, size) == [len(c) for c in np.array_split(np.zeros(n), size)]


@pytest.mark.parametrize(("numel", "size", "counts"), [
    (10, 3, [4, 4, 2]), (4, 3, [2, 2, 0]), (1, 4, [1, 0, 0, 0]), (0, 2, [0, 0]),
    (12, 4, [3, 3, 3, 3]),
])
def test_shards_are_ceil_chunks_as_deepspeed_and_fsdp_cut_them(numel, size, counts):
    # ds_tensor / FlatParamHandle shards: ceil(numel / world) each, the last short or empty
    assert shard_counts(numel, size) == counts
    assert sum(counts) == numel


def _params(*sizes, dtype="float32"):
    return [_Param(i, (n,), np.dtype(dtype), n) for i, n in enumerate(sizes)]


def test_buckets_close_before_a_parameter_that_would_overflow_them():
    # DeepSpeed: elements_in_ipg_bucket + numel > reduce_bucket_size reduces the bucket
    # first; a parameter larger than the bucket goes alone
    assert list(_buckets(_params(30, 10, 5, 50, 200, 1), 40)) == [[0, 1], [2], [3], [4], [5]]
    assert list(_buckets(_params(10, 10, 10, 10), 40)) == [[0, 1, 2, 3]]
    assert list(_buckets(_params(), 40)) == []


def test_buckets_hold_one_dtype():
    ps = _params(3, 3) + [_Param("h", (3,), np.dtype("float16"), 3)] + _params(3)
    assert list(_buckets(ps, 100)) == [[0, 1], [2], [3]]


def test_defaults_are_deepspeeds_and_pytorchs():
    assert contract.defaults("zero") == {
        "stage": 0, "reduce_bucket_size": 500_000_000, "allgather_bucket_size": 500_000_000,
        "overlap_comm": None, "reduce_scatter": True, "prefetch_bucket_size": 50_000_000,
        "max_live_parameters": 1_000_000_000, "param_persistence_threshold": 100_000}
    assert contract.defaults("fsdp") == {
        "sharding_strategy": "FULL_SHARD", "backward_prefetch": "BACKWARD_PRE",
        "forward_prefetch": False, "limit_all_gathers": True, "wrap": "layer",
        "min_num_params": 100_000_000}
    # overlap_comm=None: DeepSpeed's validator makes it stage == 3
    assert [contract.ZeroKnobs(stage=s).overlap() for s in (0, 1, 2, 3)] == [False] * 3 + [True]
    assert contract.ZeroKnobs(stage=3, overlap_comm=False).overlap() is False
    assert set(contract.tunable("zero")) == {"stage", "reduce_bucket_size"}
    assert set(contract.tunable("fsdp")) == {"sharding_strategy"}


@pytest.mark.parametrize(("name", "knobs", "message"), [
    ("zero", {"stage": 4}, "knob 'stage' of backend 'zero' must be"),
    ("zero", {"reduce_bucket_size": 0}, "must be >= 1 elements, got 0"),
    ("fsdp", {"sharding_strategy": "FULL"}, "knob 'sharding_strategy' of backend 'fsdp'"),
    ("fsdp", {"ranks_per_host": 0}, "ranks_per_host"),
])
def test_bad_knobs_are_named(name, knobs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        contract.validate_knobs(name, knobs)


def test_both_backends_are_the_real_zero_engine_with_their_own_options():
    assert backend_class("zero").Options is contract.ZeroKnobs
    assert backend_class("fsdp").Options is contract.FsdpKnobs
    assert issubclass(backend_class("fsdp"), backend_class("zero"))
    for name in GATHER_BACKENDS:
        assert {"allgather", "reduce_scatter"} <= backend_class(name).capabilities


def test_readme_table_and_list_name_both():
    table = contract.markdown_table()
    assert "| `zero` | DeepSpeed's ZeRO stages 0-3" in table
    assert "| `fsdp` | PyTorch FSDP" in table
    assert "`sharding_strategy` `FULL_SHARD`" in table and "`stage` 0" in table
