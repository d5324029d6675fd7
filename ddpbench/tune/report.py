"""The report of a tune: the answer, how sure it is, and the search behind it.

:func:`render` reads a tune folder (``tune.json``, ``results.csv``, ``study.db``) and writes
``report.md`` and ``report.html`` through the shared :class:`~ddpbench.experiments.report.Document`,
``best.yaml`` (the chosen configuration as an experiment file) and four plots: the best
iteration time so far against the trial number, each backend's best beside its default,
the iteration time over the two most important knobs of the best backend, and optuna's
parameter importances (:func:`optuna.importance.get_param_importances`, fANOVA seeded).
What the report says that is not rendering lives in :mod:`ddpbench.tune.answer`, which the
command line prints too.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ddpbench.experiments.naming import format_value
from ddpbench.experiments.report import Document, pyplot
from ddpbench.tune import answer, search

__all__ = ["importances", "render", "stop_info"]

log = logging.getLogger(__name__)


def render(folder: Path, *, top: int = 5, validation: str | Path = answer.VALIDATION_RESULTS,
           published: str | Path | None = None, numerics: bool = True) -> list[Path]:
    """Write the report of the tune in ``folder``; return the paths written.

    Args:
        folder: the tune's folder (``tune.json``, ``results.csv``, ``study.db``).
        top: how many configurations the top table shows.
        validation: the validation report's results.csv the error band is taken from.
        published: the published points' YAML (None: the shipped file).
        numerics: run the numerics emulator for the gradients' verdict (a few seconds at a
            thousand ranks).

    Returns:
        report.md, report.html, best.yaml (when a trial finished) and the PNGs.
    """
    folder = Path(folder)
    request, df = answer.load(folder)
    plt = pyplot()
    for old in folder.glob("*.png"):
        old.unlink()
    doc = Document(_title(request))
    rank = answer.ranked(request, df)
    n_ok = len(answer._ok(df))
    n_failed = int((df["status"] == "failed").sum()) if len(df) else 0
    stop = stop_info(folder)
    stopped = ("" if stop is None else " The search stopped before its budget: "
               + search.stop_sentence(stop["best_s"], stop["compute_s"], stop["within"]) + ".")
    doc.text(f"{len(df)} trials in `results.csv`: {n_ok} finished, {n_failed} failed. The search "
             f"is optuna's TPE sampler (seed {request.get('seed', 0)}), its study in `study.db`; "
             "every backend's default configuration is a trial of its own. Times are the "
             "simulator's predictions." + stopped)
    written: list[Path] = []
    if not len(rank):
        doc.text("No trial finished: nothing to rank.")
        _request_section(doc, request)
        _failed_section(doc, request, df)
        return doc.write(folder)
    rec = _recommend(request, rank, numerics)
    best = rank.iloc[rec.index] if rec is not None else rank.iloc[0]
    base = answer.defaults(df)
    imps, imp_notes = importances(folder, request)
    _answer_section(doc, request, df, rank, base, folder, validation, published, rec)
    _request_section(doc, request)
    _top_section(doc, request, rank, base, top, rec)
    _backends_section(doc, request, df, rank, base)
    from ddpbench.tune import confirm

    confirm.add_section(doc, folder)  # FOLDER/confirm/summary.json, when --confirm ran
    yaml_path = folder / "best.yaml"
    yaml_path.write_text(answer.experiment_yaml(request, df, folder,
                                                choice=rec.index if rec is not None else 0),
                         encoding="utf-8")
    written.append(yaml_path)
    doc.heading("Plots")
    written += _plot_best_so_far(plt, doc, df, folder)
    written += _plot_backends(plt, doc, request, df, base, folder)
    written += _plot_knobs(plt, doc, request, df, str(best["backend"]), imps.get(
        str(best["backend"]), {}), folder)
    written += _plot_importances(plt, doc, imps, imp_notes, folder)
    _failed_section(doc, request, df)
    return doc.write(folder) + written


def _recommend(request: Mapping[str, Any], rank: Any,
               numerics: bool) -> answer.Recommendation | None:
    """Return the recommendation (the fastest configuration that fits the device and, where
    numerics are judged, is numerically safe), or None when the model cannot judge this
    setting."""
    def fits(row: Any) -> bool:
        return bool(memory_cells(request, str(row["backend"]), row).get("fits", True))

    try:
        return answer.recommended(request, rank, numerics=numerics, fits=fits)
    except (ValueError, TypeError) as err:
        log.warning("no numerics verdict: %s", err)
        return None


def _title(request: Mapping[str, Any]) -> str:
    c = request.get("cluster") or {}
    hosts = c.get("hosts") or c.get("workers")
    device = f" {c['device']}" if c.get("device") else ""
    return (f"Tune: {request.get('workload')} on {hosts} x {c.get('gpus_per_host', 1)}"
            f"{device}, {format_value(c.get('bandwidth_gbps'))} Gbit/s {c.get('transport', '')}"
            ).rstrip()


def _ms(seconds: Any) -> float:
    return float(seconds) * 1e3


# -- the answer ------------------------------------------------------------------------------
def _answer_section(doc: Document, request: Mapping[str, Any], df: Any, rank: Any,
                    base: Mapping[str, Any], folder: Path, validation: str | Path,
                    published: str | Path | None,
                    rec: answer.Recommendation | None) -> None:
    best = rank.iloc[rec.index] if rec is not None else rank.iloc[0]
    backend = str(best["backend"])
    doc.heading("Answer")
    what = "Fastest" + (" that fits" if rec is not None and rec.too_large else "") + \
        ("" if rec is None or not rec.unsafe or not rec.safe else " numerically safe")
    lines = [f"{what}: `{best['configuration']}`, predicted "
             f"{_ms(best['iteration_time_s']):.4g} ms per iteration, "
             f"{float(best['throughput']):,.1f} samples/s"
             + (f" (trial {int(best['trial'])})." if "trial" in best.index else ".")]
    if rec is not None and rec.unsafe and rec.safe:
        passed = "; ".join(
            f"`{rank.iloc[i]['configuration']}`, {_ms(rank.iloc[i]['iteration_time_s']):.4g} "
            f"ms: {_unsafe_why(v)}" for i, v in rec.unsafe[:3])
        more = f" (and {len(rec.unsafe) - 3} more)" if len(rec.unsafe) > 3 else ""
        lines.append(f"Faster, but not numerically safe, so not recommended: {passed}{more}.")
    if base:
        gains = ", ".join(f"{answer.gain(best, d):.3f}x {b}'s" for b, d in base.items())
        lines.append(f"Its throughput over each backend's default configuration: {gains}.")
    if best["own"]:
        originals = rank[rank["own"] == ""]
        alt = ("" if not len(originals) else
               f" The fastest configuration within the originals' own mechanisms is "
               f"`{originals.iloc[0]['configuration']}`, "
               f"{_ms(originals.iloc[0]['iteration_time_s']):.4g} ms "
               f"({answer.gain(originals.iloc[0], best):.3f}x the fastest's throughput).")
        lines.append(f"It uses a mechanism of ddpbench's own ({best['own']}), not one the "
                     f"original {backend} has: a prediction for a variant to build, not a "
                     f"setting to switch on." + alt)
    band = answer.error_band(backend, request["cluster"], results=validation,
                             published=published,
                             precision=(request.get("schedule") or {}).get("precision", "fp32"))
    lines.append("How sure: " + _lower_first(band.describe()))
    scaling = answer.scaling_band(backend, request["cluster"], results=validation,
                                  published=published)
    if scaling.points:
        lines.append("How sure of the scaling: " + _lower_first(scaling.describe()))
    lines.append(_compute_bound_line(request, best, base))
    memory = _memory_line(request, best, rank, rec)
    if memory:
        lines.append(memory)
    if rec is not None and rec.verdict is not None:
        warn = ("" if rec.safe else f"no configuration among the fastest "
                f"{min(len(rank), answer.MAX_VERDICTS)} is numerically safe, so the fastest "
                "is shown with its verdict: ")
        lines.append("Numerics: " + warn + rec.verdict.describe())
    lines.append(f"Run it: `ddpbench run {folder / 'best.yaml'}` simulates the chosen "
                 "configuration beside the defaults (`best.yaml`, an experiment file).")
    doc.bullets(lines)


def _unsafe_why(verdict: answer.NumericsVerdict) -> str:
    """Return in a few words why a configuration's sums are unsafe, with the safe factors."""
    bad = [r for r in verdict.rows if not r["safe"]]
    parts = []
    for r in bad:
        why = ("overflows" if r["overflow"] else "flushes small values"
               if r["underflow_frac"] > 0 else "loses accuracy")
        rng = (f"safe factors {answer._factor(r['safe_low'])} to {answer._factor(r['safe_high'])}"
               if r["safe_low"] is not None else "no safe factor")
        parts.append(f"at RMS {r['scale']:g} it {why} ({rng})")
    return (f"{verdict.dtype} sums over {verdict.world_size} ranks at predivide factor "
            f"{verdict.factor:.4g}: " + ", ".join(parts))


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def _compute_bound_line(request: Mapping[str, Any], best: Any,
                        base: Mapping[str, Any]) -> str:
    try:
        compute = answer.compute_only_time(request)
    except (ValueError, TypeError, OSError) as err:
        return f"Compute-bound or not: not known (the compute-only simulation failed: {err})."
    t = float(best["iteration_time_s"])
    tol = answer.COMPUTE_BOUND_TOLERANCE
    if answer.compute_bound(t, compute):
        near = [b for b, d in base.items() if answer.compute_bound(float(d["iteration_time_s"]),
                                                                 compute)]
        also = (f" ({', '.join(near)} at {'its' if len(near) == 1 else 'their'} default "
                f"{'is' if len(near) == 1 else 'are'} too)" if near else "")
        below = ("" if t >= compute else
                 f"; it is {1 - t / compute:.1%} below it because the simulator measures "
                 "the steady state over the request's few iterations "
                 f"({_iterations(request)}), not because any configuration computes faster")
        return (f"Compute-bound: the fastest configuration's {_ms(t):.4g} ms is within "
                f"{tol:.0%} of the {_ms(compute):.4g} ms its compute alone takes (a free "
                f"network){also}{below}. Nothing to gain from communication tuning.")
    fastest_default = min((float(d["iteration_time_s"]) for d in base.values()), default=math.nan)
    dflt = ("" if math.isnan(fastest_default) else
            f"; the fastest default adds {fastest_default / compute - 1:.1%}")
    return (f"Not compute-bound: communication adds {t / compute - 1:.1%} to the "
            f"{_ms(compute):.4g} ms its compute alone takes (a free network) in the fastest "
            f"configuration{dflt}.")


