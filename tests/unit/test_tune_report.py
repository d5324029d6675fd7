"""The tune report (``ddpbench.tune.report``) and its answer (``ddpbench.tune.answer``).

A synthetic tune folder is built here as ``ddpbench tune`` writes one (docs: the tune
tutorial): ``tune.json``, ``results.csv`` and an optuna study in ``study.db`` whose trials
are added with optuna directly. The iteration times are made up (a smooth function of the
knobs) except where a test needs the simulator's own figure.
"""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

optuna = pytest.importorskip("optuna")

from ddpbench import contract  # noqa: E402
from ddpbench.experiments.naming import format_value  # noqa: E402
from ddpbench.experiments.schema import load_experiment  # noqa: E402
from ddpbench.tune import answer, report  # noqa: E402

WORKERS, BATCH = 4, 32
HOROVOD_DEFAULT = {"fusion_threshold": 128 * 1024 * 1024, "cycle_time": 1.0}
BYTEPS_DEFAULT = {"partition_bytes": 4_096_000}
SPACE = {
    "horovod.fusion_threshold": {"backend": "horovod", "knob": "fusion_threshold",
                                 "kind": "int", "scale": "log", "log": True,
                                 "low": 1 << 20, "high": 1 << 30,
                                 "default": HOROVOD_DEFAULT["fusion_threshold"],
                                 "source": "Horovod's autotuner", "unit": "bytes"},
    "horovod.cycle_time": {"backend": "horovod", "knob": "cycle_time", "kind": "float",
                           "scale": "log", "log": True, "low": 0.1, "high": 50.0,
                           "default": 1.0, "source": "Horovod's autotuner", "unit": "ms"},
    "byteps.partition_bytes": {"backend": "byteps", "knob": "partition_bytes", "kind": "int",
                               "scale": "log", "log": True, "low": 1 << 16, "high": 1 << 26,
                               "default": BYTEPS_DEFAULT["partition_bytes"],
                               "source": "ByteScheduler's autotuner", "unit": "bytes"},
}
DISTS = {
    "backend": optuna.distributions.CategoricalDistribution(["horovod", "byteps"]),
    "horovod.fusion_threshold": optuna.distributions.IntDistribution(1 << 20, 1 << 30, log=True),
    "horovod.cycle_time": optuna.distributions.FloatDistribution(0.1, 50.0, log=True),
    "byteps.partition_bytes": optuna.distributions.IntDistribution(1 << 16, 1 << 26, log=True),
}


def _made_up_time(backend: str, knobs: dict[str, Any]) -> float:
    """A smooth, made-up iteration time with its optimum inside the space."""
    if backend == "horovod":
        return (0.60 + 0.01 * abs(math.log2(knobs["fusion_threshold"] / (1 << 25)))
                + 0.002 * knobs["cycle_time"])
    return 0.62 + 0.012 * abs(math.log2(knobs["partition_bytes"] / (1 << 22)))


def _trials() -> list[tuple[str, dict[str, Any], bool]]:
    """(backend, knobs, is_default) of the fixture's trials: both defaults, then a search."""
    rng = np.random.default_rng(0)
    out = [("horovod", dict(HOROVOD_DEFAULT), True), ("byteps", dict(BYTEPS_DEFAULT), True)]
    for i in range(14):
        if i % 2 == 0:
            out.append(("horovod", {"fusion_threshold": int(2 ** rng.uniform(20, 30)),
                                    "cycle_time": float(10 ** rng.uniform(-1, 1.6))}, False))
        else:
            out.append(("byteps", {"partition_bytes": int(2 ** rng.uniform(16, 26))}, False))
    return out


