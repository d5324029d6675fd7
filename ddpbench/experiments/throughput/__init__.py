"""The ``throughput`` experiment kind (the default): iteration time of backends over a sweep.

Its parts: :mod:`.spec` (the file's keys, checked against :mod:`ddpbench.contract`),
:mod:`.points` (the grid, point names, running a point simulated or real), :mod:`.worker`
(the real-mode worker program run under ``ddpbench launch``), :mod:`.timeline` (Gantt
spans) and :mod:`.report` (tables and plots).
"""

from __future__ import annotations

from ddpbench.experiments.throughput.points import expand, key_params, point_name, run_point
from ddpbench.experiments.throughput.report import render
from ddpbench.experiments.throughput.spec import ThroughputSpec, check, prepare

Spec = ThroughputSpec

__all__ = ["Spec", "ThroughputSpec", "check", "expand", "key_params", "point_name", "prepare",
           "render", "run_point"]
