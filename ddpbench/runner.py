"""Run experiment files: expand the sweep, run every point, keep one CSV row per result.

``ddpbench run experiments/X.yaml`` validates the file (:mod:`ddpbench.config`), expands it
into points, runs the points that ``reports/X/results.csv`` does not already hold (simulated
points in parallel processes, real points one after another through ``ddpbench launch``),
appends one row per point and repetition as each finishes, then renders the report.

Results file (``results.csv``): one row per (mode, point, repetition), the key. A row is
appended with a single ``write`` on a file opened for appending and flushed to disk, so
killing the run loses no finished row; a torn last line (killed mid-write) is dropped on the
next read. When a row brings new columns, or replaces an older row of the same key, the
whole file is rewritten to a temporary file and renamed over the old one (atomic). A rerun
skips every key whose row has ``status == "ok"`` and runs again the failed and missing ones
(``force=True`` runs them all); the new row replaces the old one, so every key appears once.

Experiment kinds (plugin interface; CONTRACTS.md section 6)
------------------------------------------------------------
``EXPERIMENT_KINDS`` maps the ``kind:`` of an experiment file to a module path (or to an
object) that provides the members below. A module that cannot be imported makes loading an
experiment of that kind fail with a clear error naming the module.

``Spec``
    A pydantic model, ``ConfigDict(frozen=True, extra="forbid")``, of the kind's own keys:
    every top-level key of the file except the envelope ``name``, ``kind`` and
    ``description`` (read by the runner). The runner validates the file with
    ``Spec.model_validate(mapping)`` and reports the first error as ``file:line: field
    'a.b': message`` (unknown keys list the valid ones). ``Spec`` must round-trip through
    ``Spec.model_validate(spec.model_dump(mode="json"))``: the runner stores that dump in
    the report folder (``experiment.json``) for ``ddpbench report`` to re-render.

``check(spec, raw, file) -> Spec``  (optional)
    Further checks that need more than pydantic (names against registries...). Raise
    ``ddpbench.config.ExperimentError`` (use ``config.line_of(raw, loc)`` for the line).

``expand(spec) -> list[dict]``
    One dict per point and repetition, in a deterministic order, values scalars only
    (str, int, float, bool, None). Reserved keys read by the runner:

    - ``"mode"`` (str, default ``"simulate"``): ``"real"`` points run one at a time in the
      runner's process (they start processes of their own); every other mode runs in the
      parallel executor (``--jobs``, ``--executor``).
    - ``"repetition"`` (int, default 0): part of the row key, not of the point name.
    - keys starting with ``"_"``: passed to ``run_point`` but neither named nor stored.

``point_name(params: dict) -> str``
    Deterministic name of a point from its params, without ``mode``, ``repetition`` and
    ``_``-keys, as ``label[k=v,...]`` with sorted keys, e.g. ``"float16[N=64,f=8]"``.
    Two different points must not share a name.

``run_point(params: dict) -> dict``
    Run one point and return a flat row of results: str/int/float/bool/None values;
    lists and dicts are stored as JSON text. It runs in a worker process for non-real
    modes, so ``run_point`` must be a module-level function (picklable) that imports what
    it needs. Raise on failure: the runner records ``status="failed"`` and
    ``error="ExcType: message"`` and goes on. The reserved result key ``"_files"``
    (dict: relative path -> str) is written under the report folder (for example a
    timeline JSON for a plot) and not stored in the row.

``render(df, outdir: pathlib.Path, spec) -> list[pathlib.Path]``
    Write ``outdir/report.md`` (and ``report.html``) with tables and PNG plots from ``df``,
    the DataFrame of every row of results.csv (columns: the params, the results, and the
    runner's ``experiment``, ``kind``, ``mode``, ``point``, ``repetition``, ``status``,
    ``error``, ``wall_s``, ``finished_at``); failed rows are included. Return the paths
    written. :class:`ddpbench.report.Document` writes markdown and escaped HTML at once.
    Use matplotlib's Agg backend (``ddpbench.report.pyplot()`` gives one).

The ``throughput`` kind (:class:`ThroughputKind`, keys in :class:`config.ThroughputSpec`)
is the default and follows the same interface.
"""

