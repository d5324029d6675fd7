"""``ddpbench calibrate``'s work: measure this machine with real processes, fit the model.

Steps:

1. MPI ping-pong between two processes (:mod:`ddpbench.calibration.pingpong`, per size the
   fastest of five blocks' medians; the median of three jobs): latency is the half round
   trip at 0 bytes, bandwidth the least-squares slope over the three largest sizes (256 KiB
   to 32 MiB).
2. Ring steps through an engine thread at 2 to 8 processes (:mod:`.ringstep`): how much a
   message's software cost stretches as processes outnumber cores; in the same jobs, a
   sleep and a hand-off to an idle engine (how compute beside an idle engine stretches).
3. Copy and summation throughput of NumPy on 64 MiB float32 arrays (one core).
4. Compute emulation: one ``time.sleep`` per layer and pass is what the worker program does
   (:mod:`ddpbench.emulation`). The median time of calls of 0.05 to 5 ms gives the rate
   (slope) and the per-call overhead (intercept) by least squares over the four requested
   times (a median, so that one stretched sleep does not tilt the line), and the
   workload's own sequence of calls is timed against that rule.
5. For each backend, two synthetic workloads without compute on ``workers`` real worker
   processes (and ``servers`` server processes for the parameter-server backends): 64
   tensors of 256 floats (``small``: per-message costs dominate) and 4 tensors of 1 Mi
   floats (``large``: bytes dominate). ``horovod``'s small run is unfused
   (:data:`SYNTHETIC_KNOBS`).
6. The backend's ``per_message_us`` and ``bandwidth_gbps`` are fitted through the simulator
   itself, so that they count messages the way the simulator counts them: alternating
   one-dimensional solves (the simulated time grows with the per-message cost and falls
   with bandwidth) until both workloads' simulated iteration times equal the measured
   ones. When bytes take under a tenth of the large run (``p3``'s slices: it is all
   message costs) no bandwidth can be told from infinite, and the ping-pong's is kept
   (``bandwidth_fitted: false``).
7. The workload itself, with compute as the experiment runs it, gives the backend's
   ``compute_factor``: how much slower the sleeps run beside that backend's threads,
   solved the same way with the two costs fixed.

Each run is launched ``rounds`` times, every backend once per round, a backend's three runs
of a round (the two synthetic ones and the workload) one after another in one job
(:func:`real_phases`). A run's measured time is the median over its launches, since a
shared machine has slow and fast states of seconds and a launch that lands in one says
nothing about the backend. A synthetic launch stands for its median iteration; a workload
launch spans the slow phases, which begin and end inside it, so it stands for its lower
quartile (:func:`~ddpbench.calibration.machine.launch_time`, as a report with ``aggregate:
quartile`` takes the real points).
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ddpbench import contract
from ddpbench.calibration.machine import KIND, BackendFit, Machine, launch_time

__all__ = ["SYNTHETIC", "SYNTHETIC_KNOBS", "calibrate", "fit_backend", "fit_backends",
           "launch_medians", "progress_steps", "real_phases", "real_rounds", "refit",
           "shared_bandwidth", "synthetic_profile"]

STEP_PROCESSES = (2, 3, 4, 6, 8)
"""Process counts at which the ring step is timed (beyond 8: extended along 6 to 8)."""

_BW_MAX = 1e4
"""The bandwidth solve's upper end, Gbit/s (far above any two processes' memory copy)."""

_BYTES_SHARE = 0.1
"""The least share of the large run that its bytes (not its messages) must take for the
fit to keep the bandwidth it solves; below, the ping-pong's is kept."""

SYNTHETIC = {"small": (64, 256), "large": (4, 1 << 20)}
"""Calibration workloads: name -> (tensors, float32 elements each), no compute."""

SYNTHETIC_KNOBS: dict[str, dict[str, dict[str, Any]]] = {
    "horovod": {"small": {"fusion_threshold": 0, "cycle_time": 0.0},
                "large": {"cycle_time": 0.0}},
}
"""Backend knobs of a calibration workload's real and simulated runs (both alike).

``horovod``'s small run is unfused: fused, its 64 tensors take one buffer that finishes well
inside Horovod's 1 ms cycle (``HOROVOD_CYCLE_TIME``), so the iteration time is the cycle plus
a residue that falls on either side of a cycle boundary, and the per-message cost fitted to
it jumps from run to run; unfused, the 64 allreduces pin it down. Both synthetic runs also
leave out the cycle (``cycle_time`` 0: a rank starts a cycle as soon as work is queued): the
cycle is a knob the simulator models, not a cost to fit, and with it each launch's
iterations lock into one phase against the 1 ms clock. The workload run keeps the defaults,
as the experiments run it."""


