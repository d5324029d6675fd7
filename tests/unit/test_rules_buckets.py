"""Paddle's gradient buckets (coalesce_grad_tensor_pass.cc), the rule real and simulated
``collective`` runs share; and the trace writer's streaming file."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ddpbench import trace
from ddpbench.rules.buckets import (
    FUSE_GRAD_SIZE_IN_MB,
    FUSE_GROUPS_SIZE,
    MB,
    coalesce_buckets,
    layer_key,
)


def plan(grads, limit_mb=FUSE_GRAD_SIZE_IN_MB, **kw):
    """Names of each bucket of ``grads`` = [(name, bytes[, dtype])]."""
    buckets = coalesce_buckets(grads, limit_mb, nbytes=lambda g: g[1],
                               layer=lambda g: layer_key(g[0]),
                               dtype=(lambda g: g[2]) if grads and len(grads[0]) > 2 else None,
                               **kw)
    return [[g[0] for g in b] for b in buckets]


def test_whole_layers_until_the_bucket_reaches_the_limit():
    # fleet's defaults: 32 MB buckets of at most 50 gradients
    assert (FUSE_GRAD_SIZE_IN_MB, FUSE_GROUPS_SIZE, MB) == (32, 50, 1048576)
    grads = [("fc_3.w_0", 20 * MB), ("fc_3.b_0", 4096), ("fc_2.w_0", 12 * MB),
             ("fc_2.b_0", 4096), ("fc_1.w_0", 40 * MB), ("fc_0.w_0", MB)]
    # fc_3 (20 MB) stays open; fc_2 brings it past 32 MB, whole, and closes it; fc_1 alone
    # is past the limit; fc_0 is the rest
    assert plan(grads) == [["fc_3.w_0", "fc_3.b_0", "fc_2.w_0", "fc_2.b_0"], ["fc_1.w_0"],
                           ["fc_0.w_0"]]
    # exactly at the limit closes too (>=)
    assert plan([("a.w", 32 * MB), ("b.w", 1)]) == [["a.w"], ["b.w"]]


def test_a_layer_keeps_its_gradients_together_where_its_first_one_came():
    grads = [("fc_1.w_0", 10), ("fc_0.w_0", 10), ("fc_1.b_0", 10)]
    assert plan(grads, limit_mb=15 / MB) == [["fc_1.w_0", "fc_1.b_0"], ["fc_0.w_0"]]
    assert layer_key("conv2d_0.w_0") == "conv2d_0" and layer_key(7) == 7
    assert layer_key("layer1.0.conv1.weight") == "layer1.0.conv1"  # a module, not the stage


def test_a_bucket_closes_past_fifty_gradients_and_splits_by_dtype():
    tiny = [(f"p{i}", 4) for i in range(60)]
    assert [len(b) for b in plan(tiny)] == [51, 9]  # "more than" 50 closes it
    assert [len(b) for b in plan(tiny, max_tensors=1)] == [60]  # 1 or less: no cap
    mixed = [("a.w", 8, "float32"), ("b.w", 8, "float16"), ("c.w", 8, "float32")]
    assert plan(mixed) == [["a.w", "c.w"], ["b.w"]]


def test_no_fusion_is_one_bucket_per_gradient():
    grads = [("a.w", 8), ("a.b", 8)]
    assert plan(grads, limit_mb=0) == [["a.w"], ["a.b"]]


def test_resnet50_at_fleets_default():
    from ddpbench.benchmarks.allreduce import profile_tensor_sizes

    counts = profile_tensor_sizes("resnet50")[::-1]  # backward order
    grads = [(f"t{i}", 4 * c) for i, c in enumerate(counts)]
    buckets = coalesce_buckets(grads, FUSE_GRAD_SIZE_IN_MB, nbytes=lambda g: g[1],
                               layer=lambda g: g[0])
    assert [g for b in buckets for g in b] == grads
    sizes = [sum(g[1] for g in b) for b in buckets]
    for b, size in zip(buckets[:-1], sizes):
        assert size >= 32 * MB or len(b) > 50
        assert size - b[-1][1] < 32 * MB and len(b) - 1 <= 50  # closed by its last one


def test_trace_file_is_valid_json_after_every_flush(tmp_path):
    path = tmp_path / "made" / "t.json"  # the folder is made
    f = trace.TraceFile(path, t0=1.0, lanes={0: "timeline"}, meta={"backend": "x"})
    assert json.loads(path.read_text()) == {"displayTimeUnit": "ms",
                                            "otherData": {"backend": "x"}, "traceEvents": []}
    f.add(trace.Span("g", "ALLREDUCE", 0, 1.5, 2.0, 16, name="ALLREDUCE", lane=0))
    f.flush()
    f.add(trace.Span("h", "QUEUE", 0, 2.0, 2.25, 0, name="QUEUE", lane=0))
    f.flush()
    f.close()
    doc = json.loads(path.read_text())
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert [(e["name"], e["pid"], e["ts"], e["dur"], e["args"]) for e in xs] == [
        ("ALLREDUCE", 0, 5e5, 5e5, {"bytes": 16}), ("QUEUE", 1, 1e6, 2.5e5, {})]
    names = [e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"]
    assert names == ["g", "h"]
    assert np.isclose(sum(e["dur"] for e in xs), 7.5e5)


@pytest.mark.parametrize("limit", [-1.0])
def test_collective_refuses_a_negative_bucket(limit):
    import ddpbench

    cls = ddpbench.api.backend_class("collective")
    assert cls.parse_options({}).fuse_grad_size_mb == 0
    with pytest.raises(ValueError, match="fuse_grad_size_mb"):
        cls.parse_options({"fuse_grad_size_mb": limit})
