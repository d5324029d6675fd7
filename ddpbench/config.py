"""Experiment files: YAML with line numbers, validated into frozen models.

An experiment file is a mapping with an envelope read by the runner (``name``, ``kind``,
``description``) and the keys of its kind, validated by the kind's ``Spec`` (see
:mod:`ddpbench.runner`). The ``throughput`` kind (the default) looks like::

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
    report: {baseline: kvstore}

A backend knob may also be given at top level as ``p3.slice_params: [10000, 40000]``.
Every error names the file, the line and the field; malformed YAML never gives a traceback.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ddpbench.simulator.strategies import STRATEGIES

__all__ = [
    "BACKEND_KNOBS",
    "COMMON_AXES",
    "Experiment",
    "ExperimentError",
    "GanttOptions",
    "RealOptions",
    "ReportOptions",
    "ThroughputSpec",
    "load_experiment",
    "parse_experiment",
]

# Knob names and defaults of CONTRACTS.md section 1: the simulator's table is the one
# source (its strategies mirror the real backends one to one).
BACKEND_KNOBS: dict[str, dict[str, Any]] = STRATEGIES
# What each numeric axis accepts, and how its error says so.
_AXIS_BOUNDS: dict[str, tuple[Any, str]] = {
    "workers": (lambda v: v >= 1, ">= 1"),
    "bandwidth_gbps": (lambda v: v > 0 and math.isfinite(v), "a finite number > 0"),
    "compute_scale": (lambda v: v > 0 and math.isfinite(v), "a finite number > 0"),
    "size_scale": (lambda v: 0 < v <= 1, "in (0, 1] (gradient sizes x this)"),
    "oversubscription": (lambda v: v >= 1 and math.isfinite(v),
                         "a finite number >= 1 (1 = a non-blocking switch)"),
    "rack_size": (lambda v: v >= 1, ">= 1"),
    "latency_us": (lambda v: v >= 0 and math.isfinite(v), "a finite number >= 0"),
    "iterations": (lambda v: v >= 1, ">= 1"),
    "warmup": (lambda v: v >= 0, ">= 0"),
}

BUILTIN_WORKLOADS = ("resnet50", "vgg19", "seq2seq_lstm", "bert_base")
PS_BACKENDS = frozenset({"kvstore", "p3", "byteps"})

# Point-level axes shared by every backend, in the order they appear in tables.
COMMON_AXES = (
    "workload", "workers", "servers", "bandwidth_gbps", "latency_us", "iterations",
    "warmup", "compute_scale", "size_scale", "oversubscription", "rack_size",
)
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class ExperimentError(ValueError):
    """A malformed experiment file: the message names the file, the line and the field."""

    def __init__(self, file: str | Path, line: int | None, field: str | None, message: str):
        self.file, self.line, self.field = str(file), line, field
        where = f"{file}:{line}" if line else str(file)
        what = f"field '{field}': " if field else ""
        super().__init__(f"{where}: {what}{message}")


# -- YAML with line numbers -------------------------------------------------------------------
class _Map(dict):
    """A mapping from YAML that remembers the line of itself and of each key (1-based)."""

    line: int = 0
    key_lines: dict[Any, int]


class _Seq(list):
    """A sequence from YAML that remembers its line and each item's line."""

    line: int = 0
    item_lines: list[int]


class _LineLoader(yaml.SafeLoader):
    """SafeLoader that records node marks: user files are data, never code."""


def _construct_map(loader: _LineLoader, node: yaml.MappingNode) -> _Map:
    loader.flatten_mapping(node)
    out = _Map()
    out.line = node.start_mark.line + 1
    out.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, "a mapping key must be a scalar", key_node.start_mark
            ) from None
        if key in out:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        out[key] = loader.construct_object(value_node, deep=True)
        out.key_lines[key] = key_node.start_mark.line + 1
    return out


def _construct_seq(loader: _LineLoader, node: yaml.SequenceNode) -> _Seq:
    out = _Seq(loader.construct_object(child, deep=True) for child in node.value)
    out.line = node.start_mark.line + 1
    out.item_lines = [child.start_mark.line + 1 for child in node.value]
    return out


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_map)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_seq)


