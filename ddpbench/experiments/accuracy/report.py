"""The ``accuracy`` kind's report: final accuracy against the fp32 reference, curves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ddpbench.experiments.accuracy.spec import FP16_TARGET, FP32_SPREAD_TARGET, Spec


# -- report ------------------------------------------------------------------------------------
def _reference(ok: Any) -> Any:
    fp32 = ok[ok["setting"] == "fp32"]
    return fp32.iloc[0] if len(fp32) else None


def render(df: Any, outdir: Path, spec: Spec) -> list[Path]:
    """Write report.md/html: final-accuracy table, target checks, accuracy-vs-step curves."""
    import pandas as pd

    from ddpbench.experiments.report import Document, pyplot

    outdir = Path(outdir)
    doc = Document("Accuracy: one model, every backend and setting")
    doc.text(
        f"`{spec.model}` on the `{spec.dataset}` dataset, {spec.workers} workers x batch "
        f"{spec.batch_size}, {spec.steps} steps of SGD (lr {spec.lr}, {spec.lr_schedule} "
        f"schedule, momentum "
        f"{spec.momentum}), seed {spec.seed}; every worker seeded differently and made equal "
        f"by `broadcast_parameters`. Test accuracy of worker 0's replica (local SGD: at "
        f"averaging steps when the period divides eval_every={spec.eval_every})."
    )
    paths: list[Path] = []
    if df is None or len(df) == 0:
        doc.text("No results yet.")
        return paths + doc.write(outdir)
    failed = df[df["status"] != "ok"]
    ok = df[df["status"] == "ok"].copy()
    if len(ok):
        ok["final_test_acc"] = ok["final_test_acc"].astype(float)
        ok = ok.groupby("point", sort=False, as_index=False).agg(
            backend=("backend", "first"), setting=("setting", "first"),
            final_test_acc=("final_test_acc", "mean"),
            runs=("final_test_acc", "size"),
            replica_max_diff=("replica_max_diff", "max"),
            step_time_ms=("step_time_ms", "median"),
            curve_step=("curve_step", "first"), curve_test_acc=("curve_test_acc", "first"),
        )
        ref = _reference(ok)
        ref_acc = float(ref["final_test_acc"]) if ref is not None else float("nan")
        table = pd.DataFrame({
            "backend": ok["backend"], "setting": ok["setting"],
            "final test acc (%)": ok["final_test_acc"].round(2),
            "runs": ok["runs"],
            "vs fp32 ref (points)": (ok["final_test_acc"] - ref_acc).round(2),
            "replicas max |diff|": ok["replica_max_diff"].astype(float),
            "median step (ms)": ok["step_time_ms"].astype(float).round(2),
        })
        doc.heading("Final test accuracy")
        if ref is not None:
            doc.text(f"Reference: `{ref['point']}` at {ref_acc:.2f}%.")
        doc.table(table)
        doc.text("`replicas max |diff|`: the largest difference of any parameter between a "
                 "worker and worker 0 at the end. `median step`: wall time of one training "
                 "step on worker 0, ranks oversubscribing the machine's cores; it shows "
                 "that every point ran, not how fast a backend is (see `ddpbench bench`).")
        doc.heading("Targets")
        doc.bullets(_checks(ok))
        paths += _plots(ok, outdir, pyplot())
        for p in paths:
            doc.image(p.relative_to(outdir), p.stem.replace("_", " "))
    if len(failed):
        doc.heading("Failed points")
        doc.table(failed[["point", "error"]])
    return paths + doc.write(outdir)


def _checks(ok: Any) -> list[str]:
    out = []
    fp32 = ok[ok["setting"] == "fp32"]
    if len(fp32) > 1:
        spread = float(fp32["final_test_acc"].max() - fp32["final_test_acc"].min())
        verdict = "PASS" if spread <= FP32_SPREAD_TARGET else "FAIL"
        out.append(f"{verdict}: fp32 backends ({', '.join(fp32['backend'])}) span "
                   f"{spread:.2f} points (target <= {FP32_SPREAD_TARGET})")
    by_backend = {b: float(a) for b, a in zip(fp32["backend"], fp32["final_test_acc"])}
    for _, row in ok[ok["setting"] == "fp16"].iterrows():
        base = by_backend.get(row["backend"])
        if base is None:
            continue
        gap = float(row["final_test_acc"]) - base
        verdict = "PASS" if abs(gap) <= FP16_TARGET else "FAIL"
        out.append(f"{verdict}: {row['backend']} fp16 compression is {gap:+.2f} points from "
                   f"its fp32 run (target within {FP16_TARGET})")
    return out or ["(no fp32/fp16 pairs to check)"]


def _series(value: Any) -> list[float]:
    return json.loads(value) if isinstance(value, str) else list(value)


def _plots(ok: Any, outdir: Path, plt: Any) -> list[Path]:
    paths = []
    groups = [("fp32 backends", ok[ok["setting"] == "fp32"], "accuracy_fp32_backends.png"),
              ("settings (compression, predivide, local SGD)",
               ok[ok["setting"] != "fp32"], "accuracy_settings.png")]
    ref = _reference(ok)
    for title, part, fname in groups:
        if not len(part):
            continue
        fig, (ax, zoom) = plt.subplots(1, 2, figsize=(11, 4.2))
        styles = ["-", "--", "-.", ":"]
        for i, (_, row) in enumerate(part.iterrows()):
            steps, acc = _series(row["curve_step"]), _series(row["curve_test_acc"])
            label = row["backend"] if row["setting"] == "fp32" else \
                f"{row['backend']} ({row['setting']})"
            color = plt.cm.tab20(i % 20)  # more than 10 lines: tab10 would repeat colours
            for a in (ax, zoom):
                a.plot(steps, acc, styles[i % 4], lw=1.4, label=label, color=color)
        if ref is not None and part is not groups[0][1]:
            for a in (ax, zoom):
                a.plot(_series(ref["curve_step"]), _series(ref["curve_test_acc"]), "k-", lw=2.2,
                       alpha=0.35, label=f"reference {ref['backend']} fp32")
        ax.set_xlabel("step")
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(f"Accuracy vs step: {title}", fontsize=10)
        ax.grid(alpha=0.3)
        first = _series(part.iloc[0]["curve_step"])
        half = first[len(first) // 2]
        tail = [a for _, row in part.iterrows()
                for s, a in zip(_series(row["curve_step"]), _series(row["curve_test_acc"]))
                if s >= half]
        zoom.set_xlim(half, None)
        zoom.set_ylim(min(tail) - 0.3, max(tail) + 0.3)
        zoom.set_xlabel("step (second half, zoomed)")
        zoom.grid(alpha=0.3)
        zoom.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        path = outdir / fname
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    fig, ax = plt.subplots(figsize=(max(6, 0.55 * len(ok)), 4))
    labels = [f"{b}\n{s}" for b, s in zip(ok["backend"], ok["setting"])]
    acc = ok["final_test_acc"].astype(float)
    ax.bar(range(len(ok)), acc, color=["C0" if s == "fp32" else "C1" for s in ok["setting"]])
    ax.set_xticks(range(len(ok)), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylim(float(acc.min()) - 3, float(acc.max()) + 1.5)
    for i, a in enumerate(acc):
        ax.text(i, a + 0.1, f"{a:.2f}", ha="center", fontsize=6)
    ax.set_ylabel("final test accuracy (%)")
    ax.set_title("Final test accuracy per backend and setting (blue: fp32)", fontsize=10)
    fig.tight_layout()
    path = outdir / "final_accuracy.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
    return paths
