"""The ``numerics`` kind's report: error and overflow maps, safe ranges, a reading."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ddpbench import numerics as nm
from ddpbench.experiments.numerics.spec import GPU_LABEL, Spec

# --------------------------------------------------------------------------- report


def _fmt_f(f: float) -> str:
    if f >= 1024 and math.log2(f) == int(math.log2(f)):
        return f"2^{int(math.log2(f))}"
    return f"{f:g}"


def _fmt_scale(s: float) -> str:
    e = math.log10(s)
    return f"1e{int(e)}" if e == int(e) else f"{s:g}"


def _map_rows(df: Any) -> Any:
    import pandas as pd

    m = df[(df.get("task", "map") == "map") & (df["status"] == "ok")].copy()
    if m.empty:
        return m
    for col in ("scale", "factor", "rel_l2_err", "max_rel_err", "mean_rel_err",
                "overflow_frac", "underflow_frac"):
        m[col] = pd.to_numeric(m[col])
    for col in ("world_size", "overflow", "underflow"):
        m[col] = pd.to_numeric(m[col]).astype(int)
    return m


def _mark(m: Any, spec: Spec) -> Any:
    rows = m.to_dict("records")
    # Each scaling rule is its own map: the best factor is found within a rule.
    for rule in ("cpu", "gpu"):
        group = [r for r in rows if (r.get("scaling") if isinstance(r.get("scaling"), str)
                                     else "cpu") == rule]
        nm.mark_safe(group, err_ratio=spec.safe.err_ratio,
                     underflow_tol=spec.safe.underflow_tol)
    import pandas as pd

    out = pd.DataFrame(rows)
    if "scaling" in out.columns:  # Horovod's CUDA rule: its own maps, labelled float16_gpu
        out.loc[out["scaling"] == "gpu", "dtype"] = GPU_LABEL
    return out


def _cell_grids(cell: Any, grid: list[float], worlds: list[int]) -> tuple[Any, Any, Any]:
    """Return one panel's (log10 error, signed log range, safe) arrays: N rows x factor columns."""
    import numpy as np

    err = np.full((len(worlds), len(grid)), np.nan)
    sign = np.full_like(err, np.nan)
    safe = np.zeros_like(err, dtype=bool)
    for _, row in cell.iterrows():
        if row["factor"] not in grid or row["world_size"] not in worlds:
            continue
        i, j = worlds.index(row["world_size"]), grid.index(row["factor"])
        err[i, j] = math.log10(max(row["rel_l2_err"], 1e-12))
        if row["overflow"] > 0:
            err[i, j] = np.nan
        sign[i, j] = (math.log10(1e4 * row["overflow_frac"] + 1) if row["overflow"]
                      else -math.log10(1e4 * row["underflow_frac"] + 1))
        safe[i, j] = bool(row["safe"])
    return err, sign, safe


def _panel(ax: Any, cell: Any, spec: Spec, which: str, title: str) -> Any:
    """Draw one (distribution, scale) panel of an ``error`` or ``range`` map; return its image."""
    import numpy as np

    grid, worlds = spec.factors.grid(), list(spec.world_sizes)
    err, sign, safe = _cell_grids(cell, grid, worlds)
    if which == "error":
        image = ax.imshow(err, origin="lower", aspect="auto", cmap="viridis",
                          vmin=-4, vmax=0, interpolation="nearest")
        oi, oj = np.nonzero(np.isnan(err) & ~np.isnan(sign))
        if oi.size:
            ax.scatter(oj, oi, marker="x", s=14, c="red", linewidths=1)
    else:
        image = ax.imshow(sign, origin="lower", aspect="auto", cmap="RdBu_r",
                          vmin=-4, vmax=4, interpolation="nearest")
    si, sj = np.nonzero(safe)
    if si.size:
        ax.scatter(sj, si, marker="o", s=5, facecolors="none", linewidths=0.6,
                   edgecolors="white" if which == "error" else "black")
    # f = sqrt(N) and f = N as lines across the rows
    for power, style in ((0.5, ":"), (1.0, "--")):
        xs = [math.log2(n ** power) / spec.factors.step for n in worlds]
        ax.plot(xs, range(len(worlds)), style, color="orange", lw=1)
    ax.set_title(title, fontsize=9)
    ax.set_xlim(-0.5, len(grid) - 0.5)
    ax.set_ylim(-0.5, len(worlds) - 0.5)
    return image


