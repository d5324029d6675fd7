"""``ddpbench tune``: search the fastest backend and knobs for a workload on a cluster.

A trial measures the steady state: tune simulates :data:`ITERATIONS` iterations and leaves
the first :data:`WARMUP` out (``simulate`` takes 3 and 1). The simulator's iteration time is
``(end[N-1] - end[W-1]) / (N - W)``, and each end is where the compute stream stood plus a
communication tail, so the mean is the steady period plus ``(tail[N-1] - tail[W-1]) / (N -
W)``. Two warm-up iterations let the pipeline fill (a parameter server's second iteration
still differs from its third). Eight measured ones bound the error of a schedule that never
repeats (BytePS's ``window``, whose tails vary by tens of ms) to a few ms: with fewer, TPE
picks the configuration whose last window happens to end early, predicted faster than its
compute alone. Each trial costs ``N`` iterations.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from ddpbench.commands.simulate import add_allow_flag, add_cluster_flags

HELP = ("search the fastest backend and knobs for a workload on a cluster (optuna TPE over "
        "simulations; resumable)")

ITERATIONS = 10
"""Iterations a trial simulates by default, warm-up included (see the module's docstring)."""
WARMUP = 2
"""Leading iterations a trial leaves out by default."""
STOP_WITHIN_PCT = 1.0
"""Percent of the compute-only time within which the originals' best stops a tune
(``--stop-within``): below the 2% at which the report calls a job compute-bound, so a
stopped tune's answer is one."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", "-w", default="resnet50",
                        help="shipped workload, profile YAML, or a PyTorch model "
                             "(torchvision:NAME or package.module:factory) profiled here on "
                             "the CPU at --batch-size (default resnet50)")
    add_cluster_flags(parser)
    _steady_state_defaults(parser)
    parser.add_argument("--cluster", metavar="FILE.yaml",
                        help="the cluster as a YAML mapping of Cluster and Schedule fields "
                             "(flags given beside it override its values)")
    parser.add_argument("--backends", default=None, metavar="A,B",
                        help="backends to compare (default every backend of the contract)")
    parser.add_argument("--trials", type=int, default=None, metavar="N",
                        help="finished trials the study holds in the end (default 100; a "
                             "re-run with more adds the difference)")
    parser.add_argument("--time", type=float, default=None, metavar="SECONDS",
                        help="stop asking for trials after this long (with or instead of "
                             "--trials)")
    parser.add_argument("--stop-within", type=float, default=STOP_WITHIN_PCT, metavar="PCT",
                        help="stop before the budget once every backend's default has run and "
                             "the fastest configuration the original systems offer is within "
                             "PCT percent of the job's compute alone, which no configuration "
                             "can beat (default "
                             f"{STOP_WITHIN_PCT:g}; 0: spend the whole budget)")
    parser.add_argument("--jobs", "-j", type=int, default=1, metavar="N",
                        help="trials simulated at once, each in its own process (default 1)")
    parser.add_argument("--executor", choices=["local", "mpi"], default="local",
                        help="local processes, or mpi4py.futures on a cluster (default local)")
    parser.add_argument("--search-seed", type=int, default=0, metavar="N",
                        help="TPE's seed: the same seed, space and --jobs give the same "
                             "trials (default 0; --seed is the cluster's jitter seed)")
    parser.add_argument("--outdir", "-o", type=Path, default=None, metavar="FOLDER",
                        help="output folder: study.db, tune.json, results.csv, the report "
                             "(default reports/tune/WORKLOAD-HOSTSxGPUS-BWg-TRANSPORT)")
    parser.add_argument("--fix", action="append", default=[], metavar="KNOB=VALUE",
                        help="hold a knob (BACKEND.KNOB=VALUE for one backend; repeatable)")
    parser.add_argument("--range", action="append", default=[], metavar="KNOB=LO:HI",
                        help="narrow a knob's range, or a choice's values with KNOB=A,B "
                             "(BACKEND.KNOB=... for one backend; repeatable)")
    parser.add_argument("--originals-only", action="store_true",
                        help="keep to what the original systems offer: no BytePS scheduler "
                             "'window' or P3 water_mark, which are ddpbench's own")
    parser.add_argument("--space", action="store_true",
                        help="print the search space per backend (knob, kind, range, scale, "
                             "default, source of the range) and exit")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("--no-report", action="store_true", help="do not render the report")
    parser.add_argument("--confirm", type=int, default=None, metavar="K",
                        help="then run the top K configurations and every backend's default "
                             "as real processes here beside their simulated twins, and "
                             "compare the rankings (Kendall's tau-b) in FOLDER/confirm/; "
                             "needs --machine; -o FOLDER --confirm K alone confirms the tune "
                             "already there")
    parser.add_argument("--confirm-repetitions", type=int, default=3, metavar="N",
                        help="real runs of each confirmed configuration (default 3; their "
                             "median counts)")
    add_allow_flag(parser)


def _steady_state_defaults(parser: argparse.ArgumentParser) -> None:
    """Make each trial measure the steady state: more iterations than ``simulate``'s."""
    parser.set_defaults(iterations=ITERATIONS, warmup=WARMUP)
    for action in parser._actions:
        if action.dest == "iterations":
            action.help = (f"iterations per trial, warm-up included (default {ITERATIONS}: "
                           "a steady state; simulate's is 3)")
        elif action.dest == "warmup":
            action.help = (f"warm-up iterations left out of each trial (default {WARMUP}; "
                           f"{ITERATIONS - WARMUP} measured, so a schedule that never "
                           "repeats is averaged)")


def _setting(args: argparse.Namespace) -> tuple[Any, Any]:
    """Return the (Cluster, Schedule) of the flags, on top of ``--cluster``'s file."""
    from ddpbench import contract
    from ddpbench.cli import UsageError
    from ddpbench.commands.simulate import cluster_kwargs
    from ddpbench.tune.search import load_setting

    kwargs, _ = cluster_kwargs(args)
    if args.cluster:
        base = load_setting(args.cluster)
        defaults = _flag_defaults()
        flags = {k: v for k, v in kwargs.items() if v != defaults.get(k)}
        if "workers" in flags or "hosts" in flags:
            base.pop("workers", None)
            base.pop("hosts", None)
        kwargs = {"iterations": ITERATIONS, "warmup": WARMUP, **base, **flags}
        if kwargs.get("workers") is None and kwargs.get("hosts") is None:
            kwargs["workers"] = 4
    try:
        cluster = contract.Cluster.from_point(kwargs)
        schedule = contract.Schedule(**{k: v for k, v in kwargs.items()
                                        if k in contract.Schedule.model_fields})
    except ValueError as err:
        raise UsageError(_one_line(err)) from None
    return cluster, schedule


def _flag_defaults() -> dict[str, Any]:
    """Return what :func:`cluster_kwargs` gives when no flag is set."""
    from ddpbench.commands.simulate import cluster_kwargs

    parser = argparse.ArgumentParser()
    add_cluster_flags(parser)
    _steady_state_defaults(parser)
    kwargs, _ = cluster_kwargs(parser.parse_args([]))
    return kwargs


def _one_line(err: Exception) -> str:
    text = str(err)
    if hasattr(err, "errors"):  # a pydantic ValidationError: its first problem
        e = err.errors()[0]
        text = f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}, got {e.get('input')!r}"
    return text


