"""The ``throughput`` kind's keys: backends x factors, simulated or on real processes.

An experiment file of this kind (the default) looks like::

    name: p3_vs_ring
    mode: simulate                # simulate | real | both
    workloads: [resnet50, vgg19]  # profile names, or paths to profile YAML files
    workers: 4                    # every scalar may be a list: a sweep axis
    servers: colocated            # or a count of dedicated server hosts
    bandwidth_gbps: [1, 10, 25]
    latency_us: 5
    iterations: 3
    size_scale: 1.0               # gradient sizes x this (a scaled-down profile)
    oversubscription: 1           # > 1: racks of rack_size hosts share slower core links
    rack_size: 8                  #      (simulated only)
    backends:                     # a list of names, or name -> knobs
      kvstore: {}
      p3: {slice_params: [10000, 40000]}   # a knob list is an axis of that backend only
      byteps: {workers: [2, 4]}            # a common axis here overrides it for byteps
    zip:                          # axes in one group vary together instead of as a grid
      - [bandwidth_gbps, latency_us]
    repetitions: 1                # runs per point, in rounds over all points; the report
    report: {baseline: kvstore}   #   shows their median, or with aggregate: fastest their fastest

A backend knob may also be given at top level as ``p3.slice_params: [10000, 40000]``.
Every axis value and knob value is checked against :mod:`ddpbench.contract` when the file
is loaded, before any point runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict, Field, field_validator

from ddpbench import contract
from ddpbench.contract import COMMON_AXES
from ddpbench.experiments.schema import ENVELOPE, Frozen, YamlMap, YamlSeq, as_axis, err_at

__all__ = ["GanttOptions", "RealOptions", "ReportOptions", "ThroughputSpec", "check", "prepare"]

BUILTIN_WORKLOADS = ("resnet50", "vgg19", "seq2seq_lstm", "bert_base", "vgg16", "resnet101",
                     "inception_v3", "transformer_big", "bert_large", "gpt2_xl", "sockeye",
                     "llama_1b", "llama_7b", "llama_13b", "llama_70b", "llama3_8b", "llama3_70b", "vit_l", "mpt_7b",
                     "mpt_13b", "mpt_70b", "resnet152", "alexnet")


def _strict(kind: type) -> BeforeValidator:
    """Return a validator that refuses the scalars pydantic would convert into ``kind``: a
    bool or a number-like string for a number (YAML's ``true``, or ``1e9``, which YAML 1.1
    reads as text), anything but a bool for a bool. Other strings go on to pydantic, which
    names them (``'many'`` is not a valid integer), with the item's index in the location."""

    def check(value: Any) -> Any:
        try:
            contract.reject_loose(value, kind, "the value")
        except TypeError as err:
            if isinstance(value, str) and kind is not bool and "YAML reads" not in str(err):
                return value  # not a number at all (or 'colocated'): pydantic decides
            raise ValueError(str(err).removeprefix("the value ")) from None
        return value

    return BeforeValidator(check)


_STRICT_INT, _STRICT_FLOAT, _STRICT_BOOL = _strict(int), _strict(float), _strict(bool)


class RealOptions(Frozen):
    """How real-mode points run (``ddpbench.experiments.throughput.worker`` under ``ddpbench launch``).

    Attributes:
        compute: how a worker emulates a layer's compute time: ``sleep`` or ``spin``.
        timeout_s: a real point's job is killed after this many seconds and its row fails.
    """

    compute: Literal["sleep", "spin"] = "sleep"
    timeout_s: float = Field(300.0, gt=0)
    bind: Literal["none", "core"] = Field(
        "none", description="none: the OS places the ranks (as MPICH and Horovod do); core: "
        "each rank on one core, round robin (`ddpbench launch --bind core`), so that the "
        "scheduler cannot move a rank onto a core another rank of the job is using")


class GanttOptions(Frozen):
    """Which point's iteration the Gantt plot shows: params that select it, first match."""

    model_config = ConfigDict(frozen=True, extra="allow")


