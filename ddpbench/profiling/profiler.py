"""Measure one training step of a PyTorch model and turn it into a workload profile.

A *layer* is a module that owns parameters directly (``parameters(recurse=False)``); the
time of operators without parameters (activations, pooling, residual additions) falls to
the parametric layer before them, as in the shipped PipeDream-derived profiles
(:mod:`ddpbench.simulator.make_profiles`).

Forward: a forward pre-hook stamps the first call of every layer in a step; a layer's
forward time runs from its stamp to the next layer's (the last one's to the end of the
loss), so the layers' forward times add up to the forward pass.

Backward: a post-accumulate-grad hook on every parameter stamps when its gradient is
complete in ``.grad``, which is when a data-parallel backend may send it. A layer is ready
when its last tensor is; walking the layers backwards, a layer's backward time is how far
its ready time lies past every later layer's, so the simulator (which runs the layers'
backward times in reverse order and sends a layer's tensors when it ends) releases each
gradient at its measured time, and the layers' backward times add up to the backward pass.

Timed steps with hooks alternate with steps without them; the latter give the step time
that the sum of the layer times is checked against (the hooks' own overhead).
"""

from __future__ import annotations

import ctypes
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpbench.profiling.model import import_torch

__all__ = ["Measurement", "keep_freed_memory", "matmul_like", "measure", "to_profile"]

# mallopt parameters of glibc's malloc.h.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4


@dataclass
class Measurement:
    """What :func:`measure` found: per-layer and per-tensor medians over the timed steps.

    Times are seconds. ``layers`` are in forward order, each ``(name, kind, tensor
    indices)``; ``tensors`` are ``(name, shape, dtype, bytes)`` in the same order the
    profile lists them.
    """

    model: str
    device: str
    device_name: str
    batch_size: int
    input_shape: tuple[int, ...]
    warmup: int
    repeats: int
    layers: list[tuple[str, str, list[int]]]
    tensors: list[tuple[str, tuple[int, ...], str, int]]
    fwd_s: list[float]
    bwd_s: list[float]
    ready_s: list[float | None]
    step_s: list[float] = field(default_factory=list)
    hooked_s: list[float] = field(default_factory=list)
    no_grad: list[str] = field(default_factory=list)


class _Clock:
    """Stamps on the host clock (CPU) or as CUDA events resolved after the step."""

    def __init__(self, torch: Any, cuda: bool) -> None:
        self.torch, self.cuda = torch, cuda

    def mark(self) -> Any:
        if self.cuda:
            ev = self.torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def since(self, start: Any, stamp: Any) -> float:
        """Seconds from ``start`` to ``stamp`` (call after :meth:`sync`)."""
        if self.cuda:
            return float(start.elapsed_time(stamp)) / 1e3
        return float(stamp - start)

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()


def keep_freed_memory() -> bool:
    """Have the C allocator keep freed memory for reuse; return whether it could be told so.

    glibc maps large blocks (activations, their gradients) fresh from the kernel and unmaps
    them when they are freed, or trims the heap behind them, so each CPU step pays page
    faults on tens of megabytes, and how many varies from step to step. With mmap and
    trimming off (``mallopt(M_MMAP_MAX, 0)``, ``mallopt(M_TRIM_THRESHOLD, ...)``, glibc's
    malloc.h) the blocks are reused, as PyTorch's caching allocator does on CUDA. This
    changes the whole process for good, so the command calls it, not the library.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))


def matmul_like(module: Any) -> bool:
    """Return whether ``module``'s own time is mostly matrix products (conv, linear, attention)."""
    torch = import_torch()
    nn = torch.nn
    return isinstance(module, (nn.modules.conv._ConvNd, nn.Linear, nn.Bilinear,
                               nn.MultiheadAttention, nn.RNNBase))


def _loss(out: Any) -> Any:
    """Return a scalar from any output (a tensor, a tuple, a named tuple or a dict of them)."""
    torch = import_torch()
    if isinstance(out, torch.Tensor):
        return out.float().mean() if out.is_floating_point() else None
    parts = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else []
    total = None
    for p in parts:
        part = _loss(p)
        if part is not None:
            total = part if total is None else total + part
    return total


