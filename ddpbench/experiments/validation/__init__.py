"""The ``validation`` experiment kind: the simulator against published measurements.

An experiment file of ``kind: validation`` runs every published point of
``published.yaml`` (:mod:`ddpbench.experiments.validation.data`: source, quoted sentence,
setting, metric, value) in the simulator, in the point's own setting, and renders one row
per point with the relative error, the median |error|, the P3 paper's ordering of gains
and plots of published against simulated (the kind interface is documented in
:mod:`ddpbench.experiments.kinds`)::

    name: validation
    kind: validation
    sources: [p3, horovod_docs]        # optional: only these sources
    only: [p3_vgg19_peak]              # optional: only these point ids
    bandwidths_gbps: [1, 4, 10, 15, 30]  # the sweep of peak_speedup/peak_bandwidth points
    iterations: 3
"""

from __future__ import annotations

from ddpbench.experiments.kinds import ExperimentKind, Kind
from ddpbench.experiments.validation.report import render
from ddpbench.experiments.validation.run import check, expand, key_params, point_name, run_point
from ddpbench.experiments.validation.spec import Spec

KIND: ExperimentKind[Spec] = Kind(Spec=Spec, expand=expand, point_name=point_name,
                                  run_point=run_point, render=render, check=check,
                                  key_params=key_params)

__all__ = ["KIND", "Spec", "check", "expand", "key_params", "point_name", "render", "run_point"]
