"""``ddpbench bench backtest``: a simulator change judged on every stored real run, not one.

A report folder that puts real runs beside their simulated twins on a calibrated machine
(``reports/real_local``) keeps, at each commit that changed it, what was measured: the real
repetitions with their timed iterations (``results.csv``) and the machine profile the run
was calibrated with (``machine.yaml``). On a noisy machine one run says little about a
change to the model (the same point moves between runs an hour apart), so this benchmark
reads every stored version of the folder from git history and simulates each real point's
twin again on today's simulator with that run's own profile. Per run it prints the scores
as shipped (the twins stored with the run, made by the code of its day: the same run's
baseline) beside today's: the median ``|real/sim - 1|``, the points beyond 25%, and the
medians at the calibration's worker count (in sample) and at the others (out of sample).
A real point is the median over its repetitions of each repetition's lower quartile
(:func:`~ddpbench.calibration.machine.launch_time`), as a report with ``aggregate:
quartile`` shows it, for every stored run alike.

Nothing is measured: the real runs are the stored ones. Runs whose folder had no machine
profile, or whose profile or points today's code cannot read (fields renamed since), are
listed as skipped with the reason.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

HELP = ("re-simulate every stored real run of a report folder (its git history) on today's "
        "simulator and print its scores beside those it shipped with")


@dataclass
class StoredRun:
    """One stored version of a report folder: its commit, results and machine profile."""

    label: str
    date: str
    results: str
    machine: str | None


@dataclass
class Score:
    """What a run scores: ``|real/sim - 1|`` per point, and which were in sample."""

    errors: list[float] = field(default_factory=list)
    inside: list[bool] = field(default_factory=list)
    ratios: dict[str, float] = field(default_factory=dict)  # point label -> real/sim

    def line(self) -> tuple[str, str, str, str]:
        """Return median, beyond 25%, in-sample and out-of-sample median, formatted."""
        def med(xs: list[float]) -> str:
            return f"{statistics.median(xs):.1%}" if xs else "-"

        ins = [e for e, i in zip(self.errors, self.inside) if i]
        outs = [e for e, i in zip(self.errors, self.inside) if not i]
        return (med(self.errors), str(sum(e > 0.25 for e in self.errors)), med(ins), med(outs))


def stored_runs(folder: str | Path, since: str | None = None,
                limit: int | None = None, cwd: str | Path = ".") -> list[StoredRun]:
    """Return the versions of ``folder``'s ``results.csv`` in git history, newest first.

    Raises:
        ValueError: ``folder`` is not inside a git work tree or has no committed results.
    """
    path = Path(folder).as_posix().rstrip("/")
    if since and re.fullmatch(r"\d{4}-\d{2}-\d{2}", since):
        since += " 00:00:00"  # git reads a bare date as that day at the current time
    cmd = ["git", "log", "--format=%h %cI", *([f"--since={since}"] if since else []),
           "--", f"{path}/results.csv"]
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        detail = getattr(err, "stderr", "") or str(err)
        raise ValueError(f"cannot read the git history of {path}: {detail.strip()}") from None
    runs = []
    for line in out.splitlines():
        commit, date = line.split()
        results = _show(commit, f"{path}/results.csv", cwd)
        if results is None:
            continue
        runs.append(StoredRun(commit, date, results, _show(commit, f"{path}/machine.yaml", cwd)))
        if limit is not None and len(runs) >= limit:
            break
    if not runs:
        raise ValueError(f"{path}/results.csv has no committed version"
                         + (f" since {since}" if since else ""))
    return runs


def folder_run(folder: str | Path) -> StoredRun:
    """Return the run kept in ``folder`` (its results.csv and, if there, machine.yaml): one
    that was never committed, such as a run on another machine.

    Raises:
        ValueError: ``folder`` has no results.csv.
    """
    path = Path(folder)
    try:
        results = (path / "results.csv").read_text()
    except OSError as err:
        raise ValueError(f"--run {folder}: cannot read its results.csv ({err.strerror})") from None
    machine = path / "machine.yaml"
    text = machine.read_text() if machine.is_file() else None
    date = ""
    if text is not None:
        data = yaml.safe_load(text)
        date = str(data.get("measured_at", "")) if isinstance(data, dict) else ""
    return StoredRun(path.name or str(path), date, results, text)


def _show(commit: str, path: str, cwd: str | Path) -> str | None:
    res = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=cwd, capture_output=True,
                         text=True)
    return res.stdout if res.returncode == 0 else None


def parse_point(name: str) -> tuple[str, dict[str, Any]]:
    """Return the backend and parameters of a point name ``backend[k=v,...]``.

    Raises:
        ValueError: a name that is not of that form.
    """
    backend, sep, rest = name.partition("[")
    if not sep or not rest.endswith("]") or not backend:
        raise ValueError(f"not a point name: {name!r}")
    params: dict[str, Any] = {}
    for item in filter(None, rest[:-1].split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"point {name!r}: {item!r} is not key=value")
        params[key] = yaml.safe_load(value)
    return backend, params


def real_points(results: str) -> dict[str, float]:
    """Return each real point's time: the median over its repetitions of their lower
    quartiles (the stored iteration time where a row has no samples)."""
    from ddpbench.calibration.machine import launch_time

    reps: dict[str, list[float]] = {}
    for row in csv.DictReader(io.StringIO(results)):
        if row.get("mode") != "real" or row.get("status") != "ok":
            continue
        samples = row.get("samples_s")
        t = launch_time(json.loads(samples)) if samples else float(row["iteration_time_s"])
        reps.setdefault(row["point"], []).append(t)
    return {p: statistics.median(ts) for p, ts in reps.items()}


def shipped_twins(results: str) -> dict[str, float]:
    """Return each simulated point's stored iteration time (its first ok repetition)."""
    out: dict[str, float] = {}
    for row in csv.DictReader(io.StringIO(results)):
        if row.get("mode") == "simulate" and row.get("status") == "ok":
            out.setdefault(row["point"], float(row["iteration_time_s"]))
    return out


