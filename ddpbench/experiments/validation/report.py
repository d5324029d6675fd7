"""The ``validation`` kind's report: published against simulated, one row per point."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ddpbench import hardware
from ddpbench.experiments.report import Document, pyplot
from ddpbench.experiments.validation import data
from ddpbench.experiments.validation.spec import Spec

__all__ = ["render", "summary"]

_P3_ORDER = ("p3_vgg19_peak", "p3_sockeye_peak", "p3_resnet50_peak")


def _setting_text(point: data.Point) -> str:
    s = point.setting
    parts = [s.workload]
    if s.hosts is not None:
        parts.append(f"{s.hosts} hosts x {s.gpus_per_host} GPU")
    if s.device:
        parts.append(s.device)
    if s.batch_size:
        parts.append(f"batch {s.batch_size}")
    bw = f"{s.bandwidth_gbps:g} Gbps" if s.bandwidth_gbps else "bandwidth swept"
    parts.append(f"{bw} {s.transport}")
    if s.gpus_per_host > 1:
        parts.append(s.intra_link)
    if s.nccl_proto is not None:
        parts.append(f"NCCL_PROTO={s.nccl_proto}")
    if s.nccl_algo is not None:
        parts.append(f"NCCL_ALGO={s.nccl_algo}")
    if s.nccl_version is not None:
        parts.append(f"NCCL {s.nccl_version}")
    if s.nccl_channels is not None:
        parts.append(f"{s.nccl_channels} channels")
    if s.nccl_socket_flows is not None:
        parts.append(f"{s.nccl_socket_flows} sockets per connection")
    what = point.backend + "".join(f" {k}={v}" for k, v in point.backend_knobs.items())
    if point.baseline:
        what += f" vs {point.baseline}" + "".join(
            f" {k}={v}" for k, v in point.baseline_knobs.items())
        if point.baseline_transport:
            what += f" over {point.baseline_transport}"
    parts.append(what)
    text = ", ".join(parts)
    if point.assumed:
        text += f" (assumed: {', '.join(point.assumed)})"
    return text


def _num(value: Any) -> float | None:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _median(xs: list[float]) -> float | None:
    """Return the median of ``xs`` (the mean of the middle two for an even count), or None."""
    if not xs:
        return None
    xs = sorted(xs)
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


def _is_sensitivity(df: Any) -> Any:
    """Return a boolean mask of ``df``'s sensitivity rows (shown, never scored)."""
    if "sensitivity" not in df.columns:
        return df["id"].map(lambda _: False).astype(bool)
    return df["sensitivity"].map(lambda v: isinstance(v, str) and bool(v)).astype(bool)


def _score(errs: list[float], pinned: list[float], spec: Spec) -> dict[str, Any]:
    return {"scored": len(errs), "median_abs_error": _median(errs),
            "max_abs_error": max(errs) if errs else None,
            "beyond_max": sum(e > spec.target_max for e in errs),
            "beyond_test_max": sum(e > spec.test_target_max for e in errs),
            "pinned_scored": len(pinned), "pinned_median_abs_error": _median(pinned)}


def summary(df: Any, spec: Spec) -> dict[str, Any]:
    """Return the scores: median and largest |error|, over all scored points, over fully
    pinned ones, and per split (``"fit"``, ``"test"``; sensitivity rows left out)."""
    pub = data.load(spec.published)
    by_id = {p.id: p for p in pub.points}
    df = df[~_is_sensitivity(df)]
    errs: dict[str, list[float]] = {"all": [], **{k: [] for k in data.SPLITS}}
    pinned: dict[str, list[float]] = {k: [] for k in errs}
    points = {k: 0 for k in errs}
    for _, row in df.iterrows():
        p = by_id[row["id"]]
        points["all"] += 1
        points[p.split] += 1
        e = _num(row.get("rel_error"))
        if e is None:
            continue
        for k in ("all", p.split):
            errs[k].append(abs(e))
            if not p.assumed:
                pinned[k].append(abs(e))
    out = {"points": len(df), **_score(errs["all"], pinned["all"], spec),
           "sources": len({row["source"] for _, row in df.iterrows()})}
    for k in data.SPLITS:
        out[k] = {"points": points[k], **_score(errs[k], pinned[k], spec)}
    return out


