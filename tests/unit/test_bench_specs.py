"""``--backends`` specs of the benches: several knobs per backend, clear errors."""

import pytest

from ddpbench.backends.horovod import _bits, _from_words, _to_words
from ddpbench.benchmarks.allreduce import _backend_spec, check_backend_specs
from ddpbench.cli import UsageError


def test_spec_takes_several_knobs_json_or_text():
    assert _backend_spec("horovod:cycle_time=0:idle=wait:algorithm=ring") == (
        "horovod:cycle_time=0:idle=wait:algorithm=ring", "horovod",
        {"cycle_time": 0, "idle": "wait", "algorithm": "ring"})
    assert _backend_spec("mpi")[2] == {}
    assert _backend_spec("mpi:check_consistency=false")[2] == {"check_consistency": False}


@pytest.mark.parametrize("spec, words", [
    ("horovod:idl=wait", "unknown option 'idl'"),
    ("horovod:idle=sleep", "'idle'='sleep' is invalid"),
    ("horovod:cycle_time=-1", "'cycle_time'=-1 is invalid"),
    ("nosuch", "nosuch"),
])
def test_bad_spec_is_a_usage_error_naming_it(spec, words):
    with pytest.raises(UsageError) as err:
        check_backend_specs(["mpi", spec])
    assert spec in str(err.value) and words in str(err.value)


@pytest.mark.parametrize("bits, nbits", [(set(), 3), ({0, 2}, 3), ({0, 63, 64, 200}, 201)])
def test_cache_bit_vector_round_trip(bits, nbits):
    value = sum(1 << b for b in bits)
    words = _to_words(value, nbits)
    assert words.dtype.name == "uint64" and words.size == -(-nbits // 64)
    assert _from_words(words) == value and _bits(value) == sorted(bits)


@pytest.mark.parametrize("bench, argv, words", [
    ("pushpull", ["--size", "abc"], "size 'abc' is not a number"),
    ("pushpull", ["--size", "4K,2"], "need --size >= 4 bytes"),
    ("sim", ["--bandwidth-gbps", "-1"], "--bandwidth-gbps must be a finite number > 0, got -1"),
    ("sim", ["--bandwidth-gbps", "nan"], "--bandwidth-gbps must be a finite number > 0, got nan"),
    ("sim", ["--iterations", "1"], "--iterations must be >= 2"),
    ("allreduce", ["--sizes", "0"], "every size must hold at least one float32 element (4 bytes)"),
    ("allreduce", ["--sizes", "4K,2"], "every size must hold at least one float32 element"),
    ("allreduce", ["--sizes", "1", "--dtype", "float64"], "at least one float64 element (8 bytes)"),
    ("allreduce", ["--sizes", ","], "every size must hold"),
    ("allreduce", ["--tensors", "resnet50", "--scale", "0"],
     "--scale must be a finite number > 0, got 0"),
    ("allreduce", ["--tensors", "resnet50", "--scale", "nan"], "--scale must be a finite number > 0"),
    ("allreduce", ["--inflight", "0"], "--inflight must be >= 1"),
    ("allreduce", ["--inflight", "2", "--tensors", "resnet50"], "not --tensors"),
])
def test_a_bench_setting_out_of_range_is_a_usage_error(bench, argv, words):
    import argparse
    import importlib

    module = importlib.import_module(f"ddpbench.benchmarks.{bench}")
    parser = argparse.ArgumentParser()
    module.configure(parser)
    with pytest.raises(UsageError) as err:
        module.main(parser.parse_args(argv))
    assert words in str(err.value)


@pytest.mark.parametrize("factor", [1, 0, -2])
def test_a_size_range_that_would_not_grow_is_refused(factor):
    from ddpbench.benchmarks.allreduce import parse_sizes

    with pytest.raises(ValueError, match="--factor must be an integer >= 2"):
        parse_sizes("4K:1M", factor)
    assert parse_sizes("4K:16K", 2) == [4096, 8192, 16384]