from __future__ import annotations

import concurrent.futures as cf
import csv
import datetime as _dt
import fnmatch
import importlib
import io
import itertools
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpbench import config
from ddpbench.config import COMMON_AXES, PS_BACKENDS, Experiment, ThroughputSpec

__all__ = [
    "EXPERIMENT_KINDS",
    "KindUnavailableError",
    "ResultsStore",
    "RunSummary",
    "ThroughputKind",
    "format_value",
    "load_kind",
    "make_name",
    "run_experiment",
]

EXPERIMENT_KINDS: dict[str, Any] = {
    "throughput": "ddpbench.runner:ThroughputKind",
    "numerics": "ddpbench.numerics_experiment",
    "accuracy": "ddpbench.accuracy_experiment",
}
RUNNER_COLUMNS = ("experiment", "kind", "mode", "point", "repetition", "status", "error")
TAIL_COLUMNS = ("wall_s", "finished_at")
_REQUIRED = ("Spec", "expand", "point_name", "run_point", "render")


class KindUnavailableError(RuntimeError):
    """The module of an experiment kind cannot be imported or lacks a member."""


def load_kind(kind: str) -> Any:
    """Return the module (or object) implementing experiment kind ``kind``.

    Raises:
        KindUnavailableError: unknown kind, module not importable, or a member missing.
    """
    if kind not in EXPERIMENT_KINDS:
        raise KindUnavailableError(
            f"unknown experiment kind {kind!r}; valid kinds: {sorted(EXPERIMENT_KINDS)}"
        )
    target = EXPERIMENT_KINDS[kind]
    if isinstance(target, str):
        modname, _, attr = target.partition(":")
        try:
            obj = importlib.import_module(modname)
        except ImportError as err:
            raise KindUnavailableError(
                f"experiment kind {kind!r} needs module {modname!r}, which cannot be "
                f"imported ({err}); it may not be written yet"
            ) from None
        if attr:
            obj = getattr(obj, attr)
    else:
        obj = target
    missing = [m for m in _REQUIRED if not hasattr(obj, m)]
    if missing:
        raise KindUnavailableError(
            f"experiment kind {kind!r} ({target!r}) lacks {missing}; a kind defines {list(_REQUIRED)}"
        )
    return obj