def simulate_twin(name: str, machine: str) -> float:
    """Return today's simulated iteration time of point ``name`` on the profile ``machine``."""
    from ddpbench.experiments.throughput.points import run_point

    backend, params = parse_point(name)
    params.update({"mode": "simulate", "backend": backend, "repetition": 0,
                   "machine": machine})
    return float(run_point(params)["iteration_time_s"])


def _today(args: tuple[str, str]) -> float | str:
    try:
        return simulate_twin(*args)
    except Exception as err:  # noqa: BLE001 - reported as the run's skip reason
        return f"{type(err).__name__}: {err}"


def backtest(run: StoredRun, workdir: Path, pool: Any = None,
             refit: bool = False) -> tuple[Score, Score] | str:
    """Return the run's (shipped, today) scores, or why it cannot be re-simulated.

    With ``refit``, today's scores use the run's backend fits made again by today's
    simulator from the launches its profile stored (:func:`ddpbench.calibration.run.refit`),
    so that a change to what the calibration runs themselves simulate to is judged too.
    """
    from ddpbench import contract
    from ddpbench.calibration.machine import parse_machine

    if run.machine is None:
        return "no machine profile stored with it"
    try:
        m = parse_machine(yaml.safe_load(run.machine), f"{run.label}:machine.yaml")
    except (ValueError, yaml.YAMLError) as err:
        return f"its profile does not load today ({err})"
    real, stored = real_points(run.results), shipped_twins(run.results)
    names = [p for p in real if p in stored]
    if not names:
        return "no real point with a simulated twin"
    path = workdir / f"{run.label}.yaml"
    if refit:
        from ddpbench.calibration.run import refit as refit_machine

        default = contract.Schedule.model_fields["size_scale"].default
        scale = parse_point(names[0])[1].get("size_scale", default)
        try:
            m = refit_machine(m, size_scale=float(scale))
        except ValueError as err:
            return f"cannot refit it ({err})"
        m.save(path)
    else:
        path.write_text(run.machine)
    jobs = [(p, str(path)) for p in names]
    today = list(pool.map(_today, jobs) if pool is not None else map(_today, jobs))
    for got in today:
        if isinstance(got, str):
            return f"a point does not simulate today ({got})"
    shipped, now = Score(), Score()
    for p, t in zip(names, today):
        backend, params = parse_point(p)
        inside = params.get("workers") == m.workers
        label = point_label(backend, params)
        for score, sim in ((shipped, stored[p]), (now, float(t))):
            score.errors.append(abs(real[p] / sim - 1))
            score.inside.append(inside)
            score.ratios[label] = real[p] / sim
    return shipped, now


