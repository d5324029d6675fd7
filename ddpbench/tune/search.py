"""The search of ``ddpbench tune``: optuna's TPE over the space, each trial one simulation.

The study lives in the output folder (``study.db``, SQLite, study ``ddpbench-tune``), so a
second run resumes it: ``--trials 200`` after a run of 100 runs the 100 it lacks (finished
trials are counted; failed ones are not). The backend is a categorical parameter and each
backend's knobs are conditional on it, named ``<backend>.<knob>``. Every backend's default
configuration is enqueued once (``enqueue_trial(..., skip_if_exists=True)``), so the answer
is never slower than a default. TPE is seeded (``TPESampler(seed=seed)``); trials are asked
``jobs`` at a time and told in the order they were asked, so the same seed and ``jobs`` give
the same trials however long each simulation takes. A configuration met again (TPE proposes
one it has tried, or a backend without knobs) is told its earlier result without simulating:
the simulator is deterministic.

Each trial runs :func:`ddpbench.simulator.simulate` in a worker process (the runner's
executors: local processes, or ``mpi4py.futures`` with ``executor="mpi"``). A simulation
that raises is a failed trial (a row with ``status=failed`` and its error), never counted
as finished. ``results.csv`` is rewritten from the study after every batch (a temporary
file, then a rename), one row per finished or failed trial; ``tune.json`` records the
request, and a folder that holds another request is refused.

A tune stops before its budget once the fastest configuration within the original systems'
mechanisms (no BytePS ``window``, no P3 ``water_mark``: the setting a user can switch on) is
within ``stop_within`` of the job's compute alone (:func:`ddpbench.tune.answer.compute_only_time`,
the same job on a free network): an iteration cannot end before its forward and backward
passes do, whatever the communication does, so no further trial can gain more than that
configuration's distance to that time. The rule counts the originals' best, not the best
overall, so that the answer's setting to switch on is as near the bound as its variant to
build (which often gets there first); it waits for every backend's default, so the answer
still holds each of them, and it is recorded in the study (user attribute ``stop``).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import csv
import io
import json
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpbench import contract
from ddpbench.experiments import manifest
from ddpbench.experiments.runner import make_executor
from ddpbench.tune.space import Space

__all__ = ["STUDY_NAME", "Request", "TuneRun", "evaluate", "load_setting", "read_rows", "run",
           "stop_sentence"]

STUDY_NAME = "ddpbench-tune"
_RESULT_COLUMNS = ("iteration_time_s", "throughput", "events", "seconds", "cpu_s", "reused",
                   "status", "error")


@dataclass(frozen=True)
class Request:
    """What a tune answers: a workload on a cluster, over a space, from a seed."""

    workload: str
    """A shipped workload name or a profile YAML path."""
    cluster: contract.Cluster
    schedule: contract.Schedule
    space: Space
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Return the request as tune.json records it (what a resumed run must match)."""
        return {"workload": self.workload, "cluster": self.cluster.model_dump(),
                "schedule": self.schedule.model_dump(), "backends": list(self.space.backends),
                "space": self.space.to_dict(),
                "fixed": {b: dict(v) for b, v in self.space.fixed.items() if v},
                "dropped": [{"backend": b, "knob": k, "why": w}
                            for b, k, w in self.space.dropped],
                "seed": self.seed}


@dataclass
class TuneRun:
    """What one call of :func:`run` did."""

    folder: Path
    finished_before: int
    finished: int = 0
    failed: int = 0
    reused: int = 0
    seconds: float = 0.0
    stopped: str = ""
    """Why the run stopped early ("time", "failures", "bound"), or ""."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    compute_s: float | None = None
    """The job's compute-only iteration time, where ``stop_within`` asked for it."""
    best_s: float | None = None
    """The iteration time of the fastest configuration within the originals' mechanisms,
    when the run stopped on the bound."""
    stop_within: float = 0.0

    def stop_text(self) -> str:
        """Return why the run stopped on the bound, in one sentence (or "")."""
        if self.stopped != "bound" or self.compute_s is None or self.best_s is None:
            return ""
        return stop_sentence(self.best_s, self.compute_s, self.stop_within)


def stop_sentence(best_s: float, compute_s: float, within: float) -> str:
    """Return the stop rule's verdict: the best against the compute-only bound."""
    diff = best_s / compute_s - 1.0
    where = (f"{diff:.2%} above" if diff >= 0 else
             f"{-diff:.2%} below (the steady state of a few simulated iterations, not a "
             "faster compute)")
    return (f"the fastest configuration within the original systems' mechanisms, "
            f"{best_s * 1e3:.2f} ms, is {where} the "
            f"{compute_s * 1e3:.2f} ms the job's compute alone takes on a free network, within "
            f"the stop rule's {within:.2%}; no configuration computes faster than that, so at "
            f"most {max(0.0, diff) / (1.0 + max(0.0, diff)):.2%} of the iteration time is left "
            "to gain by a setting they offer, and no further trial was asked")


