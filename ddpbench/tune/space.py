"""The search space of ``ddpbench tune``: the contract's tunable knobs for a cluster.

Every parameter comes from :func:`ddpbench.contract.tunable` (a knob's range, scale and the
source of its range), so the space is declared once, beside the knob's bounds. The cluster
prunes it: a knob that cannot change a result on that cluster is dropped and the reason kept
(Horovod's hierarchical allreduce needs several hosts of several GPUs; BytePS on one worker
machine never pushes, so its partitioning and scheduling do nothing, unless
``force_distributed``). Parameter-server backends get the servers' placement as a parameter
when the cluster has dedicated server hosts: colocated, or 1 up to that many of them.
Horovod's ``gradient_predivide_factor`` runs from 1 to the world size and is searched under
fp16 compression (or mixed, fp16, bf16 or fp8 precision, where ``compression`` is not
searched: gradients are 16-bit already); it changes no time, only what the answer's numerics verdict judges.

``--fix`` and ``--range`` narrow the space; both are checked here, before any trial, against
the contract (:func:`ddpbench.contract.validate_knobs`): an unknown knob lists the valid
ones, a range outside a knob's bounds names them.

Example:
    >>> from ddpbench import contract
    >>> from ddpbench.tune.space import build_space
    >>> s = build_space(["horovod"], contract.Cluster(hosts=4, gpus_per_host=1))
    >>> [p.name for p in s.params]  # doctest: +NORMALIZE_WHITESPACE
    ['horovod.fusion_threshold', 'horovod.cycle_time', 'horovod.compression',
     'horovod.gradient_predivide_factor']
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ddpbench import contract, hardware
from ddpbench.contract import parse_value

__all__ = ["Param", "Space", "build_space", "fmt_value", "parse_assignments", "parse_value"]


@dataclass(frozen=True)
class Param:
    """One searched knob of one backend, named ``<backend>.<knob>`` in the study."""

    backend: str
    knob: str
    kind: str
    """``int``, ``float``, ``bool`` or ``categorical``."""
    scale: str
    """``log``, ``linear`` or ``categorical``."""
    default: Any
    source: str
    low: float | None = None
    high: float | None = None
    choices: tuple[Any, ...] = ()
    when: Mapping[str, Any] = field(default_factory=dict)
    """Other knobs' values (of the same backend) under which this one is searched."""
    unit: str = ""
    original: tuple[Any, ...] = ()
    """The values the original system offers, where the others are ddpbench's own."""

    def is_own(self, value: Any) -> bool:
        """Return whether ``value`` is ddpbench's own mechanism rather than the original's."""
        return bool(self.original) and value not in self.original

    @property
    def name(self) -> str:
        """Return the study's name of the parameter: ``<backend>.<knob>``."""
        return f"{self.backend}.{self.knob}"

    def active(self, knobs: Mapping[str, Any]) -> bool:
        """Return whether this parameter is searched given the backend's other knobs."""
        return all(knobs.get(k) == v for k, v in self.when.items())

    def suggest(self, trial: Any) -> Any:
        """Return this parameter's value for an optuna trial (ask/tell or objective)."""
        if self.kind in ("bool", "categorical"):
            return trial.suggest_categorical(self.name, list(self.choices))
        log = self.scale == "log"
        if self.kind == "int":
            return trial.suggest_int(self.name, int(self.low or 0), int(self.high or 0), log=log)
        return trial.suggest_float(self.name, float(self.low or 0), float(self.high or 0),
                                   log=log)

    def range_text(self) -> str:
        """Return the range for tables: ``[low, high]`` or the choices."""
        if self.kind in ("bool", "categorical"):
            return "{" + ", ".join(fmt_value(c) for c in self.choices) + "}"
        return f"[{fmt_value(self.low)}, {fmt_value(self.high)}]"

    def to_dict(self) -> dict[str, Any]:
        """Return the parameter as tune.json records it."""
        out: dict[str, Any] = {"backend": self.backend, "knob": self.knob, "kind": self.kind,
                               "scale": self.scale, "log": self.scale == "log",
                               "default": self.default, "source": self.source,
                               "unit": self.unit}
        if self.kind in ("bool", "categorical"):
            out["choices"] = list(self.choices)
        else:
            out["low"], out["high"] = self.low, self.high
        if self.when:
            out["when"] = dict(self.when)
        if self.original:
            out["original"] = list(self.original)
        return out


