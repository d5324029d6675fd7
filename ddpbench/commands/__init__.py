"""Subcommands of the ``ddpbench`` CLI (see :mod:`ddpbench.cli`)."""