def load_setting(path: str | Path) -> dict[str, Any]:
    """Return the Cluster and Schedule fields of a cluster YAML file (``--cluster``).

    The file is a mapping of :class:`~ddpbench.contract.Cluster` and
    :class:`~ddpbench.contract.Schedule` fields, as an experiment file writes them.

    Raises:
        ValueError: unreadable or malformed YAML, an unknown key (the valid ones listed) or
            a bad value; the message names the file, the line and the field, as the
            runner's schema errors do.
    """
    from pydantic import ValidationError

    from ddpbench.experiments.schema import ExperimentError, line_of, load_yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ValueError(f"--cluster {path}: {err.strerror or err}") from None
    raw = load_yaml(text, path)
    if not isinstance(raw, dict):
        raise ExperimentError(path, getattr(raw, "line", None), None,
                              "a cluster file is a mapping of Cluster and Schedule fields")
    valid = [*contract.Cluster.model_fields, *contract.Schedule.model_fields]
    for key in raw:
        if key not in valid:
            raise ExperimentError(path, line_of(raw, [key]), str(key),
                                  f"unknown key; valid keys: {valid}")
    values = {str(k): v for k, v in raw.items()}
    for model in (contract.Cluster, contract.Schedule):
        try:
            model(**{k: v for k, v in values.items() if k in model.model_fields})
        except ValidationError as err:
            e = err.errors(include_url=False)[0]
            name = str(e["loc"][0]) if e["loc"] else None
            extra = model.model_fields[name].json_schema_extra if name else None
            expect = extra.get("expect") if isinstance(extra, dict) else None
            msg = str(e["msg"]).removeprefix("Value error, ")
            if name is None:  # a whole-model check: the field whose value it names
                name = next((k for k, v in values.items() if isinstance(v, str)
                             and repr(v) in msg), None)
            if expect and e["type"] != "value_error":
                msg = f"must be {expect}, got {e.get('input')!r}"
            raise ExperimentError(path, line_of(raw, [name] if name else []), name,
                                  msg) from None
    return values


def evaluate(workload: str, backend: str, knobs: Mapping[str, Any],
             cluster: Mapping[str, Any], schedule: Mapping[str, Any]) -> dict[str, Any]:
    """Simulate one configuration (in a worker process) and return its figures.

    ``knobs`` may hold ``servers`` (a parameter-server placement): it goes to the cluster.

    Returns:
        ``{"ok": True, iteration_time_s, throughput, events, seconds, cpu_s}``, or
        ``{"ok": False, "error": text, "seconds", "cpu_s"}`` when the simulation raised
        (``seconds`` of wall time, ``cpu_s`` of this process's CPU).
    """
    from ddpbench import simulator

    start, cpu = time.perf_counter(), time.process_time()
    try:
        knobs = dict(knobs)
        fields = dict(cluster)
        if "servers" in knobs:
            fields["servers"] = knobs.pop("servers")
        res = simulator.simulate(workload, backend, cluster=contract.Cluster(**fields),
                                 schedule=contract.Schedule(**schedule), trace=False, **knobs)
        return {"ok": True, "iteration_time_s": res.iteration_time_s,
                "throughput": res.throughput, "events": res.events,
                "seconds": time.perf_counter() - start, "cpu_s": time.process_time() - cpu}
    except Exception as err:  # noqa: BLE001 - a failed trial is a row, not a crash
        msg = " ".join(str(err).split())
        return {"ok": False, "error": f"{type(err).__name__}: {msg}",
                "seconds": time.perf_counter() - start, "cpu_s": time.process_time() - cpu}


def _config_key(backend: str, knobs: Mapping[str, Any]) -> str:
    return json.dumps([backend, sorted(knobs.items())], default=str)


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    import fcntl

    with open(folder / ".tmp.lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"another tune is writing {folder}; wait for it to "
                               "finish") from None
        yield


def _check_request(folder: Path, request: dict[str, Any]) -> None:
    """Write tune.json, or refuse a folder whose tune.json holds another request."""
    path = folder / "tune.json"
    normal = json.loads(json.dumps(request))
    if path.exists():
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            saved = None
        if saved != normal:
            differ = sorted(k for k in set(normal) | set(saved or {})
                            if (saved or {}).get(k) != normal.get(k))
            raise ValueError(f"{folder} holds another tune (its tune.json differs in "
                             f"{differ}); give another -o FOLDER, or remove that one")
        return
    manifest.atomic_write(path, json.dumps(normal, indent=2) + "\n")


