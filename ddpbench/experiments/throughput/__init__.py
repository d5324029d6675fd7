"""The ``throughput`` experiment kind (the default): iteration time of backends over a sweep.

Its parts: :mod:`.spec` (the file's keys, checked against :mod:`ddpbench.contract`),
:mod:`.points` (the grid, point names, running a point simulated or real), :mod:`.worker`
(the real-mode worker program run under ``ddpbench launch``), :mod:`.timeline` (Gantt
spans) and :mod:`.report` (the report, from :mod:`.aggregate`'s one row per point,
:mod:`.text`'s tables and :mod:`.plots`' registered plots).
"""

from __future__ import annotations

from ddpbench.experiments.kinds import ExperimentKind, Kind
from ddpbench.experiments.throughput.points import (
    expand,
    key_params,
    point_name,
    run_point,
    size,
)
from ddpbench.experiments.throughput.report import render
from ddpbench.experiments.throughput.spec import ThroughputSpec, check, prepare

Spec = ThroughputSpec

KIND: ExperimentKind[ThroughputSpec] = Kind(
    Spec=ThroughputSpec, expand=expand, point_name=point_name, run_point=run_point,
    render=render, prepare=prepare, check=check, key_params=key_params, size=size)

__all__ = ["KIND", "Spec", "ThroughputSpec", "check", "expand", "key_params", "point_name",
           "prepare", "render", "run_point", "size"]
