"""Profile a PyTorch model into a workload (``ddpbench profile``).

:func:`profile` builds the model (:mod:`ddpbench.profiling.model`), times its training step
with hooks (:mod:`ddpbench.profiling.profiler`) and returns the profile mapping that
:func:`ddpbench.simulator.load_workload` reads; :func:`group_times` and
:func:`compare_tensors` are the checks between two profiles.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ddpbench.profiling.model import build_model, default_input_shape, import_torch
from ddpbench.profiling.profiler import (
    Measurement,
    keep_freed_memory,
    matmul_like,
    measure,
    to_profile,
)

__all__ = ["Measurement", "build_model", "compare_tensors", "group_times", "import_torch",
           "keep_freed_memory", "measure", "profile", "tensor_list", "to_profile"]


def profile(spec: str, *, batch_size: int, device: str = "cpu",
            input_shape: tuple[int, ...] | None = None, warmup: int = 2, repeats: int = 5,
            progress: Callable[[str], None] | None = None,
            allow_large: bool = False) -> dict[str, Any]:
    """Build the model named by ``spec``, time it, and return its workload profile mapping.

    Raises:
        ValueError: torch missing, an unknown model, an input shape that does not fit, or
            steps past this machine's memory (:func:`ddpbench.profiling.profiler.step_cost`;
            ``allow_large`` runs them anyway).
    """
    model, name = build_model(spec)
    shape = input_shape or default_input_shape(name)
    m = measure(model, name, batch_size=batch_size, input_shape=shape, device=device,
                warmup=warmup, repeats=repeats, progress=progress, allow_large=allow_large)
    modules = dict(model.named_modules())
    kinds = [matmul_like(modules.get(lname, model)) for lname, _k, _i in m.layers]
    return to_profile(m, kinds)


def tensor_list(workload: Any) -> list[tuple[str, int]]:
    """Return ``(name, numel)`` of every tensor of a workload, in file order."""
    return [(t.name, t.numel) for t in workload.tensors]


def compare_tensors(a: Any, b: Any) -> str | None:
    """Return None when two workloads list the same tensors in the same order, else why not."""
    la, lb = tensor_list(a), tensor_list(b)
    if la == lb:
        return None
    if len(la) != len(lb):
        return f"{len(la)} tensors against {len(lb)}"
    i = next(k for k, (x, y) in enumerate(zip(la, lb)) if x != y)
    return f"tensor {i} differs: {la[i]} against {lb[i]}"


def group_times(workload: Any) -> dict[str, float]:
    """Return forward+backward seconds per layer group (the first part of a layer's name)."""
    groups: dict[str, float] = {}
    for layer in workload.layers:
        key = layer.name.split(".")[0]
        groups[key] = groups.get(key, 0.0) + layer.fwd_s + layer.bwd_s
    return groups
