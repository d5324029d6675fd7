"""One size check for every command whose work grows with its input.

``simulate``, ``run``, ``tune``, ``launch``, ``numerics`` and ``profile`` estimate, before any
work, what the work will take from its actual sizes (a simulation's events and parts, a job's
ranks, an emulation's arrays, a model's activations) and hand the estimate to :func:`check`.
Past this machine's limits :func:`check` raises :class:`TooLarge`, a ValueError whose message
gives the estimate, the limit it passes and the one flag that runs it anyway,
:data:`ALLOW_FLAG`, the same on every command. The limits:

- memory: the estimate may use at most :data:`MEMORY_FRACTION` of the memory the kernel
  reports available (``MemAvailable`` in ``/proc/meminfo``), so that a refused run never
  starts swapping or meets the OOM killer halfway;
- whatever the caller adds (a simulation's event limit, a job's process limit), each with its
  own reason.

This module imports nothing heavy, so a command can check before it imports its work.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

__all__ = ["ALLOW_FLAG", "MEMORY_FRACTION", "Cost", "TooLarge", "add_allow_flag",
           "available_memory", "check", "duration", "gib", "memory_budget", "overs"]

ALLOW_FLAG = "--allow-large"
"""The flag that runs a command past its size check: one name on every command."""

MEMORY_FRACTION = 0.8
"""Share of the available memory one command's estimate may use."""


class TooLarge(ValueError):
    """A command's estimated size passes this machine's limits (the message says by how
    much and names :data:`ALLOW_FLAG`)."""


@dataclass(frozen=True)
class Cost:
    """What a piece of work is estimated to take, before it starts.

    Attributes:
        what: the work, as the message names it ("this simulation", "this job").
        size: its size in its own terms ("about 2,300,000 events", "100,000 ranks").
        memory_bytes: the memory it will hold at its peak.
        seconds: how long it will run here, when that can be told (None: it cannot).
        over: further limits it passes, each a phrase ("more than the 50,000,000-event
            limit (DDPBENCH_MAX_EVENTS)"), checked by the caller.
    """

    what: str
    size: str
    memory_bytes: float
    seconds: float | None = None
    over: tuple[str, ...] = field(default=())

    def describe(self) -> str:
        """Return ``SIZE (~T here, ~M of memory)``."""
        parts = [f"~{duration(self.seconds)} here"] if self.seconds is not None else []
        parts.append(f"~{gib(self.memory_bytes)} of memory")
        return f"{self.size} ({', '.join(parts)})"


def gib(nbytes: float) -> str:
    """Return ``nbytes`` in GiB for a message (``0.3 GiB``, ``1,234 GiB``)."""
    value = nbytes / 2**30
    return f"{value:,.1f} GiB" if value < 100 else f"{value:,.0f} GiB"


def duration(seconds: float) -> str:
    """Return ``seconds`` as a short duration (``40 s``, ``12 min``, ``3.5 h``, ``9 days``)."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:,.1f} h"
    if seconds < 3 * 365 * 86400:
        return f"{seconds / 86400:,.0f} days"
    return f"{seconds / (365 * 86400):,.0f} years"


def available_memory() -> float:
    """Return the bytes of memory this machine has available now (``MemAvailable``; the
    physical memory where ``/proc/meminfo`` is missing)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return float("inf")


def memory_budget() -> float:
    """Return the memory one command may plan to use: :data:`MEMORY_FRACTION` of what is
    available."""
    return MEMORY_FRACTION * available_memory()


def check(cost: Cost, *, allow: bool = False, advice: str = "") -> None:
    """Raise :class:`TooLarge` when ``cost`` passes this machine's memory or ``cost.over``.

    Args:
        cost: the estimate.
        allow: the user gave :data:`ALLOW_FLAG`: never refuse.
        advice: what to make smaller, for the message ("simulate fewer workers").

    Raises:
        TooLarge: naming the estimate, every limit it passes and :data:`ALLOW_FLAG`.
    """
    if allow:
        return
    over = list(cost.over)
    budget = memory_budget()
    if cost.memory_bytes > budget:
        over.insert(0, f"more memory than this machine can give it ({gib(budget)}: "
                       f"{MEMORY_FRACTION:.0%} of the {gib(available_memory())} available)")
    if not over:
        return
    fix = f"{advice}, or add {ALLOW_FLAG}" if advice else f"add {ALLOW_FLAG}"
    raise TooLarge(f"{cost.what} would take {cost.describe()}: {'; '.join(over)}. Refused "
                   f"before any work: {fix} to run it anyway")


def add_allow_flag(parser: argparse.ArgumentParser, what: str = "the work") -> None:
    """Add :data:`ALLOW_FLAG` to ``parser`` (``args.allow_large``)."""
    parser.add_argument(ALLOW_FLAG, action="store_true", dest="allow_large",
                        help=f"run {what} even when its size estimate passes this machine's "
                             f"limits (memory, events, processes); without it such a run is "
                             f"refused before it starts, with the estimate")


def overs(*pairs: tuple[bool, str]) -> tuple[str, ...]:
    """Return the phrases whose condition holds (for :attr:`Cost.over`)."""
    return tuple(text for cond, text in pairs if cond)
