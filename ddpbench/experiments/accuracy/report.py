"""The ``accuracy`` kind's report: accuracy over seeds against fp32, curves with their range."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ddpbench.experiments.accuracy.spec import NOISE_SIGMAS, Spec


def _series(value: Any) -> list[float]:
    return json.loads(value) if isinstance(value, str) else list(value)


def summarise(ok: Any) -> Any:
    """Return one row per point: accuracy mean, std, min, max over its runs, mean curves."""
    import numpy as np
    import pandas as pd

    rows = []
    for point, grp in ok.groupby("point", sort=False):
        acc = grp["final_test_acc"].astype(float).to_numpy()
        curves = [(_series(s), _series(a), _series(lo) if isinstance(lo, (str, list)) else [])
                  for s, a, lo in zip(grp["curve_step"], grp["curve_test_acc"],
                                      grp.get("curve_test_loss", grp["curve_test_acc"]))]
        steps = curves[0][0]
        same = [c for c in curves if c[0] == steps]
        accs = np.array([c[1] for c in same], float)
        losses = np.array([c[2] for c in same if len(c[2]) == len(steps)], float)
        rows.append({
            "point": point, "backend": grp["backend"].iloc[0], "setting": grp["setting"].iloc[0],
            "runs": len(acc), "acc_mean": float(acc.mean()),
            "acc_std": float(acc.std(ddof=1)) if len(acc) > 1 else float("nan"),
            "acc_min": float(acc.min()), "acc_max": float(acc.max()),
            "replica_max_diff": float(grp["replica_max_diff"].astype(float).max()),
            "step_time_ms": float(grp["step_time_ms"].astype(float).median()),
            "steps": steps, "curve_mean": accs.mean(0).tolist(),
            "curve_min": accs.min(0).tolist(), "curve_max": accs.max(0).tolist(),
            "loss_mean": losses.mean(0).tolist() if len(losses) else [],
        })
    return pd.DataFrame(rows)


def _reference_of(summary: Any, backend: str) -> Any:
    """Return the fp32 row of ``backend``, else the first fp32 row (None without any)."""
    fp32 = summary[summary["setting"] == "fp32"]
    own = fp32[fp32["backend"] == backend]
    return own.iloc[0] if len(own) else (fp32.iloc[0] if len(fp32) else None)


def _difference(row: Any, ref: Any) -> tuple[float, float]:
    """Return (mean difference, its standard error) of ``row`` against ``ref``."""
    diff = float(row["acc_mean"] - ref["acc_mean"])
    se = math.sqrt(row["acc_std"] ** 2 / row["runs"] + ref["acc_std"] ** 2 / ref["runs"])
    return diff, se


def render(df: Any, outdir: Path, spec: Spec) -> list[Path]:
    """Write report.md/html: accuracy over seeds, differences from fp32, curves."""
    import pandas as pd

    from ddpbench.experiments.report import Document, pyplot

    outdir = Path(outdir)
    doc = Document("Accuracy: one model, every backend and setting")
    framework = ("PyTorch through `ddpbench.torch` (DistributedOptimizer, "
                 "broadcast_parameters)" if ":" in spec.model else
                 "`ddpbench.nn` (NumPy) through DistributedTrainer")
    doc.text(
        f"`{spec.model}` on the `{spec.dataset}` dataset ({framework}), {spec.workers} "
        f"workers x batch {spec.batch_size}, {spec.steps} steps of SGD (lr {spec.lr}, "
        f"{spec.lr_schedule} schedule, momentum {spec.momentum}); each variant runs "
        f"{spec.repetitions} time(s) with seeds {spec.seed}..{spec.seed + spec.repetitions - 1} "
        f"(data order and initialisation); every worker is seeded differently and made "
        f"equal by `broadcast_parameters`. Test accuracy of worker 0's replica on the "
        f"held-out split.")
    paths: list[Path] = []
    if df is None or len(df) == 0:
        doc.text("No results yet.")
        return paths + doc.write(outdir)
    failed = df[df["status"] != "ok"]
    ok = df[df["status"] == "ok"].copy()
    if len(ok):
        summary = summarise(ok)
        table_rows = []
        for _, row in summary.iterrows():
            ref = _reference_of(summary, row["backend"])
            diff, se = (_difference(row, ref) if ref is not None and row["point"] != ref["point"]
                        else (float("nan"), float("nan")))
            noise = ("" if math.isnan(diff) else
                     "differs" if math.isfinite(se) and abs(diff) > NOISE_SIGMAS * se
                     else "within noise")
            table_rows.append({
                "backend": row["backend"], "setting": row["setting"], "runs": row["runs"],
                "test acc mean (%)": round(row["acc_mean"], 2),
                "std": round(row["acc_std"], 2), "min..max": f"{row['acc_min']:.2f}.."
                                                              f"{row['acc_max']:.2f}",
                "vs fp32 (points)": "" if math.isnan(diff) else f"{diff:+.2f} +- {se:.2f}",
                "vs fp32": noise,
                "replicas max |diff|": row["replica_max_diff"],
                "median step (ms)": round(row["step_time_ms"], 2),
            })
        doc.heading("Final test accuracy over seeds")
        doc.table(pd.DataFrame(table_rows))
        doc.text(f"`vs fp32`: the variant's mean minus the mean of the same backend's fp32 "
                 f"runs (the first fp32 variant for a backend without one), +- the standard "
                 f"error of that difference; `differs` when it exceeds {NOISE_SIGMAS:g} "
                 "standard errors, `within noise` otherwise. `replicas max |diff|`: the "
                 "largest difference of any parameter between a worker and worker 0 at the "
                 "end. `median step`: one training step on worker 0 with ranks "
                 "oversubscribing the cores; it shows every point ran, not how fast a "
                 "backend is (see `ddpbench bench`).")
        doc.heading("Targets")
        doc.bullets(_checks(summary, spec))
        paths += _plots(summary, outdir, pyplot())
        for p in paths:
            doc.image(p.relative_to(outdir), p.stem.replace("_", " "))
    if len(failed):
        doc.heading("Failed points")
        doc.table(failed[["point", "error"]])
    return paths + doc.write(outdir)


def _checks(summary: Any, spec: Spec) -> list[str]:
    out = []
    fp32 = summary[summary["setting"] == "fp32"]
    if spec.target_acc is not None and len(fp32):
        worst = fp32.loc[fp32["acc_mean"].idxmin()]
        lowest = fp32.loc[fp32["acc_min"].idxmin()]
        verdict = "PASS" if float(worst["acc_mean"]) >= spec.target_acc else "FAIL"
        out.append(f"{verdict}: fp32 reaches >= {spec.target_acc:g}% on every backend "
                   f"(lowest mean {worst['acc_mean']:.2f}% on {worst['backend']}; lowest "
                   f"single run {lowest['acc_min']:.2f}% on {lowest['backend']})")
    if len(fp32) > 1:
        spread = float(fp32["acc_mean"].max() - fp32["acc_mean"].min())
        seed_sd = float(fp32["acc_std"].mean())
        out.append(f"fp32 backends' means span {spread:.2f} points; the seeds' standard "
                   f"deviation within a backend is {seed_sd:.2f} points on average")
    for _, row in summary[summary["setting"] != "fp32"].iterrows():
        ref = _reference_of(summary, row["backend"])
        if ref is None:
            continue
        diff, se = _difference(row, ref)
        told = math.isfinite(se) and abs(diff) > NOISE_SIGMAS * se
        out.append(f"{row['backend']} {row['setting']}: {diff:+.2f} +- {se:.2f} points from "
                   f"{ref['backend']} fp32 ({'differs' if told else 'within noise'})")
    return out or ["(no fp32 reference to compare with)"]


def _plots(summary: Any, outdir: Path, plt: Any) -> list[Path]:
    paths = []
    groups = [("fp32 backends", summary[summary["setting"] == "fp32"],
               "accuracy_fp32_backends.png"),
              ("settings (compression, predivide, local SGD)",
               summary[summary["setting"] != "fp32"], "accuracy_settings.png")]
    for title, part, fname in groups:
        if not len(part):
            continue
        fig, (ax, zoom, lax) = plt.subplots(1, 3, figsize=(15, 4.2))
        styles = ["-", "--", "-.", ":"]
        for i, (_, row) in enumerate(part.iterrows()):
            label = row["backend"] if row["setting"] == "fp32" else \
                f"{row['backend']} ({row['setting']})"
            color = plt.cm.tab20(i % 20)
            for a in (ax, zoom):
                a.plot(row["steps"], row["curve_mean"], styles[i % 4], lw=1.4, label=label,
                       color=color)
                a.fill_between(row["steps"], row["curve_min"], row["curve_max"], color=color,
                               alpha=0.12, lw=0)
            if row["loss_mean"]:
                lax.plot(row["steps"], row["loss_mean"], styles[i % 4], lw=1.4, color=color,
                         label=label)
        ax.set_xlabel("step")
        ax.set_ylabel("test accuracy (%): seeds' mean and range")
        ax.set_title(f"Accuracy vs step: {title}", fontsize=10)
        ax.grid(alpha=0.3)
        first = part.iloc[0]["steps"]
        half = first[len(first) // 2]
        tail = [a for _, row in part.iterrows()
                for s, a in zip(row["steps"], row["curve_min"]) if s >= half]
        tail += [a for _, row in part.iterrows()
                 for s, a in zip(row["steps"], row["curve_max"]) if s >= half]
        zoom.set_xlim(half, None)
        zoom.set_ylim(min(tail) - 0.3, max(tail) + 0.3)
        zoom.set_xlabel("step (second half, zoomed)")
        zoom.grid(alpha=0.3)
        zoom.legend(fontsize=7, loc="lower right")
        lax.set_xlabel("step")
        lax.set_ylabel("test loss, mean over seeds")
        lax.set_yscale("log")
        lax.grid(alpha=0.3)
        lax.set_title("Test loss vs step", fontsize=10)
        fig.tight_layout()
        path = outdir / fname
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    fig, ax = plt.subplots(figsize=(max(6, 0.55 * len(summary)), 4))
    labels = [f"{b}\n{s}" for b, s in zip(summary["backend"], summary["setting"])]
    mean = summary["acc_mean"].astype(float)
    err = [mean - summary["acc_min"], summary["acc_max"] - mean]
    ax.bar(range(len(summary)), mean, yerr=err, capsize=3,
           color=["C0" if s == "fp32" else "C1" for s in summary["setting"]])
    ax.set_xticks(range(len(summary)), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylim(float(summary["acc_min"].min()) - 2, float(summary["acc_max"].max()) + 1)
    for i, a in enumerate(mean):
        ax.text(i, a + 0.1, f"{a:.2f}", ha="center", fontsize=6)
    ax.set_ylabel("final test accuracy (%): mean, bars min..max over seeds")
    ax.set_title("Final test accuracy per backend and setting (blue: fp32)", fontsize=10)
    fig.tight_layout()
    path = outdir / "final_accuracy.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
    return paths