def load_yaml(text: str, file: str | Path = "<string>") -> Any:
    """Parse ``text`` safely, keeping line numbers; a syntax error names its line.

    Raises:
        ExperimentError: the text is not valid YAML.
    """
    try:
        return yaml.load(text, Loader=_LineLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark else None
        problem = str(err.problem or "malformed YAML")
        start = err.context_mark.line + 1 if err.context_mark else line
        if err.context and err.context_mark and start != line:
            problem += f" ({err.context} that starts on line {start})"
        elif err.context:
            problem = f"{err.context}: {problem}"
        # Inside a flow collection the key is where the collection starts; otherwise the
        # key on the problem's line (or the top-level key above it) is the culprit.
        key_line = start if err.context and "flow" in err.context else line
        raise ExperimentError(file, line, _key_before(text, key_line),
                              f"YAML syntax error: {problem}") from None
    except yaml.YAMLError as err:
        raise ExperimentError(file, None, None, f"YAML error: {err}") from None


def _key_before(text: str, line: int | None) -> str | None:
    """Return the top-level key whose value holds ``line`` (to name it in a syntax error)."""
    if not line:
        return None
    lines = text.splitlines()
    m = re.match(r"^\s*-?\s*([A-Za-z_][\w.-]*)\s*:", lines[line - 1]) if line <= len(lines) else None
    if m:
        return m.group(1)
    for ln in reversed(lines[:line]):
        m = re.match(r"^([A-Za-z_][\w.-]*)\s*:", ln)
        if m:
            return m.group(1)
    return None


def line_of(raw: Any, loc: Sequence[Any]) -> int | None:
    """Return the line of the deepest element of ``raw`` reached by following ``loc``."""
    line = getattr(raw, "line", None) or None
    node = raw
    for part in loc:
        if isinstance(node, _Map) and part in node:
            line = node.key_lines.get(part, line)
            node = node[part]
        elif isinstance(node, _Seq) and isinstance(part, int) and 0 <= part < len(node):
            line = node.item_lines[part]
            node = node[part]
        else:
            break
    return line


# -- pydantic errors -> file:line: field messages ---------------------------------------------
def _at(raw: Any, loc: Sequence[Any]) -> Any:
    node = raw
    for part in loc:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return None
    return node


def _unwrap_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, getattr(__import__("types"), "UnionType", Union)):
        for arg in get_args(annotation):
            found = _unwrap_model(arg)
            if found is not None:
                return found
    return None


def _model_at(model: type[BaseModel], loc: Sequence[Any]) -> type[BaseModel] | None:
    current: type[BaseModel] | None = model
    for part in loc:
        if current is None or not isinstance(part, str) or part not in current.model_fields:
            return None
        current = _unwrap_model(current.model_fields[part].annotation)
    return current


def _field_name(loc: Sequence[Any]) -> str:
    parts = []
    for part in loc:
        if isinstance(part, int):
            parts.append(f"[{part}]")
        else:
            parts.append(("." if parts else "") + str(part))
    return "".join(parts)


