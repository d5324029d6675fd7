"""``ddpbench list``: backends, workloads and shipped experiments."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "list backends (with knobs), workloads and shipped experiments"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("what", nargs="?", choices=["backends", "workloads", "experiments"],
                        help="list only this (default: all)")
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
    from ddpbench import config

    what = args.what
    if what in (None, "backends"):
        real = set(ddpbench.available())
        knobs = config._known_backends()
        print("backends (knob=default; 'real' = runs on processes, 'sim' = simulated):")
        for name in sorted(set(knobs) | real):
            kn = ", ".join(f"{k}={v}" for k, v in knobs.get(name, {}).items()) or "no knobs"
            modes = "/".join(m for m, ok in (("sim", _simulated(name)), ("real", name in real))
                             if ok) or "-"
            print(f"  {name:12s} {modes:9s} {kn}")
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
                exp = config.load_experiment(path)
                desc = exp.description.split(". ")[0].strip()
                desc = desc if len(desc) <= 70 else desc[:67] + "..."
                print(f"  {path.name:26s} kind={exp.kind:10s} {desc}")
            except config.ExperimentError as err:
                print(f"  {path.name:26s} INVALID: {err}")
    return 0


def _simulated(name: str) -> bool:
    try:
        from ddpbench import simulator

        return name in getattr(simulator, "STRATEGIES", {})
    except ImportError:
        return False