def _iterations(request: Mapping[str, Any]) -> str:
    sched = request.get("schedule") or {}
    n, w = sched.get("iterations", 3), sched.get("warmup", 1)
    return f"{n} iterations, {w} of them warm-up"


# -- tables ----------------------------------------------------------------------------------
def _request_section(doc: Document, request: Mapping[str, Any]) -> None:
    import pandas as pd

    from ddpbench import contract

    doc.heading("Request")
    c = request.get("cluster") or {}
    cluster = contract.Cluster(**c) if c else None
    items = [f"workload: `{request.get('workload')}`"]
    if cluster is not None:
        shown = {"workers": cluster.workers, "hosts": cluster.hosts,
                 "gpus_per_host": cluster.gpus_per_host, "device": cluster.device,
                 "bandwidth_gbps": cluster.bandwidth_gbps, "latency_us": cluster.latency_us,
                 "transport": cluster.transport, "intra_link": cluster.intra_link,
                 **answer._non_default(cluster)}
        items.append("cluster: " + ", ".join(f"{k}={format_value(v)}" for k, v in
                                             shown.items() if v is not None))
    sched = request.get("schedule") or {}
    if sched:
        items.append("schedule: " + (", ".join(
            f"{k}={format_value(v)}" for k, v in answer._non_default(
                contract.Schedule(**sched)).items()) or "defaults"))
    items.append("backends: " + ", ".join(map(str, request.get("backends") or [])))
    known = {"workload", "cluster", "schedule", "backends", "space", "fixed", "dropped", "seed"}
    for key, value in request.items():
        if key not in known:
            items.append(f"{key}: {value}")
    for d in request.get("dropped") or []:
        items.append(f"{d.get('backend')}.{d.get('knob')} not searched: {d.get('why')}")
    doc.bullets(items)
    rows = []
    for backend, knob, e in answer._space(request):
        rng = ("{" + ", ".join(format_value(v) for v in e.get("choices") or []) + "}"
               if e.get("kind") in ("bool", "categorical") else
               f"[{format_value(e.get('low'))}, {format_value(e.get('high'))}]")
        rows.append({"backend": backend, "knob": knob, "kind": e.get("kind", ""),
                     "range": rng + (f" {e['unit']}" if e.get("unit") else ""),
                     "scale": "log" if e.get("log") or e.get("scale") == "log" else
                     e.get("scale", "linear"),
                     "default": format_value(e.get("default", "")),
                     "when": ", ".join(f"{k}={format_value(v)}"
                                       for k, v in (e.get("when") or {}).items()),
                     "range from": e.get("source", "")})
    if rows:
        doc.table(pd.DataFrame(rows), caption="The search space (`ddpbench tune --space` "
                  "prints it; a knob under `when` is searched only while those hold):")
    else:
        doc.text("Nothing searched: every backend ran its default configuration only.")
    fixed = []
    for backend in request.get("backends") or []:
        for knob, value in answer._fixed(request, str(backend)).items():
            fixed.append(f"{backend}.{knob} = {format_value(value)}")
    if fixed:
        doc.text("Fixed (`--fix`): " + ", ".join(fixed) + ".")