def point_label(backend: str, params: dict[str, Any]) -> str:
    """Return a point's name without its machine profile's path (the same point across
    runs calibrated into different files)."""
    from ddpbench.experiments.naming import make_name

    return make_name(backend, {k: v for k, v in params.items() if k != "machine"})


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--folder", default="reports/real_local",
                        help="report folder whose git history holds the runs (default "
                             "reports/real_local)")
    parser.add_argument("--since", default=None,
                        help="only runs committed since this date (git log --since, e.g. "
                             "2026-11-26)")
    parser.add_argument("--limit", type=int, default=None,
                        help="only the newest N runs")
    parser.add_argument("--run", action="append", default=[], metavar="DIR",
                        help="also a run kept in DIR (its results.csv and machine.yaml), "
                             "never committed: a run on another machine; repeatable")
    parser.add_argument("--no-history", action="store_true",
                        help="only the --run folders, not the folder's git history")
    parser.add_argument("--jobs", "-j", type=int, default=2,
                        help="processes simulating points (default 2)")
    parser.add_argument("--refit", action="store_true",
                        help="fit each run's backends again from the launches its profile "
                             "stored, on today's simulator, before simulating its points "
                             "(judges a change to what the calibration runs simulate to)")
    parser.add_argument("--points", action="store_true",
                        help="also print each point's real/sim today over the runs: median, "
                             "range and how many runs put it beyond 25%%")


def main(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ddpbench.cli import UsageError

    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit must be >= 1, got {args.limit}")
    if args.jobs < 1:
        raise UsageError(f"--jobs must be >= 1, got {args.jobs}")
    try:
        runs = [folder_run(d) for d in args.run]
        if not args.no_history:
            runs += stored_runs(args.folder, args.since, args.limit)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if not runs:
        raise UsageError("nothing to backtest: --no-history needs --run DIR")
    header = ("run", "date", "points", "shipped: median", ">25%", "in", "out",
              "today: median", ">25%", "in", "out")
    rows, skipped = [], []
    per_point: dict[str, list[float]] = {}
    totals: dict[str, list[float]] = {"shipped": [], "today": []}
    beyond = {"shipped": 0, "today": 0}
    with tempfile.TemporaryDirectory() as tmp, ProcessPoolExecutor(args.jobs) as pool:
        for run in tqdm(runs, desc="backtest", unit="run", file=sys.stderr,
                        dynamic_ncols=True):
            got = backtest(run, Path(tmp), pool, refit=args.refit)
            if isinstance(got, str):
                skipped.append(f"{run.label} ({run.date[:16]}): {got}")
                continue
            shipped, now = got
            rows.append((run.label, run.date[:16], str(len(now.errors)),
                         *shipped.line(), *now.line()))
            for label, ratio in now.ratios.items():
                per_point.setdefault(label, []).append(ratio)
            for key, score in (("shipped", shipped), ("today", now)):
                totals[key].append(statistics.median(score.errors))
                beyond[key] += sum(e > 0.25 for e in score.errors)
    if rows:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        for r in (header, *rows):
            print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
        print(f"{len(rows)} runs: points beyond 25% {beyond['shipped']} as shipped, "
              f"{beyond['today']} today; median of the runs' medians "
              f"{statistics.median(totals['shipped']):.1%} as shipped, "
              f"{statistics.median(totals['today']):.1%} today; today's median lower in "
              f"{sum(t < s for s, t in zip(totals['shipped'], totals['today']))} of "
              f"{len(rows)} runs")
    if args.points and per_point:
        print("real/sim today, per point over the runs (median, smallest-largest, runs "
              "beyond 25%):")
        for label, ratios in sorted(per_point.items(), key=lambda kv: kv[0]):
            print(f"  {label}: {statistics.median(ratios):.2f} ({min(ratios):.2f}-"
                  f"{max(ratios):.2f}), {sum(abs(r - 1) > 0.25 for r in ratios)} of "
                  f"{len(ratios)}")
    for line in skipped:
        print(f"skipped {line}")
    return 0 if rows else 1
