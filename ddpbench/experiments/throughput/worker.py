"""The real-mode worker program, which lives in :mod:`ddpbench.emulation` (below the
experiments, which the calibration shares it with); its names stay importable here, and
``python -m ddpbench.experiments.throughput.worker`` runs it as before."""

from __future__ import annotations

import sys

from ddpbench.emulation import PHASE_KEYS, load_workload, main, phases, run, scale_sizes

__all__ = ["PHASE_KEYS", "load_workload", "main", "phases", "run", "scale_sizes"]

if __name__ == "__main__":
    sys.exit(main())
