"""The throughput report's plots, registered by name in :data:`PLOTS`.

An experiment's ``report.plots`` names which to draw (:func:`auto_plots` picks them when it
names none); each plot adds its images, and any table that goes with them, to the report.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpbench.experiments.naming import format_value
from ddpbench.experiments.report import Document
from ddpbench.experiments.throughput.aggregate import (
    POINT_AXES,
    defaults_named,
    efficiency,
    int_if_whole,
    rows_by,
    series_columns,
    series_label,
    speedup_x,
    speedups,
)
from ddpbench.experiments.throughput.points import expand, point_name
from ddpbench.experiments.throughput.text import calibration_section
from ddpbench.experiments.throughput.timeline import SPAN_FIELDS, timeline_file

__all__ = ["AXIS_LABELS", "PLOTS", "PlotContext", "auto_plots", "draw", "plot"]

AXIS_LABELS = {
    "bandwidth_gbps": "link bandwidth per direction (Gbps)",
    "workers": "workers",
    "latency_us": "latency (us)",
    "throughput": "throughput (samples/s, whole job)",
    "iteration_time_ms": "iteration time (ms)",
}


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
    data = defaults_named(data, extra)
    extra_values = (list(dict.fromkeys(map(tuple, data[extra].values.tolist())))
                    if extra else [()])
    handles: dict[str, Any] = {}
    for ax, workload in zip(axes, workloads):
        sub = data[data["workload"] == workload]
        for (variant, *rest), line in sub.groupby(["variant", *extra], sort=False):
            line = line.sort_values(x)
            idx = extra_values.index(tuple(rest)) if extra else 0
            label = variant + "".join(f", {series_label(c, v)}" for c, v in zip(extra, rest))
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
        parts.append(f"{col}={format_value(int_if_whole(value))}{(' ' + units[col]) if col in units else ''}")
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
                       label=series_label(shape_col, w) if shape_col == "workers" else w)
                for i, w in enumerate(shapes)]
    handles.append(Line2D([], [], color="grey", ls=":", label="real = simulated"))
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    pairs["real/sim"] = pairs["iteration_time_ms_real"] / pairs["iteration_time_ms_sim"]
    return path, pairs


def auto_plots(agg: Any, spec: Any) -> list[str]:
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


def draw(ctx: PlotContext, names: Sequence[str]) -> list[Path]:
    """Draw, in the order they were registered, the plots ``names`` asks for and those the
    data calls for; return the images written."""
    written: list[Path] = []
    for name, draw_one in PLOTS.items():
        if name in names or (name in _ALWAYS and _ALWAYS[name](ctx.agg)):
            written += draw_one(ctx)
    return written


@plot("throughput_vs_bandwidth")
def _plot_throughput_vs_bandwidth(c: PlotContext) -> list[Path]:
    sim = c.sim
    if sim["bandwidth_gbps"].nunique() < 2:
        return []
    series = series_columns(sim, "bandwidth_gbps")
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
    sp = speedups(c.sim, baseline)
    x = speedup_x(sp)
    if sp.empty or sp[x].nunique() < 2:
        return []
    series = series_columns(sp, x)
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
    series = series_columns(sim, "workers")
    p = _line_plot(c.plt, sim, "workers", "throughput", c.outdir / "scaling.png",
                   f"Throughput vs number of workers ({c.shown})",
                   ylabel="throughput (samples/s, log scale)", logx=True,
                   logy=True, series=series,
                   note=_fixed_note(sim, ["workers", *series]), colors=c.palette)
    c.doc.image(p.relative_to(c.outdir), "scaling")
    eff = efficiency(sim)
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
    cols = rows_by(pairs, ["variant", "workload", "workers"])
    c.doc.table(pairs[[*cols, "iteration_time_ms_sim", "iteration_time_ms_real", "real/sim"]],
                caption="Iteration time (ms), simulated and measured; real/sim per point.")
    calibration_section(c.doc, pairs)
    return [p]