def make_folder(folder: Path, *, cluster: dict[str, Any] | None = None,
                trials: list[tuple[str, dict[str, Any], bool]] | None = None,
                times: dict[int, float] | None = None, failed: str | None = None,
                workload: str = "resnet50") -> list[dict[str, Any]]:
    """Write tune.json, results.csv and study.db as ``ddpbench tune`` does; return the rows."""
    folder.mkdir(parents=True, exist_ok=True)
    c = contract.Cluster(**(cluster or {"workers": WORKERS, "bandwidth_gbps": 10.0,
                                        "transport": "tcp"}))
    request = {"workload": workload, "cluster": c.model_dump(),
               "schedule": contract.Schedule(batch_size=BATCH).model_dump(),
               "backends": ["horovod", "byteps"], "space": SPACE, "fixed": {},
               "dropped": [], "seed": 0}
    (folder / "tune.json").write_text(json.dumps(request, indent=1), encoding="utf-8")
    study = optuna.create_study(study_name="ddpbench-tune", direction="minimize",
                                storage=f"sqlite:///{folder / 'study.db'}")
    rows = []
    for n, (backend, knobs, is_default) in enumerate(trials or _trials()):
        t = (times or {}).get(n, _made_up_time(backend, knobs))
        params = {"backend": backend, **{f"{backend}.{k}": v for k, v in knobs.items()}}
        study.add_trial(optuna.trial.create_trial(
            params=params, distributions={k: DISTS[k] for k in params}, value=t,
            user_attrs={"is_default": is_default, "throughput": WORKERS * BATCH / t}))
        rows.append({"trial": n, "backend": backend, "is_default": is_default, **knobs,
                     "iteration_time_s": t, "throughput": WORKERS * BATCH / t,
                     "status": "ok", "error": ""})
    if failed is not None:
        rows.append({"trial": len(rows), "backend": "byteps", "is_default": False,
                     "partition_bytes": 70000, "status": "failed", "error": failed})
    header = ["trial", "backend", "is_default", "fusion_threshold", "cycle_time",
              "partition_bytes", "iteration_time_s", "throughput", "status", "error"]
    with open(folder / "results.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, header, restval="", lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return rows


# A small fake validation results.csv: real published ids (their settings come from the
# shipped published.yaml), made-up errors.
FAKE_ERRORS = [
    # id, rel_error, sensitivity        backend, transport, GPUs, split
    ("bpsreadme_tcp20_resnet50_horovod_8", -0.10, ""),   # horovod tcp 8 fit
    ("bpsreadme_tcp20_resnet50_horovod_16", 0.05, ""),   # horovod tcp 16 fit
    ("bpsreadme_tcp20_resnet50_horovod_64", 0.30, ""),   # horovod tcp 64 fit
    ("nccl209_gcp_v100_tcp32_2x1", 0.02, ""),            # mpi tcp 2 fit
    ("nccl209_gcp_v100_tcp32_4x1", -0.04, ""),           # mpi tcp 4 fit
    ("p3_resnet50_4g", 0.20, ""),                        # p3 tcp 4 fit
    ("p3_resnet50_4g", 0.90, "socket_gbps=8"),           # a sensitivity row: never scored
    ("r3_abci_v_1x4_4096b", 0.07, ""),                   # mpi rdma 4 test
    ("r3_abci_v_1x4_65536b", -0.03, ""),                 # mpi rdma 4 test
    ("p3_vgg19_peak", math.nan, ""),                     # not scored
]


def _write_validation(path: Path, errors: list[tuple[str, float, str]]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "status", "rel_error", "sensitivity"])
        for pid, err, sens in errors:
            w.writerow([pid, "ok", "" if math.isnan(err) else err, sens])
    return path


@pytest.fixture
def validation_csv(tmp_path: Path) -> Path:
    return _write_validation(tmp_path / "validation.csv", FAKE_ERRORS)


def _band(errors: list[float]) -> tuple[float, float]:
    a = np.abs(np.array(errors))
    return float(np.median(a)), float(np.percentile(a, 90))


def test_error_band_recomputes(validation_csv: Path) -> None:
    tcp4 = {"workers": 4, "transport": "tcp"}
    # allreduce over tcp within 4x of 4 GPUs (1 to 16): horovod 8 and 16, mpi 2 and 4.
    band = answer.error_band("horovod", tcp4, results=validation_csv)
    med, p90 = _band([-0.10, 0.05, 0.02, -0.04])
    assert (band.points, band.comparable, band.splits) == (4, True, {"fit": 4})
    assert band.median == pytest.approx(med) and band.p90 == pytest.approx(p90)
    assert "1 to 16 GPUs" in band.basis
    assert f"{med:.1%}" in band.describe() and f"{p90:.1%}" in band.describe()
    # parameter servers over tcp: only p3's point (its sensitivity row is left out), any scale.
    ps = answer.error_band("byteps", tcp4, results=validation_csv)
    assert (ps.points, ps.median, ps.p90) == (1, pytest.approx(0.20), pytest.approx(0.20))
    assert "any scale" in ps.basis
    # nothing over the ideal transport: every test-split point instead, and it says so.
    none = answer.error_band("horovod", {"workers": 4, "transport": "ideal"},
                             results=validation_csv)
    med, p90 = _band([0.07, -0.03])
    assert (none.points, none.comparable, none.splits) == (2, False, {"test": 2})
    assert none.median == pytest.approx(med) and none.p90 == pytest.approx(p90)
    assert none.describe().startswith("No published point is comparable")


