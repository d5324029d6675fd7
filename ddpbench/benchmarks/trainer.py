"""``ddpbench bench trainer``: what ``DistributedTrainer.step`` costs over a bare push_pull loop.

For each backend the job times, interleaved step by step on the same gradients:

- ``bare``: the least any data-parallel step must do: ``push_pull_async`` of every gradient
  in backward order (priority -layer, op AVERAGE), wait for all, then the SGD update
  ``w -= lr * g / batch`` in NumPy;
- ``trainer``: the same gradients announced by the backward hooks (``grad_ready``, which
  makes the trainer send them) and ``trainer.step(batch)``.

No forward or backward compute runs, so the difference is the trainer's own overhead
(hooks, bookkeeping, handle waits, optimizer object). Timing is OSU-style: barrier,
``MPI.Wtime`` around one step, the slowest rank's time kept; the table shows medians, and
the ratio trainer / bare. Both loops' results are checked against each other (the final
parameters must be equal: the trainer applies the same arithmetic).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ddpbench.benchmarks import allreduce_scalar

HELP = "time DistributedTrainer.step against a bare loop of push_pull calls (ratio)"


def _model(cfg: dict[str, Any], prefix: str) -> Any:
    from ddpbench import nn

    if cfg["model"] == "cnn":
        return nn.cnn(seed=1, prefix=prefix)
    return nn.mlp(hidden=(cfg["width"],) * cfg["depth"], seed=1, prefix=prefix)


def worker(cfg: dict[str, Any]) -> None:
    from ddpbench.comm import world

    comm = world().role_comm
    rng = np.random.default_rng(comm.rank)
    shape = (cfg["batch"], 1, 8, 8) if cfg["model"] == "cnn" else (cfg["batch"], 64)
    x = rng.standard_normal(shape).astype(np.float32)
    y = rng.integers(0, 10, cfg["batch"])
    rows = [_bench_one(spec, cfg, comm, x, y) for spec in cfg["backends"]]
    if comm.rank == 0:
        Path(cfg["out"]).write_text(json.dumps(rows))


def _bench_one(spec: str, cfg: dict[str, Any], comm: Any, x: Any, y: Any) -> dict[str, Any]:
    from mpi4py import MPI

    import ddpbench
    from ddpbench import nn

    name, _, rest = spec.partition(":")
    opts = {k: json.loads(v) for k, _, v in (o.partition("=") for o in rest.split(",") if o)}
    if "sum_order" in ddpbench.api.backend_class(name).Options.model_fields:
        # Servers add pushes as they arrive (the originals'); the bit-for-bit comparison of
        # two runs of the same gradients needs ddpbench's rank order.
        opts.setdefault("sum_order", "rank")
    kv = ddpbench.create(name, **opts)
    bare_m, tr_m = _model(cfg, f"bare.{name}."), _model(cfg, f"tr.{name}.")
    for m in (bare_m, tr_m):
        _, d = nn.softmax_cross_entropy(m.forward(x), y)
        m.backward(d)
    ddpbench.broadcast_parameters(bare_m.parameters(), kv=kv)
    ddpbench.broadcast_parameters(tr_m.parameters(), kv=kv)
    lr, b = np.float32(cfg["lr"]), cfg["batch"]
    trainer = ddpbench.DistributedTrainer(tr_m.parameters(), nn.SGD(lr=cfg["lr"]), kv=kv)
    bare_ps, tr_ps = bare_m.parameters(), tr_m.parameters()
    grads = [p.grad.copy() for p in bare_ps]  # the same gradients every step
    scale = np.float32(1.0 / b)

    def bare_step() -> None:
        for p, g in zip(bare_ps, grads):
            p.grad[...] = g
        handles = [kv.push_pull_async(p.name, p.grad, priority=-p.layer, op="average")
                   for p in reversed(bare_ps)]
        for h in handles:
            h.wait()
        for p in bare_ps:
            p.data -= lr * (p.grad * scale)

    def trainer_step() -> None:
        for p, g in zip(tr_ps, grads):
            p.grad[...] = g
        for p in reversed(tr_ps):
            p.grad_ready()
        trainer.step(b)

    samples: dict[str, list[float]] = {"bare": [], "trainer": []}
    pair = [("bare", bare_step), ("trainer", trainer_step)]
    for it in range(cfg["warmup"] + cfg["iters"]):
        # Alternate which goes first, so neither always runs right after the other.
        for label, fn in (pair if it % 2 == 0 else pair[::-1]):
            comm.Barrier()
            t0 = MPI.Wtime()
            fn()
            dt = allreduce_scalar(comm, MPI.Wtime() - t0, "max")
            if it >= cfg["warmup"]:
                samples[label].append(dt)
    diff = max(float(np.max(np.abs(p.data - q.data))) for p, q in zip(bare_ps, tr_ps))
    trainer.close()
    kv.close()
    return {
        "backend": spec, "ranks": comm.size, "tensors": len(bare_ps),
        "params": int(sum(p.data.size for p in bare_ps)),
        "bare_us": 1e6 * float(np.median(samples["bare"])),
        "trainer_us": 1e6 * float(np.median(samples["trainer"])),
        "bare_min_us": 1e6 * min(samples["bare"]),
        "trainer_min_us": 1e6 * min(samples["trainer"]),
        "max_param_diff": diff,
    }


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backends", default="mpi,horovod,collective",
                        help="comma-separated; options as name:key=value (default "
                             "mpi,horovod,collective)")
    parser.add_argument("-n", "--ranks", type=int, default=2, help="worker ranks (default 2)")
    parser.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    parser.add_argument("--width", type=int, default=256, help="MLP hidden units (default 256)")
    parser.add_argument("--depth", type=int, default=2, help="MLP hidden layers (default 2)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--format", choices=["table", "json"], default="table")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--framework", choices=["numpy", "torch"], default="numpy",
                        help="numpy: DistributedTrainer against a bare push_pull loop "
                             "(default); torch: ddpbench.torch on each backend against "
                             "torch DDP on gloo, on a torchvision model")
    parser.add_argument("--torch-model", default="torchvision:resnet18",
                        help="--framework torch: the model (default torchvision:resnet18)")
    parser.add_argument("--input-shape", default="3,64,64",
                        help="--framework torch: one sample's shape (default 3,64,64)")
    parser.add_argument("--threads", type=int, default=1,
                        help="--framework torch: torch threads per rank (default 1)")


def main(args: argparse.Namespace) -> int:
    import ddpbench
    from ddpbench.cli import UsageError

    if args.ranks < 1 or args.iters < 1 or args.warmup < 0 or args.width < 1 or args.depth < 1:
        raise UsageError("need --ranks, --iters, --width, --depth >= 1 and --warmup >= 0")
    backends = [b for b in args.backends.split(",") if b]
    for spec in backends:
        try:
            ddpbench.api.backend_class(spec.partition(":")[0])
        except ValueError as err:
            raise UsageError(str(err)) from None
    if args.framework == "torch":
        return _main_torch(args, backends)
    cfg = {"backends": backends, "model": args.model, "width": args.width,
           "depth": args.depth, "batch": args.batch, "lr": args.lr,
           "warmup": args.warmup, "iters": args.iters}
    rows = _run_job("ddpbench.benchmarks.trainer", cfg, args,
                    f": {args.ranks} ranks, {args.model}, {', '.join(backends)}")
    if rows is None:
        return 1
    if args.format == "json":
        print(json.dumps(rows, indent=1))
    else:
        print(f"{'backend':<22} {'n':>2} {'tensors':>7} {'params':>9} {'bare_us':>9} "
              f"{'trainer_us':>10} {'ratio':>6} {'overhead_us':>11} {'min_ratio':>9} "
              f"{'max|dw|':>8}")
        for r in rows:
            print(f"{r['backend']:<22} {r['ranks']:>2} {r['tensors']:>7} {r['params']:>9} "
                  f"{r['bare_us']:>9.1f} {r['trainer_us']:>10.1f} "
                  f"{r['trainer_us'] / r['bare_us']:>6.3f} "
                  f"{r['trainer_us'] - r['bare_us']:>11.1f} "
                  f"{r['trainer_min_us'] / r['bare_min_us']:>9.3f} {r['max_param_diff']:>8.2g}")
        print("\n# ratio = trainer step / bare push_pull loop (median of the slowest rank per "
              "step, same run, interleaved); min_ratio = the same on the fastest step; "
              "max|dw| = final parameter difference")
    return 1 if any(r["max_param_diff"] != 0 for r in rows) else 0


def _run_job(module: str, cfg: dict[str, Any], args: argparse.Namespace,
             what: str) -> list[dict[str, Any]] | None:
    """Launch ``module``'s worker with ``cfg`` on ``args.ranks`` ranks; return rank 0's rows.

    Prints ``what`` as the run's header first; None (after saying so) when the job failed.
    """
    from ddpbench.launch import launch

    print(f"# ddpbench bench trainer {what}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="ddpbench-bench-") as tmp:
        out = Path(tmp) / "rows.json"
        rc = launch([sys.executable, "-m", module, json.dumps({**cfg, "out": str(out)})],
                    args.ranks, timeout=args.timeout)
        rows = json.loads(out.read_text()) if out.exists() else []
    if rc != 0 or not rows:
        print(f"ddpbench bench trainer: the benchmark job failed (exit {rc})", file=sys.stderr)
        return None
    return list(rows)


def _main_torch(args: argparse.Namespace, backends: list[str]) -> int:
    from ddpbench.benchmarks.trainer_torch import print_table
    from ddpbench.cli import UsageError

    try:
        shape = [int(d) for d in args.input_shape.split(",")]
    except ValueError:
        raise UsageError(f"--input-shape expects C,H,W, got {args.input_shape!r}") from None
    try:
        from ddpbench.profiling.model import build_model

        build_model(args.torch_model)
    except (ValueError, ImportError) as err:
        raise UsageError(str(err)) from None
    cfg = {"backends": backends, "model": args.torch_model, "input_shape": shape,
           "batch": args.batch, "lr": args.lr, "threads": args.threads,
           "warmup": args.warmup, "iters": args.iters}
    rows = _run_job("ddpbench.benchmarks.trainer_torch", cfg, args,
                    f"--framework torch: {args.ranks} ranks, {args.torch_model} batch "
                    f"{args.batch} x {args.input_shape}, DDP (gloo) and {', '.join(backends)}")
    if rows is None:
        return 1
    if args.format == "json":
        print(json.dumps(rows, indent=1))
    else:
        print_table(rows)
    # Same start, same batches: a variant far from DDP's parameters computed something else.
    # At 2 ranks the sums are exact (equal bits); from 3 ranks MPI's and gloo's summation
    # orders differ in the last bit and a few dozen SGD steps amplify that (below the 0.05
    # bound), while a wrong reduction (a sum for an average, a stale gradient) moves
    # parameters by whole updates.
    return 1 if any(r["max_param_diff"] > 0.05 for r in rows) else 0


if __name__ == "__main__":
    worker(json.loads(sys.argv[1]))