def _top_section(doc: Document, request: Mapping[str, Any], rank: Any,
                 base: Mapping[str, Any], top: int,
                 rec: answer.Recommendation | None) -> None:
    import pandas as pd

    doc.heading(f"Top {min(top, len(rank))} configurations")
    rows = []
    for i, (_, r) in enumerate(rank.head(top).iterrows(), 1):
        row: dict[str, Any] = {"rank": i, "configuration": r["configuration"],
                               "iteration_time_ms": _ms(r["iteration_time_s"]),
                               "throughput": float(r["throughput"])}
        for b, d in base.items():
            row[f"x {b} default"] = answer.gain(r, d)
        if rec is not None:
            v = answer.verdict_of(request, r)
            row["numerics"] = (f"{v.dtype}, f={v.factor:g}: "
                               + ("safe" if v.safe else "NOT safe"))
        if "trial" in r.index:
            row["trial"] = int(r["trial"])
        rows.append(row)
    own = " `*`: uses a mechanism of ddpbench's own, not the original's." \
        if rank.head(top)["own"].astype(bool).any() else ""
    judged = (" `numerics`: the gradients' dtype and predivide factor f, and the numerics "
              "model's verdict on them (a configuration NOT safe is never recommended)."
              if rec is not None else "")
    doc.table(pd.DataFrame(rows), caption="Predicted iteration time and throughput "
              "(samples/s, whole job); `x B default`: throughput over backend B's default "
              "configuration (> 1: faster)." + own + judged)


