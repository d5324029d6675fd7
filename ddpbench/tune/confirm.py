"""``ddpbench tune --confirm K``: the top configurations run as real processes here.

A tune ranks configurations by the simulator's prediction. The confirmation runs the top
``K`` distinct configurations and every tuned backend's default as real processes on this
machine, the way ``experiments/real_local.yaml`` does: a ``throughput`` experiment with
``mode: both`` (each point on real processes under ``ddpbench launch`` and simulated on the
machine's calibrated profile, so real and predicted come from the same point), written to
``FOLDER/confirm/experiment.yaml`` and run by :func:`ddpbench.experiments.runner.run_experiment`
into ``FOLDER/confirm/``. Each configuration's time is the median over its repetitions (the
throughput report's ``aggregate: median``); the two rankings are compared by Kendall's tau-b,
which counts tied pairs as neither agreeing nor disagreeing (Kendall 1945, as
``scipy.stats.kendalltau`` computes it by default). ``FOLDER/confirm/summary.json`` holds
the result.

Real runs measure this machine, so the tune must have been simulated on it (``--machine``,
a ``ddpbench calibrate`` profile) at a setting its processes can run: one process per worker
(and per server) on this host, no simulated-only field (hosts of several GPUs, a transport,
a device), and at most as many processes as the profile measured its ring steps at (beyond
them the prediction extrapolates the contention of the cores).
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ddpbench import contract
from ddpbench.experiments.naming import format_value
from ddpbench.tune import answer

__all__ = ["CONFIRM_DIR", "LAUNCH_S", "SUMMARY_FILE", "Config", "Plan", "add_section",
           "check_setting", "kendall_tau_b", "plan", "run", "summary_lines"]

CONFIRM_DIR = "confirm"
SUMMARY_FILE = "summary.json"
EXPERIMENT_NAME = "tune_confirm"
LAUNCH_S = 1.5
"""Seconds a real point costs beside its iterations (``mpiexec`` starting every rank's Python
and NumPy), for the estimate printed before the runs."""
_COPIES = 4
"""Gradient-sized buffers one process holds (its gradients, what it receives, a server's
store, a fused buffer): what the memory check counts."""
_MEMORY_SHARE = 0.5


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Return Kendall's tau-b between two rankings given as values (smaller = first).

    ``tau_b = (C - D) / sqrt((P - Tx) (P - Ty))`` over the ``P = n (n - 1) / 2`` pairs:
    ``C`` pairs ordered alike, ``D`` oppositely, ``Tx`` and ``Ty`` tied in ``x`` and in
    ``y`` (a pair tied in both counts in both). None when it is undefined (fewer than two
    items, or every pair tied on one side).

    Raises:
        ValueError: ``x`` and ``y`` differ in length.
    """
    if len(x) != len(y):
        raise ValueError(f"kendall_tau_b: {len(x)} values against {len(y)}")
    n = len(x)
    agree = disagree = tied_x = tied_y = 0
    for i in range(n):
        for j in range(i + 1, n):
            dx = (x[i] > x[j]) - (x[i] < x[j])
            dy = (y[i] > y[j]) - (y[i] < y[j])
            tied_x += dx == 0
            tied_y += dy == 0
            if dx and dy:
                agree += dx == dy
                disagree += dx != dy
    pairs = n * (n - 1) // 2
    den = math.sqrt((pairs - tied_x) * (pairs - tied_y))
    return (agree - disagree) / den if den else None


def _ranks(values: Sequence[float]) -> list[int]:
    """Return each value's rank, 1 = smallest; equal values share the lower rank."""
    return [1 + sum(v < w for v in values) for w in values]