class ReportOptions(Frozen):
    """What the report shows.

    Attributes:
        plots: the plots to draw, by name; ``None`` = those that suit the sweep's axes.
        gantt: params that select the point whose iteration the Gantt plot shows (first
            match); a mapping or a list of them.
        title: the report's title; ``None`` = "Experiment NAME".
    """

    baseline: str | None = Field(None, description="backend that speedups are relative to")
    plots: tuple[
        Literal["throughput_vs_bandwidth", "speedup", "scaling", "gantt", "sim_vs_real"], ...
    ] | None = None
    gantt: tuple[dict[str, Any], ...] = ()
    title: str | None = None
    aggregate: Literal["median", "fastest", "quartile"] = Field(
        "median", description="one value per point from its repetitions: their median; the "
        "fastest (shortest iteration time): the run least disturbed by a shared machine; or "
        "quartile: the median of the real runs' lower quartiles of their timed iterations, "
        "the estimator `ddpbench calibrate` fits (simulated points keep their time)")

    @field_validator("gantt", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, dict) else value


class ThroughputSpec(Frozen):
    """The keys of a ``throughput`` experiment (the default kind).

    Every point-level scalar may be a list (a sweep axis); all axes are normalised to
    tuples. ``backends`` maps each backend to its knobs, each knob a scalar or a list.
    The point-level keys are the fields of :class:`ddpbench.contract.Cluster` and
    :class:`ddpbench.contract.Schedule` of the same names.

    Attributes:
        mode: ``simulate`` (every point in the simulator), ``real`` (on real processes under
            ``ddpbench launch``) or ``both`` (each point both ways, side by side).
        workloads: profile names (``ddpbench list workloads``) or paths to profile YAML
            files, relative to the experiment file.
        repetitions: runs per point, in rounds over all points; the report shows one value
            per point from them (``report.aggregate``).
        backends: backend names, or name -> knobs; a knob list is an axis of that backend
            only, and a common axis given here overrides it for that backend.
        zip: groups of axes that vary together instead of as a grid.
        real: how real-mode points run (:class:`RealOptions`).
        report: what the report shows (:class:`ReportOptions`).
    """

    mode: Literal["simulate", "real", "both"] = "simulate"
    workloads: tuple[str, ...]
    workers: tuple[Annotated[int, _STRICT_INT], ...] = ()
    hosts: tuple[Annotated[int, _STRICT_INT], ...] = ()
    gpus_per_host: tuple[Annotated[int, _STRICT_INT], ...] = (1,)
    servers: tuple[Annotated[int | Literal["colocated"], _STRICT_INT], ...] = ("colocated",)
    bandwidth_gbps: tuple[Annotated[float, _STRICT_FLOAT], ...] = (10.0,)
    latency_us: tuple[Annotated[float, _STRICT_FLOAT], ...] = (5.0,)
    iterations: tuple[Annotated[int, _STRICT_INT], ...] = (3,)
    warmup: tuple[Annotated[int, _STRICT_INT], ...] = (1,)
    compute_scale: tuple[Annotated[float, _STRICT_FLOAT], ...] = (1.0,)
    size_scale: tuple[Annotated[float, _STRICT_FLOAT], ...] = (1.0,)
    oversubscription: tuple[Annotated[float, _STRICT_FLOAT], ...] = (1.0,)
    rack_size: tuple[Annotated[int, _STRICT_INT], ...] = (8,)
    ecmp_paths: tuple[Annotated[int, _STRICT_INT], ...] = (1,)
    intra_link: tuple[str, ...] = ("pcie",)
    transport: tuple[str, ...] = ("ideal",)
    device: tuple[str | None, ...] = (None,)
    nccl_proto: tuple[str | None, ...] = (None,)
    nccl_algo: tuple[str | None, ...] = (None,)
    nccl_version: tuple[str | None, ...] = (None,)
    nccl_channels: tuple[Annotated[int | None, _STRICT_INT], ...] = (None,)
    nccl_socket_flows: tuple[Annotated[int | None, _STRICT_INT], ...] = (None,)
    nics_per_host: tuple[Annotated[int, _STRICT_INT], ...] = (1,)
    collnet: tuple[Annotated[bool, _STRICT_BOOL], ...] = (False,)
    overlap_slowdown: tuple[Annotated[float | None, _STRICT_FLOAT], ...] = (None,)
    server_sum_gbps: tuple[Annotated[float, _STRICT_FLOAT], ...] = (80.0,)
    server_update_gbps: tuple[Annotated[float | None, _STRICT_FLOAT], ...] = (None,)
    per_message_us: tuple[Annotated[float | None, _STRICT_FLOAT], ...] = (None,)
    socket_gbps: tuple[Annotated[float | None, _STRICT_FLOAT], ...] = (None,)
    page_fault_us: tuple[Annotated[float | None, _STRICT_FLOAT], ...] = (None,)
    switch_buffer_kb: tuple[Annotated[float | None, _STRICT_FLOAT], ...] = (None,)
    jitter: tuple[Annotated[float, _STRICT_FLOAT], ...] = (0.0,)
    stragglers: tuple[Annotated[int, _STRICT_INT], ...] = (0,)
    straggler_slowdown: tuple[Annotated[float, _STRICT_FLOAT], ...] = (2.0,)
    seed: tuple[Annotated[int, _STRICT_INT], ...] = (0,)
    batch_size: tuple[Annotated[int | None, _STRICT_INT], ...] = (None,)
    precision: tuple[str, ...] = ("fp32",)
    activation_checkpointing: tuple[contract.CheckpointingPolicy, ...] = (False,)
    grad_accumulation: tuple[Annotated[int, _STRICT_INT], ...] = (1,)
    machine: tuple[str | None, ...] = (None,)
    paced: tuple[Annotated[bool, _STRICT_BOOL], ...] = (False,)
    repetitions: int = Field(1, ge=1)
    backends: dict[str, dict[str, tuple[Any, ...]]]
    zip: tuple[tuple[str, ...], ...] = ()
    real: RealOptions = RealOptions()
    report: ReportOptions = ReportOptions()

    @field_validator("workloads", *COMMON_AXES[1:], mode="before")
    @classmethod
    def _axis(cls, value: Any, info: Any) -> Any:
        if info.field_name in ("workers", "hosts") and isinstance(value, (list, tuple)) \
                and not value:
            return ()  # not given: the other one (or the default) decides
        return as_axis(value, info.field_name)

    @field_validator(*COMMON_AXES[1:])
    @classmethod
    def _bounded(cls, value: tuple[Any, ...], info: Any) -> tuple[Any, ...]:
        # One set of bounds everywhere: the contract's Cluster and Schedule.
        return tuple(contract.check_axis(info.field_name, v) for v in value)

    @field_validator("backends", mode="before")
    @classmethod
    def _backends(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [value]
        if isinstance(value, (list, tuple)):
            value = {name: {} for name in value}
        if not isinstance(value, dict):
            raise ValueError("expected a list of backend names or a mapping name -> knobs")
        if not value:
            raise ValueError("empty sweep: no backends given")
        out = {}
        for name, knobs in value.items():
            knobs = {} if knobs is None else knobs
            if not isinstance(knobs, dict):
                raise ValueError(f"knobs of backend {name!r} must be a mapping, got {knobs!r}")
            out[name] = {k: as_axis(v, f"{name}.{k}") for k, v in knobs.items()}
        return out

    def axes_of(self, backend: str) -> dict[str, tuple[Any, ...]]:
        """Return the sweep axes of ``backend``: common axes, then its knobs (``b.knob``)."""
        axes: dict[str, tuple[Any, ...]] = {"workload": self.workloads}
        for axis in COMMON_AXES[1:]:
            axes[axis] = getattr(self, axis)
        # Workers or hosts (or both, zipped to agree); neither = the Cluster's 4 workers.
        if not axes["hosts"]:
            del axes["hosts"]
            axes["workers"] = axes["workers"] or (contract.Cluster.model_fields["workers"].default,)
        elif not axes["workers"]:
            del axes["workers"]
        for knob, values in self.backends[backend].items():
            # A common axis given under a backend overrides it for that backend only.
            common = "workload" if knob == "workloads" else knob
            if common in axes:
                axes[common] = values
            else:
                axes[f"{backend}.{knob}"] = values
        return axes


def _known_workloads() -> tuple[str, ...]:
    try:
        from ddpbench import simulator

        return tuple(getattr(simulator, "WORKLOADS", BUILTIN_WORKLOADS))
    except ImportError:
        return BUILTIN_WORKLOADS


def _from_cwd(path: Path) -> str:
    """Return a profile path (relative to the experiment file) as points load it: from the cwd.

    Relative when the file lies under the working directory (so point names stay short and
    the same on every machine that runs from the checkout's root), absolute otherwise.
    """
    full = path.resolve()
    try:
        return full.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(full)


def prepare(raw: YamlMap, file: Path | str) -> None:
    """Move top-level ``backend.knob: values`` keys into ``backends`` (line kept)."""
    dotted = [k for k in raw if isinstance(k, str) and "." in k and k not in ENVELOPE]
    if not dotted:
        return
    backends = raw.get("backends")
    if isinstance(backends, YamlSeq):
        converted = YamlMap({b: YamlMap() for b in backends})
        converted.line, converted.key_lines = backends.line, dict(
            zip(backends, backends.item_lines)
        )
        for v in converted.values():
            v.line, v.key_lines = converted.line, {}
        raw["backends"] = backends = converted
    for key in dotted:
        backend, knob = key.split(".", 1)
        if not isinstance(backends, dict) or backend not in backends:
            raise err_at(file, raw, [key], f"backend {backend!r} is not in 'backends'")
        knobs = backends[backend]
        if knobs is None:
            knobs = backends[backend] = YamlMap()
            knobs.line, knobs.key_lines = raw.key_lines[key], {}
        if knob in knobs:
            raise err_at(file, raw, [key], f"knob {knob!r} of {backend!r} is given twice")
        knobs[knob] = raw.pop(key)
        knobs.key_lines[knob] = raw.key_lines[key]


def check(spec: ThroughputSpec, raw: Any, file: Path | str) -> ThroughputSpec:
    """Check names against the known backends, knobs and workloads (with lines)."""
    base = Path(file).parent if file != "<string>" else Path.cwd()
    _check_backends(spec, raw, file)
    spec = _resolve_workloads(spec, raw, file, base)
    spec = _resolve_machines(spec, raw, file, base)
    _check_zip(spec, raw, file)
    if spec.report.baseline is not None and spec.report.baseline not in spec.backends:
        raise err_at(file, raw, ["report", "baseline"],
                     f"baseline {spec.report.baseline!r} is not one of the experiment's "
                     f"backends {sorted(spec.backends)}")
    return spec


def _check_backends(spec: ThroughputSpec, raw: Any, file: Path | str) -> None:
    """Check every backend's name, its knobs' names and every knob value against the contract."""
    for name, knobs in spec.backends.items():
        if name not in contract.BACKENDS:
            raise err_at(file, raw, ["backends", name],
                         f"unknown backend {name!r}; valid backends: {sorted(contract.BACKENDS)}")
        valid_knobs = contract.sweep_knobs(name)
        for knob, values in knobs.items():
            loc = ["backends", name, knob]
            if knob == "workloads":
                continue
            if knob not in COMMON_AXES and knob not in valid_knobs:
                raise err_at(file, raw, loc,
                             f"unknown knob {knob!r} of backend {name!r}; "
                             f"valid knobs: {sorted(valid_knobs)} (or a common axis to "
                             f"override for this backend: {list(COMMON_AXES)})")
            # Every value is checked now, against the contract, before any point runs.
            for value in values:
                try:
                    if knob in COMMON_AXES:
                        contract.check_axis(knob, value)
                    else:
                        contract.validate_knobs(name, {knob: value})
                except ValueError as err:
                    raise err_at(file, raw, loc, str(err)) from None


def _resolve_workloads(spec: ThroughputSpec, raw: Any, file: Path | str,
                       base: Path) -> ThroughputSpec:
    """Check each workload is built in or a profile file; make profile paths cwd-relative."""
    valid = _known_workloads()
    resolved = []
    for i, w in enumerate(spec.workloads):
        if w not in valid and not (w.endswith((".yaml", ".yml")) and (base / w).is_file()):
            raise err_at(file, raw, ["workloads", i] if isinstance(raw.get("workloads"), list)
                       else ["workloads"],
                       f"unknown workload {w!r}; valid workloads: {sorted(valid)} or a path "
                       f"to a profile .yaml file")
        resolved.append(w if w in valid else _from_cwd(base / w))
    if tuple(resolved) != spec.workloads:
        spec = spec.model_copy(update={"workloads": tuple(resolved)})
    return spec


def _resolve_machines(spec: ThroughputSpec, raw: Any, file: Path | str,
                      base: Path) -> ThroughputSpec:
    """Check each machine profile exists, covers the backends and matches the real runs'
    binding; make its path cwd-relative."""
    machines: list[str | None] = []
    for i, m in enumerate(spec.machine):
        if m is None:
            machines.append(m)
            continue
        where = ["machine", i] if isinstance(raw.get("machine"), list) else ["machine"]
        path = base / m
        _check_machine(spec, m, path, file, raw, where)
        machines.append(_from_cwd(path))
    if tuple(machines) != spec.machine:
        spec = spec.model_copy(update={"machine": tuple(machines)})
    return spec


def _check_machine(spec: ThroughputSpec, m: str, path: Path, file: Path | str, raw: Any,
                   where: list[Any]) -> None:
    """Raise an error at ``where`` unless the machine profile ``m`` at ``path`` fits ``spec``."""
    if not path.is_file():
        raise err_at(file, raw, where,
                     f"machine profile {m!r} not found (relative to the "
                     "experiment file); write one with `ddpbench calibrate -o PATH`")
    from ddpbench.calibration.machine import load_machine

    try:
        profile = load_machine(path)
    except ValueError as bad:
        raise err_at(file, raw, where, str(bad)) from None
    missing = [b for b in spec.backends if b not in profile.backends]
    if missing:
        raise err_at(file, raw, where,
                     f"machine profile {m!r} has no calibration "
                     f"for backend(s) {missing} (it has: {sorted(profile.backends)}); "
                     f"calibrate them: ddpbench calibrate --backends "
                     f"{','.join(spec.backends)} -o {m}")
    if spec.mode != "simulate" and profile.bind != spec.real.bind:
        # The simulated twin of a real point must describe the same placement of ranks.
        raise err_at(file, raw, where,
                     f"machine profile {m!r} was calibrated with "
                     f"bind: {profile.bind}, but this experiment's real runs use bind: "
                     f"{spec.real.bind}; calibrate with `ddpbench calibrate --bind "
                     f"{spec.real.bind} -o {m}` or set real: {{bind: {profile.bind}}}")


def _check_zip(spec: ThroughputSpec, raw: Any, file: Path | str) -> None:
    """Check each zip group pairs known axes, none in two groups, of equal lengths."""
    axis_names: set[str] = set(spec.axes_of(next(iter(spec.backends))))
    for name in spec.backends:
        axis_names |= set(spec.axes_of(name))
    axis_names |= {"workloads"}
    seen: set[str] = set()
    for g, group in enumerate(spec.zip):
        if len(group) < 2:
            raise err_at(file, raw, ["zip", g], "a zip group pairs two or more axes")
        lengths = {}
        for axis in group:
            key = "workload" if axis == "workloads" else axis
            if axis not in axis_names:
                raise err_at(file, raw, ["zip", g],
                             f"zip names unknown axis {axis!r}; valid axes: {sorted(axis_names)}")
            if key in seen:
                raise err_at(file, raw, ["zip", g], f"axis {axis!r} is in two zip groups")
            seen.add(key)
            for backend in spec.backends:
                axes = spec.axes_of(backend)
                if key in axes:
                    lengths[axis] = len(axes[key])
        if len(set(lengths.values())) > 1:
            raise err_at(file, raw, ["zip", g],
                         f"zipped axes must have equal lengths, got {lengths}")
