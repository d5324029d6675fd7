"""The ``accuracy`` experiment kind: train one model with every backend and setting, compare.

An experiment file (``experiments/accuracy.yaml``)::

    name: accuracy
    kind: accuracy
    model: mlp              # the training run shared by every point
    workers: 4
    steps: 400
    variants:               # each: backends x the grid of its lists
      - backends: [mpi, horovod, collective, kvstore, p3, byteps]
      - backends: [horovod, collective]
        compression: [fp16]
      - backends: [horovod]
        predivide: [4, 16]
      - backends: [collective]
        local_sgd_period: [2, 4, 10]

Every point is a real job (``ddpbench train``'s :func:`run_training`, run one at a time);
points repeated by several variants run once. The report has the final test accuracy of
every point against the fp32 reference (the first plain fp32 point), checks of the targets
(fp32 backends within 0.1 point of each other, fp16 within 0.5 point of fp32) and
accuracy-vs-step curves.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ddpbench.runner import format_value, make_name

__all__ = ["Spec", "Variant", "expand", "point_name", "render", "run_point"]

FP32_SPREAD_TARGET = 0.1  # points of accuracy between fp32 backends
FP16_TARGET = 0.5  # points of accuracy between fp16 and fp32 of the same backend


class Variant(BaseModel):
    """Backends and the settings to grid over for them."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    backends: list[str] = Field(min_length=1)
    compression: list[Literal["none", "fp16"]] = ["none"]
    predivide: list[float] = Field(default=[1.0], min_length=1)
    local_sgd_period: list[int] = Field(default=[0], min_length=1)
    knobs: dict[str, int | float | str | bool] = {}


class Spec(BaseModel):
    """The keys of an ``accuracy`` experiment."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    model: Literal["mlp", "cnn"] = "mlp"
    dataset: Literal["synthetic", "digits"] = "synthetic"
    workers: int = Field(4, ge=1, le=64)
    servers: int | Literal["colocated"] = "colocated"
    steps: int = Field(400, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(0.1, gt=0)
    lr_schedule: Literal["cosine", "constant"] = "cosine"
    momentum: float = Field(0.9, ge=0)
    seed: int = 0
    eval_every: int = Field(20, ge=1)
    repetitions: int = Field(1, ge=1, description="runs per point, seeds seed, seed+1, ...")
    timeout_s: float = Field(600.0, gt=0)
    variants: list[Variant] = Field(min_length=1)


_RUN_KEYS = ("model", "dataset", "workers", "servers", "steps", "batch_size", "lr", "lr_schedule",
             "momentum", "seed", "eval_every", "timeout_s")
_NAMED_DEFAULTS = {"compression": "none", "predivide": 1.0, "local_sgd_period": 0}


def expand(spec: Spec) -> list[dict[str, Any]]:
    """Return one point per distinct (backend, compression, predivide, period, knobs)."""
    import itertools

    seen: set[str] = set()
    out = []
    run = {k: getattr(spec, k) for k in _RUN_KEYS}
    for v in spec.variants:
        for backend, comp, f, period in itertools.product(
            v.backends, v.compression, v.predivide, v.local_sgd_period
        ):
            params: dict[str, Any] = {
                "mode": "real", "backend": backend, "compression": comp,
                "predivide": float(f), "local_sgd_period": int(period),
                "knobs": json.dumps(dict(sorted(v.knobs.items())), separators=(",", ":")),
                **run,
            }
            name = point_name(params)
            if name in seen:
                continue
            seen.add(name)
            for rep in range(spec.repetitions):
                out.append({**params, "repetition": rep})
    return out


def point_name(params: dict[str, Any]) -> str:
    """``backend[compression=fp16,local_sgd_period=4,predivide=16,...]``; defaults left out."""
    named = {k: params[k] for k, d in _NAMED_DEFAULTS.items()
             if format_value(params.get(k, d)) != format_value(d)}
    knobs = json.loads(params.get("knobs") or "{}")
    named.update(knobs)
    return make_name(params["backend"], named)


def setting_label(params: dict[str, Any]) -> str:
    """Return a short label of the point's setting (``fp32``, ``fp16``, ``f=16``, ``P=4``)."""
    parts = []
    if params.get("compression", "none") == "fp16":
        parts.append("fp16")
    if float(params.get("predivide", 1.0)) != 1.0:
        parts.append(f"f={format_value(float(params['predivide']))}")
    if int(params.get("local_sgd_period", 0) or 0):
        parts.append(f"localSGD P={int(params['local_sgd_period'])}")
    knobs = json.loads(params.get("knobs") or "{}")
    parts += [f"{k}={format_value(v)}" for k, v in knobs.items()]
    return ", ".join(parts) or "fp32"


def run_point(params: dict[str, Any]) -> dict[str, Any]:
    """Train once through ``ddpbench train``'s launcher; return the final figures and curve."""
    from ddpbench.commands.train import make_config, run_training

    servers = params.get("servers", "colocated")
    cfg = make_config(
        model=params["model"], dataset=params["dataset"], backend=params["backend"],
        workers=int(params["workers"]),
        servers=servers if servers == "colocated" else int(servers),
        knobs=json.loads(params.get("knobs") or "{}"), steps=int(params["steps"]),
        batch_size=int(params["batch_size"]), lr=float(params["lr"]),
        lr_schedule=str(params.get("lr_schedule", "cosine")),
        momentum=float(params["momentum"]), compression=params["compression"],
        predivide=float(params["predivide"]), local_sgd_period=int(params["local_sgd_period"]),
        # Repetition r is an independent run: seed + r for the data order and the init.
        seed=int(params["seed"]) + int(params.get("repetition", 0)),
        eval_every=int(params["eval_every"]),
    )
    if cfg["backend"] not in ("kvstore", "p3", "byteps"):
        cfg["servers"] = None
    res = run_training(cfg, timeout=float(params.get("timeout_s", 600.0)))
    return {
        "setting": setting_label(params),
        "final_test_acc": res["final_test_acc"],
        "final_test_loss": res["final_test_loss"],
        "final_train_loss": res["final_train_loss"],
        "replica_max_diff": res["replica_max_diff"],
        "step_time_ms": res["step_time_ms"],
        "train_wall_s": res["wall_s"],
        "curve_step": res["curve"]["step"],
        "curve_test_acc": res["curve"]["test_acc"],
    }


# -- report ------------------------------------------------------------------------------------
def _reference(ok: Any) -> Any:
    fp32 = ok[ok["setting"] == "fp32"]
    return fp32.iloc[0] if len(fp32) else None


def render(df: Any, outdir: Path, spec: Spec) -> list[Path]:
    """Write report.md/html: final-accuracy table, target checks, accuracy-vs-step curves."""
    import pandas as pd

    from ddpbench.report import Document, pyplot

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
