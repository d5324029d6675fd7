"""``ddpbench run FILE``: run an experiment's sweep and render its report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "run an experiment file (sweep in simulation or on real processes) and render its report"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="experiment YAML file, e.g. experiments/p3_vs_ring.yaml")
    parser.add_argument("--only", metavar="PATTERN",
                        help="run only points whose name matches (a glob such as 'p3[*' or "
                        "a substring such as 'workload=vgg19')")
    parser.add_argument("--mode", metavar="MODE",
                        help="run only points of this mode, e.g. 'simulate' (a report's "
                        "simulated twins without its real runs)")
    parser.add_argument("--jobs", "-j", type=int, default=None, metavar="N",
                        help="parallel processes for simulated points (default: one per core)")
    parser.add_argument("--force", action="store_true",
                        help="run finished points again (their rows are replaced)")
    parser.add_argument("--fresh", action="store_true",
                        help="start over in an empty folder; the old one is kept beside it "
                             "as <folder>.<UTC time>")
    parser.add_argument("--dry-run", action="store_true",
                        help="list the points that would run, run nothing")
    parser.add_argument("--executor", choices=["local", "mpi"], default="local",
                        help="local processes (default) or mpi4py.futures workers; on a "
                             "cluster start the pool up front: mpiexec -n 1+J python -m "
                             "mpi4py.futures -m ddpbench run FILE --executor mpi --jobs J")
    parser.add_argument("--outdir", type=Path, default=None,
                        help="report folder (default: reports/<name>)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("--no-report", action="store_true", help="do not render the report")
    from ddpbench.sizes import add_allow_flag

    add_allow_flag(parser, "every point")


def main(args: argparse.Namespace) -> int:
    from ddpbench.cli import UsageError
    from ddpbench.experiments import runner, schema

    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be >= 1, got {args.jobs}")
    try:
        exp = schema.load_experiment(args.file)
    except schema.ExperimentError as err:
        raise UsageError(str(err)) from None
    outdir = args.outdir or Path("reports") / exp.name
    try:
        summary = runner.run_experiment(
            exp, outdir, jobs=args.jobs, executor=args.executor, only=args.only, mode=args.mode,
            force=args.force, fresh=args.fresh, dry_run=args.dry_run, progress=not args.no_progress,
            render_report=not args.no_report, allow_large=args.allow_large,
        )
    except (ValueError, RuntimeError) as err:
        raise UsageError(str(err)) from None
    except OSError as err:  # a full disk, a quota, a file-size limit: finished rows are kept
        print(f"ddpbench run: error: cannot write the results in {outdir}: {err}; every row "
              f"written before is kept: make room and run again to resume", file=sys.stderr)
        return 1
    if args.dry_run:
        for mode, name in summary.planned:
            print(f"{mode:8s} {name}")
        print(f"{len(summary.planned)} of {summary.total} points would run "
              f"({summary.skipped} finished; --force runs them again)")
        return 0
    if summary.moved_aside is not None:
        print(f"--fresh: the old folder is kept as {summary.moved_aside}")
    if summary.archived:
        print(f"{summary.archived} rows made under another version of the spec (changed "
              f"points, knobs or input files) moved to {summary.history}")
    print(f"{exp.name}: {summary.ok} ran ok, {summary.failed} failed, {summary.skipped} "
          f"already finished, of {summary.total} points -> {outdir / 'results.csv'}")
    if summary.report:
        print(f"report: {outdir / 'report.md'} ({len(summary.report)} files)")
    elif (outdir / "report.md").exists():
        print(f"report: {outdir / 'report.md'} (up to date; 'ddpbench run {args.file} "
              f"--force' computes every point again)")
    if summary.failed:
        from ddpbench.messages import bounded

        print(bounded("\n".join(["failed points:", *runner.iter_failures(summary)]),
                      name="run"), file=sys.stderr)
        return 1
    return 0
