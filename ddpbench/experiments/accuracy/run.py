"""The ``accuracy`` kind's points: one real training job per variant."""

from __future__ import annotations

import json
from typing import Any

from ddpbench import contract
from ddpbench.experiments.accuracy.spec import NAMED_DEFAULTS, RUN_KEYS, Spec
from ddpbench.experiments.naming import format_value, make_name


def check(spec: Spec, raw: Any, file: Any) -> Spec:
    """Build a PyTorch model once at load, so a bad spec is an error with its line."""
    from ddpbench.experiments.schema import err_at

    if ":" in spec.model:
        try:
            from ddpbench.profiling.model import build_model

            build_model(spec.model)
        except (ValueError, ImportError) as err:
            raise err_at(file, raw, ("model",), str(err)) from None
    return spec


def expand(spec: Spec) -> list[dict[str, Any]]:
    """Return one point per distinct (backend, compression, predivide, period, knobs)."""
    import itertools

    seen: set[str] = set()
    out = []
    run = {k: getattr(spec, k) for k in RUN_KEYS}
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
    named = {k: params[k] for k, d in NAMED_DEFAULTS.items()
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
    from ddpbench.experiments.accuracy.worker import make_config, run_training

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
    if cfg["backend"] not in contract.PS_BACKENDS:
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
        "curve_test_loss": res["curve"]["test_loss"],
        "seed": cfg["seed"],
    }