def test_error_band_takes_points_of_the_tunes_precision_class(tmp_path: Path) -> None:
    # Horovod over tcp: three fp32 points and three fp16 ones (issue 779's V100s); a tune in
    # fp16 (or bf16) takes the 16-bit ones, one in fp32 the others, and with too few of a
    # class the band takes every precision and says so.
    errors = FAKE_ERRORS + [("fb_hvd779_p316_rn50_1gpu", 0.70, ""),
                            ("fb_hvd779_p316_rn50_8gpu", 0.75, ""),
                            ("fb_hvd779_p316_rn50_16gpu", 0.80, "")]
    path = _write_validation(tmp_path / "validation.csv", errors)
    tcp8 = {"workers": 8, "transport": "tcp"}
    for precision in ("fp16", "bf16", "mixed"):
        low = answer.error_band("horovod", tcp8, results=path, precision=precision)
        assert low.points == 3 and low.median == pytest.approx(0.75)
        assert "in 16-bit precision" in low.basis
    full = answer.error_band("horovod", tcp8, results=path, precision="fp32")
    assert "in 32-bit precision" in full.basis
    assert full.median == pytest.approx(_band([-0.10, 0.05, 0.02, -0.04])[0])
    # parameter servers over tcp have no 16-bit point: every precision, and it says so
    assert answer.error_band("byteps", tcp8, results=path, precision="fp16").basis.endswith(
        "(any precision: fewer than 3 in 16-bit precision) (at any scale: fewer than 3 within "
        "4x of 8 GPUs)")


def test_scaling_band_is_the_error_of_each_curves_scaling_from_its_first_point(
        tmp_path: Path) -> None:
    # The BytePS README's Horovod ResNet-50 curve over 20 Gbit/s tcp: published 2450, 3950,
    # 7620 and 11430 images/s at 8, 16, 32 and 64 GPUs; made-up simulated values.
    path = tmp_path / "validation.csv"
    sims = {8: 2500.0, 16: 4000.0, 32: 8000.0, 64: 12000.0}
    published = {8: 2450.0, 16: 3950.0, 32: 7620.0, 64: 11430.0}
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "status", "simulated", "rel_error", "sensitivity"])
        for n, sim in sims.items():
            w.writerow([f"bpsreadme_tcp20_resnet50_horovod_{n}", "ok", sim,
                        sim / published[n] - 1, ""])
    errors = [abs((sims[n] / sims[8]) / (published[n] / published[8]) - 1) for n in (16, 32, 64)]
    band = answer.scaling_band("horovod", {"workers": 16, "transport": "tcp"}, results=path)
    assert (band.points, band.splits, band.kind) == (3, {"fit": 3}, "scaling")
    assert band.median == pytest.approx(float(np.median(errors)))
    assert band.p90 == pytest.approx(float(np.percentile(errors, 90)))
    assert "4 to 64 GPUs" in band.basis and f"{band.median:.1%}" in band.describe()
    # no parameter-server curve, and no test-split one to fall back on: no band, said so
    none = answer.scaling_band("byteps", {"workers": 16, "transport": "tcp"}, results=path)
    assert none.points == 0 and none.describe().startswith("No validation point to take a "
                                                           "scaling band from")


def _table(md: str, heading: str) -> list[dict[str, str]]:
    """Return the rows of the first markdown table after ``heading``."""
    lines = md.split(heading, 1)[1].splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("|"))
    block = []
    for ln in lines[first:]:
        if not ln.startswith("|"):
            break
        block.append([c.strip() for c in ln.strip("|").split("|")])
    return [dict(zip(block[0], cells)) for cells in block[2:]]


