"""The ``validation`` kind's points: one per published value, simulated in its setting."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ddpbench import hardware
from ddpbench.experiments.schema import ExperimentError, err_at
from ddpbench.experiments.validation import data
from ddpbench.experiments.validation.spec import Spec

__all__ = ["check", "expand", "point_name", "run_point", "sensitivity_label"]


def _published(spec: Spec) -> data.Published:
    return data.load(spec.published)


def check(spec: Spec, raw: Any, file: str | Path) -> Spec:
    """Load the points file and check ``only``/``sources`` against it."""
    try:
        pub = _published(spec)
    except (OSError, ValueError) as err:
        raise err_at(file, raw, ("published",), str(err)) from None
    ids = {p.id for p in pub.points}
    for i, pid in enumerate(spec.only):
        if pid not in ids:
            raise err_at(file, raw, ("only", i), f"unknown point id {pid!r}; valid: {sorted(ids)}")
    for i, src in enumerate(spec.sources):
        if src not in pub.sources:
            raise err_at(file, raw, ("sources", i),
                         f"unknown source {src!r}; valid: {sorted(pub.sources)}")
    by_id = {p.id: p for p in pub.points}
    for i, sens in enumerate(spec.sensitivity):
        for j, pid in enumerate(sens.points):
            if pid not in by_id:
                raise err_at(file, raw, ("sensitivity", i, "points", j),
                             f"unknown point id {pid!r}; valid: {sorted(ids)}")
            if not by_id[pid].simulate:
                raise err_at(file, raw, ("sensitivity", i, "points", j),
                             f"point {pid!r} is not simulated (simulate: false)")
    if spec.warmup >= spec.iterations:
        raise ExperimentError(file, None, "warmup",
                              f"warmup ({spec.warmup}) must be below iterations "
                              f"({spec.iterations})")
    return spec


def expand(spec: Spec) -> list[dict[str, Any]]:
    """Return one point per selected published value, in the file's order, then one per
    sensitivity, value and chosen point (``sensitivity`` names the field and value)."""
    pub = _published(spec)
    by_id = {p.id: p for p in pub.points}

    def params(p: data.Point) -> dict[str, Any]:
        return {
            "id": p.id, "source": p.source, "metric": p.metric, "published": p.value,
            "simulated_by": "simulator" if p.simulate else "none",
            "mode": "simulate",
            "_point": p.model_dump_json(),
            "_bandwidths": json.dumps(list(spec.bandwidths_gbps)),
            "_iterations": spec.iterations, "_warmup": spec.warmup,
        }

    def selected(p: data.Point) -> bool:
        return ((not spec.only or p.id in spec.only)
                and (not spec.sources or p.source in spec.sources) and p.split in spec.splits)

    points = [params(p) for p in pub.points if selected(p)]
    for sens in spec.sensitivity:
        for value in sens.values:
            for pid in sens.points:
                if not selected(by_id[pid]):
                    continue  # outside this run's only/sources, as its shipped point is
                points.append({**params(by_id[pid]),
                               "sensitivity": sensitivity_label(sens.field, value),
                               "_override": json.dumps({sens.field: value})})
    return points


def sensitivity_label(field: str, value: Any) -> str:
    """Return how a sensitivity row names its field and value (``socket_gbps=8``)."""
    return f"{field}={value:g}" if isinstance(value, (int, float)) else f"{field}={value}"


def key_params(params: dict[str, Any]) -> dict[str, Any]:
    """Return what a point's result depends on: its published setting and the sweep too.

    The runner keys results on public parameters; the setting travels in ``_point``, so a
    changed setting (an assumption revised in ``published.yaml``) must be named here or
    the old result would be kept. So must the device table's overlap slowdown of the
    setting's device (a model constant that a result made before it existed lacks).
    """
    key = {**params, "setting": params["_point"], "bandwidths": params["_bandwidths"],
           "iterations": params["_iterations"], "warmup": params["_warmup"]}
    slowdown = hardware.overlap_slowdown_of(
        json.loads(params["_point"]).get("setting", {}).get("device"))
    if slowdown:
        key["overlap_slowdown"] = slowdown
    return key


def point_name(params: dict[str, Any]) -> str:
    """Return the point's id (ids are unique in a points file), with its sensitivity's
    field and value in brackets for a sensitivity row (``p3_vgg19_30g[socket_gbps=8]``)."""
    sens = params.get("sensitivity")
    return f"{params['id']}[{sens}]" if sens else str(params["id"])


def _throughput(point: data.Point, backend: str, knobs: dict[str, Any], *, bandwidth: float,
                hosts: int | None, gpus_per_host: int, iterations: int,
                warmup: int, transport: str | None = None,
                override: dict[str, Any] | None = None) -> float:
    from ddpbench.experiments.throughput.points import run_point as run_throughput

    s = point.setting
    hosts = hosts if hosts is not None else 1
    params: dict[str, Any] = {
        "mode": "simulate", "workload": s.workload, "backend": backend,
        "workers": hosts * gpus_per_host, "hosts": hosts, "gpus_per_host": gpus_per_host,
        "bandwidth_gbps": bandwidth, "latency_us": s.latency_us,
        "transport": transport or s.transport, "intra_link": s.intra_link, "iterations": iterations, "warmup": warmup, **knobs}
    if s.device is not None:
        params["device"] = s.device
    for field in ("nccl_proto", "nccl_algo", "nccl_version", "nccl_channels",
                  "nccl_socket_flows"):
        if getattr(s, field) is not None:
            params[field] = getattr(s, field)
    if s.nics_per_host != 1:
        params["nics_per_host"] = s.nics_per_host
    if s.collnet:
        params["collnet"] = True
    if s.batch_size is not None:
        params["batch_size"] = s.batch_size
    if s.precision != "fp32":
        params["precision"] = s.precision
    if s.activation_checkpointing is not False:
        params["activation_checkpointing"] = s.activation_checkpointing
    if s.grad_accumulation != 1:
        params["grad_accumulation"] = s.grad_accumulation
    if backend in ("kvstore", "p3", "byteps"):
        params["servers"] = s.servers
    params.update(override or {})
    return float(run_throughput(params)["throughput"])


def _bus_bandwidth(point: data.Point, override: dict[str, Any]) -> float:
    """Return nccl-tests' bus bandwidth (GB/s) of the point's simulated collective in its
    setting: ``bytes / time`` times ``2 (p-1) / p`` for an allreduce, ``(p-1) / p`` for an
    all-gather or a reduce-scatter, whose size is the whole buffer (nccl-tests
    doc/PERFORMANCE.md)."""
    from ddpbench.simulator import simulate_collective

    s = point.setting
    assert s.message_bytes is not None and s.bandwidth_gbps is not None
    hosts = s.hosts or 1
    p = hosts * s.gpus_per_host
    cluster: dict[str, Any] = {"hosts": hosts, "gpus_per_host": s.gpus_per_host,
                               "transport": s.transport, "intra_link": s.intra_link,
                               "nccl_proto": s.nccl_proto, "nccl_algo": s.nccl_algo,
                               "nccl_version": s.nccl_version,
                               "nccl_channels": s.nccl_channels,
                               "nccl_socket_flows": s.nccl_socket_flows, "device": s.device,
                               "nics_per_host": s.nics_per_host if s.nics_per_host != 1
                               else None, "collnet": s.collnet or None,
                               **override}
    t = simulate_collective(s.collective, s.message_bytes, bandwidth_gbps=s.bandwidth_gbps,
                            latency_us=s.latency_us,
                            **{k: v for k, v in cluster.items() if v is not None})
    factor = 2 * (p - 1) / p if s.collective == "allreduce" else (p - 1) / p
    return s.message_bytes / t * factor / 1e9


def run_point(params: dict[str, Any]) -> dict[str, Any]:
    """Simulate one published point; return the simulated value and its relative error."""
    point = data.Point.model_validate_json(params["_point"])
    if not point.simulate:
        return {"simulated": None, "rel_error": None, "peak_bandwidth_gbps": None,
                "note": point.reason, "sweep": None}
    s = point.setting
    it, wu = int(params["_iterations"]), int(params["_warmup"])
    override = json.loads(params.get("_override") or "{}")

    def thr(backend: str, knobs: dict[str, Any], bw: float, hosts: int | None = s.hosts,
            gpus_per_host: int = s.gpus_per_host, transport: str | None = None) -> float:
        return _throughput(point, backend, knobs, bandwidth=bw, hosts=hosts,
                           gpus_per_host=gpus_per_host, iterations=it, warmup=wu,
                           transport=transport, override=override)

    def speedup(bw: float) -> float:
        assert point.baseline is not None
        return (thr(point.backend, point.backend_knobs, bw)
                / thr(point.baseline, point.baseline_knobs, bw,
                      transport=point.baseline_transport))

    peak_bw: float | None = None
    sweep: dict[float, float] = {}
    if point.metric == "speedup":
        assert s.bandwidth_gbps is not None
        value = speedup(s.bandwidth_gbps)
    elif point.metric in ("peak_speedup", "peak_bandwidth"):
        sweep = {bw: speedup(bw) for bw in json.loads(params["_bandwidths"])}
        # Ties (a flat curve) resolve to the lowest bandwidth reaching the peak.
        best = max(sweep.values())
        peak_bw = min(bw for bw, v in sweep.items() if v >= best - 1e-9)
        value = best if point.metric == "peak_speedup" else peak_bw
    elif point.metric == "scaling_efficiency":
        assert s.bandwidth_gbps is not None
        ref = point.reference or data.Reference()
        n = (s.hosts or 1) * s.gpus_per_host
        many = thr(point.backend, point.backend_knobs, s.bandwidth_gbps)
        few = thr(point.backend, point.backend_knobs, s.bandwidth_gbps, hosts=ref.hosts,
                  gpus_per_host=ref.gpus_per_host)
        value = many / (n / (ref.hosts * ref.gpus_per_host) * few)
    elif point.metric == "bus_bandwidth":
        value = _bus_bandwidth(point, override)
    else:
        assert s.bandwidth_gbps is not None
        value = thr(point.backend, point.backend_knobs, s.bandwidth_gbps)
    return {"simulated": float(value), "rel_error": float(value / point.value - 1.0),
            "peak_bandwidth_gbps": peak_bw, "note": "",
            "sweep": json.dumps({f"{bw:g}": v for bw, v in sweep.items()}) if sweep else None}
