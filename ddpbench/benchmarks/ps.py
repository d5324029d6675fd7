"""``ddpbench bench ps``: the parameter-server backends on real ranks against the simulator.

Each backend runs in its own job (``ddpbench.launch``): W workers train a workload profile
(VGG-19 by default) with emulated compute (``time.sleep`` of each layer's forward and
backward time times ``--compute-scale``) and real communication of the profile's tensors
(element counts divided by ``--model-scale``), paced at ``--bandwidth-gbps`` per direction
so that communication dominates as on a real network. The loop is the simulator's: after
the backward of layer i its gradients are pushed with priority -i; the forward of layer i in
the next iteration waits for them; iteration t ends when every worker has every part of
iteration t back. The same point is then simulated (``simulator.simulate``) and the command
prints, per backend: real and simulated iteration time, the ratio to kvstore on each side,
the relative error of the simulation, and the bytes each worker sent per iteration, real
(counted by the transport) and simulated.
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

HELP = "run kvstore, p3, byteps on paced real ranks and compare with the simulator"


def scaled_workload(name: str, model_scale: float) -> Any:
    """The profile ``name`` with every tensor's element count divided by ``model_scale``."""
    from ddpbench.simulator import load_workload
    from ddpbench.simulator.workload import Tensor

    wl = load_workload(name)
    tensors = tuple(Tensor(name=t.name, layer=t.layer, numel=max(1, int(t.numel / model_scale)))
                    for t in wl.tensors)
    return wl.model_copy(update={"tensors": tensors, "name": f"{wl.name}/{model_scale:g}"})


# -- worker side ----------------------------------------------------------------------------
def _stamp(times: list[float]) -> Any:
    """Return a done-callback that appends the completion time to ``times``."""
    return lambda _handle: times.append(time.monotonic())


def worker(cfg: dict[str, Any]) -> None:
    import ddpbench
    from ddpbench.backends.ps.worker import PSStore
    from ddpbench.comm import engine, precise_timers, world

    ddpbench.init()  # a server rank serves here and exits
    precise_timers()  # the layers' sleeps take what they ask (comm.precise_timers)
    wl = scaled_workload(cfg["workload"], cfg["model_scale"]).scaled(cfg["compute_scale"])
    kv = ddpbench.create(cfg["backend"], bandwidth_gbps=cfg["bandwidth_gbps"],
                         latency_us=cfg["latency_us"], trace=True, **cfg["knobs"])
    if not isinstance(kv, PSStore):
        raise ValueError(f"bench ps runs parameter-server backends, got {cfg['backend']!r}")
    w = world()
    grads = [np.ones(t.numel, np.float32) for t in wl.tensors]
    by_layer: list[list[int]] = [[] for _ in wl.layers]
    for key, t in enumerate(wl.tensors):
        by_layer[t.layer].append(key)
    kv.broadcast(list(range(len(grads))), grads)  # init, forward order: fixes placement
    iters = cfg["iterations"]
    done_at: list[list[float]] = [[] for _ in range(iters)]
    handles: list[list[Any]] = [[] for _ in wl.layers]
    # A barrier through the store: a blocking MPI collective on the engine thread would
    # stall the colocated servers that other workers are still waiting on.
    kv.push_pull(len(grads), np.zeros(1, np.float32))
    t_start = time.monotonic()
    for t in range(iters):
        for i, layer in enumerate(wl.layers):
            for h in handles[i]:
                h.wait()
            time.sleep(layer.fwd_s)
        for i in range(len(wl.layers) - 1, -1, -1):
            time.sleep(wl.layers[i].bwd_s)
            hs = []
            for key in by_layer[i]:
                h = kv.push_pull_async(key, grads[key], priority=-i)
                h.add_done_callback(_stamp(done_at[t]))
                hs.append(h)
            handles[i] = hs
    kv.synchronize()
    ends = np.array([max(d) - t_start for d in done_at])
    kv.close()
    # Gradient bytes this host sent (its pushes, and colocated its server's pulls), from the
    # send trace: the broadcast and the barrier are left out.
    sent = sum(r.bytes for r in kv.trace_records
               if r.kind in ("push", "pull") and r.key < len(grads)) / iters  # collective: after it no server needs this engine any more
    rows = engine().call(lambda: w.role_comm.gather((ends.tolist(), sent), root=0)).wait()
    if w.role_rank == 0:
        ends_all = np.max(np.array([r[0] for r in rows]), axis=0)
        warm = cfg["warmup"]
        iter_s = (ends_all[-1] - ends_all[warm - 1]) / (iters - warm)
        row = {"backend": cfg["backend"], "iteration_s": float(iter_s),
               "ends": ends_all.tolist(), "bytes_sent": [r[1] for r in rows]}
        Path(cfg["out"]).write_text(json.dumps(row))


