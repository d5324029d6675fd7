"""The ``throughput`` kind's report: tables, throughput/speedup/scaling plots, Gantt charts.

:func:`render` renders from the rows of ``results.csv`` (and the timeline JSON files the
runner stored for the Gantt plot), so ``ddpbench report DIR`` re-renders a report without
running anything. Plots are registered by name in :data:`PLOTS`; an experiment's
``report.plots`` names which to draw.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpbench import contract
from ddpbench.contract import COMMON_AXES
from ddpbench.experiments.naming import format_value
from ddpbench.experiments.report import Document, pyplot
from ddpbench.experiments.throughput.points import expand, point_name
from ddpbench.experiments.throughput.timeline import SPAN_FIELDS, timeline_file

__all__ = ["PLOTS", "PlotContext", "plot", "render", "variant_label"]

RESULT_COLUMNS = ("iteration_time_s", "throughput")
# Columns that identify a point apart from the backend and its knobs.
POINT_AXES = tuple(a for a in COMMON_AXES if a != "workload")
KNOB_COLUMNS = tuple(sorted({k for name in contract.BACKENDS for k in contract.sweep_knobs(name)}))
AXIS_LABELS = {
    "bandwidth_gbps": "link bandwidth per direction (Gbps)",
    "workers": "workers",
    "latency_us": "latency (us)",
    "throughput": "throughput (samples/s, whole job)",
    "iteration_time_ms": "iteration time (ms)",
}


def _saved_meta(outdir: Path) -> dict[str, Any]:
    try:
        return json.loads((outdir / "experiment.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def variant_label(row: Any, knobs: Sequence[str]) -> str:
    """Return ``backend`` or ``backend (knob=v, ...)`` for the knobs given on ``row``."""
    given = [f"{k}={format_value(_num(row[k]))}" for k in knobs
             if k in row and row[k] == row[k] and row[k] != ""]
    return f"{row['backend']} ({', '.join(given)})" if given else str(row["backend"])


def _num(value: Any) -> Any:
    if isinstance(value, float) and value == int(value):
        return int(value)
    return value


def _prepare(df: Any, aggregate: str = "median") -> Any:
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
        ok = _real_quartiles(ok)
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


def _real_quartiles(ok: Any) -> Any:
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


def _is_default(value: Any) -> bool:
    """An axis left at None (its default: the device's, the profile's), NaN in a frame."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _axis_label(value: Any) -> Any:
    if _is_default(value):
        return "default"
    return format_value(value) if isinstance(value, float) else value


def _defaults_named(df: Any, cols: Sequence[str]) -> Any:
    """Return ``df`` with None/NaN in ``cols`` written "default", so that grouping keeps
    those points as series of their own instead of dropping them."""
    if not any(df[c].map(_is_default).any() for c in cols):
        return df
    out = df.copy()
    for c in cols:
        out[c] = out[c].map(lambda v: "default" if _is_default(v) else v)
    return out


def _axis_labels(table: Any) -> Any:
    """Return ``table`` with its (sorted) index values written as point names write them."""
    return table.rename(index=_axis_label)


def _rows_by(df: Any, first: Sequence[str]) -> list[str]:
    """Return ``first`` and then every point axis that varies in ``df``.

    A table keyed on fewer axes than vary would average two configurations into one cell
    (paced and unpaced runs, say); keyed on all of them, each cell is one point.
    """
    return [*first, *(a for a in POINT_AXES if a not in first and a in df.columns
                      and df[a].nunique(dropna=False) > 1)]


def _varying(df: Any, cols: Sequence[str]) -> list[str]:
    return [c for c in cols if c in df.columns and df[c].nunique(dropna=False) > 1]


def _series(df: Any, x: str) -> list[str]:
    """Return the plot series: one line per variant and per value of every other point axis
    that varies (a line through two devices' or paced and unpaced points would mix two
    configurations); ``hosts`` follows ``workers`` and is not a series of its own there."""
    skip = {x, "hosts"} if x == "workers" else {x}
    return ["variant", *_varying(df, [a for a in POINT_AXES if a not in skip])]


