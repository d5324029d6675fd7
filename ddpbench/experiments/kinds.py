"""The registry of experiment kinds: ``kind:`` in a file -> the module that runs it.

A kind is registered by name with the path of its module (imported on first use, so a
kind whose optional dependencies are missing fails only when used, with a clear error)::

    from ddpbench.experiments.kinds import register_kind
    register_kind("mykind", "mypackage.mykind")

Experiment kinds (the interface)
-------------------------------
Each kind maps the ``kind:`` of an experiment file to a module path (or to an
object) that provides the members below. A module that cannot be imported makes loading an
experiment of that kind fail with a clear error naming the module.

``Spec``
    A pydantic model, ``ConfigDict(frozen=True, extra="forbid")``, of the kind's own keys:
    every top-level key of the file except the envelope ``name``, ``kind`` and
    ``description`` (read by the runner). The runner validates the file with
    ``Spec.model_validate(mapping)`` and reports the first error as ``file:line: field
    'a.b': message`` (unknown keys list the valid ones). ``Spec`` must round-trip through
    ``Spec.model_validate(spec.model_dump(mode="json"))``: the runner stores that dump in
    the report folder (``experiment.json``) for ``ddpbench report`` to re-render.

``check(spec, raw, file) -> Spec``  (optional)
    Further checks that need more than pydantic (names against registries...). Raise
    ``ddpbench.experiments.schema.ExperimentError`` (``schema.err_at(file, raw, loc, msg)``
    names the line).

``prepare(raw, file) -> None``  (optional)
    Rewrite the raw mapping before validation (the throughput kind lifts top-level
    ``backend.knob`` keys into ``backends``).

``expand(spec) -> list[dict]``
    One dict per point and repetition, in a deterministic order, values scalars only
    (str, int, float, bool, None). Reserved keys read by the runner:

    - ``"mode"`` (str, default ``"simulate"``): ``"real"`` points run one at a time in the
      runner's process (they start processes of their own); every other mode runs in the
      parallel executor (``--jobs``, ``--executor``).
    - ``"repetition"`` (int, default 0): part of the row key, not of the point name.
    - keys starting with ``"_"``: passed to ``run_point`` but neither named nor stored.

``point_name(params: dict) -> str``
    Deterministic name of a point from its params, without ``mode``, ``repetition`` and
    ``_``-keys, as ``label[k=v,...]`` with sorted keys, e.g. ``"float16[N=64,f=8]"``.
    Two different points must not share a name.

``key_params(params: dict) -> dict``  (optional)
    The point's parameters with every default that changes its result filled in (knob
    defaults from the contract, cluster defaults). The runner keys each result on a digest
    of these and of the input files they name (:mod:`ddpbench.experiments.manifest`), so
    a result is reused only while none of them changes.

``run_point(params: dict) -> dict``
    Run one point and return a flat row of results: str/int/float/bool/None values;
    lists and dicts are stored as JSON text. It runs in a worker process for non-real
    modes, so ``run_point`` must be a module-level function (picklable) that imports what
    it needs. Raise on failure: the runner records ``status="failed"`` and
    ``error="ExcType: message"`` and goes on. The reserved result key ``"_files"``
    (dict: relative path -> str) is written under the report folder (for example a
    timeline JSON for a plot) and not stored in the row.

``render(df, outdir: pathlib.Path, spec) -> list[pathlib.Path]``
    Write ``outdir/report.md`` (and ``report.html``) with tables and PNG plots from ``df``,
    the DataFrame of every row of results.csv (columns: the params, the results, and the
    runner's ``experiment``, ``kind``, ``mode``, ``point``, ``repetition``, ``status``,
    ``error``); failed rows are included. Return the paths
    written. :class:`ddpbench.experiments.report.Document` writes markdown and escaped HTML at once.
    Use matplotlib's Agg backend (``ddpbench.experiments.report.pyplot()`` gives one).

The ``throughput`` kind (:mod:`ddpbench.experiments.throughput`) is the default and follows
the same interface.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["EXPERIMENT_KINDS", "KindUnavailableError", "load_kind", "register_kind"]

EXPERIMENT_KINDS: dict[str, Any] = {
    "throughput": "ddpbench.experiments.throughput",
    "numerics": "ddpbench.experiments.numerics",
    "accuracy": "ddpbench.experiments.accuracy",
    "validation": "ddpbench.experiments.validation",
}
REQUIRED = ("Spec", "expand", "point_name", "run_point", "render")


class KindUnavailableError(RuntimeError):
    """The module of an experiment kind cannot be imported or lacks a member."""


def load_kind(kind: str) -> Any:
    """Return the module (or object) implementing experiment kind ``kind``.

    Raises:
        KindUnavailableError: unknown kind, module not importable, or a member missing.
    """
    if kind not in EXPERIMENT_KINDS:
        raise KindUnavailableError(
            f"unknown experiment kind {kind!r}; valid kinds: {sorted(EXPERIMENT_KINDS)}"
        )
    target = EXPERIMENT_KINDS[kind]
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
    else:
        obj = target
    missing = [m for m in REQUIRED if not hasattr(obj, m)]
    if missing:
        raise KindUnavailableError(
            f"experiment kind {kind!r} ({target!r}) lacks {missing}; a kind defines {list(REQUIRED)}"
        )
    return obj




def register_kind(name: str, target: Any) -> None:
    """Register experiment kind ``name``: a module path (``"pkg.mod"``) or an object.

    Raises:
        ValueError: ``name`` is already registered.
    """
    if name in EXPERIMENT_KINDS:
        raise ValueError(f"experiment kind {name!r} is already registered")
    EXPERIMENT_KINDS[name] = target
