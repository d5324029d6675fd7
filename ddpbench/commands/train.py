"""``ddpbench train``: train a zoo model data-parallel through a real backend and report accuracy.

The command launches its own ranks (``ddpbench.launch``). Every worker seeds its model
differently on purpose (seed + 1000 x rank): :func:`ddpbench.broadcast_parameters` makes
them equal at the first forward, and the job checks at the end that the replicas agree.
Worker 0 evaluates its replica on the test set every ``--eval-every`` steps and writes the
curve as JSON, which the parent prints (or the accuracy experiment stores).

Example:
    ddpbench train --model mlp --backend horovod -n 4 --steps 300
    ddpbench train --model cnn --backend collective -n 2 --local-sgd-period 4 --compression fp16
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HELP = "train a small model data-parallel with a real backend; print the accuracy curve"


def _knob(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--knob takes KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def configure(parser: argparse.ArgumentParser) -> None:
    from ddpbench.experiments.accuracy.worker import DEFAULTS

    d = DEFAULTS
    parser.add_argument("--model", default=d["model"], help="mlp (default) or cnn")
    parser.add_argument("--dataset", default=d["dataset"],
                        help="synthetic (default, teacher-student) or digits (needs scikit-learn)")
    parser.add_argument("--backend", default=d["backend"], help="a name from 'ddpbench list'")
    parser.add_argument("-n", "--workers", type=int, default=d["workers"], help="worker ranks")
    parser.add_argument("--servers", default=None,
                        help="parameter-server backends: a number of server ranks, or "
                             "'colocated' (default: colocated)")
    parser.add_argument("--knob", action="append", type=_knob, default=[], metavar="KEY=VALUE",
                        help="a backend option, e.g. --knob fusion_threshold=0 (repeatable)")
    parser.add_argument("--steps", type=int, default=d["steps"])
    parser.add_argument("--batch-size", type=int, default=d["batch_size"],
                        help="samples per worker per step (default 32)")
    parser.add_argument("--lr", type=float, default=d["lr"])
    parser.add_argument("--lr-schedule", choices=["cosine", "constant"], default="cosine",
                        help="cosine decay from --lr to 0 over the steps (default), or constant")
    parser.add_argument("--momentum", type=float, default=d["momentum"])
    parser.add_argument("--compression", choices=["none", "fp16"], default=d["compression"])
    parser.add_argument("--predivide", type=float, default=d["predivide"],
                        help="gradient_predivide_factor (default 1)")
    parser.add_argument("--local-sgd-period", type=int, default=0,
                        help="collective backend: average parameters every P steps (local SGD)")
    parser.add_argument("--nrings", type=int, default=None, help="collective backend: rings")
    parser.add_argument("--update-on-kvstore", action="store_true",
                        help="run the optimizer on the servers (kvstore)")
    parser.add_argument("--seed", type=int, default=d["seed"])
    parser.add_argument("--eval-every", type=int, default=d["eval_every"])
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before the job is killed")
    parser.add_argument("--out", default=None, help="also write the result JSON here")
    parser.add_argument("--format", choices=["table", "json"], default="table")


def main(args: argparse.Namespace) -> int:
    from ddpbench.cli import UsageError, check_writable_file
    from ddpbench.experiments.accuracy.worker import make_config, run_training

    if args.out:
        check_writable_file(args.out, "--out")
    knobs = dict(args.knob)
    if args.nrings is not None:
        knobs["nrings"] = args.nrings
    try:
        cfg = make_config(
            model=args.model, dataset=args.dataset, backend=args.backend, workers=args.workers,
            servers=args.servers, knobs=knobs, steps=args.steps, batch_size=args.batch_size,
            lr=args.lr, lr_schedule=args.lr_schedule, momentum=args.momentum,
            compression=args.compression,
            predivide=args.predivide, local_sgd_period=args.local_sgd_period,
            update_on_kvstore=args.update_on_kvstore, seed=args.seed, eval_every=args.eval_every,
        )
        if cfg["dataset"] == "digits":
            from ddpbench.data import digits

            digits()  # fail here, with the install hint, rather than on every rank
    except (ValueError, ImportError) as err:
        raise UsageError(str(err)) from None
    print(f"# ddpbench train: {cfg['model']} on {cfg['dataset']}, backend {cfg['backend']} "
          f"{cfg['knobs'] or ''}, {cfg['workers']} workers", file=sys.stderr, flush=True)
    try:
        result = run_training(cfg, timeout=args.timeout)
    except (RuntimeError, TimeoutError) as err:
        print(f"ddpbench train: {err}", file=sys.stderr)
        return 1
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    if args.format == "json":
        print(json.dumps(result, indent=1))
        return 0
    c = result["curve"]
    print(f"{'step':>6} {'train_loss':>10} {'test_loss':>10} {'test_acc%':>9}")
    for s, tl, vl, a in zip(c["step"], c["train_loss"], c["test_loss"], c["test_acc"]):
        print(f"{s:>6} {tl:>10.4f} {vl:>10.4f} {a:>9.2f}")
    print(f"\nfinal test accuracy {result['final_test_acc']:.2f}% after {cfg['steps']} steps; "
          f"median step {result['step_time_ms']:.2f} ms; replicas differ by at most "
          f"{result['replica_max_diff']:.3g}")
    return 0
