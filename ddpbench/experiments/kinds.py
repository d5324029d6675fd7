"""The registry of experiment kinds: ``kind:`` in a file -> the object that runs it.

A kind implements :class:`ExperimentKind`. The built-in kinds are :class:`Kind` objects
named ``KIND`` in their modules; a kind is registered by name with the path of its module
(imported on first use, so a kind whose optional dependencies are missing fails only when
used, with a clear error)::

    from ddpbench.experiments.kinds import register_kind
    register_kind("mykind", "mypackage.mykind")

The module (or a ``"module:attr"`` object, or the object itself) either holds a ``KIND``
that satisfies :class:`ExperimentKind`, or is the kind: then it defines the required
members as module-level names and may define the optional ones, and :func:`load_kind`
wraps it in a :class:`Kind` that fills the missing optional members with their defaults.
The runner (:mod:`ddpbench.experiments.runner`) calls the members; it knows no kind by name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel

__all__ = ["EXPERIMENT_KINDS", "ExperimentKind", "Kind", "KindUnavailableError", "Params",
           "load_kind", "register_kind"]

Params = dict[str, Any]
"""One point's parameters (:meth:`ExperimentKind.expand`) or one row of results."""

SpecT = TypeVar("SpecT", bound=BaseModel)
_S = TypeVar("_S")


@runtime_checkable
class ExperimentKind(Protocol[SpecT]):
    """What the runner needs of an experiment kind.

    ``Spec``, :meth:`expand`, :meth:`point_name`, :meth:`run_point` and :meth:`render` are
    required of a registered module or class; :meth:`prepare`, :meth:`check`,
    :meth:`key_params`, :meth:`batch_key` and :meth:`size` are optional there (:func:`load_kind` fills in
    the defaults of :class:`Kind`), so every kind the runner gets has them all.
    """

    @property
    def Spec(self) -> type[SpecT]:  # noqa: N802 - the model class, named as it is used
        """The pydantic model of the kind's own keys.

        ``ConfigDict(frozen=True, extra="forbid")``; every top-level key of the file except
        the envelope ``name``, ``kind`` and ``description`` (read by the runner). The runner
        validates the file with ``Spec.model_validate(mapping)`` and reports the first error
        as ``file:line: field 'a.b': message`` (unknown keys list the valid ones). ``Spec``
        must round-trip through ``Spec.model_validate(spec.model_dump(mode="json"))``: the
        runner stores that dump in the report folder (``experiment.json``) for ``ddpbench
        report`` to re-render.
        """
        ...

    def expand(self, spec: SpecT) -> list[Params]:
        """Return one dict per point and repetition, in a deterministic order.

        Values are scalars only (str, int, float, bool, None). Reserved keys read by the
        runner:

        - ``"mode"`` (str, default ``"simulate"``): ``"real"`` points run one at a time in
          the runner's process (they start processes of their own); every other mode runs
          in the parallel executor (``--jobs``, ``--executor``).
        - ``"repetition"`` (int, default 0): part of the row key, not of the point name.
        - keys starting with ``"_"``: passed to :meth:`run_point` but neither named nor
          stored.
        """
        ...

    def point_name(self, params: Params) -> str:
        """Return the deterministic name of a point, e.g. ``"float16[N=64,f=8]"``.

        Built from ``params`` without ``mode``, ``repetition`` and ``_``-keys, as
        ``label[k=v,...]`` with sorted keys (:func:`ddpbench.experiments.naming.make_name`).
        Two different points must not share a name.
        """
        ...

    def run_point(self, params: Params) -> Params:
        """Run one point and return a flat row of results.

        Values are str/int/float/bool/None; lists and dicts are stored as JSON text. It runs
        in a worker process for non-real modes, so it must be a module-level function
        (picklable by name) that imports what it needs. Raise on failure: the runner records
        ``status="failed"`` and ``error="ExcType: message"`` and goes on. The reserved result
        key ``"_files"`` (dict: relative path -> str) is written under the report folder (a
        timeline JSON for a plot, say) and not stored in the row.
        """
        ...

    def render(self, df: Any, outdir: Path, spec: SpecT) -> list[Path]:
        """Write ``outdir/report.md`` (and ``report.html``) from the results; return the paths.

        ``df`` is the pandas DataFrame of every row of results.csv (columns: the params, the
        results, and the runner's ``experiment``, ``kind``, ``mode``, ``point``,
        ``repetition``, ``status``, ``error``); failed rows are included.
        :class:`ddpbench.experiments.report.Document` writes markdown and escaped HTML at
        once; use matplotlib's Agg backend (``ddpbench.experiments.report.pyplot()``).
        """
        ...

    def prepare(self, raw: Any, file: Path | str) -> None:
        """Rewrite the raw mapping of the file's keys before validation (optional).

        The throughput kind lifts top-level ``backend.knob`` keys into ``backends``.
        Default: no rewrite.
        """
        ...

    def check(self, spec: SpecT, raw: Any, file: Path | str) -> SpecT:
        """Check what pydantic cannot (names against registries...); return the spec (optional).

        Raise ``ddpbench.experiments.schema.ExperimentError``
        (``schema.err_at(file, raw, loc, msg)`` names the line). Default: no check.
        """
        ...

    def key_params(self, params: Params) -> Params:
        """Return the point's params with every default that changes its result (optional).

        Knob defaults from the contract, cluster defaults. The runner keys each result on a
        digest of these and of the input files they name
        (:mod:`ddpbench.experiments.manifest`), so a result is reused only while none of them
        changes. Default: the params as they are.
        """
        ...

    def batch_key(self, params: Params) -> Hashable | None:
        """Return the batch of a non-real point: points of one batch run in one task (optional).

        The parallel executor runs the points of a batch one after another in one worker
        process, in their :meth:`expand` order, so :meth:`run_point` can share work between
        them through a per-process cache (the numerics kind emulates a cell of factors once).
        Each point is still its own row. Default: ``None``, every point its own task.
        """
        ...

    def size(self, params: Params) -> Any:
        """Return what running a point will take, estimated before any work (optional).

        A :class:`ddpbench.sizes.Cost` (memory, time, the limits it passes) or None. The
        runner asks it of every point to run before it runs any, and refuses the run when
        one passes this machine's limits (:func:`ddpbench.sizes.check`) unless the user gave
        ``--allow-large``; every point checked so (or allowed) then gets ``_allow_large:
        True`` and must not refuse itself. Default: None (nothing to check).
        """
        ...


