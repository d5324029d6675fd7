"""The ``accuracy`` experiment kind: train one model with every backend and setting, compare.

An experiment file (``experiments/accuracy.yaml``)::

    name: accuracy
    kind: accuracy
    model: mlp              # the training run shared by every point
    workers: 4
    steps: 400
    variants:               # each: backends x the grid of its lists
      - backends: [mpi, horovod, collective, kvstore, p3, byteps]
      - backends: [horovod, collective]
        compression: [fp16]
      - backends: [horovod]
        predivide: [4, 16]
      - backends: [collective]
        local_sgd_period: [2, 4, 10]

Every point is a real job (``ddpbench train``'s :func:`run_training`, run one at a time);
points repeated by several variants run once. The report has the final test accuracy of
every point against the fp32 reference (the first plain fp32 point), checks of the targets
(fp32 backends within 0.1 point of each other, fp16 within 0.5 point of fp32) and
accuracy-vs-step curves.
"""

from __future__ import annotations

from ddpbench.experiments.accuracy.report import render
from ddpbench.experiments.accuracy.run import expand, point_name, run_point
from ddpbench.experiments.accuracy.spec import Spec, Variant

__all__ = ["Spec", "Variant", "expand", "point_name", "render", "run_point"]