def _is_model_spec(workload: str) -> bool:
    return ":" in workload and not Path(workload).exists()


def _slug(workload: str) -> str:
    name = workload.rsplit(":", 1)[-1] if _is_model_spec(workload) else Path(workload).stem
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "workload"


def _default_folder(workload: str, cluster: Any) -> Path:
    return Path("reports") / "tune" / (
        f"{_slug(workload)}-{cluster.num_hosts}x{cluster.gpus_per_host}-"
        f"{cluster.bandwidth_gbps:g}g-{cluster.transport}")


def _workload(args: argparse.Namespace, folder: Path, schedule: Any) -> str:
    """Return the workload as the simulator takes it: a name or a profile path.

    A PyTorch model spec is profiled here on the CPU (once: a resumed tune reuses the
    profile in the folder).
    """
    from ddpbench.cli import UsageError
    from ddpbench.simulator import load_workload

    if not _is_model_spec(args.workload):
        try:
            load_workload(args.workload)
        except ValueError as err:
            raise UsageError(str(err)) from None
        return str(args.workload)
    import yaml

    from ddpbench import profiling

    path = folder / f"{_slug(args.workload)}.yaml"
    if path.exists():
        return str(path)
    batch = schedule.batch_size or 32
    print(f"profiling {args.workload} on the CPU at batch {batch} (once; kept as {path})",
          file=sys.stderr, flush=True)
    try:
        data = profiling.profile(args.workload, batch_size=batch,
                                 progress=lambda line: print(f"  {line}", file=sys.stderr))
    except ValueError as err:
        raise UsageError(str(err)) from None
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return str(path)