def _speedups(agg: Any, baseline: str) -> Any:
    """Return rows of non-baseline variants with ``speedup`` = throughput / baseline's."""
    keys = ["mode", "workload", *[a for a in POINT_AXES if a in agg.columns]]
    base = agg[agg["backend"] == baseline][[*keys, "throughput"]].rename(
        columns={"throughput": "baseline_throughput"})
    # The baseline's own knob variants would make the merge ambiguous: keep the first.
    base = base.drop_duplicates(subset=keys)
    merged = agg[agg["backend"] != baseline].merge(base, on=keys, how="inner")
    merged["speedup"] = merged["throughput"] / merged["baseline_throughput"]
    return merged


def _panel_grid(plt: Any, n: int, *, width: float = 5.0, height: float = 3.8) -> tuple:
    ncols = min(n, 3)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows + 0.6),
                             squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


_STYLES = ["-", "--", ":", "-."]
_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]


def _line_plot(
    plt: Any, data: Any, x: str, y: str, path: Path, title: str, *,
    ylabel: str, logx: bool = False, logy: bool = False, hline: float | None = None,
    series: Sequence[str] = ("variant",), note: str | None = None,
    colors: dict[str, Any] | None = None, zero: bool = True,
) -> Path:
    """One panel per workload; one line per ``series`` combination; save to ``path``."""
    workloads = list(dict.fromkeys(data["workload"]))
    fig, axes = _panel_grid(plt, len(workloads))
    variants = list(dict.fromkeys(data["variant"]))
    colors = colors or {v: plt.get_cmap("tab10")(i % 10) for i, v in enumerate(variants)}
    extra = [s for s in series if s != "variant"]
    data = _defaults_named(data, extra)
    extra_values = (list(dict.fromkeys(map(tuple, data[extra].values.tolist())))
                    if extra else [()])
    handles: dict[str, Any] = {}
    for ax, workload in zip(axes, workloads):
        sub = data[data["workload"] == workload]
        for (variant, *rest), line in sub.groupby(["variant", *extra], sort=False):
            line = line.sort_values(x)
            idx = extra_values.index(tuple(rest)) if extra else 0
            label = variant + "".join(f", {_series_label(c, v)}" for c, v in zip(extra, rest))
            (h,) = ax.plot(line[x], line[y], _STYLES[idx % 4], color=colors[variant],
                           marker=_MARKERS[variants.index(variant) % len(_MARKERS)],
                           markersize=4, label=label)
            handles.setdefault(label, h)
        if hline is not None:
            h = ax.axhline(hline, color="grey", lw=0.8, ls=":")
            handles.setdefault(f"= {hline:g} (baseline)", h)
        if logx:
            ax.set_xscale("log", base=2)
            ticks = sorted(sub[x].unique())
            ax.set_xticks(ticks)
            ax.set_xticklabels([f"{t:g}" for t in ticks])
        ax.set_title(str(workload))
        ax.set_xlabel(AXIS_LABELS.get(x, x))
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both" if logy else "major")
        if logy:
            ax.set_yscale("log")
        elif zero:
            ax.set_ylim(bottom=0)
    fig.suptitle(title + (f"\n({note})" if note else ""), fontsize=11)
    # As many columns as the figure's width holds at the longest label (9 pt: ~0.075 in a
    # character, plus the line sample), at most 4.
    column_in = 0.075 * max(len(label) for label in handles) + 0.7
    ncol = max(1, min(len(handles), 4, int(fig.get_size_inches()[0] // column_in)))
    rows = math.ceil(len(handles) / ncol)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=ncol,
               frameon=False, fontsize=9)
    height = fig.get_size_inches()[1]
    fig.tight_layout(rect=(0, (0.3 + 0.22 * rows) / height, 1, 1 - 0.1 / height))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _series_label(col: str, value: Any) -> str:
    units = {"bandwidth_gbps": " Gbps", "latency_us": " us", "workers": " workers"}
    if col == "mode":
        return str(value)
    return f"{format_value(_num(value))}{units.get(col, '')}" if col in units else \
        f"{col}={format_value(_num(value))}"


def _fixed_note(data: Any, exclude: Sequence[str]) -> str:
    units = {"bandwidth_gbps": "Gbps", "latency_us": "us"}
    parts = []
    for col in ("workers", "servers", "bandwidth_gbps", "latency_us", "size_scale",
                "compute_scale"):
        if col in exclude or col not in data.columns or data[col].nunique() != 1:
            continue
        value = data[col].iloc[0]
        if col in ("size_scale", "compute_scale") and value == 1:
            continue
        parts.append(f"{col}={format_value(_num(value))}{(' ' + units[col]) if col in units else ''}")
    return ", ".join(parts)


def _gantt(plt: Any, timeline: dict[str, Any], path: Path) -> Path:
    """Draw one iteration's compute and transfer spans per host, coloured by layer."""
    fields = timeline.get("fields", list(SPAN_FIELDS))
    spans = [dict(zip(fields, row)) for row in timeline.get("spans", [])]
    spans = [s for s in spans if float(s["end"]) > 0]
    iter_s = float(timeline.get("iteration_time_s") or 0)
    rows = sorted({(str(s["host"]), str(s["kind"])) for s in spans},
                  key=lambda hk: (_natural(hk[0]), _KIND_ORDER.get(hk[1], 9), hk[1]))
    layers = [int(s["layer"]) for s in spans if s.get("layer") not in (None, "")]
    n_layers = max(layers) + 1 if layers else 1
    cmap = plt.get_cmap("viridis")
    fig, ax = plt.subplots(figsize=(12, 0.32 * len(rows) + 3.2))
    kinds = sorted({k for _, k in rows}, key=lambda k: (_KIND_ORDER.get(k, 9), k))
    # One distinct hatching per activity (forward and backward too), so the legend's
    # swatches tell every kind apart.
    hatches = {k: h for k, h in zip(kinds, ["", "...", "////", "\\\\", "xx", "++", "--", "oo"])}
    by_row: dict[tuple[str, str], list[dict]] = {}
    for s in spans:
        by_row.setdefault((str(s["host"]), str(s["kind"])), []).append(s)
    for y, row in enumerate(rows):
        items = by_row[row]
        bars = [(max(float(s["start"]), 0.0) * 1e3,
                 (float(s["end"]) - max(float(s["start"]), 0.0)) * 1e3) for s in items]
        colors = [cmap(int(s["layer"]) / max(1, n_layers - 1))
                  if s.get("layer") not in (None, "") else "lightgrey" for s in items]
        ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=colors, hatch=hatches.get(row[1]),
                       edgecolor="none", linewidth=0)
    if spans:
        # The drawn iteration ends when its last update is back on every worker (the
        # simulator's definition); the title's iteration time is the mean over the measured
        # iterations, which need not equal this one's length.
        end_ms = max(float(s["end"]) for s in spans) * 1e3
        ax.axvline(end_ms, color="red", ls="--", lw=1)
        ax.text(end_ms, -0.75, "this iteration's last update is back ", color="red",
                fontsize=8, va="center", ha="right")
        iter_ms = iter_s * 1e3
        if iter_ms > 0 and abs(iter_ms - end_ms) > 0.01 * end_ms:
            # Explain the gap between the drawn span and the (mean) iteration time.
            ax.axvline(iter_ms, color="grey", ls=":", lw=1)
            why = ("the next forward pass starts before this\nlast update: its first layers "
                   "are back early" if iter_ms < end_ms else
                   "iterations differ in length:\nthe mean is longer than this one")
            ax.text(iter_ms, -0.95, f"mean iteration time {iter_ms:.1f} ms;\n{why} ",
                    color="dimgrey", fontsize=7, va="center", ha="right")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{h}: {k}" for h, k in rows], fontsize=7)
    ax.set_ylim(len(rows) - 0.5, -1.6)
    ax.set_xlabel("time since the start of the iteration's forward pass (ms)")
    ax.set_ylabel("host: activity")
    import textwrap

    point = textwrap.fill(str(timeline.get("point", "?")).replace(",", ", "), 110)
    ax.set_title(f"One iteration (the last simulated) of\n{point}\n"
                 f"steady-state iteration time {iter_s * 1e3:.1f} ms (mean of the measured "
                 f"iterations); colour = layer (dark = input side, yellow = output side)",
                 fontsize=9)
    from matplotlib.patches import Patch

    legend = [Patch(facecolor="lightgrey", edgecolor="black", hatch=hatches[k], label=k)
              for k in kinds]
    fig.legend(handles=legend, loc="lower center", fontsize=8, ncol=len(legend),
               title="activity (hatching)", title_fontsize=8, frameon=False)
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(0, n_layers - 1))
    fig.colorbar(sm, ax=ax, label="layer index (0 = input)", pad=0.01)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout(rect=(0, 0.75 / fig.get_size_inches()[1], 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


_KIND_ORDER = {"forward": 0, "backward": 1, "compute": 0, "push": 2, "send": 2, "pull": 3,
               "recv": 3, "sum": 4, "allreduce": 2}


def _natural(text: str) -> tuple:
    import re

    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text))