# -- command --------------------------------------------------------------------------------
def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", default="vgg19", help="profile name (default vgg19)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--servers", default="colocated",
                        help="'colocated' (one server per worker process, P3's setup) or a "
                             "number of dedicated server ranks")
    parser.add_argument("--backends", default="kvstore,p3,byteps",
                        help="comma-separated; the first is the baseline of the ratios")
    parser.add_argument("--bandwidth-gbps", type=float, default=0.25,
                        help="pacing per direction per process (default 0.25: communication dominates)")
    parser.add_argument("--latency-us", type=float, default=0.0,
                        help="added one-way delay per message, real and simulated")
    parser.add_argument("--model-scale", type=float, default=32.0,
                        help="divide every tensor's element count by this")
    parser.add_argument("--compute-scale", type=float, default=0.2,
                        help="multiply every layer's compute time by this")
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--knob", action="append", default=[], metavar="BACKEND:K=V",
                        help="a backend knob, e.g. p3:water_mark=4 (repeatable)")
    parser.add_argument("--timeout", type=float, default=600.0)


def _parse_knobs(specs: list[str], backends: list[str]) -> dict[str, dict[str, Any]]:
    from ddpbench.cli import UsageError

    knobs: dict[str, dict[str, Any]] = {b: {} for b in backends}
    for spec in specs:
        backend, _, kv = spec.partition(":")
        key, _, value = kv.partition("=")
        if backend not in knobs or not key or not value:
            raise UsageError(f"--knob {spec!r}: expected BACKEND:KEY=VALUE with BACKEND one of "
                             f"{backends}")
        knobs[backend][key] = json.loads(value)
    return knobs


def main(args: argparse.Namespace) -> int:
    from ddpbench.cli import UsageError
    from ddpbench.launch import launch

    backends = [b for b in args.backends.split(",") if b]
    if args.servers == "colocated":
        servers: int | str = "colocated"
    else:
        try:
            servers = int(args.servers)
        except ValueError:
            raise UsageError(f"--servers {args.servers!r}: expected 'colocated' or a count") from None
    if args.workers < 1 or args.iterations <= args.warmup or args.warmup < 1:
        raise UsageError("need --workers >= 1 and 1 <= --warmup < --iterations")
    knobs = _parse_knobs(args.knob, backends)
    wl = scaled_workload(args.workload, args.model_scale)
    print(f"# ddpbench bench ps: {wl.name} ({wl.total_params:,} params, "
          f"{wl.model_bytes / 1e6:.1f} MB fp32), {args.workers} workers, servers {servers}, "
          f"{args.bandwidth_gbps:g} Gbit/s paced, compute x{args.compute_scale:g}",
          file=sys.stderr, flush=True)
    real: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="ddpbench-ps-") as tmp:
        for backend in backends:
            out = Path(tmp) / f"{backend}.json"
            cfg = {"backend": backend, "workload": args.workload,
                   "model_scale": args.model_scale, "compute_scale": args.compute_scale,
                   "bandwidth_gbps": args.bandwidth_gbps, "latency_us": args.latency_us,
                   "iterations": args.iterations, "warmup": args.warmup,
                   "knobs": knobs[backend], "out": str(out)}
            nserv = servers if isinstance(servers, int) else 0
            rc = launch([sys.executable, "-m", "ddpbench.benchmarks.ps", json.dumps(cfg)],
                        args.workers, nserv, timeout=args.timeout)
            if rc != 0 or not out.exists():
                print(f"ddpbench bench ps: the {backend} job failed (exit {rc})", file=sys.stderr)
                return 1
            real[backend] = json.loads(out.read_text())
    sim: dict[str, Any] = {}
    try:
        from ddpbench.simulator import simulate

        for backend in backends:
            sim[backend] = simulate(wl, backend, workers=args.workers, servers=servers,
                                    bandwidth_gbps=args.bandwidth_gbps,
                                    latency_us=args.latency_us, iterations=args.iterations,
                                    warmup=args.warmup, compute_scale=args.compute_scale,
                                    trace=False, **knobs[backend])
    except ImportError as err:
        print(f"# simulator unavailable ({err}); real side only", file=sys.stderr)
    _print(real, sim, backends, args.workers)
    return 0


def _print(real: dict, sim: dict, backends: list[str], workers: int) -> None:
    base = backends[0]
    print(f"{'backend':<10} {'real_s':>8} {'sim_s':>8} {'err':>7} {'real/' + base:>13} "
          f"{'sim/' + base:>12}   bytes/iter per worker: real | simulated")
    for b in backends:
        r = real[b]["iteration_s"]
        rb = real[base]["iteration_s"]
        line = f"{b:<10} {r:8.4f} "
        s = sim.get(b)
        if s is not None:
            sb = sim[base].iteration_time_s
            err = (s.iteration_time_s - r) / r
            line += f"{s.iteration_time_s:8.4f} {err:+7.1%} {r / rb:13.3f} {s.iteration_time_s / sb:12.3f}"
            sim_bytes = [int(s.bytes_sent[f"worker{w}"]) for w in range(workers)]
        else:
            line += f"{'-':>8} {'-':>7} {r / rb:13.3f} {'-':>12}"
            sim_bytes = []
        real_bytes = [int(x) for x in real[b]["bytes_sent"]]
        line += f"   {real_bytes} | {sim_bytes}"
        print(line)
    if sim:
        print(f"\n# relative error of the simulated ratio to {base}:")
        for b in backends[1:]:
            rr = real[b]["iteration_s"] / real[base]["iteration_s"]
            sr = sim[b].iteration_time_s / sim[base].iteration_time_s
            print(f"{b:<10} real {rr:.3f}  simulated {sr:.3f}  error {(sr - rr) / rr:+.1%}")


if __name__ == "__main__":
    worker(json.loads(sys.argv[1]))