def _check_cost(args: argparse.Namespace, workload: str, request: Any, trials: int | None
                ) -> list[str]:
    """Refuse a tune whose simulations pass the size limits (without ``--allow-large``);
    say what it will cost. Without ``--backends`` (every backend), one whose default
    simulation passes them is left out instead, with a note: return those names."""
    from ddpbench import contract
    from ddpbench.cli import UsageError
    from ddpbench.simulator import estimate

    fields = {**request.cluster.model_dump(), **request.schedule.model_dump()}
    worst = None
    dropped: list[str] = []
    for b in request.space.backends:
        knobs = {**contract.defaults(b), **request.space.fixed.get(b, {})}
        point = {**fields, "servers": knobs.pop("servers", fields["servers"])}
        try:
            est = estimate.estimate(workload, b, **point, **knobs)
            estimate.check(est, allow=args.allow_large)
        except ValueError as err:
            if args.backends is not None or len(dropped) + 1 == len(request.space.backends):
                raise UsageError(f"{b}: {err}") from None
            print(f"{b}: left out of the search: {err}", file=sys.stderr)
            dropped.append(b)
            continue
        if est is not None and (worst is None or est.events > worst.events):
            worst = est
    if worst is not None:
        n = f"{trials} trials" if trials else "each trial"
        total = worst.seconds * (trials or 1) / max(1, args.jobs)
        print(f"each default simulation: up to {worst.describe()}; {n}: about "
              f"{total / 60:,.0f} min with {args.jobs} job(s)", file=sys.stderr)
    return dropped


def main(args: argparse.Namespace) -> int:
    from ddpbench import contract
    from ddpbench.cli import UsageError
    from ddpbench.tune import search
    from ddpbench.tune.space import build_space

    if args.trials is not None and args.trials < 1:
        raise UsageError(f"--trials must be >= 1, got {args.trials}")
    if args.time is not None and not (args.time > 0 and math.isfinite(args.time)):
        raise UsageError(f"--time must be a number of seconds > 0, got {args.time:g}")
    if args.jobs < 1:
        raise UsageError(f"--jobs must be >= 1, got {args.jobs}")
    if args.search_seed < 0:
        raise UsageError(f"--search-seed must be >= 0, got {args.search_seed}")
    if not 0 <= args.stop_within < 100:
        raise UsageError(f"--stop-within must be a percentage in [0, 100), got "
                         f"{args.stop_within:g}")
    if args.confirm is not None and _confirm_only(args):
        return _confirm(args, args.outdir)
    backends = (list(contract.BACKENDS) if args.backends is None
                else [b.strip() for b in args.backends.split(",") if b.strip()])
    try:
        cluster, schedule = _setting(args)
        space = build_space(backends, cluster, fix=args.fix, ranges=args.range,
                            originals_only=args.originals_only, schedule=schedule)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if args.space:
        print(f"search space on {_describe_cluster(cluster)}:")
        print(space.describe())
        return 0
    folder = args.outdir or _default_folder(args.workload, cluster)
    workload = _workload(args, folder, schedule)
    request = search.Request(workload, cluster, schedule, space, seed=args.search_seed)
    trials = args.trials if args.trials is not None or args.time is not None else 100
    if args.confirm is not None:
        _confirm_check(args, workload, cluster, schedule, space.backends)
    dropped = _check_cost(args, workload, request, trials)
    if dropped:
        try:
            space = build_space([b for b in backends if b not in dropped], cluster,
                                fix=args.fix, ranges=args.range,
                                originals_only=args.originals_only, schedule=schedule)
        except ValueError as err:
            raise UsageError(str(err)) from None
        request = search.Request(workload, cluster, schedule, space, seed=args.search_seed)
    if space.empty:
        print(f"the space is empty (every knob fixed or none to tune): only the "
              f"{len(space.backends)} default configuration(s) run", file=sys.stderr)
    try:
        done = search.run(request, folder, trials=trials, seconds=args.time, jobs=args.jobs,
                          executor=args.executor, progress=not args.no_progress,
                          stop_within=args.stop_within / 100)
    except (ValueError, RuntimeError) as err:
        raise UsageError(str(err)) from None
    _print_answer(done, space, folder, cluster, request.to_dict())
    if not args.no_report:
        _render(folder)
    ok = [r for r in done.rows if r["status"] == "ok"]
    if ok and args.confirm is not None:
        return _confirm(args, folder)
    return 0 if ok else 1