# -- the setting -----------------------------------------------------------------------------
def check_setting(workload: str, cluster: Mapping[str, Any], schedule: Mapping[str, Any],
                  backends: Sequence[str]) -> Any:
    """Return the machine profile of a setting that real processes can run here.

    Raises:
        ValueError: no machine profile (``--machine``), one without a fit for a backend,
            a simulated-only field, more processes than the profile measured, or
            gradients that would not fit this machine's memory; the message says why.
    """
    from ddpbench import emulation
    from ddpbench.calibration.machine import load_machine

    path = cluster.get("machine")
    if not path:
        raise ValueError("--confirm compares real runs here with predictions on this "
                         "machine's calibrated profile: give --machine PROFILE (written by "
                         "`ddpbench calibrate -o PROFILE`)")
    machine = load_machine(path)
    missing = [b for b in backends if b not in machine.backends]
    if missing:
        raise ValueError(f"--confirm: machine profile {path} has no fit for {missing} (it "
                         f"has {sorted(machine.backends)}); calibrate them or leave them "
                         "out of --backends")
    cap = max(max(table) for table in machine.ring_step_us.values())
    workers = int(cluster["workers"])
    for b in backends:
        params = {**cluster, **schedule, "backend": b, "mode": "real"}
        try:
            # The runner's own check of a real point: simulated-only fields, availability.
            _, servers, _ = emulation._job(params)
        except (ValueError, RuntimeError) as err:
            raise ValueError(f"--confirm: {b} cannot run as real processes here: {err}"
                             ) from None
        if workers + servers > cap:
            raise ValueError(
                f"--confirm: {b} at {workers} workers runs {workers + servers} processes "
                f"here, more than the {cap} the machine profile measured ({machine.cores} "
                f"cores; its ring steps up to {cap} processes): the prediction would "
                "extrapolate the cores' contention. Tune at fewer --workers")
    _check_memory(workload, schedule, workers, backends)
    return machine


def _check_memory(workload: str, schedule: Mapping[str, Any], workers: int,
                  backends: Sequence[str]) -> None:
    from ddpbench.emulation import load_workload

    size_scale = float(schedule.get("size_scale") or 1.0)
    nbytes = load_workload(workload).resized(size_scale).model_bytes
    ps = any(contract.backend(b).uses_servers for b in backends)
    need = nbytes * _COPIES * workers * (2 if ps else 1)
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return
    if need > _MEMORY_SHARE * free:
        raise ValueError(
            f"--confirm: {workload} at size_scale {size_scale:g} holds {nbytes / 1e6:,.1f} MB "
            f"of gradients per process; its real processes would need about "
            f"{need / 1e9:,.1f} GB, over half of the {free / 1e9:,.1f} GB free here. Scale "
            "it down with --size-scale (real_local runs ResNet-50 at 0.01)")


# -- the plan --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    """One configuration to confirm."""

    backend: str
    knobs: dict[str, Any]
    """Every knob the experiment gives it (defaults filled in beside its backend's others)."""
    label: str
    is_default: bool
    tune_rank: int | None
    """Its place in the tune's ranking (1 = predicted fastest), None if it never ran."""
    predicted_tune_s: float | None
    """The tune's prediction (its results.csv)."""
    sim_seconds: float = 0.0


@dataclass
class Plan:
    """What a confirmation runs, and where."""

    folder: Path
    configs: list[Config]
    experiment: dict[str, Any]
    repetitions: int
    iterations: int
    skipped: list[str] = field(default_factory=list)
    """Configurations of the top that real processes cannot run, with why."""

    @property
    def outdir(self) -> Path:
        return self.folder / CONFIRM_DIR

    def estimate_s(self) -> float:
        """Return the expected seconds of the real runs and their simulated twins."""
        total = 0.0
        for c in self.configs:
            per = self.iterations * (c.predicted_tune_s or 0.1) + LAUNCH_S
            total += self.repetitions * (per + c.sim_seconds)
        return total

    def describe(self) -> str:
        """Return one line: what runs and about how long."""
        n = len(self.configs)
        est = self.estimate_s()
        took = f"{est / 60:.1f} min" if est >= 120 else f"{est:.0f} s"
        return (f"confirm: {n} configurations x {self.repetitions} repetitions as real "
                f"processes (and as many simulated twins): about {took} "
                f"({n * self.repetitions} launches of "
                f"{self.iterations} iterations, each launch about {LAUNCH_S:g} s more)")


