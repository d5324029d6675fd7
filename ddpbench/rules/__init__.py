"""The rules that the real backends and the simulator share, so that both do the same thing.

- :mod:`.fusion`: Horovod's cycle grid and response fusion (``horovod`` and its simulation).
- :mod:`.placement`: where each part of an array goes on the parameter servers
  (``kvstore``, ``p3``, ``byteps``, ``tensorflow`` and their simulations).
- :mod:`.ring`: the ring allreduce's chunks and steps (``horovod``'s and ``collective``'s
  rings, :mod:`ddpbench.numerics`, the simulated rings).

Each module is free of MPI, threads and SimPy and imports only NumPy (the bottom layer):
a backend feeds the steps to its transport, the simulator prices them.
"""