def step_cost(model: Any, *, batch_size: int, input_shape: tuple[int, ...],
              device: str = "cpu", steps: int = 12) -> Any:
    """Return what ``steps`` training steps of ``model`` at ``batch_size`` will take (a
    :class:`ddpbench.sizes.Cost`), measured on two small steps before any large one.

    Memory: the parameters and their gradients, plus what autograd saves for the backward
    pass, counted by ``torch.autograd.graph.saved_tensors_hooks`` at batches 1 and 2: the
    difference is one sample's activations, the rest is what every batch saves (weights).
    Time: the batch-2 step's time per sample times the samples of every step (an
    overestimate: small batches carry more overhead per sample). Returns None when the
    small steps fail (the measurement then reports why).
    """
    from ddpbench import sizes

    torch = import_torch()
    model = model.to(device).train()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    saved_by, took = {}, 0.0
    for batch in (1, 2):
        total = 0

        def pack(t: Any) -> Any:
            nonlocal total
            total += t.numel() * t.element_size()
            return t

        x = torch.randn(batch, *input_shape, device=device)
        try:
            start = time.perf_counter()
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss = _loss(model(x))
            if loss is None:
                return None
            loss.backward()
            took = time.perf_counter() - start
        except (RuntimeError, ValueError, TypeError, IndexError):
            return None
        finally:
            model.zero_grad(set_to_none=True)
        saved_by[batch] = total + x.numel() * x.element_size()
    per_sample = max(0, saved_by[2] - saved_by[1])
    fixed = max(0, saved_by[1] - per_sample)
    memory = 2 * params + fixed + batch_size * per_sample
    seconds = took / 2 * batch_size * steps
    over: tuple[str, ...] = ()
    host = memory
    if device == "cuda":
        free, _total = torch.cuda.mem_get_info()
        over = sizes.overs((memory > free, f"more than the GPU's {sizes.gib(free)} free"))
        host = 2 * params
    return sizes.Cost("this profile", f"{steps} steps at batch {batch_size:,} "
                      f"({per_sample / 2**20:,.1f} MiB of activations a sample)", host,
                      seconds, over) if device != "cuda" else sizes.Cost(
        "this profile", f"{steps} steps at batch {batch_size:,} "
        f"({per_sample / 2**20:,.1f} MiB of activations a sample, "
        f"~{sizes.gib(memory)} of GPU memory)", host, seconds, over)


def measure(model: Any, name: str, *, batch_size: int, input_shape: tuple[int, ...],
            device: str = "cpu", warmup: int = 2, repeats: int = 5,
            progress: Callable[[str], None] | None = None,
            allow_large: bool = False) -> Measurement:
    """Time forward and backward of ``model`` on random input; return per-layer medians.

    Args:
        model: a ``torch.nn.Module``; it is put in training mode on ``device``.
        name: the model's name (recorded).
        batch_size: samples per step.
        input_shape: the shape of one sample (the batch dimension is added).
        device: ``cpu`` or ``cuda``.
        warmup: untimed steps first.
        repeats: timed steps with hooks, and as many without.
        progress: called with one line per step.
        allow_large: run even when :func:`step_cost` passes this machine's memory.

    Raises:
        ValueError: a batch or repeat count < 1, CUDA asked for but absent, an input shape
            that the model does not accept, or a model without parameters or floating
            outputs.
        ddpbench.sizes.TooLarge: the steps would not fit in memory (a ValueError).
    """
    from ddpbench import sizes

    torch = import_torch()
    _check_arguments(torch, batch_size=batch_size, device=device, warmup=warmup,
                     repeats=repeats)
    if not allow_large:
        cost = step_cost(model, batch_size=batch_size, input_shape=tuple(input_shape),
                         device=device, steps=warmup + 2 * repeats)
        if cost is not None:
            sizes.check(cost, advice="profile a smaller --batch-size")
    model = model.to(device).train()
    subject = _subject(torch, model, name, batch_size=batch_size, input_shape=input_shape,
                       device=device)
    plain, hooked, runs = _run_steps(subject, warmup, repeats, progress or (lambda _line: None))
    order = _layer_order(subject.owners, runs[0].fwd)
    index_of = {id(p): i for i, (_n, p) in enumerate(subject.params)}
    layer_tensors = {m: [index_of[id(p)] for _n, p in subject.params
                         if subject.owner_of[id(p)] == m]
                     for m in subject.owners}
    per_fwd, per_bwd, per_ready = _layer_times(runs, order, layer_tensors)
    layers_out, tensors_out, ready_out = _tables(subject, order, layer_tensors, per_ready)
    device_name = torch.cuda.get_device_name() if device == "cuda" else _cpu_name(torch)
    return Measurement(
        model=name, device=device, device_name=device_name, batch_size=batch_size,
        input_shape=tuple(input_shape), warmup=warmup, repeats=repeats, layers=layers_out,
        tensors=tensors_out, fwd_s=[statistics.median(v) for v in per_fwd],
        bwd_s=[statistics.median(v) for v in per_bwd], ready_s=ready_out, step_s=plain,
        hooked_s=hooked,
        no_grad=[subject.params[i][0] for i in range(len(subject.params))
                 if i not in per_ready])