# -- names -----------------------------------------------------------------------------------
def format_value(value: Any) -> str:
    """Format a param value for names and tables: ``10.0 -> '10'``, ``0.25 -> '0.25'``."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        if math.isfinite(value) and value == int(value) and abs(value) < 1e15:
            return str(int(value))
        return repr(value)
    return str(value)


def make_name(label: str, params: dict[str, Any]) -> str:
    """Return ``label[k=v,...]`` with keys sorted, values formatted by :func:`format_value`."""
    inner = ",".join(f"{k}={format_value(params[k])}" for k in sorted(params))
    return f"{label}[{inner}]"


def _public(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if not k.startswith("_")}


# -- the throughput kind ---------------------------------------------------------------------
# Run settings left out of a point's name while they hold their default value, so names
# stay readable; any other value is named.
_NAME_DEFAULTS = {"iterations": 3, "warmup": 1, "compute_scale": 1.0, "size_scale": 1.0,
                  "oversubscription": 1.0, "rack_size": 8}
_REAL_KEYS = ("compute", "timeout_s")


def _grid(axes: dict[str, tuple[Any, ...]], groups: Sequence[Sequence[str]]) -> list[dict]:
    """Expand ``axes`` as a grid in which each group of axes varies together (zip)."""
    dims: list[tuple[list[str], list[tuple[Any, ...]]]] = []
    grouped: dict[str, int] = {}
    for group in groups:
        names = [n for n in group if n in axes]
        if not names:
            continue
        for n in names:
            grouped[n] = len(dims)
        dims.append((names, list(zip(*(axes[n] for n in names)))))
    for name, values in axes.items():
        if name not in grouped:
            dims.append(([name], [(v,) for v in values]))
    # Keep the axes' declared order as the loop order (first axis varies slowest).
    order = {n: i for i, n in enumerate(axes)}
    dims.sort(key=lambda d: min(order[n] for n in d[0]))
    points = []
    for combo in itertools.product(*(values for _, values in dims)):
        point: dict[str, Any] = {}
        for (names, _), vals in zip(dims, combo):
            point.update(zip(names, vals))
        points.append({n: point[n] for n in axes})
    return points


class ThroughputKind:
    """The default kind: iteration time and throughput of backends over a sweep."""

    Spec = ThroughputSpec
    check = staticmethod(config.check_throughput)

    @staticmethod
    def expand(spec: ThroughputSpec) -> list[dict[str, Any]]:
        """Return the points: for each mode, each backend, the grid of its axes."""
        modes = ["simulate", "real"] if spec.mode == "both" else [spec.mode]
        groups = [["workload" if a == "workloads" else a for a in g] for g in spec.zip]
        gantt = list(spec.report.gantt)
        out = []
        for mode in modes:
            for backend in spec.backends:
                for axes in _grid(spec.axes_of(backend), groups):
                    params: dict[str, Any] = {"mode": mode, "backend": backend}
                    for key, value in axes.items():
                        params[key.split(".", 1)[1] if "." in key else key] = value
                    if mode == "real":
                        params.update(
                            {k: getattr(spec.real, k) for k in _REAL_KEYS},
                        )
                    for rep in range(spec.repetitions):
                        out.append({**params, "repetition": rep})
        # The Gantt plot's points: the first point matching each selector keeps a timeline.
        for selector in gantt:
            for params in out:
                if params["mode"] != "real" and params["repetition"] == 0 and all(
                    format_value(params.get(k)) == format_value(v) for k, v in selector.items()
                ):
                    params["_timeline"] = True
                    break
        return out

    @staticmethod
    def point_name(params: dict[str, Any]) -> str:
        """Return ``backend[k=v,...]`` over the point's axes and knobs (sorted keys)."""
        named = {
            k: v for k, v in _public(params).items()
            if k not in ("mode", "repetition", "backend", *_REAL_KEYS)
            and not (k in _NAME_DEFAULTS and v == _NAME_DEFAULTS[k])
        }
        return make_name(params["backend"], named)

    @staticmethod
    def run_point(params: dict[str, Any]) -> dict[str, Any]:
        """Run one point in simulation or on real processes; return its result row."""
        if params.get("mode", "simulate") == "real":
            return _run_real(params)
        return _run_simulated(params)

    @staticmethod
    def render(df: Any, outdir: Path, spec: ThroughputSpec) -> list[Path]:
        """Write the throughput report (tables and the plots the spec asks for)."""
        from ddpbench import report

        return report.render_throughput(df, outdir, spec)


def _knobs(params: dict[str, Any]) -> dict[str, Any]:
    skip = {"mode", "backend", "repetition", *COMMON_AXES, *_REAL_KEYS}
    return {k: v for k, v in params.items() if k not in skip and not k.startswith("_")}


def _servers_arg(value: Any) -> Any:
    return value if value == "colocated" else int(value)


