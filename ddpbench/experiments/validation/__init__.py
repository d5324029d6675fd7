"""The ``validation`` experiment kind: the simulator against published measurements.

Each point of a ``kind: validation`` file is one published figure with its source and the
sentence it comes from, the setting it was measured in, and the metric it states::

    name: validation
    kind: validation
    points:
      - id: p3_vgg19_peak
        source: Jayarajan et al., P3, MLSys 2019, abstract
        quote: "P3 can improve the training throughput of ... VGG-19 by as much as ... 66%"
        metric: peak_speedup          # max over bandwidth_gbps of backend / baseline
        workload: vgg19
        backend: p3
        baseline: kvstore
        bandwidth_gbps: [1, 2, 4, 10, 25]
        cluster: {workers: 4, device: P4000, batch_size: 32, transport: tcp}
        published: 1.66

Metrics: ``peak_speedup`` (the largest throughput ratio backend/baseline over the listed
bandwidths), ``speedup`` (that ratio at the one listed bandwidth) and ``throughput``
(samples per second of the whole job at the one listed bandwidth). Every point simulates
its setting with the model's constants as they are (set once per device and transport in
:mod:`ddpbench.hardware`, never per point) and reports the relative error
``simulated / published - 1`` (``rel_error``); the report shows every point, the misses included.
"""

from __future__ import annotations

from ddpbench.experiments.validation.report import render
from ddpbench.experiments.validation.run import expand, point_name, run_point
from ddpbench.experiments.validation.spec import Spec

__all__ = ["Spec", "expand", "point_name", "render", "run_point"]