def _label_axes(fig: Any, axes: Any, spec: Spec, used: set[tuple[int, int]]) -> None:
    """Put the factor axis under each column, the N axis beside each row; drop unused panels."""
    grid, worlds = spec.factors.grid(), list(spec.world_sizes)
    nrows, ncols = len(axes), len(axes[0])
    for c in range(ncols):
        # the lowest panel of each column carries the factor axis
        r = max(r for r in range(nrows) if (r, c) in used)
        ticks = list(range(0, len(grid), max(1, len(grid) // 6)))
        axes[r][c].set_xticks(ticks, [_fmt_f(grid[t]) for t in ticks], fontsize=7)
        axes[r][c].xaxis.set_tick_params(labelbottom=True)
        axes[r][c].set_xlabel("predivide factor f", fontsize=8)
    for r in range(nrows):
        for c in range(ncols):
            if (r, c) not in used:
                fig.delaxes(axes[r][c])
    for row_axes in axes:
        ticks = list(range(0, len(worlds), 2))
        row_axes[0].set_yticks(ticks, [str(worlds[t]) for t in ticks], fontsize=7)
        row_axes[0].set_ylabel("world size N", fontsize=8)


def _legend(fig: Any, image: Any, dtype: str, which: str) -> None:
    """Title the figure and add the colour bar of an ``error`` or ``range`` map."""
    if which == "error":
        title = (f"{dtype}: log10 relative L2 error of the ring average vs fp64 "
                 "(red x: overflow; o: safe; dotted f=sqrt(N), dashed f=N)")
        label = "log10 rel. L2 error"
    else:
        title = (f"{dtype}: overflow (red) / underflow (blue) fraction of results "
                 "(o: safe; dotted f=sqrt(N), dashed f=N)")
        label = "fraction of results that overflow (red) or underflow (blue)"
    fig.suptitle(title, fontsize=10)
    bar = fig.colorbar(image, cax=fig.add_axes((0.83, 0.25, 0.015, 0.5)), label=label)
    if which == "range":
        fracs = (1e-3, 1e-2, 1e-1, 1.0)
        cbar_ticks = [-math.log10(1e4 * f + 1) for f in reversed(fracs)] + [0.0] + [
            math.log10(1e4 * f + 1) for f in fracs]
        labels = [f"under {f:g}" for f in reversed(fracs)] + ["none"] + [
            f"over {f:g}" for f in fracs]
        bar.set_ticks(cbar_ticks, labels=labels)


def _heatmaps(plt: Any, m: Any, spec: Spec, dtype: str, outdir: Path) -> list[Path]:
    """Write ``error_<dtype>.png`` and ``range_<dtype>.png``: a panel per distribution and scale."""
    d = m[m["dtype"] == dtype]
    ncols = max(len(dist.scales) for dist in spec.distributions)
    nrows = len(spec.distributions)
    paths = []
    for which in ("error", "range"):
        fig, axes = plt.subplots(nrows, ncols, figsize=(3.1 * ncols + 1.4, 2.6 * nrows + 0.7),
                                 squeeze=False, sharex=True, sharey=True)
        fig.subplots_adjust(left=0.08, right=0.8, top=0.92, bottom=0.07, wspace=0.08,
                            hspace=0.28)
        image = None
        used = set()
        for r, dist in enumerate(spec.distributions):
            for c, s in enumerate(dist.scales):
                used.add((r, c))
                cell = d[(d["dist"] == dist.name) & (d["scale"] == s)]
                image = _panel(axes[r][c], cell, spec, which,
                               f"{dist.name}, scale {_fmt_scale(s)}")
        _label_axes(fig, axes, spec, used)
        _legend(fig, image, dtype, which)
        path = outdir / f"{which}_{dtype}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)
    return paths


# A cell whose best factor still errs by more than this is flagged: no factor helps there.
POOR_ERROR = 0.01


def _range_text(lo_hi: tuple[float, float] | None, n: int, rows: Any) -> str:
    if lo_hi is None:
        return "none"
    lo, hi = lo_hi
    safe = set(rows[rows["safe"]]["factor"])
    gaps = [f for f in rows["factor"] if lo < f < hi and f not in safe]
    text = f"{_fmt_f(lo)} - {_fmt_f(hi)}" + (" (gaps)" if gaps else "")
    best = float(rows["best_rel_l2_err"].min())
    if best > POOR_ERROR:
        text += f" [best err {best:.0%}]"
    return text


def safe_table(m: Any, spec: Spec, dtype: str, dist: str) -> Any:
    """Return the safe factor range per world size (rows) and scale (columns)."""
    import pandas as pd

    d = m[(m["dtype"] == dtype) & (m["dist"] == dist)]
    table = []
    for n in spec.world_sizes:
        row: dict[str, Any] = {"N": n}
        for s in sorted(d["scale"].unique()):
            cell = d[(d["world_size"] == n) & (d["scale"] == s)]
            rng = nm.safe_range(cell.to_dict("records"))
            row[f"scale {_fmt_scale(s)}"] = _range_text(rng, n, cell)
        table.append(row)
    return pd.DataFrame(table)


def _reading(m: Any, spec: Spec) -> list[str]:
    """Return one plain sentence per (dtype, distribution, N in {1024, 4096})."""
    out = []
    for dtype in spec.map_labels():
        for dist in spec.distributions:
            for n in [w for w in (1024, 4096) if w in spec.world_sizes]:
                parts, worst = [], 0.0
                for s in dist.scales:
                    cell = m[(m["dtype"] == dtype) & (m["dist"] == dist.name)
                             & (m["world_size"] == n) & (m["scale"] == s)]
                    if cell.empty:
                        continue
                    rng = nm.safe_range(cell.to_dict("records"))
                    worst = max(worst, float(cell["best_rel_l2_err"].min()))
                    parts.append(f"near {_fmt_scale(s)}: " + (
                        "none" if rng is None else f"{_fmt_f(rng[0])} to {_fmt_f(rng[1])}"))
                if not parts:
                    continue
                text = (f"{dtype}, {dist.name} gradients, N={n}: safe factors "
                        + "; ".join(parts) + ".")
                if worst > POOR_ERROR:
                    text += (f" Even the best factor leaves up to {worst:.0%} relative error "
                             f"here: {dtype} accumulation over {n} ranks, not range, limits "
                             "accuracy, and no factor fixes that.")
                out.append(text)
    return out


def _choices(m: Any, spec: Spec) -> Any:
    """Return a table: are f = 1, sqrt(N), N safe at N = 1024 and 4096, and why not."""
    import pandas as pd

    rows = []
    worlds = [w for w in (256, 1024, 4096) if w in spec.world_sizes]
    for dtype in spec.map_labels():
        for dist in spec.distributions:
            for s in dist.scales:
                row = {"dtype": dtype, "gradients": dist.name, "scale": _fmt_scale(s)}
                for n in worlds:
                    cell = m[(m["dtype"] == dtype) & (m["dist"] == dist.name)
                             & (m["world_size"] == n) & (m["scale"] == s)]
                    by_f = {r["factor"]: r for r in cell.to_dict("records")}
                    for label, f in (("1", 1.0), ("sqrt(N)", math.sqrt(n)), ("N", float(n))):
                        r = by_f.get(f)
                        if r is None:
                            verdict = ""
                        elif r["safe"]:
                            verdict = "ok"
                        elif r["overflow"]:
                            verdict = "OVERFLOW"
                        elif r["underflow_frac"] > spec.safe.underflow_tol:
                            verdict = "underflow"
                        else:
                            verdict = f"err x{r['rel_l2_err'] / r['best_rel_l2_err']:.0f}"
                        row[f"N={n} f={label}"] = verdict
                rows.append(row)
    return pd.DataFrame(rows)


def _training(plt: Any, df: Any, outdir: Path, doc: Any, m: Any) -> list[Path]:
    import pandas as pd

    t = df[(df.get("task", "map") == "train") & (df["status"] == "ok")].copy()
    if t.empty:
        return []
    t["factor"] = pd.to_numeric(t["factor"])
    fig, ax = plt.subplots(figsize=(7, 4))
    table = []
    n = int(t["world_size"].iloc[0])
    dtype = t["dtype"].iloc[0]
    rms = float(t["grad_rms0"].iloc[0])
    base = t[t["factor"] == 0]
    rms_last = float(base["grad_rms_last"].iloc[0]) if not base.empty else math.nan

    def verdict(value: Any) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "-"
        return "safe" if str(value).lower() == "true" else "unsafe"

    for _, row in t.sort_values("factor").iterrows():
        curve = json.loads(row["loss_curve"])
        f = float(row["factor"])
        first, last = verdict(row.get("map_safe_first")), verdict(row.get("map_safe_last"))
        label = "fp64 average (baseline)" if f == 0 else f"f = {_fmt_f(f)} ({first} / {last})"
        diverged = row.get("diverged_at")
        if f and diverged == diverged and diverged is not None and str(diverged) != "":
            label += f", diverged at step {int(float(diverged))}"
        finite = [v for v in curve if v == v and v not in (math.inf, -math.inf)]
        steps = range(1, len(curve) + 1) if finite else []
        ax.plot(steps, curve if finite else [], label=label,
                lw=2.5 if f == 0 else 1.2, ls="-" if f == 0 else "--")
        table.append({"factor": "fp64 baseline" if f == 0 else _fmt_f(f),
                      "map at first gradient scale": first if f else "",
                      "map at last gradient scale": last if f else "",
                      "overflow steps": int(row["overflow_steps"]),
                      "final loss": float(row["final_loss"])})
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (fp64 evaluation)")
    ax.set_title(f"least squares, {n} simulated workers, {dtype} ring\none worker's gradient "
                 f"RMS {rms:.3g} at the start, {rms_last:.3g} at the end; map verdict: "
                 "first / last step", fontsize=9)
    ax.legend(fontsize=8)
    path = outdir / "training.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    doc.heading("Training with fp16 communication")
    doc.text(
        f"A least-squares model (w in R^dim, rows a ~ N(0, I), y = a.w* + 0.01 noise) trained "
        f"with SGD by {n} simulated workers whose fp32 gradients are multiplied by a loss "
        f"scale (so one worker's first gradient has RMS {rms:.3g}), cast to {dtype} and "
        "averaged by the emulated ring at each predivide factor; the average is unscaled in "
        "fp32. No dynamic loss scaling: an overflowed step is applied, so overflow shows as "
        "divergence (a run that diverges at step 1 leaves no curve). The least-squares "
        "gradients share a mean across workers but are noisier than the map's 'correlated' "
        "model, so the map's verdict is a conservative guide here, not a prediction; "
        "the map columns are the emulator's verdict for correlated gradients at "
        "this N at the first and at the last step's gradient RMS: training shrinks the "
        "gradients, so a factor must be safe at both ends. (ddpbench's real trainer needs "
        "a process per worker; 1024 workers need the emulator.)")
    doc.table(pd.DataFrame(table))
    doc.image(Path(path.name), "training loss per predivide factor")
    return [path]


def render(df: Any, outdir: Path, spec: Spec) -> list[Path]:
    """Write report.md/.html with heatmaps, safe-range tables, a reading and the training."""
    from ddpbench.experiments import report

    plt = report.pyplot()
    outdir.mkdir(parents=True, exist_ok=True)
    doc = report.Document("Predivide factor numerics of the ring allreduce")
    m = _map_rows(df)
    paths: list[Path] = []
    _intro(doc, spec)
    if not m.empty:
        m = _mark(m, spec)
        _users(doc, m, spec)
        for dtype in spec.map_labels():
            if (m["dtype"] == dtype).any():
                paths += _maps(doc, plt, m, spec, dtype, outdir)
        _error_table(doc, m)
        paths.append(_write_safe_csv(m, outdir))
    paths += _training(plt, df, outdir, doc, m)
    _how_to(doc)
    _failed(doc, df)
    return paths + doc.write(outdir)


def _intro(doc: Any, spec: Spec) -> None:
    """Say what the maps show and how the gradients and 'safe' are defined."""
    doc.text(
        "What `gradient_predivide_factor` f does to half-precision gradient averages: every "
        "rank multiplies its gradient by 1/f (in fp32, rounded once), the ring sums in the "
        "gradient's dtype in the exact order of the `horovod` backend, and the sum is "
        "multiplied by f/N. Emulated (bit-exact with the backend, checked at 2-4 ranks) for "
        f"N up to {max(spec.world_sizes)}, {spec.elements} elements per rank, against the "
        "exact fp64 mean of the same inputs. `scale` is the RMS of one rank's gradient element.")
    doc.bullets([
        "normal: independent N(0, scale^2) per rank (noise only: sums grow like sqrt(N))",
        "correlated: a mean shared by all ranks plus equal per-rank noise (sums grow like N)",
        "heavy_tailed: Student t, 3 degrees of freedom",
        "layers: correlated, with per-tensor RMS spread over 3 decades (ResNet-50 tensor sizes)",
        f"safe = no inf/nan, at most {spec.safe.underflow_tol:g} more of the results flushed "
        "to zero or subnormal (where the fp64 mean is normal) than at the cell's least "
        f"underflowing factor, and relative L2 error at most "
        f"{spec.safe.err_ratio:g}x the best factor of the cell (or {spec.safe.err_ratio:g}x the "
        "unit roundoff, if larger)",
    ])


def _users(doc: Any, m: Any, spec: Spec) -> None:
    """Write the reading for users: the rule of thumb, one sentence per cell, common choices."""
    reading = _reading(m, spec)
    doc.heading("Reading for users")
    doc.text(
        "A factor f is a range tool: dividing by f before the sum keeps partial sums "
        "below 65504 (fp16's largest value) and multiplying by f/N afterwards restores "
        "the mean. It costs nothing while every prescaled value g/f stays a normal "
        "number (>= 6.1e-5 in fp16); below that, values lose bits as subnormals and "
        "under 6e-8 they vanish. So: pick f large enough that N x (typical |g|) / f "
        "stays well below 65504 when gradients share a sign across ranks (with pure "
        "noise the sum only grows like sqrt(N)), and small enough that the smallest "
        "gradients you care about stay above ~6e-5 x f. Check the gradient scale at the "
        "end of training too: it shrinks as the loss falls. bfloat16 has fp32's range, so "
        "no factor is needed, but its 8-bit significand makes long ring sums inaccurate.")
    doc.bullets(reading)
    doc.table(_choices(m, spec),
              caption="The common choices, checked (ok = safe; OVERFLOW = inf/nan; "
                      "underflow = results flushed; err xK = K times the best factor's "
                      "error):")


def _maps(doc: Any, plt: Any, m: Any, spec: Spec, dtype: str, outdir: Path) -> list[Path]:
    """Write one dtype's section: its error and range maps and its safe-range tables."""
    hm = _heatmaps(plt, m, spec, dtype, outdir)
    doc.heading(f"{dtype}: error and range maps")
    if dtype == GPU_LABEL:
        doc.text("float16 under Horovod's CUDA scaling rule (horovod/common/ops/cuda/"
                 "cuda_kernels.cu): the factor is rounded to half and each element "
                 "is multiplied in half, where the float16 maps scale in fp32 as "
                 "Horovod does on CPU. Where 1/f is not exact in half the average is "
                 "biased.")
    for p in hm:
        doc.image(Path(p.name), p.stem)
    doc.heading(f"{dtype}: safe factor ranges", level=3)
    for dist in spec.distributions:
        doc.table(safe_table(m, spec, dtype, dist.name),
                  caption=f"{dtype}, {dist.name}: safe predivide factors "
                          "(smallest - largest on the grid)")
    return hm


def _error_table(doc: Any, m: Any) -> None:
    """Tabulate the relative L2 error at f = 1, sqrt(N), N for N = 64, 1024, 4096."""
    summary = m.copy()
    summary["factor"] = summary.apply(lambda r: nm.factor_label(r["factor"],
                                                                r["world_size"]), axis=1)
    keep = summary[summary["factor"].isin(["1", "sqrt(N)", "N"])]
    piv = keep.pivot_table(index=["dtype", "dist", "scale", "world_size"], columns="factor",
                           values="rel_l2_err", aggfunc="first")
    doc.heading("Relative L2 error at f = 1, sqrt(N), N", level=3)
    doc.table(piv.reset_index()[[c for c in ("dtype", "dist", "scale", "world_size", "1",
                                              "sqrt(N)", "N") if c in piv.reset_index()]]
              .query("world_size in [64, 1024, 4096]"))


def _write_safe_csv(m: Any, outdir: Path) -> Path:
    """Write every map point with its verdict to ``safe.csv``; return its path."""
    cols = ["dtype", "dist", "scale", "world_size", "factor", "factor_label", "overflow",
            "underflow", "rel_l2_err", "best_rel_l2_err", "max_rel_err", "mean_rel_err",
            "safe"]
    m[cols].to_csv(outdir / "safe.csv", index=False, float_format="%.4g")
    return outdir / "safe.csv"


def _how_to(doc: Any) -> None:
    """Define the metrics and name the commands that reproduce the report."""
    doc.heading("Metrics and how to reproduce")
    doc.bullets([
        "rel_l2_err = ||out - mean|| / ||mean|| over finite outputs: the error an optimizer "
        "step sees; it decides 'safe'.",
        "max_rel_err / mean_rel_err are element-wise |out - mean| / |mean| (in safe.csv): "
        "large wherever the ranks' gradients cancel (mean near 0), at every factor.",
        "overflow = inf/nan results; underflow = results zero or subnormal where the fp64 "
        "mean is a normal number of the dtype.",
        "`ddpbench numerics query -N 1024 --dtype float16 --scale 1e2 --dist correlated` "
        "answers one point; `ddpbench numerics sweep FILE` or `ddpbench run FILE` the map; "
        "`ddpbench numerics bench` times the emulator.",
    ])


def _failed(doc: Any, df: Any) -> None:
    """List the failed points with their errors, if any."""
    import pandas as pd

    failed = df[df["status"] != "ok"] if "status" in df else pd.DataFrame()
    if not failed.empty:
        doc.heading("Failed points")
        doc.table(failed[[c for c in ("point", "error") if c in failed]])
