"""An output folder belongs to one experiment: its manifest, the points' keys and history.

``experiment.json`` in a report folder is the manifest: the experiment's name, kind and
validated spec, and per point (``mode|name|repetition``) a key over everything that changes
its result: the kind, every parameter of the point (knobs with their defaults filled in by
the kind's expansion) and the content of every input file a parameter names (a workload
profile, a machine profile, a dataset). A row of ``results.csv`` counts as finished only
while its point's key is unchanged.

Opening a folder for a run (:func:`claim`):

- an empty or new folder is claimed for the experiment;
- a folder of the same experiment keeps the rows whose key is unchanged; the others (a
  changed spec, knob, input file, or a point no longer in the sweep) move to
  ``history/<UTC time>/results.csv`` beside the manifest they were made under (nothing is
  deleted), so a report never mixes two specs;
- a folder of another experiment is refused with what to do instead;
- ``fresh=True`` moves the whole folder aside (``<folder>.<UTC time>``) and starts over.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["MANIFEST", "Claim", "FolderError", "check_outdir", "claim", "point_key",
           "read_manifest", "row_id", "stale_rows", "stamp", "write_manifest"]

MANIFEST = "experiment.json"
_INPUT_SUFFIXES = (".yaml", ".yml", ".json", ".npz", ".npy", ".tsv", ".csv", ".txt")


class FolderError(ValueError):
    """The output folder cannot be used for this run (the message says what to do)."""


def stamp() -> str:
    """Return the current UTC time as a name-safe string (``20261124T233000Z``)."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def _file_digest(value: str) -> str | None:
    """Return the SHA-256 of the input file ``value`` names, or None if it names none."""
    if not value.lower().endswith(_INPUT_SUFFIXES):
        return None
    path = Path(value)
    try:
        if not path.is_file():
            return None
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _canonical(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)  # 10 and 10.0 are the same bandwidth
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def point_key(kind: str, params: Mapping[str, Any]) -> str:
    """Return the key of one point: a digest of its kind, parameters and input files."""
    inputs = {}
    for name, value in params.items():
        if isinstance(value, str):
            digest = _file_digest(value)
            if digest is not None:
                inputs[name] = digest
    doc = {"kind": kind, "params": _canonical(dict(params)), "inputs": inputs}
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:20]


def row_id(mode: str, name: str, repetition: Any) -> str:
    """Return the manifest's name of a row: ``mode|point|repetition``."""
    return f"{mode}|{name}|{repetition}"


@dataclass
class Claim:
    """What :func:`claim` did to the folder."""

    outdir: Path
    kept: int = 0
    moved: int = 0
    history: Path | None = None
    moved_aside: Path | None = None


def _read_manifest(outdir: Path) -> dict[str, Any] | None:
    path = outdir / MANIFEST
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise FolderError(f"{path} is not a readable manifest ({err}); move the folder "
                          f"away or run with --fresh to start over (the old folder is "
                          f"kept beside it)") from None
    if not isinstance(doc, dict) or "name" not in doc:
        raise FolderError(f"{path} is not a ddpbench manifest (no experiment name); use "
                          f"another --outdir or --fresh")
    return doc