def _check_arguments(torch: Any, *, batch_size: int, device: str, warmup: int,
                     repeats: int) -> None:
    """Raise ValueError for a count out of range or a device that is not there."""
    if batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {batch_size}")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"--repeats must be >= 1 and --warmup >= 0, got {repeats}, {warmup}")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: PyTorch sees no CUDA device here (use --device cpu)")


@dataclass
class _Subject:
    """The model under measurement, its input and its parametric layers.

    ``owner_of`` maps a parameter's ``id`` to the name of the module that owns it;
    ``owners`` lists those modules in the order their first parameter is registered.
    """

    model: Any
    name: str
    x: Any
    batch_size: int
    input_shape: tuple[int, ...]
    clock: _Clock
    params: list[tuple[str, Any]]
    modules: dict[str, Any]
    owner_of: dict[int, str]
    owners: list[str]


@dataclass
class _Run:
    """One hooked step: first-call stamps per layer, ready stamps per tensor, and when the
    forward pass and the backward pass ended (seconds from the step's start)."""

    fwd: dict[str, float]
    rdy: dict[int, float]
    t_fwd: float
    t_end: float


def _subject(torch: Any, model: Any, name: str, *, batch_size: int,
             input_shape: tuple[int, ...], device: str) -> _Subject:
    """Draw the random input and find the layers: the modules that own parameters directly."""
    x = torch.randn(batch_size, *input_shape, device=device)
    clock = _Clock(torch, device == "cuda")
    params = list(model.named_parameters())
    if not params:
        raise ValueError(f"model {name!r} has no parameters to profile")
    owner_of: dict[int, str] = {}
    modules = dict(model.named_modules())
    for pname, p in params:
        owner_of[id(p)] = pname.rsplit(".", 1)[0] if "." in pname else ""
    owners: list[str] = []
    for _pname, p in params:
        if owner_of[id(p)] not in owners:
            owners.append(owner_of[id(p)])
    return _Subject(model=model, name=name, x=x, batch_size=batch_size,
                    input_shape=input_shape, clock=clock, params=params, modules=modules,
                    owner_of=owner_of, owners=owners)


def _install_hooks(s: _Subject, firsts: dict[str, Any], ready: dict[int, Any]) -> list[Any]:
    """Hook every layer's first forward call and every parameter's accumulated gradient."""
    handles = []
    for mname in s.owners:
        def pre(_m: Any, _a: Any, mname: str = mname) -> None:
            if mname not in firsts:
                firsts[mname] = s.clock.mark()
        handles.append(s.modules[mname].register_forward_pre_hook(pre))
    for i, (_pname, p) in enumerate(s.params):
        def done(_p: Any, i: int = i) -> None:
            ready[i] = s.clock.mark()
        handles.append(p.register_post_accumulate_grad_hook(done))
    return handles


def _forward_loss(s: _Subject) -> Any:
    """Run the forward pass and return its loss; say which input shape would fit if it fails."""
    try:
        loss = _loss(s.model(s.x))
    except (RuntimeError, ValueError, TypeError, IndexError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"input shape {list(s.input_shape)} (batch {s.batch_size}) does not "
                         f"fit model {s.name!r}: {first}; pass --input-shape C,H,W "
                         "(one sample, without the batch)") from None
    if loss is None:
        raise ValueError(f"model {s.name!r} returns no floating-point tensor to "
                         "differentiate")
    return loss


