"""``ddpbench bench pushpull``: a large key's push-pull against MPI point-to-point.

Each backend runs in its own job (``ddpbench.launch``) of W workers and S server ranks
(default one of each: a worker and its server). Before the store opens, the job times the
baseline on the same ranks: the push-pull's traffic in bare MPI point-to-point, every
worker sending ``bytes / S`` to each server and each server answering every worker once
all are in (with W = S = 1, a ping-pong), ``Isend``/``Irecv`` on preallocated buffers.
``ratio = baseline time / push-pull time`` is the share of MPI's point-to-point bandwidth
the backend reaches (1.0: as fast as the bare wire); every job is one sample, and
``--rounds`` runs each backend's job several times in turn so that drift of a shared
machine falls on every row alike. ``--size`` may list several sizes (``4K,16M``): one key
each, one row each, every one against its own baseline; at a small size the ratio is one of
latencies (what the transport's per-message cost leaves of MPI's). Each timed push-pull is
checked against the closed form (the sum of every worker's input).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HELP = "time a large key's push-pull on kvstore, p3, byteps against an MPI ping-pong"


def _pingpong(comm: Any, workers: int, nbytes: int, warmup: int, iters: int) -> list[float]:
    """Bare MPI with a push-pull's traffic: every worker sends ``nbytes / S`` to each of
    the S server ranks (``workers..size-1``), each server answers every worker once all
    are in; preallocated buffers, ``Isend``/``Irecv``/``Waitall``."""
    from mpi4py import MPI

    servers = comm.size - workers
    share = nbytes // servers
    me = comm.rank
    peers = list(range(workers, comm.size)) if me < workers else list(range(workers))
    out = [np.ones(share, np.uint8) for _ in peers]
    back = [np.empty(share, np.uint8) for _ in peers]
    samples = []
    for i in range(warmup + iters):
        comm.Barrier()
        t0 = MPI.Wtime()
        if me < workers:
            reqs = [comm.Irecv(b, p, 78) for b, p in zip(back, peers)]
            reqs += [comm.Isend(o, p, 77) for o, p in zip(out, peers)]
            MPI.Request.Waitall(reqs)
        else:
            MPI.Request.Waitall([comm.Irecv(b, p, 77) for b, p in zip(back, peers)])
            MPI.Request.Waitall([comm.Isend(o, p, 78) for o, p in zip(out, peers)])
        if i >= warmup:
            samples.append(MPI.Wtime() - t0)
    return samples


def worker(cfg: dict[str, Any]) -> None:
    import ddpbench
    from ddpbench.comm import world

    w = world()
    sizes = cfg["sizes"]
    base = [_pingpong(w.comm, w.num_workers, n, cfg["warmup"], cfg["iters"]) for n in sizes]
    kv = ddpbench.create(cfg["backend"], servers=w.num_servers, **cfg["knobs"])
    # (a server rank serves in create and exits when the workers close)
    want = float(sum(range(1, w.num_workers + 1)))
    rows = []
    for key, (nbytes, ping) in enumerate(zip(sizes, base), start=1):  # key 0: the barrier
        x = np.full(nbytes // 4, float(w.rank + 1), np.float32)
        y = np.empty_like(x)
        samples, wrong = [], 0
        for i in range(cfg["warmup"] + cfg["iters"]):
            kv.push_pull(0, np.zeros(1, np.float32))  # a barrier through the store
            t0 = time.perf_counter()
            kv.push_pull(key, x, output=y)
            dt = time.perf_counter() - t0
            if i >= cfg["warmup"]:
                samples.append(dt)
                wrong += int(np.count_nonzero(y != want))
        rows.append({"bytes": nbytes, "pingpong_s": float(np.median(ping)),
                     "pushpull_s": float(np.median(samples)), "wrong": wrong})
    kv.close()
    if w.rank == 0:
        Path(cfg["out"]).write_text(json.dumps({"backend": cfg["backend"], "sizes": rows}))


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backends", default="kvstore,p3,byteps",
                        help="comma-separated parameter-server backends, knobs as "
                             "name:key=value (e.g. p3:slice_params=1000000)")
    parser.add_argument("--size", default="16M",
                        help="the key's bytes (float32), e.g. 16M, a list, e.g. 4K,16M, or a "
                             "range LO:HI (doubling): one key per size, each timed against "
                             "its own baseline in the same job")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--servers", type=int, default=1, help="dedicated server ranks")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3,
                        help="run every backend's job this many times in turn (a fresh "
                             "baseline each time); rows give the medians")
    parser.add_argument("--timeout", type=float, default=300.0)


def main(args: argparse.Namespace) -> int:
    from ddpbench.benchmarks.allreduce import (
        _backend_spec,
        check_backend_specs,
        human,
        parse_sizes,
    )
    from ddpbench.cli import UsageError
    from ddpbench.launch import launch

    try:
        sizes = parse_sizes(args.size)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if (not sizes or min(sizes) < 4 or args.workers < 1 or args.servers < 1 or args.iters < 1
            or args.warmup < 0):
        raise UsageError("need --size >= 4 bytes, --workers >= 1, --servers >= 1, "
                         "--iters >= 1 and --warmup >= 0")
    sizes = [n - n % 4 for n in sizes]
    specs = [s for s in args.backends.split(",") if s]
    check_backend_specs(specs)
    print(f"# ddpbench bench pushpull: a float32 key of {', '.join(human(n) for n in sizes)}; "
          f"{args.workers} worker(s), {args.servers} server rank(s); baseline: the same "
          f"traffic in bare MPI point-to-point, in the same job", file=sys.stderr, flush=True)
    if args.rounds < 1:
        raise UsageError("need --rounds >= 1")
    got: dict[str, list[dict[str, Any]]] = {spec: [] for spec in specs}
    with tempfile.TemporaryDirectory(prefix="ddpbench-pushpull-") as tmp:
        for round_ in range(args.rounds):
            for spec in specs:
                label, name, knobs = _backend_spec(spec)
                out = Path(tmp) / "row.json"
                cfg = {"backend": name, "knobs": knobs, "sizes": sizes,
                       "warmup": args.warmup, "iters": args.iters, "out": str(out)}
                rc = launch([sys.executable, "-m", "ddpbench.benchmarks.pushpull",
                             json.dumps(cfg)], args.workers, args.servers, timeout=args.timeout)
                if rc != 0 or not out.exists():
                    print(f"ddpbench bench pushpull: the {label} job failed (exit {rc})",
                          file=sys.stderr)
                    return 1
                got[spec].append(json.loads(out.read_text()))
                out.unlink()
            print(f"  round {round_ + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    print(f"{'backend':<28} {'size':>6} {'mpi_p2p_us':>12} {'pushpull_us':>12} {'p2p_GB/s':>9} "
          f"{'pp_GB/s':>8} {'ratio':>6} {'min':>6} {'max':>6} {'#wrong':>6}")
    wrong = 0
    for spec in specs:
        for k, nbytes in enumerate(sizes):
            rows = [job["sizes"][k] for job in got[spec]]
            moved = 2 * nbytes / 1e9
            ping = float(np.median([r["pingpong_s"] for r in rows]))
            pp = float(np.median([r["pushpull_s"] for r in rows]))
            ratios = [r["pingpong_s"] / r["pushpull_s"] for r in rows]
            bad = sum(r["wrong"] for r in rows)
            wrong += bad
            print(f"{spec:<28} {human(nbytes):>6} {ping * 1e6:12.1f} {pp * 1e6:12.1f} "
                  f"{moved / ping:9.3f} {moved / pp:8.3f} {float(np.median(ratios)):6.3f} "
                  f"{min(ratios):6.3f} {max(ratios):6.3f} {bad:6d}")
    print("# ratio: bare MPI time / push-pull time, per job (median, min, max over the "
          "rounds) = the share of MPI point-to-point bandwidth a push-pull reaches "
          "(target >= 0.6 at 16 MiB; for a small key it is a ratio of latencies: what the "
          "transport's per-message cost leaves of MPI's)")
    return 1 if wrong else 0


if __name__ == "__main__":
    worker(json.loads(sys.argv[1]))
