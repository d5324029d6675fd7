"""The programs behind ``ddpbench bench``: each prints its figure as a ratio against a
baseline measured in the same run (allreduce, ps, sim, trainer, scale-kernel)."""