def test_report_top_configurations_and_gains(tmp_path: Path, validation_csv: Path) -> None:
    folder = tmp_path / "tune"
    rows = make_folder(folder, failed="ValueError: <script>alert('x')</script> & more")
    written = report.render(folder, validation=validation_csv)
    names = {p.name for p in written}
    assert {"report.md", "report.html", "best.yaml", "best_so_far.png", "backends.png",
            "knobs.png", "importances.png"} <= names
    md = (folder / "report.md").read_text(encoding="utf-8")

    # Independently: rank the ok rows by time; gains are throughput / each default's.
    ok = sorted((r for r in rows if r["status"] == "ok"), key=lambda r: r["iteration_time_s"])
    default = {r["backend"]: r for r in rows if r["is_default"]}
    table = _table(md, "## Top 5 configurations")
    assert len(table) == 5
    for got, want in zip(table, ok[:5]):
        knobs = {k: want[k] for k in ("fusion_threshold", "cycle_time", "partition_bytes")
                 if k in want}
        assert got["configuration"].startswith(want["backend"] + "[")
        assert got["trial"] == str(want["trial"])
        assert float(got["iteration_time_ms"]) == pytest.approx(
            want["iteration_time_s"] * 1e3, rel=1e-3)
        for b in ("horovod", "byteps"):
            gain = want["throughput"] / default[b]["throughput"]
            assert float(got[f"x {b} default"]) == pytest.approx(gain, rel=1e-3)
        for k, v in knobs.items():
            assert f"{k}=" in got["configuration"]
            assert re.search(rf"{k}=([^,\]]+)", got["configuration"]).group(1) == \
                format_value(float(f"{v:.4g}") if isinstance(v, float) else v)
    best = ok[0]
    assert f"`{table[0]['configuration']}`" in md
    backends = _table(md, "## Each backend's best")
    assert [r["backend"] for r in backends] == ["horovod", "byteps"]
    byteps_best = min((r for r in ok if r["backend"] == "byteps"),
                      key=lambda r: r["iteration_time_s"])
    assert float(backends[1]["x its default"]) == pytest.approx(
        byteps_best["throughput"] / default["byteps"]["throughput"], rel=1e-3)
    assert best["backend"] == "horovod"

    # The error band in the report is the recomputed one (horovod over tcp at 4 GPUs).
    med, p90 = _band([-0.10, 0.05, 0.02, -0.04])
    assert f"median {med:.1%} and 90th percentile {p90:.1%}" in md
    # Made-up times far above the compute alone: not compute-bound.
    assert "Not compute-bound" in md
    assert "float32 gradients summed over 4 ranks with predivide factor 1" in md
    assert "safe at every scale tried" in md

    # HTML: the failed trial's error is escaped, never raw markup.
    page = (folder / "report.html").read_text(encoding="utf-8")
    assert "<script>" not in page
    assert "&lt;script&gt;alert(" in page and "&lt;/script&gt; &amp; more" in page


def test_best_yaml_loads_as_an_experiment(tmp_path: Path) -> None:
    folder = tmp_path / "tune"
    rows = make_folder(folder)
    report.render(folder, numerics=False)
    exp = load_experiment(folder / "best.yaml")
    assert exp.kind == "throughput"
    spec = exp.spec
    best = min((r for r in rows if r["status"] == "ok"), key=lambda r: r["iteration_time_s"])
    assert best["backend"] == "horovod" and not best["is_default"]
    assert spec.mode == "simulate"
    assert spec.workloads == ("resnet50",)
    assert spec.workers == (WORKERS,) and spec.transport == ("tcp",)
    assert spec.batch_size == (BATCH,)
    # The chosen knobs beside the defaults, zipped: two horovod points; byteps at defaults.
    hv = spec.backends["horovod"]
    assert hv["fusion_threshold"] == (best["fusion_threshold"], HOROVOD_DEFAULT["fusion_threshold"])
    assert hv["cycle_time"] == (best["cycle_time"], HOROVOD_DEFAULT["cycle_time"])
    assert spec.zip == (("horovod.fusion_threshold", "horovod.cycle_time"),)
    assert spec.backends["byteps"] == {}
    assert spec.report.baseline == "byteps"


