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
    if args.experiment:
        _check_same_points(exp, outdir, args.experiment)
    paths = runner.render(exp, outdir)
    for p in paths:
        print(p)
    return 0


def _check_same_points(exp: object, outdir: Path, file: str) -> None:
    """Refuse ``--experiment FILE`` unless FILE describes the points ``outdir`` was run with
    (its prose may differ): another experiment's file would put its backends and axes in
    the report's header over rows it did not make.

    Raises:
        UsageError: another experiment, or other points, naming both and what to run.
    """
    import json

    from ddpbench.cli import UsageError
    from ddpbench.experiments import manifest, runner

    try:
        doc = json.loads((outdir / manifest.MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # no manifest to compare with: the file is all there is
    name = getattr(exp, "name", None)
    if doc.get("name") != name:
        raise UsageError(f"{outdir} holds the results of experiment {doc.get('name')!r}, "
                         f"but {file} is experiment {name!r}: its report would describe rows "
                         f"it did not make. Use `ddpbench report {outdir}` (the stored "
                         f"experiment), or run {file} into a folder of its own")
    keys = runner.point_keys(exp)  # type: ignore[arg-type]
    stored = doc.get("points") or {}
    if stored and keys != stored:
        missing = sum(1 for k, v in keys.items() if stored.get(k) != v)
        extra = sum(1 for k in stored if k not in keys)
        raise UsageError(f"{file} describes other points than {outdir} was run with "
                         f"({missing} of its {len(keys)} points are not in the folder as they "
                         f"are now; {extra} of the folder's {len(stored)} are not in the "
                         f"file): run it first (`ddpbench run {file} --outdir {outdir}`), or "
                         f"use `ddpbench report {outdir}` to re-render what was run")
