"""The published data points the ``validation`` kind checks the simulator against.

The points live in ``published.yaml`` beside this module (or a file the experiment names);
:func:`load` reads it with a safe loader (:func:`ddpbench.safeyaml.load`) and validates every
point: a known source, a quote, a metric, a setting whose device, transport and intra-host
link exist in :mod:`ddpbench.hardware` and whose workload is a shipped profile (points marked
``simulate: false`` only need a ``reason``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ddpbench import contract, hardware, safeyaml

__all__ = ["DEFAULT_FILE", "METRICS", "SPLITS", "Point", "Published", "Reference", "Setting",
           "Source", "load"]

DEFAULT_FILE = Path(__file__).with_name("published.yaml")
METRICS = ("speedup", "peak_speedup", "peak_bandwidth", "scaling_efficiency", "throughput",
           "bus_bandwidth")
SPLITS = ("fit", "test")
_SWEPT = ("peak_speedup", "peak_bandwidth")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Source(_Frozen):
    """Where points come from: a paper, a documentation page, a reading note."""

    title: str = Field(min_length=1)
    url: str = Field(min_length=1)


class Setting(_Frozen):
    """The cluster and workload a point was measured on (the simulator's names)."""

    workload: str
    hosts: int | None = Field(None, ge=1)
    gpus_per_host: int = Field(1, ge=1)
    device: str | None = None
    batch_size: int | None = Field(None, ge=1)
    precision: Literal["fp32", "mixed", "tf32", "fp16", "bf16", "fp8"] = "fp32"
    activation_checkpointing: contract.CheckpointingPolicy = False
    grad_accumulation: int = Field(1, ge=1, description="micro-batches per optimizer step "
                                   "(batch_size is one micro-batch's, per GPU)")
    transport: str = "tcp"
    intra_link: str = "pcie"
    nccl_proto: str | None = None
    nccl_algo: str | None = None
    nccl_version: str | None = None
    nccl_channels: int | None = Field(None, ge=1)
    nccl_socket_flows: int | None = Field(None, ge=1)
    nics_per_host: int = Field(1, ge=1)
    collnet: bool = False
    bandwidth_gbps: float | None = Field(None, gt=0)
    latency_us: float = Field(5.0, ge=0)
    servers: int | Literal["colocated"] = "colocated"
    message_bytes: int | None = Field(None, ge=1)
    collective: Literal["allreduce", "all_gather", "reduce_scatter"] = Field(
        "allreduce", description="bus_bandwidth: the nccl-tests operation (all_reduce_perf, "
        "all_gather_perf, reduce_scatter_perf); message_bytes is its size column")


class Reference(_Frozen):
    """What a scaling efficiency is relative to: the same job on this many GPUs."""

    hosts: int = Field(1, ge=1)
    gpus_per_host: int = Field(1, ge=1)


class Point(_Frozen):
    """One published value with its citation and setting."""

    id: str = Field(pattern=r"^[a-z0-9_]+$")
    source: str
    where: str = Field(min_length=1)
    quote: str = Field(min_length=1)
    setting: Setting
    metric: Literal["speedup", "peak_speedup", "peak_bandwidth", "scaling_efficiency",
                    "throughput", "bus_bandwidth"]
    backend: str
    backend_knobs: dict[str, Any] = Field(default_factory=dict)
    baseline: str | None = None
    baseline_knobs: dict[str, Any] = Field(default_factory=dict)
    baseline_transport: str | None = None  # the baseline over another transport (RDMA vs TCP)
    value: float = Field(gt=0)
    assumed: tuple[str, ...] = ()
    simulate: bool = True
    reason: str | None = None
    split: Literal["fit", "test"] = "fit"
    curve: str | None = Field(None, pattern=r"^[a-z0-9_]+$")
    reference: Reference | None = None
    notes: str = ""

    @model_validator(mode="after")
    def _consistent(self) -> Point:
        needs_baseline = self.metric in ("speedup", *_SWEPT)
        if needs_baseline and self.baseline is None:
            raise ValueError(f"point {self.id!r}: metric {self.metric!r} needs a baseline")
        if self.reference is not None and self.metric != "scaling_efficiency":
            raise ValueError(f"point {self.id!r}: reference applies to scaling_efficiency only")
        if (self.metric == "bus_bandwidth") != (self.setting.message_bytes is not None):
            raise ValueError(f"point {self.id!r}: setting.message_bytes is needed by, and only "
                             f"by, metric 'bus_bandwidth'")
        if self.setting.collective != "allreduce" and self.metric != "bus_bandwidth":
            raise ValueError(f"point {self.id!r}: setting.collective applies to metric "
                             f"'bus_bandwidth' only")
        for field in self.assumed:
            if field not in Setting.model_fields:
                raise ValueError(f"point {self.id!r}: assumed field {field!r} is not a setting "
                                 f"field; valid: {sorted(Setting.model_fields)}")
        if not self.simulate:
            if not self.reason:
                raise ValueError(f"point {self.id!r}: simulate: false needs a reason")
            return self
        s = self.setting
        for backend in (self.backend, self.baseline):
            if backend is not None and backend not in contract.BACKENDS:
                raise ValueError(f"point {self.id!r}: unknown backend {backend!r}; "
                                 f"valid: {sorted(contract.BACKENDS)}")
        if s.device is not None:
            hardware.device(s.device)
        hardware.transport(s.transport)
        if self.baseline_transport is not None:
            if self.baseline is None:
                raise ValueError(f"point {self.id!r}: baseline_transport needs a baseline")
            hardware.transport(self.baseline_transport)
        hardware.intra_link(s.intra_link)
        hardware.nccl_protocols(s.nccl_proto)
        hardware.nccl_algorithms(s.nccl_algo, hardware.nccl_release(s.nccl_version))
        if self.metric in _SWEPT and s.bandwidth_gbps is not None:
            raise ValueError(f"point {self.id!r}: metric {self.metric!r} sweeps the bandwidth; "
                             "leave bandwidth_gbps out of its setting")
        if self.metric not in _SWEPT and s.bandwidth_gbps is None:
            raise ValueError(f"point {self.id!r}: metric {self.metric!r} needs "
                             "setting.bandwidth_gbps")
        from ddpbench.experiments.throughput.spec import BUILTIN_WORKLOADS

        if self.metric != "bus_bandwidth" and s.workload not in BUILTIN_WORKLOADS:
            raise ValueError(f"point {self.id!r}: unknown workload {s.workload!r}; "
                             f"valid: {sorted(BUILTIN_WORKLOADS)}")
        if s.precision == "mixed" and self.metric != "bus_bandwidth":
            from ddpbench.simulator import load_workload

            wl = load_workload(s.workload)
            if wl.mixed_precision_speedup is None:
                raise ValueError(f"point {self.id!r}: precision 'mixed' needs a workload "
                                 f"profile that records a measured mixed_precision_speedup; "
                                 f"{s.workload!r} records none (mark the point simulate: "
                                 f"false with a reason)")
            measured = hardware.DEVICES[wl.device].like if wl.device in hardware.DEVICES \
                else None
            if s.device is not None and s.device not in (wl.device, measured):
                raise ValueError(f"point {self.id!r}: precision 'mixed' is {s.workload!r}'s "
                                 f"speedup measured on {measured or wl.device}, not "
                                 f"{s.device}; name the arithmetic (fp16, bf16) instead")
        contract.validate_knobs(self.backend, dict(self.backend_knobs))
        if self.baseline is not None:
            contract.validate_knobs(self.baseline, dict(self.baseline_knobs))
        return self


class Published(_Frozen):
    """The whole file: sources and points."""

    sources: dict[str, Source]
    points: tuple[Point, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _references(self) -> Published:
        seen: set[str] = set()
        for p in self.points:
            if p.source not in self.sources:
                raise ValueError(f"point {p.id!r}: unknown source {p.source!r}; "
                                 f"valid: {sorted(self.sources)}")
            if p.id in seen:
                raise ValueError(f"point id {p.id!r} appears twice")
            seen.add(p.id)
        return self


def load(path: str | Path | None = None) -> Published:
    """Read and validate the published points (the shipped file when ``path`` is None).

    Raises:
        ValueError: the file is not a mapping or a point is malformed (the message names
            the point and the field).
    """
    file = Path(path) if path is not None else DEFAULT_FILE
    raw = safeyaml.load(file.read_text(encoding="utf-8"))
    if not isinstance(raw, dict):
        raise ValueError(f"{file}: expected a mapping with 'sources' and 'points'")
    try:
        return Published.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        loc_t = tuple(first["loc"])
        loc = ".".join(str(x) for x in loc_t)
        if len(loc_t) > 1 and loc_t[0] == "points" and isinstance(loc_t[1], int):
            pid = raw["points"][loc_t[1]].get("id", "?")
            loc = f"{loc} (point {pid!r})"
        msg = str(first["msg"]).removeprefix("Value error, ")
        if not loc:
            raise ValueError(f"{file}: {msg}") from None
        raise ValueError(f"{file}: {loc}: {msg}") from None
