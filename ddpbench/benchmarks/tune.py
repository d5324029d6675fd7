"""``ddpbench bench tune``: the wall time of ``ddpbench tune`` on the issue's cases, and its
best against an exhaustive grid of a small space, both measured in the same run."""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path
from typing import Any

HELP = ("time ddpbench tune (200 trials: ResNet-50 and VGG-19 on 16 x 8 V100 at 25 Gbit/s "
        "TCP, VGG-19 on P3's 4 x P4000 at 10; --baseline: also without the stop rule) and "
        "check its best against an exhaustive grid")

# V100 servers of eight GPUs join them over NVLink (DGX-1, AWS p3.16xlarge).
_V100 = {"hosts": 16, "gpus_per_host": 8, "device": "V100", "intra_link": "nvlink",
         "transport": "tcp", "bandwidth_gbps": 25.0}
# The P3 paper's testbed: 4 hosts of one P4000, ps-lite over TCP (experiments/p3_vs_ring.yaml).
_P3 = {"workers": 4, "device": "P4000", "batch_size": 32, "transport": "tcp",
       "bandwidth_gbps": 10.0}
CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("resnet50 16x8 V100", "resnet50", _V100),
    ("vgg19 16x8 V100", "vgg19", _V100),
    ("vgg19 P3 testbed", "vgg19", _P3),
]
"""(case, workload, cluster and schedule fields)."""

# The grid: two backends, two knobs each, five values each (log-spaced over the range).
GRID_CASE = "vgg19 P3 testbed"
GRID: dict[str, dict[str, tuple[float, float, str]]] = {
    "p3": {"slice_params": (40_000, 1_000_000, "int"), "send_hwm": (1, 16, "int")},
    "byteps": {"partition_bytes": (1_024_000, 128_000_000, "int"),
               "credit_params": (1_000_000, 16_000_000, "int")},
}
GRID_FIXED: dict[str, dict[str, Any]] = {"byteps": {"scheduler": "credit",
                                                   "compression": "none"},
                                        "p3": {"water_mark": 0}}
GRID_VALUES = 5


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trials", type=int, default=200,
                        help="trials per case (default 200)")
    parser.add_argument("--jobs", "-j", type=int, default=2,
                        help="trials simulated at once (default 2)")
    parser.add_argument("--target", type=float, default=180.0, metavar="SECONDS",
                        help="wall-time target per case (default 180)")
    parser.add_argument("--only", metavar="TEXT",
                        help="run only the cases whose name holds TEXT ('grid': the grid only)")
    parser.add_argument("--stop-within", type=float, default=None, metavar="PCT",
                        help="tune's stop rule: stop once the best is within PCT percent of "
                             "the job's compute alone (default tune's, "
                             "commands.tune.STOP_WITHIN_PCT; 0: every trial)")
    parser.add_argument("--baseline", action="store_true",
                        help="also run each case with the stop rule off (the whole budget, "
                             "as tune did before it), in this same run, and print both")
    parser.add_argument("--keep", type=Path, metavar="FOLDER",
                        help="keep each case's tune folder under FOLDER (default: a temporary "
                             "folder, removed)")


def _setting(fields: dict[str, Any]) -> tuple[Any, Any]:
    """Return the case's (Cluster, Schedule), with tune's steady-state iterations."""
    from ddpbench import contract
    from ddpbench.commands.tune import ITERATIONS, WARMUP

    fields = {"iterations": ITERATIONS, "warmup": WARMUP, **fields}
    cluster = contract.Cluster(**{k: v for k, v in fields.items()
                                  if k in contract.Cluster.model_fields})
    schedule = contract.Schedule(**{k: v for k, v in fields.items()
                                    if k in contract.Schedule.model_fields})
    return cluster, schedule


def _tune(workload: str, fields: dict[str, Any], folder: Path, trials: int, jobs: int, *,
          backends: list[str] | None = None, fix: list[str] | None = None,
          ranges: list[str] | None = None, stop_within: float = 0.0
          ) -> tuple[Any, float, float]:
    from ddpbench import contract
    from ddpbench.tune import search
    from ddpbench.tune.space import build_space

    cluster, schedule = _setting(fields)
    space = build_space(backends or list(contract.BACKENDS), cluster, fix=fix or [],
                        ranges=ranges or [], schedule=schedule)
    request = search.Request(workload, cluster, schedule, space, seed=0)
    start, cpu = time.perf_counter(), time.process_time()
    done = search.run(request, folder, trials=trials, jobs=jobs, progress=False,
                      stop_within=stop_within)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    # The trials ran in the pool's processes: their own CPU time is in the rows.
    return done, wall, cpu + sum(r.get("cpu_s") or 0.0 for r in done.rows
                                 if r["trial"] >= done.finished_before)


