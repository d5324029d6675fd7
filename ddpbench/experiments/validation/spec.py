"""The keys of a ``kind: validation`` file: published points with their source and setting."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ddpbench import contract

METRICS = ("peak_speedup", "speedup", "throughput")


class PublishedPoint(BaseModel):
    """One published figure, where it comes from, and the setting it was measured in."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    source: str = Field(min_length=1)
    quote: str = Field(min_length=1)
    metric: Literal["peak_speedup", "speedup", "throughput"]
    workload: str = Field(min_length=1)
    backend: str
    baseline: str | None = None
    bandwidth_gbps: tuple[float, ...] = Field(min_length=1)
    cluster: dict[str, Any] = Field(default_factory=dict)
    knobs: dict[str, Any] = Field(default_factory=dict)
    published: float = Field(gt=0, allow_inf_nan=False)

    @field_validator("backend", "baseline")
    @classmethod
    def _known_backend(cls, value: str | None) -> str | None:
        if value is not None and value not in contract.BACKENDS:
            raise ValueError(f"unknown backend {value!r}; valid: {sorted(contract.BACKENDS)}")
        return value

    @field_validator("bandwidth_gbps")
    @classmethod
    def _positive(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if any(not (b > 0) for b in value):
            raise ValueError(f"every bandwidth must be > 0, got {list(value)}")
        return value

    @field_validator("cluster")
    @classmethod
    def _cluster(cls, value: dict[str, Any]) -> dict[str, Any]:
        allowed = set(contract.Cluster.model_fields) | {"batch_size"}
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise ValueError(f"unknown cluster key(s) {unknown}; valid: {sorted(allowed)}")
        if "bandwidth_gbps" in value:
            raise ValueError("give bandwidth_gbps beside cluster, not inside it")
        return value

    @model_validator(mode="after")
    def _metric_needs(self) -> PublishedPoint:
        if self.metric in ("peak_speedup", "speedup") and self.baseline is None:
            raise ValueError(f"metric {self.metric!r} needs a baseline backend")
        if self.metric in ("speedup", "throughput") and len(self.bandwidth_gbps) != 1:
            raise ValueError(f"metric {self.metric!r} is measured at one bandwidth, got "
                             f"{list(self.bandwidth_gbps)}")
        return self


class Spec(BaseModel):
    """A validation experiment: the published points, checked against the contract."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    points: tuple[PublishedPoint, ...] = Field(min_length=1)
    iterations: int = Field(3, ge=2, strict=True)

    @model_validator(mode="after")
    def _unique_ids(self) -> Spec:
        ids = [p.id for p in self.points]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"point ids must be unique, repeated: {dup}")
        return self