def _no_rewrite(raw: Any, file: Path | str) -> None:
    return None


def _unchecked(spec: _S, raw: Any, file: Path | str) -> _S:
    return spec


def _as_is(params: Params) -> Params:
    return params


def _unbatched(params: Params) -> Hashable | None:
    return None


def _unsized(params: Params) -> Any:
    return None


@dataclass(frozen=True)
class Kind(Generic[SpecT]):
    """An :class:`ExperimentKind` made of functions: the built-in kinds' ``KIND``.

    Example::

        KIND: ExperimentKind[Spec] = Kind(Spec=Spec, expand=expand, point_name=point_name,
                                          run_point=run_point, render=render)
    """

    Spec: type[SpecT]
    expand: Callable[[SpecT], list[Params]]
    point_name: Callable[[Params], str]
    run_point: Callable[[Params], Params]
    render: Callable[[Any, Path, SpecT], list[Path]]
    prepare: Callable[[Any, Path | str], None] = _no_rewrite
    check: Callable[[SpecT, Any, Path | str], SpecT] = _unchecked
    key_params: Callable[[Params], Params] = _as_is
    batch_key: Callable[[Params], Hashable | None] = _unbatched
    size: Callable[[Params], Any] = _unsized

    @classmethod
    def of(cls, obj: Any) -> Kind[Any]:
        """Wrap a module or class that defines the members, defaults for the optional ones."""
        optional = ("prepare", "check", "key_params", "batch_key", "size")
        return cls(**{m: getattr(obj, m) for m in REQUIRED},
                   **{m: getattr(obj, m) for m in optional if hasattr(obj, m)})


REQUIRED = ("Spec", "expand", "point_name", "run_point", "render")

EXPERIMENT_KINDS: dict[str, Any] = {
    "throughput": "ddpbench.experiments.throughput",
    "numerics": "ddpbench.experiments.numerics",
    "accuracy": "ddpbench.experiments.accuracy",
    "validation": "ddpbench.experiments.validation",
}
"""Kind name -> module path (``"pkg.mod"`` or ``"pkg.mod:attr"``) or object."""


class KindUnavailableError(RuntimeError):
    """The module of an experiment kind cannot be imported or lacks a member."""


def load_kind(kind: str) -> ExperimentKind[Any]:
    """Return the implementation of experiment kind ``kind``.

    Raises:
        KindUnavailableError: unknown kind, module not importable, or a member missing.
    """
    if kind not in EXPERIMENT_KINDS:
        raise KindUnavailableError(
            f"unknown experiment kind {kind!r}; valid kinds: {sorted(EXPERIMENT_KINDS)}"
        )
    target = EXPERIMENT_KINDS[kind]
    obj = target
    if isinstance(target, str):
        modname, _, attr = target.partition(":")
        try:
            obj = importlib.import_module(modname)
        except ImportError as err:
            raise KindUnavailableError(
                f"experiment kind {kind!r} needs module {modname!r}, which cannot be "
                f"imported ({err}); it may not be written yet"
            ) from None
        if attr:
            obj = getattr(obj, attr)
    obj = getattr(obj, "KIND", obj)
    missing = [m for m in REQUIRED if not hasattr(obj, m)]
    if missing:
        raise KindUnavailableError(
            f"experiment kind {kind!r} ({target!r}) lacks {missing}; a kind defines {list(REQUIRED)}"
        )
    if isinstance(obj, ExperimentKind):
        return obj
    return Kind.of(obj)


def register_kind(name: str, target: Any) -> None:
    """Register experiment kind ``name``: a module path (``"pkg.mod"``) or an object.

    Raises:
        ValueError: ``name`` is already registered.
    """
    if name in EXPERIMENT_KINDS:
        raise ValueError(f"experiment kind {name!r} is already registered")
    EXPERIMENT_KINDS[name] = target