def _step(s: _Subject, hooked: bool) -> tuple[float, _Run]:
    """Run one training step; return its time and, if ``hooked``, the layers' stamps."""
    s.model.zero_grad(set_to_none=True)
    firsts: dict[str, Any] = {}
    ready: dict[int, Any] = {}
    handles = _install_hooks(s, firsts, ready) if hooked else []
    clock = s.clock
    clock.sync()
    t0 = clock.mark()
    try:
        loss = _forward_loss(s)
        tf = clock.mark()
        loss.backward()
        te = clock.mark()
        clock.sync()
    finally:
        for h in handles:
            h.remove()
    fwd = {m: clock.since(t0, st) for m, st in firsts.items()}
    rdy = {i: clock.since(t0, st) for i, st in ready.items()}
    return clock.since(t0, te), _Run(fwd, rdy, clock.since(t0, tf), clock.since(t0, te))


def _run_steps(s: _Subject, warmup: int, repeats: int, say: Callable[[str], None],
               ) -> tuple[list[float], list[float], list[_Run]]:
    """Run the warm-up steps, then alternate plain and hooked timed steps.

    Returns the plain steps' times, the hooked steps' times and the hooked steps' stamps.
    """
    for k in range(warmup):
        total = _step(s, False)[0]
        say(f"warm-up {k + 1}/{warmup}: {total * 1e3:.1f} ms")
    plain: list[float] = []
    hooked: list[float] = []
    runs: list[_Run] = []
    for k in range(repeats):
        total = _step(s, False)[0]
        plain.append(total)
        h_total, run = _step(s, True)
        hooked.append(h_total)
        runs.append(run)
        say(f"step {k + 1}/{repeats}: {total * 1e3:.1f} ms (with hooks {h_total * 1e3:.1f} ms)")
    return plain, hooked, runs


def _layer_order(owners: list[str], first_fwd: dict[str, float]) -> list[str]:
    """Order the layers by their first forward call in the first timed step.

    A layer never called (its parameters used by a parent directly, or unused) goes just
    before the next one created.
    """
    order: list[str] = []
    pending: list[str] = []
    for mname in sorted(owners, key=lambda m: (first_fwd.get(m, float("inf")), owners.index(m))):
        if mname in first_fwd:
            order.append(mname)
    for mname in owners:
        if mname not in first_fwd:
            pending.append(mname)
    for mname in pending:
        later = [m for m in owners[owners.index(mname) + 1:] if m in first_fwd]
        order.insert(order.index(later[0]) if later else len(order), mname)
    return order


def _forward_times(run: _Run, order: list[str]) -> list[float]:
    """Give each called layer the time from its first call to the next layer's."""
    called = [(run.fwd[m], j) for j, m in enumerate(order) if m in run.fwd]
    called.sort()
    f_times = [0.0] * len(order)
    for c, (start, j) in enumerate(called):
        stop = called[c + 1][0] if c + 1 < len(called) else run.t_fwd
        f_times[j] = stop - start
    if called:
        f_times[called[0][1]] += called[0][0]  # before the first layer: input handling
    return f_times


def _backward_times(run: _Run, order: list[str],
                    layer_tensors: dict[str, list[int]]) -> list[float]:
    """Give each layer, walking backwards, how far its ready time lies past every later one's."""
    b_times = [0.0] * len(order)
    reached = run.t_fwd
    for j in range(len(order) - 1, -1, -1):
        times = [run.rdy[i] for i in layer_tensors[order[j]] if i in run.rdy]
        if times:
            b_times[j] = max(0.0, max(times) - reached)
            reached = max(reached, max(times))
    b_times[0] += max(0.0, run.t_end - reached)  # after the last gradient: the pass ends
    return b_times


def _layer_times(runs: list[_Run], order: list[str], layer_tensors: dict[str, list[int]],
                 ) -> tuple[list[list[float]], list[list[float]], dict[int, list[float]]]:
    """Return per layer its forward and backward times and per tensor its ready times
    (from the end of the forward pass), one entry per hooked step."""
    per_fwd: list[list[float]] = [[] for _ in order]
    per_bwd: list[list[float]] = [[] for _ in order]
    per_ready: dict[int, list[float]] = {}
    for run in runs:
        f_times = _forward_times(run, order)
        b_times = _backward_times(run, order, layer_tensors)
        for j in range(len(order)):
            per_fwd[j].append(f_times[j])
            per_bwd[j].append(b_times[j])
        for i, t in run.rdy.items():
            per_ready.setdefault(i, []).append(t - run.t_fwd)
    return per_fwd, per_bwd, per_ready


