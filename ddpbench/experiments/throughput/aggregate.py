"""The throughput report's numbers: one row per point, speedups, efficiency, and the axes
that vary.

:func:`per_point` turns the rows of ``results.csv`` into one row per point (the median of
its repetitions, or another ``report.aggregate``); the tables and plots of
:mod:`.report` are drawn from its result.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from ddpbench import contract
from ddpbench.contract import COMMON_AXES
from ddpbench.experiments.naming import format_value

__all__ = ["KNOB_COLUMNS", "POINT_AXES", "RESULT_COLUMNS", "axis_label", "axis_labels",
           "defaults_named", "efficiency", "int_if_whole", "is_default", "per_point",
           "real_quartiles", "rows_by", "series_columns", "series_label", "speedup_x",
           "speedups", "variant_label", "varying"]

RESULT_COLUMNS = ("iteration_time_s", "throughput")
# Columns that identify a point apart from the backend and its knobs.
POINT_AXES = tuple(a for a in COMMON_AXES if a != "workload")
KNOB_COLUMNS = tuple(sorted({k for name in contract.BACKENDS for k in contract.sweep_knobs(name)}))


def variant_label(row: Any, knobs: Sequence[str]) -> str:
    """Return ``backend`` or ``backend (knob=v, ...)`` for the knobs given on ``row``.

    Only the row's own backend's knobs name it: another backend's knob swept in the same
    experiment (Horovod's ``hierarchical`` beside ``byteps``) is not a variant of it.
    """
    own = set(contract.knob_info(row["backend"])) if row["backend"] in contract.BACKENDS else None
    given = [f"{k}={format_value(int_if_whole(row[k]))}" for k in knobs
             if (own is None or k in own) and k in row and row[k] == row[k] and row[k] != ""]
    return f"{row['backend']} ({', '.join(given)})" if given else str(row["backend"])


def int_if_whole(value: Any) -> Any:
    if isinstance(value, float) and value == int(value):
        return int(value)
    return value


def per_point(df: Any, aggregate: str = "median") -> Any:
    """Return the ok rows with a ``variant`` column, one per point: the median over its
    repetitions (a real run stretched by a busy machine does not move it), with
    ``aggregate="fastest"`` the repetition with the shortest iteration time, or with
    ``aggregate="quartile"`` the median of the real repetitions' lower quartiles of their
    iteration times (:func:`~ddpbench.calibration.machine.launch_time`, what ``ddpbench
    calibrate`` fits; simulated rows keep their iteration time)."""
    import pandas as pd

    ok = df[df["status"] == "ok"].copy()
    if ok.empty:
        return ok
    if aggregate == "quartile" and "samples_s" in ok.columns:
        ok = real_quartiles(ok)
    # Rows made before a field existed lack its column: they ran at its neutral value.
    for col, neutral in contract.NEUTRAL_AT_DEFAULT.items():
        if col in ok.columns and neutral is not None:
            ok[col] = ok[col].astype(object).where(ok[col].notna(), neutral)
    knobs = [k for k in KNOB_COLUMNS if k in ok.columns and ok[k].notna().any()]
    ok["variant"] = [variant_label(r, knobs) for _, r in ok.iterrows()]
    for col in ("size_scale",):
        if col not in ok.columns:
            ok[col] = 1.0
    keys = ["mode", "variant", "backend", "workload",
            *[a for a in POINT_AXES if a in ok.columns]]
    ok["servers"] = ok["servers"].astype(str)
    fastest = aggregate == "fastest"
    agg = ok.groupby(keys, dropna=False, sort=False).agg(
        iteration_time_s=("iteration_time_s", "min" if fastest else "median"),
        throughput=("throughput", "max" if fastest else "median"),
        repetitions=("throughput", "size"),
    ).reset_index()
    agg["iteration_time_ms"] = agg["iteration_time_s"] * 1e3
    return pd.DataFrame(agg)


def real_quartiles(ok: Any) -> Any:
    """Return ``ok`` with each real row's iteration time its lower quartile of
    ``samples_s`` and its throughput scaled to match (rows without samples unchanged)."""
    from ddpbench.calibration.machine import launch_time

    times, rates = [], []
    for _, row in ok.iterrows():
        t, rate = row["iteration_time_s"], row["throughput"]
        raw = row["samples_s"]
        if row["mode"] == "real" and isinstance(raw, str) and raw.startswith("["):
            samples = [float(x) for x in json.loads(raw)]
            if samples:
                q = launch_time(samples)
                rate, t = rate * t / q, q
        times.append(t)
        rates.append(rate)
    ok["iteration_time_s"], ok["throughput"] = times, rates
    return ok


def is_default(value: Any) -> bool:
    """An axis left at None (its default: the device's, the profile's), NaN in a frame."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def axis_label(value: Any) -> Any:
    if is_default(value):
        return "default"
    return format_value(value) if isinstance(value, float) else value


def defaults_named(df: Any, cols: Sequence[str]) -> Any:
    """Return ``df`` with None/NaN in ``cols`` written "default", so that grouping keeps
    those points as series of their own instead of dropping them."""
    if not any(df[c].map(is_default).any() for c in cols):
        return df
    out = df.copy()
    for c in cols:
        out[c] = out[c].map(lambda v: "default" if is_default(v) else v)
    return out


def axis_labels(table: Any) -> Any:
    """Return ``table`` with its (sorted) index values written as point names write them."""
    return table.rename(index=axis_label)


def rows_by(df: Any, first: Sequence[str]) -> list[str]:
    """Return ``first`` and then every point axis that varies in ``df``.

    A table keyed on fewer axes than vary would average two configurations into one cell
    (paced and unpaced runs, say); keyed on all of them, each cell is one point.
    """
    return [*first, *(a for a in POINT_AXES if a not in first and a in df.columns
                      and df[a].nunique(dropna=False) > 1)]


def varying(df: Any, cols: Sequence[str]) -> list[str]:
    return [c for c in cols if c in df.columns and df[c].nunique(dropna=False) > 1]


def series_columns(df: Any, x: str) -> list[str]:
    """Return the plot series: one line per variant and per value of every other point axis
    that varies (a line through two devices' or paced and unpaced points would mix two
    configurations); ``hosts`` follows ``workers`` and is not a series of its own there."""
    skip = {x, "hosts"} if x == "workers" else {x}
    return ["variant", *varying(df, [a for a in POINT_AXES if a not in skip])]


def speedups(agg: Any, baseline: str) -> Any:
    """Return rows of non-baseline variants with ``speedup`` = throughput / baseline's."""
    keys = ["mode", "workload", *[a for a in POINT_AXES if a in agg.columns]]
    base = agg[agg["backend"] == baseline][[*keys, "throughput"]].rename(
        columns={"throughput": "baseline_throughput"})
    # The baseline's own knob variants would make the merge ambiguous: keep the first.
    base = base.drop_duplicates(subset=keys)
    merged = agg[agg["backend"] != baseline].merge(base, on=keys, how="inner")
    merged["speedup"] = merged["throughput"] / merged["baseline_throughput"]
    return merged


def speedup_x(sp: Any) -> str:
    """Plot speedup against the axis swept most finely (bandwidth on a tie)."""
    if sp.empty:
        return "bandwidth_gbps"
    return "workers" if sp["workers"].nunique() > sp["bandwidth_gbps"].nunique() \
        else "bandwidth_gbps"


def efficiency(sim: Any) -> Any:
    # Relative to the smallest job of the same series (device, paced, ... alike).
    keys = ["variant", "workload", *series_columns(sim, "workers")[1:]]
    out = sim.copy()
    per_worker = out["throughput"] / out["workers"]
    first = out.assign(pw=per_worker).sort_values("workers").groupby(
        keys, sort=False, dropna=False)["pw"]
    out["efficiency"] = 100.0 * per_worker / first.transform("first")
    return out


def series_label(col: str, value: Any) -> str:
    units = {"bandwidth_gbps": " Gbps", "latency_us": " us", "workers": " workers"}
    if col == "mode":
        return str(value)
    return f"{format_value(int_if_whole(value))}{units.get(col, '')}" if col in units else \
        f"{col}={format_value(int_if_whole(value))}"