def _study(folder: Path, seed: int) -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    sampler = optuna.samplers.TPESampler(seed=seed)
    return optuna.create_study(study_name=STUDY_NAME, storage=f"sqlite:///{folder / 'study.db'}",
                               sampler=sampler, direction="minimize", load_if_exists=True)


def read_rows(study: Any, space: Space) -> list[dict[str, Any]]:
    """Return one row per finished or failed trial of ``study``, in trial order."""
    from optuna.trial import TrialState

    rows = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
        if "backend" not in t.params:
            continue
        backend, _ = space.knobs_of(t.params)
        row: dict[str, Any] = {"trial": t.number, "backend": backend,
                               "is_default": bool(t.user_attrs.get("is_default", False))}
        for p in space.params:
            if p.name in t.params:
                row[p.knob] = t.params[p.name]
        ok = t.state == TrialState.COMPLETE
        row.update({"iteration_time_s": t.value if ok else None,
                    "throughput": t.user_attrs.get("throughput"),
                    "events": t.user_attrs.get("events"),
                    "seconds": t.user_attrs.get("seconds"),
                    "cpu_s": t.user_attrs.get("cpu_s"),
                    "reused": bool(t.user_attrs.get("reused", False)),
                    "status": "ok" if ok else "failed", "error": t.user_attrs.get("error", "")})
        rows.append(row)
    return rows


def _write_rows(folder: Path, rows: list[dict[str, Any]], space: Space) -> None:
    knobs = list(dict.fromkeys(p.knob for p in space.params))
    header = ["trial", "backend", "is_default", *knobs, *_RESULT_COLUMNS]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, header, lineterminator="\n", restval="")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    manifest.atomic_write(folder / "results.csv", buf.getvalue())


def run(request: Request, folder: Path, *, trials: int | None = 100,
        seconds: float | None = None, jobs: int = 1, executor: str = "local",
        progress: bool = True, on_batch: Callable[[TuneRun], None] | None = None,
        stop_within: float = 0.0) -> TuneRun:
    """Run (or resume) the tune of ``request`` in ``folder`` until it holds ``trials``.

    Args:
        request: the workload, cluster, schedule, space and seed.
        folder: the output folder (created); its study resumes.
        trials: finished trials the study should hold in all (None: no limit, then
            ``seconds`` must be given).
        seconds: stop asking for trials after this many seconds (None: no limit).
        jobs: trials evaluated at once, each in a process of its own.
        executor: ``"local"`` (processes here) or ``"mpi"`` (``mpi4py.futures``).
        progress: show a tqdm bar on stderr.
        on_batch: called after every batch of trials is told.
        stop_within: stop asking for trials once every backend's default has run and the
            fastest configuration within the originals' mechanisms is within this fraction
            of the job's compute-only time (0.01: 1%); 0 spends the whole budget.

    Raises:
        ValueError: a bad budget, executor or stop_within, or a folder that holds another
            request.
        RuntimeError: another tune writes the folder.
    """
    if trials is None and seconds is None:
        raise ValueError("give --trials N or --time SECONDS")
    if trials is not None and trials < 1:
        raise ValueError(f"--trials must be >= 1, got {trials}")
    if seconds is not None and not seconds > 0:
        raise ValueError(f"--time must be > 0 seconds, got {seconds:g}")
    if jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {jobs}")
    if executor not in ("local", "mpi"):
        raise ValueError(f"unknown executor {executor!r}; valid: ['local', 'mpi']")
    if not (isinstance(stop_within, (int, float)) and 0 <= stop_within < 1):
        raise ValueError(f"stop_within must be a fraction in [0, 1) of the compute-only "
                         f"time, got {stop_within!r}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder):
        _check_request(folder, request.to_dict())
        return _search(request, folder, trials, seconds, jobs, executor, progress, on_batch,
                       float(stop_within))


def _within_bound(study: Any, state: TuneRun, space: Space) -> bool:
    """Return whether the stop rule holds: no default waits, and the fastest configuration
    within the originals' mechanisms is within ``state.stop_within`` of the compute-only
    time (then ``state`` records it)."""
    from optuna.trial import TrialState

    if state.compute_s is None or study.get_trials(deepcopy=False,
                                                   states=(TrialState.WAITING,)):
        return False
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if not space.own(*space.knobs_of(t.params))]
    if not done:
        return False
    best = min(done, key=lambda t: (t.value, t.number))
    if best.value > state.compute_s * (1.0 + state.stop_within):
        return False
    state.stopped, state.best_s = "bound", float(best.value)
    return True