_CONFIRM_ONLY = {"outdir", "confirm", "confirm_repetitions", "machine", "no_progress",
                 "no_report", "jobs", "executor", "allow_large"}
"""The flags that may come with ``-o FOLDER --confirm K`` to confirm the tune in FOLDER."""


def _confirm_only(args: argparse.Namespace) -> bool:
    """Return whether to confirm the tune already in ``-o FOLDER`` without searching: it
    holds one, and no flag asks for trials (--trials, --time) or sets another request."""
    if args.outdir is None or not (Path(args.outdir) / "tune.json").exists():
        return False
    parser = argparse.ArgumentParser()
    configure(parser)
    base = vars(parser.parse_args([]))
    return not {k for k, v in vars(args).items() if k in base and v != base[k]} - _CONFIRM_ONLY


def _confirm_check(args: argparse.Namespace, workload: str, cluster: Any, schedule: Any,
                   backends: Any) -> None:
    """Refuse, before any trial, a --confirm that real processes cannot run here."""
    from ddpbench.cli import UsageError
    from ddpbench.tune import confirm

    if args.confirm < 1 or args.confirm_repetitions < 1:
        raise UsageError(f"--confirm and --confirm-repetitions must be >= 1, got "
                         f"{args.confirm} and {args.confirm_repetitions}")
    try:
        confirm.check_setting(workload, cluster.model_dump(), schedule.model_dump(), backends)
    except ValueError as err:
        raise UsageError(str(err)) from None


def _confirm(args: argparse.Namespace, folder: Path) -> int:
    """Run the top configurations and the defaults of the tune in ``folder`` for real."""
    from ddpbench.cli import UsageError
    from ddpbench.tune import confirm

    try:
        plan = confirm.plan(folder, args.confirm, machine=args.machine,
                            repetitions=args.confirm_repetitions)
    except ValueError as err:
        raise UsageError(str(err)) from None
    print(plan.describe(), file=sys.stderr, flush=True)
    try:
        summary = confirm.run(plan, progress=not args.no_progress)
    except (ValueError, RuntimeError) as err:
        raise UsageError(str(err)) from None
    for line in confirm.summary_lines(summary):
        print(line)
    if not args.no_report:
        _render(folder)
    return 0 if summary["compared"] else 1


def _describe_cluster(c: Any) -> str:
    net = f"{c.bandwidth_gbps:g} Gbit/s {c.transport}"
    device = f" {c.device}" if c.device else ""
    return f"{c.num_hosts} hosts x {c.gpus_per_host}{device} GPUs, {net}"


