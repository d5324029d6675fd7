"""Experiment files: YAML with line numbers, validated into frozen models.

An experiment file is a mapping with an envelope read here (``name``, ``kind``,
``description``) and the keys of its kind, validated by the kind's ``Spec`` (the kinds are
registered in :mod:`ddpbench.experiments.kinds`; the default ``throughput`` kind's keys are
documented in :mod:`ddpbench.experiments.throughput.spec`). Every error names the file, the
line and the field; malformed YAML never gives a traceback; YAML is loaded with a
SafeLoader (files are data, never code).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from ddpbench.experiments import kinds

__all__ = [
    "Experiment",
    "ExperimentError",
    "ENVELOPE",
    "Frozen",
    "YamlMap",
    "YamlSeq",
    "as_axis",
    "err_at",
    "line_of",
    "load_experiment",
    "load_yaml",
    "parse_experiment",
    "validation_error",
]

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class ExperimentError(ValueError):
    """A malformed experiment file: the message names the file, the line and the field."""

    def __init__(self, file: str | Path, line: int | None, field: str | None, message: str):
        self.file, self.line, self.field = str(file), line, field
        where = f"{file}:{line}" if line else str(file)
        what = f"field '{field}': " if field else ""
        super().__init__(f"{where}: {what}{message}")


# -- YAML with line numbers -------------------------------------------------------------------
class YamlMap(dict):
    """A mapping from YAML that remembers the line of itself and of each key (1-based)."""

    line: int = 0
    key_lines: dict[Any, int]


class YamlSeq(list):
    """A sequence from YAML that remembers its line and each item's line."""

    line: int = 0
    item_lines: list[int]


class _LineLoader(yaml.SafeLoader):
    """SafeLoader that records node marks: user files are data, never code."""


def _construct_map(loader: _LineLoader, node: yaml.MappingNode) -> YamlMap:
    loader.flatten_mapping(node)
    out = YamlMap()
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


def _construct_seq(loader: _LineLoader, node: yaml.SequenceNode) -> YamlSeq:
    out = YamlSeq(loader.construct_object(child, deep=True) for child in node.value)
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
        if isinstance(node, YamlMap) and part in node:
            line = node.key_lines.get(part, line)
            node = node[part]
        elif isinstance(node, YamlSeq) and isinstance(part, int) and 0 <= part < len(node):
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
    if not isinstance(given, (dict, list)) and ", got " not in msg:
        msg = f"{msg} (got {given!r})"
    return ExperimentError(file, line, _field_name(full), msg)


class Frozen(BaseModel):
    """Base of the kinds' spec models: frozen, unknown keys rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def as_axis(value: Any, name: str) -> Any:
    """Return ``value`` as a non-empty tuple (a scalar is an axis of one value)."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"empty sweep: '{name}' is an empty list; give at least one value")
        return tuple(value)
    return (value,)


class Experiment(Frozen):
    """A validated experiment file: the envelope and the kind's spec."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    name: str
    kind: str = "throughput"
    description: str = ""
    spec: Any
    path: str = "<string>"


ENVELOPE = {"name", "kind", "description"}


def err_at(file: Path | str, raw: Any, loc: Sequence[Any], message: str) -> ExperimentError:
    return ExperimentError(file, line_of(raw, loc), _field_name(loc), message)


def parse_experiment(text: str, file: str | Path = "<string>") -> Experiment:
    """Validate the experiment in ``text`` (``file`` names it in errors).

    Raises:
        ExperimentError: malformed YAML, a wrong type, an unknown key (the valid ones are
            listed), a missing key, an empty sweep, an unknown backend, knob or workload.
    """
    raw = load_yaml(text, file)
    if not isinstance(raw, YamlMap):
        raise ExperimentError(file, getattr(raw, "line", 1) or 1, None,
                              "an experiment file must be a mapping of keys to values")
    name = raw.get("name")
    if name is None:
        raise ExperimentError(file, raw.line, "name", "this required key is missing")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise err_at(file, raw, ["name"], f"expected a name of letters, digits, '_', '.', '-' "
                   f"(it names the report folder), got {name!r}")
    kind = raw.get("kind", "throughput")
    if kind not in kinds.EXPERIMENT_KINDS:
        raise err_at(file, raw, ["kind"], f"unknown kind {kind!r}; valid kinds: "
                   f"{sorted(kinds.EXPERIMENT_KINDS)}")
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise err_at(file, raw, ["description"], f"expected a string, got {description!r}")
    try:
        module = kinds.load_kind(kind)
    except kinds.KindUnavailableError as err:
        raise err_at(file, raw, ["kind"], str(err)) from None
    body = YamlMap({k: v for k, v in raw.items() if k not in ENVELOPE})
    body.line, body.key_lines = raw.line, raw.key_lines
    prepare = getattr(module, "prepare", None)  # a kind's rewrites of its raw keys
    if prepare is not None:
        prepare(body, file)
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