def _search(request: Request, folder: Path, trials: int | None, seconds: float | None,
            jobs: int, executor: str, progress: bool,
            on_batch: Callable[[TuneRun], None] | None, stop_within: float) -> TuneRun:
    from optuna.trial import TrialState
    from tqdm import tqdm

    space = request.space
    study = _study(folder, request.seed)
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        # A run killed mid-trial left it running: it failed, and is asked again.
        study.tell(t.number, state=TrialState.FAIL)
    for b in space.backends:
        study.enqueue_trial(space.default_params(b), user_attrs={"is_default": True},
                            skip_if_exists=True)
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    cache = {_config_key(*space.knobs_of(t.params)): t for t in done}
    state = TuneRun(folder, finished_before=len(done), stop_within=stop_within)
    if stop_within > 0:
        from ddpbench.tune.answer import compute_only_time

        state.compute_s = compute_only_time(request.to_dict())
    if space.empty:
        waiting = len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
        trials = min(trials, len(done) + waiting) if trials is not None else len(done) + waiting
        seconds = None
    todo = None if trials is None else max(0, trials - len(done))
    cluster, schedule = request.cluster.model_dump(), request.schedule.model_dump()
    bar = tqdm(total=todo, desc="tune", unit="trial", disable=not progress or todo == 0,
               file=sys.stderr, dynamic_ncols=True)
    start = time.perf_counter()
    pool = make_executor(executor, jobs) if jobs > 1 else None
    try:
        while todo is None or state.finished < todo:
            if seconds is not None and time.perf_counter() - start >= seconds:
                state.stopped = "time"
                break
            if state.failed >= max(10, todo or 0):
                state.stopped = "failures"
                break
            if _within_bound(study, state, space):
                break
            n = jobs if todo is None else min(jobs, todo - state.finished)
            asked = [study.ask() for _ in range(n)]
            configs = [space.suggest(t) for t in asked]
            results = _evaluate_batch(request.workload, configs, cache, cluster, schedule, pool)
            if pool is not None and any(r.get("broken") for r in results):
                pool.shutdown(cancel_futures=True)
                pool = make_executor(executor, jobs)
            for t, (backend, knobs), res in zip(asked, configs, results):
                for key in ("throughput", "events", "seconds", "cpu_s", "reused", "error"):
                    if key in res:
                        t.set_user_attr(key, res[key])
                if res["ok"]:
                    frozen = study.tell(t, res["iteration_time_s"])
                    cache.setdefault(_config_key(backend, knobs), frozen)
                    state.finished += 1
                    state.reused += bool(res.get("reused"))
                    bar.update(1)
                else:
                    study.tell(t, state=TrialState.FAIL)
                    state.failed += 1
                    bar.set_postfix(failed=state.failed)
            state.rows = read_rows(study, space)
            _write_rows(folder, state.rows, space)
            if on_batch is not None:
                on_batch(state)
    finally:
        bar.close()
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    state.seconds = time.perf_counter() - start
    state.rows = read_rows(study, space)
    _write_rows(folder, state.rows, space)
    # The report says why the search stopped; a later run that did not stop clears it.
    study.set_user_attr("stop", None if state.stopped != "bound" else {
        "within": state.stop_within, "compute_s": state.compute_s, "best_s": state.best_s,
        "finished": sum(r["status"] == "ok" for r in state.rows)})
    return state


def _evaluate_batch(workload: str, configs: list[tuple[str, dict[str, Any]]],
                    cache: Mapping[str, Any], cluster: dict[str, Any],
                    schedule: dict[str, Any], pool: Any) -> list[dict[str, Any]]:
    """Return the result of each configuration: reused from ``cache`` or simulated."""
    out: list[dict[str, Any] | None] = [None] * len(configs)
    futures: dict[str, Any] = {}
    for i, (backend, knobs) in enumerate(configs):
        key = _config_key(backend, knobs)
        hit = cache.get(key)
        if hit is not None:
            out[i] = {"ok": True, "iteration_time_s": hit.value, "reused": True,
                      "throughput": hit.user_attrs.get("throughput"),
                      "events": hit.user_attrs.get("events"), "seconds": 0.0, "cpu_s": 0.0}
        elif key not in futures:
            args = (workload, backend, knobs, cluster, schedule)
            futures[key] = pool.submit(evaluate, *args) if pool is not None else evaluate(*args)
    done = {}
    for k, f in futures.items():
        if pool is None:
            done[k] = f
            continue
        try:
            done[k] = f.result()
        except cf.process.BrokenProcessPool as err:
            # A worker died (killed, out of memory): the trial fails, the tune goes on.
            done[k] = {"ok": False, "broken": True, "seconds": 0.0,
                       "error": f"{type(err).__name__}: the trial's worker process died"}
    for i, (backend, knobs) in enumerate(configs):
        if out[i] is None:
            out[i] = dict(done[_config_key(backend, knobs)])
    return [r for r in out if r is not None]