def validation_error(
    err: ValidationError, raw: Any, model: type[BaseModel], file: str | Path,
    prefix: Sequence[Any] = (),
) -> ExperimentError:
    """Turn the first error of ``err`` into an ExperimentError naming line and field."""
    first = err.errors(include_url=False)[0]
    # pydantic adds the union member's tag (e.g. 'list[int]', 'function-after[...]') to
    # the location; keep only the parts that exist in the user's file.
    loc = [
        p for p in first["loc"]
        if isinstance(p, int) or not re.match(r"^(list|int|float|str|function|literal|bool)\b", p)
        and "[" not in p
    ]
    # A scalar given where an axis (list) is allowed: name the key, not an index of it.
    while loc and isinstance(loc[-1], int) and not isinstance(_at(raw, loc[:-1]), list):
        loc.pop()
    full = [*prefix, *loc]
    line = line_of(raw, loc)
    if first["type"] == "extra_forbidden":
        parent = _model_at(model, loc[:-1])
        valid = sorted(parent.model_fields) if parent is not None else []
        return ExperimentError(
            file, line, _field_name(full), f"unknown key {loc[-1]!r}; valid keys: {valid}"
        )
    if first["type"] == "missing":
        return ExperimentError(file, line, _field_name(full), "this required key is missing")
    msg = first["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    given = first.get("input")
    if not isinstance(given, (dict, list)):
        msg = f"{msg} (got {given!r})"
    return ExperimentError(file, line, _field_name(full), msg)


# -- the throughput kind's models --------------------------------------------------------------
class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _as_axis(value: Any, name: str) -> Any:
    """Return ``value`` as a non-empty tuple (a scalar is an axis of one value)."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"empty sweep: '{name}' is an empty list; give at least one value")
        return tuple(value)
    return (value,)


class RealOptions(_Frozen):
    """How real-mode points run (``ddpbench.realrun`` under ``ddpbench launch``)."""

    compute: Literal["sleep", "spin"] = "sleep"
    timeout_s: float = Field(300.0, gt=0)


class GanttOptions(_Frozen):
    """Which point's iteration the Gantt plot shows: params that select it, first match."""

    model_config = ConfigDict(frozen=True, extra="allow")


class ReportOptions(_Frozen):
    """What the report shows."""

    baseline: str | None = Field(None, description="backend that speedups are relative to")
    plots: tuple[
        Literal["throughput_vs_bandwidth", "speedup", "scaling", "gantt", "sim_vs_real"], ...
    ] | None = None
    gantt: tuple[dict[str, Any], ...] = ()
    title: str | None = None

    @field_validator("gantt", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, dict) else value


class ThroughputSpec(_Frozen):
    """The keys of a ``throughput`` experiment (the default kind).

    Every point-level scalar may be a list (a sweep axis); all axes are normalised to
    tuples. ``backends`` maps each backend to its knobs, each knob a scalar or a list.
    """

    mode: Literal["simulate", "real", "both"] = "simulate"
    workloads: tuple[str, ...]
    workers: tuple[int, ...] = (4,)
    servers: tuple[int | Literal["colocated"], ...] = ("colocated",)
    bandwidth_gbps: tuple[float, ...] = (10.0,)
    latency_us: tuple[float, ...] = (5.0,)
    iterations: tuple[int, ...] = (3,)
    warmup: tuple[int, ...] = (1,)
    compute_scale: tuple[float, ...] = (1.0,)
    size_scale: tuple[float, ...] = (1.0,)
    oversubscription: tuple[float, ...] = (1.0,)
    rack_size: tuple[int, ...] = (8,)
    repetitions: int = Field(1, ge=1)
    backends: dict[str, dict[str, tuple[Any, ...]]]
    zip: tuple[tuple[str, ...], ...] = ()
    real: RealOptions = RealOptions()
    report: ReportOptions = ReportOptions()

    @field_validator(
        "workloads", "workers", "servers", "bandwidth_gbps", "latency_us", "iterations",
        "warmup", "compute_scale", "size_scale", "oversubscription", "rack_size",
        mode="before",
    )
    @classmethod
    def _axis(cls, value: Any, info: Any) -> Any:
        return _as_axis(value, info.field_name)

    @field_validator(*_AXIS_BOUNDS)
    @classmethod
    def _bounded(cls, value: tuple[Any, ...], info: Any) -> tuple[Any, ...]:
        ok, expected = _AXIS_BOUNDS[info.field_name]
        for v in value:
            if not ok(v):
                raise ValueError(f"{info.field_name} must be {expected}, got {v}")
        return value

    @field_validator("servers")
    @classmethod
    def _servers(cls, value: tuple[Any, ...]) -> tuple[Any, ...]:
        for s in value:
            if isinstance(s, int) and s < 1:
                raise ValueError(f"servers must be >= 1 or 'colocated', got {s}")
        return value

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
            out[name] = {k: _as_axis(v, f"{name}.{k}") for k, v in knobs.items()}
        return out

    def axes_of(self, backend: str) -> dict[str, tuple[Any, ...]]:
        """Return the sweep axes of ``backend``: common axes, then its knobs (``b.knob``)."""
        axes: dict[str, tuple[Any, ...]] = {
            "workload": self.workloads, "workers": self.workers, "servers": self.servers,
            "bandwidth_gbps": self.bandwidth_gbps, "latency_us": self.latency_us,
            "iterations": self.iterations, "warmup": self.warmup,
            "compute_scale": self.compute_scale, "size_scale": self.size_scale,
            "oversubscription": self.oversubscription, "rack_size": self.rack_size,
        }
        for knob, values in self.backends[backend].items():
            # A common axis given under a backend overrides it for that backend only.
            common = "workload" if knob == "workloads" else knob
            if common in axes:
                axes[common] = values
            else:
                axes[f"{backend}.{knob}"] = values
        return axes


class Experiment(_Frozen):
    """A validated experiment file: the envelope and the kind's spec."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    name: str
    kind: str = "throughput"
    description: str = ""
    spec: Any
    path: str = "<string>"


_ENVELOPE = {"name", "kind", "description"}


def _known_backends() -> dict[str, dict[str, Any]]:
    return {k: dict(v) for k, v in BACKEND_KNOBS.items()}


def _known_workloads() -> tuple[str, ...]:
    try:
        from ddpbench import simulator

        return tuple(getattr(simulator, "WORKLOADS", BUILTIN_WORKLOADS))
    except ImportError:
        return BUILTIN_WORKLOADS


def _err(file: Path | str, raw: Any, loc: Sequence[Any], message: str) -> ExperimentError:
    return ExperimentError(file, line_of(raw, loc), _field_name(loc), message)


def _lift_dotted_knobs(raw: _Map, file: Path | str) -> None:
    """Move top-level ``backend.knob: values`` keys into ``backends`` (line kept)."""
    dotted = [k for k in raw if isinstance(k, str) and "." in k and k not in _ENVELOPE]
    if not dotted:
        return
    backends = raw.get("backends")
    if isinstance(backends, (list, tuple)):
        converted = _Map({b: _Map() for b in backends})
        converted.line, converted.key_lines = backends.line, dict(
            zip(backends, backends.item_lines)
        )
        for v in converted.values():
            v.line, v.key_lines = converted.line, {}
        raw["backends"] = backends = converted
    for key in dotted:
        backend, knob = key.split(".", 1)
        if not isinstance(backends, dict) or backend not in backends:
            raise _err(file, raw, [key], f"backend {backend!r} is not in 'backends'")
        knobs = backends[backend]
        if knobs is None:
            knobs = backends[backend] = _Map()
            knobs.line, knobs.key_lines = raw.key_lines[key], {}
        if knob in knobs:
            raise _err(file, raw, [key], f"knob {knob!r} of {backend!r} is given twice")
        knobs[knob] = raw.pop(key)
        knobs.key_lines[knob] = raw.key_lines[key]


def check_throughput(spec: ThroughputSpec, raw: Any, file: Path | str) -> ThroughputSpec:
    """Check names against the known backends, knobs and workloads (with lines)."""
    known = _known_backends()
    base = Path(file).parent if file != "<string>" else Path.cwd()
    for name, knobs in spec.backends.items():
        if name not in known:
            raise _err(file, raw, ["backends", name],
                       f"unknown backend {name!r}; valid backends: {sorted(known)}")
        for knob in knobs:
            if knob in COMMON_AXES or knob == "workloads":
                continue
            if knob not in known[name]:
                raise _err(file, raw, ["backends", name, knob],
                           f"unknown knob {knob!r} of backend {name!r}; "
                           f"valid knobs: {sorted(known[name])} (or a common axis to "
                           f"override for this backend: {list(COMMON_AXES)})")
    valid = _known_workloads()
    for i, w in enumerate(spec.workloads):
        if w not in valid and not (w.endswith((".yaml", ".yml")) and (base / w).is_file()):
            raise _err(file, raw, ["workloads", i] if isinstance(raw.get("workloads"), list)
                       else ["workloads"],
                       f"unknown workload {w!r}; valid workloads: {sorted(valid)} or a path "
                       f"to a profile .yaml file")
    axis_names: set[str] = set(spec.axes_of(next(iter(spec.backends))))
    for name in spec.backends:
        axis_names |= set(spec.axes_of(name))
    axis_names |= {"workloads"}
    seen: set[str] = set()
    for g, group in enumerate(spec.zip):
        if len(group) < 2:
            raise _err(file, raw, ["zip", g], "a zip group pairs two or more axes")
        lengths = {}
        for axis in group:
            key = "workload" if axis == "workloads" else axis
            if axis not in axis_names:
                raise _err(file, raw, ["zip", g],
                           f"zip names unknown axis {axis!r}; valid axes: {sorted(axis_names)}")
            if key in seen:
                raise _err(file, raw, ["zip", g], f"axis {axis!r} is in two zip groups")
            seen.add(key)
            for backend in spec.backends:
                axes = spec.axes_of(backend)
                if key in axes:
                    lengths[axis] = len(axes[key])
        if len(set(lengths.values())) > 1:
            raise _err(file, raw, ["zip", g],
                       f"zipped axes must have equal lengths, got {lengths}")
    if spec.report.baseline is not None and spec.report.baseline not in spec.backends:
        raise _err(file, raw, ["report", "baseline"],
                   f"baseline {spec.report.baseline!r} is not one of the experiment's "
                   f"backends {sorted(spec.backends)}")
    return spec


def parse_experiment(text: str, file: str | Path = "<string>") -> Experiment:
    """Validate the experiment in ``text`` (``file`` names it in errors).

    Raises:
        ExperimentError: malformed YAML, a wrong type, an unknown key (the valid ones are
            listed), a missing key, an empty sweep, an unknown backend, knob or workload.
    """
    from ddpbench import runner  # the kinds live there; imported late to avoid a cycle

    raw = load_yaml(text, file)
    if not isinstance(raw, _Map):
        raise ExperimentError(file, getattr(raw, "line", 1) or 1, None,
                              "an experiment file must be a mapping of keys to values")
    name = raw.get("name")
    if name is None:
        raise ExperimentError(file, raw.line, "name", "this required key is missing")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise _err(file, raw, ["name"], f"expected a name of letters, digits, '_', '.', '-' "
                   f"(it names the report folder), got {name!r}")
    kind = raw.get("kind", "throughput")
    if kind not in runner.EXPERIMENT_KINDS:
        raise _err(file, raw, ["kind"], f"unknown kind {kind!r}; valid kinds: "
                   f"{sorted(runner.EXPERIMENT_KINDS)}")
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise _err(file, raw, ["description"], f"expected a string, got {description!r}")
    try:
        module = runner.load_kind(kind)
    except runner.KindUnavailableError as err:
        raise _err(file, raw, ["kind"], str(err)) from None
    body = _Map({k: v for k, v in raw.items() if k not in _ENVELOPE})
    body.line, body.key_lines = raw.line, raw.key_lines
    if kind == "throughput":
        _lift_dotted_knobs(body, file)
    try:
        spec = module.Spec.model_validate(dict(body))
    except ValidationError as err:
        raise validation_error(err, body, module.Spec, file) from None
    check = getattr(module, "check", None)
    if check is not None:
        spec = check(spec, body, file)
    return Experiment(name=name, kind=kind, description=description.strip(), spec=spec,
                      path=str(file))


def load_experiment(path: str | Path) -> Experiment:
    """Read and validate the experiment file at ``path``.

    Raises:
        ExperimentError: the file is missing, unreadable or malformed.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ExperimentError(p, None, None, "no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ExperimentError(p, None, None, f"cannot read: {err}") from None
    return parse_experiment(text, p)
