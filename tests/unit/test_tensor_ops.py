"""Scaling, ring chunking and mismatch messages (single process)."""

import ml_dtypes
import numpy as np
import pytest

from ddpbench.backends._common import Meta, mismatch_message
from ddpbench.benchmarks.allreduce import parse_size, parse_sizes, profile_tensor_sizes
from ddpbench.rules.ring import ring_chunks
from ddpbench.tensor_ops import adjacent_span, scale_


@pytest.mark.parametrize("n,p", [(10, 3), (2, 4), (0, 3), (16, 4), (7, 1)])
def test_ring_chunks_match_array_split(n, p):
    chunks = ring_chunks(n, p)
    parts = np.array_split(np.arange(n), p)
    assert [c for _, c in chunks] == [len(x) for x in parts]
    assert [o for o, c in chunks if c] == [int(x[0]) for x in parts if len(x)]


def test_scale_half_in_float32():
    x = np.array([1000.0, 7.0, 6e-5], np.float16)
    y = x.copy()
    scale_(y, 1 / 3)
    # One rounding from float32, not a product with 1/3 rounded to half first.
    assert np.array_equal(y, (x.astype(np.float32) * np.float32(1 / 3)).astype(np.float16))
    assert not np.array_equal(y, x * np.float16(1 / 3))
    b = np.array([1.5, 3.0], ml_dtypes.bfloat16)
    scale_(b, 0.5)
    assert b.tolist() == [0.75, 1.5]
    i = np.array([7, -7], np.int32)
    scale_(i, 0.5)
    assert i.tolist() == [3, -3]  # truncated toward zero, like C
    same = np.array([1.0], np.float32)
    scale_(same, 1.0)
    assert same[0] == 1.0


def test_mismatch_message_names_both_sides():
    a = Meta("allreduce", "g", "float32", (4,), "sum", 0.5, 1.0)
    b = Meta("allreduce", "g", "float32", (4,), "sum", 1.0, 1.0)
    assert mismatch_message([a, a, b]) == (
        "Mismatched prescale and/or postscale factors for 'g': rank 0 sent prescale 0.5 "
        "postscale 1.0, rank 2 sent prescale 1.0 postscale 1.0")
    c = Meta("allreduce", "g", "float16", (4,), "sum", 0.5, 1.0)
    assert mismatch_message([a, c]) == "Mismatched dtype for 'g': rank 0 sent float32, rank 1 sent float16"
    assert mismatch_message([a, a]) is None
    assert a.signature() == Meta("allreduce", "g", "float32", (4,), "sum", 0.5, 1.0).signature()
    assert a.signature() != b.signature()


def test_bench_size_parsing():
    assert parse_size("4K") == 4096 and parse_size("64M") == 64 << 20 and parse_size("12") == 12
    assert parse_sizes("1K:8K") == [1024, 2048, 4096, 8192]
    assert parse_sizes("1K:64K", 4) == [1024, 4096, 16384, 65536]
    with pytest.raises(ValueError, match="not a number"):
        parse_size("lots")
    sizes = profile_tensor_sizes("resnet50")
    assert len(sizes) == 161 and sum(sizes) == 25_557_032
    with pytest.raises(ValueError, match="unknown tensor set 'googlenet'"):
        profile_tensor_sizes("googlenet")


def test_adjacent_span_is_one_view_over_back_to_back_tensors():
    flat = np.arange(20, dtype=np.float32)
    parts = [flat[0:3].reshape(3, 1), flat[3:3], flat[3:11].reshape(2, 4), flat[11:20]]
    span = adjacent_span(parts)
    assert span is not None and span.shape == (20,) and np.shares_memory(span, flat)
    span[...] = -1  # a view, not a copy
    assert (flat == -1).all()
    # Only the covered range: a run in the middle of the buffer.
    middle = adjacent_span([flat[4:6], flat[6:9]])
    assert middle is not None and middle.__array_interface__["data"][0] == \
        flat[4:].__array_interface__["data"][0] and middle.size == 5


@pytest.mark.parametrize("case", ["gap", "order", "dtype", "strided", "separate", "cupy-like"])
def test_adjacent_span_refuses_what_is_not_back_to_back(case):
    flat = np.zeros(20, np.float32)
    parts = {
        "gap": [flat[0:3], flat[4:8]],
        "order": [flat[3:6], flat[0:3]],
        "dtype": [flat[0:2], flat[2:4].view(np.int32)],
        "strided": [flat[0:8:2], flat[8:12]],
        "separate": [np.zeros(3, np.float32), np.zeros(3, np.float32)],
        "cupy-like": [[0.0, 1.0]],
    }[case]
    assert adjacent_span(parts) is None
