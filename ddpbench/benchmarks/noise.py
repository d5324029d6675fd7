"""``ddpbench bench noise``: how closely a perfect model could match this machine's real runs.

``ddpbench calibrate`` fits each backend to the median of a few launches of its workload, and
a report with ``aggregate: quartile`` compares the simulated twin with the median of a
point's few real repetitions. Where launches of the same job differ (a shared machine,
more processes than cores), both medians carry sampling error, and the ratio real/sim of a
point misses 1 by that much even if the model were exact. This benchmark launches each
backend's ``real_local`` point (the calibration's workers, the ResNet-50 workload scaled as
the experiment scales it) ``--launches`` times, interleaved across backends so that drift of
the machine falls on every backend alike, takes each launch's lower quartile (as
``calibrate`` and the report do: :func:`~ddpbench.calibration.machine.launch_time`), and
draws from those launches with replacement (:func:`sampling_floor`) to print, per backend:

- the launches' spread (coefficient of variation; mpi, whose 2 ranks each have a core on a
  2-core machine, is the same run's baseline);
- ``|real/sim - 1|`` of an exact model: the median over draws, and how often it exceeds 15%
  and 25%, with the calibration's ``--calibration`` launches against the experiment's
  ``--repetitions``;
- how often two calibrations' medians agree within 10% (``calibrate``'s repeatability
  target for the workload time, before any fit amplifies it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

HELP = ("launch each backend's real_local point repeatedly and print how closely an exact "
        "model could match it (the sampling floor of calibrate and of a report's medians)")

DEFAULT_BACKENDS = ("mpi", "horovod", "collective", "kvstore", "p3", "byteps")

DRAWS = 20000
"""Draws of :func:`sampling_floor` (its default and what the benchmark prints)."""


def sampling_floor(launches: Sequence[float], calibration: int = 3, repetitions: int = 5,
                   draws: int = DRAWS, seed: int = 0) -> dict[str, float]:
    """Return what an exact model scores against launches drawn from ``launches``.

    Each draw takes the median of ``calibration`` launches (what a calibration fits) and the
    median of ``repetitions`` launches (what a report shows), both with replacement from
    ``launches``, and a second calibration's median. Returns the median over draws of
    ``|real/sim - 1|`` (``median_error``), the shares of draws beyond 15% and 25%
    (``beyond_15``, ``beyond_25``), the share in which two calibrations agree within 10%
    (``repeat_10``), and the launches' coefficient of variation (``cv``).

    Raises:
        ValueError: no launches, a launch time that is not > 0, or a count below 1.
    """
    x = np.asarray(launches, dtype=float)
    if x.size == 0:
        raise ValueError("sampling_floor: no launches")
    if not np.all(x > 0):
        raise ValueError("sampling_floor: every launch time must be > 0")
    if min(calibration, repetitions, draws) < 1:
        raise ValueError("sampling_floor: calibration, repetitions and draws must be >= 1")
    rng = np.random.default_rng(seed)
    sim = np.median(rng.choice(x, (draws, calibration)), axis=1)
    real = np.median(rng.choice(x, (draws, repetitions)), axis=1)
    again = np.median(rng.choice(x, (draws, calibration)), axis=1)
    err = np.abs(real / sim - 1)
    return {"median_error": float(np.median(err)), "beyond_15": float(np.mean(err > 0.15)),
            "beyond_25": float(np.mean(err > 0.25)),
            "repeat_10": float(np.mean(np.abs(again / sim - 1) <= 0.10)),
            "cv": float(x.std() / x.mean())}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backends", default=",".join(DEFAULT_BACKENDS),
                        help="comma-separated backends (default: the six of real_local)")
    parser.add_argument("-n", "--workers", type=int, default=2,
                        help="worker processes, as the calibration (default 2); the "
                             "parameter-server backends add one server each")
    parser.add_argument("--launches", type=int, default=10,
                        help="launches of each backend, interleaved (default 10)")
    parser.add_argument("--calibration", type=int, default=3,
                        help="launches a calibration takes the median of (default 3, as "
                             "ddpbench calibrate --rounds)")
    parser.add_argument("--repetitions", type=int, default=5,
                        help="real repetitions a report takes the median of (default 5, as "
                             "experiments/real_local.yaml)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds one launch may take (default 120)")


def main(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ddpbench import contract
    from ddpbench.calibration.machine import launch_time
    from ddpbench.calibration.run import real_phases
    from ddpbench.cli import UsageError

    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    for b in backends:
        if b not in contract.BACKENDS:
            raise UsageError(f"unknown backend {b!r}; valid: {sorted(contract.BACKENDS)}")
    for name in ("workers", "launches", "calibration", "repetitions"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.launches < 2:
        raise UsageError("--launches must be >= 2 (a spread needs two launches)")
    # The real_local point: ResNet-50 at 0.05 of its compute and 0.01 of its gradients,
    # 20 timed iterations after 3 of warm-up (experiments/real_local.yaml).
    phase = {"workload": "resnet50", "iterations": 20, "warmup": 3, "compute_scale": 0.05,
             "size_scale": 0.01}
    times: dict[str, list[float]] = {b: [] for b in backends}
    timed = 0
    bar = tqdm(total=args.launches * len(backends), desc="noise", unit="launch",
               file=sys.stderr, dynamic_ncols=True)
    try:
        for _ in range(args.launches):
            for b in backends:
                bar.set_postfix_str(b)
                # One server rank per worker for the parameter-server backends (the
                # calibration's and real_local's set-up); the others ignore the count.
                got = real_phases(b, [phase], args.workers, args.workers, args.timeout)
                times[b].append(launch_time(got[0]))
                timed = len(got[0])
                bar.update(1)
    finally:
        bar.close()
    print(f"{args.launches} launches per backend at {args.workers} workers (lower quartile "
          f"of {timed} timed iterations each); an exact model against the median of "
          f"{args.calibration} launches (calibration) and of {args.repetitions} "
          f"(a report's repetitions), {DRAWS} draws")
    print(f"{'backend':<11} {'median ms':>9} {'cv':>6} {'|real/sim-1|':>12} {'>15%':>6} "
          f"{'>25%':>6} {'repeat<=10%':>11}")
    rows: dict[str, dict[str, Any]] = {}
    for b in backends:
        f = sampling_floor(times[b], args.calibration, args.repetitions)
        rows[b] = f
        print(f"{b:<11} {statistics.median(times[b]) * 1e3:>9.2f} {f['cv']:>6.2f} "
              f"{100 * f['median_error']:>11.1f}% {100 * f['beyond_15']:>5.0f}% "
              f"{100 * f['beyond_25']:>5.0f}% {100 * f['repeat_10']:>10.0f}%")
    if "mpi" in rows:
        base = rows["mpi"]["cv"]
        print("spread against mpi's (cv ratio): " + ", ".join(
            f"{b} {rows[b]['cv'] / base:.1f}x" for b in backends if b != "mpi" and base > 0))
    print("launch times (ms): " + "; ".join(
        f"{b} " + " ".join(f"{t * 1e3:.1f}" for t in times[b]) for b in backends))
    return 0