def _tables(s: _Subject, order: list[str], layer_tensors: dict[str, list[int]],
            per_ready: dict[int, list[float]],
            ) -> tuple[list[tuple[str, str, list[int]]],
                       list[tuple[str, tuple[int, ...], str, int]], list[float | None]]:
    """List the layers in order with their tensors, renumbered in that order, and each
    tensor's median ready time."""
    tensors_out: list[tuple[str, tuple[int, ...], str, int]] = []
    ready_out: list[float | None] = []
    layers_out: list[tuple[str, str, list[int]]] = []
    for m in order:
        idx = []
        for i in layer_tensors[m]:
            pname, p = s.params[i]
            idx.append(len(tensors_out))
            tensors_out.append((pname, tuple(p.shape), str(p.dtype).replace("torch.", ""),
                                p.numel() * p.element_size()))
            ready_out.append(statistics.median(per_ready[i]) if i in per_ready else None)
        layers_out.append((m or s.name, type(s.modules[m]).__name__, idx))
    return layers_out, tensors_out, ready_out


def _cpu_name(torch: Any) -> str:
    """Return the CPU's model name (Linux) or architecture, with the threads torch uses."""
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {torch.get_num_threads()} threads"


def _spread(values: list[float]) -> float:
    """Return (max - min) / median: how far the timed steps lay apart."""
    return (max(values) - min(values)) / statistics.median(values)


def to_profile(m: Measurement, matmul: list[bool]) -> dict[str, Any]:
    """Return the workload profile mapping (:mod:`ddpbench.simulator.workload`) of ``m``.

    Args:
        m: the measurement.
        matmul: per layer, whether its module is matrix-product-like (:func:`matmul_like`);
            their share of the time becomes ``matmul_fraction``.
    """
    from ddpbench import hardware

    torch = import_torch()
    if m.device == "cpu":
        device = "cpu"
    else:
        device = next((d for d in hardware.DEVICES if d != "cpu" and d in m.device_name), "")
    total = sum(m.fwd_s) + sum(m.bwd_s)
    mm = sum(f + b for f, b, is_mm in zip(m.fwd_s, m.bwd_s, matmul) if is_mm)
    layers = []
    for j, (lname, _kind, idx) in enumerate(m.layers):
        tensors = []
        for i in idx:
            tname, shape, dtype, nbytes = m.tensors[i]
            entry: dict[str, Any] = {"name": tname, "numel": nbytes // _itemsize(dtype),
                                     "shape": list(shape), "dtype": dtype, "bytes": nbytes}
            if m.ready_s[i] is not None:
                entry["ready_ms"] = round(float(m.ready_s[i] or 0.0) * 1e3, 4)
            tensors.append(entry)
        layers.append({"name": lname, "fwd_ms": round(m.fwd_s[j] * 1e3, 4),
                       "bwd_ms": round(m.bwd_s[j] * 1e3, 4), "tensors": tensors})
    step = statistics.median(m.step_s)
    notes = (f"measured by ddpbench profile: {m.model} on {m.device} ({m.device_name}), batch "
             f"{m.batch_size}; layer times are medians over {m.repeats} timed steps with hooks; "
             "parameterless operators fall to the preceding layer.")
    if m.no_grad:
        notes += f" {len(m.no_grad)} tensor(s) received no gradient: {', '.join(m.no_grad[:5])}."
    return {
        "name": m.model,
        "batch_size": m.batch_size,
        "gpu": f"{m.device}: {m.device_name}",
        **({"device": device} if device else {}),
        "matmul_fraction": round(mm / total, 3) if total > 0 else 0.0,
        "notes": notes,
        "measured": {
            "tool": "ddpbench profile",
            "torch": str(torch.__version__),
            "python": sys.version.split()[0],
            "device": m.device,
            "device_name": m.device_name,
            "threads": int(torch.get_num_threads()),
            "batch_size": m.batch_size,
            "input_shape": list(m.input_shape),
            "warmup": m.warmup,
            "repeats": m.repeats,
            "step_ms": round(step * 1e3, 3),
            "step_ms_min": round(min(m.step_s) * 1e3, 3),
            "step_ms_max": round(max(m.step_s) * 1e3, 3),
            "step_spread": round(_spread(m.step_s), 4),
            "hooked_step_ms": round(statistics.median(m.hooked_s) * 1e3, 3),
            "layers_sum_ms": round(total * 1e3, 3),
            "layers_sum_vs_step": round(total / step, 4),
        },
        "layers": layers,
    }


def _itemsize(dtype: str) -> int:
    torch = import_torch()
    return int(torch.empty((), dtype=getattr(torch, dtype)).element_size())
