"""The throughput report's text: headline speedups, tables, failed points and the machine
profiles behind a comparison of simulated and real runs."""

from __future__ import annotations

from typing import Any

from ddpbench.experiments.report import Document
from ddpbench.experiments.throughput.aggregate import (
    axis_labels,
    defaults_named,
    rows_by,
    series_label,
    speedup_x,
    speedups,
    varying,
)

__all__ = ["all_points", "calibration_section", "failed_section", "repetitions_note",
           "speedup_section", "throughput_table"]


def repetitions_note(doc: Document, agg: Any, aggregate: str) -> None:
    """Say which of a point's repetitions the tables show, when a point has several."""
    most = int(agg["repetitions"].max())
    if most > 1:
        doc.text(f"A point with repetitions (up to {most}) shows "
                 + ("the fastest of them (the shortest iteration time: the run least "
                    "disturbed by a shared machine)." if aggregate == "fastest"
                    else "the median of the real runs' lower quartiles of their timed "
                    "iterations (as `ddpbench calibrate` estimates each of its runs: a "
                    "shared machine's slow phases begin and end inside runs, and a run "
                    "may land in a slow or a fast state of seconds)."
                    if aggregate == "quartile"
                    else "their median."))


def speedup_section(doc: Document, agg: Any, sim: Any, baseline: str | None,
                    shown: str) -> None:
    """Give each variant's speedup over ``baseline``: highlights, then one row per point."""
    if not (baseline and baseline in set(agg["backend"])):
        return
    sp = speedups(sim, baseline)
    if sp.empty:
        return
    doc.heading(f"Speedup over {baseline} ({shown})")
    doc.bullets(_speedup_highlights(sp, baseline))
    x = speedup_x(sp)
    cols = rows_by(sp, ["workload", *([x] if x in sp.columns else [])])
    # Rows in numeric order of their axes (bandwidth 6 before 8, 10 before 15).
    table = axis_labels(_pivot(sp, cols, "speedup"))
    doc.table(table, index=True, caption=f"Throughput / {baseline}'s throughput at "
              f"the same point (> 1: faster than {baseline}).")


def throughput_table(doc: Document, agg: Any) -> None:
    """Table every point's throughput, one column per variant."""
    doc.heading("Throughput (samples/s, whole job)")
    cols = rows_by(agg, ["mode", "workload"] if agg["mode"].nunique() > 1 else ["workload"])
    doc.table(axis_labels(_pivot(agg, cols, "throughput")), index=True)


def _pivot(df: Any, cols: list[str], values: str) -> Any:
    """Return ``values`` with a row per combination of ``cols`` that has a point, a column
    per variant, rows in numeric order of their axes (bandwidth 6 before 8, 10 before 15).

    ``dropna=False`` keeps the row of a point whose axis is left at None (its default), but
    also makes every combination of the axes a row; those without a point are dropped
    (hosts and workers as axes together would otherwise list 2 workers on 2 hosts of 2 GPUs).
    """
    table = df.pivot_table(index=cols, columns="variant", values=values, sort=False,
                           dropna=False)
    return table.dropna(how="all").sort_index()


def all_points(doc: Document, df: Any) -> None:
    """Table every row of results.csv: its point, repetition, status and times."""
    doc.heading("All points")
    show = [c for c in ("mode", "point", "repetition", "status", "iteration_time_s",
                        "throughput", "bytes_sent_max") if c in df.columns]
    table = df[show].copy()
    if "iteration_time_s" in table:
        table["iteration_time_ms"] = table.pop("iteration_time_s") * 1e3
    doc.table(table)


def _speedup_highlights(sp: Any, baseline: str) -> list[str]:
    """One line per variant and workload: the speedup at 10 Gbps and where it peaks."""
    x = speedup_x(sp)
    others = varying(sp, [c for c in ("workers", "bandwidth_gbps", "latency_us") if c != x])
    sp = defaults_named(sp, others)
    lines = []
    for (variant, workload, *rest), grp in sp.groupby(["variant", "workload", *others],
                                                      sort=False):
        best = grp.loc[grp["speedup"].idxmax()]
        where = series_label(x, best[x])
        ten = ""
        if x == "bandwidth_gbps":
            at10 = grp[grp["bandwidth_gbps"] == 10]
            if len(at10) == 1:
                ten = f"{at10['speedup'].iloc[0]:.2f}x at 10 Gbps; "
        ctx = "".join(f", {series_label(c, v)}" for c, v in zip(others, rest))
        lines.append(f"{variant} on {workload}{ctx}: {ten}peak {best['speedup']:.2f}x at "
                     f"{where}")
    return lines