def targets_met(s: dict[str, Any], spec: Spec) -> dict[str, bool]:
    """Return which targets a :func:`summary` meets: the fit split's median, the test
    split's median and largest error, every point within ``target_max``."""
    fit, test = s["fit"], s["test"]
    return {
        "fit_median": fit["median_abs_error"] is not None
        and fit["median_abs_error"] <= spec.target_median,
        "test_median": test["median_abs_error"] is not None
        and test["median_abs_error"] <= spec.test_target_median,
        "test_max": test["scored"] > 0 and test["beyond_test_max"] == 0,
        "every_point": s["scored"] > 0 and s["beyond_max"] == 0,
    }


def curve_slopes(df: Any, by_id: dict[str, data.Point]) -> list[dict[str, Any]]:
    """Return one entry per published curve (points sharing ``curve``), its points in order
    of GPU count (then bandwidth), and whether each step's simulated change has the sign of
    the published one (a change under 1% either way counts as flat, which agrees with
    either sign); ``simulated`` holds the points' simulated values, in the same order."""
    sims = {str(r["id"]): _num(r.get("simulated")) for _, r in df.iterrows()}
    curves: dict[str, list[data.Point]] = {}
    for pid in sims:
        p = by_id[pid]
        if p.curve and p.simulate:
            curves.setdefault(p.curve, []).append(p)
    out = []
    for name, pts in curves.items():
        pts.sort(key=lambda q: ((q.setting.hosts or 1) * q.setting.gpus_per_host,
                                q.setting.bandwidth_gbps or 0.0, q.setting.message_bytes or 0))
        agree: list[bool | None] = []
        for a, b in zip(pts, pts[1:]):
            sa, sb = sims[a.id], sims[b.id]
            if sa is None or sb is None:
                agree.append(None)
                continue
            pub_d, sim_d = b.value / a.value - 1, sb / sa - 1
            agree.append(abs(pub_d) < 0.01 or abs(sim_d) < 0.01 or (pub_d > 0) == (sim_d > 0))
        out.append({"curve": name, "points": pts, "agree": agree,
                    "simulated": [sims[q.id] for q in pts],
                    "split": ",".join(sorted({q.split for q in pts}))})
    return out


