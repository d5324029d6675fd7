"""The ``validation`` kind's keys: which published points, the bandwidth sweep, iterations."""

from __future__ import annotations

from pydantic import Field, field_validator

from ddpbench.experiments.schema import Frozen

__all__ = ["Spec"]


class Spec(Frozen):
    """The keys of a ``kind: validation`` experiment file.

    Attributes:
        published: the points file; ``None`` = the shipped ``published.yaml``.
        only: point ids to run (empty = every point of the file).
        sources: source keys to run (empty = every source).
        bandwidths_gbps: the sweep of ``peak_speedup``/``peak_bandwidth`` points.
        iterations: simulated iterations per run (warm-up included).
        warmup: leading iterations left out.
        target_median: the median |relative error| the report checks against.
        target_max: the largest |relative error| any point may have.
        notes: paragraphs the report prints under "Why the misses" (the analysis of the
            model gaps, written by whoever ran the validation).
    """

    published: str | None = None
    only: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    bandwidths_gbps: tuple[float, ...] = (1, 2, 4, 6, 8, 10, 15, 20, 25, 30, 40, 50, 100)
    iterations: int = Field(3, ge=1)
    warmup: int = Field(1, ge=0)
    target_median: float = Field(0.10, gt=0)
    target_max: float = Field(0.25, gt=0)
    notes: tuple[str, ...] = ()

    @field_validator("bandwidths_gbps")
    @classmethod
    def _bandwidths(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if not value:
            raise ValueError("bandwidths_gbps is empty; give at least one bandwidth > 0")
        for bw in value:
            if not bw > 0:
                raise ValueError(f"bandwidths_gbps value {bw!r} is not > 0")
        return tuple(sorted(set(float(b) for b in value)))
