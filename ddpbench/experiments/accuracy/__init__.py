"""The ``accuracy`` experiment kind: train one model with every backend and setting, compare.

An experiment file (``experiments/accuracy.yaml``)::

    name: accuracy
    kind: accuracy
    model: ddpbench.torch.models:lenet   # or torchvision:NAME, or mlp / cnn (ddpbench.nn)
    dataset: mnist5k        # synthetic, digits, mnist5k, a .npz file or an image folder
    workers: 4
    steps: 300
    repetitions: 3          # seeds seed, seed+1, seed+2: mean +- spread per variant
    variants:               # each: backends x the grid of its lists
      - backends: [mpi, horovod, collective, kvstore, p3, byteps]
      - backends: [horovod, collective]
        compression: [fp16]
      - backends: [horovod]
        predivide: [4, 16]
      - backends: [collective]
        local_sgd_period: [2, 4, 10]

Every point is a real job (``ddpbench train``'s :func:`run_training`, run one at a time):
a PyTorch model trains through :mod:`ddpbench.torch` (``DistributedOptimizer``,
``broadcast_parameters``), a ``ddpbench.nn`` one through ``DistributedTrainer``; points
repeated by several variants run once. The report gives each variant's final test accuracy
as mean +- standard deviation (and min..max) over its seeds, its difference from the fp32
run of the same backend with the standard error of that difference (beyond two of them it
is told from noise), the ``target_acc`` check of the fp32 runs, and mean accuracy and loss
curves with their seed range.
"""

from __future__ import annotations

from ddpbench.experiments.accuracy.report import render
from ddpbench.experiments.accuracy.run import check, expand, point_name, run_point
from ddpbench.experiments.accuracy.spec import Spec, Variant
from ddpbench.experiments.kinds import ExperimentKind, Kind

KIND: ExperimentKind[Spec] = Kind(Spec=Spec, expand=expand, point_name=point_name,
                                  run_point=run_point, render=render, check=check)

__all__ = ["KIND", "Spec", "Variant", "check", "expand", "point_name", "render", "run_point"]
