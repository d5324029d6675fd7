"""``ddpbench list``: backends, workloads and shipped experiments."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "list backends (with knobs), workloads and shipped experiments"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("what", nargs="?", choices=["backends", "workloads", "experiments"],
                        help="list only this (default: all)")
    parser.add_argument("--markdown", action="store_true",
                        help="backends: print the README's table (from ddpbench/contract.py)")
    parser.add_argument("--experiments-dir", type=Path, default=None,
                        help="where to look for experiment files (default: ./experiments, "
                        "else the source checkout's)")


def _experiments_dir(given: Path | None) -> Path | None:
    if given is not None:
        return given
    for candidate in (Path("experiments"), Path(__file__).resolve().parents[2] / "experiments"):
        if candidate.is_dir():
            return candidate
    return None


def main(args: argparse.Namespace) -> int:
    import ddpbench
    from ddpbench import contract
    from ddpbench.experiments import schema

    what = args.what
    if args.markdown:
        print(contract.markdown_table())
        return 0
    if what in (None, "backends"):
        real = set(ddpbench.available())
        print("backends ('real' = runs on processes, 'sim' = simulated; knob=default, "
              "(real) = only real runs see it):")
        for name in [*contract.BACKENDS, *sorted(real - set(contract.BACKENDS))]:
            modes = "/".join(m for m, ok in (("sim", _simulated(name)), ("real", name in real))
                             if ok) or "-"
            summary = contract.BACKENDS[name].summary if name in contract.BACKENDS else ""
            print(f"  {name:12s} {modes:9s} {summary}")
            info = contract.knob_info(name) if name in contract.BACKENDS else {}
            for knob in contract.sweep_knobs(name) if info else []:
                i = info[knob]
                where = " (real)" if i["side"] == "real" else ""
                unit = f" {i['unit']}" if i["unit"] else ""
                src = f" [from {i['source']}]" if i["source"] else ""
                print(f"      {knob}={i['default']}{unit}{where}: {i['doc']}{src}")
    if what in (None, "workloads"):
        print("workloads:")
        try:
            from ddpbench import simulator

            for name in simulator.WORKLOADS:
                try:
                    w = simulator.load_workload(name)
                    print(f"  {name:14s} {len(w.tensors):4d} tensors, {w.total_params:>12,d} "
                          f"params, {w.model_bytes / 2**20:8.1f} MiB, batch {w.batch_size}")
                except Exception as err:  # noqa: BLE001 - one broken profile, list the rest
                    print(f"  {name:14s} (cannot load: {err})")
        except ImportError as err:
            print(f"  (simulator not importable: {err})")
    if what in (None, "experiments"):
        folder = _experiments_dir(args.experiments_dir)
        print(f"experiments ({folder or 'no experiments folder found'}):")
        for path in sorted(folder.glob("*.yaml")) if folder else []:
            try:
                exp = schema.load_experiment(path)
                desc = exp.description.split(". ")[0].strip()
                desc = desc if len(desc) <= 70 else desc[:67] + "..."
                print(f"  {path.name:26s} kind={exp.kind:10s} {desc}")
            except schema.ExperimentError as err:
                print(f"  {path.name:26s} INVALID: {err}")
    return 0


def _simulated(name: str) -> bool:
    try:
        from ddpbench import simulator

        return name in getattr(simulator, "STRATEGIES", {})
    except ImportError:
        return False