def test_compute_bound_on_an_infinitely_fast_network(tmp_path: Path) -> None:
    from ddpbench import simulator

    def request(**cluster: Any) -> dict[str, Any]:
        return {"workload": "resnet50",
                "cluster": contract.Cluster(workers=WORKERS, **cluster).model_dump(),
                "schedule": schedule.model_dump()}

    def simulate(req: dict[str, Any]) -> float:
        return simulator.simulate("resnet50", "byteps", cluster=contract.Cluster(
            **req["cluster"]), schedule=schedule, trace=False).iteration_time_s

    schedule = contract.Schedule(batch_size=BATCH)
    fast = request(bandwidth_gbps=1e6, latency_us=0.0, transport="ideal")
    compute = answer.compute_only_time(fast)
    t = simulate(fast)
    assert answer.compute_bound(t, compute)
    slow = request(bandwidth_gbps=0.5, transport="tcp")
    t_slow = simulate(slow)
    assert answer.compute_only_time(slow) == pytest.approx(compute)
    assert not answer.compute_bound(t_slow, compute)

    # The report says so plainly when the best trial is the compute alone.
    folder = tmp_path / "fast"
    make_folder(folder, cluster=fast["cluster"], times={1: t})
    report.render(folder, numerics=False)
    md = (folder / "report.md").read_text(encoding="utf-8")
    assert "Compute-bound" in md and "Nothing to gain from communication tuning." in md


def test_importances_need_two_differing_trials(tmp_path: Path) -> None:
    folder = tmp_path / "small"
    make_folder(folder, trials=[("horovod", dict(HOROVOD_DEFAULT), True),
                                ("byteps", dict(BYTEPS_DEFAULT), True)])
    imps, notes = report.importances(folder, json.loads((folder / "tune.json").read_text()))
    assert imps == {}
    assert len(notes) == 2 and all("at least two" in n for n in notes)
    written = {p.name for p in report.render(folder, numerics=False)}
    assert "importances.png" not in written and "best.yaml" in written
    md = (folder / "report.md").read_text(encoding="utf-8")
    assert "Parameter importances skipped" in md
    # The best is a default: best.yaml runs it as is, with no zipped knobs.
    exp = load_experiment(folder / "best.yaml")
    assert exp.spec.zip == ()


def test_best_yaml_names_a_profile_relative_to_itself(tmp_path: Path) -> None:
    profile = Path(__file__).resolve().parents[2] / "experiments" / "profiles" / \
        "my_model_resnet18.yaml"
    folder = tmp_path / "tune"
    local = folder / "model.yaml"
    folder.mkdir()
    local.write_text(profile.read_text(encoding="utf-8"), encoding="utf-8")
    make_folder(folder, workload=str(local))
    text = answer.experiment_yaml(*answer.load(folder), folder)
    assert "- model.yaml" in text
    (folder / "best.yaml").write_text(text, encoding="utf-8")
    exp = load_experiment(folder / "best.yaml")
    assert Path(exp.spec.workloads[0]).resolve() == local.resolve()
    lines = answer.summary_lines(*answer.load(folder))
    assert len(lines) == 5 and lines[0].startswith("1. horovod[")


def test_own_mechanisms_are_marked() -> None:
    import pandas as pd

    request = {"space": {"byteps.scheduler": {
        "backend": "byteps", "knob": "scheduler", "kind": "categorical",
        "choices": ["byteps", "credit", "window"],
        "original": ["byteps"]}}}
    rows = pd.DataFrame([
        {"trial": 0, "backend": "byteps", "is_default": True, "scheduler": "byteps",
         "iteration_time_s": 0.5, "throughput": 2.0, "status": "ok"},
        {"trial": 1, "backend": "byteps", "is_default": False, "scheduler": "window",
         "iteration_time_s": 0.4, "throughput": 2.5, "status": "ok"},
        {"trial": 2, "backend": "horovod", "is_default": True, "scheduler": None,
         "iteration_time_s": 0.6, "throughput": 1.7, "status": "ok"}])
    assert answer.own_mechanisms(request, rows.iloc[1]) == ["scheduler=window"]
    assert answer.own_mechanisms(request, rows.iloc[0]) == []
    assert answer.own_mechanisms(request, rows.iloc[2]) == []
    rank = answer.ranked(request, rows)
    assert list(rank["configuration"]) == ["byteps[scheduler=window] *",
                                           "byteps[scheduler=byteps] (default)", "horovod (default)"]


