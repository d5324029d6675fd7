"""The answer of a tune, apart from its rendering: what the report and the CLI both say.

A tune folder holds ``tune.json`` (the request), ``results.csv`` (one row per trial) and
``study.db`` (the optuna study). From them this module gives:

- :func:`ranked`, :func:`defaults`, :func:`best_per_backend`: the trials ranked by predicted
  iteration time, each backend's default configuration and its best;
- :func:`error_band`: how far the simulator's predictions have been from published
  measurements on points like this one (``reports/validation/results.csv``), and
  :func:`scaling_band`: how far their scaling from each published curve's first point has
  been;
- :func:`compute_only_time` and :func:`compute_bound`: the iteration time with a free network,
  and whether the best configuration is already within 2% of it (then no communication
  setting can gain anything);
- :func:`numerics_verdict`, :func:`verdict_of`: whether a configuration's gradient dtype
  (float16 under fp16 compression or mixed precision) at this world size and predivide
  factor sums safely, from the numerics emulator (:func:`ddpbench.numerics.predivide_safe_range`,
  the function behind ``ddpbench numerics query``); :func:`recommended`: the fastest
  configuration that does, and the faster ones that do not (never recommended silently);
- :func:`experiment_yaml`: the chosen configuration as a ``throughput`` experiment file that
  ``ddpbench run`` accepts, beside the defaults of every backend on the same cluster.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpbench import contract, hardware
from ddpbench.experiments.naming import format_value, make_name

__all__ = [
    "COMPUTE_BOUND_TOLERANCE",
    "REQUEST_FILE",
    "RESULTS_FILE",
    "STUDY_FILE",
    "STUDY_NAME",
    "VALIDATION_RESULTS",
    "ErrorBand",
    "MAX_VERDICTS",
    "NumericsVerdict",
    "Recommendation",
    "best_per_backend",
    "compute_bound",
    "compute_only_time",
    "config",
    "config_label",
    "defaults",
    "error_band",
    "experiment_yaml",
    "gain",
    "gradient_dtype",
    "knob_columns",
    "load",
    "numerics_verdict",
    "own_mechanisms",
    "predivide_factor",
    "ranked",
    "recommended",
    "scaling_band",
    "summary_lines",
    "verdict_of",
]

REQUEST_FILE = "tune.json"
RESULTS_FILE = "results.csv"
STUDY_FILE = "study.db"
STUDY_NAME = "ddpbench-tune"
VALIDATION_RESULTS = Path(__file__).resolve().parents[2] / "reports" / "validation" / "results.csv"
"""The shipped validation report's rows: the simulator against published measurements."""
COMPUTE_BOUND_TOLERANCE = 0.02
"""A configuration within this fraction of the compute-only time leaves nothing to tune."""
PREDIVIDE_KNOBS = ("predivide", "predivide_factor", "gradient_predivide_factor")
_FREE_GBPS = 1e9  # a finite "infinite" line rate: the contract rejects inf


# -- reading a folder ------------------------------------------------------------------------
def load(folder: str | Path) -> tuple[dict[str, Any], Any]:
    """Return the request (``tune.json``) and the trials (``results.csv``) of a tune folder.

    ``is_default`` becomes a bool column and ``status`` a string one (``ok`` when missing).

    Raises:
        ValueError: the folder lacks either file or one cannot be read.
    """
    import pandas as pd

    folder = Path(folder)
    try:
        request = json.loads((folder / REQUEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"{folder / REQUEST_FILE}: cannot read the tune request ({err})") from None
    path = folder / RESULTS_FILE
    try:
        df = pd.read_csv(path) if path.stat().st_size else pd.DataFrame()
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: cannot read the trials ({err})") from None
    if "status" not in df.columns:
        df["status"] = "ok"
    df["status"] = df["status"].fillna("ok").astype(str)
    if "is_default" not in df.columns:
        df["is_default"] = False
    df["is_default"] = df["is_default"].map(_truthy).astype(bool)
    if "trial" in df.columns:
        df = df.sort_values("trial", kind="stable").reset_index(drop=True)
    return request, df


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value) and not (isinstance(value, float) and math.isnan(value))


