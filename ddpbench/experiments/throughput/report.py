"""The ``throughput`` kind's report: tables, throughput/speedup/scaling plots, Gantt charts.

:func:`render` renders from the rows of ``results.csv`` (and the timeline JSON files the
runner stored for the Gantt plot), so ``ddpbench report DIR`` re-renders a report without
running anything. Its parts: :mod:`.aggregate` (one row per point, speedups),
:mod:`.text` (headlines and tables) and :mod:`.plots` (registered by name in
:data:`PLOTS`; an experiment's ``report.plots`` names which to draw).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ddpbench.experiments.report import Document, pyplot
from ddpbench.experiments.throughput.aggregate import per_point, variant_label
from ddpbench.experiments.throughput.plots import PLOTS, PlotContext, auto_plots, draw, plot
from ddpbench.experiments.throughput.text import (
    all_points,
    failed_section,
    repetitions_note,
    speedup_section,
    throughput_table,
)

__all__ = ["PLOTS", "PlotContext", "plot", "render", "variant_label"]


def _saved_meta(outdir: Path) -> dict[str, Any]:
    try:
        return json.loads((outdir / "experiment.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


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
    opts = spec.report
    doc = _front_matter(df, outdir, spec)
    for old in outdir.glob("*.png"):
        old.unlink()
    agg = per_point(df, opts.aggregate) if len(df) else df
    if agg is None or len(agg) == 0:
        doc.text("No point finished successfully yet: nothing to plot.")
        failed_section(doc, df)
        return doc.write(outdir)

    repetitions_note(doc, agg, opts.aggregate)
    plots = list(opts.plots) if opts.plots is not None else auto_plots(agg, spec)
    sim = agg[agg["mode"] == "simulate"] if (agg["mode"] == "simulate").any() else agg
    shown = "simulated" if (sim["mode"] == "simulate").all() else "measured"
    palette = {v: plt.get_cmap("tab10")(i % 10)
               for i, v in enumerate(dict.fromkeys(agg["variant"]))}
    # Headline numbers first: what a reader came for.
    speedup_section(doc, agg, sim, opts.baseline, shown)
    throughput_table(doc, agg)
    doc.heading("Plots")
    ctx = PlotContext(plt=plt, doc=doc, outdir=outdir, df=df, agg=agg, sim=sim, spec=spec,
                      shown=shown, palette=palette, baseline=opts.baseline)
    written = draw(ctx, plots)
    failed_section(doc, df)
    all_points(doc, df)
    return doc.write(outdir) + written


def _front_matter(df: Any, outdir: Path, spec: Any) -> Document:
    """Start the report: its title, the experiment's description, and what results.csv holds."""
    meta = _saved_meta(outdir)
    name = meta.get("name") or (str(df["experiment"].iloc[0]) if len(df) else outdir.name)
    doc = Document(spec.report.title or f"Experiment {name}")
    if meta.get("description"):
        doc.text(meta["description"])
    n_ok = int((df["status"] == "ok").sum()) if len(df) else 0
    n_failed = int((df["status"] == "failed").sum()) if len(df) else 0
    doc.text(f"{len(df)} rows in `results.csv`: {n_ok} ok, {n_failed} failed. "
             f"Backends: {', '.join(spec.backends)}; workloads: {', '.join(spec.workloads)}; "
             f"mode: {spec.mode}. Re-render with `ddpbench report {outdir}`.")
    return doc