def synthetic_profile(name: str) -> dict[str, Any]:
    """Return the profile (plain data, the simulator's YAML format) of a calibration workload."""
    count, numel = SYNTHETIC[name]
    return {"name": f"calibration_{name}", "batch_size": 1, "device": "cpu",
            "matmul_fraction": 0.5,
            "notes": "ddpbench calibrate: synthetic, no compute",
            "layers": [{"name": f"l{i}", "fwd_ms": 0.0, "bwd_ms": 0.0,
                        "tensors": [{"name": f"t{i}", "numel": numel}]}
                       for i in range(count)]}


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def pingpong(timeout_s: float = 120.0, bind: str = "none", launches: int = 3) -> dict[str, Any]:
    """Return the ping-pong sizes, half round trips, and the fitted latency and bandwidth
    (ranks placed by ``bind``, as ``ddpbench launch --bind``).

    Per size, the median of ``launches`` jobs' times: on a shared machine one job can land
    in a fast or a slow state of seconds, which a median of three leaves out.
    """
    runs = []
    with tempfile.TemporaryDirectory(prefix="ddpbench-calibrate-") as tmp:
        for i in range(launches):
            out = Path(tmp) / f"pingpong-{i}.json"
            cmd = [sys.executable, "-m", "ddpbench", "launch", "-n", "2", "--timeout",
                   str(timeout_s), "--bind", bind, "--", sys.executable, "-m",
                   "ddpbench.calibration.pingpong",
                   "--out", str(out)]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s + 30)
            if proc.returncode != 0 or not out.exists():
                tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
                raise RuntimeError(f"ping-pong failed (exit {proc.returncode}): {tail}")
            runs.append(json.loads(out.read_text()))
    sizes = runs[0]["sizes"]
    secs = [statistics.median(r["seconds"][k] for r in runs) for k in range(len(sizes))]
    slope = float(np.polyfit(sizes[-3:], secs[-3:], 1)[0])  # the three largest sizes
    return {"sizes_bytes": sizes, "half_round_trip_us": [round(s * 1e6, 3) for s in secs],
            "latency_us": secs[0] * 1e6, "bandwidth_gbps": 8e-9 / slope}


def ring_steps(counts: Sequence[int], timeout_s: float = 120.0, repeats: int = 5,
               bind: str = "none") -> dict[str, dict[int, float]]:
    """Return style -> process count -> ring step time, microseconds (:mod:`.ringstep`),
    and under ``"handoff"`` process count -> hand-off time beside idle engines.

    One job per count measures both styles in ``repeats`` alternating blocks and keeps each
    style's median block: with more processes than cores the time depends on how the
    scheduler happens to interleave them, and one job per count (rather than one per
    repeat) also spares the launches. Counts up to the cores run three times (first, in
    the middle and last); the median run is kept.
    """
    from ddpbench.calibration.ringstep import STYLES

    out: dict[str, dict[int, float]] = {s: {} for s in (*STYLES, "handoff")}
    # A count within the cores runs again in the middle and at the end and keeps its
    # median run: there the step is the uncontended one (the law's s0), and one job can
    # land in a slow or a fast state of a shared machine.
    within = [n for n in counts if n <= _cores()]
    mid = len(counts) // 2
    order = [*counts[:mid], *within, *counts[mid:], *within]
    runs: dict[str, dict[int, list[float]]] = {s: {} for s in out}
    with tempfile.TemporaryDirectory(prefix="ddpbench-calibrate-") as tmp:
        for i, n in enumerate(order):
            path = Path(tmp) / f"ringstep-{n}-{i}.json"
            cmd = [sys.executable, "-m", "ddpbench", "launch", "-n", str(n),
                   "--timeout", str(timeout_s), "--bind", bind, "--", sys.executable, "-m",
                   "ddpbench.calibration.ringstep", "--blocks", str(repeats), "--out",
                   str(path)]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s + 30)
            if proc.returncode != 0 or not path.exists():
                tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
                raise RuntimeError(f"ring steps at {n} processes failed "
                                   f"(exit {proc.returncode}): {tail}")
            data = json.loads(path.read_text())
            for style, us in (*data["step_us"].items(), ("handoff", data["handoff_us"])):
                runs[style].setdefault(n, []).append(float(us))
    for style, by_count in runs.items():
        out[style] = {n: round(statistics.median(v), 2) for n, v in by_count.items()}
    return out


