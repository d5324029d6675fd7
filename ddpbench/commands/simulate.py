"""``ddpbench simulate``: simulate one point from flags and print its figures."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

HELP = "simulate one point (workload, backend, knobs, network) and print its iteration time"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", "-w", default="resnet50",
                        help="profile name or YAML path (default resnet50)")
    parser.add_argument("--backend", "-b", default="p3", help="backend name (default p3)")
    add_cluster_flags(parser)
    parser.add_argument("--knob", "-k", action="append", default=[], metavar="NAME=VALUE",
                        help="a backend knob, e.g. -k slice_params=10000 (repeatable)")
    parser.add_argument("--trace", metavar="FILE", help="write a Chrome trace (chrome://tracing)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    add_allow_flag(parser)


def add_allow_flag(parser: argparse.ArgumentParser) -> None:
    """Add ``--allow-large``: run a simulation past its size estimate's limits (the event
    limit, DDPBENCH_MAX_EVENTS or 50,000,000: about 5 min here; this machine's memory)."""
    from ddpbench import sizes

    sizes.add_allow_flag(parser, "the simulation")


def add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    """Add the flags of the cluster and the schedule (``ddpbench simulate``'s and ``tune``'s)."""
    parser.add_argument("--workers", "-n", type=int, default=None,
                        help="worker processes, one per GPU (default 4, or hosts x "
                             "gpus_per_host with --hosts)")
    parser.add_argument("--servers", default="colocated",
                        help="server hosts, or 'colocated' (default)")
    parser.add_argument("--bandwidth-gbps", type=float, default=10.0,
                        help="per-direction link bandwidth in Gbps (default 10)")
    parser.add_argument("--latency-us", type=float, default=5.0, help="latency in us (default 5)")
    parser.add_argument("--iterations", type=int, default=3, help="iterations (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up iterations (default 1)")
    parser.add_argument("--compute-scale", type=float, default=1.0,
                        help="compute times x this (default 1)")
    parser.add_argument("--oversubscription", type=float, default=1.0,
                        help="core links carry 1/this of their racks' NICs (default 1: "
                             "non-blocking)")
    parser.add_argument("--rack-size", type=int, default=8,
                        help="hosts per rack when oversubscribed (default 8)")
    _cluster_flags(parser)


_FLAGGED = ("workers", "servers", "bandwidth_gbps", "latency_us", "iterations", "warmup",
            "compute_scale", "oversubscription", "rack_size")


def _cluster_flags(parser: argparse.ArgumentParser) -> None:
    """Add one flag per other contract Cluster/Schedule field (same names as in YAML)."""
    from ddpbench import contract

    for model in (contract.Cluster, contract.Schedule):
        for name, f in model.model_fields.items():
            if name in _FLAGGED:
                continue
            extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
            parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=contract.parse_value,
                                default=None, metavar=name.split("_")[-1].upper(),
                                help=f"{(f.description or name).split(chr(10))[0]}: "
                                     f"{extra.get('expect', '')} (default {f.default})")