def plan(folder: str | Path, k: int, *, machine: str | None = None,
         repetitions: int = 3) -> Plan:
    """Return the confirmation of the tune in ``folder``: its top ``k`` and the defaults.

    Args:
        folder: a tune folder (``tune.json``, ``results.csv``).
        k: distinct configurations taken from the top of the tune's ranking.
        machine: the machine profile (None: the one the tune was simulated on).
        repetitions: real runs per configuration (and simulated twins).

    Raises:
        ValueError: a bad ``k`` or ``repetitions``, no finished trial, or a setting real
            processes cannot run here (:func:`check_setting`).
    """
    if k < 1:
        raise ValueError(f"--confirm must be >= 1, got {k}")
    if repetitions < 1:
        raise ValueError(f"--confirm-repetitions must be >= 1, got {repetitions}")
    folder = Path(folder)
    request, df = answer.load(folder)
    cluster = dict(request["cluster"])
    if machine:
        cluster["machine"] = machine
    schedule = dict(request.get("schedule") or {})
    backends = [str(b) for b in request.get("backends") or sorted(set(df["backend"]))]
    workload = answer._workload(request)
    profile = check_setting(workload, cluster, schedule, backends)
    rank = answer.ranked(request, df)
    if not len(rank):
        raise ValueError(f"{folder}: no trial finished; nothing to confirm")
    every = [_config(request, row, i) for i, (_, row) in enumerate(rank.iterrows(), 1)]
    at: dict[tuple[str, str], Config] = {}
    for c in every:
        at.setdefault(_key(c), c)
    configs: dict[tuple[str, str], Config] = {}
    skipped: list[str] = []
    for c in every:
        if len(configs) >= k:
            break
        why = _simulated_only(c)
        if why:
            skipped.append(f"{c.label}: {why}")
            continue
        configs.setdefault(_key(c), c)
    base = answer.defaults(df)
    for b in backends:
        c = (_config(request, base[b], None) if b in base
             else Config(b, _fill(b, {}), f"{b} default", True, None, None))
        key = _key(c)
        configs[key] = replace(configs.get(key) or at.get(key) or c, is_default=True,
                               label=f"{b} default")
    chosen = list(configs.values())
    exp = _experiment(request, chosen, folder / CONFIRM_DIR, cluster, repetitions, profile)
    return Plan(folder, chosen, exp, repetitions, int(schedule.get("iterations") or 3), skipped)


def _config(request: Mapping[str, Any], row: Any, rank: int | None) -> Config:
    backend = str(row["backend"])
    knobs = {**{k: answer._coerce(backend, k, v)
                for k, v in answer._fixed(request, backend).items()},
             **answer.config(request, row)}
    seconds = row.get("seconds")
    label = (f"{backend} default" if bool(row["is_default"])
             else answer.config_label(request, row, short=True))
    return Config(backend, _fill(backend, knobs), label, bool(row["is_default"]), rank, float(row["iteration_time_s"]),
                  float(seconds) if seconds == seconds and seconds is not None else 0.0)