def _sim_vs_real(plt: Any, agg: Any, path: Path) -> tuple[Path, Any] | None:
    keys = ["variant", "backend", "workload", *[a for a in POINT_AXES if a in agg.columns]]
    sim = agg[agg["mode"] == "simulate"][[*keys, "iteration_time_ms"]]
    real = agg[agg["mode"] == "real"][[*keys, "iteration_time_ms"]]
    pairs = sim.merge(real, on=keys, suffixes=("_sim", "_real"))
    if pairs.empty:
        return None
    fig, ax = plt.subplots(figsize=(8.5, 5.5))
    backends = list(dict.fromkeys(pairs["variant"]))
    # Marker shape tells apart what else varies: workloads, else worker counts.
    shape_col = "workload" if pairs["workload"].nunique() > 1 else "workers"
    shapes = list(dict.fromkeys(pairs[shape_col]))
    for _, r in pairs.iterrows():
        ax.scatter(r["iteration_time_ms_sim"], r["iteration_time_ms_real"],
                   color=plt.get_cmap("tab10")(backends.index(r["variant"]) % 10),
                   marker=_MARKERS[shapes.index(r[shape_col]) % len(_MARKERS)], s=45)
    hi = 1.1 * max(pairs["iteration_time_ms_sim"].max(), pairs["iteration_time_ms_real"].max())
    ax.plot([0, hi], [0, hi], color="grey", ls=":", lw=1)
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    ax.set_xlabel("simulated iteration time (ms)")
    ax.set_ylabel("measured iteration time (ms)")
    ax.set_title("Simulator prediction vs real run (points on the dotted line agree)",
                 fontsize=10)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=plt.get_cmap("tab10")(i % 10), marker="o", ls="",
                      label=v) for i, v in enumerate(backends)]
    handles += [Line2D([], [], color="black", marker=_MARKERS[i % len(_MARKERS)], ls="",
                       label=_series_label(shape_col, w) if shape_col == "workers" else w)
                for i, w in enumerate(shapes)]
    handles.append(Line2D([], [], color="grey", ls=":", label="real = simulated"))
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    pairs["real/sim"] = pairs["iteration_time_ms_real"] / pairs["iteration_time_ms_sim"]
    return path, pairs