def failed_section(doc: Document, df: Any) -> None:
    if not len(df) or not (df["status"] == "failed").any():
        return
    failed = df[df["status"] == "failed"][["mode", "point", "error"]]
    doc.heading("Failed points")
    doc.table(failed)


def calibration_section(doc: Document, pairs: Any) -> None:
    """Summarise real/sim and, for points simulated on a machine profile, the profile."""
    err = (pairs["real/sim"] - 1).abs()
    lines = [f"all {len(pairs)} points: median |real/sim - 1| {err.median():.1%}, largest "
             f"{err.max():.1%}, {int((err > 0.25).sum())} beyond 25%"]
    machines = ([m for m in dict.fromkeys(pairs["machine"]) if isinstance(m, str) and m]
                if "machine" in pairs.columns else [])
    profiles = []
    for path in machines:
        from ddpbench.calibration.machine import load_machine

        try:
            profiles.append((path, load_machine(path)))
        except ValueError as bad:
            lines.append(f"machine profile {path}: cannot be read ({bad})")
    for path, m in profiles:
        on = pairs["machine"] == path
        inside = on & (pairs["workers"].astype(int) == m.workers)
        outside = on & ~inside
        for label, mask in ((f"calibrated at {m.workers} workers (in sample)", inside),
                            ("other worker counts (out of sample)", outside)):
            if mask.any():
                sub = err[mask]
                lines.append(f"{label}: {int(mask.sum())} points, median {sub.median():.1%}, "
                             f"largest {sub.max():.1%}")
    doc.bullets(lines)
    for path, m in profiles:
        doc.heading(f"Machine profile {path}", level=3)
        bind = "" if m.bind == "none" else f" --bind {m.bind}"
        doc.text(f"Measured by `ddpbench calibrate -n {m.workers}{bind}` on {m.host} at "
                 f"{m.measured_at} ({m.cores} cores): MPI latency {m.latency_us:.1f} us, "
                 f"bandwidth {m.bandwidth_gbps:.1f} Gbit/s; NumPy copy {m.copy_gbps:.0f} and "
                 f"sum {m.sum_gbps:.0f} Gbit/s; one sleep of t takes {m.compute_rate:.3f} t + "
                 f"{m.compute_overhead_us:.0f} us. A 1 KiB ring step through the engine "
                 "thread takes " + "; ".join(
                     f"{style}: " + ", ".join(f"{v:.0f} us at {k}" for k, v in t.items())
                     for style, t in m.ring_step_us.items()) + " processes." + (
                 "" if m.handoff_us is None else " A 0.2 ms sleep and a call handed to an "
                 "idle engine take beyond the sleep " + ", ".join(
                     f"{v:.0f} us at {k}" for k, v in m.handoff_us.items()) + " processes."))
        rows = [{"backend": b, "per_message_us": f.per_message_us,
                 "bandwidth_gbps": (f"{f.bandwidth_gbps:,.2f} (shared)" if f.bandwidth_shared
                                    else f.bandwidth_gbps if f.bandwidth_fitted
                                    else f"{f.bandwidth_gbps:,.1f} (ping-pong's)"),
                 "compute_factor": f.compute_factor,
                 "small_ms (real/sim)": f"{f.small_ms:.2f} / {f.small_sim_ms:.2f}"
                 if f.small_ms and f.small_sim_ms else "",
                 "large_ms (real/sim)": f"{f.large_ms:.2f} / {f.large_sim_ms:.2f}"
                 if f.large_ms and f.large_sim_ms else "",
                 "workload_ms (real/sim)": f"{f.workload_ms:.1f} / {f.workload_sim_ms:.1f}"
                 if f.workload_ms and f.workload_sim_ms else ""}
                for b, f in m.backends.items()]
        import pandas as pd

        doc.table(pd.DataFrame(rows), caption=(
            "Each backend's constants, fitted once through the simulator on its runs at the "
            "calibration's worker count (many small tensors: per-message cost; few large "
            "ones: bandwidth; the workload itself: how much slower compute runs beside the "
            "backend's threads) and used unchanged at every point (a bandwidth marked "
            "ping-pong's: the large run was all message costs, so the wire's is kept; "
            "marked shared: one bandwidth for the parameter-server backends, whose bytes go "
            "through one transport, from all their large runs); "
            "other process counts stretch the software costs by the ratio of the measured ring steps "
            "(ddpbench/calibration/machine.py)."))
