"""Calibration of the simulator from real runs on this machine (``ddpbench calibrate``).

:mod:`.machine` holds the machine profile and how a simulated point uses it;
:mod:`.run` measures and fits it; :mod:`.pingpong` and :mod:`.ringstep` are the MPI
programs it launches, and its real runs are :mod:`ddpbench.emulation`'s worker program.
"""

from ddpbench.calibration.machine import BackendFit, Machine, adjust, load_machine, parse_machine

__all__ = ["BackendFit", "Machine", "adjust", "load_machine", "parse_machine"]