def fmt_value(value: Any) -> str:
    """Return a knob's value for tables: ``true``, ``40,000``, ``1.5``, ``window``."""
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and abs(value) >= 10_000:
        return f"{value:,}"
    return f"{value:g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Space:
    """The searched parameters of the chosen backends, and what is held fixed."""

    backends: tuple[str, ...]
    params: tuple[Param, ...]
    fixed: Mapping[str, Mapping[str, Any]]
    """backend -> knob -> value, from ``--fix`` (applies to every trial of that backend)."""
    dropped: tuple[tuple[str, str, str], ...] = ()
    """(backend, knob, why) of the tunable knobs left out: irrelevant on the cluster, or
    ddpbench's own with ``originals_only``, or conditional on a value no longer searched."""

    def of(self, backend: str) -> list[Param]:
        """Return the parameters of ``backend``, in the contract's order."""
        return [p for p in self.params if p.backend == backend]

    @property
    def empty(self) -> bool:
        """Return whether nothing is searched beyond each backend's default."""
        return not self.params

    def default_params(self, backend: str) -> dict[str, Any]:
        """Return the study parameters of ``backend``'s default configuration."""
        knobs = self._defaults(backend)
        out: dict[str, Any] = {"backend": backend}
        for p in self.of(backend):
            if p.active(knobs):
                out[p.name] = knobs[p.knob]
        return out

    def _defaults(self, backend: str) -> dict[str, Any]:
        knobs: dict[str, Any] = {**contract.defaults(backend), **self.fixed.get(backend, {})}
        for p in self.of(backend):
            knobs.setdefault(p.knob, p.default)
        return knobs

    def suggest(self, trial: Any) -> tuple[str, dict[str, Any]]:
        """Return ``(backend, knobs)`` for an optuna trial: the backend, then its knobs.

        A conditional knob is suggested only when the knobs it depends on (declared before
        it in the contract) hold its ``when`` values.
        """
        backend = str(trial.suggest_categorical("backend", list(self.backends)))
        knobs = self._defaults(backend)
        tuned: dict[str, Any] = {}
        for p in self.of(backend):
            if p.active(knobs):
                knobs[p.knob] = tuned[p.knob] = p.suggest(trial)
        return backend, {**self.fixed.get(backend, {}), **tuned}

    def knobs_of(self, params: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        """Return ``(backend, knobs)`` of a finished trial's parameters (fixed ones added)."""
        backend = str(params["backend"])
        tuned = {p.knob: params[p.name] for p in self.of(backend) if p.name in params}
        return backend, {**self.fixed.get(backend, {}), **tuned}

    def own(self, backend: str, knobs: Mapping[str, Any]) -> list[str]:
        """Return ``knob=value`` of the knobs set to ddpbench's own mechanisms."""
        return [f"{p.knob}={fmt_value(knobs[p.knob])}" for p in self.of(backend)
                if p.knob in knobs and p.is_own(knobs[p.knob])]

    def to_dict(self) -> dict[str, Any]:
        """Return the space as tune.json records it: ``<backend>.<knob>`` -> its range."""
        return {p.name: p.to_dict() for p in self.params}

    def describe(self) -> str:
        """Return the space as a table, one backend after another (``tune --space``)."""
        lines = []
        w = max([18, *(len(p.knob) + 2 for p in self.params),
                 *(len(k) + 2 for _, k, _ in self.dropped)])
        for b in self.backends:
            lines.append(f"{b}:")
            params = self.of(b)
            for p in params:
                when = (" when " + ", ".join(f"{k}={fmt_value(v)}" for k, v in p.when.items())
                        if p.when else "")
                unit = f" {p.unit}" if p.unit else ""
                lines.append(f"  {p.knob:<{w}}{p.kind:<12}{p.range_text() + unit:<36} "
                             f"{p.scale:<12}default {fmt_value(p.default)}{when}")
                lines.append(f"  {'':<{w}}range from: {p.source}")
            for knob, value in self.fixed.get(b, {}).items():
                lines.append(f"  {knob:<{w}}fixed at {fmt_value(value)} (--fix)")
            for backend, knob, why in self.dropped:
                if backend == b:
                    lines.append(f"  {knob:<{w}}not searched: {why}")
            if not params:
                lines.append("  (nothing to search: its default configuration only)")
        return "\n".join(lines)


def parse_assignments(items: Iterable[str], option: str) -> list[tuple[str | None, str, str]]:
    """Return ``(backend or None, knob, value text)`` of ``--fix``/``--range`` items.

    Raises:
        ValueError: an item without ``=`` or a name, or an unknown backend prefix.
    """
    out = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise ValueError(f"{option} expects KNOB=VALUE or BACKEND.KNOB=VALUE, got {item!r}")
        backend, dot, knob = name.strip().rpartition(".")
        if dot and backend not in contract.BACKENDS:
            raise ValueError(f"{option} {item!r}: unknown backend {backend!r}; available: "
                             f"{sorted(contract.BACKENDS)}")
        out.append((backend or None, knob, value.strip()))
    return out


def _half(schedule: contract.Schedule) -> bool:
    """Return whether the schedule's gradients are 16-bit already (mixed, fp16, bf16, fp8)."""
    return schedule.precision == "mixed" or hardware.gradient_bytes(schedule.precision) == 2


def _drop_reason(backend: str, knob: str, cluster: contract.Cluster,
                 fixed: Mapping[str, Any], schedule: contract.Schedule) -> str | None:
    """Return why ``knob`` cannot change a result on ``cluster``, or None."""
    if knob == "compression" and _half(schedule):
        return (f"gradients are 16-bit already under {schedule.precision} precision: the fp16 "
                "cast changes nothing")
    if knob == "gradient_predivide_factor" and cluster.workers < 2:
        return "one worker sums nothing"
    if backend == "horovod" and knob == "hierarchical" and (
            cluster.gpus_per_host == 1 or cluster.num_hosts == 1):
        return (f"needs several hosts of several GPUs (the cluster has {cluster.num_hosts} "
                f"x {cluster.gpus_per_host})")
    if knob == "local_reduce" and cluster.gpus_per_host == 1:
        return "one GPU per host has nothing to reduce on the host"
    if knob == "local_reduce" and fixed.get("system") == "tensorflow":
        return "TensorFlow's parameter servers have no MXNet worker"
    if backend == "byteps" and cluster.num_hosts == 1 and not fixed.get("force_distributed"):
        return ("one worker machine is not a distributed job: BytePS reduces on the host and "
                "never pushes (byteps/common/global.cc)")
    return None


def _fitted(param: Param, cluster: contract.Cluster, schedule: contract.Schedule) -> Param:
    """Return ``param`` fitted to the cluster: the predivide factor runs from 1 (all the
    averaging after the sum) to the world size (all of it before), and under mixed
    precision, where every sum is float16, it is searched whatever the compression."""
    if param.knob != "gradient_predivide_factor":
        return param
    when = {k: v for k, v in param.when.items()
            if not (k == "compression" and _half(schedule))}
    return replace(param, high=min(float(param.high or 1.0), float(cluster.workers)),
                   when=when)


def _servers_param(backend: str, cluster: contract.Cluster) -> Param | None:
    """Return the servers' placement as a parameter where the cluster has server hosts."""
    count = cluster.dedicated_servers()
    if not contract.backend(backend).uses_servers or count < 1:
        return None
    choices: list[Any] = ["colocated"]
    n = 1
    while n < count:
        choices.append(n)
        n *= 2
    choices.append(count)
    return Param(backend, "servers", "categorical", "categorical", count,
                 f"the cluster's {count} dedicated server host(s): colocated, or 1 up to "
                 f"{count} of them (powers of two)", choices=tuple(choices))


def build_space(backends: Sequence[str], cluster: contract.Cluster, *,
                fix: Iterable[str] = (), ranges: Iterable[str] = (),
                originals_only: bool = False,
                schedule: contract.Schedule | None = None) -> Space:
    """Return the space of ``backends`` on ``cluster``, narrowed by ``--fix`` and ``--range``.

    Args:
        backends: backend names (each in :data:`ddpbench.contract.BACKENDS`).
        cluster: the cluster every trial runs on.
        fix: ``KNOB=VALUE`` (every chosen backend that has the knob) or
            ``BACKEND.KNOB=VALUE`` items.
        ranges: ``KNOB=LOW:HIGH`` (a number's range) or ``KNOB=A,B`` (a choice's subset)
            items, with the same optional ``BACKEND.`` prefix.
        originals_only: keep to the values the original systems offer (no scheduler
            ``window``, no P3 ``water_mark``: ddpbench's own mechanisms).
        schedule: the trials' schedule (None: the contract's default, fp32): under mixed
            precision gradients are float16 already, so ``compression`` is not searched.

    Raises:
        ValueError: no backend or an unknown one, an unknown knob (the valid ones listed),
            a value or range outside a knob's bounds (naming them), an empty range.
    """
    if not backends:
        raise ValueError("--backends is empty: name at least one of "
                         f"{list(contract.BACKENDS)}")
    for b in backends:
        contract.backend(b)
    if len(set(backends)) != len(backends):
        raise ValueError(f"--backends names a backend twice: {list(backends)}")
    fixed = _fixed(backends, fix)
    schedule = schedule or contract.Schedule()
    params, dropped = [], []
    for b in backends:
        for knob, spec in contract.tunable(b).items():
            if knob in fixed[b]:
                continue
            why = _drop_reason(b, knob, cluster, fixed[b], schedule)
            if why:
                dropped.append((b, knob, why))
                continue
            param = _fitted(Param(b, knob, spec["kind"], spec["scale"], spec["default"],
                                  spec["source"], spec.get("low"), spec.get("high"),
                                  tuple(spec.get("choices", ())), dict(spec["when"]),
                                  spec["unit"], tuple(spec.get("original", ()))),
                            cluster, schedule)
            if originals_only and param.original:
                if param.kind not in ("bool", "categorical"):
                    dropped.append((b, knob, "its other values are ddpbench's own "
                                             "(--originals-only)"))
                    continue
                param = replace(param, choices=tuple(c for c in param.choices
                                                     if c in param.original))
            params.append(param)
        servers = _servers_param(b, cluster)
        if servers is not None and "servers" not in fixed[b]:
            params.append(servers)
    space = Space(tuple(backends), tuple(params), fixed, tuple(dropped))
    return _without_dead_conditions(_narrow(space, ranges))


def _without_dead_conditions(space: Space) -> Space:
    """Drop conditional parameters whose condition no longer can hold (its value was
    narrowed away, e.g. credit_bytes once the scheduler cannot be ``window``)."""
    params, dropped = [], list(space.dropped)
    for p in space.params:
        dead = [f"{k}={fmt_value(v)}" for k, v in p.when.items()
                if any(q.backend == p.backend and q.knob == k and v not in q.choices
                       for q in space.params)
                or space.fixed.get(p.backend, {}).get(k, v) != v]
        if dead:
            dropped.append((p.backend, p.knob, f"only searched when {', '.join(dead)}"))
        else:
            params.append(p)
    return replace(space, params=tuple(params), dropped=tuple(dropped))


def _fixed(backends: Sequence[str], fix: Iterable[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {b: {} for b in backends}
    for backend, knob, text in parse_assignments(fix, "--fix"):
        value = parse_value(text)
        targets = _targets(backends, backend, knob, "--fix", servers_ok=True)
        for b in targets:
            if knob == "servers":
                value = _servers_value(value)
            else:
                contract.validate_knobs(b, {**out[b], knob: value}, side="sim")
            out[b][knob] = value
    return out


def _servers_value(value: Any) -> Any:
    if value == "colocated" or (isinstance(value, int) and not isinstance(value, bool)
                                and value >= 1):
        return value
    raise ValueError(f"--fix servers must be 'colocated' or a count >= 1, got {value!r}")


def _targets(backends: Sequence[str], backend: str | None, knob: str, option: str, *,
             servers_ok: bool = False) -> list[str]:
    """Return the chosen backends a ``--fix``/``--range`` item applies to."""
    if backend is not None and backend not in backends:
        raise ValueError(f"{option} {backend}.{knob}: backend {backend!r} is not searched; "
                         f"--backends {','.join(backends)}")
    names = [backend] if backend else list(backends)

    def has(b: str) -> bool:
        if knob == "servers":
            return servers_ok and contract.backend(b).uses_servers
        return knob in contract.sweep_knobs(b, "sim")

    found = [b for b in names if has(b)]
    real = [b for b in names if knob in contract.sweep_knobs(b, "real")]
    if not found and real:
        raise ValueError(f"{option}: knob {knob!r} of {real} only applies to real runs; "
                         "tune simulates")
    if not found:
        valid = {b: contract.sweep_knobs(b, "sim") + (["servers"] if servers_ok and contract.
                                                       backend(b).uses_servers else [])
                 for b in names}
        where = f"backend {backend!r}" if backend else f"the backends {list(names)}"
        raise ValueError(f"{option}: unknown knob {knob!r} for {where}; valid knobs: {valid}")
    return found


def _narrow(space: Space, ranges: Iterable[str]) -> Space:
    params = list(space.params)
    for backend, knob, text in parse_assignments(ranges, "--range"):
        _targets(space.backends, backend, knob, "--range", servers_ok=True)
        hits = [i for i, p in enumerate(params) if p.knob == knob
                and (backend is None or p.backend == backend)]
        if not hits:
            why = [w for b, k, w in space.dropped if k == knob]
            fixed = [b for b, f in space.fixed.items() if knob in f]
            reason = (f"it is not searched here ({why[0]})" if why else
                      f"it is fixed by --fix for {fixed}" if fixed else
                      "it is not a tunable knob (see ddpbench tune --space)")
            raise ValueError(f"--range {knob}={text}: {reason}")
        for i in hits:
            params[i] = _narrowed(params[i], text)
    return replace(space, params=tuple(params))


def _narrowed(p: Param, text: str) -> Param:
    """Return ``p`` with its range set from ``LOW:HIGH`` or its choices from ``A,B``."""
    option = f"--range {p.name}={text}"
    if p.kind in ("bool", "categorical"):
        wanted = [parse_value(t.strip()) for t in text.split(",") if t.strip()]
        bad = [w for w in wanted if w not in p.choices]
        if bad or not wanted:
            raise ValueError(f"{option}: choices must come from "
                             f"{list(p.choices)}, got {bad or wanted}")
        return replace(p, choices=tuple(c for c in p.choices if c in wanted))
    low_text, sep, high_text = text.partition(":")
    if not sep:
        raise ValueError(f"{option}: expected LOW:HIGH")
    low, high = parse_value(low_text.strip()), parse_value(high_text.strip())
    for v in (low, high):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{option}: LOW and HIGH must be finite numbers, got {v!r}")
    if p.kind == "int" and not (float(low).is_integer() and float(high).is_integer()):
        raise ValueError(f"{option}: knob {p.knob!r} takes integers")
    if not low < high:
        raise ValueError(f"{option}: the range is empty (LOW must be below HIGH); to hold "
                         f"the knob at one value use --fix {p.name}={low_text.strip()}")
    for v in (low, high):
        try:
            contract.validate_knobs(p.backend, {p.knob: int(v) if p.kind == "int" else v},
                                    side="sim")
        except ValueError as err:
            raise ValueError(f"{option}: outside the knob's bounds: {err}") from None
    if p.scale == "log" and low <= 0:
        raise ValueError(f"{option}: {p.knob} is searched on a log scale, so LOW must be > 0")
    return replace(p, low=int(low) if p.kind == "int" else float(low),
                   high=int(high) if p.kind == "int" else float(high))