def _run_simulated(params: dict[str, Any]) -> dict[str, Any]:
    from ddpbench import simulator
    from ddpbench.realrun import load_workload, scale_sizes

    workload = load_workload(params["workload"])
    workload = scale_sizes(workload, float(params.get("size_scale", 1.0)))
    res = simulator.simulate(
        workload, params["backend"],
        workers=int(params["workers"]), servers=_servers_arg(params["servers"]),
        bandwidth_gbps=float(params["bandwidth_gbps"]), latency_us=float(params["latency_us"]),
        iterations=int(params["iterations"]), warmup=int(params["warmup"]),
        compute_scale=float(params["compute_scale"]),
        oversubscription=float(params.get("oversubscription", 1.0)),
        rack_size=int(params.get("rack_size", 8)), **_knobs(params),
    )
    sent = dict(getattr(res, "bytes_sent", {}) or {})
    util = dict(getattr(res, "nic_utilisation", {}) or {})
    samples = list(getattr(res, "iteration_times_s", None) or [res.iteration_time_s])
    row: dict[str, Any] = {
        "iteration_time_s": float(res.iteration_time_s),
        "throughput": float(res.throughput),
        "bytes_sent_max": max(sent.values()) if sent else None,
        "bytes_sent_total": sum(sent.values()) if sent else None,
        "nic_utilisation_max": max(util.values()) if util else None,
        "events": getattr(res, "events", None),
        "samples_s": samples,
    }
    if params.get("_timeline"):
        from ddpbench.report import compact_timeline

        name = ThroughputKind.point_name(params)
        timeline = compact_timeline([_span_dict(s) for s in res.timeline],
                                    float(res.iteration_time_s))
        doc = {"point": name, "params": _public(params),
               "iteration_time_s": float(res.iteration_time_s), **timeline}
        row["_files"] = {f"timelines/{timeline_file(name)}": json.dumps(
            doc, separators=(",", ":"))}
    return row


def timeline_file(point: str) -> str:
    """Return the file name under ``timelines/`` that holds ``point``'s timeline."""
    safe = "".join(c if c.isalnum() or c in "-_.=," else "_" for c in point.rstrip("]"))
    return f"{safe}.json"


def _span_dict(span: Any) -> dict[str, Any]:
    if isinstance(span, dict):
        d = dict(span)
    elif isinstance(span, (tuple, list)):
        d = dict(zip(("host", "kind", "layer", "start", "end", "bytes"), span))
    else:
        d = {k: getattr(span, k, None) for k in ("host", "kind", "layer", "start", "end", "bytes")}
    return {k: (v if isinstance(v, (int, float, str)) or v is None else str(v))
            for k, v in d.items()}


def _run_real(params: dict[str, Any]) -> dict[str, Any]:
    import ddpbench

    backend = params["backend"]
    if backend not in ddpbench.available():
        raise RuntimeError(
            f"backend {backend!r} is not available for real runs (not installed or not "
            f"written yet); available: {ddpbench.available()}"
        )
    if float(params.get("oversubscription", 1.0)) != 1.0:
        raise ValueError("oversubscription is simulated only: a real run uses the machine's "
                         "own network; run this point with mode: simulate")
    workers = int(params["workers"])
    if backend in PS_BACKENDS:
        servers = workers if params["servers"] == "colocated" else int(params["servers"])
    else:
        servers = 0
    timeout = float(params.get("timeout_s", 300.0))
    with tempfile.TemporaryDirectory(prefix="ddpbench-real-") as tmp:
        out = Path(tmp) / "result.json"
        worker_cmd = [
            sys.executable, "-m", "ddpbench.realrun",
            "--workload", str(params["workload"]), "--backend", backend,
            "--knobs", json.dumps(_knobs(params)),
            "--iterations", str(int(params["iterations"])),
            "--warmup", str(int(params["warmup"])),
            "--compute-scale", repr(float(params["compute_scale"])),
            "--size-scale", repr(float(params.get("size_scale", 1.0))),
            "--compute", str(params.get("compute", "sleep")),
            "--out", str(out),
        ]
        cmd = [sys.executable, "-m", "ddpbench", "launch", "-n", str(workers),
               "--servers", str(servers), "--timeout", repr(timeout), "--", *worker_cmd]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 60)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"real run did not finish in {timeout + 60:.0f} s: "
                               f"{shlex.join(cmd)}") from None
        if not out.exists() or proc.returncode != 0:
            errs = sorted(Path(tmp).glob("result.json.rank*.err"))
            detail = errs[0].read_text().strip() if errs else _tail(proc.stderr or proc.stdout)
            raise RuntimeError(f"real run failed (exit {proc.returncode}): {detail}")
        result = json.loads(out.read_text())
    return {
        "iteration_time_s": result["iteration_time_s"],
        "throughput": result["throughput"],
        "bytes_sent_max": result.get("bytes_per_iteration"),
        "bytes_sent_total": None,
        "samples_s": result["iteration_times_s"],
    }


