"""``ddpbench bench KIND``: benchmarks that print ratios against a baseline of the same run."""

from __future__ import annotations

import argparse
import importlib

HELP = "run a benchmark (allreduce, sim, ...) and print figures against a same-run baseline"

# kind -> module defining HELP, configure(parser) and main(args) -> int
BENCHES = {
    "allreduce": "ddpbench.benchmarks.allreduce",
    "sim": "ddpbench.benchmarks.sim",
    "scale-kernel": "ddpbench.benchmarks.scale_kernel",
    "trainer": "ddpbench.benchmarks.trainer",
    "ps": "ddpbench.benchmarks.ps",
    "pushpull": "ddpbench.benchmarks.pushpull",
    "noise": "ddpbench.benchmarks.noise",
    "backtest": "ddpbench.benchmarks.backtest",
    "tune": "ddpbench.benchmarks.tune",
}


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", metavar="KIND")
    for kind, modname in BENCHES.items():
        try:
            module = importlib.import_module(modname)
        except ModuleNotFoundError as err:
            if err.name != modname:
                raise
            continue
        p = sub.add_parser(kind, help=module.HELP, description=module.HELP)
        module.configure(p)
        p.set_defaults(_bench_main=module.main)


def main(args: argparse.Namespace) -> int:
    fn = getattr(args, "_bench_main", None)
    if fn is None:
        from ddpbench.cli import UsageError

        raise UsageError(f"name a benchmark: one of {sorted(BENCHES)}")
    return int(fn(args) or 0)
