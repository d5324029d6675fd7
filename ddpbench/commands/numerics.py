"""``ddpbench numerics``: predivide-factor numerics of the ring allreduce (emulated).

Subcommands:

- ``sweep [FILE.yaml]``: run the map (world size x factor x dtype x gradients) through the
  runner, as ``ddpbench run`` does, into ``--out``: ``results.csv`` and the report (heatmaps,
  safe-range tables, training). Without a file, flags describe the sweep (defaults: the
  shipped experiment's axes).
- ``query -N 1024 --dtype float16 --scale 1e2``: which factors are safe at one point.
- ``bench -N 4096 --elements 1048576``: time and peak memory of one emulation.
- ``render DIR``: re-render DIR/report.md from DIR/results.csv and DIR/experiment.json.
"""

from __future__ import annotations

import argparse
from typing import Any

HELP = "predivide-factor numerics of the ring allreduce: maps, safe-factor queries, benchmark"


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="numerics_cmd", metavar="ACTION")
    sw = sub.add_parser("sweep", help="run the error/overflow map and write the report")
    sw.add_argument("file", nargs="?", help="a kind: numerics experiment YAML (else flags)")
    sw.add_argument("--out", default="reports/predivide_numerics", help="report folder")
    sw.add_argument("--jobs", type=int, default=2, help="processes (default 2)")
    sw.add_argument("--world-sizes", help="comma list, e.g. 1,2,4,...,4096")
    sw.add_argument("--dtypes", help="comma list of float16,bfloat16,float32")
    sw.add_argument("--dist", action="append", metavar="NAME:S1,S2",
                    help="distribution and scales, e.g. normal:1e-2,1,1e2 (repeatable)")
    sw.add_argument("--elements", type=int, help="elements per rank")
    sw.add_argument("--max-exp", type=int, help="largest factor 2^max_exp")
    sw.add_argument("--step", type=int, help="exponent step of the factor grid")
    sw.add_argument("--no-training", action="store_true", help="skip the training run")
    sw.add_argument("--force", action="store_true",
                    help="run the points the folder already holds again")

    from ddpbench.sizes import add_allow_flag

    add_allow_flag(sw, "every point")
    q = sub.add_parser("query", help="which predivide factors are safe at one point")
    q.add_argument("-N", "--world-size", type=_count, required=True)
    q.add_argument("--dtype", default="float16")
    q.add_argument("--scale", type=float, required=True, help="RMS of one rank's gradient")
    q.add_argument("--dist", default="normal",
                   help="normal, correlated, heavy_tailed or layers (default normal)")
    q.add_argument("--elements", type=_count, default=1 << 16)
    q.add_argument("--factors", help="comma list (default 2^0..2^24 by 4x, sqrt(N), N)")
    add_allow_flag(q, "the emulation")

    b = sub.add_parser("bench", help="time one emulation; print seconds and peak memory")
    b.add_argument("-N", "--world-size", type=_count, default=4096)
    b.add_argument("--elements", type=_count, default=1 << 20)
    b.add_argument("--dtype", default="float16")
    b.add_argument("--dist", default="normal")
    b.add_argument("--scale", type=float, default=1.0)
    b.add_argument("--factor", type=float, default=64.0)
    b.add_argument("--threads", type=int, default=None)
    add_allow_flag(b, "the emulation")

    r = sub.add_parser("render", help="re-render a numerics report folder")
    r.add_argument("dir", help="folder holding results.csv and experiment.json")


