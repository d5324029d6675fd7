"""``ddpbench tune``: the fastest backend and knobs for a workload on a cluster.

:mod:`~ddpbench.tune.space` builds the search space from the knob contract (each knob's
range, scale and the source of its range), pruned for the cluster and narrowed by ``--fix``
and ``--range``; :mod:`~ddpbench.tune.search` runs optuna's TPE over it, one simulation per
trial, its study kept in SQLite in the output folder so that a tune resumes;
:mod:`~ddpbench.tune.report` turns the folder into the answer (report, plots, the chosen
configuration as an experiment YAML).
"""