def _tail(text: str, lines: int = 3) -> str:
    kept = [ln for ln in (text or "").strip().splitlines() if ln.strip()][-lines:]
    return " | ".join(kept) or "no output"


# -- results.csv -----------------------------------------------------------------------------
def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


# mkstemp makes owner-only files; reports are meant to be shared like any other file.
_FILE_MODE = _umask_mode()


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(value)
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


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
        self._index: dict[tuple[str, str, str], int] = {}
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        text = self.path.read_text(encoding="utf-8")
        if text and not text.endswith("\n"):
            # A row torn by a kill mid-write: drop it, it is run again.
            text = text[: text.rfind("\n") + 1]
            self._write_all_text(text)
        reader = csv.DictReader(io.StringIO(text))
        self.header = list(reader.fieldnames or [])
        for row in reader:
            if None in row or not row.get("point"):
                continue  # a malformed line (more cells than the header): ignore it
            self._add(row)

    def _add(self, row: dict[str, str]) -> None:
        key = row_key(row)
        if key in self._index:
            self.rows[self._index[key]] = row
        else:
            self._index[key] = len(self.rows)
            self.rows.append(row)

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


def expand_points(exp: Experiment, only: str | None = None) -> list[Point]:
    """Expand ``exp`` into named points, keeping those whose name matches ``only``.

    ``only`` is a glob (``p3[*``) when it has ``*?[`` characters, else a substring.

    Raises:
        ValueError: two points share a name (the kind's point_name is not injective).
    """
    kind = load_kind(exp.kind)
    points = [Point(p, kind.point_name(p)) for p in kind.expand(exp.spec)]
    seen: dict[tuple[str, str, str], dict] = {}
    for p in points:
        if p.key in seen:
            raise ValueError(f"two points share the name {p.name!r} (mode {p.mode}): "
                             f"{_public(seen[p.key])} and {_public(p.params)}")
        seen[p.key] = p.params
    if only:
        if any(c in only for c in "*?["):
            points = [p for p in points if fnmatch.fnmatchcase(p.name, only)]
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


def _error_text(err: BaseException) -> str:
    msg = " ".join(str(err).split())
    where = traceback.extract_tb(err.__traceback__)
    origin = f" (at {Path(where[-1].filename).name}:{where[-1].lineno})" if where else ""
    return f"{type(err).__name__}: {msg}{origin}"


def _make_executor(kind: str, jobs: int) -> cf.Executor:
    if kind == "mpi":
        try:
            from mpi4py.futures import MPIPoolExecutor
        except ImportError as err:
            raise RuntimeError(f"--executor mpi needs mpi4py.futures: {err}") from None
        # main=False: workers need only ddpbench.runner, not the caller's __main__ (which
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


def save_experiment(exp: Experiment, outdir: Path) -> None:
    """Store the validated experiment in ``outdir/experiment.json`` for re-rendering."""
    doc = {"name": exp.name, "kind": exp.kind, "description": exp.description,
           "source": exp.path, "spec": exp.spec.model_dump(mode="json")}
    text = json.dumps(doc, indent=2) + "\n"
    target = outdir / "experiment.json"
    if not target.exists() or target.read_text(encoding="utf-8") != text:
        _write_files(outdir, {"experiment.json": text})


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
    """Render the report of ``exp`` in ``outdir`` from its results.csv."""
    df = read_results(outdir / "results.csv")
    return list(load_kind(exp.kind).render(df, outdir, exp.spec))