def curve_scaling(slopes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return, for every point of a throughput curve past its first GPU count, how its
    scaling from the curve's first point (fewest GPUs) compares: ``published`` is
    ``value / first value``, ``simulated`` the same of the simulated values, and ``error``
    ``simulated / published - 1``. Only curves over GPU counts count (one bandwidth, no
    message sizes): the ratio takes the one-GPU or one-host compute out, which a user's own
    profile sets, and leaves what adding GPUs and hosts does. A point keeps its own split
    (``slopes``: :func:`curve_slopes`' entries)."""
    out = []
    for c in slopes:
        pts = c["points"]
        if pts[0].metric != "throughput" or len({p.metric for p in pts}) > 1 \
                or len({p.setting.bandwidth_gbps for p in pts}) > 1:
            continue
        first, s0 = pts[0], c["simulated"][0]
        n0 = (first.setting.hosts or 1) * first.setting.gpus_per_host
        for p, s in zip(pts[1:], c["simulated"][1:]):
            n = (p.setting.hosts or 1) * p.setting.gpus_per_host
            if n == n0 or s0 is None or s is None:
                continue
            pub, sim = p.value / first.value, s / s0
            out.append({"curve": c["curve"], "id": p.id, "split": p.split, "from_gpus": n0,
                        "gpus": n, "published": pub, "simulated": sim,
                        "error": sim / pub - 1})
    return out


def scaling_summary(scaling: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Return per split (and ``"both"``) the :func:`curve_scaling` points' count, curves,
    median and largest |error| and how many are beyond 25%."""
    out = {}
    for k in (*data.SPLITS, "both"):
        rows = [r for r in scaling if k == "both" or r["split"] == k]
        errs = [abs(r["error"]) for r in rows]
        out[k] = {"points": len(rows), "curves": len({r["curve"] for r in rows}),
                  "median_abs_error": _median(errs),
                  "max_abs_error": max(errs) if errs else None,
                  "beyond_25": sum(e > 0.25 for e in errs)}
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def render(df: Any, outdir: Path, spec: Spec) -> list[Path]:
    """Write report.md/html, the scatter of published against simulated and the error bars."""
    pub = data.load(spec.published)
    by_id = {p.id: p for p in pub.points}
    outdir.mkdir(parents=True, exist_ok=True)
    df, sens_df = _published_rows(df, pub)
    s = summary(df, spec)
    doc = Document("Validation against published measurements")
    doc.text(
        f"{s['points']} published points from {s['sources']} sources; {s['scored']} simulated "
        f"and scored. The `fit` split holds the points looked at while the model's "
        f"mechanisms were chosen; the `test` split holds points set aside before any of them "
        f"was simulated, to score the model once it is frozen.")
    slopes = curve_slopes(df, by_id)
    scaling = curve_scaling(slopes)
    _scores(doc, s, spec, slopes)
    if scaling:
        _scaling(doc, scaling)
    _every_point(doc, df, pub, by_id)
    if slopes:
        _curves(doc, slopes, scaling)
    _p3_ordering(doc, df, by_id)
    _constants(doc, df, by_id)
    _mechanisms_and_notes(doc, spec)
    if spec.sensitivity:
        _sensitivity(doc, df, sens_df, by_id, spec)

    paths = _plots(df, by_id, outdir, spec, doc, sens_df)
    return [*doc.write(outdir), *paths]


def _published_rows(df: Any, pub: data.Published) -> tuple[Any, Any]:
    """Keep the rows of published points, in the published order; return the scored rows
    and the sensitivity rows apart."""
    by_id = {p.id: p for p in pub.points}
    df = df[[str(i) in by_id for i in df["id"]]].copy()
    sensitive = _is_sensitivity(df)
    sens_df, df = df[sensitive], df[~sensitive]
    order = {p.id: i for i, p in enumerate(pub.points)}
    df["_order"] = [order[i] for i in df["id"]]
    return df.sort_values("_order"), sens_df


def _scores(doc: Document, s: dict[str, Any], spec: Spec,
            slopes: list[dict[str, Any]]) -> None:
    """Table the scores per split and both together; say which targets are met."""
    import pandas as pd

    met = targets_met(s, spec)
    split_rows = []
    for k, target_med in (("fit", spec.target_median), ("test", spec.test_target_median)):
        t = s[k]
        split_rows.append({
            "split": k, "points": t["points"], "scored": t["scored"],
            "median abs. error": _pct(t["median_abs_error"]),
            "target median": f"<= {_pct(target_med)}",
            "largest": _pct(t["max_abs_error"]),
            f"beyond {_pct(spec.target_max)}": t["beyond_max"],
            f"beyond {_pct(spec.test_target_max)}": t["beyond_test_max"],
            "pinned (median)": f"{t['pinned_scored']} ({_pct(t['pinned_median_abs_error'])})",
        })
    split_rows.append({
        "split": "both", "points": s["points"], "scored": s["scored"],
        "median abs. error": _pct(s["median_abs_error"]), "target median": "-",
        "largest": _pct(s["max_abs_error"]),
        f"beyond {_pct(spec.target_max)}": s["beyond_max"],
        f"beyond {_pct(spec.test_target_max)}": s["beyond_test_max"],
        "pinned (median)": f"{s['pinned_scored']} ({_pct(s['pinned_median_abs_error'])})"})
    doc.table(pd.DataFrame(split_rows))
    wrong = [c["curve"] for c in slopes if any(a is False for a in c["agree"])]
    doc.text(
        f"Targets: fit median {'met' if met['fit_median'] else 'NOT met'}; test median "
        f"{'met' if met['test_median'] else 'NOT met'}; no test point beyond "
        f"{_pct(spec.test_target_max)}: {'met' if met['test_max'] else 'NOT met'}; every point "
        f"within {_pct(spec.target_max)}: {'met' if met['every_point'] else 'NOT met'}; "
        f"{len(slopes) - len(wrong)} of {len(slopes)} published curves with every step's "
        f"slope of the published sign" + (f" (not: {', '.join(wrong)})" if wrong else "") + ".")


def _scaling(doc: Document, scaling: list[dict[str, Any]]) -> None:
    """Table :func:`scaling_summary` per split: what adding GPUs and hosts does."""
    import pandas as pd

    doc.text(
        "What adding GPUs and hosts does, apart from one GPU's speed: each throughput curve's "
        "scaling from its first point (fewest GPUs), simulated over published, at every later "
        "point (shown, not a target; the per-point errors are in the curves' table):")
    rows = []
    for k, t in scaling_summary(scaling).items():
        rows.append({"split": k, "curves": t["curves"], "points": t["points"],
                     "median abs. error": _pct(t["median_abs_error"]),
                     "largest": _pct(t["max_abs_error"]), "beyond 25.0%": t["beyond_25"]})
    doc.table(pd.DataFrame(rows))


def _every_point(doc: Document, df: Any, pub: data.Published,
                 by_id: dict[str, data.Point]) -> None:
    """One row per point: its source and quote, setting, published and simulated value."""
    import pandas as pd

    rows = []
    for _, row in df.iterrows():
        p = by_id[row["id"]]
        src = pub.sources[p.source]
        sim = _num(row.get("simulated"))
        err = _num(row.get("rel_error"))
        status = row.get("status", "ok")
        note = row.get("note") if isinstance(row.get("note"), str) else ""
        if status == "failed":
            note = str(row.get("error", ""))
        rows.append({
            "id": p.id, "split": p.split,
            "source": f"{src.title} ({p.where}): \"{p.quote}\"",
            "setting": _setting_text(p), "metric": p.metric,
            "published": f"{p.value:g}",
            "simulated": "-" if sim is None else f"{sim:.3g}",
            "error": "-" if err is None else f"{100 * err:+.1f}%",
            "note": note or "",
        })
    doc.heading("Every point")
    doc.table(pd.DataFrame(rows))


def _p3_ordering(doc: Document, df: Any, by_id: dict[str, data.Point]) -> None:
    """Compare the P3 paper's ordering of peak gains with the simulated one, and the peak
    bandwidths."""
    doc.heading("The P3 paper's ordering of gains")
    peaks = {r["id"]: (_num(r.get("simulated")), _num(r.get("peak_bandwidth_gbps")))
             for _, r in df.iterrows() if r["id"] in _P3_ORDER}
    if len(peaks) != len(_P3_ORDER):
        doc.text("Not all three P3 peak-gain points ran; the ordering is not checked.")
        return
    pub_order = sorted(_P3_ORDER, key=lambda i: -by_id[i].value)
    sim_order = sorted(_P3_ORDER, key=lambda i: -(peaks[i][0] or 0.0))
    names = {i: by_id[i].setting.workload for i in _P3_ORDER}
    doc.text("Published: " + " > ".join(f"{names[i]} ({by_id[i].value:g}x)" for i in pub_order)
             + ". Simulated: " + " > ".join(
                 f"{names[i]} ({peaks[i][0] or 0:.2f}x at {peaks[i][1] or 0:g} Gbps)"
                 for i in sim_order)
             + ". Ordering " + ("reproduced." if pub_order == sim_order else "NOT reproduced."))
    pb = {r["id"]: _num(r.get("simulated")) for _, r in df.iterrows()
          if by_id[r["id"]].metric == "peak_bandwidth"}
    if pb:
        doc.text("Peak bandwidths (published -> simulated): " + "; ".join(
            f"{by_id[i].setting.workload} {by_id[i].value:g} -> {v or 0:g} Gbps"
            for i, v in pb.items()) + ". The paper states no peak bandwidth for Sockeye.")


def _constants(doc: Document, df: Any, by_id: dict[str, data.Point]) -> None:
    """List the hardware table's entries that the simulated points use, with their sources."""
    doc.heading("Constants and how they were chosen")
    used_t = sorted({by_id[i].setting.transport for i in df["id"] if by_id[i].simulate})
    used_d = sorted({str(by_id[i].setting.device) for i in df["id"]
                     if by_id[i].simulate and by_id[i].setting.device})
    used_l = sorted({by_id[i].setting.intra_link for i in df["id"]
                     if by_id[i].simulate and by_id[i].setting.gpus_per_host > 1})
    items = [_transport_line(hardware.transport(t)) for t in used_t]
    items += [f"device {d}: {hardware.device(d).fp32_tflops:g} TFLOP/s fp32, "
              f"{hardware.device(d).mem_gbps:g} GB/s; {hardware.device(d).source}"
              for d in used_d]
    slowed = [d for d in used_d if hardware.device(d).overlap_slowdown]
    if slowed:
        figures = sorted({hardware.device(d).overlap_slowdown for d in slowed})
        items.append(f"compute overlapped by the GPUs' own collectives (ring allreduce, "
                     f"intra-host reduction) takes {', '.join(f'{x:.1%}' for x in figures)} "
                     f"longer on {', '.join(slowed)}: {hardware.OVERLAP_SOURCE}")
    items += [f"intra-host link {x}: {hardware.intra_link(x).bandwidth_gbps:g} Gbit/s; "
              f"{hardware.intra_link(x).source}" for x in used_l]
    if any(hardware.device(d).compute_capability is not None for d in used_d):
        protos = "; ".join(f"{p.name} {p.base_us:g} us + per step "
                           + ", ".join(f"{k} {v:g}" for k, v in p.step_us.items()) + " us"
                           for p in hardware.NCCL_PROTOCOLS)
        items.append("a named GPU's rings on a real transport run NCCL's own cost model "
                     f"(ddpbench.hardware.nccl_ring): {protos}; Simple x1.9 across hosts "
                     f"below compute capability 8.0 (x1.4 from it); {hardware.NCCL_SOURCE}")
    doc.text("Every constant is the simulator's table entry (ddpbench.hardware), set once "
             "per transport, device and link from datasheets, protocol overheads and "
             "published measurements; none is set from a test point, one set from a fit "
             "point says so in its source (EFA's efficiency), and no point sets its own.")
    doc.bullets(items)


def _mechanisms_and_notes(doc: Document, spec: Spec) -> None:
    """Table the spec's mechanisms (the split each was chosen on) and list its notes."""
    import pandas as pd

    if spec.mechanisms:
        doc.heading("Mechanisms: the split each was chosen on, and what it did to both")
        doc.table(pd.DataFrame([{"mechanism": m.name, "source": m.source,
                                 "chosen on": m.chosen_on, "fit (without -> with)": m.fit,
                                 "test (without -> with)": m.test}
                                for m in spec.mechanisms]))

    if spec.notes:
        doc.heading("Why the misses")
        doc.bullets(list(spec.notes))


def _curves(doc: Document, slopes: list[dict[str, Any]],
            scaling: list[dict[str, Any]]) -> None:
    """One row per published curve: its points in order, published and simulated, whether
    each step's simulated slope has the published sign, and (throughput over GPU counts)
    each later point's scaling error from the first (:func:`curve_scaling`)."""
    import pandas as pd

    scaled = {r["id"]: r["error"] for r in scaling}
    doc.heading("Published curves: slopes")
    rows = []
    for c in slopes:
        pts = c["points"]
        xs = []
        for p in pts:
            st = p.setting
            x = f"{(st.hosts or 1) * st.gpus_per_host} GPUs"
            if p.metric == "bus_bandwidth":
                x = f"{st.message_bytes / 2**20:g} MiB @ {x}"
            elif len({q.setting.bandwidth_gbps for q in pts}) > 1:
                x = f"{st.bandwidth_gbps:g} Gbps"
            xs.append(x)
        sim = ["-" if v is None else f"{v:.3g}" for v in c["simulated"]]
        rows.append({
            "curve": c["curve"], "split": c["split"], "metric": pts[0].metric,
            "at": ", ".join(xs),
            "published": ", ".join(f"{p.value:g}" for p in pts),
            "simulated": ", ".join(sim),
            "slopes agree": "yes" if all(a is not False for a in c["agree"]) else
            "NO (" + ", ".join("ok" if a else "-" if a is None else "wrong"
                               for a in c["agree"]) + ")",
            "scaling from the first": ", ".join(
                f"{100 * scaled[p.id]:+.1f}%" for p in pts if p.id in scaled) or "-"})
    doc.table(pd.DataFrame(rows))


def _sensitivity(doc: Document, df: Any, sens_df: Any, by_id: dict[str, data.Point],
                 spec: Spec) -> None:
    """One table per sensitivity: each chosen point as shipped and at each value tried, and
    what the scores would read with that value on those points (shown, not scored)."""
    import pandas as pd

    from ddpbench.experiments.validation.run import sensitivity_label

    doc.heading("Sensitivity (shown, not scored)")
    shipped = {str(r["id"]): _num(r.get("rel_error")) for _, r in df.iterrows()}
    shipped_sim = {str(r["id"]): _num(r.get("simulated")) for _, r in df.iterrows()}
    got = {(str(r["id"]), str(r["sensitivity"])): (_num(r.get("simulated")),
                                                   _num(r.get("rel_error")))
           for _, r in sens_df.iterrows()}

    def cell(sim: float | None, err: float | None) -> str:
        return "-" if sim is None or err is None else f"{sim:.3g} ({100 * err:+.1f}%)"

    for sens in spec.sensitivity:
        labels = [sensitivity_label(sens.field, v) for v in sens.values]
        doc.text(f"{sens.field} at {', '.join(f'{v:g}' for v in sens.values)} on "
                 f"{len(sens.points)} points. {sens.why}")
        rows = []
        for pid in sens.points:
            row = {"id": pid, "published": f"{by_id[pid].value:g}",
                   "shipped": cell(shipped_sim.get(pid), shipped.get(pid))}
            row.update({lab: cell(*got.get((pid, lab), (None, None))) for lab in labels})
            rows.append(row)
        doc.table(pd.DataFrame(rows))
        lines = []
        for lab in labels:
            errs: dict[str, float | None] = {pid: e for pid, e in shipped.items()
                                             if e is not None}
            missing = [pid for pid in sens.points if got.get((pid, lab), (None, None))[1] is None]
            if missing:
                lines.append(f"{lab}: not run for {', '.join(missing)}")
                continue
            errs.update({pid: got[(pid, lab)][1] for pid in sens.points})
            med = _median([abs(e) for e in errs.values() if e is not None])
            beyond = sorted(pid for pid, e in errs.items()
                            if e is not None and abs(e) > spec.target_max)
            text = (f"{lab} on these points, every other point as shipped: median "
                    f"|error| {_pct(med)}, {len(beyond)} beyond {_pct(spec.target_max)}"
                    + (f" ({', '.join(beyond)})" if beyond else ""))
            if all(pid in sens.points for pid in _P3_ORDER):
                peak = {pid: got[(pid, lab)][0] or 0.0 for pid in _P3_ORDER}
                same = (sorted(_P3_ORDER, key=lambda i: -by_id[i].value)
                        == sorted(_P3_ORDER, key=lambda i: -peak[i]))
                text += "; the P3 paper's ordering of gains " + (
                    "reproduced" if same else "NOT reproduced")
            lines.append(text)
        doc.bullets(lines)


def _plots(df: Any, by_id: dict[str, data.Point], outdir: Path, spec: Spec,
           doc: Document, sens_df: Any = None) -> list[Path]:
    plt = pyplot()
    scored = [(r["id"], by_id[r["id"]], _num(r.get("simulated")), _num(r.get("rel_error")))
              for _, r in df.iterrows() if _num(r.get("rel_error")) is not None]
    if not scored:
        return []
    paths = []
    ratio = [x for x in scored if x[1].metric in ("speedup", "peak_speedup",
                                                  "scaling_efficiency")]
    fig, ax = plt.subplots(figsize=(6.5, 6))
    markers = {"speedup": "o", "peak_speedup": "^", "scaling_efficiency": "s"}
    for metric, marker in markers.items():
        pts = [x for x in ratio if x[1].metric == metric]
        if pts:
            ax.scatter([x[1].value for x in pts], [x[2] for x in pts], marker=marker,
                       label=metric)
            for pid, p, sim, _ in pts:
                ax.annotate(pid, (p.value, sim), fontsize=6, alpha=0.7)
    lo = min([x[1].value for x in ratio] + [x[2] or 0 for x in ratio] + [0.5])
    hi = max([x[1].value for x in ratio] + [x[2] or 0 for x in ratio] + [1.0])
    xs = [lo, hi]
    ax.plot(xs, xs, "k-", lw=0.8, label="simulated = published")
    ax.fill_between(xs, [x * (1 - spec.target_max) for x in xs],
                    [x * (1 + spec.target_max) for x in xs], color="grey", alpha=0.15,
                    label=f"±{100 * spec.target_max:g}%")
    ax.set_xlabel("published")
    ax.set_ylabel("simulated")
    ax.set_title("Speedups and scaling efficiencies: published against simulated")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = outdir / "published_vs_simulated.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
    doc.image(path, "published against simulated")

    fig, ax = plt.subplots(figsize=(8, 0.3 * len(scored) + 1.5))
    names = [x[0] for x in scored]
    errs = [100 * (x[3] or 0.0) for x in scored]
    colors = ["tab:red" if abs(e) > 100 * spec.target_max else "tab:blue" for e in errs]
    ax.barh(names, errs, color=colors)
    ax.axvline(0, color="k", lw=0.8)
    for sign in (-1, 1):
        ax.axvline(sign * 100 * spec.target_max, color="grey", ls="--", lw=0.8)
    ax.invert_yaxis()
    ax.set_xlabel("relative error, % (simulated / published - 1)")
    ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    path = outdir / "errors.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
    doc.image(path, "relative error per point")

    curves = [(r["id"], by_id[r["id"]], r.get("sweep")) for _, r in df.iterrows()
              if by_id[r["id"]].metric == "peak_speedup" and isinstance(r.get("sweep"), str)]
    if curves:
        fields = [None, *dict.fromkeys(sens.field for sens in spec.sensitivity)]
        for field in fields:
            # The shipped sweeps; then, one figure per sensitivity field, the same sweeps
            # at each value tried (thin, dashed, in the shipped curve's colour).
            tried: dict[str, list[tuple[str, str]]] = {}
            if field is not None and sens_df is not None:
                for _, r in sens_df.iterrows():
                    if (str(r["sensitivity"]).startswith(f"{field}=")
                            and isinstance(r.get("sweep"), str)):
                        tried.setdefault(str(r["id"]), []).append(
                            (str(r["sensitivity"]), str(r["sweep"])))
                if not tried:
                    continue
            path = outdir / ("peak_gain_sweep.png" if field is None
                             else f"peak_gain_sweep_{field}.png")
            _sweep_figure(plt, curves, by_id, tried, path, field)
            paths.append(path)
            doc.image(path, "speedup against bandwidth, simulated, with the published peaks"
                      if field is None else f"the same sweeps with {field} at the values "
                      "tried (sensitivity, not scored)")
    return paths


def _sweep_figure(plt: Any, curves: list[tuple[str, data.Point, str]],
                  by_id: dict[str, data.Point], tried: dict[str, list[tuple[str, str]]],
                  path: Path, field: str | None) -> None:
    """Draw the peak-gain sweeps (and a sensitivity's sweeps of the same points) to ``path``."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for pid, p, text in curves:
        sweep = {float(k): float(v) for k, v in json.loads(text).items()}
        bws = sorted(sweep)
        line, = ax.plot(bws, [sweep[b] for b in bws], marker="o", ms=3,
                        label=f"{p.setting.workload} simulated")
        peak_bw = next((q.value for q in by_id.values() if q.metric == "peak_bandwidth"
                        and q.setting.workload == p.setting.workload
                        and q.source.startswith("p3")), None)
        ax.axhline(p.value, color=line.get_color(), ls=":", lw=0.9,
                   label=f"{p.setting.workload} published peak {p.value:g}x")
        if peak_bw is not None:
            ax.plot([peak_bw], [p.value], marker="*", ms=12, color=line.get_color())
        for k, (label, other_text) in enumerate(tried.get(pid, [])):
            other = {float(b): float(v) for b, v in json.loads(other_text).items()}
            xs = sorted(other)
            ax.plot(xs, [other[b] for b in xs], ls=("--", "-.", (0, (5, 1, 1, 1, 1, 1)))[k % 3], lw=0.9,
                    color=line.get_color(), alpha=0.8,
                    label=f"{p.setting.workload} at {label.split('=', 1)[1]}")
    ax.set_xscale("log")
    ax.set_xlabel("bandwidth, Gbit/s (log)")
    ax.set_ylabel(f"speedup of {curves[0][1].backend} over {curves[0][1].baseline}")
    ax.set_title("Peak gains over the bandwidth sweep (stars: published peak bandwidth)"
                 if field is None else f"The same sweeps at other values of {field} "
                 "(dashed; sensitivity)")
    ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _transport_line(t: hardware.Transport) -> str:
    socket = ("" if t.socket_gbps is None
              else f", one connection (a ps-lite process's socket, a ring's step to the "
                   f"next host) carries at most {t.socket_gbps:g} Gbit/s")
    large = ("" if t.large_message_bytes is None or not t.page_fault_us
             else f", a received message above {t.large_message_bytes / 2**20:g} MiB costs "
                  f"{t.page_fault_us:g} us per 4 KiB page besides its bytes")
    return (f"transport {t.name}: efficiency {t.efficiency:g}, {t.per_message_us:g} us per "
            f"message{socket}{large}; {t.source}")
