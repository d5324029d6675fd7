"""``ddpbench calibrate``: measure this machine with real processes, write a machine profile."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

HELP = ("measure this machine with each backend's real processes and write a machine "
        "profile for the simulator (--machine, machine: in experiment files)")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--workers", type=int, default=2,
                        help="worker processes of each backend's runs (default 2)")
    parser.add_argument("--servers", type=int, default=None,
                        help="server processes of the parameter-server runs (default: workers)")
    parser.add_argument("-o", "--output", required=True, help="machine profile to write (YAML)")
    parser.add_argument("--backends", default=None,
                        help="comma-separated backends (default: every available one)")
    parser.add_argument("--workload", default="resnet50",
                        help="profile whose compute and tensors are run with each backend "
                             "(default resnet50)")
    parser.add_argument("--compute-scale", type=float, default=0.05,
                        help="its compute times x this (default 0.05, as real_local)")
    parser.add_argument("--size-scale", type=float, default=0.01,
                        help="its gradient sizes x this (default 0.01, as real_local)")
    parser.add_argument("--iterations", type=int, default=20,
                        help="timed iterations of each real run (default 20)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds each real run may take (default 120)")
    parser.add_argument("--step-processes", default="2,3,4,6,8",
                        help="process counts at which ring steps are timed (default 2,3,4,6,8)")
    parser.add_argument("--step-repeats", type=int, default=5,
                        help="ring-step blocks per style and process count, alternating "
                             "in one job; the median is kept (default 5)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="launches of each backend's three runs (one job each), "
                             "interleaved across backends; each run keeps its launches' "
                             "median (default 3)")
    from ddpbench.launch import BINDINGS

    parser.add_argument("--bind", choices=BINDINGS, default="none",
                        help="how every job's ranks are placed: none (the OS's choice; "
                             "default, as real runs' default) or core (one core each, round "
                             "robin); recorded in the profile, and real runs compared with "
                             "it must use the same (real: {bind: ...})")
    parser.add_argument("--compare", metavar="PROFILE", default=None,
                        help="an earlier profile: print each fitted value's change against it")


def main(args: argparse.Namespace) -> int:
    import ddpbench
    from ddpbench.calibration.run import calibrate, progress_steps
    from ddpbench.cli import UsageError, check_writable_file

    backends = (ddpbench.available() if args.backends is None
                else [b.strip() for b in args.backends.split(",") if b.strip()])
    if args.iterations < 1:
        raise UsageError(f"--iterations must be >= 1, got {args.iterations}")
    try:
        counts = [int(x) for x in args.step_processes.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--step-processes expects comma-separated counts, got "
                         f"{args.step_processes!r}") from None
    earlier = None
    if args.compare is not None:
        from ddpbench.calibration.machine import load_machine

        try:
            earlier = load_machine(args.compare)
        except ValueError as err:
            raise UsageError(str(err)) from None
    check_writable_file(args.output, "-o")
    steps = progress_steps(backends, args.rounds)
    from tqdm import tqdm

    bar: Any = None  # drawn from the first step on, once calibrate has checked its inputs

    def tick(step: str) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=steps, desc="calibrate", unit="step", file=sys.stderr)
        else:
            bar.update(1)
        bar.set_postfix_str(step)

    def close_bar(done: bool = False) -> None:
        if bar is not None:
            if done:
                bar.update(1)
            bar.close()

    t0 = time.perf_counter()
    try:
        machine = calibrate(backends, workers=args.workers, servers=args.servers,
                            workload=args.workload, compute_scale=args.compute_scale,
                            size_scale=args.size_scale, iterations=args.iterations,
                            timeout_s=args.timeout, step_processes=counts,
                            step_repeats=args.step_repeats, rounds=args.rounds,
                            bind=args.bind, progress=tick)
    except ValueError as err:
        close_bar()
        raise UsageError(str(err)) from None
    except RuntimeError as err:  # a real run failed: its message, no traceback
        close_bar()
        print(f"ddpbench calibrate: error: {err}", file=sys.stderr)
        return 1
    close_bar(done=True)
    try:
        machine.save(args.output)
    except OSError as err:
        raise UsageError(f"cannot write {args.output}: {err.strerror}") from None
    print(f"machine profile -> {args.output} ({time.perf_counter() - t0:.0f} s): latency "
          f"{machine.latency_us:.1f} us, bandwidth {machine.bandwidth_gbps:.1f} Gbit/s, "
          f"{machine.cores} cores, sleep overhead {machine.compute_overhead_us:.0f} us")
    for name, fit in machine.backends.items():
        print(f"  {name:<10} per message {fit.per_message_us:8.1f} us  bandwidth "
              f"{fit.bandwidth_gbps:7.2f} Gbit/s  compute x{fit.compute_factor:.2f}"
              + ("  (bandwidth shared by the parameter-server backends)"
                 if fit.bandwidth_shared else ""))
    if earlier is not None:
        _compare(earlier, machine)
    return 0


def fitted_values(machine: Any) -> dict[str, float]:
    """Return the profile's fitted values by name (what a second calibration should repeat)."""
    out = {"latency_us": machine.latency_us, "bandwidth_gbps": machine.bandwidth_gbps,
           "compute_overhead_us": machine.compute_overhead_us,
           "compute_rate": machine.compute_rate}
    for style in machine.ring_step_us:
        s0, k = (machine.step_us(style, machine.cores),
                 machine.step_us(style, machine.cores + 1) - machine.step_us(style, machine.cores))
        out[f"ring_step.{style}.s0_us"], out[f"ring_step.{style}.k_us"] = s0, k
    from ddpbench.calibration.machine import contention_law

    if machine.handoff_us is not None:
        s0, k = contention_law(machine.handoff_us, machine.cores)
        out["handoff.s0_us"], out["handoff.k_us"] = s0, k
    for name, fit in machine.backends.items():
        for field in ("per_message_us", "bandwidth_gbps", "compute_factor"):
            out[f"{name}.{field}"] = getattr(fit, field)
    return out