def _fill(backend: str, knobs: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``knobs`` with every other searched knob of ``backend`` at its default, less
    the simulated-only knobs at their defaults (a real run cannot be given them)."""
    info = contract.knob_info(backend)
    out = {**{k: info[k]["default"] for k in info if info[k].get("tune") and k not in knobs},
           **knobs}
    return {k: v for k, v in out.items()
            if not (k in info and info[k]["side"] == "sim" and v == info[k]["default"])}


def _simulated_only(c: Config) -> str:
    """Return why real processes cannot run ``c`` (a simulated-only knob off its default)."""
    info = contract.knob_info(c.backend)
    off = [f"{k}={format_value(v)}" for k, v in c.knobs.items()
           if k in info and info[k]["side"] == "sim" and v != info[k]["default"]]
    return f"{', '.join(off)} is simulated only" if off else ""


def _key(c: Config) -> tuple[str, str]:
    return c.backend, json.dumps(sorted(c.knobs.items()), default=str)


def _experiment(request: Mapping[str, Any], configs: Sequence[Config], outdir: Path,
                cluster: Mapping[str, Any], repetitions: int, machine: Any) -> dict[str, Any]:
    """Return the confirmation's ``throughput`` experiment (as a mapping for YAML)."""
    from ddpbench.experiments.throughput.spec import BUILTIN_WORKLOADS

    c = contract.Cluster(**cluster)
    s = contract.Schedule(**(request.get("schedule") or {}))
    workload = answer._workload(request)
    exp: dict[str, Any] = {
        "name": EXPERIMENT_NAME,
        "description": "`ddpbench tune --confirm`: the tune's top configurations and every "
                       "backend's default as real processes here, each beside its "
                       "simulated twin on the machine's calibrated profile.",
        "mode": "both",
        "workloads": [workload if workload in BUILTIN_WORKLOADS
                      else answer._relative(workload, outdir)],
    }
    for key, value in {**answer._non_default(c), **answer._non_default(s)}.items():
        exp[key] = answer._relative(str(value), outdir) if key == "machine" else value
    exp["repetitions"] = repetitions
    backends: dict[str, dict[str, Any]] = {}
    zipped: list[list[str]] = []
    for b in dict.fromkeys(cf.backend for cf in configs):
        mine = [cf for cf in configs if cf.backend == b]
        names = list(dict.fromkeys(k for cf in mine for k in cf.knobs))
        info = contract.knob_info(b)
        # A simulated-only knob at its default is left out: the real run cannot take it.
        names = [k for k in names if not (k in info and info[k]["side"] == "sim")]
        knobs: dict[str, Any] = {}
        for k in names:
            values = [cf.knobs.get(k, info[k]["default"] if k in info else None) for cf in mine]
            if k == "servers" and len(set(map(str, values))) > 1:
                raise ValueError(f"--confirm: the configurations of {b} place the servers "
                                 f"differently ({sorted(set(map(str, values)))}); confirm "
                                 "them one placement at a time (--fix servers=...)")
            knobs[k] = values if len(mine) > 1 and k != "servers" else values[0]
        backends[b] = knobs
        varying = [k for k, v in knobs.items() if isinstance(v, list)]
        if len(varying) > 1:
            zipped.append([f"{b}.{k}" for k in varying])
    exp["backends"] = backends
    if zipped:
        exp["zip"] = zipped
    per_point = max(60.0, 10 * (s.iterations * max(
        (cf.predicted_tune_s or 0.1) for cf in configs) + LAUNCH_S))
    exp["real"] = {"compute": "sleep", "timeout_s": round(per_point), "bind": machine.bind}
    exp["report"] = {"aggregate": "median", "plots": ["sim_vs_real"],
                     "title": "Tune confirmed on this machine"}
    return exp


# -- running ---------------------------------------------------------------------------------
def run(p: Plan, *, progress: bool = True) -> dict[str, Any]:
    """Write the plan's experiment, run it into ``FOLDER/confirm`` and return the summary.

    The summary (also written to ``FOLDER/confirm/summary.json``) holds one row per
    configuration, fastest predicted first: its backend, knobs, the tune's rank and
    prediction, the twin's predicted and the real iteration time (medians over the
    repetitions that finished), ``real/predicted``, both ranks; then both rankings and
    Kendall's tau-b between them (None with fewer than two configurations that ran).
    """
    import yaml

    from ddpbench.experiments import runner, schema

    p.outdir.mkdir(parents=True, exist_ok=True)
    path = p.outdir / "experiment.yaml"
    path.write_text(yaml.safe_dump(p.experiment, sort_keys=False, width=100), encoding="utf-8")
    exp = schema.load_experiment(path)
    summary = runner.run_experiment(exp, p.outdir, progress=progress)
    df = runner.read_results(p.outdir / "results.csv")
    points = runner.expand_points(exp)
    rows = []
    for c in p.configs:
        names = {pt.name for pt in points
                 if pt.params["backend"] == c.backend and _matches(pt.params, c)}
        times = {mode: _median(df, names, mode) for mode in ("simulate", "real")}
        rows.append({"configuration": c.label,
                     "backend": c.backend, "knobs": c.knobs, "is_default": c.is_default,
                     "tune_rank": c.tune_rank, "predicted_tune_s": c.predicted_tune_s,
                     "predicted_s": times["simulate"][0], "real_s": times["real"][0],
                     "repetitions": times["real"][1],
                     "real_over_predicted": (times["real"][0] / times["simulate"][0]
                                             if times["real"][0] and times["simulate"][0]
                                             else None)})
    out = _summarise(rows)
    out.update({"experiment": str(path), "results": str(p.outdir / "results.csv"),
                "ran": summary.ok, "failed": summary.failed, "skipped": p.skipped,
                "failures": [f"{n}: {e}" for n, e in summary.failures]})
    tmp = p.outdir / f".tmp-{SUMMARY_FILE}"
    tmp.write_text(json.dumps(out, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, p.outdir / SUMMARY_FILE)
    return out


def _matches(params: Mapping[str, Any], c: Config) -> bool:
    return all(format_value(params.get(k)) == format_value(v) for k, v in c.knobs.items()
               if k in params)


def _median(df: Any, names: set[str], mode: str) -> tuple[float | None, int]:
    if not len(df):
        return None, 0
    ok = df[(df["mode"] == mode) & (df["status"] == "ok") & df["point"].isin(names)]
    times = [float(t) for t in ok["iteration_time_s"]]
    return (statistics.median(times) if times else None), len(times)


def _summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Add both ranks to ``rows`` (those with both times) and return the summary."""
    both = [r for r in rows if r["predicted_s"] and r["real_s"]]
    pred = _ranks([r["predicted_s"] for r in both])
    real = _ranks([r["real_s"] for r in both])
    for r, a, b in zip(both, pred, real):
        r["predicted_rank"], r["real_rank"] = a, b
    for r in rows:
        r.setdefault("predicted_rank", None)
        r.setdefault("real_rank", None)
    rows.sort(key=lambda r: (r["predicted_rank"] is None, r["predicted_rank"] or 0,
                             r["predicted_s"] or math.inf))
    tau = kendall_tau_b([r["predicted_s"] for r in both], [r["real_s"] for r in both])
    order = sorted(both, key=lambda r: r["real_s"])
    return {"configurations": rows,
            "predicted_ranking": [r["configuration"] for r in sorted(
                both, key=lambda r: r["predicted_s"])],
            "real_ranking": [r["configuration"] for r in order],
            "kendall_tau_b": tau, "compared": len(both),
            "best_held": bool(both) and order[0]["predicted_rank"] == 1}


def summary_lines(summary: Mapping[str, Any]) -> list[str]:
    """Return what the command prints: a table, both rankings' agreement, the verdict."""
    w = max([len("configuration")] + [len(r["configuration"]) for r in
                                       summary["configurations"]]) + 2
    lines = [f"{'configuration':<{w}}{'predicted ms':>13}{'real ms':>10}"
             f"{'real/pred':>10}{'rank pred/real':>16}"]
    for r in summary["configurations"]:
        pred, real = r["predicted_s"], r["real_s"]
        ratio = f"{r['real_over_predicted']:.2f}" if r["real_over_predicted"] else "-"
        ranks = (f"{r['predicted_rank']}/{r['real_rank']}" if r["real_rank"] else "-")
        lines.append(f"{r['configuration']:<{w}}"
                     f"{pred * 1e3 if pred else math.nan:>13.2f}"
                     f"{real * 1e3 if real else math.nan:>10.2f}{ratio:>10}{ranks:>16}")
    tau, n = summary["kendall_tau_b"], summary["compared"]
    if tau is None:
        lines.append(f"Kendall's tau-b: undefined ({n} configuration(s) with both times)")
    else:
        held = ("the ranking held" if tau == 1 else "the ranking held in part" if tau > 0
                else "the ranking did not hold")
        best = ("the predicted fastest was the fastest for real" if summary["best_held"]
                else "the predicted fastest was not the fastest for real")
        lines.append(f"Kendall's tau-b between predicted and real: {tau:+.2f} over {n} "
                     f"configurations: {held}; {best}")
    for s in summary.get("skipped") or []:
        lines.append(f"not confirmed (cannot run for real): {s}")
    for f in summary.get("failures") or []:
        lines.append(f"failed: {f}")
    lines.append(f"confirm: {Path(summary['results']).parent / SUMMARY_FILE}")
    return lines


def add_section(doc: Any, folder: Path) -> None:
    """Add "Confirmed on this machine" to a tune report when ``folder/confirm`` holds one."""
    import pandas as pd

    path = Path(folder) / CONFIRM_DIR / SUMMARY_FILE
    if not path.exists():
        return
    try:
        s = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    doc.heading("Confirmed on this machine")
    rows = [{"configuration": r["configuration"],
             "predicted_ms": r["predicted_s"] * 1e3 if r["predicted_s"] else None,
             "real_ms": r["real_s"] * 1e3 if r["real_s"] else None,
             "real/predicted": r["real_over_predicted"], "predicted rank": r["predicted_rank"],
             "real rank": r["real_rank"], "repetitions": r["repetitions"]}
            for r in s["configurations"]]
    doc.table(pd.DataFrame(rows), caption="`ddpbench tune --confirm`: each configuration as "
              "real processes here beside its simulated twin on the machine's profile "
              "(medians over the repetitions; `confirm/report.md` has every run).")
    tau = s.get("kendall_tau_b")
    doc.text("Kendall's tau-b between the predicted and the real ranking: "
             + (f"{tau:+.2f} over {s['compared']} configurations; the predicted fastest "
                f"{'was' if s.get('best_held') else 'was not'} the fastest for real."
                if tau is not None else "undefined (fewer than two configurations ran)."))
