"""Run experiment files: expand the sweep, run every point, keep one CSV row per result.

``ddpbench run experiments/X.yaml`` validates the file (:mod:`ddpbench.experiments.schema`), expands it
into points, runs the points that ``reports/X/results.csv`` does not already hold (simulated
points in parallel processes, real points one after another through ``ddpbench launch``),
appends one row per point and repetition as each finishes, then renders the report.

Results file (``results.csv``): one row per (mode, point, repetition), the key. A row is
appended with a single ``write`` on a file opened for appending and flushed to disk, so
killing the run loses no finished row; a torn last line (killed mid-write) is dropped on the
next read. Every row is validated as it is read (one row is one line: the right number of
cells, a point, a known status, JSON that parses): one that does not parse is reported on
stderr, moved to ``results.rejected.csv`` beside the file, and its point runs again; it is
never counted as finished. When a row brings new columns, or replaces an older row of the same key, the
whole file is rewritten to a temporary file and renamed over the old one (atomic). A rerun
skips every key whose row has ``status == "ok"`` and runs again the failed and missing ones
(``force=True`` runs them all); the new row replaces the old one, so every key appears once.

The kinds it runs implement :class:`ddpbench.experiments.kinds.ExperimentKind` and are
registered in :mod:`ddpbench.experiments.kinds`; this module only executes, it knows no kind
by name, and it is the one writer of results.csv.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import csv
import datetime as _dt
import fnmatch
import io
import json
import math
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpbench.experiments import manifest
from ddpbench.experiments.kinds import load_kind
from ddpbench.experiments.naming import public
from ddpbench.experiments.schema import Experiment
from ddpbench.messages import ERROR_CELL_CHARS, cut

__all__ = [
    "RUNNER_COLUMNS",
    "ResultsStore",
    "RunSummary",
    "expand_points",
    "load_saved_experiment",
    "read_results",
    "render",
    "run_experiment",
]

RUNNER_COLUMNS = ("experiment", "kind", "mode", "point", "repetition", "status", "error")
_LEGACY_COLUMNS = ("wall_s", "finished_at")  # the run log's fields: dropped from results.csv
# -- results.csv -----------------------------------------------------------------------------
def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


# mkstemp makes owner-only files; reports are meant to be shared like any other file.
_FILE_MODE = _umask_mode()


def _cell(value: Any) -> str:
    """Return one cell's text; never a line break (a row is one line of the file)."""
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(value)
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, separators=(",", ":"))
    return " ".join(str(value).splitlines())


REJECTED = "results.rejected.csv"
"""Beside results.csv: the rows that did not parse when it was read, as they were."""


def _row_problem(header: list[str], cells: list[str]) -> str | None:
    """Return why a row of ``cells`` under ``header`` cannot be a result, or None.

    A row holds exactly the header's cells (the writer fills every column), names its
    point, has status ``ok`` or ``failed`` and a whole repetition, and every cell that
    starts a JSON list or mapping (how lists and dicts are written) parses as JSON.
    """
    if len(cells) != len(header):
        return (f"{len(cells)} cells where the header has {len(header)}: cut short or run "
                f"together")
    row = dict(zip(header, cells))
    if not row.get("point"):
        return "no point name"
    if row.get("status") not in ("ok", "failed"):
        return f"status {row.get('status')!r} is neither ok nor failed"
    rep = row.get("repetition", "0") or "0"
    if not rep.isdigit():
        return f"repetition {rep!r} is not a whole number"
    for col, value in row.items():
        if value[:1] in ("[", "{") and col not in ("point", "error"):
            try:
                json.loads(value)
            except ValueError:
                return f"column {col!r} is not valid JSON: {value[:40]!r}"
    return None


def row_key(row: dict[str, Any]) -> tuple[str, str, str]:
    """Return the key of a row: (mode, point, repetition) as strings."""
    return (str(row.get("mode", "")), str(row["point"]), str(row.get("repetition", 0)))