def _backends_section(doc: Document, request: Mapping[str, Any], df: Any, rank: Any,
                      base: Mapping[str, Any]) -> None:
    import pandas as pd

    doc.heading("Each backend's best")
    ok = answer._ok(df)
    rows = []
    for _, r in answer.best_per_backend(request, df).iterrows():
        b = str(r["backend"])
        d = base.get(b)
        rows.append({"backend": b, "best configuration": r["configuration"],
                     "iteration_time_ms": _ms(r["iteration_time_s"]),
                     "throughput": float(r["throughput"]),
                     "default_ms": _ms(d["iteration_time_s"]) if d is not None else math.nan,
                     "x its default": answer.gain(r, d) if d is not None else math.nan,
                     "trials": int((ok["backend"] == b).sum()),
                     **memory_cells(request, b, r)})
    device = (request.get("cluster") or {}).get("device")
    memory = (" `model_states_gb`: each GPU's parameters, gradients and Adam states in mixed "
              "precision, 2 + 2 + 12 bytes per parameter divided by the ranks for what the "
              "configuration shards (ZeRO paper, section 3); `fits`: within the "
              f"{device}'s memory, activations not counted." if rows and "fits" in rows[0]
              else "")
    doc.table(pd.DataFrame(rows), caption="Fastest backend first; `default_ms`: its default "
              "configuration's iteration time." + memory)


