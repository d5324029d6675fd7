"""``ddpbench bench sim``: wall time and event count of the simulator on the issue's cases."""

from __future__ import annotations

import argparse
from typing import Any

HELP = "time the network simulator (ResNet-50 horovod at 8..1024 workers, VGG-19 p3)"
# cpu s is this process's CPU time: on a shared machine wall time also counts waiting for a core.

# (case, workload, backend, workers, knobs, target wall seconds, expected events).
# The event counts pin the amount of simulated work: a speed-up that drops events fails.
CASES = [
    ("resnet50 horovod", "resnet50", "horovod", 8, {}, 1.0, 1766),
    ("resnet50 horovod", "resnet50", "horovod", 64, {}, 2.0, 9226),
    ("resnet50 horovod", "resnet50", "horovod", 256, {}, 10.0, 30065),
    ("resnet50 horovod", "resnet50", "horovod", 1024, {}, 60.0, 45449),
    ("vgg19 p3 40k slices", "vgg19", "p3", 8, {"slice_params": 40_000}, 5.0, 310446),
]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bandwidth-gbps", type=float, default=10.0,
                        help="NIC bandwidth per direction (default 10)")
    parser.add_argument("--iterations", type=int, default=2,
                        help="iterations simulated per case, the first one warm-up (default 2)")
    parser.add_argument("--max-workers", type=int, default=1024,
                        help="skip cases with more workers (default 1024)")


def main(args: argparse.Namespace) -> int:
    import time

    from ddpbench.simulator import simulate

    if args.iterations < 2:
        from ddpbench.cli import UsageError

        raise UsageError(f"--iterations must be >= 2 (one warm-up), got {args.iterations}")
    print(f"bandwidth {args.bandwidth_gbps:g} Gbit/s, latency 5 us, {args.iterations} "
          "iterations (1 warm-up)")
    header = (f"{'case':<22}{'workers':>8}{'wall s':>9}{'cpu s':>8}{'target s':>10}{'events':>10}"
              f"{'iter s':>10}")
    print(header)
    print("-" * len(header))
    failed = 0
    for case, workload, backend, workers, knobs, target, expected in CASES:
        if workers > args.max_workers:
            continue
        t0, c0 = time.perf_counter(), time.process_time()
        r = simulate(workload, backend, workers=workers, bandwidth_gbps=args.bandwidth_gbps,
                     iterations=args.iterations, warmup=1, **dict[str, Any](knobs))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        note = ""
        default_run = args.bandwidth_gbps == 10.0 and args.iterations == 2
        if expected is not None and default_run and r.events != expected:
            note = f"  EVENTS CHANGED (expected {expected})"
            failed += 1
        if wall > target:
            note += "  OVER TARGET"
        print(f"{case:<22}{workers:>8}{wall:>9.2f}{cpu:>8.2f}{target:>10.0f}{r.events:>10}"
              f"{r.iteration_time_s:>10.4f}{note}")
    return 1 if failed else 0
