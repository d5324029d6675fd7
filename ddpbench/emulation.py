"""Compute emulation on real processes: the worker program and the launch of one real point.

The worker program (run under ``ddpbench launch``, or a plain ``mpiexec`` for the allreduce
backends)::

    ddpbench launch -n 2 -- python -m ddpbench.emulation --workload resnet50 \\
        --backend horovod --size-scale 0.01 --compute-scale 0.1 --out result.json

Each worker builds the profile's gradient tensors (float32, each ``numel x size_scale``
elements, at least one) and emulates the profile's per-layer forward and backward times
(``x compute_scale``) by sleeping or spinning; a sleeping worker's main thread runs with 1 us
of timer slack (:func:`ddpbench.comm.precise_timers`), since Linux's default 50 us makes
every sleep oversleep. Backward produces layer L's gradients after its compute and sends
them at once with ``push_pull_async(priority=-L)``; the next forward waits for layer L's
gradients just before computing layer L, so communication overlaps compute as in a real
framework. Iteration time is the time between the starts of successive iterations (the last
one ends when every gradient has arrived); the first ``--warmup`` iterations are not counted.

Every result is checked: each worker pushes ``rank + 1`` everywhere, so every reduced
element must equal ``W (W + 1) / 2``. A sharding store (``zero``, ``fsdp``) trains instead
as DeepSpeed and FSDP do: it holds the parameters and the update, units are gathered before
their forward and backward and reduced by the front-end rule
(:class:`ddpbench.rules.unshard.UnitSchedule`, the one :mod:`ddpbench.torch` uses), the
iteration ends with the step, and every gathered value is checked (:func:`_run_sharded`).
Worker 0 writes the timings as JSON to ``--out`` (and prints them); a failing rank writes
its error to ``<out>.rank<R>.err`` and exits non-zero.

``--then`` runs further phases in the same job, each with a store of its own created after
the previous one closed (``ddpbench calibrate`` times three workloads per launch so, sparing
process start-ups). Each phase is a JSON object of the options above (``workload``,
``knobs``, ``iterations``, ``warmup``, ``compute_scale``, ``size_scale``; the ones left out
keep the first phase's values, knobs included); the result then lists every phase's under
``"phases"``. Dedicated server ranks serve one phase's store after another
(``serve(last=False)`` until the last phase).

:func:`run_real` runs one real point (a ``throughput`` experiment's, or a calibration
round's) with this program and returns its result row. The module sits below the
experiments and the calibration, which both use it (the workload profiles come from
:func:`ddpbench.simulator.workload.load_workload`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from ddpbench import contract
from ddpbench.contract import COMMON_AXES
from ddpbench.launch import launch_logged

__all__ = ["PHASE_KEYS", "REAL_KEYS", "cluster_params", "knobs_of", "load_workload", "main",
           "phases", "run", "run_real", "scale_sizes"]

REAL_KEYS = ("compute", "timeout_s", "bind")
"""A real point's run settings (not knobs, not axes): how the worker emulates compute, the
job's timeout and how its ranks are placed."""


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ddpbench.emulation",
                                description=__doc__.split("\n")[0])
    p.add_argument("--workload", required=True, help="profile name or YAML path")
    p.add_argument("--backend", required=True, help="a name from ddpbench.available()")
    p.add_argument("--knobs", default="{}", help="backend knobs as a JSON object")
    p.add_argument("--iterations", type=int, default=3, help="timed iterations (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="untimed iterations first (default 1)")
    p.add_argument("--compute-scale", type=float, default=1.0,
                   help="per-layer compute time x this (default 1.0)")
    p.add_argument("--size-scale", type=float, default=1.0,
                   help="gradient sizes x this, in (0, 1] (default 1.0)")
    p.add_argument("--compute", choices=["sleep", "spin"], default="sleep",
                   help="emulate compute by sleeping (default; fair on few cores) or spinning")
    p.add_argument("--out", default=None, help="write worker 0's result JSON here")
    p.add_argument("--then", default="[]",
                   help="further phases in this job, a JSON list of objects with any of "
                        f"{', '.join(PHASE_KEYS)} (default: none)")
    args = p.parse_args(argv)
    if args.iterations < 1 or args.warmup < 0:
        p.error("--iterations must be >= 1 and --warmup >= 0")
    if not 0 < args.size_scale <= 1:
        p.error(f"--size-scale must be in (0, 1], got {args.size_scale}")
    if args.compute_scale < 0:
        p.error(f"--compute-scale must be >= 0, got {args.compute_scale}")
    try:
        args.phases = phases(args)
    except ValueError as err:
        p.error(str(err))
    return args


PHASE_KEYS = ("workload", "knobs", "iterations", "warmup", "compute_scale", "size_scale")
"""What a ``--then`` phase may set (the first phase's values stand for the rest)."""


def phases(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Return the job's phases: the options' own, then ``--then``'s over them.

    Raises:
        ValueError: ``--then`` is not a list of objects of known keys and valid values.
    """
    first = {"workload": args.workload, "knobs": json.loads(args.knobs),
             "iterations": args.iterations, "warmup": args.warmup,
             "compute_scale": args.compute_scale, "size_scale": args.size_scale}
    try:
        then = json.loads(args.then)
    except json.JSONDecodeError as err:
        raise ValueError(f"--then is not JSON: {err}") from None
    if not isinstance(then, list) or not all(isinstance(x, dict) for x in then):
        raise ValueError("--then must be a JSON list of objects")
    out = [first]
    for i, extra in enumerate(then, 2):
        unknown = sorted(set(extra) - set(PHASE_KEYS))
        if unknown:
            raise ValueError(f"--then: phase {i} has unknown key(s) {unknown}; valid: "
                             f"{', '.join(PHASE_KEYS)}")
        ph = {**first, **extra}
        if not (isinstance(ph["iterations"], int) and ph["iterations"] >= 1
                and isinstance(ph["warmup"], int) and ph["warmup"] >= 0):
            raise ValueError(f"--then: phase {i}: iterations must be >= 1 and warmup >= 0")
        if not 0 < ph["size_scale"] <= 1 or ph["compute_scale"] < 0:
            raise ValueError(f"--then: phase {i}: size_scale must be in (0, 1] and "
                             "compute_scale >= 0")
        if not isinstance(ph["knobs"], dict):
            raise ValueError(f"--then: phase {i}: knobs must be an object")
        out.append(ph)
    return out


def scale_sizes(workload: Any, size_scale: float) -> Any:
    """Return ``workload`` with every tensor's numel x ``size_scale`` (see ``Workload.resized``)."""
    return workload.resized(size_scale)


def load_workload(name: str) -> Any:
    """Return the simulator's profile ``name`` (a shipped name or a YAML path)."""
    from ddpbench.simulator.workload import load_workload as loader

    return loader(name)


def _busy(seconds: float, mode: str) -> None:
    if seconds <= 0:
        return
    if mode == "sleep":
        time.sleep(seconds)
        return
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def run(args: argparse.Namespace) -> dict[str, Any] | None:
    """Run the loop on this rank, phase by phase; return worker 0's result (None elsewhere):
    the first phase's, with every phase's under ``"phases"`` when there are several."""
    from ddpbench import comm

    world = comm.world()
    todo = getattr(args, "phases", None) or phases(args)
    results: list[dict[str, Any] | None] = []
    for i, ph in enumerate(todo):
        if world.num_servers and len(todo) > 1:
            from ddpbench.backends.ps import server, worker

            if world.is_server and i < len(todo) - 1:
                server.serve(last=False)  # returns when this phase's workers have closed
                results.append(None)
                continue
            if i:  # the server ranks serve this phase's store too
                worker.expect_another_store()
        results.append(_run_phase(args, ph, world))
    if results[0] is None:
        return None
    if len(results) == 1:
        return results[0]
    return {**results[0], "phases": results}


def _run_phase(args: argparse.Namespace, ph: dict[str, Any], world: Any) -> dict[str, Any] | None:
    import ddpbench
    from ddpbench import comm

    knobs = ph["knobs"]
    if world.is_server:
        kv = ddpbench.create(args.backend, **knobs)  # a server rank serves until workers close
        if kv is not None and hasattr(kv, "close"):
            kv.close()
        return None
    workload = scale_sizes(load_workload(ph["workload"]), ph["size_scale"])
    layers = workload.layers
    fwd = [layer.fwd_s * ph["compute_scale"] for layer in layers]
    bwd = [layer.bwd_s * ph["compute_scale"] for layer in layers]
    kv = ddpbench.create(args.backend, **knobs)
    if kv.is_capable("gather"):
        return _run_sharded(args, ph, world, kv, workload, fwd, bwd)
    by_layer: dict[int, list[int]] = {}
    grads, outs = [], []
    for i, t in enumerate(workload.tensors):
        n = t.numel
        grads.append(np.full(n, world.role_rank + 1, dtype=np.float32))
        outs.append(np.empty(n, dtype=np.float32))
        by_layer.setdefault(int(t.layer), []).append(i)
    declare = getattr(kv, "declare", None)
    if declare is not None:
        # The gradients' keys in the order the original's PyTorch front end declares them
        # (BytePS: sorted by name), which placement follows; the simulator uses the same
        from ddpbench.rules.placement import declaration_order

        declare(declaration_order(args.backend, [t.name for t in workload.tensors]))
    workers = kv.num_workers
    expected = np.float32(workers * (workers + 1) / 2)
    handles: dict[int, Any] = {}

    def wait_layer(layer: int) -> None:
        for i in by_layer.get(layer, ()):
            h = handles.pop(i, None)
            if h is not None:
                h.wait()
                if outs[i][0] != expected or outs[i][-1] != expected:
                    raise RuntimeError(
                        f"tensor {i} reduced to {outs[i][0]} / {outs[i][-1]}, expected "
                        f"{expected} (sum of rank+1 over {workers} workers)"
                    )

    if args.compute == "sleep":
        comm.precise_timers()
    starts = []
    total = ph["warmup"] + ph["iterations"]
    world.role_comm.Barrier()
    for _ in range(total):
        starts.append(time.perf_counter())
        for layer in range(len(layers)):
            wait_layer(layer)
            _busy(fwd[layer], args.compute)
        for layer in reversed(range(len(layers))):
            _busy(bwd[layer], args.compute)
            for i in by_layer.get(layer, ()):
                handles[i] = kv.push_pull_async(i, grads[i], outs[i], priority=-layer)
    for layer in range(len(layers)):
        wait_layer(layer)
    starts.append(time.perf_counter())
    kv.close()
    return _result(ph, world, workload, args.backend, workers, starts,
                   int(sum(g.nbytes for g in grads)))


def _sharded_units(backend: str, kv: Any, workload: Any) -> tuple[
        list[str], list[int], list[tuple[int, ...]], list[list[int]]]:
    """Return a sharding store's parameters (names, elements), each unit's layers in
    forward order and each unit's parameters (indices into the names), as the simulator's
    strategies cut the profile (:mod:`ddpbench.simulator.sharded`): ZeRO's units are the
    layers and its parameters the profile's tensors; FSDP's units follow its ``wrap``
    policy, each one flat parameter (``FlatParamHandle``)."""
    from ddpbench.simulator.sharded import fsdp_units

    numel = [0] * len(workload.layers)
    for t in workload.tensors:
        numel[t.layer] += t.numel
    if backend == "fsdp":
        units = fsdp_units(numel, kv.options.wrap, kv.options.min_num_params)
        return ([f"unit{u.position}" for u in units], [u.numel for u in units],
                [u.layers for u in units], [[j] for j in range(len(units))])
    tensors = sorted(workload.tensors, key=lambda t: int(t.layer))  # stable: profile order
    layers = sorted({int(t.layer) for t in tensors})
    unit_of = {layer: j for j, layer in enumerate(layers)}
    members: list[list[int]] = [[] for _ in layers]
    for k, t in enumerate(tensors):
        members[unit_of[int(t.layer)]].append(k)
    return ([t.name for t in tensors], [t.numel for t in tensors],
            [(layer,) for layer in layers], members)


def _run_sharded(args: argparse.Namespace, ph: dict[str, Any], world: Any, kv: Any,
                 workload: Any, fwd: list[float], bwd: list[float]) -> dict[str, Any] | None:
    """One phase on a sharding store (``zero``, ``fsdp``), as DeepSpeed and FSDP train.

    The store holds the parameters (every one zero at first, registered by ``broadcast``)
    and ``SGD(lr=1)``; each rank's gradients are ``-(rank + 1)``, so after ``t`` steps
    every element is ``t (W + 1) / 2``. The front-end rule
    (:class:`ddpbench.rules.unshard.UnitSchedule`) gathers units before their forward and
    backward, frees and reduces them as the store's plan says; the step waits for every
    reduction. Every gathered unit, and every parameter a store keeps whole, is checked
    against that value. The iteration ends when the step has returned. ``fwd`` and ``bwd``:
    each layer's compute, seconds.
    """
    from ddpbench import comm
    from ddpbench.optim import SGD
    from ddpbench.rules.unshard import UnitSchedule

    names, sizes, unit_layers, members = _sharded_units(args.backend, kv, workload)
    params = [np.zeros(n, dtype=np.float32) for n in sizes]
    grads = [np.full(n, -(world.role_rank + 1), dtype=np.float32) for n in sizes]
    kv.broadcast(names, params)
    kv.set_optimizer(SGD(lr=1.0))
    workers = kv.num_workers
    half = np.float32((workers + 1) / 2)
    steps = [0]

    def check(ks: list[int], when: str) -> None:
        want = np.float32(steps[0]) * half
        for k in ks:
            a = params[k]
            if a.size and (a[0] != want or a[-1] != want):
                raise RuntimeError(f"parameter {names[k]!r} {when} is {a[0]} / {a[-1]}, "
                                   f"expected {want} ({steps[0]} steps of (W + 1) / 2 over "
                                   f"{workers} workers)")

    def gather(units: list[int]) -> None:
        ks = [k for j in units for k in members[j]]
        kv.gather([names[k] for k in ks], [params[k] for k in ks])
        check(ks, "gathered")

    def reduce(ks: list[int], asynchronous: bool) -> Any:
        call = kv.push_pull_async if asynchronous else kv.push_pull
        out = call([names[k] for k in ks], [grads[k] for k in ks],
                   output=[params[k] for k in ks], op="average")
        return out if asynchronous else None

    sharded = bool(kv.holds_sharded_params)
    schedule = UnitSchedule(kv.front_end_plan(), members, sizes, sharded, gather,
                            lambda units: None, reduce)
    first = {u[0]: j for j, u in enumerate(unit_layers)}
    last = {u[-1]: j for j, u in enumerate(unit_layers)}
    if args.compute == "sleep":
        comm.precise_timers()
    starts = []
    world.role_comm.Barrier()
    for _ in range(ph["warmup"] + ph["iterations"]):
        starts.append(time.perf_counter())
        for layer in range(len(workload.layers)):
            if layer in first:
                schedule.pre_forward(first[layer])
            _busy(fwd[layer], args.compute)
            if layer in last:
                schedule.post_forward(last[layer])
        for layer in reversed(range(len(workload.layers))):
            if layer in last:
                schedule.pre_backward(last[layer])
            _busy(bwd[layer], args.compute)
            if layer in first:
                for k in members[first[layer]]:
                    schedule.grad_ready(first[layer], k)
        schedule.step()
        steps[0] += 1
        if not sharded:
            check(list(range(len(names))), "after the step")
    starts.append(time.perf_counter())
    stats = {**kv.stats, **schedule.stats}
    kv.close()
    return _result(ph, world, workload, args.backend, workers, starts,
                   int(sum(g.nbytes for g in grads)), stats)


def _result(ph: dict[str, Any], world: Any, workload: Any, backend: str, workers: int,
            starts: list[float], grad_bytes: int,
            stats: dict[str, int] | None = None) -> dict[str, Any] | None:
    """Worker 0's result of a phase from every worker's iteration starts (the slowest
    worker's time per iteration: a job's throughput is bounded by it); None elsewhere."""
    times = [b - a for a, b in zip(starts, starts[1:])][ph["warmup"]:]
    all_times = world.role_comm.allgather(times)
    times = [max(col) for col in zip(*all_times)]
    if world.role_rank != 0:
        return None
    median = statistics.median(times)
    out = {
        "workload": workload.name, "backend": backend, "knobs": ph["knobs"],
        "workers": workers, "iteration_times_s": times, "iteration_time_s": median,
        "iteration_time_min_s": min(times), "iteration_time_max_s": max(times),
        "throughput": workload.batch_size * workers / median,
        "bytes_per_iteration": grad_bytes,
        "size_scale": ph["size_scale"], "compute_scale": ph["compute_scale"],
    }
    if stats is not None:
        out["collectives"] = stats
    return out


def knobs_of(params: dict[str, Any]) -> dict[str, Any]:
    """Return a point's backend knobs: its parameters less the axes and run settings."""
    skip = {"mode", "backend", "repetition", *COMMON_AXES, *REAL_KEYS}
    return {k: v for k, v in params.items() if k not in skip and not k.startswith("_")}


def cluster_params(params: dict[str, Any]) -> dict[str, Any]:
    """Return ``params`` with ``servers`` as the Cluster takes it (results.csv stores text)."""
    servers = params.get("servers", "colocated")
    return {**params, "servers": servers if servers == "colocated" else int(servers)}


def run_real(params: dict[str, Any]) -> dict[str, Any]:
    """Run one real point (its parameters as an experiment names them) with the worker
    program under :func:`ddpbench.launch.launch_logged`; return its result row.

    Raises:
        RuntimeError: the backend cannot run here, or the job failed (its first error).
        TimeoutError: the job ran past ``timeout_s``.
        ValueError: a simulated-only setting, or pacing a backend that cannot be paced.
    """
    workers, servers, knobs = _job(params)
    result = _launch(params, workers, servers, knobs)
    row = {
        "iteration_time_s": result["iteration_time_s"],
        "throughput": result["throughput"],
        "bytes_sent_max": result.get("bytes_per_iteration"),
        "bytes_sent_total": None,
        "samples_s": result["iteration_times_s"],
    }
    if "phases" in result:
        row["_phase_samples_s"] = [ph["iteration_times_s"] for ph in result["phases"]]
    return row


def real_job_size(params: dict[str, Any]) -> Any:
    """Return what a real point's job will take of this host (:func:`ddpbench.launch.job_cost`:
    its ranks, each holding :data:`~ddpbench.launch.RANK_BYTES` and three copies of the
    workload's gradients), or None for a point that cannot run here (its run says why)."""
    from ddpbench.launch import job_cost

    try:
        workers, servers, _ = _job(params)
    except (ValueError, RuntimeError, TypeError):
        return None
    return job_cost(workers + servers, rank_bytes=_rank_bytes(params))


def _rank_bytes(params: dict[str, Any]) -> float:
    """Return the memory one rank of a real point holds: the interpreter and libraries, and
    three copies of the (scaled) gradients (the tensors, their sums, the staging buffers)."""
    from ddpbench.launch import RANK_BYTES

    try:
        model = load_workload(params["workload"]).model_bytes
    except (ValueError, OSError, KeyError):
        model = 0
    return RANK_BYTES + 3 * model * float(params.get("size_scale", 1.0))


def _job(params: dict[str, Any]) -> tuple[int, int, dict[str, Any]]:
    """Return a real point's worker and server processes and its knobs (pacing included),
    refusing what only a simulation can do."""
    import ddpbench

    backend = params["backend"]
    if backend not in ddpbench.available():
        raise RuntimeError(
            f"backend {backend!r} is not available for real runs (not installed or not "
            f"written yet); available: {ddpbench.available()}"
        )
    cluster = contract.Cluster.from_point(cluster_params(params))
    # The machine a real run measures is the one it runs on: a machine profile is for the
    # simulated twin of the point, and pacing is what a real run does with the bandwidth.
    default = contract.Cluster(workers=cluster.workers, servers=cluster.servers,
                               bandwidth_gbps=cluster.bandwidth_gbps,
                               latency_us=cluster.latency_us, rack_size=cluster.rack_size,
                               server_sum_gbps=cluster.server_sum_gbps,
                               machine=cluster.machine, paced=cluster.paced)
    simulated_only = [k for k in contract.Cluster.model_fields
                      if getattr(cluster, k) != getattr(default, k)]
    schedule = contract.Schedule.from_point(params)
    if schedule.batch_size is not None:
        simulated_only.append("batch_size")
    if schedule.precision != "fp32":
        simulated_only.append("precision")
    if schedule.activation_checkpointing:
        simulated_only.append("activation_checkpointing")
    if schedule.grad_accumulation != 1:
        simulated_only.append("grad_accumulation")
    if simulated_only:
        verb = "is" if len(simulated_only) == 1 else "are"
        raise ValueError(f"{', '.join(simulated_only)} {verb} simulated only (a real run uses "
                         "the machine's own network, devices and processes); run this point "
                         "with mode: simulate")
    workers = cluster.workers
    knobs = knobs_of(params)
    if backend in contract.PS_BACKENDS:
        servers = cluster.dedicated_servers() or workers
        if cluster.paced:
            knobs.update(bandwidth_gbps=cluster.bandwidth_gbps, latency_us=cluster.latency_us)
    else:
        servers = 0
        if cluster.paced:
            raise ValueError(f"paced: backend {backend!r} cannot be paced (its messages go "
                             "through the MPI library); pacing applies to "
                             f"{sorted(contract.PS_BACKENDS)}")
    return workers, servers, knobs


def _launch(params: dict[str, Any], workers: int, servers: int,
            knobs: dict[str, Any]) -> dict[str, Any]:
    """Run the worker program's job for a point; return worker 0's result (its JSON)."""
    timeout = float(params.get("timeout_s", 300.0))
    with tempfile.TemporaryDirectory(prefix="ddpbench-real-") as tmp:
        out = Path(tmp) / "result.json"
        worker_cmd = [
            sys.executable, "-m", "ddpbench.emulation",
            "--workload", str(params["workload"]), "--backend", params["backend"],
            "--knobs", json.dumps(knobs),
            "--iterations", str(int(params["iterations"])),
            "--warmup", str(int(params["warmup"])),
            "--compute-scale", repr(float(params["compute_scale"])),
            "--size-scale", repr(float(params.get("size_scale", 1.0))),
            "--compute", str(params.get("compute", "sleep")),
            "--out", str(out),
        ]
        if params.get("_then"):  # further phases in this job (ddpbench calibrate's launches)
            worker_cmd += ["--then", json.dumps(params["_then"])]
        log = Path(tmp) / "launch.log"
        rc = launch_logged(worker_cmd, workers, servers, log=log, timeout=timeout,
                           bind=str(params.get("bind", "none")),
                           allow_large=bool(params.get("_allow_large")),
                           rank_bytes=_rank_bytes(params))
        if rc == 124:  # (mpiexec's own lines about the killed ranks say no more)
            raise TimeoutError(f"real run did not finish in {timeout:g} s (timeout_s); "
                               f"the job was killed")
        if not out.exists() or rc != 0:
            errs = sorted(Path(tmp).glob("result.json.rank*.err"))
            detail = (errs[0].read_text().strip() if errs
                      else _tail(log.read_text(errors="replace")))
            raise RuntimeError(f"real run failed (exit {rc}): {detail}")
        result: dict[str, Any] = json.loads(out.read_text())
    return result


def _tail(text: str, lines: int = 3) -> str:
    kept = [ln for ln in (text or "").strip().splitlines() if ln.strip()][-lines:]
    return " | ".join(kept) or "no output"


def main(argv: list[str] | None = None) -> int:
    """Run the worker program; return the exit code."""
    args = _parse(argv)
    try:
        result = run(args)
    except Exception as err:  # noqa: BLE001 - reported to the runner through a file
        rank = "?"
        try:
            from ddpbench import comm

            rank = str(comm.world().rank)
        except Exception:  # noqa: BLE001
            pass
        msg = f"rank {rank}: {type(err).__name__}: {' '.join(str(err).split())}"
        if args.out:
            Path(f"{args.out}.rank{rank}.err").write_text(msg + "\n")
        traceback.print_exc()
        print(msg, file=sys.stderr, flush=True)
        return 1
    if result is not None:
        text = json.dumps(result)
        print(text, flush=True)
        if args.out:
            Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
