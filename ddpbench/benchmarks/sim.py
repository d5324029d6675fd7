"""``ddpbench bench sim``: wall time and event count of the simulator on the issue's cases."""

from __future__ import annotations

import argparse
from typing import Any

HELP = ("time the network simulator (ResNet-50 horovod at 8..1024 workers and hierarchical on "
        "1024 hosts x 8 GPUs with jitter, VGG-19 p3 at 8 and 64 hosts, kvstore's events, "
        "GPT-2 XL fsdp and zero-3 on 128 hosts x 8 H100)")
# cpu s is this process's CPU time: on a shared machine wall time also counts waiting for a core.

# (case, workload, backend, cluster and knobs, target wall seconds, expected events).
# The event counts pin the amount of simulated work: a speed-up that drops events fails.
# The hierarchical case has jitter, so every one of its 8,192 GPUs computes at its own speed
# (each rank's clock is simulated; the collective waits for the slowest).
_HIER = {"hosts": 1024, "gpus_per_host": 8, "hierarchical": True, "jitter": 0.05,
         "transport": "tcp", "intra_link": "nvlink"}
# Sharded data parallelism: every rank alike, one event per collective (issue 55).
_SHARDED = {"hosts": 128, "gpus_per_host": 8, "intra_link": "nvlink", "transport": "rdma",
            "device": "H100"}
CASES: list[tuple[str, str, str, dict[str, Any], float, int | None]] = [
    ("resnet50 horovod", "resnet50", "horovod", {"workers": 8}, 1.0, 1766),
    ("resnet50 horovod", "resnet50", "horovod", {"workers": 64}, 2.0, 9226),
    ("resnet50 horovod", "resnet50", "horovod", {"workers": 256}, 10.0, 30065),
    ("resnet50 horovod", "resnet50", "horovod", {"workers": 1024}, 60.0, 45449),
    ("resnet50 hier. jitter", "resnet50", "horovod", _HIER, 10.0, 1840),
    ("vgg19 p3 40k slices", "vgg19", "p3", {"workers": 8, "slice_params": 40_000}, 5.0, 160065),
    ("vgg19 p3 40k slices", "vgg19", "p3", {"workers": 64}, 10.0, 1381761),
    ("vgg19 kvstore", "vgg19", "kvstore", {"workers": 4}, 5.0, 2767),
    ("vgg19 kvstore", "vgg19", "kvstore", {"workers": 16}, 5.0, 32928),
    ("vgg19 kvstore", "vgg19", "kvstore", {"workers": 64}, 10.0, 470616),
    ("gpt2_xl fsdp 128x8", "gpt2_xl", "fsdp", _SHARDED, 5.0, 7652),
    ("gpt2_xl zero-3 128x8", "gpt2_xl", "zero", {**_SHARDED, "stage": 3}, 5.0, 5443),
]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bandwidth-gbps", type=float, default=10.0,
                        help="NIC bandwidth per direction (default 10)")
    parser.add_argument("--iterations", type=int, default=2,
                        help="iterations simulated per case, the first one warm-up (default 2)")
    parser.add_argument("--max-workers", type=int, default=1024,
                        help="skip cases with more hosts (default 1024)")
    parser.add_argument("--baseline", metavar="CHECKOUT",
                        help="another ddpbench checkout (e.g. the main branch's): time each "
                             "case with its code too, in a subprocess of this run, and print "
                             "the CPU-time ratio baseline / this (cases it cannot run: -)")


_CHILD = """\
import json, sys, time
from ddpbench.simulator import simulate
case = json.loads(sys.argv[1])
c0 = time.process_time()
r = simulate(case["workload"], case["backend"], bandwidth_gbps=case["bw"],
             iterations=case["iterations"], warmup=1, **case["setting"])
print(json.dumps({"cpu": time.process_time() - c0, "events": r.events,
                  "iteration_time_s": r.iteration_time_s}))
"""


def _baseline(checkout: str, case: dict[str, Any]) -> dict[str, Any] | None:
    """Return the case's cpu seconds and events under ``checkout``'s code, or None."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": checkout}
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(case)], env=env, cwd=checkout,
                          capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        return None
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def main(args: argparse.Namespace) -> int:
    import gc
    import time

    from ddpbench.cli import UsageError
    from ddpbench.simulator import simulate

    if args.iterations < 2:
        raise UsageError(f"--iterations must be >= 2 (one warm-up), got {args.iterations}")
    if not (0 < args.bandwidth_gbps < float("inf")):
        raise UsageError(f"--bandwidth-gbps must be a finite number > 0, got "
                         f"{args.bandwidth_gbps:g}")
    print(f"bandwidth {args.bandwidth_gbps:g} Gbit/s, latency 5 us, {args.iterations} "
          "iterations (1 warm-up)")
    header = (f"{'case':<22}{'workers':>8}{'wall s':>9}{'cpu s':>8}{'target s':>10}{'events':>10}"
              f"{'iter s':>10}{'events/s':>10}")
    if args.baseline:
        header += f"{'base cpu s':>11}{'base/this':>10}"
    print(header)
    print("-" * len(header))
    failed = 0
    for case, workload, backend, setting, target, expected in CASES:
        workers = setting.get("workers") or setting["hosts"] * setting["gpus_per_host"]
        if setting.get("hosts", workers) > args.max_workers:
            continue
        # The previous case's result (a timeline of up to millions of spans) would otherwise
        # stay alive and make every garbage collection of this case walk it.
        r = None
        gc.collect()
        t0, c0 = time.perf_counter(), time.process_time()
        r = simulate(workload, backend, bandwidth_gbps=args.bandwidth_gbps,
                     iterations=args.iterations, warmup=1, **setting)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        note = ""
        default_run = args.bandwidth_gbps == 10.0 and args.iterations == 2
        if expected is not None and default_run and r.events != expected:
            note = f"  EVENTS CHANGED (expected {expected})"
            failed += 1
        if wall > target:
            note += "  OVER TARGET"
        line = (f"{case:<22}{workers:>8}{wall:>9.2f}{cpu:>8.2f}{target:>10.0f}{r.events:>10}"
                f"{r.iteration_time_s:>10.4f}{r.events / cpu if cpu else 0:>10.0f}")
        if args.baseline:
            base = _baseline(args.baseline, {"workload": workload, "backend": backend,
                                             "setting": setting, "bw": args.bandwidth_gbps,
                                             "iterations": args.iterations})
            if base is None:
                line += f"{'-':>11}{'-':>10}"
            else:
                line += f"{base['cpu']:>11.2f}{base['cpu'] / cpu if cpu else 0:>10.2f}"
                if base["events"] != r.events or base["iteration_time_s"] != r.iteration_time_s:
                    note += "  DIFFERS FROM BASELINE"
        print(line + note)
    return 1 if failed else 0