def _count(text: str) -> int:
    """A count typed as ``4096`` or ``1e11`` (a whole number in any notation)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    return int(value)


def _floats(text: str, what: str) -> list[float]:
    from ddpbench.cli import UsageError

    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError as err:
        raise UsageError(f"{what}: expected comma-separated numbers, got {text!r}") from err


def _spec(args: argparse.Namespace) -> tuple[Any, dict[str, str]]:
    """Return the validated Spec (file, then flags over it) and the envelope."""
    from pydantic import ValidationError

    from ddpbench.cli import UsageError
    from ddpbench.experiments import schema
    from ddpbench.experiments.numerics import Spec

    raw: dict[str, Any] = {}
    envelope = {"name": "predivide_numerics", "description": "", "source": "<flags>"}
    if args.file:
        try:
            exp = schema.load_experiment(args.file)
        except (schema.ExperimentError, OSError) as err:
            raise UsageError(str(err)) from None
        if exp.kind != "numerics":
            raise UsageError(f"{args.file}: kind is {exp.kind!r}, expected 'numerics'")
        raw = exp.spec.model_dump(mode="json")
        envelope = {"name": exp.name, "description": exp.description, "source": str(args.file)}
    if args.world_sizes:
        raw["world_sizes"] = [int(v) for v in _floats(args.world_sizes, "--world-sizes")]
    if args.dtypes:
        raw["dtypes"] = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if args.dist:
        dists = []
        for item in args.dist:
            name, _, scales = item.partition(":")
            if not scales:
                raise UsageError(f"--dist {item!r}: expected NAME:S1,S2 (e.g. normal:1e-2,1)")
            dists.append({"name": name, "scales": _floats(scales, "--dist")})
        raw["distributions"] = dists
    if args.elements:
        raw["elements"] = args.elements
    grid = dict(raw.get("factors") or {})
    if args.max_exp is not None:
        grid["max_exp"] = args.max_exp
    if args.step is not None:
        grid["step"] = args.step
    if grid:
        raw["factors"] = grid
    if args.no_training:
        raw["training"] = None
    try:
        return Spec.model_validate(raw), envelope
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise UsageError(f"field {loc!r}: {first['msg']}") from None


def _sweep(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from ddpbench.cli import UsageError
    from ddpbench.experiments import runner
    from ddpbench.experiments.numerics import run_sweep

    spec, envelope = _spec(args)
    if args.jobs < 1:
        raise UsageError(f"--jobs must be >= 1, got {args.jobs}")
    out = Path(args.out)
    try:
        summary = run_sweep(spec, out, jobs=args.jobs, force=args.force,
                            name=envelope["name"], description=envelope["description"],
                            source=envelope["source"], allow_large=args.allow_large)
    except (ValueError, RuntimeError) as err:  # a file, another experiment's folder, a lock
        raise UsageError(str(err)) from None
    except OSError as err:  # a full disk, a folder that cannot be made: finished rows kept
        print(f"ddpbench numerics sweep: error: cannot write the results in {args.out}: "
              f"{err}; every point written before is kept: run again to resume",
              file=sys.stderr)
        return 1
    for p in [out / "results.csv", out / "experiment.json", *summary.report]:
        print(p)
    if summary.failed:
        print("failed points:", file=sys.stderr)
        for line in runner.iter_failures(summary):
            print(line, file=sys.stderr)
        return 1
    return 0


def _query(args: argparse.Namespace) -> int:
    from ddpbench import numerics as nm
    from ddpbench import sizes
    from ddpbench.cli import UsageError

    try:
        factors = _floats(args.factors, "--factors") if args.factors else None
        count = len(factors) if factors is not None else len(
            nm.default_factors(nm.check_world_size(args.world_size)))
        sizes.check(nm.emulation_cost(args.world_size, args.elements, args.dtype, count),
                    allow=args.allow_large, advice="emulate fewer ranks or elements")
        res = nm.predivide_safe_range(args.world_size, args.dtype, scale=args.scale,
                                      dist=args.dist, n=args.elements, factors=factors)
    except (ValueError, TypeError) as err:
        raise UsageError(str(err)) from None
    n = args.world_size
    print(f"N={n}, {nm.resolve_dtype(args.dtype).name}, {args.dist} gradients, RMS "
          f"{args.scale:g}, {args.elements} elements per rank, vs the fp64 mean:")
    print(f"{'factor':>12} {'':>8} {'overflow':>9} {'underflow':>9} {'rel L2 err':>11} "
          f"{'max rel err':>11}  safe")
    for r in res["rows"]:
        print(f"{r['factor']:12.6g} {r['factor_label'] if r['factor_label'] in ('N', 'sqrt(N)') else '':>8} "
              f"{r['overflow']:9d} {r['underflow']:9d} {r['rel_l2_err']:11.3g} "
              f"{r['max_rel_err']:11.3g}  {'yes' if r['safe'] else 'no'}")
    rng = res["range"]
    if rng is None:
        print(f"no factor tried is safe for N={n} at this scale")
    else:
        print(f"for N={n} and gradients near {args.scale:g}, factors between {rng[0]:g} and "
              f"{rng[1]:g} are safe")
    return 0


def _bench(args: argparse.Namespace) -> int:
    import resource
    import time

    from ddpbench import numerics as nm
    from ddpbench import sizes
    from ddpbench.cli import UsageError

    try:
        p = nm.check_world_size(args.world_size)
        dtype = nm.resolve_dtype(args.dtype)
        factor = nm.check_factor(args.factor)
        nm.gradient_block(args.dist, args.scale, 1, 0, 1, dtype)
        sizes.check(nm.emulation_cost(p, args.elements, dtype, 1, args.threads),
                    allow=args.allow_large, advice="emulate fewer ranks or elements")
    except (ValueError, TypeError) as err:
        raise UsageError(str(err)) from None
    n = args.elements
    t0 = time.perf_counter()
    c0 = time.process_time()
    emu = nm.emulate(
        lambda lo, hi, out: nm.gradient_block(args.dist, args.scale, p, lo, hi, dtype, 0, out),
        p, n, dtype, [factor], threads=args.threads)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    metrics = emu.metrics(factor)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"emulated N={p} x {n} {dtype.name} ({args.dist}, RMS {args.scale:g}, f={factor:g}): "
          f"{wall:.1f} s wall, {cpu:.1f} s CPU, {p * n / wall / 1e6:.0f} M elements/s, "
          f"peak RSS {peak:.0f} MiB (includes drawing the data and the fp64 reference)")
    print("vs fp64: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                  for k, v in metrics.items()))
    return 0


def _render(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ddpbench.cli import UsageError
    from ddpbench.experiments import runner

    folder = Path(args.dir)
    try:
        exp = runner.load_saved_experiment(folder)
    except (OSError, ValueError, KeyError) as err:
        raise UsageError(f"cannot read {folder}: {err}") from err
    if exp.kind != "numerics":
        raise UsageError(f"{folder} holds a {exp.kind!r} experiment, not a numerics one")
    for p in runner.render(exp, folder):
        print(p)
    return 0


def main(args: argparse.Namespace) -> int:
    from ddpbench.cli import UsageError

    actions = {"sweep": _sweep, "query": _query, "bench": _bench, "render": _render}
    if args.numerics_cmd not in actions:
        raise UsageError(f"name an action: one of {sorted(actions)}")
    return actions[args.numerics_cmd](args)