def _memory_line(request: Mapping[str, Any], best: Any, rank: Any,
                 rec: answer.Recommendation | None) -> str:
    """Return the answer's memory line: the faster configurations passed over because their
    model states do not fit the device (:func:`memory_cells`), or, where none fits, that the
    answer does not either; else ''."""
    device = (request.get("cluster") or {}).get("device")
    rule = (f"the {device}'s {_device_gb(device):g} GB (ZeRO paper, section 3: 2 + 2 + 12 "
            f"bytes per parameter in mixed-precision Adam, divided by the ranks for what is "
            f"sharded)")
    if rec is not None and rec.too_large:
        faster = [i for i in rec.too_large if i < rec.index]
        if not faster:
            return ""
        rows = [rank.iloc[i] for i in faster[:3]]
        passed = "; ".join(
            f"`{r['configuration']}`, {_ms(r['iteration_time_s']):.4g} ms, "
            f"{memory_cells(request, str(r['backend']), r)['model_states_gb']:,.1f} GB"
            for r in rows)
        more = f" (and {len(faster) - 3} more)" if len(faster) > 3 else ""
        return (f"Memory: faster, but their model states per GPU do not fit {rule}, so not "
                f"recommended: {passed}{more}.")
    cells = memory_cells(request, str(best["backend"]), best)
    if not cells or cells["fits"]:
        return ""
    return (f"Memory: its model states need {cells['model_states_gb']:,.1f} GB per GPU, more "
            f"than {rule}: it would not fit, and no configuration tried fits.")


def _device_gb(device: Any) -> float:
    from ddpbench.simulator.sharded import DEVICE_MEMORY_GB

    return DEVICE_MEMORY_GB.get(str(device), math.nan)


def memory_cells(request: Mapping[str, Any], backend: str, r: Any) -> dict[str, Any]:
    """Return the ``model_states_gb`` and ``fits`` cells of a backend's best configuration
    (:func:`ddpbench.simulator.sharded.model_state_bytes` against the device's memory), or
    none where the workload or the device's memory is unknown."""
    from ddpbench.simulator import load_workload
    from ddpbench.simulator.sharded import DEVICE_MEMORY_GB, model_state_bytes

    c = request.get("cluster") or {}
    device = c.get("device")
    if device not in DEVICE_MEMORY_GB:
        return {}
    try:
        params = load_workload(str(request.get("workload"))).total_params
    except (OSError, ValueError):
        return {}
    knobs = {k: r[k] for k in ("stage", "sharding_strategy")
             if k in r.index and r[k] == r[k] and r[k] is not None}
    if "stage" in knobs:
        knobs["stage"] = int(knobs["stage"])
    gpus = int(c.get("gpus_per_host", 1))
    ranks = int(c.get("workers") or int(c.get("hosts") or 1) * gpus)
    need = model_state_bytes(params, ranks, backend, knobs, gpus)
    return {"model_states_gb": need / 1e9, "fits": need <= DEVICE_MEMORY_GB[device] * 1e9}


def _failed_section(doc: Document, request: Mapping[str, Any], df: Any) -> None:
    if not len(df) or not (df["status"] == "failed").any():
        return
    failed = df[df["status"] == "failed"]
    cols = [c for c in ("trial", "backend", "error") if c in failed.columns]
    doc.heading("Failed trials")
    doc.table(failed[cols])


# -- importances -----------------------------------------------------------------------------
def _load_study(folder: Path) -> Any:
    """Return the tune's optuna study, or an error text when it cannot be loaded."""
    db = Path(folder) / answer.STUDY_FILE
    if not db.is_file():
        return f"no `{answer.STUDY_FILE}` in the folder"
    try:
        import optuna
    except ImportError:
        return "optuna is not installed"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.load_study(study_name=answer.STUDY_NAME, storage=f"sqlite:///{db}")
    except (KeyError, ValueError, RuntimeError) as err:
        return f"cannot load the study: {err}"


def stop_info(folder: Path) -> dict[str, Any] | None:
    """Return what the last run recorded when it stopped on the compute-only bound (its
    ``within``, ``compute_s``, ``best_s``, ``finished``), or None."""
    study = _load_study(folder)
    if isinstance(study, str):
        return None
    info = study.user_attrs.get("stop")
    return dict(info) if isinstance(info, Mapping) else None