def _fp16_request(**schedule: Any) -> dict[str, Any]:
    """A tune on 128 workers whose space holds Horovod's compression and predivide factor."""
    cat = {"kind": "categorical", "scale": "categorical", "choices": ["none", "fp16"],
           "default": "none", "source": "horovod/torch/compression.py"}
    return {"workload": "resnet50",
            "cluster": contract.Cluster(workers=128, bandwidth_gbps=10.0).model_dump(),
            "schedule": contract.Schedule(**schedule).model_dump(),
            "backends": ["horovod", "byteps"], "fixed": {}, "dropped": [], "seed": 0,
            "space": {
                "horovod.compression": {"backend": "horovod", "knob": "compression", **cat},
                "horovod.gradient_predivide_factor": {
                    "backend": "horovod", "knob": "gradient_predivide_factor", "kind": "float",
                    "scale": "log", "low": 1.0, "high": 128.0, "default": 1.0,
                    "when": {"compression": "fp16"}, "source": "horovod/torch/optimizer.py"},
                "byteps.compression": {"backend": "byteps", "knob": "compression", **cat}}}


def _fp16_rows() -> Any:
    import pandas as pd

    def row(n: int, backend: str, t: float, compression: str, factor: float | None = None,
            is_default: bool = False) -> dict[str, Any]:
        return {"trial": n, "backend": backend, "is_default": is_default,
                "compression": compression, "gradient_predivide_factor": factor,
                "iteration_time_s": t, "throughput": 128 * 32 / t, "status": "ok"}

    return pd.DataFrame([row(0, "horovod", 0.45, "none", is_default=True),
                         row(1, "byteps", 0.47, "none", is_default=True),
                         row(2, "horovod", 0.40, "fp16", 1.0),    # overflows at RMS 100
                         row(3, "horovod", 0.41, "fp16", 64.0),   # safe
                         row(4, "byteps", 0.42, "fp16")])       # sums unscaled: overflows


def test_a_configurations_dtype_is_float16_under_fp16_compression_or_mixed_precision() -> None:
    request, rows = _fp16_request(), _fp16_rows()
    assert [answer.gradient_dtype(request, r) for _, r in rows.iterrows()] == [
        "float32", "float32", "float16", "float16", "float16"]
    assert [answer.predivide_factor(request, r) for _, r in rows.iterrows()] == [
        1.0, 1.0, 1.0, 64.0, 1.0]
    mixed = _fp16_request(precision="mixed")
    assert {answer.gradient_dtype(mixed, r) for _, r in rows.iterrows()} == {"float16"}
    for precision, dtype in (("bf16", "bfloat16"), ("fp8", "bfloat16"), ("fp16", "float16")):
        half = _fp16_request(precision=precision)
        assert {answer.gradient_dtype(half, r) for _, r in rows.iterrows()} == {dtype}
    # a fixed compression counts as a chosen one; a plain dict row is read too
    fixed = {**request, "fixed": {"horovod": {"compression": "fp16"}}}
    assert answer.gradient_dtype(fixed, {"backend": "horovod"}) == "float16"