def render(df: Any, outdir: Path, spec: Any) -> list[Path]:
    """Render the report of a ``throughput`` experiment into ``outdir``.

    Args:
        df: every row of results.csv (failed rows included).
        outdir: the report folder; PNGs are written beside report.md.
        spec: the experiment's ``ThroughputSpec`` (which plots, the baseline, Gantt points).

    Returns:
        The paths written (report.md, report.html, PNGs).
    """
    plt = pyplot()
    outdir = Path(outdir)
    meta = _saved_meta(outdir)
    name = meta.get("name") or (str(df["experiment"].iloc[0]) if len(df) else outdir.name)
    opts = spec.report
    doc = Document(opts.title or f"Experiment {name}")
    if meta.get("description"):
        doc.text(meta["description"])
    n_ok = int((df["status"] == "ok").sum()) if len(df) else 0
    n_failed = int((df["status"] == "failed").sum()) if len(df) else 0
    doc.text(f"{len(df)} rows in `results.csv`: {n_ok} ok, {n_failed} failed. "
             f"Backends: {', '.join(spec.backends)}; workloads: {', '.join(spec.workloads)}; "
             f"mode: {spec.mode}. Re-render with `ddpbench report {outdir}`.")
    written: list[Path] = []
    for old in outdir.glob("*.png"):
        old.unlink()
    agg = _prepare(df, opts.aggregate) if len(df) else df
    if agg is None or len(agg) == 0:
        doc.text("No point finished successfully yet: nothing to plot.")
        _failed_section(doc, df)
        return doc.write(outdir)

    most = int(agg["repetitions"].max())
    if most > 1:
        doc.text(f"A point with repetitions (up to {most}) shows "
                 + ("the fastest of them (the shortest iteration time: the run least "
                    "disturbed by a shared machine)." if opts.aggregate == "fastest"
                    else "the median of the real runs' lower quartiles of their timed "
                    "iterations (as `ddpbench calibrate` estimates each of its runs: a "
                    "shared machine's slow phases begin and end inside runs, and a run "
                    "may land in a slow or a fast state of seconds)."
                    if opts.aggregate == "quartile"
                    else "their median."))
    plots = list(opts.plots) if opts.plots is not None else _auto_plots(agg, spec)
    sim = agg[agg["mode"] == "simulate"] if (agg["mode"] == "simulate").any() else agg
    shown = "simulated" if (sim["mode"] == "simulate").all() else "measured"
    palette = {v: plt.get_cmap("tab10")(i % 10)
               for i, v in enumerate(dict.fromkeys(agg["variant"]))}
    baseline = opts.baseline

    shown = "simulated" if (sim["mode"] == "simulate").all() else "measured"
    # Headline numbers first: what a reader came for.
    if baseline and baseline in set(agg["backend"]):
        sp = _speedups(sim, baseline)
        if not sp.empty:
            doc.heading(f"Speedup over {baseline} ({shown})")
            doc.bullets(_speedup_highlights(sp, baseline))
            x = _speedup_x(sp)
            cols = _rows_by(sp, ["workload", *([x] if x in sp.columns else [])])
            # Rows in numeric order of their axes (bandwidth 6 before 8, 10 before 15).
            # dropna=False: a point whose axis is left at None (its default) keeps its row.
            table = _axis_labels(sp.pivot_table(index=cols, columns="variant",
                                                values="speedup", sort=False,
                                                dropna=False).sort_index())
            doc.table(table, index=True, caption=f"Throughput / {baseline}'s throughput at "
                      f"the same point (> 1: faster than {baseline}).")

    doc.heading("Throughput (samples/s, whole job)")
    cols = _rows_by(agg, ["mode", "workload"] if agg["mode"].nunique() > 1 else ["workload"])
    doc.table(_axis_labels(agg.pivot_table(index=cols, columns="variant", values="throughput",
                                           sort=False, dropna=False).sort_index()), index=True)

    doc.heading("Plots")
    ctx = PlotContext(plt=plt, doc=doc, outdir=outdir, df=df, agg=agg, sim=sim, spec=spec,
                      shown=shown, palette=palette, baseline=baseline)
    for name, draw in PLOTS.items():
        if name in plots or (name in _ALWAYS and _ALWAYS[name](agg)):
            written += draw(ctx)
    _failed_section(doc, df)
    doc.heading("All points")
    show = [c for c in ("mode", "point", "repetition", "status", "iteration_time_s",
                        "throughput", "bytes_sent_max") if c in df.columns]
    table = df[show].copy()
    if "iteration_time_s" in table:
        table["iteration_time_ms"] = table.pop("iteration_time_s") * 1e3
    doc.table(table)
    return doc.write(outdir) + written