def importances(folder: Path, request: Mapping[str, Any]
                ) -> tuple[dict[str, dict[str, float]], list[str]]:
    """Return backend -> knob -> importance from the study, and notes on what was skipped.

    Each backend's knobs are assessed on its own trials (optuna uses the trials that hold
    every parameter asked for, and a backend's parameters are named ``<backend>.<knob>``);
    a conditional knob is left out unless every one of the backend's trials has it. fANOVA
    needs at least two completed trials whose values differ.
    """
    notes: list[str] = []
    db = Path(folder) / answer.STUDY_FILE
    if not db.is_file():
        return {}, [f"no `{answer.STUDY_FILE}` in the folder: no importances"]
    try:
        import optuna
        from optuna.trial import TrialState
    except ImportError:
        return {}, ["optuna is not installed: no importances"]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.load_study(study_name=answer.STUDY_NAME, storage=f"sqlite:///{db}")
    except (KeyError, ValueError, RuntimeError) as err:
        return {}, [f"cannot load the study: {err}"]
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    out: dict[str, dict[str, float]] = {}
    for backend in request.get("backends") or []:
        backend = str(backend)
        names = [_param_name(request, backend, k) for k in answer.knob_columns(request, backend)]
        trials = [t for t in done if t.params.get("backend", backend) == backend]
        if not names:
            continue  # nothing searched: its default only
        names = [n for n in names if trials and all(n in t.params for t in trials)]
        if not names:
            notes.append(f"{backend}: no knob was searched in every one of its trials")
            continue
        values = {t.value for t in trials}
        if len(trials) < 2 or len(values) < 2:
            notes.append(f"{backend}: {len(trials)} completed trial(s) with "
                         f"{len(values)} distinct value(s); importances need at least two "
                         "that differ")
            continue
        if len(names) == 1:
            notes.append(f"{backend}: one knob searched ({names[0].removeprefix(backend + '.')}"
                         "), its importance 1 by definition")
            continue
        try:
            imp = optuna.importance.get_param_importances(
                study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0),
                params=names)
        except (RuntimeError, ValueError) as err:
            notes.append(f"{backend}: {err}")
            continue
        out[backend] = {n.removeprefix(f"{backend}."): float(v) for n, v in imp.items()}
    return out, notes


def _param_name(request: Mapping[str, Any], backend: str, knob: str) -> str:
    for key, e in (request.get("space") or {}).items():
        if (e or {}).get("backend", key.rpartition(".")[0]) == backend and \
                (e or {}).get("knob", key.rpartition(".")[2]) == knob:
            return str(key)
    return f"{backend}.{knob}"


# -- plots -----------------------------------------------------------------------------------
def _palette(plt: Any, backends: list[str]) -> dict[str, Any]:
    return {b: plt.get_cmap("tab10")(i % 10) for i, b in enumerate(backends)}


def _plot_best_so_far(plt: Any, doc: Document, df: Any, folder: Path) -> list[Path]:
    ok = answer._ok(df)
    if "trial" not in ok.columns:
        return []
    ok = ok.sort_values("trial")
    colors = _palette(plt, list(dict.fromkeys(df["backend"])))
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    # The scale ends a little above the slowest default: a far slower trial (a knob at the
    # edge of its range) would flatten the region where the search converges.
    defaults_ms = ok[ok["is_default"]]["iteration_time_s"] * 1e3
    times_ms = ok["iteration_time_s"] * 1e3
    top = float(defaults_ms.max()) * 1.15 if len(defaults_ms) else float(times_ms.max())
    off = times_ms > top
    for b, grp in ok.groupby("backend", sort=False):
        inside = grp[~off.loc[grp.index]]
        ax.scatter(inside["trial"], inside["iteration_time_s"] * 1e3, s=12, alpha=0.6,
                   color=colors[b], label=str(b))
        above = grp[off.loc[grp.index]]
        if len(above):
            ax.scatter(above["trial"], [top] * len(above), marker="^", s=24, alpha=0.8,
                       color=colors[b], clip_on=False)
    ax.step(ok["trial"], times_ms.cummin(), where="post", color="black", lw=1.5,
            label="best so far")
    if off.any():
        ax.set_ylim(top=top)
    ax.set_xlabel("trial")
    ax.set_ylabel("predicted iteration time (ms)")
    ax.set_title("Best iteration time so far against trials"
                 + (f"\n(^ at the top: {int(off.sum())} slower trials, off the scale)"
                    if off.any() else ""), fontsize=11)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    path = folder / "best_so_far.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    doc.image(path.relative_to(folder), "best iteration time so far against trials")
    return [path]


def _plot_backends(plt: Any, doc: Document, request: Mapping[str, Any], df: Any,
                   base: Mapping[str, Any], folder: Path) -> list[Path]:
    best = answer.best_per_backend(request, df)
    names = [str(b) for b in best["backend"]]
    colors = _palette(plt, list(dict.fromkeys(df["backend"])))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(names) + 2), 4.2))
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], best["iteration_time_s"] * 1e3, width=0.4,
           color=[colors[b] for b in names], label="best found")
    dflt = [_ms(base[b]["iteration_time_s"]) if b in base else math.nan for b in names]
    ax.bar([x + 0.2 for x in xs], dflt, width=0.4, color=[colors[b] for b in names],
           alpha=0.35, hatch="//", label="default")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(names)
    ax.set_ylabel("predicted iteration time (ms)")
    ax.set_title("Each backend's best configuration beside its default")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    path = folder / "backends.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    doc.image(path.relative_to(folder), "each backend's best and default iteration time")
    return [path]


