"""Points of a validation experiment: simulate each published setting, compare."""

from __future__ import annotations

import json
from typing import Any

from ddpbench.experiments.naming import make_name
from ddpbench.experiments.validation.spec import Spec


def expand(spec: Spec) -> list[dict[str, Any]]:
    """Return one point per published figure (its setting as JSON text: scalars only)."""
    return [{"mode": "simulate", "id": p.id, "source": p.source, "quote": p.quote,
             "metric": p.metric, "workload": p.workload, "backend": p.backend,
             "baseline": p.baseline or "", "published": p.published,
             "bandwidth_gbps": json.dumps(list(p.bandwidth_gbps)),
             "cluster": json.dumps(p.cluster, sort_keys=True),
             "knobs": json.dumps(p.knobs, sort_keys=True), "iterations": spec.iterations}
            for p in spec.points]


def point_name(params: dict[str, Any]) -> str:
    """Return ``validation[id=...]``."""
    return make_name("validation", {"id": params["id"]})


def _throughput(params: dict[str, Any], backend: str, bandwidth: float,
                knobs: dict[str, Any]) -> float:
    from ddpbench.simulator import simulate

    cluster = json.loads(params["cluster"])
    res = simulate(params["workload"], backend, bandwidth_gbps=bandwidth,
                   iterations=int(params["iterations"]), warmup=1, **cluster, **knobs)
    return float(res.throughput)


def run_point(params: dict[str, Any]) -> dict[str, Any]:
    """Simulate the point's setting; return the simulated figure and its error."""
    bandwidths = json.loads(params["bandwidth_gbps"])
    knobs = json.loads(params["knobs"])
    best_at, value = bandwidths[0], 0.0
    for bw in bandwidths:
        mine = _throughput(params, params["backend"], bw, knobs)
        if params["metric"] == "throughput":
            figure = mine
        else:
            figure = mine / _throughput(params, params["baseline"], bw, {})
        if figure > value:
            best_at, value = bw, figure
    published = float(params["published"])
    return {"simulated": value, "at_gbps": best_at, "rel_error": value / published - 1.0}
