"""The ``throughput`` kind's points: the sweep grid, point names, and running one point.

A simulated point calls :func:`ddpbench.simulator.simulate` in the runner's worker
process; a real point is :func:`ddpbench.emulation.run_real` (the worker program under
``ddpbench launch``).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from typing import Any

from ddpbench import contract, hardware
from ddpbench.emulation import REAL_KEYS as _REAL_KEYS
from ddpbench.emulation import cluster_params as _cluster_params
from ddpbench.emulation import knobs_of as _knobs
from ddpbench.emulation import run_real as _run_real
from ddpbench.experiments.naming import format_value, make_name, public
from ddpbench.experiments.throughput.spec import ThroughputSpec
from ddpbench.experiments.throughput.timeline import compact_timeline, span_dict, timeline_file

__all__ = ["expand", "key_params", "point_name", "run_point", "size"]


# Run settings left out of a point's name while they hold their default value, so names
# stay readable; any other value is named.
_NAME_DEFAULTS = {
    **{k: f.default for k, f in contract.Schedule.model_fields.items()},
    **{k: f.default for k, f in contract.Cluster.model_fields.items()
       if k not in ("workers", "hosts", "servers", "bandwidth_gbps", "latency_us")},
}


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


def expand(spec: ThroughputSpec) -> list[dict[str, Any]]:
    """Return the points: for each mode, each backend, the grid of its axes."""
    modes = ["simulate", "real"] if spec.mode == "both" else [spec.mode]
    groups = [["workload" if a == "workloads" else a for a in g] for g in spec.zip]
    gantt = list(spec.report.gantt)
    out: list[dict[str, Any]] = []
    for mode in modes:
        grid: list[dict[str, Any]] = []
        for backend in spec.backends:
            for axes in _grid(spec.axes_of(backend), groups):
                params: dict[str, Any] = {"mode": mode, "backend": backend}
                for key, value in axes.items():
                    params[key.split(".", 1)[1] if "." in key else key] = value
                if "workers" not in params:  # given as hosts x gpus_per_host
                    params["workers"] = params["hosts"] * params["gpus_per_host"]
                if mode == "real":
                    params.update(
                        {k: getattr(spec.real, k) for k in _REAL_KEYS},
                    )
                grid.append(params)
        # Repetitions outermost: every point once, then every point again, so that a slow
        # phase of a shared machine (tens of seconds) catches one repetition of many points
        # rather than all repetitions of one (the report takes their median or fastest).
        out.extend({**params, "repetition": rep}
                   for rep in range(spec.repetitions) for params in grid)
    # The Gantt plot's points: the first point matching each selector keeps a timeline.
    for selector in gantt:
        for params in out:
            if params["mode"] != "real" and params["repetition"] == 0 and all(
                format_value(params.get(k)) == format_value(v) for k, v in selector.items()
            ):
                params["_timeline"] = True
                break
    return out

def point_name(params: dict[str, Any]) -> str:
    """Return ``backend[k=v,...]`` over the point's axes and knobs (sorted keys)."""
    named = {
        k: v for k, v in public(params).items()
        if k not in ("mode", "repetition", "backend", *_REAL_KEYS)
        and not (k in _NAME_DEFAULTS and v == _NAME_DEFAULTS[k])
    }
    return make_name(params["backend"], named)

def key_params(params: dict[str, Any]) -> dict[str, Any]:
    """Return ``params`` with every knob default and Cluster/Schedule default filled in.

    The runner keys a result on these, so a point run under one default (say P3's
    ``water_mark``) is not reused after the contract changes that default.
    """
    side: contract.Side = "real" if params.get("mode") == "real" else "sim"
    filled: dict[str, Any] = {}
    if params.get("backend") in contract.BACKENDS:
        filled.update(contract.defaults(params["backend"], side))
    filled.update({k: f.default for k, f in contract.Schedule.model_fields.items()})
    filled.update({k: f.default for k, f in contract.Cluster.model_fields.items()})
    filled.update(params)
    if side == "sim" and filled.get("overlap_slowdown") is None and filled.get("device"):
        # None means the device's figure: key the point on the figure in force, so that
        # results from before it existed (or under another figure) are not reused.
        slowdown = hardware.overlap_slowdown_of(str(filled["device"]))
        if slowdown:
            filled["overlap_slowdown"] = slowdown
    # Fields added later leave the key at the value under which they change nothing, so
    # the results keyed before they existed stay valid.
    for k, neutral in contract.NEUTRAL_AT_DEFAULT.items():
        if k in filled and filled[k] == neutral and type(filled[k]) is type(neutral):
            del filled[k]
    return filled


def run_point(params: dict[str, Any]) -> dict[str, Any]:
    """Run one point in simulation or on real processes; return its result row."""
    if params.get("mode", "simulate") == "real":
        return _run_real(params)
    return _run_simulated(params)


def size(params: dict[str, Any]) -> Any:
    """Return what one point will take (:class:`ddpbench.sizes.Cost`), before it runs: a
    simulated point's events and memory (:func:`ddpbench.simulator.estimate.estimate`), a
    real point's ranks on this host (:func:`ddpbench.launch.job_cost`); None for a point
    whose values its run will refuse anyway (it says why)."""
    if params.get("mode", "simulate") == "real":
        from ddpbench.emulation import real_job_size

        return real_job_size(params)
    est = _estimate(params)
    return est.cost() if est is not None else None


def _estimate(params: dict[str, Any]) -> Any:
    from ddpbench.emulation import load_workload
    from ddpbench.simulator import estimate

    try:
        workload = load_workload(params["workload"])
        cluster = contract.Cluster.from_point(_cluster_params(params))
        schedule = contract.Schedule.from_point(params)
    except (ValueError, TypeError):
        return None
    fields = {k: v for k, v in cluster.model_dump().items() if v is not None}
    return estimate.estimate(workload, params["backend"], **fields,
                             **{k: v for k, v in schedule.model_dump().items()
                                if v is not None}, **_knobs(params))


def _run_simulated(params: dict[str, Any]) -> dict[str, Any]:
    from ddpbench import simulator
    from ddpbench.emulation import load_workload
    from ddpbench.simulator import estimate

    workload = load_workload(params["workload"])
    cluster = contract.Cluster.from_point(_cluster_params(params))
    schedule = contract.Schedule.from_point(params)
    # A point past the limits fails at once with the estimate, not after hours (a run
    # refuses it before any point; run_point called alone refuses it here).
    if not params.get("_allow_large"):
        estimate.check(_estimate(params))
    res = simulator.simulate(workload, params["backend"], cluster=cluster, schedule=schedule,
                             **_knobs(params))
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
        name = point_name(params)
        timeline = compact_timeline([span_dict(s) for s in res.timeline],
                                    float(res.iteration_time_s))
        doc = {"point": name, "params": public(params),
               "iteration_time_s": float(res.iteration_time_s), **timeline}
        row["_files"] = {f"timelines/{timeline_file(name)}": json.dumps(
            doc, separators=(",", ":"))}
    return row