def check_outdir(outdir: Path) -> None:
    """Raise :class:`FolderError` when ``outdir`` cannot be a report folder."""
    if outdir.exists() and not outdir.is_dir():
        raise FolderError(f"report folder {outdir} is a file, not a folder; name a folder "
                          f"(it is created if missing)")
    parent = outdir
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise FolderError(f"report folder {outdir} cannot be created: {parent} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise FolderError(f"report folder {outdir} cannot be written: no permission in {parent}")


def claim(exp: Any, outdir: Path, keys: Mapping[str, str], store: Any, *,
          fresh: bool = False, old_keys: Any = None) -> Claim:
    """Make ``outdir`` the folder of ``exp`` for a run over the points ``keys``.

    Args:
        exp: the validated experiment (name, kind, description, path, spec).
        outdir: the report folder.
        keys: row id (:func:`row_id`) -> :func:`point_key` of every point of the sweep.
        store: the folder's :class:`~ddpbench.experiments.runner.ResultsStore`; stale rows
            are taken out of it.
        fresh: move an existing folder aside and start over.
        old_keys: ``callable(manifest) -> {row id: key}`` for a manifest written before
            keys were kept (the kind's expansion of its saved spec).

    Raises:
        FolderError: the folder belongs to another experiment, or cannot be used.
    """
    check_outdir(outdir)
    result = Claim(outdir)
    if fresh and outdir.exists() and any(outdir.iterdir()):
        aside = outdir.with_name(f"{outdir.name}.{stamp()}")
        outdir.rename(aside)
        result.moved_aside = aside
        store.reset()
    doc = _read_manifest(outdir) if outdir.exists() else None
    if doc is None:
        if store.rows:
            raise FolderError(f"{outdir} holds a results.csv but no {MANIFEST}, so it cannot "
                              f"be told which experiment made it; use another --outdir, or "
                              f"--fresh to start over (the old folder is kept beside it)")
    elif doc["name"] != exp.name:
        raise FolderError(
            f"{outdir} holds the results of experiment {doc['name']!r} (from "
            f"{doc.get('source', '?')}), not {exp.name!r}; give this run its own folder "
            f"(--outdir reports/{exp.name}), or add --fresh to start over in {outdir} (the "
            f"old folder is kept beside it)")
    else:
        stale = stale_rows(doc, keys, store.rows, old_keys)
        if stale:
            result.history = _archive(outdir, stale, doc)
            store.remove(stale)
            result.moved = len(stale)
    result.kept = len(store.rows)
    write_manifest(exp, outdir, keys)
    return result


def stale_rows(doc: Mapping[str, Any], keys: Mapping[str, str],
               rows: Iterable[Mapping[str, Any]], old_keys: Any = None) -> list[Any]:
    """Return the rows whose point is gone from the sweep or whose key has changed."""
    before = doc.get("points")
    if not isinstance(before, dict):
        before = old_keys(doc) if old_keys is not None else {}
    return [r for r in rows
            if before.get(_rid(r)) is None or before.get(_rid(r)) != keys.get(_rid(r))]


def read_manifest(outdir: Path) -> dict[str, Any] | None:
    """Return the manifest of ``outdir`` (None when there is none)."""
    return _read_manifest(outdir) if outdir.is_dir() else None


def _rid(row: Mapping[str, Any]) -> str:
    return row_id(str(row.get("mode", "")), str(row["point"]), row.get("repetition", 0))


def _archive(outdir: Path, rows: Iterable[Mapping[str, Any]], doc: Mapping[str, Any]) -> Path:
    """Append ``rows`` to ``history/<time>/results.csv`` with the manifest they were made under."""
    import csv
    import io

    rows = list(rows)
    target = outdir / "history" / stamp()
    target.mkdir(parents=True, exist_ok=True)
    header: list[str] = []
    for r in rows:
        header.extend(k for k in r if k not in header)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, header, lineterminator="\n", restval="")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write(target / "results.csv", buf.getvalue())
    atomic_write(target / MANIFEST, json.dumps(doc, indent=2) + "\n")
    for r in rows:  # the files a row's point wrote (a timeline) go with it
        for rel in filter(None, str(r.get("files") or "").split(";")):
            src = (outdir / rel).resolve()
            if outdir.resolve() in src.parents and src.is_file():
                dst = target / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                src.replace(dst)
    return target


def write_manifest(exp: Any, outdir: Path, keys: Mapping[str, str]) -> None:
    """Write ``outdir/experiment.json``: the experiment and its points' keys (atomic)."""
    doc = {"name": exp.name, "kind": exp.kind, "description": exp.description,
           "source": exp.path, "spec": exp.spec.model_dump(mode="json"),
           "points": dict(sorted(keys.items()))}
    text = json.dumps(doc, indent=2) + "\n"
    target = outdir / MANIFEST
    if not target.exists() or target.read_text(encoding="utf-8") != text:
        atomic_write(target, text)


def atomic_write(target: Path, text: str) -> None:
    """Write ``text`` to ``target`` whole or not at all: a temporary file beside it, fsynced,
    then renamed over it (a kill leaves the old file or the new one, never half of one)."""
    import tempfile

    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