def _speedup_x(sp: Any) -> str:
    """Plot speedup against the axis swept most finely (bandwidth on a tie)."""
    if sp.empty:
        return "bandwidth_gbps"
    return "workers" if sp["workers"].nunique() > sp["bandwidth_gbps"].nunique() \
        else "bandwidth_gbps"


def _efficiency(sim: Any) -> Any:
    # Relative to the smallest job of the same series (device, paced, ... alike).
    keys = ["variant", "workload", *_series(sim, "workers")[1:]]
    out = sim.copy()
    per_worker = out["throughput"] / out["workers"]
    first = out.assign(pw=per_worker).sort_values("workers").groupby(
        keys, sort=False, dropna=False)["pw"]
    out["efficiency"] = 100.0 * per_worker / first.transform("first")
    return out


def _auto_plots(agg: Any, spec: Any) -> list[str]:
    plots = []
    if agg["bandwidth_gbps"].nunique() > 1:
        plots.append("throughput_vs_bandwidth")
    if spec.report.baseline:
        plots.append("speedup")
    if agg["workers"].nunique() > 1:
        plots.append("scaling")
    if spec.report.gantt:
        plots.append("gantt")
    if {"simulate", "real"} <= set(agg["mode"]):
        plots.append("sim_vs_real")
    return plots