def cluster_kwargs(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return the cluster and schedule keywords of :func:`add_cluster_flags`' flags.

    Returns:
        ``(kwargs, given)``: every keyword ``simulate`` takes from the flags, and those of
        the other Cluster/Schedule fields that were given.

    Raises:
        UsageError: a malformed ``--servers``.
    """
    from ddpbench import contract
    from ddpbench.cli import UsageError

    servers: object = args.servers
    if servers != "colocated":
        try:
            servers = int(args.servers)
        except ValueError:
            raise UsageError(f"--servers must be a count or 'colocated', got {args.servers!r}"
                             ) from None
    cluster = {k: getattr(args, k) for k in (*contract.Cluster.model_fields,
                                             *contract.Schedule.model_fields)
               if k not in _FLAGGED and getattr(args, k, None) is not None}
    kwargs: dict[str, Any] = dict(
        workers=args.workers if args.workers is not None or args.hosts is not None else 4,
        servers=servers,
        bandwidth_gbps=args.bandwidth_gbps, latency_us=args.latency_us,
        iterations=args.iterations, warmup=args.warmup,
        compute_scale=args.compute_scale, oversubscription=args.oversubscription,
        rack_size=args.rack_size, **cluster,
    )
    return kwargs, cluster


def main(args: argparse.Namespace) -> int:
    from ddpbench import contract
    from ddpbench.cli import UsageError, check_writable_file

    knobs = {}
    for item in args.knob:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--knob expects NAME=VALUE, got {item!r}")
        knobs[name] = contract.parse_value(value)
    from ddpbench import simulator

    kwargs, cluster = cluster_kwargs(args)
    servers = kwargs["servers"]
    for name in knobs:
        if name in kwargs:
            raise UsageError(f"--knob {name}: {name} is a cluster setting; give it as "
                             f"--{name.replace('_', '-')}")
    kwargs.update(knobs)
    if args.trace:  # refused now, not after the simulation
        check_writable_file(args.trace, "--trace")
    from ddpbench.simulator import estimate

    try:
        est = estimate.estimate(args.workload, args.backend, **kwargs)
        estimate.check(est, allow=args.allow_large)
        with _progress(est):
            res = simulator.simulate(args.workload, args.backend, **kwargs)
    except ValueError as err:
        raise UsageError(str(err)) from None
    sent = dict(res.bytes_sent or {})
    out = {
        "workload": args.workload, "backend": args.backend, "knobs": knobs,
        "workers": res.workers, "hosts": res.hosts, "gpus_per_host": res.gpus_per_host,
        **cluster, "bandwidth_gbps": args.bandwidth_gbps,
        "iteration_time_s": res.iteration_time_s, "throughput": res.throughput,
        "bytes_sent_max": max(sent.values()) if sent else None, "events": res.events,
        "timeouts": res.timeouts,
    }
    note = _memory_note(args.workload, args.backend, knobs, res, cluster.get("device"))
    if note is not None:
        out["memory_note"] = note
    if args.json:
        print(json.dumps(out))
    else:
        shape = (f"{res.hosts} hosts x {res.gpus_per_host} GPUs" if res.gpus_per_host > 1
                 else f"{res.workers} workers")
        net = f"{args.bandwidth_gbps:g} Gbps, {args.latency_us:g} us"
        if cluster.get("machine"):
            net = (f"on machine {cluster['machine']}" + (f", paced at {net}"
                                                           if cluster.get("paced") else ""))
        print(f"{args.backend} on {args.workload}, {shape}, {net}: "
              f"iteration {res.iteration_time_s * 1e3:.2f} ms, "
              f"{res.throughput:,.1f} samples/s, "
              f"max bytes sent per host {out['bytes_sent_max'] or 0:,.0f}, {res.events} events")
        _notes(args, cluster, servers)
        if res.timeouts:
            from ddpbench import hardware

            print(f"note: {res.timeouts:,} messages waited TCP's minimum retransmission "
                  f"timeout ({hardware.transport(cluster.get('transport', 'ideal')).rto_min_ms:g}"
                  f" ms) at a switch port over the run: more senders reached a port at once "
                  f"than its {cluster['switch_buffer_kb']:g} KiB buffer holds (TCP incast)")
        if note is not None:
            print(f"warning: {note}")
    return _write_trace(res, args.trace, quiet=args.json) if args.trace else 0


def _memory_note(workload: str, backend: str, knobs: dict[str, Any], res: Any,
                 device: str | None) -> str | None:
    """Return the warning of :func:`ddpbench.simulator.sharded.memory_note` for this point
    (a replica's or a shard's model states beyond the device's memory), or None."""
    from ddpbench.simulator import load_workload
    from ddpbench.simulator.sharded import memory_note

    params = load_workload(workload).total_params
    return memory_note(params, res.workers, backend, knobs, device, res.gpus_per_host)


def _write_trace(res: Any, path: str, *, quiet: bool) -> int:
    """Write the Chrome trace after the result is printed: a trace that cannot be written
    (the disk filled, the folder went away) costs the trace, never the result."""
    try:
        res.to_chrome_trace(path)
    except OSError as err:
        print(f"ddpbench simulate: error: the result above is complete, but its trace could "
              f"not be written to {path}: {err.strerror or err}", file=sys.stderr)
        return 1
    if not quiet:
        print(f"trace: {path}")
    return 0


def _notes(args: argparse.Namespace, cluster: dict[str, Any], servers: Any) -> None:
    """Print what binds below the NIC: one TCP connection's ceiling (a ring's step, or a
    ps-lite process's socket) and a colocated server reached over the loopback."""
    cap = _socket_cap(cluster.get("transport"), args.bandwidth_gbps,
                      cluster.get("socket_gbps"))
    if cap is not None and not cluster.get("machine"):
        why = ("socket_gbps" if cluster.get("socket_gbps") is not None
               else "ddpbench.hardware")
        over = f"over {cluster.get('transport', 'ideal')}"
        flows = _ring_flows(cluster)
        if _is_ring(args.backend) and flows * cap < args.bandwidth_gbps:
            what = ("one TCP connection" if flows == 1
                    else f"{flows} TCP connections of {cap:g}, NCCL's")
            print(f"note: {over} each ring's step to the next host "
                  f"moves at most {flows * cap:g} Gbit/s ({what}, {why}), "
                  f"below the NIC's {args.bandwidth_gbps:g}")
        elif not _is_ring(args.backend):
            print(f"note: {over} each {args.backend} process receives "
                  f"at most {cap:g} Gbit/s (its one ZeroMQ socket, {why}), "
                  f"below the NIC's {args.bandwidth_gbps:g}")
    if (servers == "colocated" and not _is_ring(args.backend)
            and not cluster.get("machine") and _loopback(cluster.get("transport"))):
        print(f"note: over {cluster.get('transport')} each worker reaches the server on "
              f"its own host over the loopback, as ps-lite does: no NIC time, but the "
              f"sender's per-message cost and the receiving socket")


def _loopback(transport: str | None) -> bool:
    """Return whether a colocated server is reached through ``transport``'s stack."""
    from ddpbench import hardware

    return transport is not None and hardware.transport(transport).loopback


def _is_ring(backend: str) -> bool:
    """Return whether ``backend`` is an allreduce (ring) strategy."""
    from ddpbench.simulator.strategies import strategy_class

    return bool(strategy_class(backend).symmetric)


def _ring_flows(cluster: dict[str, Any]) -> int:
    """Return the TCP connections a ring's step to the next host uses: NCCL's channels times
    its sockets on a named GPU (hardware.nccl_channels), else one (MPI)."""
    from ddpbench import hardware

    if not cluster.get("device") or cluster.get("device") == "cpu":
        return 1
    release = hardware.nccl_release(cluster.get("nccl_version"))
    channels = cluster.get("nccl_channels") or hardware.nccl_channels(
        release, cluster.get("intra_link", "pcie"), cluster.get("gpus_per_host", 1))
    return int(channels) * int(cluster.get("nccl_socket_flows") or 1)


def _socket_cap(transport: str | None, bandwidth_gbps: float,
                socket_gbps: float | None) -> float | None:
    """The one-connection ceiling that binds here, or None: a parameter-server process's
    receiving socket, or a ring's connection to its next host (``socket_gbps`` when given,
    else the transport's figure)."""
    from ddpbench import hardware

    if transport is None and socket_gbps is None:
        return None
    return hardware.transport(transport or "ideal").binding_socket_gbps(bandwidth_gbps,
                                                                        socket_gbps)


@contextlib.contextmanager
def _progress(est: Any) -> Iterator[None]:
    """Show the estimate and a time bar on stderr while a simulation of over 3 s runs."""
    if est is None or est.seconds < 3:
        yield
        return
    from tqdm import tqdm

    print(f"simulating {est.describe()}", file=sys.stderr, flush=True)
    done = threading.Event()
    bar = tqdm(total=round(est.seconds), unit="s", desc="simulate (estimated time)",
               file=sys.stderr, dynamic_ncols=True, mininterval=1.0)

    def tick() -> None:
        start = time.monotonic()
        while not done.wait(0.5):
            bar.n = min(bar.total, round(time.monotonic() - start))
            bar.refresh()

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
        bar.close()