_RUN_OF_FIT = {"per_message_us": "small", "bandwidth_gbps": "large", "compute_factor": None}
"""A backend fit -> the calibration run it is solved from (None: the workload's run)."""


def launch_spread(machine: Any, backend: str, run: str) -> float | None:
    """Return how far the launches of one calibration run spread: (largest - smallest) /
    median of the launches' statistics (their medians; the workload's lower quartiles, as
    ``calibrate`` takes them), from the profile's stored iteration times; None with fewer
    than two launches stored."""
    from ddpbench.calibration.machine import launch_time

    runs = (machine.measurements or {}).get("iteration_ms", {}).get(backend, {})
    launches = runs.get(run) or []
    stat = launch_time if run not in ("small", "large") else statistics.median
    values = [stat(x) for x in launches if x]
    if len(values) < 2:
        return None
    mid = statistics.median(values)
    return (max(values) - min(values)) / mid if mid > 0 else None


def _fit_spread(old: Any, new: Any, key: str) -> float | None:
    """The wider of the two profiles' launch spreads behind backend fit ``key``."""
    backend, _, field = key.partition(".")
    run = _RUN_OF_FIT.get(field, "")
    if run is None:  # the workload's run: the one that is neither synthetic run
        names = [n for n in (new.measurements or {}).get("iteration_ms", {}).get(backend, {})
                 if n not in ("small", "large")]
        run = names[0] if names else ""
    spreads = [x for x in (launch_spread(old, backend, run), launch_spread(new, backend, run))
               if x is not None]
    return max(spreads) if spreads else None


def _compare(old: Any, new: Any) -> None:
    a, b = fitted_values(old), fitted_values(new)
    print(f"against {old.measured_at}: value, earlier, this run, this/earlier, and for a "
          "backend fit the spread of its run's launches ((largest - smallest) / median, the "
          "wider of the two profiles)")
    within: dict[bool, list[bool]] = {True: [], False: []}  # backend fit? -> within 10%
    noise = outside = 0
    shared = [k for k in b if k in a]
    for key in shared:
        ratio = b[key] / a[key] if a[key] else float("inf") if b[key] else 1.0
        fit = key.split(".")[0] in new.backends
        ok = abs(ratio - 1) <= 0.10
        within[fit].append(ok)
        spread = _fit_spread(old, new, key) if fit else None
        if fit and not ok and spread is not None:
            outside += 1
            noise += abs(ratio - 1) <= spread
        print(f"  {key:<32} {a[key]:10.3f} {b[key]:10.3f} {ratio:8.3f}"
              + (f"   launches {100 * spread:5.1f}%" if spread is not None else ""))
    fits, figures = within[True], within[False]
    print(f"{sum(fits) + sum(figures)} of {len(shared)} fitted values within 10% of the "
          f"earlier profile ({sum(fits)} of {len(fits)} backend fits, {sum(figures)} of "
          f"{len(figures)} machine figures)")
    if outside:
        print(f"of the {outside} backend fits outside 10% (with launches stored), {noise} moved "
              "by less than the range of their run's launches (largest - smallest, relative "
              "to the median): within what the launches themselves repeat to")
