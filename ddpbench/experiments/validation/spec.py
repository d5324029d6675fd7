"""The ``validation`` kind's keys: which published points, the bandwidth sweep, iterations."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from ddpbench import contract
from ddpbench.experiments.schema import Frozen

__all__ = ["Mechanism", "Sensitivity", "Spec"]

_NOT_VARIED = ("workers", "hosts", "gpus_per_host", "servers", "bandwidth_gbps", "latency_us",
               "intra_link", "transport", "device", "nccl_proto", "nccl_algo", "nccl_version",
               "nccl_channels", "nccl_socket_flows", "nics_per_host", "collnet", "machine",
               "paced")
"""Cluster fields a sensitivity may not vary: each point's setting states them (or the sweep
does), or they belong to real runs."""


class Sensitivity(Frozen):
    """A model constant that the published settings do not pin down, simulated at other
    values on chosen points: shown in the report beside the shipped results, never scored.

    Attributes:
        field: a field of :class:`ddpbench.contract.Cluster` that no setting states
            (``socket_gbps``, ``server_update_gbps``, ``overlap_slowdown``, ...).
        values: the values tried (each checked against the field's bounds).
        points: ids of the published points it is tried on.
        why: what the constant stands for and why it is tried (printed above its table).
    """

    field: str
    values: tuple[float, ...] = Field(min_length=1)
    points: tuple[str, ...] = Field(min_length=1)
    why: str = Field(min_length=1)

    @field_validator("field")
    @classmethod
    def _field(cls, value: str) -> str:
        valid = sorted(f for f in contract.Cluster.model_fields if f not in _NOT_VARIED)
        if value not in valid:
            raise ValueError(f"sensitivity field {value!r} cannot be varied; valid: {valid}")
        return value

    @field_validator("values")
    @classmethod
    def _values(cls, value: tuple[float, ...], info: Any) -> tuple[float, ...]:
        field = info.data.get("field")
        if field is None:  # the field's own check has failed and said so
            return value
        return tuple(sorted({contract.check_axis(field, v) for v in value}))


class Mechanism(Frozen):
    """One mechanism of the model, as the validation chose it: what it is, its source, the
    split it was chosen on, and the scores of both splits without and with it.

    Attributes:
        name: what the mechanism does, in a few words.
        source: where its rule and constants come from.
        chosen_on: the split looked at while choosing it (``fit``), or ``none`` for a rule
            read from an original's code, chosen on no split.
        fit: the ``fit`` split's scores without and with it (median |error|, points beyond
            the target), as measured when it was added.
        test: the ``test`` split's, measured once the model was frozen.
    """

    name: str = Field(min_length=1)
    source: str = Field(min_length=1)
    chosen_on: Literal["fit", "test", "none"] = "fit"
    fit: str = Field(min_length=1)
    test: str = Field(min_length=1)


class Spec(Frozen):
    """The keys of a ``kind: validation`` experiment file.

    Attributes:
        published: the points file; ``None`` = the shipped ``published.yaml``.
        only: point ids to run (empty = every point of the file).
        sources: source keys to run (empty = every source).
        splits: the splits to run (``fit``, ``test``); a model under development runs
            ``[fit]`` alone, and ``test`` is added once the model is frozen.
        bandwidths_gbps: the sweep of ``peak_speedup``/``peak_bandwidth`` points.
        iterations: simulated iterations per run (warm-up included).
        warmup: leading iterations left out.
        target_median: the median |relative error| the ``fit`` split must not exceed.
        target_max: the largest |relative error| any point of either split should have.
        test_target_median: the median |relative error| the ``test`` split must not exceed.
        test_target_max: the largest |relative error| a ``test`` point may have.
        notes: paragraphs the report prints under "Why the misses" (the analysis of the
            model gaps, written by whoever ran the validation).
        sensitivity: constants tried at other values on chosen points (:class:`Sensitivity`;
            shown, not scored).
        mechanisms: the model's mechanisms and what each did to both splits
            (:class:`Mechanism`).
    """

    published: str | None = None
    only: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    splits: tuple[Literal["fit", "test"], ...] = ("fit", "test")
    bandwidths_gbps: tuple[float, ...] = (1, 2, 4, 6, 8, 10, 15, 20, 25, 30, 40, 50, 100)
    iterations: int = Field(3, ge=1)
    warmup: int = Field(1, ge=0)
    target_median: float = Field(0.08, gt=0)
    target_max: float = Field(0.25, gt=0)
    test_target_median: float = Field(0.12, gt=0)
    test_target_max: float = Field(0.40, gt=0)
    notes: tuple[str, ...] = ()
    sensitivity: tuple[Sensitivity, ...] = ()
    mechanisms: tuple[Mechanism, ...] = ()

    @field_validator("bandwidths_gbps")
    @classmethod
    def _bandwidths(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if not value:
            raise ValueError("bandwidths_gbps is empty; give at least one bandwidth > 0")
        for bw in value:
            if not bw > 0:
                raise ValueError(f"bandwidths_gbps value {bw!r} is not > 0")
        return tuple(sorted(set(float(b) for b in value)))