class ResultsStore:
    """``results.csv`` of one experiment: read, resume, append rows atomically.

    Only one process writes (the runner's); a lock file keeps two runs of the same
    experiment from interleaving.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.header: list[str] = []
        self.rows: list[dict[str, str]] = []
        self.rejected: list[tuple[int, str, str]] = []  # (line, text, why) set aside
        self._index: dict[tuple[str, str, str], int] = {}
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        text = self.path.read_text(encoding="utf-8", errors="replace")
        if text and not text.endswith("\n"):
            # A row torn by a kill mid-write: drop it, it is run again.
            text = text[: text.rfind("\n") + 1]
            self._write_all_text(text)
        lines = text.split("\n")[:-1] if text else []
        if not lines:
            return
        # One row is one line (the writer folds newlines out of every cell), so each line
        # parses alone: a cut quote cannot run into the rows after it.
        self.header = next(csv.reader([lines[0]]), [])
        if "point" not in self.header or "status" not in self.header:
            self.rejected = [(1, line, "no header with point and status columns")
                             for line in lines]
            self.header = []
            self._set_aside(lines[0], fold=False)
            return
        for number, line in enumerate(lines[1:], start=2):
            if not line.strip():
                continue
            try:
                cells = next(csv.reader([line], strict=True), [])
            except csv.Error:
                self.rejected.append((number, line, "a quoted cell is not closed: cut short"))
                continue
            problem = _row_problem(self.header, cells)
            if problem is not None:
                self.rejected.append((number, line, problem))
                continue
            self._add(dict(zip(self.header, cells)))
        if self.rejected:
            self._set_aside(lines[0])
        legacy = [c for c in _LEGACY_COLUMNS if c in self.header]
        if legacy:  # wall times and timestamps belong in the untracked run log
            self.header = [c for c in self.header if c not in legacy]
            for row in self.rows:
                for c in legacy:
                    row.pop(c, None)
            self._rewrite()

    def _set_aside(self, header_line: str, *, fold: bool = True) -> None:
        """Move the rows that do not parse to ``results.rejected.csv`` beside the file (after
        the header they were written under) and say so on stderr; they run again."""
        aside = self.path.with_name(REJECTED)
        try:
            new = not aside.exists()
            with open(aside, "a", encoding="utf-8") as f:
                if new:
                    f.write(header_line + "\n")
                for _number, line, _problem in self.rejected:
                    f.write(line + "\n")
            if fold:
                self._rewrite()
            else:
                self.path.unlink()
        except OSError as err:  # a read-only folder: the rows are still not counted
            where = f"left in place ({err.strerror or err})"
        else:
            where = f"set aside in {aside.name} beside it"
        from ddpbench.messages import bounded

        lines = [f"ddpbench: {len(self.rejected)} row(s) of {self.path} do not parse: {where}; "
                 f"not counted as finished, their points run again"]
        lines += [f"  line {number}: {problem}" for number, _line, problem in self.rejected]
        print(bounded("\n".join(lines), name="results"), file=sys.stderr, flush=True)

    def _add(self, row: dict[str, str]) -> None:
        key = row_key(row)
        if key in self._index:
            self.rows[self._index[key]] = row
        else:
            self._index[key] = len(self.rows)
            self.rows.append(row)

    def reset(self) -> None:
        """Forget every row (the folder was moved aside)."""
        self.header, self.rows, self._index = [], [], {}

    def remove(self, rows: list[dict[str, str]]) -> None:
        """Take ``rows`` out of the file (atomic rewrite)."""
        drop = {id(r) for r in rows}
        kept = [r for r in self.rows if id(r) not in drop]
        self.rows, self._index = [], {}
        for r in kept:
            self._add(r)
        if self.path.exists():
            self._rewrite()

    def done(self) -> set[tuple[str, str, str]]:
        """Return the keys whose row finished with status ``ok``."""
        return {row_key(r) for r in self.rows if r.get("status") == "ok"}

    def append(self, row: dict[str, Any]) -> None:
        """Add ``row`` durably: append one line, or rewrite atomically when needed."""
        cells = {k: _cell(v) for k, v in row.items()}
        new_cols = [k for k in cells if k not in self.header]
        replaces = row_key(cells) in self._index
        self.header.extend(new_cols)
        self._add(cells)
        if new_cols or replaces or not self.path.exists():
            self._rewrite()
            return
        buf = io.StringIO()
        csv.DictWriter(buf, self.header, lineterminator="\n").writerow(cells)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, buf.getvalue().encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)

    def put_in_order(self, order: list[tuple[str, str, str]]) -> None:
        """Rewrite the file in ``order`` (the sweep's expansion order), if it is not already.

        Rows land in the order their points finish, which parallel jobs make vary from run
        to run; once the run is over the file is put in the sweep's order, with columns in
        the order they first appear along it, so a run's results.csv does not depend on
        which point finished first. Rows of keys not in ``order`` keep their place at the end.
        """
        rank = {k: i for i, k in enumerate(order)}
        rows = sorted(self.rows, key=lambda r: rank.get(row_key(r), len(rank)))
        header: dict[str, None] = {c: None for c in RUNNER_COLUMNS if c in self.header}
        for row in rows:
            header.update((c, None) for c in row if c in self.header)
        header.update((c, None) for c in self.header)
        if rows == self.rows and list(header) == self.header:
            return
        self.header, self.rows, self._index = list(header), [], {}
        for row in rows:
            self._add(row)
        self._rewrite()

    def _rewrite(self) -> None:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, self.header, lineterminator="\n", restval="")
        writer.writeheader()
        writer.writerows(self.rows)
        self._write_all_text(buf.getvalue())

    def _write_all_text(self, text: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-results-", dir=self.path.parent)
        os.fchmod(fd, _FILE_MODE)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def read_results(path: Path) -> Any:
    """Return results.csv as a DataFrame (JSON cells stay text)."""
    import pandas as pd

    store = ResultsStore(path)
    if not store.rows:
        return pd.DataFrame(columns=list(RUNNER_COLUMNS))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, store.header, lineterminator="\n", restval="")
    writer.writeheader()
    writer.writerows(store.rows)
    buf.seek(0)
    return pd.read_csv(buf, keep_default_na=False, na_values=[""])


# -- running -----------------------------------------------------------------------------------
@dataclass
class Point:
    """One point of a sweep, with its name and row key."""

    params: dict[str, Any]
    name: str

    @property
    def mode(self) -> str:
        return str(self.params.get("mode", "simulate"))

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.mode, self.name, str(self.params.get("repetition", 0)))


@dataclass
class RunSummary:
    """What a run did."""

    outdir: Path
    total: int = 0
    skipped: int = 0
    ok: int = 0
    failed: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)
    report: list[Path] = field(default_factory=list)
    planned: list[tuple[str, str]] = field(default_factory=list)
    archived: int = 0
    history: Path | None = None
    moved_aside: Path | None = None


def expand_points(exp: Experiment, only: str | None = None) -> list[Point]:
    """Expand ``exp`` into named points, keeping those whose name matches ``only``.

    ``only`` is a glob (``p3[*workers=4*``) when it has ``*`` or ``?``, else a substring;
    brackets match themselves, as in the point names.

    Raises:
        ValueError: two points share a name (the kind's point_name is not injective).
    """
    kind = load_kind(exp.kind)
    points = [Point(p, kind.point_name(p)) for p in kind.expand(exp.spec)]
    seen: dict[tuple[str, str, str], dict] = {}
    for p in points:
        if p.key in seen:
            raise ValueError(f"two points share the name {p.name!r} (mode {p.mode}): "
                             f"{public(seen[p.key])} and {public(p.params)}")
        seen[p.key] = p.params
    if only:
        if any(c in only for c in "*?"):
            # Point names hold brackets (``p3[workers=4]``): they match themselves.
            pattern = only.replace("[", "\0").replace("]", "[]]").replace("\0", "[[]")
            points = [p for p in points if fnmatch.fnmatchcase(p.name, pattern)]
        else:
            points = [p for p in points if only in p.name]
    return points


def _execute(kind_name: str, params: dict[str, Any]) -> tuple[bool, Any, float]:
    """Run one point (in a worker process or in-line): (ok, row or error, seconds)."""
    start = time.perf_counter()
    try:
        row = load_kind(kind_name).run_point(params)
        if not isinstance(row, dict):
            raise TypeError(f"run_point returned {type(row).__name__}, expected a dict")
        return True, row, time.perf_counter() - start
    except BaseException as err:  # noqa: BLE001 - a failed point is a row, not a crash
        if isinstance(err, KeyboardInterrupt):
            raise
        return False, _error_text(err), time.perf_counter() - start


def _execute_batch(kind_name: str, batch: list[dict[str, Any]]) -> list[tuple[bool, Any, float]]:
    """Run the points of one batch in order in one process (see ``ExperimentKind.batch_key``)."""
    return [_execute(kind_name, params) for params in batch]


def _batches(exp: Experiment, points: list[Point]) -> list[list[Point]]:
    """Group ``points`` by the kind's batch key, batches and points in their first order."""
    batch_key = load_kind(exp.kind).batch_key
    batches: list[list[Point]] = []
    by_key: dict[Hashable, list[Point]] = {}
    for p in points:
        key = batch_key(p.params)
        if key is None:
            batches.append([p])
        elif key in by_key:
            by_key[key].append(p)
        else:
            by_key[key] = [p]
            batches.append(by_key[key])
    return batches


def _error_text(err: BaseException) -> str:
    msg = " ".join(str(err).split())
    where = traceback.extract_tb(err.__traceback__)
    origin = f" (at {Path(where[-1].filename).name}:{where[-1].lineno})" if where else ""
    return f"{type(err).__name__}: {msg}{origin}"


def make_executor(kind: str, jobs: int) -> cf.Executor:
    """Return a pool of ``jobs`` workers: local processes (``"local"``) or mpi4py.futures
    workers (``"mpi"``), the executors simulated points and tune's trials run in."""
    if kind == "mpi":
        try:
            from mpi4py.futures import MPIPoolExecutor
        except ImportError as err:
            raise RuntimeError(f"--executor mpi needs mpi4py.futures: {err}") from None
        # main=False: workers need only ddpbench.experiments, not the caller's __main__ (which
        # for `python -m ddpbench` would run the CLI again in every worker).
        return MPIPoolExecutor(max_workers=jobs, main=False)
    import multiprocessing as mp

    # fork would copy the runner's state (tqdm, open files); spawn workers start clean.
    ctx = mp.get_context("forkserver" if sys.platform != "win32" else "spawn")
    return cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx)


def _safe_relpath(outdir: Path, rel: str) -> Path:
    target = (outdir / rel).resolve()
    if outdir.resolve() not in target.parents:
        raise ValueError(f"a result file must stay inside {outdir}, got {rel!r}")
    return target


def _write_files(outdir: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        target = _safe_relpath(outdir, rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=target.parent)
        os.fchmod(fd, _FILE_MODE)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, target)


def point_keys(exp: Experiment, points: list[Point] | None = None) -> dict[str, str]:
    """Return row id -> key of every point of ``exp`` (see :mod:`.manifest`)."""
    points = expand_points(exp) if points is None else points
    fill = load_kind(exp.kind).key_params  # the defaults that change a result, filled in
    return {manifest.row_id(p.mode, p.name, p.params.get("repetition", 0)):
            manifest.point_key(exp.kind, public(fill(p.params))) for p in points}


def save_experiment(exp: Experiment, outdir: Path) -> None:
    """Store the validated experiment and its points' keys in ``outdir/experiment.json``."""
    manifest.write_manifest(exp, outdir, point_keys(exp))


def _saved_keys(doc: dict[str, Any]) -> dict[str, str]:
    """Return the keys of a manifest that holds none, computed from its saved spec."""
    try:
        kind = load_kind(doc.get("kind", "throughput"))
        exp = Experiment(name=doc["name"], kind=doc.get("kind", "throughput"),
                         description=doc.get("description", ""),
                         spec=kind.Spec.model_validate(doc["spec"]),
                         path=doc.get("source", "<saved>"))
        return point_keys(exp)
    except Exception:  # noqa: BLE001 - an old spec that no longer validates keeps nothing
        return {}


def load_saved_experiment(outdir: Path) -> Experiment:
    """Read back ``outdir/experiment.json`` (written by :func:`save_experiment`).

    Raises:
        FileNotFoundError: no experiment.json in ``outdir``.
        ValueError: it does not validate against its kind's Spec.
    """
    doc = json.loads((outdir / "experiment.json").read_text(encoding="utf-8"))
    kind = load_kind(doc.get("kind", "throughput"))
    spec = kind.Spec.model_validate(doc["spec"])
    return Experiment(name=doc["name"], kind=doc.get("kind", "throughput"),
                      description=doc.get("description", ""), spec=spec,
                      path=doc.get("source", "<saved>"))


def render(exp: Experiment, outdir: Path) -> list[Path]:
    """Render the report of ``exp`` in ``outdir`` from its results.csv.

    Where ``exp`` has exactly the points the folder was run with but other prose (``ddpbench
    report DIR --experiment FILE`` after the file's description was edited), the stored
    experiment takes the file's description, so the report shows it; a file with other
    points leaves the stored experiment alone (its rows were not made with that file).
    """
    _refresh_prose(exp, outdir)
    df = read_results(outdir / "results.csv")
    return list(load_kind(exp.kind).render(df, outdir, exp.spec))


def _refresh_prose(exp: Experiment, outdir: Path) -> None:
    try:
        doc = json.loads((outdir / manifest.MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if doc.get("description") == exp.description or doc.get("name") != exp.name:
        return
    keys = point_keys(exp)
    if doc.get("points") == dict(sorted(keys.items())):
        manifest.write_manifest(exp, outdir, keys)


def run_experiment(
    exp: Experiment,
    outdir: Path,
    *,
    jobs: int | None = None,
    executor: str = "local",
    only: str | None = None,
    mode: str | None = None,
    force: bool = False,
    fresh: bool = False,
    dry_run: bool = False,
    progress: bool = True,
    render_report: bool = True,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    allow_large: bool = False,
) -> RunSummary:
    """Run the points of ``exp`` that ``outdir/results.csv`` lacks, then render.

    Args:
        exp: a validated experiment.
        outdir: the report folder (``reports/<name>``).
        jobs: parallel processes for non-real points (default: all cores).
        executor: ``"local"`` (processes on this machine) or ``"mpi"`` (mpi4py.futures).
        only: run only points whose name matches (glob or substring).
        mode: run only points of this mode (``simulate``, ``real``...): a report's
            simulated twins again without its real runs.
        force: run finished points again (their rows are replaced).
        fresh: move an existing ``outdir`` aside (``<outdir>.<UTC time>``) and start over.
        dry_run: list what would run; run nothing, write nothing.
        progress: show a progress bar with ETA on stderr.
        render_report: render the report after the run.
        on_row: called with each row as it is stored (tests use it).
        allow_large: run points past this machine's limits (``--allow-large``); without it
            a run with one such point is refused before any point runs.

    Returns:
        A summary; ``failed > 0`` means some point failed (its row says why).

    Raises:
        ValueError: a bad executor, ``only`` matching no point, a folder that belongs to
            another experiment (:class:`~.manifest.FolderError`), or a point past this
            machine's limits (:class:`ddpbench.sizes.TooLarge`).
    """
    if executor not in ("local", "mpi"):
        raise ValueError(f"unknown executor {executor!r}; valid: ['local', 'mpi']")
    outdir = Path(outdir)
    manifest.check_outdir(outdir)
    points, keys = _select(exp, only, mode)
    summary = RunSummary(outdir=outdir, total=len(points))
    store = ResultsStore(outdir / "results.csv")
    if dry_run:
        done = _done_dry(exp, outdir, keys, store, force=force, fresh=fresh)
    else:
        finished = set() if force or fresh else store.done()
        check_sizes(exp, [p for p in points if p.key not in finished], allow=allow_large)
        lock = _claim(exp, outdir, keys, store, summary, fresh=fresh)
        done = set() if force else store.done()
    todo = [p for p in points if p.key not in done]
    summary.skipped = len(points) - len(todo)
    summary.planned = [(p.mode, p.name) for p in todo]
    if dry_run:
        return summary
    try:
        _run_points(exp, outdir, store, todo, summary, jobs, executor, progress, on_row)
        store.put_in_order([p.key for p in expand_points(exp)])
    finally:
        lock.close()
    if render_report and not _report_up_to_date(outdir, summary):
        summary.report = render(exp, outdir)
    return summary


def check_sizes(exp: Experiment, points: list[Point], *, allow: bool = False) -> None:
    """Refuse a run before any point runs when a point to run passes this machine's limits.

    Every point's size is the kind's estimate (:meth:`~.kinds.ExperimentKind.size`); the
    first one past the limits is named with its estimate (:func:`ddpbench.sizes.check`).
    Points that passed (or every point, with ``allow``) are marked ``_allow_large``, so
    that they do not estimate and refuse themselves again when they run.

    Raises:
        ddpbench.sizes.TooLarge: naming the point, its estimate and ``--allow-large``.
    """
    from ddpbench import sizes

    if allow:
        for p in points:
            p.params["_allow_large"] = True
        return
    size = load_kind(exp.kind).size
    refused: list[tuple[Point, Exception]] = []
    for p in points:
        cost = size(p.params)
        if cost is None:
            continue
        try:
            sizes.check(cost)
        except sizes.TooLarge as err:
            refused.append((p, err))
    if refused:
        point, first = refused[0]
        count = (f" (and {len(refused) - 1} more of the {len(points)} points to run)"
                 if len(refused) > 1 else "")
        raise sizes.TooLarge(f"point {point.name}{count}: {first}")
    for p in points:
        p.params["_allow_large"] = True


def _select(exp: Experiment, only: str | None,
            mode: str | None = None) -> tuple[list[Point], dict[str, str]]:
    """Return the points to consider (matching ``only`` and ``mode``) and every point's key."""
    every = expand_points(exp)
    keys = point_keys(exp, every)
    points = expand_points(exp, only) if only else every
    if only and not points:
        names = ", ".join(p.name for p in every[:3])
        raise ValueError(f"--only {only!r} matches none of the {len(every)} points of "
                         f"{exp.name} (names look like: {names})")
    if mode is not None:
        modes = sorted({p.mode for p in every})
        points = [p for p in points if p.mode == mode]
        if not points:
            raise ValueError(f"--mode {mode!r} matches none of the points to run of "
                             f"{exp.name}; its modes: {modes}")
    return points, keys


def _done_dry(exp: Experiment, outdir: Path, keys: dict[str, str], store: ResultsStore, *,
              force: bool, fresh: bool) -> set[tuple[str, str, str]]:
    """Return the keys a real run would skip, writing nothing (``dry_run``)."""
    doc = None if fresh else manifest.read_manifest(outdir)
    if doc is not None and doc["name"] != exp.name:
        raise manifest.FolderError(f"{outdir} holds the results of experiment "
                                   f"{doc['name']!r}, not {exp.name!r}")
    stale = {row_key(r) for r in manifest.stale_rows(doc, keys, store.rows, _saved_keys)
             } if doc is not None else {row_key(r) for r in store.rows}
    return set() if force or fresh else store.done() - stale


def _claim(exp: Experiment, outdir: Path, keys: dict[str, str], store: ResultsStore,
           summary: RunSummary, *, fresh: bool) -> Any:
    """Lock ``outdir`` and claim it for ``exp`` (:func:`.manifest.claim`); return the lock."""
    outdir.mkdir(parents=True, exist_ok=True)
    lock = _lock(outdir)
    try:
        claimed = manifest.claim(exp, outdir, keys, store, fresh=fresh, old_keys=_saved_keys)
    except BaseException:
        lock.close()
        raise
    if claimed.moved_aside is not None:
        lock.close()
        outdir.mkdir(parents=True, exist_ok=True)
        lock = _lock(outdir)
        manifest.write_manifest(exp, outdir, keys)
    summary.moved_aside, summary.history, summary.archived = (
        claimed.moved_aside, claimed.history, claimed.moved)
    return lock


def _report_up_to_date(outdir: Path, summary: RunSummary) -> bool:
    """Return whether report.md is newer than the results and nothing changed in this run."""
    report_md = outdir / "report.md"
    return (report_md.exists() and summary.ok + summary.failed + summary.archived == 0
            and all(report_md.stat().st_mtime >= (outdir / f).stat().st_mtime
                    for f in ("results.csv", "experiment.json")))


RUN_LOG = "run-log.jsonl"
"""Per folder, one JSON line per point run: when it finished and how long it took. Kept out
of results.csv (and out of git) so a committed report changes only when its results do."""


def log_run(outdir: Path, row: dict[str, Any], seconds: float, *,
            error: str | None = None) -> None:
    """Append the wall time and finishing time of ``row``'s point to the run log (and a
    failed point's whole error, where the row holds it cut)."""
    entry = {"point": row.get("point"), "mode": row.get("mode"),
             "repetition": row.get("repetition"), "status": row.get("status"),
             "wall_s": round(seconds, 4),
             "finished_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    if error is not None:
        entry["error"] = error
    with open(outdir / RUN_LOG, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


def _lock(outdir: Path) -> Any:
    import fcntl

    f = open(outdir / ".tmp.lock", "w")  # noqa: SIM115 - held for the whole run
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise RuntimeError(f"another run is writing {outdir}; wait for it to finish") from None
    return f


def _run_points(
    exp: Experiment, outdir: Path, store: ResultsStore, todo: list[Point],
    summary: RunSummary, jobs: int | None, executor: str, progress: bool,
    on_row: Callable[[dict[str, Any]], None] | None,
) -> None:
    from tqdm import tqdm

    bar = tqdm(total=len(todo), desc=exp.name, unit="point", disable=not progress or not todo,
               file=sys.stderr, dynamic_ncols=True, smoothing=0.1)

    def record(point: Point, ok: bool, result: Any, seconds: float) -> None:
        # A failed point's error in the row and the summary is cut to a readable length;
        # the run log keeps it whole.
        error = "" if ok else cut(str(result), ERROR_CELL_CHARS)
        row: dict[str, Any] = {"experiment": exp.name, "kind": exp.kind, "mode": point.mode,
                               "point": point.name,
                               "repetition": point.params.get("repetition", 0),
                               "status": "ok" if ok else "failed",
                               "error": error}
        row.update({k: v for k, v in public(point.params).items() if k not in row})
        if ok:
            files = result.pop("_files", None)
            if files:
                _write_files(outdir, files)
                # Named in the row, so a row moved to history takes its files along.
                row["files"] = ";".join(sorted(files))
            row.update(public(result))
            summary.ok += 1
        else:
            summary.failed += 1
            summary.failures.append((point.name, error))
        store.append(row)
        log_run(outdir, row, seconds, error=None if ok or error == result else str(result))
        if on_row is not None:
            on_row(row)
        bar.update(1)
        if summary.failed:
            bar.set_postfix(failed=summary.failed)

    parallel = [p for p in todo if p.mode != "real"]
    serial = [p for p in todo if p.mode == "real"]
    n_jobs = max(1, jobs or os.cpu_count() or 1)
    try:
        if parallel and (n_jobs == 1 or len(parallel) == 1) and executor == "local":
            for p in parallel:
                record(p, *_execute(exp.kind, p.params))
        elif parallel:
            batches = _batches(exp, parallel)
            _run_pool(exp.kind, batches, min(n_jobs, len(batches)), executor, record)
        for p in serial:
            record(p, *_execute(exp.kind, p.params))
    finally:
        bar.close()


def _run_pool(
    kind: str, batches: list[list[Point]], jobs: int, executor: str,
    record: Callable[[Point, bool, Any, float], None],
) -> None:
    pending = list(batches)
    while pending:
        pool = make_executor(executor, jobs)
        try:
            futures = {pool.submit(_execute_batch, kind, [p.params for p in batch]): batch
                       for batch in pending}
            broken: list[Point] | None = None
            for fut in cf.as_completed(futures):
                batch = futures[fut]
                try:
                    results = fut.result()
                except cf.process.BrokenProcessPool as err:
                    # A worker died (killed, out of memory): that batch fails, the rest
                    # go on in a fresh pool.
                    for point in batch:
                        record(point, False, f"{type(err).__name__}: worker process died", 0.0)
                    broken = batch
                    break
                for point, result in zip(batch, results):
                    record(point, *result)
                pending = [b for b in pending if b is not batch]
            if broken is not None:
                pending = [b for b in pending if b is not broken]
                for f in futures:
                    f.cancel()
        except BaseException:
            _abandon(pool)  # Ctrl-C: the rows recorded so far stay, nothing waits
            raise
        pool.shutdown(wait=True)


def _abandon(pool: cf.Executor) -> None:
    """Stop ``pool`` at once: cancel what has not started and end its worker processes.

    ``shutdown(wait=True)``, which leaving a ``with`` block calls, would first run every
    queued point to its end (8-12 s after a Ctrl-C); the points in flight are lost instead
    (they run again next time), the rows already recorded are kept.
    """
    procs = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.terminate()
    deadline = time.monotonic() + 1.0
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()


def iter_failures(summary: RunSummary) -> Iterable[str]:
    """Yield one line per failed point of ``summary``."""
    for name, err in summary.failures:
        yield f"  {name}: {err}"