def _print_answer(done: Any, space: Any, folder: Path, cluster: Any,
                  request: dict[str, Any]) -> None:
    from ddpbench.tune import answer
    from ddpbench.tune.space import fmt_value

    rows = [r for r in done.rows if r["status"] == "ok"]
    what = (f"{done.finished} new trial(s) ({done.reused} reused a configuration already "
            f"simulated), {done.failed} failed, in {done.seconds:.1f} s; the study holds "
            f"{len(rows)} finished trial(s)")
    print(f"tune on {_describe_cluster(cluster)}: {what}")
    if done.stopped == "time":
        print("stopped: --time ran out")
    elif done.stopped == "failures":
        print("stopped: too many failed trials (see the error column of results.csv)")
    elif done.stopped == "bound":
        print(f"stopped: {done.stop_text()} (--stop-within 0 spends the whole budget)")
    if not rows:
        return
    default = {r["backend"]: r["iteration_time_s"] for r in rows if r["is_default"]}
    seen, top, own = set(), [], False
    for r in sorted(rows, key=lambda r: (r["iteration_time_s"], r["trial"])):
        knobs = tuple((p.knob, r[p.knob]) for p in space.of(r["backend"]) if p.knob in r)
        if (r["backend"], knobs) in seen:
            continue
        seen.add((r["backend"], knobs))
        top.append((r, knobs))
        if len(top) == 5:
            break
    print(f"{'':3}{'backend':<11}{'iteration ms':>13}{'samples/s':>12}{'vs default':>12}  knobs")
    safe = [answer.verdict_of(request, r).safe for r, _ in top]
    fits = _fits(request, [r for r, _ in top])
    for i, (r, knobs) in enumerate(top, 1):
        base = default.get(r["backend"])
        gain = f"{base / r['iteration_time_s'] - 1:+.1%}" if base else "-"
        text = ", ".join(f"{k}={fmt_value(v)}" for k, v in knobs) or "(no knobs)"
        text += " (default)" if r["is_default"] else ""
        if space.own(r["backend"], dict(knobs)):
            text += " *"
            own = True
        text += "" if safe[i - 1] else " !"
        text += "" if fits[i - 1] else " m"
        print(f"{i:>2} {r['backend']:<11}{r['iteration_time_s'] * 1e3:>13.2f}"
              f"{r['throughput']:>12,.1f}{gain:>12}  {text}")
    if own:
        print("* uses a mechanism of ddpbench's own, not the original's (see the knob's doc; "
              "--originals-only leaves them out)")
    if not all(safe):
        print("! its float16 gradient sums are NOT numerically safe at this world size and "
              "predivide factor (the report's Numerics says why): never recommended")
    if not all(fits):
        print("m its model states do not fit the device's memory (the report's Memory says "
              "how much they need): never recommended while a configuration tried fits")
    if not any(fits):
        print("none of these fits; the report's Answer names the fastest configuration "
              "that does")
    elif default:
        fastest = min(default, key=lambda b: default[b])
        best = next((r for (r, _), ok, fit in zip(top, safe, fits) if ok and fit),
                    top[0][0])
        print(f"best{' numerically safe' if not safe[0] and any(safe) else ''} against the "
              f"fastest default ({fastest}, "
              f"{default[fastest] * 1e3:.2f} ms): "
              f"{default[fastest] / best['iteration_time_s'] - 1:+.1%}")
    print(f"results: {folder / 'results.csv'}")


def _fits(request: Any, rows: list[Any]) -> list[bool]:
    """Return whether each row's model states fit the device
    (:func:`ddpbench.tune.report.memory_cells`; True where it cannot tell)."""
    import pandas as pd

    from ddpbench.tune.report import memory_cells

    return [bool(memory_cells(request, str(r["backend"]), pd.Series(r)).get("fits", True))
            for r in rows]


def _render(folder: Path) -> None:
    try:
        from ddpbench.tune import report
    except ImportError:
        print("report: ddpbench.tune.report is not there yet; results.csv holds the trials")
        return
    paths = report.render(folder)
    main = [p for p in paths if Path(p).name == "report.md"]
    print(f"report: {main[0] if main else folder / 'report.md'}")