def _space(request: Mapping[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """Return the request's search space as (backend, knob, entry), in its order."""
    out = []
    for key, entry in (request.get("space") or {}).items():
        entry = dict(entry or {})
        backend, _, knob = key.rpartition(".")
        out.append((entry.get("backend") or backend, entry.get("knob") or knob, entry))
    return out


def _fixed(request: Mapping[str, Any], backend: str) -> dict[str, Any]:
    """Return the knobs the request fixed for ``backend`` (``--fix``).

    ``fixed`` maps backend -> knob -> value (as :class:`ddpbench.tune.space.Space` holds
    it); a flat ``<backend>.<knob>`` or ``<knob>`` -> value mapping is read too.
    """
    fixed = request.get("fixed") or {}
    if isinstance(fixed.get(backend), Mapping):
        return dict(fixed[backend])
    out = {}
    for key, value in fixed.items():
        if isinstance(value, Mapping):
            continue
        owner, _, knob = key.rpartition(".")
        if owner and owner != backend:
            continue
        if not owner and knob not in contract.backend(backend).knobs.model_fields:
            continue
        out[knob] = value
    return out


def knob_columns(request: Mapping[str, Any], backend: str, df: Any = None) -> list[str]:
    """Return the knobs searched for ``backend`` (the results.csv columns that hold them)."""
    knobs = [k for b, k, _ in _space(request) if b == backend]
    if df is not None:
        knobs = [k for k in knobs if k in df.columns]
    return list(dict.fromkeys(knobs))


def _value(value: Any) -> Any:
    """Return a results.csv cell as a plain Python value (None for an empty cell)."""
    if value is None:
        return None
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, str):
        low = value.strip().lower()
        if low in ("true", "false"):
            return low == "true"
        if value == "":
            return None
    return value


def _coerce(backend: str, knob: str, value: Any) -> Any:
    """Return ``value`` as the type the contract gives ``knob`` (results.csv loses types)."""
    value = _value(value)
    if value is None:
        return None
    fields = contract.backend(backend).knobs.model_fields
    if knob in fields:
        return getattr(contract.validate_knobs(backend, {knob: value}), knob)
    if isinstance(value, float) and value.is_integer():
        try:
            return contract.check_axis(knob, int(value))
        except ValueError:
            pass
    return contract.check_axis(knob, value) if knob in contract.COMMON_AXES else value


def config(request: Mapping[str, Any], row: Any) -> dict[str, Any]:
    """Return the searched knobs of a trial's row, typed: knob -> value."""
    backend = str(row["backend"])
    out = {}
    for knob in knob_columns(request, backend):
        if knob in row.index:
            value = _coerce(backend, knob, row[knob])
            if value is not None:
                out[knob] = value
    return out


def own_mechanisms(request: Mapping[str, Any], row: Any) -> list[str]:
    """Return ``knob=value`` of a trial's knobs set to a mechanism of ddpbench's own.

    A space entry's ``original`` lists the values the original system offers (BytePS's
    scheduler ``byteps``, not ``credit`` or ``window``); any other value is
    ddpbench's own, a prediction for a system that does not exist as such.
    """
    backend = str(row["backend"])
    out = []
    for b, knob, entry in _space(request):
        original = entry.get("original")
        if b != backend or not original or knob not in row.index:
            continue
        value = _coerce(backend, knob, row[knob])
        if value is not None and value not in original:
            out.append(f"{knob}={format_value(value)}")
    return out


def config_label(request: Mapping[str, Any], row: Any, *, short: bool = False) -> str:
    """Return ``backend[k=v,...]`` for a trial (``backend`` alone when nothing was searched).

    ``short`` rounds float values to 4 significant digits (for tables; a label that must
    tell two trials apart keeps them whole).
    """
    knobs = config(request, row)
    if short:
        knobs = {k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in knobs.items()}
    return make_name(str(row["backend"]), knobs) if knobs else str(row["backend"])


# -- ranking ---------------------------------------------------------------------------------
def _ok(df: Any) -> Any:
    if not len(df) or "iteration_time_s" not in df.columns:
        return df.iloc[0:0]
    times = df["iteration_time_s"].astype(float)
    return df[(df["status"] == "ok") & times.notna() & (times > 0)]


def defaults(df: Any) -> dict[str, Any]:
    """Return backend -> the row of its default configuration (the first such row that ran)."""
    ok = _ok(df)
    rows = ok[ok["is_default"]]
    return {str(b): grp.iloc[0] for b, grp in rows.groupby("backend", sort=False)}


def ranked(request: Mapping[str, Any], df: Any) -> Any:
    """Return the finished trials fastest first, one row per distinct configuration.

    A search may try one configuration more than once (a simulation is deterministic, so the
    repeats agree); the first trial of each is kept. Adds ``configuration`` (its label,
    marked `` *`` when it uses a mechanism of ddpbench's own) and ``own`` (those knobs).
    """
    ok = _ok(df).copy()
    if not len(ok):
        ok["configuration"], ok["own"] = [], []
        return ok
    ok["configuration"] = [config_label(request, r) for _, r in ok.iterrows()]
    ok = ok.drop_duplicates(subset="configuration", keep="first")
    ok["own"] = [", ".join(own_mechanisms(request, r)) for _, r in ok.iterrows()]
    ok["configuration"] = [config_label(request, r, short=True)
                           + (" (default)" if r["is_default"] else "")
                           + (" *" if r["own"] else "") for _, r in ok.iterrows()]
    return ok.sort_values(["iteration_time_s", "trial" if "trial" in ok.columns
                           else "configuration"], kind="stable").reset_index(drop=True)


def best_per_backend(request: Mapping[str, Any], df: Any) -> Any:
    """Return one row per backend: its fastest configuration, fastest backend first."""
    rank = ranked(request, df)
    return rank.drop_duplicates(subset="backend", keep="first").reset_index(drop=True)


def gain(row: Any, default: Any) -> float:
    """Return a configuration's throughput over a default configuration's (> 1: faster)."""
    return float(row["throughput"]) / float(default["throughput"])


# -- the error band --------------------------------------------------------------------------
@dataclass(frozen=True)
class ErrorBand:
    """The simulator's |relative error| on published points comparable to a tune's setting.

    Attributes:
        points: how many scored points the band is taken from.
        splits: split -> how many of them (``fit``: looked at while the model was built;
            ``test``: scored only once it was frozen).
        median: the median |rel_error| (None without points).
        p90: the 90th percentile of |rel_error| (linear interpolation, NumPy's default).
        basis: which points: what they share with the tune's setting.
        comparable: False when no point shared backend family and transport and the band
            falls back on every test-split point.
        source: the results.csv it was read from.
        kind: ``"time"`` (each point's value as published, :func:`error_band`) or
            ``"scaling"`` (each curve's scaling from its first point, :func:`scaling_band`).
    """

    points: int
    splits: dict[str, int]
    median: float | None
    p90: float | None
    basis: str
    comparable: bool
    source: str
    ids: tuple[str, ...] = field(default=(), repr=False)
    kind: str = "time"

    def describe(self) -> str:
        """Return one sentence: the band and where it comes from."""
        if not self.points or self.median is None or self.p90 is None:
            what = "a scaling band" if self.kind == "scaling" else "an error band"
            return f"No validation point to take {what} from ({self.basis})."
        split = ", ".join(f"{n} {k}" for k, n in sorted(self.splits.items()))
        lead = "" if self.comparable else "No published point is comparable, so "
        if self.kind == "scaling":
            return (f"{lead}on {self.points} points of published throughput curves "
                    f"({self.basis}; {split} split) the simulated scaling from each curve's "
                    f"first point (fewest GPUs) is off the published by a median of "
                    f"{self.median:.1%} (90th percentile {self.p90:.1%}). The ratio leaves "
                    "out one GPU's speed, which sets a time's level (your own profile's, if "
                    "you give one), and keeps what adding GPUs and hosts does.")
        return (f"{lead}on {self.points} published points ({self.basis}; {split} split) the "
                f"simulator's |relative error| has median {self.median:.1%} and 90th "
                f"percentile {self.p90:.1%}: a predicted time is typically within "
                f"±{self.median:.0%} of a measurement, and within ±{self.p90:.0%} in nine "
                "cases of ten.")


@functools.lru_cache(maxsize=4)
def _published(path: str | None) -> dict[str, Any]:
    """Return the published points by id (read once: the file is long)."""
    from ddpbench.experiments.validation import data

    return {p.id: p for p in data.load(path).points}


def _family(backend: str) -> str:
    return "parameter server" if contract.backend(backend).uses_servers else "allreduce"


_SIXTEEN_BIT = frozenset({p for p, b in hardware.ACTIVATION_BYTES.items() if b < 4} | {"mixed"})
"""Precisions whose compute a point's profile (measured in fp32, or at a fixed MFU) reaches
only through a rule or a measured speedup: a band for one of them is taken from such points."""


def _precision_class(precision: str | None) -> str:
    return "16-bit" if precision in _SIXTEEN_BIT else "32-bit"


def error_band(backend: str, cluster: Mapping[str, Any], *,
               results: str | Path = VALIDATION_RESULTS,
               published: str | Path | None = None, min_points: int = 3,
               scale_factor: float = 4.0, precision: str | None = None) -> ErrorBand:
    """Return the simulator's error on published points like ``backend`` on ``cluster``.

    The points come from the validation report's ``results.csv`` (``rel_error`` per point;
    sensitivity rows left out), with their settings from the published points
    (:mod:`ddpbench.experiments.validation.data`). Comparable means the same backend family
    (allreduce or parameter server) and transport; of those, the ones of the same precision
    class (16-bit: fp16, bf16, fp8 and mixed; else 32-bit) when ``precision`` is given and
    there are at least ``min_points`` of them; of those, the ones within ``scale_factor``
    of the cluster's GPU count when there are at least ``min_points`` of them. When no
    point is comparable, every test-split point is used (and the band says so).

    Args:
        backend: the chosen backend.
        cluster: the tune's cluster (``contract.Cluster`` fields; ``workers`` and
            ``transport`` are read).
        results: the validation results.csv.
        published: the published points' YAML (None: the shipped file).
        precision: the tune's precision (its schedule's), or None: any precision.
    """
    import pandas as pd

    family, transport = _family(backend), str(cluster.get("transport", "ideal"))
    workers = int(cluster.get("workers") or 1)
    read = _scored_rows(results, published)
    if isinstance(read, str):
        return ErrorBand(0, {}, None, None, read, False, str(results))
    df, by_id = read
    df = df[pd.to_numeric(df["rel_error"], errors="coerce").notna()]
    rows = [(str(r["id"]), abs(float(r["rel_error"])), by_id[str(r["id"])])
            for _, r in df.iterrows()]

    def gpus(p: Any) -> int | None:
        return None if p.setting.hosts is None else p.setting.hosts * p.setting.gpus_per_host

    like = [r for r in rows if _family(r[2].backend) == family
            and r[2].setting.transport == transport]
    basis = f"{family} backends over {transport}"
    if precision is not None and like:
        cls = _precision_class(precision)
        same = [r for r in like if _precision_class(r[2].setting.precision) == cls]
        if len(same) >= min_points:
            like, basis = same, basis + f" in {cls} precision"
        else:
            basis += f" (any precision: fewer than {min_points} in {cls} precision)"
    if like:
        chosen, basis = _near_scale(like, lambda r: gpus(r[2]), workers, scale_factor,
                                    min_points, basis)
    else:
        chosen = [r for r in rows if r[2].split == "test"]
        basis = (f"none is a {family} backend over {transport}; every test-split point "
                 f"instead")
    return _band([(i, e, p.split) for i, e, p in chosen], basis, bool(like), str(results))


def _scored_rows(results: str | Path,
                 published: str | Path | None) -> tuple[Any, dict[str, Any]] | str:
    """Return the validation results' rows of published points (sensitivity rows left out)
    and the published points by id; or why ``results`` cannot be read."""
    import pandas as pd

    try:
        df = pd.read_csv(results)
    except (OSError, ValueError) as err:
        return f"cannot read {results}: {err}"
    by_id = _published(None if published is None else str(published))
    if "sensitivity" in df.columns:
        df = df[~df["sensitivity"].map(lambda v: isinstance(v, str) and bool(v))]
    return df[df["id"].isin(by_id)], by_id


def _near_scale(like: list[Any], gpus: Callable[[Any], int | None], workers: int,
                scale_factor: float, min_points: int, basis: str) -> tuple[list[Any], str]:
    """Return those of ``like`` within ``scale_factor`` of ``workers`` GPUs when there are
    at least ``min_points`` of them, else all of ``like``; and ``basis`` saying which."""
    lo, hi = workers / scale_factor, workers * scale_factor
    near = [r for r in like if (g := gpus(r)) is not None and lo <= g <= hi]
    if len(near) >= min_points:
        return near, basis + f", {math.ceil(lo)} to {math.floor(hi)} GPUs"
    return like, basis + (f" (at any scale: fewer than {min_points} within "
                          f"{scale_factor:g}x of {workers} GPUs)")


def _band(chosen: list[tuple[str, float, str]], basis: str, comparable: bool, source: str,
          kind: str = "time") -> ErrorBand:
    """Return the band of ``chosen`` (id, |error|, split): its median and 90th percentile."""
    import numpy as np

    splits: dict[str, int] = {}
    for _, _, split in chosen:
        splits[split] = splits.get(split, 0) + 1
    if not chosen:
        return ErrorBand(0, {}, None, None, basis, comparable, source, kind=kind)
    errs = np.array([e for _, e, _ in chosen], dtype=float)
    med, p90 = (float(v) for v in np.percentile(errs, [50, 90]))
    return ErrorBand(len(errs), splits, med, p90, basis, comparable, source,
                     tuple(i for i, _, _ in chosen), kind=kind)


def scaling_band(backend: str, cluster: Mapping[str, Any], *,
                 results: str | Path = VALIDATION_RESULTS,
                 published: str | Path | None = None, min_points: int = 3,
                 scale_factor: float = 4.0) -> ErrorBand:
    """Return the simulator's error on published curves' scaling, for ``backend`` on
    ``cluster``: |simulated / published - 1| of each throughput curve's scaling from its
    first point (:func:`ddpbench.experiments.validation.report.curve_scaling`), at the points
    of the same backend family and transport, of those within ``scale_factor`` of the
    cluster's GPU count when there are at least ``min_points``. No comparable point: every
    test-split curve point (and the band says so). The same arguments as :func:`error_band`.
    """
    from ddpbench.experiments.validation.report import curve_scaling, curve_slopes

    family, transport = _family(backend), str(cluster.get("transport", "ideal"))
    workers = int(cluster.get("workers") or 1)
    read = _scored_rows(results, published)
    if isinstance(read, str):
        return ErrorBand(0, {}, None, None, read, False, str(results), kind="scaling")
    df, by_id = read
    rows = [(r, by_id[r["id"]]) for r in curve_scaling(curve_slopes(df, by_id))]
    like = [(r, p) for r, p in rows if _family(p.backend) == family
            and p.setting.transport == transport]
    basis = f"{family} backends over {transport}"
    if like:
        chosen, basis = _near_scale(like, lambda rp: rp[0]["gpus"], workers, scale_factor,
                                    min_points, basis)
    else:
        chosen = [(r, p) for r, p in rows if r["split"] == "test"]
        basis = (f"none is a {family} backend over {transport}; every test-split curve "
                 "point instead")
    return _band([(r["id"], abs(r["error"]), r["split"]) for r, _ in chosen], basis,
                 bool(like), str(results), kind="scaling")


# -- compute-bound ---------------------------------------------------------------------------
def _workload(request: Mapping[str, Any]) -> str:
    return str(request.get("workload_file") or request["workload"])


def compute_only_time(request: Mapping[str, Any]) -> float:
    """Return the iteration time of the request's job on a free network: its compute alone.

    Without jitter or stragglers every worker computes alike, so one worker (no
    communication at all) gives it. Otherwise the same workers run on a network of
    :data:`_FREE_GBPS` Gbit/s, no latency, the ideal transport, one GPU per host and free
    summation, so the slowest worker's compute decides each iteration as it would in the
    job. On a calibrated machine (``cluster.machine``) one worker is simulated either way:
    the machine's own costs would otherwise replace the free network.
    """
    from ddpbench import simulator

    cluster = contract.Cluster(**request["cluster"])
    schedule = contract.Schedule(**(request.get("schedule") or {}))
    dump = cluster.model_dump()
    if cluster.machine is not None or (cluster.jitter == 0 and cluster.stragglers == 0):
        one = {**dump, "workers": 1, "hosts": 1, "gpus_per_host": 1, "servers": "colocated"}
        free = contract.Cluster(**one)
        return simulator.simulate(_workload(request), "byteps", cluster=free,
                                  schedule=schedule, trace=False).iteration_time_s
    free = contract.Cluster(**{
        **dump, "hosts": cluster.workers, "gpus_per_host": 1, "servers": "colocated",
        "bandwidth_gbps": _FREE_GBPS, "latency_us": 0.0, "transport": "ideal",
        "oversubscription": 1.0, "ecmp_paths": 1, "per_message_us": 0.0, "socket_gbps": None,
        "page_fault_us": None, "switch_buffer_kb": None, "overlap_slowdown": 0.0})
    return simulator.simulate(_workload(request), "mpi", cluster=free, schedule=schedule,
                              summation_gbps=math.inf, trace=False).iteration_time_s


def compute_bound(best_time_s: float, compute_time_s: float,
                  tolerance: float = COMPUTE_BOUND_TOLERANCE) -> bool:
    """Return whether ``best_time_s`` is within ``tolerance`` of the compute-only time."""
    return best_time_s <= compute_time_s * (1.0 + tolerance)


# -- numerics ----------------------------------------------------------------------------
def _cell(row: Any, knob: str) -> Any:
    """Return a trial's value of ``knob`` (a results.csv row or a dict), None if it has none."""
    if row is None:
        return None
    return _value(row.get(knob)) if hasattr(row, "get") else None


def gradient_dtype(request: Mapping[str, Any], row: Any = None) -> str:
    """Return the dtype gradients are summed in: float16 under mixed precision and fp16,
    bfloat16 under bf16 and fp8 (Transformer Engine's gradients are bf16), float16 where the
    configuration's ``compression`` (searched or fixed) is ``fp16``, else float32."""
    precision = str((request.get("schedule") or {}).get("precision") or "fp32")
    if precision in ("mixed", "fp16", "float16"):
        return "float16"
    if precision in ("bf16", "fp8"):
        return "bfloat16"
    compression = _cell(row, "compression")
    if compression is None and row is not None:
        compression = _fixed(request, str(row["backend"])).get("compression")
    return "float16" if compression == "fp16" else "float32"


def predivide_factor(request: Mapping[str, Any], row: Any = None) -> float:
    """Return the chosen predivide factor: a searched or fixed knob of that name, else 1."""
    backend = str(row["backend"]) if row is not None else ""
    for knob in PREDIVIDE_KNOBS:
        if _cell(row, knob) is not None:
            return float(_cell(row, knob))
        fixed = _fixed(request, backend) if backend else {}
        if fixed.get(knob) is not None:
            return float(fixed[knob])
    return 1.0


@dataclass(frozen=True)
class NumericsVerdict:
    """Whether summing gradients of ``dtype`` over ``world_size`` ranks at ``factor`` is safe.

    Attributes:
        rows: one per gradient scale tried: scale, safe, overflow, underflow_frac,
            rel_l2_err, and the safe factor range at that scale (``safe_low``, ``safe_high``).
    """

    dtype: str
    world_size: int
    factor: float
    dist: str
    elements: int
    rows: tuple[dict[str, Any], ...]

    @property
    def safe(self) -> bool:
        """True when the factor is safe at every scale tried."""
        return all(r["safe"] for r in self.rows)

    def describe(self) -> str:
        """Return the verdict in one or two sentences, with the query that reproduces it."""
        scales = ", ".join(f"{r['scale']:g}" for r in self.rows)
        head = (f"{self.dtype} gradients summed over {self.world_size} ranks with predivide "
                f"factor {self.factor:g} ({self.dist} gradients of RMS {scales}, "
                f"{self.elements} elements per rank, against the fp64 mean): ")
        if self.safe:
            worst = max(r["rel_l2_err"] for r in self.rows)
            return head + f"safe at every scale tried (relative L2 error at most {worst:.2g})."
        bad = [r for r in self.rows if not r["safe"]]
        parts = []
        for r in bad:
            why = ("overflows" if r["overflow"] else "flushes small values"
                   if r["underflow_frac"] > 0 else "loses accuracy")
            rng = (f"safe factors there: {_factor(r['safe_low'])} to {_factor(r['safe_high'])}"
                   if r["safe_low"] is not None else "no factor tried is safe there")
            parts.append(f"at RMS {r['scale']:g} it {why} ({rng})")
        return (head + "NOT safe: " + "; ".join(parts) + f". Check with `ddpbench numerics query "
                f"-N {self.world_size} --dtype {self.dtype} --dist {self.dist} --scale "
                f"{bad[0]['scale']:g}`.")


def _factor(f: float) -> str:
    """Return a factor as tables name it: ``2^k`` for a power of two from 1024 up."""
    k = math.log2(f) if f > 0 else 0.0
    return f"2^{int(k)}" if k.is_integer() and k >= 10 else f"{f:g}"


def numerics_verdict(request: Mapping[str, Any], factor: float = 1.0, *,
                     scales: Sequence[float] = (1e-2, 1.0, 1e2), dist: str = "layers",
                     elements: int = 8192, dtype: str | None = None) -> NumericsVerdict:
    """Return the numerics model's verdict for the gradients' dtype and the world size.

    Runs :func:`ddpbench.numerics.predivide_safe_range` (``ddpbench numerics query``) at
    each gradient scale on the default factor grid plus ``factor``: a factor is safe when
    it neither overflows nor underflows more than the best and costs at most twice the best
    factor's error (:func:`ddpbench.numerics.mark_safe`). ``dtype`` defaults to the
    request's (:func:`gradient_dtype`); verdicts are memoised per process.
    """
    dtype = dtype or gradient_dtype(request)
    world = int(request["cluster"].get("workers") or 1)
    return _verdict(dtype, world, float(factor), tuple(float(s) for s in scales), dist,
                    int(elements))


@functools.lru_cache(maxsize=64)
def _verdict(dtype: str, world: int, factor: float, scales: tuple[float, ...], dist: str,
             elements: int) -> NumericsVerdict:
    from ddpbench import numerics as nm

    factors = sorted(set(nm.default_factors(world)) | {float(factor)})
    rows = []
    for s in scales:
        res = nm.predivide_safe_range(world, dtype, scale=s, dist=dist, n=elements,
                                      factors=factors)
        row = next(r for r in res["rows"] if r["factor"] == float(factor))
        rng = res["range"]
        rows.append({"scale": float(s), "safe": bool(row["safe"]),
                     "overflow": int(row["overflow"]),
                     "underflow_frac": float(row["underflow_frac"]),
                     "rel_l2_err": float(row["rel_l2_err"]),
                     "safe_low": None if rng is None else rng[0],
                     "safe_high": None if rng is None else rng[1]})
    return NumericsVerdict(dtype, world, float(factor), dist, elements, tuple(rows))


def verdict_of(request: Mapping[str, Any], row: Any) -> NumericsVerdict:
    """Return the numerics verdict of one configuration: its dtype (fp16 compression or
    mixed precision: float16) and its predivide factor (1 where it has none: BytePS
    averages after the pull, the parameter servers sum in arrival order, which the ring's
    order stands in for), over all of the cluster's workers."""
    return numerics_verdict(request, predivide_factor(request, row),
                            dtype=gradient_dtype(request, row))


MAX_VERDICTS = 25
"""How far down the ranking :func:`recommended` looks for a numerically safe configuration."""


@dataclass(frozen=True)
class Recommendation:
    """The configuration an answer recommends and the faster ones it passed over.

    Attributes:
        index: the recommended row's position in the ranking.
        verdict: its numerics verdict (None when numerics were not judged).
        unsafe: ``(position, verdict)`` of every faster configuration the numerics model
            judged unsafe: marked in every table, never recommended.
        safe: False when no configuration within :data:`MAX_VERDICTS` is safe; the index
            is then the fastest's, and it is recommended only with that warning.
    """

    index: int
    verdict: NumericsVerdict | None
    unsafe: tuple[tuple[int, NumericsVerdict], ...] = ()
    safe: bool = True
    too_large: tuple[int, ...] = ()


def recommended(request: Mapping[str, Any], rank: Any, *, numerics: bool = True,
                fits: Callable[[Any], bool] | None = None) -> Recommendation:
    """Return the fastest configuration of ``rank`` that fits and whose numerics verdict is
    safe.

    A faster configuration whose model states do not fit the device (``fits`` says so of a
    row: :func:`ddpbench.tune.report.memory_cells`) or that sums float16 gradients out of
    range (an fp16 compression with too small a predivide factor at this world size) is
    passed over and listed, so the answer never recommends it silently. When no row fits,
    memory is not judged. Without ``numerics`` the fastest (that fits) is returned.

    Raises:
        ValueError: an empty ranking.
    """
    if not len(rank):
        raise ValueError("no trial finished: there is no configuration to recommend")
    order = list(range(len(rank)))
    too_large: tuple[int, ...] = ()
    if fits is not None:
        big = [i for i in order if not fits(rank.iloc[i])]
        if len(big) < len(order):
            too_large = tuple(big)
            order = [i for i in order if i not in set(big)]
    if not numerics:
        return Recommendation(order[0], None, too_large=too_large)
    unsafe: list[tuple[int, NumericsVerdict]] = []
    for i in order[:MAX_VERDICTS]:
        verdict = verdict_of(request, rank.iloc[i])
        if verdict.safe:
            return Recommendation(i, verdict, tuple(unsafe), too_large=too_large)
        unsafe.append((i, verdict))
    return Recommendation(order[0], unsafe[0][1], tuple(unsafe), safe=False,
                          too_large=too_large)


# -- the experiment file ---------------------------------------------------------------------
def _relative(path: str, folder: Path) -> str:
    """Return ``path`` (as the tune read it: from the cwd) relative to ``folder``."""
    return os.path.relpath(Path(path).resolve(), folder.resolve())


def experiment_yaml(request: Mapping[str, Any], df: Any, folder: str | Path,
                    *, name: str | None = None, choice: int = 0) -> str:
    """Return the chosen configuration as a ``throughput`` experiment file (YAML text).

    The file simulates the request's workload and cluster (every field that differs from
    the contract's default) with the chosen backend at its chosen knobs and at its
    defaults (the knobs that differ zipped, so two points), and every other tuned backend
    at its defaults; the report's baseline is the fastest other backend's default. Paths
    (a profile, a machine) are written relative to ``folder``, where the file goes.

    ``choice`` is the chosen configuration's position in :func:`ranked` (the fastest
    numerically safe one: :func:`recommended`).

    Raises:
        ValueError: no trial finished.
    """
    import yaml

    folder = Path(folder)
    rank = ranked(request, df)
    if not len(rank):
        raise ValueError("no trial finished: there is no configuration to write")
    best = rank.iloc[choice]
    backend = str(best["backend"])
    chosen = {**{k: _coerce(backend, k, v) for k, v in _fixed(request, backend).items()},
              **config(request, best)}
    cluster = contract.Cluster(**request["cluster"])
    schedule = contract.Schedule(**(request.get("schedule") or {}))
    # A cluster field searched as a knob (the servers' placement) defaults to the cluster's.
    base = {**{k: getattr(cluster, k) for k in chosen if k in contract.Cluster.model_fields},
            **contract.defaults(backend, "both")}
    differ = {k: v for k, v in chosen.items() if k not in base or base[k] != v}
    exp: dict[str, Any] = {
        "name": name or f"tune_{Path(str(request['workload'])).stem}".replace(":", "_"),
        "description": (f"The configuration `ddpbench tune` chose "
                        f"({config_label(request, best, short=True)}, "
                        f"predicted {float(best['iteration_time_s']) * 1e3:.4g} ms per "
                        "iteration) beside the defaults of every tuned backend; simulated."),
        "mode": "simulate",
        "workloads": [_workload_entry(request, folder)],
    }
    for key, value in _non_default(cluster).items():
        if key == "machine" and value is not None:
            value = _relative(str(value), folder)
        exp[key] = value
    exp.update(_non_default(schedule))
    backends: dict[str, dict[str, Any]] = {}
    zipped: list[list[str]] = []
    # The fixed knobs as they are; the chosen ones that differ from their defaults as
    # [chosen, default], zipped: the chosen point and the default point.
    knobs: dict[str, Any] = {k: _coerce(backend, k, v)
                             for k, v in _fixed(request, backend).items()}
    for k, v in differ.items():
        knobs[k] = [v, base.get(k)]
    backends[backend] = knobs
    if len(differ) > 1:
        zipped.append([k if k in contract.COMMON_AXES else f"{backend}.{k}" for k in differ])
    for other in request.get("backends") or sorted(set(df["backend"])):
        if other != backend:
            backends[str(other)] = {k: _coerce(str(other), k, v)
                                    for k, v in _fixed(request, str(other)).items()}
    exp["backends"] = backends
    if zipped:
        exp["zip"] = zipped
    others = [r for b, r in defaults(df).items() if b != backend and b in backends]
    report: dict[str, Any] = {
        "title": f"Tuned configuration: {config_label(request, best, short=True)}"}
    if others:
        report["baseline"] = str(min(others, key=lambda r: float(r["iteration_time_s"]))["backend"])
    exp["report"] = report
    return yaml.safe_dump(exp, sort_keys=False, allow_unicode=True, width=100)


def _workload_entry(request: Mapping[str, Any], folder: Path) -> str:
    """Return the request's workload as the experiment file names it: a shipped name as it
    is, a profile's path relative to ``folder``."""
    from ddpbench.experiments.throughput.spec import BUILTIN_WORKLOADS

    workload = _workload(request)
    known = set(BUILTIN_WORKLOADS)
    try:
        from ddpbench import simulator

        known |= set(simulator.WORKLOADS)
    except ImportError:
        pass
    return workload if workload in known else _relative(workload, folder)


def _non_default(model: Any) -> dict[str, Any]:
    """Return the fields of a Cluster or Schedule that differ from their defaults."""
    out = {}
    for key, f in type(model).model_fields.items():
        value = getattr(model, key)
        if value != f.get_default(call_default_factory=True):
            out[key] = value
    if isinstance(model, contract.Cluster):
        out["workers"] = model.workers
        out.pop("hosts", None)
        if model.gpus_per_host > 1:
            out["hosts"] = model.hosts
            del out["workers"]
    return out


# -- a summary for the command line ----------------------------------------------------------
def summary_lines(request: Mapping[str, Any], df: Any, top: int = 5) -> list[str]:
    """Return the top configurations and their gain over each default, one line each."""
    rank = ranked(request, df)
    base = defaults(df)
    lines = []
    for i, (_, r) in enumerate(rank.head(top).iterrows(), 1):
        gains = ", ".join(f"{gain(r, d):.3f}x {b}'s default" for b, d in base.items())
        lines.append(f"{i}. {r['configuration']}: {float(r['iteration_time_s']) * 1e3:.4g} ms, "
                     f"{float(r['throughput']):,.1f} samples/s" + (f" ({gains})" if gains else ""))
    return lines

