"""The ``numerics`` kind's points, and ``ddpbench numerics sweep`` through the runner."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Hashable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddpbench import numerics as nm
from ddpbench.experiments.numerics.spec import GPU_LABEL, Spec

if TYPE_CHECKING:
    from ddpbench.experiments.runner import RunSummary

# --------------------------------------------------------------------------- the kind's points


def _cells(spec: Spec) -> list[dict[str, Any]]:
    cells = []
    for scaling in spec.scalings:
        for dtype in spec.dtypes:
            if scaling == "gpu" and dtype != "float16":
                continue  # Horovod's CUDA rule is a float16 kernel
            extra = {"scaling": "gpu"} if scaling == "gpu" else {}  # cpu: keys unchanged
            for dist in spec.distributions:
                for scale in dist.scales:
                    for n in spec.world_sizes:
                        cells.append({"task": "map", "dtype": dtype, "dist": dist.name,
                                      "scale": float(scale), "world_size": n, **extra})
    return cells


def expand(spec: Spec) -> list[dict[str, Any]]:
    """Return one point per (dtype, distribution, scale, N, factor), then the training runs."""
    points: list[dict[str, Any]] = []
    for cell in _cells(spec):
        factors = spec.factors.for_world(cell["world_size"])
        for f in factors:
            points.append({**cell, "factor": f, "elements": spec.elements, "seed": spec.seed,
                           "mode": "emulate", "_factors": json.dumps(factors)})
    if spec.training is not None:
        t = spec.training
        for tf in (None, *t.factors):
            points.append({"task": "train", "dtype": t.dtype, "dist": "least_squares",
                           "scale": t.scale, "world_size": t.world_size,
                           "factor": float(tf) if tf is not None else 0.0, "steps": t.steps,
                           "dim": t.dim, "batch": t.batch, "seed": spec.seed, "mode": "emulate",
                           "_factors": json.dumps(sorted(float(x) for x in t.factors))})
    return points


def point_name(params: dict[str, Any]) -> str:
    """Return e.g. ``float16[N=64,dist=normal,f=8,scale=1]`` (``train[...]`` for training;
    f=0 is the fp64-communication baseline)."""
    from ddpbench.experiments.naming import make_name

    named = {"N": params["world_size"], "f": params["factor"], "scale": params["scale"]}
    if params.get("task") == "train":
        return make_name("train", {**named, "dtype": params["dtype"]})
    label = GPU_LABEL if params.get("scaling") == "gpu" else params["dtype"]
    return make_name(label, {**named, "dist": params["dist"]})


@functools.lru_cache(maxsize=4)
def _cell_rows(dtype: str, dist: str, scale: float, world_size: int, factors: tuple[float, ...],
               elements: int, seed: int, scaling: str = "cpu") -> dict[float, dict[str, Any]]:
    rows = nm.sweep_cell(dtype, dist, scale, world_size, factors, elements, seed, threads=1,
                         scaling=scaling)
    return {r["factor"]: r for r in rows}


def batch_key(params: dict[str, Any]) -> Hashable | None:
    """Return the cell of a map point (its factors run in one task), None for training."""
    if params.get("task") == "train":
        return None
    return (params.get("scaling", "cpu"), params["dtype"], params["dist"],
            float(params["scale"]), int(params["world_size"]))


def size(params: dict[str, Any]) -> Any:
    """Return what a map point's cell will take (:func:`ddpbench.numerics.emulation_cost`:
    one emulation, single-threaded, at all the cell's factors); None for a training run or a
    point whose values its run refuses anyway."""
    if params.get("task") == "train":
        return None
    factors = len(json.loads(params["_factors"])) if "_factors" in params else 1
    try:
        return nm.emulation_cost(int(params["world_size"]), int(params["elements"]),
                                 params["dtype"], factors, threads=1)
    except (ValueError, TypeError):
        return None


def run_point(params: dict[str, Any]) -> dict[str, Any]:
    """Emulate one point (its whole cell once per process) or run one training run."""
    if params.get("task") == "train":
        return _train_row(params)
    factors = tuple(json.loads(params["_factors"])) if "_factors" in params else (
        float(params["factor"]),)
    rows = _cell_rows(params["dtype"], params["dist"], float(params["scale"]),
                      int(params["world_size"]), factors, int(params["elements"]),
                      int(params.get("seed", 0)), str(params.get("scaling", "cpu")))
    row = dict(rows[float(params["factor"])])
    for key in ("dtype", "dist", "scale", "world_size", "factor", "elements", "seed",
                "scaling"):
        row.pop(key, None)
    return row


def _loss_scale_for(scale: float, world_size: int, dim: int, batch: int, seed: int) -> float:
    probe = nm.train_least_squares(None, world_size=min(world_size, 64), dim=dim, batch=batch,
                                   steps=1, loss_scale=1.0, dtype="float32", seed=seed)
    return scale / probe["grad_rms0"]


def _train_row(params: dict[str, Any]) -> dict[str, Any]:
    factor = float(params["factor"]) or None
    n, dim, seed = int(params["world_size"]), int(params["dim"]), int(params.get("seed", 0))
    batch = int(params.get("batch", 16))
    loss_scale = _loss_scale_for(float(params["scale"]), n, dim, batch, seed)
    res = nm.train_least_squares(factor, world_size=n, dim=dim, batch=batch,
                                 steps=int(params["steps"]), loss_scale=loss_scale,
                                 dtype=params["dtype"], seed=seed)
    verdicts: dict[str, Any] = {"map_safe_first": None, "map_safe_last": None}
    if factor is not None:
        factors = tuple(json.loads(params.get("_factors", "[]"))) or (factor,)
        for when, rms in (("first", res["grad_rms0"]), ("last", res["grad_rms_last"])):
            if not (math.isfinite(rms) and rms > 0):
                continue
            rows = _cell_rows(params["dtype"], "correlated", float(f"{rms:.3g}"), n, factors,
                              8192, seed)
            cell = nm.mark_safe([dict(r) for r in rows.values()])
            verdicts[f"map_safe_{when}"] = next(r["safe"] for r in cell if r["factor"] == factor)
    return {"final_loss": res["final_loss"], "overflow_steps": res["overflow_steps"],
            "diverged_at": res["diverged_at"], "grad_rms0": res["grad_rms0"],
            "grad_rms_last": res["grad_rms_last"], "loss_scale": loss_scale, **verdicts,
            "loss_curve": json.dumps(res["loss"])}


# --------------------------------------------------------------------------- ddpbench numerics sweep


def run_sweep(spec: Spec, outdir: Path, *, jobs: int = 2, name: str | None = None,
              description: str = "", source: str = "<flags>", progress: bool = True,
              force: bool = False, allow_large: bool = False) -> RunSummary:
    """Run every point of ``spec`` through the runner into ``outdir``, then render.

    ``ddpbench numerics sweep`` builds the experiment from flags (or a file) and runs it as
    ``ddpbench run`` would: the runner writes results.csv and experiment.json, skips the
    points the folder already holds (``force`` runs them again) and renders the report.
    Cells (all factors of one dtype, distribution, scale and N) run in ``jobs`` processes.

    Raises:
        ValueError: ``outdir`` is a file or holds another experiment, or a cell passes this
            machine's limits (:func:`size`; ``allow_large`` runs it anyway).
    """
    from ddpbench.experiments import runner
    from ddpbench.experiments.schema import Experiment

    exp = Experiment(name=name or outdir.name, kind="numerics", description=description,
                     spec=spec, path=source)
    return runner.run_experiment(exp, outdir, jobs=max(1, jobs), force=force,
                                 progress=progress, allow_large=allow_large)