def run_experiment(
    exp: Experiment,
    outdir: Path,
    *,
    jobs: int | None = None,
    executor: str = "local",
    only: str | None = None,
    force: bool = False,
    dry_run: bool = False,
    progress: bool = True,
    render_report: bool = True,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> RunSummary:
    """Run the points of ``exp`` that ``outdir/results.csv`` lacks, then render.

    Args:
        exp: a validated experiment.
        outdir: the report folder (``reports/<name>``).
        jobs: parallel processes for non-real points (default: all cores).
        executor: ``"local"`` (processes on this machine) or ``"mpi"`` (mpi4py.futures).
        only: run only points whose name matches (glob or substring).
        force: run finished points again (their rows are replaced).
        dry_run: list what would run; run nothing, write nothing.
        progress: show a progress bar with ETA on stderr.
        render_report: render the report after the run.
        on_row: called with each row as it is stored (tests use it).

    Returns:
        A summary; ``failed > 0`` means some point failed (its row says why).
    """
    if executor not in ("local", "mpi"):
        raise ValueError(f"unknown executor {executor!r}; valid: ['local', 'mpi']")
    outdir = Path(outdir)
    points = expand_points(exp, only)
    summary = RunSummary(outdir=outdir, total=len(points))
    store = ResultsStore(outdir / "results.csv") if not dry_run else None
    done = set() if force else (
        store.done() if store is not None else ResultsStore(outdir / "results.csv").done()
    )
    todo = [p for p in points if p.key not in done]
    summary.skipped = len(points) - len(todo)
    summary.planned = [(p.mode, p.name) for p in todo]
    if dry_run:
        return summary
    outdir.mkdir(parents=True, exist_ok=True)
    save_experiment(exp, outdir)
    lock = _lock(outdir)
    try:
        _run_points(exp, outdir, store, todo, summary, jobs, executor, progress, on_row)
    finally:
        lock.close()
    report_md = outdir / "report.md"
    fresh = (report_md.exists() and summary.ok + summary.failed == 0
             and all(report_md.stat().st_mtime >= (outdir / f).stat().st_mtime
                     for f in ("results.csv", "experiment.json")))
    if render_report and not fresh:
        summary.report = render(exp, outdir)
    return summary


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
        row: dict[str, Any] = {"experiment": exp.name, "kind": exp.kind, "mode": point.mode,
                               "point": point.name,
                               "repetition": point.params.get("repetition", 0),
                               "status": "ok" if ok else "failed",
                               "error": "" if ok else result}
        row.update({k: v for k, v in _public(point.params).items() if k not in row})
        if ok:
            files = result.pop("_files", None)
            if files:
                _write_files(outdir, files)
            row.update(_public(result))
            summary.ok += 1
        else:
            summary.failed += 1
            summary.failures.append((point.name, str(result)))
        row["wall_s"] = round(seconds, 4)
        row["finished_at"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        store.append(row)
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
            _run_pool(exp.kind, parallel, min(n_jobs, len(parallel)), executor, record)
        for p in serial:
            record(p, *_execute(exp.kind, p.params))
    finally:
        bar.close()


def _run_pool(
    kind: str, points: list[Point], jobs: int, executor: str,
    record: Callable[[Point, bool, Any, float], None],
) -> None:
    pending = list(points)
    while pending:
        with _make_executor(executor, jobs) as pool:
            futures = {pool.submit(_execute, kind, p.params): p for p in pending}
            broken = False
            for fut in cf.as_completed(futures):
                point = futures[fut]
                try:
                    record(point, *fut.result())
                except cf.process.BrokenProcessPool as err:
                    # A worker died (killed, out of memory): that point fails, the rest
                    # go on in a fresh pool.
                    record(point, False, f"{type(err).__name__}: worker process died", 0.0)
                    broken = True
                    break
                pending.remove(point)
            if broken:
                pending = [p for p in pending if p is not point]
                for f in futures:
                    f.cancel()
                continue


def iter_failures(summary: RunSummary) -> Iterable[str]:
    """Yield one line per failed point of ``summary``."""
    for name, err in summary.failures:
        yield f"  {name}: {err}"