def _best(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return min((r for r in rows if r["status"] == "ok"),
               key=lambda r: (r["iteration_time_s"], r["trial"]))


def _knobs_text(row: dict[str, Any], names: list[str]) -> str:
    from ddpbench.tune.space import fmt_value

    return ", ".join(f"{k}={fmt_value(row[k])}" for k in names if row.get(k) not in (None, ""))


def _stop_within(args: argparse.Namespace) -> float:
    """Return the stop rule's fraction: ``--stop-within`` PCT, else tune's default."""
    from ddpbench.commands.tune import STOP_WITHIN_PCT

    return (STOP_WITHIN_PCT if args.stop_within is None else args.stop_within) / 100


def _cases(args: argparse.Namespace, root: Path) -> None:
    from ddpbench.commands.tune import ITERATIONS, WARMUP

    within = _stop_within(args)
    runs = [("", within)] + ([("baseline", 0.0)] if args.baseline and within > 0 else [])
    print(f"{args.trials} trials per case, {args.jobs} job(s), {ITERATIONS} iterations a "
          f"trial ({WARMUP} warm-up); stop rule: within {within:.2%} of the compute-only "
          "time" + (" (baseline rows: off, every trial, measured in this run)"
                    if len(runs) > 1 else "")
          + "; gain = fastest default / best; "
          "cpu s: this process's and the trials' (wall also waits for a core)")
    header = (f"{'case':<20}{'run':<10}{'trials':>7}{'simulated':>10}{'wall s':>8}"
              f"{'cpu s':>8}{'target s':>9}{'best ms':>9}{'compute ms':>11}{'default ms':>11}"
              f"{'gain':>7}  best (fastest default)")
    print(header)
    print("-" * len(header))
    compared: list[tuple[str, tuple[float, float], tuple[float, float]]] = []
    for case, workload, fields in CASES:
        if args.only and args.only not in case:
            continue
        bests: list[tuple[float, float]] = []
        for label, stop in runs:
            folder = root / (case.replace(" ", "-") + (f"-{label}" if label else ""))
            done, wall, cpu = _tune(workload, fields, folder, args.trials, args.jobs,
                                    stop_within=stop)
            bests.append(_case_row(case, label or "stop", done, wall, cpu, args, workload,
                                   fields))
        if len(bests) == 2:
            compared.append((case, bests[0], bests[1]))
    for case, (with_stop, compute), (without, _) in compared:
        below = [f"{label} {1 - t / compute:.2%} below it" for label, t in
                 (("with", with_stop), ("without", without)) if t < compute]
        note = (f"; the compute alone takes {compute * 1e3:.2f} ms"
                + (f" ({', '.join(below)}: the steady state of a trial's few iterations, not "
                   "a faster compute)" if below else ""))
        print(f"{case}: best with the stop rule {with_stop * 1e3:.2f} ms, without "
              f"{without * 1e3:.2f} ms (ratio {with_stop / without:.4f}){note}")


def _case_row(case: str, label: str, done: Any, wall: float, cpu: float,
              args: argparse.Namespace, workload: str, fields: dict[str, Any]
              ) -> tuple[float, float]:
    """Print one case's row; return its best and its compute-only iteration times."""
    from ddpbench import contract
    from ddpbench.tune.answer import compute_only_time
    from ddpbench.tune.space import build_space

    rows = [r for r in done.rows if r["status"] == "ok"]
    best = _best(rows)
    defaults = [r for r in rows if r["is_default"]]
    fastest = min(defaults, key=lambda r: r["iteration_time_s"])
    cluster, schedule = _setting(fields)
    compute = done.compute_s or compute_only_time(
        {"workload": workload, "cluster": cluster.model_dump(),
         "schedule": schedule.model_dump()})
    space = build_space(list(contract.BACKENDS), cluster, schedule=schedule)
    names = [p.knob for p in space.of(best["backend"])]
    note = "  OVER TARGET" if wall > args.target else ""
    if done.stopped == "bound":
        note = " (stopped: within the bound)" + note
    chosen = {k: best[k] for k in names if best.get(k) not in (None, "")}
    if space.own(best["backend"], chosen):
        note = " (* ddpbench's own mechanism)" + note
    print(f"{case:<20}{label:<10}{len(rows):>7}{done.finished - done.reused:>10}{wall:>8.1f}"
          f"{cpu:>8.1f}{args.target:>9.0f}{best['iteration_time_s'] * 1e3:>9.2f}"
          f"{compute * 1e3:>11.2f}{fastest['iteration_time_s'] * 1e3:>11.2f}"
          f"{fastest['iteration_time_s'] / best['iteration_time_s']:>7.3f}  "
          f"{best['backend']} {_knobs_text(best, names) or '(default)'} "
          f"({fastest['backend']}){note}", flush=True)
    return float(best["iteration_time_s"]), float(compute)


def _grid_points() -> list[tuple[str, dict[str, Any]]]:
    import itertools

    out: list[tuple[str, dict[str, Any]]] = []
    for backend, knobs in GRID.items():
        axes = []
        for _knob, (low, high, _kind) in knobs.items():
            values = [low * (high / low) ** (i / (GRID_VALUES - 1)) for i in range(GRID_VALUES)]
            axes.append(sorted({round(v) for v in values}))
        for combo in itertools.product(*axes):
            out.append((backend, {**GRID_FIXED.get(backend, {}), **dict(zip(knobs, combo))}))
    return out


def _grid(args: argparse.Namespace, root: Path) -> None:
    import concurrent.futures as cf

    from ddpbench.tune import search

    workload, fields = next((w, f) for c, w, f in CASES if c == GRID_CASE)
    cluster, schedule = _setting(fields)
    points = _grid_points()
    start = time.perf_counter()
    with cf.ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(search.evaluate, *zip(*[
            (workload, b, k, cluster.model_dump(), schedule.model_dump()) for b, k in points])))
    grid_wall = time.perf_counter() - start
    best_i = min(range(len(points)), key=lambda i: results[i].get("iteration_time_s", math.inf))
    grid_best = results[best_i]["iteration_time_s"]
    budget = len(points) // 4
    fix = [f"{b}.{k}={v}" for b, kv in GRID_FIXED.items() for k, v in kv.items()]
    ranges = [f"{b}.{k}={low}:{high}" for b, kv in GRID.items() for k, (low, high, _) in kv.items()]
    done, wall, _ = _tune(workload, fields, root / "grid-tune", budget, args.jobs,
                          backends=list(GRID), fix=fix, ranges=ranges,
                          stop_within=_stop_within(args))
    rows = [r for r in done.rows if r["status"] == "ok"]
    best = _best(rows)
    simulated = done.finished - done.reused + done.failed
    b, k = points[best_i]
    knobs = "; ".join(f"{b}: {', '.join(kv)}" for b, kv in GRID.items())
    print(f"\ngrid on {GRID_CASE}: {len(GRID)} backends x 2 knobs x {GRID_VALUES} values, "
          f"log-spaced over each knob's range ({knobs}; fixed: {', '.join(fix)})")
    print(f"  grid: {len(points)} simulations in {grid_wall:.1f} s; best {grid_best * 1e3:.2f} ms: "
          f"{b} {', '.join(f'{kk}={vv:,}' for kk, vv in k.items() if kk in GRID[b])}")
    names = list(GRID[best["backend"]])
    ratio = best["iteration_time_s"] / grid_best
    print(f"  tune: {done.finished} trials ({simulated} simulated, budget {budget} = 1/4 of the "
          f"grid) in {wall:.1f} s; best {best['iteration_time_s'] * 1e3:.2f} ms: "
          f"{best['backend']} {_knobs_text(best, names)}")
    verdict = "within 1%" if ratio <= 1.01 else "NOT WITHIN 1%"
    print(f"  tune best / grid best = {ratio:.4f} ({verdict}); simulations {simulated} / "
          f"{len(points)} = {simulated / len(points):.2f}")


def main(args: argparse.Namespace) -> int:
    from ddpbench.cli import UsageError

    if args.trials < 1 or args.jobs < 1:
        raise UsageError(f"--trials and --jobs must be >= 1, got {args.trials}, {args.jobs}")
    with tempfile.TemporaryDirectory(prefix="ddpbench-bench-tune-") as tmp:
        root = args.keep or Path(tmp)
        if args.only != "grid":
            _cases(args, root)
        if not args.only or args.only == "grid":
            _grid(args, root)
    return 0
