"""``ddpbench report DIR``: re-render a report from its results.csv (nothing runs)."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "re-render reports/<name>/report.md and .html from its results.csv"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", type=Path, help="a report folder, e.g. reports/p3_vs_ring")
    parser.add_argument("--experiment", metavar="FILE",
                        help="the experiment YAML (default: the copy the run stored in DIR)")


def main(args: argparse.Namespace) -> int:
    from ddpbench.cli import UsageError
    from ddpbench.experiments import kinds, runner, schema

    outdir: Path = args.dir
    if not (outdir / "results.csv").is_file():
        raise UsageError(f"{outdir} has no results.csv; run the experiment first "
                         f"(ddpbench run experiments/<name>.yaml)")
    try:
        if args.experiment:
            exp = schema.load_experiment(args.experiment)
        else:
            exp = runner.load_saved_experiment(outdir)
    except FileNotFoundError:
        raise UsageError(f"{outdir} has no experiment.json; pass --experiment FILE") from None
    except (ValueError, kinds.KindUnavailableError) as err:
        raise UsageError(str(err)) from None
    paths = runner.render(exp, outdir)
    for p in paths:
        print(p)
    return 0
