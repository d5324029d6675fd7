"""The predivide maps under Horovod's CUDA fp16 rule: their own points, values and labels."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ddpbench import numerics as nm
from ddpbench.experiments.numerics import Spec, expand, point_name, run_point


def test_gpu_rule_needs_float16():
    with pytest.raises(ValidationError, match="Horovod's CUDA rule for float16"):
        Spec(dtypes=("bfloat16",), scalings=("cpu", "gpu"))


def test_gpu_points_are_float16_only_and_keep_cpu_points_unchanged():
    spec = Spec(world_sizes=(3,), dtypes=("float16", "bfloat16"), scalings=("cpu", "gpu"),
                factors={"max_exp": 2, "step": 2}, training=None, elements=64)
    points = expand(spec)
    gpu = [p for p in points if p.get("scaling") == "gpu"]
    cpu = [p for p in points if "scaling" not in p]
    assert {p["dtype"] for p in gpu} == {"float16"}
    assert cpu == expand(spec.model_copy(update={"scalings": ("cpu",)}))
    assert point_name(gpu[0]).startswith("float16_gpu[")
    assert spec.map_labels() == ["float16", "bfloat16", "float16_gpu"]
    # A GPU point's figures are the emulator's under scaling="gpu", not the CPU rule's.
    p = gpu[0]
    want = {r["factor"]: r for r in nm.sweep_cell(
        "float16", p["dist"], p["scale"], 3, [p["factor"]], 64, 0, scaling="gpu")}
    got = run_point({**p, "_factors": f"[{p['factor']}]"})
    assert got["rel_l2_err"] == want[p["factor"]]["rel_l2_err"]
