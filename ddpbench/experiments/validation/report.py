"""The validation report: published against simulated, one row per point, misses included."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ddpbench.experiments.report import Document, pyplot
from ddpbench.experiments.validation.spec import Spec


def render(df: Any, outdir: Path, spec: Spec) -> list[Path]:
    """Write report.md/.html and the published-vs-simulated plot into ``outdir``."""
    import pandas as pd

    outdir = Path(outdir)
    ok = df[df["status"] == "ok"].copy() if len(df) else df
    doc = Document("The simulator against published measurements")
    doc.text("Each row is one published figure, simulated in the setting the source "
             "states with the model's constants as they are: device speed and transport "
             "efficiency are set once per device and transport (ddpbench/hardware.py, "
             "each with its source), never fitted per point. rel_error = simulated / "
             "published - 1. Every point is shown, the misses included.")
    if len(ok):
        ok["abs_error"] = ok["rel_error"].astype(float).abs()
        doc.bullets([
            f"points: {len(ok)} from {ok['source'].nunique()} source(s)",
            f"median |error|: {ok['abs_error'].median():.1%}; largest: "
            f"{ok['abs_error'].max():.1%} ({ok.loc[ok['abs_error'].idxmax(), 'id']})",
        ])
        rows = pd.DataFrame({
            "point": ok["id"], "source": ok["source"], "sentence": ok["quote"],
            "setting": [_setting(r) for _, r in ok.iterrows()],
            "metric": ok["metric"], "published": ok["published"].astype(float).round(3),
            "simulated": ok["simulated"].astype(float).round(3),
            "error": [f"{e:+.1%}" for e in ok["rel_error"].astype(float)],
        })
        doc.table(rows)
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(5.5, 5))
        pub, sim = ok["published"].astype(float), ok["simulated"].astype(float)
        ax.scatter(pub, sim)
        for _, r in ok.iterrows():
            ax.annotate(str(r["id"]), (float(r["published"]), float(r["simulated"])),
                        fontsize=7, xytext=(3, 3), textcoords="offset points")
        lo, hi = min(pub.min(), sim.min()) * 0.9, max(pub.max(), sim.max()) * 1.1
        ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="simulated = published")
        ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], alpha=0.15,
                        label="within 10%")
        ax.set_xlabel("published")
        ax.set_ylabel("simulated")
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = outdir / "published_vs_simulated.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        doc.image(Path(path.name), "published against simulated")
    failed = df[df["status"] != "ok"] if len(df) else df
    if len(failed):
        doc.heading("Points that failed")
        doc.table(failed[["point", "error"]])
    return doc.write(outdir)


def _setting(row: Any) -> str:
    cluster = json.loads(row["cluster"]) if isinstance(row["cluster"], str) else {}
    parts = [f"{row['workload']}, {row['backend']}"]
    if isinstance(row.get("baseline"), str) and row["baseline"]:
        parts[0] += f" vs {row['baseline']}"
    parts += [f"{k}={v}" for k, v in sorted(cluster.items())]
    parts.append(f"at {float(row['at_gbps']):g} Gbps")
    return ", ".join(parts)
