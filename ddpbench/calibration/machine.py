"""A machine profile: what ``ddpbench calibrate`` measured on one machine, and its fitted model.

The profile is plain YAML (``yaml.safe_dump`` of :meth:`Machine.to_dict`), read back with
``yaml.safe_load`` and checked field by field: a missing, negative or unknown field is an
error that names it. It speaks the simulator's vocabulary (:mod:`ddpbench.hardware`): a
transport (latency, bandwidth, per-message cost), the servers' summation rate and a compute
rule, so a measured profile and a published preset are the same kind of thing.

How a simulated point uses a profile (:func:`adjust`):

- compute: every non-zero forward or backward time ``t`` of the point's (scaled) profile
  becomes ``t x compute_rate + compute_overhead_us``: what the trainer's compute emulation
  (one ``time.sleep`` per layer and pass) takes on this machine;
- network: the backend's fitted ``per_message_us`` and ``bandwidth_gbps`` replace the
  transport's per-message cost and the line rate; ``latency_us`` is the MPI ping-pong
  latency. A paced point (``paced: true``, the parameter-server backends' token bucket)
  runs at the slower of its ``bandwidth_gbps`` and the backend's fitted rate, with its own
  ``latency_us`` added to the machine's;
- compute beside communication: the backend's ``compute_factor`` (fitted on the
  calibration workload's own run) multiplies the emulated compute times;
- servers sum at ``sum_gbps``;
- CPU contention: the fitted costs are software costs, paid on the CPU and in thread
  hand-offs; a point with P processes (workers plus servers) stretches them by
  ``step(P) / step(P_cal)``, the ratio of the ring step times at its and the calibration's
  process counts (``ring_step_us`` of the backend's style, blocking MPI calls for ``mpi``
  and ``horovod`` and polled requests for the others, smoothed by the law of
  :meth:`Machine.step_us`): per-message costs are multiplied by it, the bandwidth divided
  by it, and ``compute_factor - 1`` multiplied by it, except where the engines sit idle
  between their calls (the blocking style: ``mpi`` waits on a condition variable, ``horovod``
  sleeps until its next cycle): there ``compute_factor - 1`` is multiplied by the ratio of
  the hand-off times beside idle engines instead (``handoff_us``, the same law;
  :meth:`Machine.compute_contention`). The ring step keeps every engine busy, which a worker
  computing beside an idle engine does not see. The polled style's engines poll between
  messages as the ring step's do, so theirs keeps the ring step;
- per call: ``mpi`` and ``horovod`` make one native ``MPI_Allreduce`` per tensor (or fused
  buffer), whose steps run inside MPI; their fitted cost is a call's, which the ring step's
  ratio stretches as a whole (the ring step is one call too). The simulator charges a ring's
  software cost per step, 2(P-1) of them, so at W workers a step carries
  ``(W_cal - 1) / (W - 1)`` of the stretched per-step cost and a call costs the same
  whatever its step count (``ddpbench bench allreduce``, where every rank has a core,
  finds a call's cost over a bare ``MPI_Allreduce`` flat in the rank count). ``collective``'s ring is made in Python, a step at a time on
  its engine, so its cost stays per step.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

__all__ = ["LAUNCH_QUANTILE", "BackendFit", "Machine", "adjust", "contention_law",
           "launch_time", "load_machine", "parse_machine"]

KIND = "ddpbench-machine"

# Which of a launch's timed iterations stands for it: its lower quartile.
LAUNCH_QUANTILE = 0.25


def launch_time(samples: Sequence[float]) -> float:
    """Return the iteration time one launch stands for: the lower quartile of its timed
    iterations (the ``floor(n / 4)``-th smallest, counting from 0).

    A shared machine's slow phases (seconds long, everything slower) only ever add time,
    and they begin and end inside a workload's launches (1-4 s): a launch's median moves
    with the share of its iterations they catch, its lower quartile less.
    ``ddpbench calibrate`` fits each backend's compute factor to it, and a report with
    ``aggregate: quartile`` takes it for the real points, so that the two estimate the
    same thing.
    """
    if not samples:
        raise ValueError("launch_time: no iteration times")
    ordered = sorted(samples)
    return float(ordered[min(len(ordered) - 1, int(LAUNCH_QUANTILE * len(ordered)))])


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BackendFit(_Strict):
    """One backend's software costs, fitted through the simulator to its real runs.

    Attributes:
        per_message_us: CPU time per simulated message (a ring step, a push, a pull, a
            slice), microseconds, at the calibration's process count.
        bandwidth_gbps: the rate its bytes move at between two processes, Gbit/s.
        bandwidth_fitted: False when message costs alone take over 90% of the large
            workload's time (a backend that slices large arrays into many messages, as
            ``p3`` does): the fit cannot tell its bandwidth from infinite, so it is the
            ping-pong's bandwidth.
        bandwidth_shared: True when ``bandwidth_gbps`` is the one bandwidth fitted jointly
            to every parameter-server backend's large run (they move bytes through one
            transport, :mod:`ddpbench.backends.ps`); ``per_message_us`` is then solved
            against it.
        bytes_share: the share of the large run that its bytes take at this fit (the
            rest is message costs): how much the large run says about the bandwidth; its
            value at the backend's own fit is its weight in the shared fit.
        compute_factor: how much slower the trainer's compute emulation runs beside this
            backend's communication threads than alone (fitted on the workload's own run).
        workload_ms: measured iteration time of the calibration workload (with compute;
            the median of the launches' lower quartiles, :func:`launch_time`).
        workload_sim_ms: the fitted simulator's time for it.
        small_ms: measured iteration time of the many-small-tensors workload (median).
        large_ms: measured iteration time of the few-large-tensors workload (median).
        small_sim_ms: the fitted simulator's time for the small workload.
        large_sim_ms: the fitted simulator's time for the large workload.
    """

    per_message_us: float = Field(ge=0, allow_inf_nan=False)
    bandwidth_gbps: float = Field(gt=0, allow_inf_nan=False)
    bandwidth_fitted: bool = True
    bandwidth_shared: bool = False
    bytes_share: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    compute_factor: float = Field(1.0, gt=0, allow_inf_nan=False)
    workload_ms: float | None = Field(None, gt=0, allow_inf_nan=False)
    workload_sim_ms: float | None = Field(None, gt=0, allow_inf_nan=False)
    small_ms: float | None = Field(None, gt=0, allow_inf_nan=False)
    large_ms: float | None = Field(None, gt=0, allow_inf_nan=False)
    small_sim_ms: float | None = Field(None, gt=0, allow_inf_nan=False)
    large_sim_ms: float | None = Field(None, gt=0, allow_inf_nan=False)


class Machine(_Strict):
    """A calibrated machine (every field is documented in the README's calibration section).

    Attributes:
        kind: always ``ddpbench-machine``.
        host: the machine's name when it was measured.
        measured_at: UTC time of the measurement.
        cores: CPU cores available to the job.
        workers: worker processes of the calibration runs.
        servers: server processes of the parameter-server calibration runs.
        latency_us: MPI point-to-point latency (half a ping-pong round trip at 0 bytes).
        bandwidth_gbps: MPI point-to-point bandwidth (large messages), Gbit/s.
        copy_gbps: ``np.copyto`` of a 64 MiB float32 array, Gbit/s.
        sum_gbps: ``np.add`` of two 64 MiB float32 arrays into a third, Gbit/s of output.
        compute_rate: slope of the measured against the requested time of one compute call.
        compute_overhead_us: its intercept: what each call costs beyond the time asked.
        ring_step_us: step style ("blocking": one blocking MPI call, as ``mpi`` and
            ``horovod`` make their reductions; "polled": nonblocking requests the engine
            polls, as ``collective`` and the parameter-server backends do) -> process count
            -> median time of one 1 KiB ring step made through an engine thread
            (:mod:`ddpbench.calibration.ringstep`), microseconds.
        bind: how the calibration's ranks were placed on cores (``ddpbench launch --bind``):
            "core" (one core each, round robin) or "none" (the OS's choice; profiles written
            before it was recorded). A real run compared with this profile must use the same.
        handoff_us: process count -> mean time a 0.2 ms sleep and an empty call handed to an
            idle engine take beyond the sleep, all ranks alike (:mod:`.ringstep`),
            microseconds; None in profiles written before it was measured (then the
            blocking style's compute stretches by its ring step, as every style's did).
        backends: backend name -> :class:`BackendFit`.
        measurements: the raw figures the fits come from (data only).
    """

    kind: Literal["ddpbench-machine"]
    host: str
    measured_at: str
    cores: int = Field(ge=1, strict=True)
    workers: int = Field(ge=1, strict=True)
    servers: int = Field(ge=0, strict=True)
    latency_us: float = Field(ge=0, allow_inf_nan=False)
    bandwidth_gbps: float = Field(gt=0, allow_inf_nan=False)
    copy_gbps: float = Field(gt=0, allow_inf_nan=False)
    sum_gbps: float = Field(gt=0, allow_inf_nan=False)
    compute_rate: float = Field(gt=0, allow_inf_nan=False)
    compute_overhead_us: float = Field(ge=0, allow_inf_nan=False)
    ring_step_us: dict[Literal["blocking", "polled"], dict[int, float]]
    handoff_us: dict[int, float] | None = None
    bind: Literal["none", "core"] = "none"
    backends: dict[str, BackendFit]
    measurements: dict[str, Any] = Field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Return the profile as plain data (what ``ddpbench calibrate -o`` writes)."""
        return self.model_dump()

    def save(self, path: str | Path) -> None:
        """Write the profile as YAML to ``path``."""
        header = ("# Machine profile written by `ddpbench calibrate`; its fields: "
                  "docs/tutorials/calibrate.md.\n")
        Path(path).write_text(header + yaml.safe_dump(self.to_dict(), sort_keys=False))

    def fit(self, backend: str) -> BackendFit:
        """Return ``backend``'s fit, or raise naming the backends the profile has."""
        try:
            return self.backends[backend]
        except KeyError:
            raise ValueError(f"machine profile has no calibration for backend {backend!r} "
                             f"(it has: {sorted(self.backends)}); calibrate with "
                             f"`ddpbench calibrate --backends {backend}`") from None

    @field_validator("ring_step_us")
    @classmethod
    def _steps(cls, value: dict[str, dict[int, float]]) -> dict[str, dict[int, float]]:
        return {style: dict(sorted(_check_table(t, style).items())) for style, t in value.items()}

    @field_validator("handoff_us")
    @classmethod
    def _handoffs(cls, value: dict[int, float] | None) -> dict[int, float] | None:
        return None if value is None else dict(sorted(_check_table(value, "handoff").items()))

    def step_us(self, style: str, processes: int) -> float:
        """Return the ring step time of ``style`` at ``processes`` by the contention law.

        ``step(P) = s0 + k x (ceil(P / cores) - 1)``: flat while every process has a core
        (``s0``: the median of the measured counts up to ``cores``, else the smallest
        count's), then growing by ``k`` with each further process that every core has to
        share its time among, ``k >= 0`` fitted by least squares to the measured counts
        above ``cores``. Processes per core, not processes beyond the cores, because that
        is what a ring step waits for: each core's runnable processes take turns, so on 2
        cores 3 and 4 processes cost alike, where a line in ``P - cores`` would put 3
        processes halfway between 2 and 4.
        A law through the table, not the table itself: with more processes than cores
        each measured step time depends on how the scheduler happened to interleave them.
        """
        try:
            table = self.ring_step_us[style]  # type: ignore[index]
        except KeyError:
            raise ValueError(f"machine profile has no ring steps of style {style!r} (it has: "
                             f"{sorted(self.ring_step_us)})") from None
        return _law_at(table, self.cores, processes)

    def contention(self, style: str, processes: int, *, calibration_processes: int) -> float:
        """Return the factor on software costs at ``processes`` against the calibration's:
        the ratio of their ring step times of ``style`` (never below 1 for more processes)."""
        ratio = self.step_us(style, processes) / self.step_us(style, calibration_processes)
        return _bounded(ratio, processes, calibration_processes)

    def compute_contention(self, style: str, processes: int, *,
                           calibration_processes: int) -> float:
        """Return the factor on ``compute_factor - 1`` at ``processes`` against the
        calibration's: for the blocking style the ratio of the hand-off times beside idle
        engines (``handoff_us``, by the law of :meth:`step_us`), else :meth:`contention`."""
        if style != "blocking" or self.handoff_us is None:
            return self.contention(style, processes, calibration_processes=calibration_processes)
        ratio = (_law_at(self.handoff_us, self.cores, processes)
                 / _law_at(self.handoff_us, self.cores, calibration_processes))
        return _bounded(ratio, processes, calibration_processes)


def _bounded(ratio: float, processes: int, calibration_processes: int) -> float:
    """Never below 1 for more processes than the calibration's, never above for fewer."""
    return max(1.0, ratio) if processes >= calibration_processes else min(1.0, ratio)


def _check_table(table: dict[int, float], name: str) -> dict[int, float]:
    if not table:
        raise ValueError(f"{name}: expected process counts mapped to times, got none")
    for k, v in table.items():
        if k < 2 or not (v > 0 and math.isfinite(v)):
            raise ValueError(f"{name}: expected process counts >= 2 mapped to "
                             f"times > 0, got {k}: {v}")
    return table


def _law_at(table: dict[int, float], cores: int, processes: int) -> float:
    """Return the law through ``table`` (:func:`contention_law`) at ``processes``."""
    s0, k = contention_law(table, cores)
    return s0 + k * _sharers(processes, cores)


def _sharers(processes: int, cores: int) -> int:
    """Return how many more processes than one each core runs: ``ceil(P / cores) - 1``."""
    return max(0, -(-processes // cores) - 1)


def contention_law(table: dict[int, float], cores: int) -> tuple[float, float]:
    """Return ``(s0, k)`` of :meth:`Machine.step_us` for a measured table (one style's ring
    steps, or the hand-offs)."""
    within = [v for p, v in table.items() if p <= cores] or [table[min(table)]]
    s0 = statistics.median(within)
    over = [(_sharers(p, cores), v - s0) for p, v in table.items() if p > cores]
    den = sum(x * x for x, _ in over)
    k = max(0.0, sum(x * y for x, y in over) / den) if den else 0.0
    return s0, k


def _message(err: ValidationError, source: str) -> str:
    e = err.errors(include_url=False)[0]
    field = ".".join(str(p) for p in e["loc"]) or "(top level)"
    kind = e["type"]
    if kind == "missing":
        return f"{source}: missing field {field!r}"
    if kind == "extra_forbidden":
        return f"{source}: unknown field {field!r}"
    return f"{source}: field {field!r}: {e['msg']}, got {e.get('input')!r}"


def parse_machine(data: Any, source: str = "machine profile") -> Machine:
    """Return the :class:`Machine` in ``data`` (a mapping), naming the first bad field."""
    if not isinstance(data, dict):
        raise ValueError(f"{source}: expected a mapping of fields, got {type(data).__name__}")
    if data.get("kind") != KIND:
        raise ValueError(f"{source}: field 'kind' must be {KIND!r}, got {data.get('kind')!r}"
                         if "kind" in data else f"{source}: missing field 'kind'")
    try:
        machine = Machine.model_validate(data)
    except ValidationError as err:
        raise ValueError(_message(err, source)) from None
    from ddpbench import contract

    unknown = sorted(set(machine.backends) - set(contract.BACKENDS))
    if unknown:
        raise ValueError(f"{source}: field 'backends': unknown backend(s) {unknown}; "
                         f"valid backends: {sorted(contract.BACKENDS)}")
    return machine


_CACHE: dict[tuple[str, int, int], Machine] = {}


def load_machine(path: str | Path | Machine) -> Machine:
    """Return the machine profile at ``path`` (YAML, loaded safely), or ``path`` itself.

    Raises:
        ValueError: an unreadable file, bad YAML, or a bad field (named).
    """
    if isinstance(path, Machine):
        return path
    p = Path(path)
    try:
        st = p.stat()
        key = (str(p.resolve()), st.st_mtime_ns, st.st_size)
    except OSError as err:
        raise ValueError(f"machine: cannot read machine profile {str(p)!r}: "
                         f"{err.strerror}") from None
    if key not in _CACHE:
        try:
            data = yaml.safe_load(p.read_text())
        except yaml.YAMLError as err:
            raise ValueError(f"machine: {p} is not valid YAML: {err}") from None
        _CACHE[key] = parse_machine(data, f"machine profile {p}")
    return _CACHE[key]


def step_style(backend: str) -> str:
    """Return how ``backend``'s engine makes its messages: "blocking" or "polled"."""
    return "blocking" if backend in ("mpi", "horovod") else "polled"


def calibration_processes(machine: Machine, uses_servers: bool) -> int:
    """Return the processes the calibration ran for a backend with or without servers."""
    return machine.workers + (machine.servers if uses_servers else 0)


def adjust(machine: Machine, backend: str, *, workers: int, servers: int, paced: bool,
           bandwidth_gbps: float, latency_us: float) -> dict[str, Any]:
    """Return the simulator settings of a point on ``machine`` (the rules in the module doc).

    Args:
        machine: the profile.
        backend: the point's backend (its fit must be in the profile).
        workers: the point's worker processes.
        servers: its server processes (0 for the allreduce backends).
        paced: whether the point's real run paces its messages.
        bandwidth_gbps: the point's bandwidth (the pacing rate when paced).
        latency_us: the point's latency (added to the machine's when paced).

    Returns:
        ``bandwidth_gbps``, ``latency_us``, ``per_message_us``, ``sum_gbps``,
        ``compute_rate`` and ``compute_overhead_s`` for the simulator.
    """
    from ddpbench import contract

    fit = machine.fit(backend)
    uses_servers = contract.backend(backend).uses_servers
    style, cal = step_style(backend), calibration_processes(machine, uses_servers)
    factor = machine.contention(style, workers + servers, calibration_processes=cal)
    compute = machine.compute_contention(style, workers + servers, calibration_processes=cal)
    bw = fit.bandwidth_gbps / factor
    own = fit.per_message_us
    if style == "blocking" and workers > 1 and machine.workers > 1:
        # mpi and horovod make one native MPI call per tensor (or fused buffer): their
        # software cost is the call's, whose own steps are MPI's; the simulator spreads
        # it over the ring's 2(P-1) steps, so a step carries the calibration's share.
        own *= (machine.workers - 1) / (workers - 1)
    per_message = own * factor
    lat = machine.latency_us
    if paced:
        bw = min(bw, bandwidth_gbps)
        lat += latency_us
    # compute_factor - 1 is the compute's excess beside this backend's threads, which
    # contention stretches. A factor below 1 (a fit at the bottom of its range: the model
    # over-predicts the workload run's communication) is no excess: kept as fitted, never
    # stretched (stretched, it would turn compute times negative).
    excess = fit.compute_factor - 1.0
    slow = 1.0 + excess * (compute if excess > 0 else 1.0)
    return {"bandwidth_gbps": bw, "latency_us": lat,
            "per_message_us": per_message,
            "sum_gbps": machine.sum_gbps, "compute_rate": machine.compute_rate * slow,
            "compute_overhead_s": machine.compute_overhead_us * 1e-6 * slow}