def _gantt_points(df: Any, spec: Any) -> list[str]:

    names = []
    for params in expand(spec):
        if params.get("_timeline"):
            names.append(point_name(params))
    return names


def _speedup_highlights(sp: Any, baseline: str) -> list[str]:
    """One line per variant and workload: the speedup at 10 Gbps and where it peaks."""
    x = _speedup_x(sp)
    others = _varying(sp, [c for c in ("workers", "bandwidth_gbps", "latency_us") if c != x])
    sp = _defaults_named(sp, others)
    lines = []
    for (variant, workload, *rest), grp in sp.groupby(["variant", "workload", *others],
                                                      sort=False):
        best = grp.loc[grp["speedup"].idxmax()]
        where = _series_label(x, best[x])
        ten = ""
        if x == "bandwidth_gbps":
            at10 = grp[grp["bandwidth_gbps"] == 10]
            if len(at10) == 1:
                ten = f"{at10['speedup'].iloc[0]:.2f}x at 10 Gbps; "
        ctx = "".join(f", {_series_label(c, v)}" for c, v in zip(others, rest))
        lines.append(f"{variant} on {workload}{ctx}: {ten}peak {best['speedup']:.2f}x at "
                     f"{where}")
    return lines


def _failed_section(doc: Document, df: Any) -> None:
    if not len(df) or not (df["status"] == "failed").any():
        return
    failed = df[df["status"] == "failed"][["mode", "point", "error"]]
    doc.heading("Failed points")
    doc.table(failed)


@dataclass
class PlotContext:
    """What a registered plot draws from, and the document it adds its images to."""

    plt: Any
    doc: Document
    outdir: Path
    df: Any
    agg: Any
    sim: Any
    spec: Any
    shown: str
    palette: dict[Any, Any]
    baseline: str | None


PLOTS: dict[str, Callable[[PlotContext], list[Path]]] = {}
"""Plot name (``report.plots`` in an experiment file) -> the function that draws it."""
# Plots drawn even when not asked for, when the data calls for them.
_ALWAYS: dict[str, Callable[[Any], bool]] = {
    "sim_vs_real": lambda agg: {"real", "simulate"} <= set(agg["mode"]),
}


def plot(name: str) -> Callable[[Callable[[PlotContext], list[Path]]],
                                Callable[[PlotContext], list[Path]]]:
    """Register a plot under ``name`` (a duplicate name is an error)."""
    def deco(fn: Callable[[PlotContext], list[Path]]) -> Callable[[PlotContext], list[Path]]:
        if name in PLOTS:
            raise ValueError(f"plot {name!r} is already registered")
        PLOTS[name] = fn
        return fn
    return deco