def _axis_values(values: Any) -> tuple[list[float], list[str] | None]:
    """Return plottable x values and, for categories, their tick labels."""
    vals = [answer._value(v) for v in values]
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
        return [float(v) for v in vals], None
    labels = sorted({format_value(v) for v in vals})
    return [float(labels.index(format_value(v))) for v in vals], labels


def _plot_knobs(plt: Any, doc: Document, request: Mapping[str, Any], df: Any, backend: str,
                imp: Mapping[str, float], folder: Path) -> list[Path]:
    ok = answer._ok(df)
    ok = ok[ok["backend"] == backend]
    knobs = answer.knob_columns(request, backend, df)
    knobs = sorted(knobs, key=lambda k: -imp.get(k, -1.0)) if imp else knobs
    knobs = [k for k in knobs if ok[k].notna().sum() > 1][:2]
    if not knobs:
        doc.text(f"No knob of {backend} varies over its trials: no knob plot.")
        return []
    space = {k: e for b, k, e in answer._space(request) if b == backend}
    fig, ax = plt.subplots(figsize=(6.5, 4.8))
    x, xl = _axis_values(ok[knobs[0]])
    time_ms = (ok["iteration_time_s"] * 1e3).tolist()
    if len(knobs) == 2:
        y, yl = _axis_values(ok[knobs[1]])
        sc = ax.scatter(x, y, c=time_ms, cmap="viridis_r", s=25, edgecolors="none")
        fig.colorbar(sc, ax=ax, label="predicted iteration time (ms)")
        _scale(ax, "y", space.get(knobs[1], {}), yl)
        ax.set_ylabel(knobs[1])
        i = time_ms.index(min(time_ms))
        ax.scatter([x[i]], [y[i]], marker="*", s=160, color="red", label="best")
        ax.legend(fontsize=8, frameon=False)
    else:
        ax.scatter(x, time_ms, s=20, color="tab:blue")
        ax.set_ylabel("predicted iteration time (ms)")
    _scale(ax, "x", space.get(knobs[0], {}), xl)
    ax.set_xlabel(knobs[0])
    which = "the two most important knobs" if imp and len(knobs) == 2 else \
        "its most important knob" if imp else f"its knob{'s' if len(knobs) > 1 else ''}"
    ax.set_title(f"{backend}: iteration time over {which}")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = folder / "knobs.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    doc.image(path.relative_to(folder), f"{backend}'s trials over {', '.join(knobs)}")
    return [path]


def _scale(ax: Any, axis: str, entry: Mapping[str, Any], labels: list[str] | None) -> None:
    if labels is not None:
        getattr(ax, f"set_{axis}ticks")(range(len(labels)))
        getattr(ax, f"set_{axis}ticklabels")(labels)
    elif entry.get("log") or entry.get("scale") == "log":
        getattr(ax, f"set_{axis}scale")("log")


def _plot_importances(plt: Any, doc: Document, imps: Mapping[str, Mapping[str, float]],
                      notes: list[str], folder: Path) -> list[Path]:
    if notes:
        doc.text("Parameter importances skipped for " + "; ".join(notes) + ".")
    if not imps:
        return []
    n = len(imps)
    ncols = min(n, 3)
    nrows = math.ceil(n / ncols)
    height = 0.5 * max(len(v) for v in imps.values()) + 1.6
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, height * nrows + 0.4),
                             squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    for ax, (backend, imp) in zip(flat, imps.items()):
        names = list(imp)[::-1]
        ax.barh(names, [imp[k] for k in names], color="tab:blue")
        ax.set_xlim(0, 1)
        ax.set_title(backend)
        ax.set_xlabel("importance (fANOVA, sums to 1)")
        ax.grid(alpha=0.3, axis="x")
    fig.suptitle("optuna's parameter importances, each backend on its own trials", fontsize=11)
    fig.tight_layout()
    path = folder / "importances.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    doc.image(path.relative_to(folder), "parameter importances")
    return [path]
