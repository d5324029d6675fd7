"""Discrete-event (simpy) network simulator of data-parallel gradient communication.

Example:
    >>> import simulator
    >>> r = simulator.simulate("vgg19", "p3", workers=4, bandwidth_gbps=10)
    >>> r.iteration_time_s, r.bytes_sent["worker0"]

Public API : :func:`simulate`, :func:`simulate_collective`,
:func:`load_workload`, :data:`WORKLOADS`, :data:`STRATEGIES`, :class:`SimResult`,
:class:`Workload`.
"""

from ddpbench.simulator.core import (
    DEFAULT_SUMMATION_GBPS,
    SimResult,
    Span,
    simulate,
    simulate_collective,
)
from ddpbench.simulator.strategies import STRATEGIES
from ddpbench.simulator.workload import WORKLOADS, Layer, Tensor, Workload, load_workload

__all__ = [
    "DEFAULT_SUMMATION_GBPS",
    "STRATEGIES",
    "WORKLOADS",
    "Layer",
    "SimResult",
    "Span",
    "Tensor",
    "Workload",
    "load_workload",
    "simulate",
    "simulate_collective",
]