@plot("throughput_vs_bandwidth")
def _plot_throughput_vs_bandwidth(c: PlotContext) -> list[Path]:
    sim = c.sim
    if sim["bandwidth_gbps"].nunique() < 2:
        return []
    series = _series(sim, "bandwidth_gbps")
    p = _line_plot(c.plt, sim, "bandwidth_gbps", "throughput",
                   c.outdir / "throughput_vs_bandwidth.png",
                   f"Throughput vs link bandwidth ({c.shown})",
                   ylabel=AXIS_LABELS["throughput"], series=series,
                   note=_fixed_note(sim, series), colors=c.palette)
    c.doc.image(p.relative_to(c.outdir), "throughput vs bandwidth")
    return [p]


@plot("speedup")
def _plot_speedup(c: PlotContext) -> list[Path]:
    baseline = c.baseline
    if not baseline or baseline not in set(c.sim["backend"]):
        return []
    sp = _speedups(c.sim, baseline)
    x = _speedup_x(sp)
    if sp.empty or sp[x].nunique() < 2:
        return []
    series = _series(sp, x)
    p = _line_plot(c.plt, sp, x, "speedup", c.outdir / "speedup.png",
                   f"Speedup over {baseline} ({c.shown})",
                   ylabel=f"speedup over {baseline} (x)", hline=1.0,
                   logx=(x == "workers"), series=series,
                   note=_fixed_note(sp, [x, *series]), colors=c.palette, zero=False)
    c.doc.image(p.relative_to(c.outdir), f"speedup over {baseline}")
    return [p]


@plot("scaling")
def _plot_scaling(c: PlotContext) -> list[Path]:
    sim = c.sim
    if sim["workers"].nunique() < 2:
        return []
    series = _series(sim, "workers")
    p = _line_plot(c.plt, sim, "workers", "throughput", c.outdir / "scaling.png",
                   f"Throughput vs number of workers ({c.shown})",
                   ylabel="throughput (samples/s, log scale)", logx=True,
                   logy=True, series=series,
                   note=_fixed_note(sim, ["workers", *series]), colors=c.palette)
    c.doc.image(p.relative_to(c.outdir), "scaling")
    eff = _efficiency(sim)
    q = _line_plot(c.plt, eff, "workers", "efficiency", c.outdir / "scaling_efficiency.png",
                   "Scaling efficiency: throughput per worker relative to the smallest "
                   "job", ylabel="efficiency (%)", logx=True, hline=100.0, series=series,
                   note=_fixed_note(sim, ["workers", *series]), colors=c.palette)
    c.doc.image(q.relative_to(c.outdir), "scaling efficiency")
    return [p, q]


@plot("gantt")
def _plot_gantt(c: PlotContext) -> list[Path]:
    written = []
    for point in _gantt_points(c.df, c.spec):
        tl_path = c.outdir / "timelines" / timeline_file(point)
        if not tl_path.exists():
            c.doc.text(f"Gantt of `{point}`: no timeline stored (run it again with "
                       f"`--force --only '{point}'`).")
            continue
        p = _gantt(c.plt, json.loads(tl_path.read_text()), c.outdir / f"gantt_{tl_path.stem}.png")
        c.doc.image(p.relative_to(c.outdir), f"timeline of {point}")
        written.append(p)
    return written


@plot("sim_vs_real")
def _plot_sim_vs_real(c: PlotContext) -> list[Path]:
    found = _sim_vs_real(c.plt, c.agg, c.outdir / "sim_vs_real.png")
    if found is None:
        return []
    p, pairs = found
    c.doc.image(p.relative_to(c.outdir), "simulated vs measured iteration time")
    cols = _rows_by(pairs, ["variant", "workload", "workers"])
    c.doc.table(pairs[[*cols, "iteration_time_ms_sim", "iteration_time_ms_real", "real/sim"]],
                caption="Iteration time (ms), simulated and measured; real/sim per point.")
    _calibration_section(c.doc, pairs)
    return [p]


def _calibration_section(doc: Document, pairs: Any) -> None:
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
