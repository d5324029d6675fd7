"""The ``numerics`` experiment kind: predivide-factor maps of the emulated ring.

An experiment file of ``kind: numerics`` sweeps world size x predivide factor x dtype x
gradient distribution/scale through :mod:`ddpbench.numerics` and renders error and
overflow/underflow heatmaps, the safe-range table and a training run (the kind interface is
documented in :mod:`ddpbench.experiments.kinds`)::

    name: predivide_numerics
    kind: numerics
    world_sizes: [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    factors: {max_exp: 24, step: 2}        # 2^0, 2^2, ..., 2^24, plus sqrt(N) and N
    dtypes: [float16, bfloat16]
    distributions:
      - {name: normal, scales: [1.0e-4, 1.0e-2, 1, 100]}
    elements: 8192                         # per rank
    training: {world_size: 1024, scale: 100, factors: [1, 32, 1024, 16777216]}

Points are one per (dtype, distribution, scale, N, factor), named like
``float16[N=64,dist=normal,f=8,scale=1]``. The gradient of a cell (all but the factor) is
drawn once and every factor of the cell is emulated on it: :func:`batch_key` makes a cell
one task of the runner and :func:`run_point` keeps the cell's rows in a small per-process
cache, so factors compare on equal data. ``ddpbench numerics sweep`` runs the same points
through the same runner (:func:`run_sweep`).
"""

from __future__ import annotations

from ddpbench.experiments.kinds import ExperimentKind, Kind
from ddpbench.experiments.numerics.report import render
from ddpbench.experiments.numerics.run import (
    batch_key,
    expand,
    point_name,
    run_point,
    run_sweep,
    size,
)
from ddpbench.experiments.numerics.spec import Spec

KIND: ExperimentKind[Spec] = Kind(Spec=Spec, expand=expand, point_name=point_name,
                                  run_point=run_point, render=render, batch_key=batch_key,
                                  size=size)

__all__ = ["KIND", "Spec", "batch_key", "expand", "point_name", "render", "run_point",
           "run_sweep", "size"]