def test_an_unsafe_configuration_is_passed_over_and_marked_never_recommended(
        tmp_path: Path) -> None:
    """fp16 sums of 128 ranks at predivide 1 overflow at gradient RMS 100 (the numerics
    model, ``ddpbench numerics query -N 128 --scale 100``): the faster such configuration
    is named as unsafe, the fastest safe one is the answer and best.yaml's choice."""
    request, rows = _fp16_request(), _fp16_rows()
    rank = answer.ranked(request, rows)
    assert list(rank["trial"]) == [2, 3, 4, 0, 1]
    rec = answer.recommended(request, rank)
    assert rec.safe and rec.index == 1 and rec.verdict is not None and rec.verdict.safe
    assert [i for i, _ in rec.unsafe] == [0] and not rec.unsafe[0][1].safe
    assert rec.unsafe[0][1].rows[-1]["overflow"] > 0  # at RMS 100
    assert answer.recommended(request, rank, numerics=False).index == 0

    folder = tmp_path / "tune"
    folder.mkdir()
    (folder / "tune.json").write_text(json.dumps(request), encoding="utf-8")
    rows.to_csv(folder / "results.csv", index=False)
    report.render(folder)
    md = (folder / "report.md").read_text(encoding="utf-8")
    assert ("Fastest numerically safe: `horovod[compression=fp16,"
            "gradient_predivide_factor=64]`") in md
    assert ("Faster, but not numerically safe, so not recommended: "
            "`horovod[compression=fp16,gradient_predivide_factor=1]`") in md
    assert "float16 gradients summed over 128 ranks with predivide factor 64" in md
    top = _table(md, "## Top 5 configurations")
    assert [r["numerics"] for r in top] == [
        "float16, f=1: NOT safe", "float16, f=64: safe", "float16, f=1: NOT safe",
        "float32, f=1: safe", "float32, f=1: safe"]
    exp = load_experiment(folder / "best.yaml").spec
    assert exp.backends["horovod"]["gradient_predivide_factor"] == (64.0, 1.0)
    assert exp.backends["horovod"]["compression"] == ("fp16", "none")


def test_the_answer_says_when_a_replica_does_not_fit_and_which_configuration_does(
        tmp_path: Path) -> None:
    import pandas as pd

    profile = tmp_path / "big.yaml"  # 6.7e9 parameters: a replica needs 107.2 GB
    profile.write_text("name: big\nbatch_size: 1\nlayers:\n  - {name: a, fwd_ms: 1, bwd_ms: 2,"
                       " tensors: [{name: w, numel: 6700000000}]}\n", encoding="utf-8")
    request = {"workload": str(profile),
               "cluster": {"workers": 128, "hosts": 16, "gpus_per_host": 8, "device": "H100"}}
    rank = pd.DataFrame([
        {"backend": "horovod", "configuration": "horovod (default)", "stage": math.nan,
         "sharding_strategy": math.nan, "iteration_time_s": 1.0},
        {"backend": "zero", "configuration": "zero[stage=1]", "stage": 1.0,
         "sharding_strategy": math.nan, "iteration_time_s": 1.1},
        {"backend": "fsdp", "configuration": "fsdp (default)", "stage": math.nan,
         "sharding_strategy": "FULL_SHARD", "iteration_time_s": 1.2}])
    cells = [report.memory_cells(request, r["backend"], r) for _, r in rank.iterrows()]
    assert [c["fits"] for c in cells] == [False, True, True]
    assert cells[0]["model_states_gb"] == pytest.approx(16 * 6.7)
    assert cells[1]["model_states_gb"] == pytest.approx(4 * 6.7 + 12 * 6.7 / 128)
    assert cells[2]["model_states_gb"] == pytest.approx(16 * 6.7 / 128)
    from ddpbench.tune import answer

    def fits(row: Any) -> bool:
        return bool(report.memory_cells(request, str(row["backend"]), row)["fits"])

    rec = answer.recommended(request, rank, numerics=False, fits=fits)
    assert rec.index == 1 and rec.too_large == (0,)  # never the replica that does not fit
    line = report._memory_line(request, rank.iloc[1], rank, rec)
    assert line.startswith("Memory: faster, but their model states per GPU do not fit the "
                           "H100's 80 GB")
    assert "`horovod (default)`, 1000 ms, 107.2 GB" in line
    none_fit = rank.iloc[[0]]
    rec = answer.recommended(request, none_fit, numerics=False, fits=fits)
    assert rec.index == 0 and rec.too_large == ()  # nothing fits: memory is not judged
    line = report._memory_line(request, none_fit.iloc[0], none_fit, rec)
    assert "107.2 GB per GPU, more than the H100's 80 GB" in line and "no configuration" in line
    assert report._memory_line(request, rank.iloc[2], rank, None) == ""
    request["cluster"]["device"] = "M60"  # no datasheet figure here: no claim either way
    assert report.memory_cells(request, "horovod", rank.iloc[0]) == {}