def copy_and_sum(nbytes: int = 64 << 20, reps: int = 5) -> dict[str, float]:
    """Return NumPy's copy and add throughput on float32 arrays of ``nbytes``, Gbit/s."""
    a = np.ones(nbytes // 4, np.float32)
    b = np.ones_like(a)
    c = np.empty_like(a)
    copy, add = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(c, a)
        t1 = time.perf_counter()
        np.add(a, b, out=c)
        t2 = time.perf_counter()
        copy.append(t1 - t0)
        add.append(t2 - t1)
    return {"copy_gbps": nbytes * 8e-9 / statistics.median(copy),
            "sum_gbps": nbytes * 8e-9 / statistics.median(add)}


def compute_rule(workload: str, compute_scale: float, size_scale: float,
                 reps: int = 3) -> dict[str, Any]:
    """Return the sleep rule (rate, overhead) and the workload's sequence timed against it."""
    from ddpbench.comm import precise_timers
    from ddpbench.emulation import load_workload

    precise_timers()  # as the trainer's worker sleeps (its main thread's timer slack)
    requested = [5e-5, 2e-4, 1e-3, 5e-3]
    medians = []
    for t in requested:
        took = []
        for _ in range(200 if t < 1e-3 else 20):  # 0.2 s in all
            t0 = time.perf_counter()
            time.sleep(t)
            took.append(time.perf_counter() - t0)
        # The median per requested time: one sleep that the scheduler stretched (a busy
        # machine) must not tilt the line that every call of the workload is charged by.
        medians.append(statistics.median(took))
    rate, intercept = np.polyfit(np.array(requested), np.array(medians), 1)
    overhead = max(0.0, float(intercept))
    wl = load_workload(workload).resized(size_scale)
    calls = [x * compute_scale for layer in wl.layers for x in (layer.fwd_s, layer.bwd_s)
             if x > 0]
    runs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for t in calls:
            time.sleep(t)
        runs.append(time.perf_counter() - t0)
    return {"rate": float(rate), "overhead_us": overhead * 1e6,
            "workload": wl.name, "compute_scale": compute_scale, "calls": len(calls),
            "requested_ms": sum(calls) * 1e3, "measured_ms": statistics.median(runs) * 1e3,
            "rule_ms": (sum(calls) * float(rate) + len(calls) * overhead) * 1e3}


def real_phases(backend: str, phases: Sequence[dict[str, Any]], workers: int, servers: int,
                timeout_s: float, bind: str = "none") -> list[list[float]]:
    """Return each phase's timed iteration times (seconds), all run in one job of
    ``workers`` worker (and ``servers`` server) processes, each phase with a store of its
    own (server ranks serve one after another).

    A phase is a dict of the worker's ``--then`` keys (``workload``, ``knobs``,
    ``iterations``, ``warmup``, ``compute_scale``, ``size_scale``); one job for the three
    runs of a calibration round spares two process start-ups.
    """
    from ddpbench.emulation import run_real

    first, *rest = phases
    row = run_real({"mode": "real", "backend": backend, "workload": str(first["workload"]),
                     "workers": workers,
                     "servers": servers if servers != workers else "colocated",
                     "iterations": first["iterations"], "warmup": first.get("warmup", 3),
                     "compute_scale": first.get("compute_scale", 1.0),
                     "size_scale": first.get("size_scale", 1.0), "compute": "sleep",
                     "timeout_s": timeout_s, "bind": bind, **(first.get("knobs") or {}),
                     "_then": [{"warmup": 3, "knobs": {}, "compute_scale": 1.0,
                                "size_scale": 1.0, **ph} for ph in rest]})
    samples = row.get("_phase_samples_s") or [row["samples_s"]]
    return [[float(x) for x in ph] for ph in samples]


def _solve(f: Callable[[float], float], target: float, lo: float, hi: float, *,
           increasing: bool, inverse: bool = False, rtol: float = 1e-6,
           steps: int = 40) -> float:
    """Return x in [lo, hi] with f(x) = target for a monotone f (clamped to the ends).

    Bracketed false position with the Illinois rule, on ``1 / x`` when ``inverse`` (a
    simulated time is close to linear in a per-message cost and a compute factor, and in
    the inverse of a bandwidth), stopping once f is within ``rtol`` of the target: a few
    simulations per solve where bisection takes several times as many for the same
    accuracy. Every step keeps the root bracketed, so a simulated time with a jump in it
    (events reordering) still converges, to the jump.
    """
    flo, fhi = f(lo), f(hi)
    if increasing and target <= flo or not increasing and target >= flo:
        return lo
    if increasing and target >= fhi or not increasing and target <= fhi:
        return hi

    def flip(x: float) -> float:  # x to the solve's variable and back (1/x is its own inverse)
        return 1.0 / x if inverse else x

    a, b = flip(lo), flip(hi)
    ga, gb = flo - target, fhi - target  # opposite signs
    side = 0
    x = lo
    for _ in range(steps):
        u = (a * gb - b * ga) / (gb - ga)
        if not min(a, b) < u < max(a, b):  # rounding: fall back to the midpoint
            u = (a + b) / 2
        x = flip(u)
        g = f(x) - target
        if abs(g) <= rtol * target:
            return x
        if (g < 0) == (ga < 0):
            a, ga = u, g
            if side == -1:
                gb /= 2  # Illinois: the end that stayed twice counts half
            side = -1
        else:
            b, gb = u, g
            if side == 1:
                ga /= 2
            side = 1
        if abs(b - a) <= 1e-7 * max(abs(a), abs(b)):  # a jump in f: as fine as bisection's
            break
    return x


def _sim_time(backend: str, profile: Path | str, workers: int, servers: int, latency_us: float,
              per_message_us: float, bandwidth_gbps: float, cores: int, *,
              compute: tuple[float, float] = (1.0, 0.0), compute_factor: float = 1.0,
              schedule: dict[str, float] | None = None,
              knobs: dict[str, Any] | None = None) -> float:
    from ddpbench import simulator

    m = Machine(kind=KIND, host="fit", measured_at="fit", cores=cores, workers=workers,
                servers=servers, latency_us=latency_us, bandwidth_gbps=bandwidth_gbps,
                copy_gbps=1.0, sum_gbps=1e6, compute_rate=compute[0],
                compute_overhead_us=compute[1],
                ring_step_us={"blocking": {2: 1.0}, "polled": {2: 1.0}},
                backends={backend: BackendFit(per_message_us=per_message_us,
                                              bandwidth_gbps=bandwidth_gbps,
                                              compute_factor=compute_factor)})
    sched = schedule or {}
    res = simulator.simulate(str(profile), backend, workers=workers, servers="colocated",
                             bandwidth_gbps=bandwidth_gbps, latency_us=latency_us,
                             iterations=5, warmup=2, machine=m, trace=False,
                             compute_scale=sched.get("compute_scale", 1.0),
                             size_scale=sched.get("size_scale", 1.0), **(knobs or {}))
    return float(res.iteration_time_s)


def fit_backend(backend: str, small: tuple[Path, float], large: tuple[Path, float], *,
                workers: int, servers: int, latency_us: float, bandwidth_gbps: float,
                cores: int, rounds: int = 3,
                workload: tuple[str, float, tuple[float, float], dict[str, float]] | None = None,
                shared_bandwidth: float | None = None) -> BackendFit:
    """Fit ``backend``'s per-message cost and bandwidth so the simulator meets both runs.

    Args:
        backend: the backend.
        small: (profile path, measured seconds) of the many-small-tensors workload.
        large: the same for the few-large-tensors workload.
        workers: worker processes of the runs.
        servers: server processes of the runs (0 for allreduce backends).
        latency_us: the machine's point-to-point latency.
        bandwidth_gbps: the starting bandwidth (the ping-pong's), and the bandwidth kept
            when the large run cannot pin one down (``BackendFit.bandwidth_fitted``).
        cores: the machine's cores.
        rounds: alternations of the two solves.
        workload: (profile, measured seconds, (compute rate, overhead us), schedule
            keywords) of the workload's own run with compute: fits ``compute_factor``.
        shared_bandwidth: a bandwidth fitted jointly with other backends
            (:func:`shared_bandwidth`): kept as it is, and only the per-message cost (and
            the compute factor) solved against it.
    """
    per_msg, bw = 0.0, bandwidth_gbps

    runs = {small[0]: "small", large[0]: "large"}

    def sim(path: Path, p: float, b: float) -> float:
        return _sim_time(backend, path, workers, servers, latency_us, p, b, cores,
                         knobs=SYNTHETIC_KNOBS.get(backend, {}).get(runs[path]))

    def solve_per_msg(b: float) -> float:
        return _solve(functools.partial(lambda b, p: sim(small[0], p, b), b), small[1],
                      0.0, 1e5, increasing=True)

    if shared_bandwidth is not None:
        bw = shared_bandwidth
        per_msg = solve_per_msg(bw)
    else:
        for _ in range(rounds):
            per_msg = solve_per_msg(bw)
            bw = _solve(functools.partial(lambda p, b: sim(large[0], p, b), per_msg),
                        large[1], 0.01, _BW_MAX, increasing=False, inverse=True)
    # Bytes must explain a share of the large run for its time to pin a bandwidth down.
    share = min(1.0, max(0.0, 1.0 - sim(large[0], per_msg, _BW_MAX) / large[1]))
    fitted = share >= _BYTES_SHARE or shared_bandwidth is not None
    if not fitted:
        # The large run is (nearly) all message costs (p3 cuts each array into many
        # slices): any bandwidth from some hundreds of Gbit/s to infinity fits it, and the
        # one the solve stops at would change from run to run. Bytes move at the wire's
        # rate then, as far as anything can tell.
        bw = bandwidth_gbps
        per_msg = solve_per_msg(bw)
    factor, wl_sim = 1.0, None
    if workload is not None:
        name, measured, compute, schedule = workload

        def wsim(f: float) -> float:
            return _sim_time(backend, name, workers, servers, latency_us, per_msg, bw, cores,
                             compute=compute, compute_factor=f, schedule=schedule)

        factor = _solve(wsim, measured, 0.5, 10.0, increasing=True)
        wl_sim = wsim(factor) * 1e3
    return BackendFit(per_message_us=round(per_msg, 3), bandwidth_gbps=round(bw, 3),
                      bandwidth_fitted=fitted, bandwidth_shared=shared_bandwidth is not None,
                      bytes_share=round(share, 4), compute_factor=round(factor, 4),
                      workload_ms=workload[1] * 1e3 if workload else None,
                      workload_sim_ms=wl_sim,
                      small_ms=small[1] * 1e3, large_ms=large[1] * 1e3,
                      small_sim_ms=sim(small[0], per_msg, bw) * 1e3,
                      large_sim_ms=sim(large[0], per_msg, bw) * 1e3)


def shared_bandwidth(fits: dict[str, BackendFit]) -> float | None:
    """Return one bandwidth for backends that move their bytes through one transport.

    The log-mean of their own fitted bandwidths, each weighted by the square of its large
    run's bytes share (a run that is mostly message costs says little about the
    bandwidth: a change of the bandwidth by a factor moves its time by about the share
    times that), i.e. the least-squares solution of their large runs' log time errors to
    first order. None when no backend's large run pins a bandwidth down.
    """
    weights = {b: (f.bytes_share or 0.0) ** 2 for b, f in fits.items() if f.bandwidth_fitted}
    total = sum(weights.values())
    if total <= 0:
        return None
    return math.exp(sum(w * math.log(fits[b].bandwidth_gbps) for b, w in weights.items())
                    / total)


def write_synthetic(folder: Path) -> dict[str, Path]:
    """Write the calibration workloads' profiles into ``folder``; return name -> file."""
    paths = {name: folder / f"calibration_{name}.yaml" for name in SYNTHETIC}
    for name, path in paths.items():
        path.write_text(yaml.safe_dump(synthetic_profile(name)))
    return paths


def launch_medians(samples: dict[str, dict[str, list[list[float]]]],
                   workload: str) -> dict[str, dict[str, float]]:
    """Return what each backend's runs stand for: the median over their launches of each
    launch's time (seconds; ``samples``: backend -> run name -> launches' iterations).

    The workload's launches (1-4 s) span the VM's slow phases, which begin and end inside
    them: each stands for its lower quartile, as the reports' real points do. The synthetic
    launches (0.1-0.4 s of 1-10 ms iterations) sit inside one phase, where a low quantile
    only picks the luckiest iterations: each stands for its median.
    """
    def stands_for(name: str) -> Callable[[list[float]], float]:
        return launch_time if name == workload else statistics.median

    return {b: {name: statistics.median(map(stands_for(name), v)) for name, v in runs.items()}
            for b, runs in samples.items()}


def fit_backends(measured: dict[str, dict[str, float]], servers: dict[str, int],
                 paths: dict[str, Path], *, workload: str, workers: int, latency_us: float,
                 bandwidth_gbps: float, cores: int, compute: tuple[float, float],
                 schedule: dict[str, float],
                 tick: Callable[[str], None] = lambda _step: None) -> dict[str, BackendFit]:
    """Fit every backend of ``measured`` (:func:`launch_medians`) through the simulator.

    ``servers``: each backend's server processes (0: an allreduce backend); ``paths``: the
    synthetic profiles' files; ``compute``: the sleep rule (rate, overhead us);
    ``schedule``: the workload run's ``compute_scale`` and ``size_scale``.

    The parameter-server backends move bytes through one transport: one bandwidth for all
    of them, from all their large runs (one run alone is a noisy measure of it); their own
    fits only weigh in.
    """
    group = [b for b in measured if servers[b]]
    group = group if len(group) > 1 else []

    def fit(b: str, shared: float | None = None, *, alone: bool = False) -> BackendFit:
        tick(f"{b} fit" + (" (shared bandwidth)" if b in group and not alone else ""))
        return fit_backend(
            b, (paths["small"], measured[b]["small"]), (paths["large"], measured[b]["large"]),
            workers=workers, servers=servers[b], latency_us=latency_us,
            bandwidth_gbps=bandwidth_gbps, cores=cores,
            workload=None if alone else (workload, measured[b][workload], compute, schedule),
            shared_bandwidth=shared)

    fits = {b: fit(b, alone=b in group) for b in measured}
    if group:
        shared = shared_bandwidth({b: fits[b] for b in group})
        fits.update({b: fit(b, shared) for b in group})  # None: each keeps its own
    return fits


def refit(machine: Machine, *, size_scale: float) -> Machine:
    """Return ``machine`` with every backend fit made again, by today's simulator, from the
    launches it stored (``measurements.iteration_ms``); the machine's own figures (ping-pong,
    ring steps, compute rule) stay as measured. ``size_scale``: the gradient scale of its
    workload runs (the profile does not record it; ``calibrate``'s default is 0.01).

    Raises:
        ValueError: a profile without the stored launches or workload it needs.
    """
    m = machine.measurements or {}
    try:
        launches = m["iteration_ms"]
        workload, compute_scale = m["compute"]["workload"], m["compute"]["compute_scale"]
        samples = {b: {name: [[x / 1e3 for x in launch] for launch in launches[b][name]]
                       for name in (*SYNTHETIC, workload)} for b in machine.backends}
    except KeyError as err:
        raise ValueError(f"the profile stores no launches to refit from (missing {err})") from None
    except TypeError:
        raise ValueError("the profile's stored runs are not lists of launches (an older "
                         "profile kept one time per run)") from None
    servers = {b: machine.servers if contract.backend(b).uses_servers else 0
               for b in machine.backends}
    with tempfile.TemporaryDirectory(prefix="ddpbench-refit-") as tmp:
        paths = write_synthetic(Path(tmp))
        fits = fit_backends(launch_medians(samples, workload), servers, paths,
                            workload=workload, workers=machine.workers,
                            latency_us=machine.latency_us,
                            bandwidth_gbps=machine.bandwidth_gbps, cores=machine.cores,
                            compute=(machine.compute_rate, machine.compute_overhead_us),
                            schedule={"compute_scale": compute_scale,
                                      "size_scale": size_scale})
    return machine.model_copy(update={"backends": fits})


def progress_steps(backends: Sequence[str], rounds: int) -> int:
    """Return how many steps :func:`calibrate` reports to its ``progress`` callback."""
    ps = [b for b in backends if b in contract.BACKENDS and contract.backend(b).uses_servers]
    # 4 measurements, a job per backend and round, a fit per backend, and one more per
    # parameter-server backend where two or more share a bandwidth
    return 4 + (rounds + 1) * len(backends) + (len(ps) if len(ps) > 1 else 0)


def calibrate(backends: Sequence[str], *, workers: int = 2, servers: int | None = None,
              workload: str = "resnet50", compute_scale: float = 0.05,
              size_scale: float = 0.01, iterations: int = 20, timeout_s: float = 120.0,
              step_processes: Sequence[int] = STEP_PROCESSES, step_repeats: int = 5,
              rounds: int = 3, bind: str = "none",
              progress: Callable[[str], None] | None = None) -> Machine:
    """Measure this machine and return its fitted :class:`Machine` (steps: module doc).

    Args:
        backends: the backends to calibrate (real ones from ``ddpbench.available()``).
        workers: worker processes of each backend's runs (>= 2).
        servers: server processes of the parameter-server runs (default: ``workers``).
        workload: the profile whose compute sequence is timed.
        compute_scale: its compute times x this (as the experiment runs it).
        size_scale: its gradient sizes x this.
        iterations: timed iterations of each real run.
        timeout_s: per real run.
        step_processes: process counts of the ring-step measurement (at least one).
        step_repeats: blocks per style and count (the median is kept).
        rounds: launches of each backend's runs, every backend once per round; each
            launch's median iteration time is taken (the workload's: its lower quartile,
            :func:`~ddpbench.calibration.machine.launch_time`) and the median of them
            kept, so that a launch that lands in a slow or fast state of a shared machine
            does not move the fit.
        bind: how every job's ranks are placed on cores (``ddpbench launch --bind``); the
            profile records it, and a real run compared with it must use the same.
        progress: called with each step's name before it runs.

    Raises:
        ValueError: bad arguments, naming them.
        RuntimeError: a real run failed (its message).
    """
    servers = _check_arguments(backends, workers=workers, servers=servers,
                               step_processes=step_processes, step_repeats=step_repeats,
                               rounds=rounds, bind=bind)
    tick = progress or (lambda _step: None)
    cores = _cores()
    tick("ping-pong")
    pp = pingpong(timeout_s, bind)
    tick("ring steps")
    steps = ring_steps(sorted(set(step_processes)), timeout_s, step_repeats, bind)
    handoff = steps.pop("handoff")
    tick("copy and sum")
    cs = copy_and_sum()
    tick("compute")
    comp = compute_rule(workload, compute_scale, size_scale)
    schedule = {"compute_scale": compute_scale, "size_scale": size_scale}
    # Server processes of each backend's runs (0: an allreduce backend); a run launches
    # ``workers`` of them colocated when the count equals the workers.
    srv = {b: servers if contract.backend(b).uses_servers else 0 for b in backends}
    with tempfile.TemporaryDirectory(prefix="ddpbench-calibrate-") as tmp:
        paths = write_synthetic(Path(tmp))
        samples = real_rounds(backends, paths, srv, workload=workload, workers=workers,
                              iterations=iterations, schedule=schedule, rounds=rounds,
                              timeout_s=timeout_s, bind=bind, tick=tick)
        fits = fit_backends(launch_medians(samples, workload), srv, paths, workload=workload,
                            workers=workers, latency_us=pp["latency_us"],
                            bandwidth_gbps=pp["bandwidth_gbps"], cores=cores,
                            compute=(comp["rate"], comp["overhead_us"]), schedule=schedule,
                            tick=tick)
    return _profile(pp, steps, handoff, cs, comp, fits, samples, cores=cores, workers=workers,
                    servers=servers, iterations=iterations, bind=bind)


def _check_arguments(backends: Sequence[str], *, workers: int, servers: int | None,
                     step_processes: Sequence[int], step_repeats: int, rounds: int,
                     bind: str) -> int:
    """Return the server processes (``workers`` when None), refusing a bad argument by name."""
    import ddpbench
    from ddpbench.launch import BINDINGS

    if workers < 2:
        raise ValueError(f"workers: calibration needs at least 2 worker processes, got {workers}")
    servers = workers if servers is None else servers
    if servers < 1:
        raise ValueError(f"servers: expected >= 1 server processes, got {servers}")
    unknown = [b for b in backends if b not in contract.BACKENDS]
    if unknown:
        raise ValueError(f"backends: unknown backend(s) {unknown}; valid backends: "
                         f"{sorted(contract.BACKENDS)}")
    missing = [b for b in backends if b not in ddpbench.available()]
    if missing:
        raise ValueError(f"backends: {missing} cannot run here; available: "
                         f"{ddpbench.available()}")
    if not step_processes or any(n < 2 for n in step_processes):
        raise ValueError(f"step_processes: expected counts >= 2, got {list(step_processes)}")
    if step_repeats < 1:
        raise ValueError(f"step_repeats: expected >= 1, got {step_repeats}")
    if rounds < 1:
        raise ValueError(f"rounds: expected >= 1, got {rounds}")
    if bind not in BINDINGS:
        raise ValueError(f"bind: expected one of {', '.join(BINDINGS)}, got {bind!r}")
    return servers


def real_rounds(backends: Sequence[str], paths: dict[str, Path], servers: dict[str, int], *,
                workload: str, workers: int, iterations: int, schedule: dict[str, float],
                rounds: int, timeout_s: float, bind: str = "none",
                tick: Callable[[str], None] = lambda _step: None,
                ) -> dict[str, dict[str, list[list[float]]]]:
    """Return backend -> run name -> each launch's timed iterations (seconds): ``rounds``
    rounds, every backend once per round, its three runs (the synthetic ones, then the
    workload with compute) in one job (:func:`real_phases`).

    ``paths``: the synthetic profiles' files; ``servers``: each backend's server processes
    (0: an allreduce backend); ``schedule``: the workload run's ``compute_scale`` and
    ``size_scale``. The synthetic runs are short, so they take twice ``iterations``.
    """
    samples: dict[str, dict[str, list[list[float]]]] = {
        b: {name: [] for name in (*SYNTHETIC, workload)} for b in backends}
    for r in range(rounds):
        of = f" ({r + 1}/{rounds})" if rounds > 1 else ""
        for b in backends:
            tick(f"{b}{of}")
            got = real_phases(b, [
                *({"workload": str(paths[name]), "iterations": 2 * iterations,
                   "knobs": SYNTHETIC_KNOBS.get(b, {}).get(name) or {}}
                  for name in SYNTHETIC),
                {"workload": workload, "iterations": iterations + iterations // 2,
                 "compute_scale": schedule["compute_scale"],
                 "size_scale": schedule["size_scale"]}],
                workers, servers[b] or workers, timeout_s, bind)
            for name, times in zip((*SYNTHETIC, workload), got):
                samples[b][name].append(times)
    return samples


def _profile(pp: dict[str, Any], steps: dict[str, dict[int, float]], handoff: dict[int, float],
             cs: dict[str, float], comp: dict[str, Any], fits: dict[str, BackendFit],
             samples: dict[str, dict[str, list[list[float]]]], *, cores: int, workers: int,
             servers: int, iterations: int, bind: str) -> Machine:
    """Return the machine profile of the measurements (``pp``: :func:`pingpong`, ``steps``
    and ``handoff``: :func:`ring_steps`, ``cs``: :func:`copy_and_sum`, ``comp``:
    :func:`compute_rule`), the fits and the launches they come from, stamped now."""
    runs = {b: {name: [[round(x * 1e3, 4) for x in launch] for launch in v]
                for name, v in by_run.items()} for b, by_run in samples.items()}
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return Machine(
        kind=KIND, host=platform.node() or "unknown", measured_at=now, cores=cores,
        workers=workers, servers=servers, latency_us=round(pp["latency_us"], 3),
        bandwidth_gbps=round(pp["bandwidth_gbps"], 3), copy_gbps=round(cs["copy_gbps"], 2),
        sum_gbps=round(cs["sum_gbps"], 2), compute_rate=round(comp["rate"], 5),
        compute_overhead_us=round(comp["overhead_us"], 2), ring_step_us=steps,
        handoff_us=handoff, bind=bind,
        backends=fits,
        measurements={"pingpong": {k: pp[k] for k in ("sizes_bytes", "half_round_trip_us")},
                      "compute": {k: (round(v, 3) if isinstance(v, float) else v)
                                  for k, v in comp.items() if k not in ("rate", "overhead_us")},
                      "synthetic": {k: {"tensors": c, "numel": n} for k, (c, n) in SYNTHETIC.items()},
                      "iteration_ms": runs, "iterations": iterations})
