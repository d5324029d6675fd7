"""``ddpbench bench allreduce``: nccl-tests-style allreduce timings of the real backends.

The command launches its own ranks (``ddpbench.launch``); rank 0 of the job writes one JSON
row per (backend, size) that the parent prints as a table, CSV or JSON. Timing is OSU's
(``osu_allreduce``): warm-up iterations, one barrier, then ``MPI.Wtime`` around each
``push_pull`` of the timed loop, the slowest rank's time of each call kept; the row reports
the median with min and max. No barrier between the timed calls: under
``MPI_THREAD_MULTIPLE`` MPICH completes a barrier on the caller's thread only once a
blocking call on another thread of the process returns, so with an engine thread that
cycles (``horovod``: a bit-vector ``MPI_Allreduce`` each cycle) every barrier would end just
after a cycle began and every timed call would wait for the next one (measured:
docs/results/2026-12-01-fidelity-round-2.md); for the same reason a cycling backend's calls
are not paired with bare ones (below). ``--inflight K`` makes each timed call
``K`` tensors of the size submitted at once and waited for together, as a training step
has several gradients in flight; the row's time is per call and its bandwidth counts all
``K``. Every result is checked against the closed-form reference (#wrong counts differing
elements). The ratios compare each row (on CPU) with a bare ``comm.Allreduce`` of the same
size timed right before each of its calls, so both see the same phase of a shared machine
(a cycling backend's rows with the ``native`` row); the ``native`` row is that baseline
timed on its own. Above 16 MiB native makes its calls in
the equal chunks the backends make (``backends._common.ALLREDUCE_CHUNK_BYTES``: glibc would
map MPICH's temporary buffer afresh on every call), so the ratios measure the engines, not
the allocator; a ``native:one_call`` row, added where a size (or the tensor set) is larger,
times one bare call of the whole buffer, as a user's own code would make it.

``--tensors resnet50`` reduces the 161 gradient tensors of ResNet-50 as one set, in
backward order, with ``mpi`` (the baseline), ``horovod`` fused and ``horovod`` unfused;
``--layout flat`` makes every tensor a view of one flat buffer (in backward order), which
``horovod`` then reduces where it lies instead of copying into its fusion buffer.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from ddpbench.benchmarks import allreduce_scalar

HELP = "time allreduce of the real backends (nccl-tests columns, ratios against mpi)"

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
DTYPES = ["float16", "bfloat16", "float32", "float64", "int32", "int64"]
OPS = ["sum", "average", "min", "max", "product"]


def parse_size(text: str) -> int:
    """Return the byte count of ``'4K'``, ``'64M'``, ``'1G'`` or ``'512'``."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(i?B)?\s*", text, flags=re.IGNORECASE)
    if not m:
        raise ValueError(f"size {text!r} is not a number with an optional K, M or G suffix")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def parse_sizes(text: str, factor: int = 2) -> list[int]:
    """Return the sizes of ``'1K:64M'`` (doubling by ``factor``) or ``'4K,1M'``."""
    if ":" in text:
        if factor < 2:  # a range that never grows would never end
            raise ValueError(f"--factor must be an integer >= 2 for the size range {text!r}, "
                             f"got {factor}")
        lo, hi = (parse_size(t) for t in text.split(":", 1))
        if lo < 1 or hi < lo:
            raise ValueError(f"size range {text!r} must go from >= 1 byte up to a larger size")
        out, s = [], lo
        while s <= hi:
            out.append(s)
            s *= factor
        return out
    return [parse_size(t) for t in text.split(",") if t.strip()]


def human(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f}{unit}" if nbytes == int(nbytes) else f"{nbytes:.1f}{unit}"
        nbytes /= 1024
    return f"{nbytes}"


def profile_tensor_sizes(model: str) -> list[int]:
    """Parameter counts of a shipped model's tensors, in definition order."""
    path = resources.files("ddpbench.simulator") / "profiles" / f"{model}_tensors.tsv"
    if not path.is_file():
        raise ValueError(f"unknown tensor set {model!r}; available: ['resnet50', 'vgg19']")
    rows = path.read_text().splitlines()[1:]
    return [int(r.split("\t")[2]) for r in rows if r.strip()]


# -- worker side (runs on every rank) -------------------------------------------------------
def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _inputs(count: int, rank: int, size: int, dtype: np.dtype, op: str) -> tuple:
    """Rank-dependent input and its exact reduction (small integers: exact in every dtype)."""
    pattern = (np.arange(count, dtype=np.int64) % 7) + 1
    x = (pattern * (rank + 1)).astype(dtype)
    ranks = np.arange(1, size + 1, dtype=np.float64)
    combine = {
        "sum": ranks.sum(), "average": ranks.mean(), "min": ranks.min(), "max": ranks.max(),
    }
    if op == "product":  # (rank+1) everywhere keeps the product, size!, exact in fp16
        x = np.full(count, rank + 1, dtype=dtype)
        ref = np.full(count, float(math.factorial(size)))
    else:
        ref = pattern.astype(np.float64) * combine[op]
    return x, ref


def _time_one(comm: Any, fn: Any, warmup: int, iters: int, pair: Any = None
              ) -> tuple[list[float], list[float]]:
    """Time ``iters`` calls of ``fn`` (the slowest rank's time each); with ``pair``, time one
    call of it right before every call of ``fn`` too and return its samples second.

    One barrier before the timed loop, as ``osu_allreduce`` has, and none between the calls
    (the module docstring says why)."""
    from mpi4py import MPI

    for _ in range(warmup):
        fn()
        if pair is not None:
            pair()
    samples, paired = [], []
    comm.Barrier()
    for _ in range(iters):
        if pair is not None:
            t0 = MPI.Wtime()
            pair()
            paired.append(MPI.Wtime() - t0)
        t0 = MPI.Wtime()
        fn()
        samples.append(MPI.Wtime() - t0)
    worst = np.array(samples + paired)
    comm.Allreduce(MPI.IN_PLACE, worst, op=MPI.MAX)
    return worst[:iters].tolist(), worst[iters:].tolist()


def _backend_spec(spec: str) -> tuple[str, str, dict[str, Any]]:
    """``'horovod'``, ``'horovod:fusion_threshold=0'`` or ``'horovod:cycle_time=0:idle=wait'``
    -> (label, name, options). A value is read as JSON (numbers, true/false), else kept as
    text; a key without ``=value`` is True."""
    name, *pairs = spec.split(":")
    options: dict[str, Any] = {}
    for kv in filter(None, pairs):
        key, _, value = kv.partition("=")
        try:
            options[key] = json.loads(value) if value else True
        except json.JSONDecodeError:
            options[key] = value
    return spec, name, options


def check_backend_specs(specs: list[str]) -> None:
    """Raise UsageError for an unknown backend or a bad option in ``specs`` (in the parent,
    before any process starts)."""
    import ddpbench
    from ddpbench.cli import UsageError

    for spec in specs:
        _, name, options = _backend_spec(spec)
        try:
            ddpbench.api.backend_class(name).parse_options(options)
        except ValueError as err:
            raise UsageError(f"--backends {spec!r}: {err}") from None


class _Native:
    """The ``native`` row: a bare allreduce on preallocated buffers, no engine.

    On CPU arrays ``comm.Allreduce``. With ``--device gpu`` the arrays are CuPy's, which
    the mpich wheel's MPI cannot read (it is not CUDA-aware: device pointers crash it), so
    the bare call is the transport the backends use there: one ``ncclAllReduce`` with
    ``--gpu-transport nccl``, or a copy into page-locked host memory, ``comm.Allreduce`` and
    a copy back with ``host``.
    """

    def __init__(self, comm: Any, cfg: dict[str, Any] | None = None, *,
                 one_call: bool = False) -> None:
        from ddpbench.backends._common import ALLREDUCE_CHUNK_BYTES

        self.comm = comm.Dup()
        self.chunk_bytes = 0 if one_call else ALLREDUCE_CHUNK_BYTES
        self.nccl: Any = None
        self.stage = False
        self._pinned: dict[tuple[int, str], tuple[Any, Any]] = {}
        if cfg is not None and cfg.get("device") == "gpu":
            if cfg.get("gpu_transport", "nccl") == "nccl":
                from ddpbench import gpu
                from ddpbench.comm import world

                self.nccl = gpu.NcclComm(self.comm, gpu.select_device(world().local_rank))
            else:
                self.stage = True

    def push_pull_async(self, name: Any, x: Any, output: Any, op: str, priority: int = 0
                        ) -> Any:
        from ddpbench.api import ReduceOp
        from ddpbench.backends._common import mpi_allreduce

        reduce_op = ReduceOp.parse(op)
        if self.nccl is not None:
            if output is not x:
                output[...] = x
            self.nccl.allreduce(output.reshape(-1), reduce_op)
        elif self.stage:
            key = (x.size, str(x.dtype))
            if key not in self._pinned:  # preallocated once per size, page-locked
                import cupyx

                self._pinned[key] = (cupyx.empty_pinned(x.size, x.dtype),
                                     cupyx.empty_pinned(x.size, x.dtype))
            host, out = self._pinned[key]
            x.reshape(-1).get(out=host)
            mpi_allreduce(self.comm, out, reduce_op, source=host,
                          chunk_bytes=self.chunk_bytes)
            output.reshape(-1).set(out)
        else:
            mpi_allreduce(self.comm, output.reshape(-1), reduce_op, source=x.reshape(-1),
                          chunk_bytes=self.chunk_bytes)
        if op == "average":
            output /= self.comm.size
        return _Done()

    def push_pull(self, name: Any, x: Any, output: Any, op: str) -> None:
        self.push_pull_async(name, x, output, op)

    def close(self) -> None:
        if self.nccl is not None:
            self.nccl.close()
        self.comm.Free()


class _Done:
    def wait(self) -> None:
        return None


class _Gloo:
    """torch.distributed on gloo, the peer users know, on preallocated tensors."""

    BUCKET_BYTES = 25 * 1024 * 1024  # DDP's default bucket_cap_mb

    def __init__(self, comm: Any) -> None:
        import torch.distributed as dist

        from ddpbench.benchmarks import init_gloo

        self.dist = dist
        init_gloo(comm)

    def push_pull(self, name: Any, x: Any, output: Any, op: str) -> None:
        import torch

        y = torch.from_numpy(output)
        y.copy_(torch.from_numpy(x))
        self.dist.all_reduce(y, op=self._op(op))
        if op == "average":
            y /= self.dist.get_world_size()

    def set_runner(self, xs: list[np.ndarray], ys: list[np.ndarray], order: list[int],
                   op: str) -> Any:
        """Return a function reducing the set as DDP does: 25 MB buckets in backward order."""
        import torch

        buckets: list[list[int]] = [[]]
        size = 0
        for i in order:
            if buckets[-1] and size + xs[i].nbytes > self.BUCKET_BYTES:
                buckets.append([])
                size = 0
            buckets[-1].append(i)
            size += xs[i].nbytes
        flats = [torch.empty(sum(xs[i].size for i in b), dtype=torch.from_numpy(xs[0]).dtype)
                 for b in buckets]

        def run() -> None:
            works = []
            for b, flat in zip(buckets, flats):
                torch.cat([torch.from_numpy(xs[i]) for i in b], out=flat)
                works.append(self.dist.all_reduce(flat, op=self._op(op), async_op=True))
            for b, flat, w in zip(buckets, flats, works):
                w.wait()
                off = 0
                for i in b:
                    torch.from_numpy(ys[i]).copy_(flat[off:off + xs[i].size])
                    off += xs[i].size

        return run

    def _op(self, op: str) -> Any:
        r = self.dist.ReduceOp
        return {"sum": r.SUM, "average": r.SUM, "min": r.MIN, "max": r.MAX,
                "product": r.PRODUCT}[op]

    def close(self) -> None:
        """Keep the process group: later rounds reuse it."""


def _open(spec: str, cfg: dict[str, Any], comm: Any) -> tuple[str, Any]:
    import ddpbench

    label, name, options = _backend_spec(spec)
    if name == "native":
        return label, _Native(comm, cfg, one_call=bool(options.get("one_call")))
    if name == "gloo":
        return label, _Gloo(comm)
    if cfg.get("device") == "gpu" and "gpu_transport" in ddpbench.api.backend_class(
            name).Options.model_fields:  # mpi, horovod; the others stage through the host
        options = {"gpu_transport": cfg["gpu_transport"], **options}
    return label, ddpbench.create(name, **options)


def worker(cfg: dict[str, Any]) -> None:
    """Time every backend at every size (or on the tensor set), in ``rounds`` rounds.

    Each round opens each backend in turn, times ``iters / rounds`` iterations of every
    size and closes it, so that slow drift of a shared machine falls on every row alike;
    the samples of all rounds make the row.
    """
    from ddpbench.comm import world

    comm = world().comm
    dtype = _np_dtype(cfg["dtype"])
    if cfg.get("device") == "gpu":
        from ddpbench import gpu

        gpu.select_device(world().local_rank)
    rounds = max(1, cfg.get("rounds", 1))
    per_round = max(1, -(-cfg["iters"] // rounds))
    samples: dict[tuple[str, int], list[float]] = {}
    extra: dict[tuple[str, int], dict[str, Any]] = {}
    keys = [(s, n) for s in cfg["backends"] for n in (cfg["sizes"] if not cfg.get("tensors")
                                                     else [0])]
    for _ in range(rounds):
        for spec in cfg["backends"]:
            label, kv = _open(spec, cfg, comm)
            runs = ([(0, _tensor_set(kv, comm, label, cfg, dtype, per_round))]
                    if cfg.get("tensors") else
                    [(n, _one_size(kv, comm, n, cfg, dtype, per_round)) for n in cfg["sizes"]])
            for nbytes, (got, info) in runs:
                samples.setdefault((spec, nbytes), []).extend(got)
                prev = extra.get((spec, nbytes), {})
                for k in ("wrong", "groups", "zero_copy_groups", "paired_native_us"):
                    if k in info:  # summed (counts) or joined (samples) over the rounds
                        info[k] = prev.get(k, type(info[k])()) + info[k]
                extra[(spec, nbytes)] = info
            info_cycle = getattr(getattr(kv, "options", None), "cycle_time", None)
            for key in keys:
                if key[0] == spec and info_cycle is not None:
                    extra[key]["cycle_time_ms"] = info_cycle
            kv.close()
        if comm.rank == 0:
            print("  round done", file=sys.stderr, flush=True)
    if comm.rank == 0:
        with open(cfg["out"], "a") as out:
            for spec, nbytes in keys:
                info = extra[(spec, nbytes)]
                row = _row(spec, info["nbytes"], info["count"], cfg, samples[(spec, nbytes)],
                           info["wrong"], comm.size, info.get("inflight", 1))
                row.update({k: v for k, v in info.items() if k not in ("nbytes", "count",
                                                                        "wrong")})
                if "paired_native_us" in info:
                    row["paired_native_time_us"] = float(np.median(info["paired_native_us"]))
                out.write(json.dumps(row) + "\n")


def _on_device(cfg: dict[str, Any], x: np.ndarray) -> Any:
    if cfg.get("device") != "gpu":
        return x
    from ddpbench import gpu

    return gpu.cupy_or_raise().asarray(x)


def _to_host(y: Any) -> np.ndarray:
    return y.get() if hasattr(y, "get") and not isinstance(y, np.ndarray) else y


def _cycles(kv: Any) -> bool:
    """Whether ``kv``'s engine keeps making blocking MPI calls while idle (horovod's cycle).

    Then no bare call is paired with its timed calls: under MPI_THREAD_MULTIPLE MPICH ends a
    blocking call on this thread only once the engine's blocking call returns, so each timed
    call would start just after a cycle began (its ratio to native uses the native row)."""
    return getattr(getattr(kv, "options", None), "idle", None) == "cycle"


def _one_size(kv, comm, nbytes, cfg, dtype, iters) -> tuple[list[float], dict[str, Any]]:
    count = max(1, nbytes // dtype.itemsize)
    x, ref = _inputs(count, comm.rank, comm.size, dtype, cfg["op"])
    x = _on_device(cfg, x)
    k = max(1, int(cfg.get("inflight", 1)))
    xs = [x] + [x.copy() for _ in range(k - 1)]
    ys = [t.copy() for t in xs]
    names = [f"ar{nbytes}"] if k == 1 else [f"ar{nbytes}_{j}" for j in range(k)]

    def call() -> None:
        if k == 1 or not hasattr(kv, "push_pull_async"):
            for n, t, o in zip(names, xs, ys):
                kv.push_pull(n, t, output=o, op=cfg["op"])
            return
        handles = [kv.push_pull_async(n, t, output=o, op=cfg["op"])
                   for n, t, o in zip(names, xs, ys)]
        for h in handles:
            h.wait()

    pair = None
    if cfg.get("device") != "gpu" and not isinstance(kv, _Native) and not _cycles(kv):
        # Bare allreduces timed right before each call: the ratios compare samples taken
        # seconds apart at most, so the machine's slow and fast phases hit both alike.
        native, x_n, y_n = _Native(comm), x.copy(), x.copy()

        def pair() -> None:
            for _ in range(k):
                native.push_pull_async(names[0], x_n, y_n, op=cfg["op"])

    samples, paired = _time_one(comm, call, cfg["warmup"], iters, pair)
    if pair is not None:
        native.comm.Free()
    wrong = sum(int(np.count_nonzero(_to_host(y).astype(np.float64) != ref)) for y in ys)
    wrong = int(allreduce_scalar(comm, wrong, "sum"))
    info: dict[str, Any] = {"nbytes": count * dtype.itemsize, "count": count, "wrong": wrong,
                            "inflight": k}
    if paired:
        info["paired_native_us"] = [t * 1e6 for t in paired]
    return samples, info


def _tensor_set(kv, comm, label, cfg, dtype, iters) -> tuple[list[float], dict[str, Any]]:
    counts = profile_tensor_sizes(cfg["tensors"])
    scale = cfg.get("scale", 1.0)
    counts = [max(1, int(c * scale)) for c in counts]
    xs, refs, ys = [], [], []
    for c in counts:
        x, ref = _inputs(c, comm.rank, comm.size, dtype, cfg["op"])
        x = _on_device(cfg, x)
        xs.append(x)
        refs.append(ref)
        ys.append(x.copy())
    order = list(reversed(range(len(counts))))  # backward: last layer's gradient first
    total = sum(counts)
    if cfg.get("layout") == "flat":
        # Every input and every output a view of one flat buffer, in backward order.
        x_flat, y_flat = np.empty(total, dtype), np.empty(total, dtype)
        off = 0
        for i in order:
            c = counts[i]
            x_flat[off:off + c] = xs[i].reshape(-1)
            xs[i] = x_flat[off:off + c].reshape(xs[i].shape)
            ys[i] = y_flat[off:off + c].reshape(ys[i].shape)
            ys[i][...] = xs[i]
            off += c
    if label in ("native", "native:one_call"):
        # The floor: an MPI_Allreduce of every gradient at once, already packed (in the
        # backends' chunks; native:one_call in one call).
        x_all = np.concatenate([x.reshape(-1) for x in xs])
        y_all = x_all.copy()

        def one_set() -> None:
            kv.push_pull("all", x_all, output=y_all, op=cfg["op"])

        samples, _ = _time_one(comm, one_set, cfg["warmup"], iters)
        ref_all = np.concatenate(refs)
        wrong = int(np.count_nonzero(_to_host(y_all).astype(np.float64) != ref_all))
        return samples, {"nbytes": total * dtype.itemsize, "count": total, "tensors": 1,
                         "wrong": int(allreduce_scalar(comm, wrong, "sum"))}
    if isinstance(kv, _Gloo):
        one_set = kv.set_runner(xs, ys, order, cfg["op"])
    else:
        def one_set() -> None:
            handles = [kv.push_pull_async(i, xs[i], output=ys[i], op=cfg["op"], priority=-i)
                       for i in order]
            for h in handles:
                h.wait()

    stats = getattr(kv, "stats", None)
    before = dict(stats) if isinstance(stats, dict) else {}
    samples, _ = _time_one(comm, one_set, cfg["warmup"], iters)
    wrong = sum(int(np.count_nonzero(_to_host(y).astype(np.float64) != r))
                for y, r in zip(ys, refs))
    extra: dict[str, Any] = {}
    if "zero_copy_groups" in before:  # fused groups, and those reduced where they lie
        after = kv.stats
        extra = {"groups": after["groups"] - before["groups"],
                 "zero_copy_groups": after["zero_copy_groups"] - before["zero_copy_groups"]}
    return samples, {"nbytes": total * dtype.itemsize, "count": total, "tensors": len(counts),
                     "wrong": int(allreduce_scalar(comm, wrong, "sum")), **extra}


def _row(label, nbytes, count, cfg, samples, wrong, n, inflight=1) -> dict[str, Any]:
    med = float(np.median(samples))
    algbw = nbytes * inflight / med / 1e9 if med > 0 else float("inf")
    return {
        "backend": label, "ranks": n, "size": nbytes, "count": count, "type": cfg["dtype"],
        "device": cfg.get("device", "cpu"), "redop": cfg["op"], "time_us": med * 1e6, "min_us": min(samples) * 1e6,
        "max_us": max(samples) * 1e6, "algbw": algbw, "busbw": algbw * 2 * (n - 1) / n,
        "wrong": wrong, "samples_us": [s * 1e6 for s in samples], "inflight": inflight,
    }


# -- parent side ------------------------------------------------------------------------------
def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backends", default="mpi,horovod",
                        help="comma-separated; options as name:key=value[:key=value...] (default "
                             "mpi,horovod); "
                             "a 'native' row (bare comm.Allreduce) is always measured first")
    parser.add_argument("--peers", default="",
                        help="other libraries measured in the same run: 'gloo' "
                             "(torch.distributed; needs the torch extra)")
    parser.add_argument("-n", "--ranks", default="2",
                        help="ranks to launch, or a comma-separated list (e.g. 2,3: one job "
                             "each, every backend in each; default 2)")
    parser.add_argument("--sizes", default="1K:64M",
                        help="a range LO:HI (x --factor each step) or a list, e.g. 4K,1M")
    parser.add_argument("--factor", type=int, default=2, help="size step of a range (default 2)")
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument("--op", default="sum", choices=OPS)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2,
                        help="open every backend this many times in turn, iters/rounds "
                             "iterations each, so drift of a shared machine hits all rows alike")
    parser.add_argument("--inflight", type=int, default=1,
                        help="tensors of each size submitted at once and waited for together "
                             "in each timed call, as a training step has several gradients in "
                             "flight (default 1: one synchronous call); bandwidth counts all")
    parser.add_argument("--tensors", default=None, choices=["resnet50", "vgg19"],
                        help="reduce a model's gradient tensors as one set instead of --sizes")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="with --tensors: scale every tensor's size by this factor")
    parser.add_argument("--layout", default="separate", choices=["separate", "flat"],
                        help="with --tensors: one array per tensor (separate), or every "
                             "tensor a view of one flat buffer in backward order (flat, as "
                             "PyTorch DDP's bucket views), which horovod reduces where it lies")
    parser.add_argument("--device", default="cpu", choices=["cpu", "gpu"],
                        help="where the tensors live (gpu: CuPy arrays, one GPU per local rank)")
    parser.add_argument("--gpu-transport", default="nccl", choices=["nccl", "host"],
                        help="with --device gpu: NCCL (one rank per GPU) or pinned-host staging")
    parser.add_argument("--format", default="table", choices=["table", "csv", "json"])
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="kill the benchmark job after this many seconds")


def main(args: argparse.Namespace) -> int:
    from ddpbench.backends._common import ALLREDUCE_CHUNK_BYTES
    from ddpbench.cli import UsageError

    try:
        sizes = parse_sizes(args.sizes, args.factor)
    except ValueError as err:
        raise UsageError(str(err)) from None
    try:
        ranks = [int(t) for t in str(args.ranks).split(",") if t.strip()]
    except ValueError:
        raise UsageError(f"-n/--ranks must be an integer or a list such as 2,3, got "
                         f"{args.ranks!r}") from None
    if not ranks or min(ranks) < 1 or args.warmup < 0 or args.iters < 1 or args.rounds < 1:
        raise UsageError("need --ranks >= 1, --warmup >= 0, --iters >= 1 and --rounds >= 1")
    if args.inflight < 1 or (args.inflight > 1 and args.tensors):
        raise UsageError(f"--inflight must be >= 1 and goes with --sizes, not --tensors; got "
                         f"{args.inflight}")
    itemsize = np.dtype(args.dtype).itemsize if args.dtype != "bfloat16" else 2
    if not args.tensors and (not sizes or min(sizes) < itemsize):
        raise UsageError(f"--sizes: every size must hold at least one {args.dtype} element "
                         f"({itemsize} bytes), got {args.sizes!r}")
    if not (math.isfinite(args.scale) and args.scale > 0):
        raise UsageError(f"--scale must be a finite number > 0, got {args.scale}")
    if args.layout == "flat" and (not args.tensors or args.device != "cpu"):
        raise UsageError("--layout flat needs --tensors and --device cpu")
    if args.device == "gpu":
        from ddpbench import gpu

        if not gpu.is_available():
            raise UsageError(f"--device gpu needs CuPy and a CUDA device ({gpu.INSTALL_HINT})")
    backends = [b for b in args.backends.split(",") if b and b != "native"]
    if args.tensors and args.backends == "mpi,horovod":
        backends = ["mpi", "horovod", "horovod:fusion_threshold=0"]
    peers = [p for p in args.peers.split(",") if p]
    for peer in peers:
        if peer != "gloo":
            raise UsageError(f"--peers: unknown peer {peer!r}; available: ['gloo']")
        if args.device == "gpu":
            raise UsageError("--peers gloo measures CPU tensors; drop it with --device gpu")
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            raise UsageError("--peers gloo needs PyTorch: pip install 'ddpbench[torch]'")
    check_backend_specs(backends)
    native = ["native"] + (["native:per_tensor"] if args.tensors else [])
    largest = (sum(max(1, int(c * args.scale)) for c in profile_tensor_sizes(args.tensors))
               * itemsize if args.tensors else max(sizes))
    if args.device == "cpu" and largest > ALLREDUCE_CHUNK_BYTES:
        native.append("native:one_call")  # what chunking saves: one call of the whole
    specs = native + backends + peers
    rows: list[dict[str, Any]] = []
    for n in ranks:
        got, rc = _run_job(args, specs, sizes, n)
        if rc != 0:
            print(f"ddpbench bench allreduce: the benchmark job of {n} ranks failed (exit {rc})",
                  file=sys.stderr)
            return 1
        rows += got
    _print(rows, args.format)
    return 1 if any(r["wrong"] for r in rows) else 0


def _run_job(args: argparse.Namespace, specs: list[str], sizes: list[int], n: int
             ) -> tuple[list[dict[str, Any]], int]:
    """Launch one job of ``n`` ranks over every spec; return its rows and exit code."""
    from ddpbench.launch import launch

    with tempfile.TemporaryDirectory(prefix="ddpbench-bench-") as tmp:
        out = Path(tmp) / "rows.jsonl"
        cfg = {
            "backends": specs, "sizes": sizes, "dtype": args.dtype, "op": args.op,
            "warmup": args.warmup, "iters": args.iters, "rounds": args.rounds,
            "tensors": args.tensors, "scale": args.scale, "layout": args.layout,
            "out": str(out), "inflight": args.inflight,
            "device": args.device, "gpu_transport": args.gpu_transport,
        }
        print(f"# ddpbench bench allreduce: {n} ranks, {', '.join(specs)}",
              file=sys.stderr, flush=True)
        rc = launch([sys.executable, "-m", "ddpbench.benchmarks.allreduce", json.dumps(cfg)],
                    n, timeout=args.timeout)
        rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return rows, rc


def _print(rows: list[dict[str, Any]], fmt: str) -> None:
    """Print the rows of every job (one table, then the ratios of each rank count)."""
    if fmt == "json":
        print(json.dumps(rows, indent=1))
        return
    counts = sorted({r["ranks"] for r in rows})
    if fmt == "csv" or len(counts) <= 1:
        _print_job(rows, fmt)
        _print_backend_ratios(rows)
        return
    for i, n in enumerate(counts):
        if i:
            print()
        _print_job([r for r in rows if r["ranks"] == n], fmt)
    _print_backend_ratios(rows)


def _print_backend_ratios(rows: list[dict[str, Any]]) -> None:
    """Each backend's busbw against mpi's at the same ranks and size (same run)."""
    mpi = {(r["ranks"], r["size"]): r for r in rows if r["backend"] == "mpi"}
    lines = [f"{r['backend']:<32} n={r['ranks']:<2} {human(r['size']):>9}  busbw / mpi's "
             f"{r['busbw'] / mpi[(r['ranks'], r['size'])]['busbw']:6.3f}"
             for r in rows if r["backend"] not in ("mpi", "native") and "tensors" not in r
             and (r["ranks"], r["size"]) in mpi and mpi[(r["ranks"], r["size"])]["busbw"]]
    if lines:
        print("\n# busbw against the mpi backend's (same run, same ranks and size)")
        print("\n".join(lines))


def _print_job(rows: list[dict[str, Any]], fmt: str) -> None:
    from ddpbench.backends._common import ALLREDUCE_CHUNK_BYTES

    cols = ["backend", "ranks", "size", "count", "type", "redop", "time_us", "min_us",
            "max_us", "algbw", "busbw", "wrong"]
    if fmt == "csv":
        print(",".join(cols))
        for r in rows:
            print(",".join(str(r[c]) for c in cols))
        return
    head = (f"{'backend':<32} {'n':>2} {'size':>9} {'count':>10} {'type':>8} {'redop':>7} "
            f"{'time_us':>10} {'min_us':>10} {'max_us':>10} {'algbw':>7} {'busbw':>7} "
            f"{'#wrong':>6}")
    print(head)
    print("#" + " " * 83 + "(GB/s)  (GB/s)")
    for r in rows:
        print(f"{r['backend']:<32} {r['ranks']:>2} {human(r['size']):>9} {r['count']:>10} "
              f"{r['type']:>8} {r['redop']:>7} {r['time_us']:>10.1f} {r['min_us']:>10.1f} "
              f"{r['max_us']:>10.1f} {r['algbw']:>7.3f} {r['busbw']:>7.3f} {r['wrong']:>6}")
    inflight = max((r.get("inflight", 1) for r in rows), default=1)
    if inflight > 1:
        print(f"# each timed call: {inflight} tensors of the size in flight at once; time per "
              f"call, algbw and busbw over all {inflight}")
    cycles = {r["backend"]: r["cycle_time_ms"] for r in rows if "cycle_time_ms" in r}
    for label, ms in cycles.items():
        print(f"# {label}: cycle_time {ms:g} ms (Horovod's default is 1 ms; set "
              f"HOROVOD_CYCLE_TIME or {label.partition(':')[0]}:cycle_time=MS)")
    if any("tensors" in r for r in rows):
        _print_set(rows)
        return
    base = {r["size"]: r for r in rows if r["backend"] == "native"}
    gloo = {r["size"]: r for r in rows if r["backend"] == "gloo"}
    paired = any("paired_native_time_us" in r for r in rows)
    print(f"\n# ratios against native (bare comm.Allreduce, above "
          f"{human(ALLREDUCE_CHUNK_BYTES)} in the backends' chunks" + (
          ", timed right before each call of the row, so the machine's slow and fast phases "
          "hit both alike (a backend that cycles: the native row)" if paired else ", same run") + "): busbw ratio >= 1 and "
          "time ratio <= 1 mean as fast as native" + ("; last column: time / gloo's" if gloo
                                                      else ""))

    def native_us(r: dict[str, Any]) -> float | None:
        b = base.get(r["size"])
        return r.get("paired_native_time_us", b["time_us"] if b is not None else None)

    for r in rows:
        ref = native_us(r)
        if r["backend"] == "native" or ref is None:
            continue
        line = (f"{r['backend']:<32} {human(r['size']):>9}  busbw ratio "
                f"{ref / r['time_us']:6.3f}   time ratio {r['time_us'] / ref:7.3f}")
        g = gloo.get(r["size"])
        if g is not None and r["backend"] != "gloo":
            line += f"   vs gloo {r['time_us'] / g['time_us']:6.3f}"
        print(line)
    smallest = min(base) if base else None
    if smallest is not None:
        print(f"\n# per-tensor engine overhead at {human(smallest)}: time - native time "
              f"(target <= 50 us)")
        for r in rows:
            ref = native_us(r)
            if r["size"] == smallest and r["backend"] not in ("native", "gloo") and ref:
                print(f"{r['backend']:<32} {r['time_us'] - ref:8.1f} us")


def _print_set(rows: list[dict[str, Any]]) -> None:
    """Ratios of a tensor set: against the floor (one allreduce of everything), fusion."""
    by = {r["backend"]: r for r in rows}
    floor, per = by.get("native"), by.get("native:per_tensor")
    if floor is None:
        return
    n = next(r["tensors"] for r in rows if r["backend"] != "native")
    print(f"\n# {n} tensors, {human(floor['size'])}: time against the floor (native: one "
          f"MPI_Allreduce of all of it, in the backends' chunks; native:one_call: in one call) and "
          f"against native:per_tensor ({n} bare calls)")
    for r in rows:
        if r["backend"] == "native":
            continue
        line = f"{r['backend']:<32} time / floor {r['time_us'] / floor['time_us']:6.3f}"
        if per is not None:
            line += f"   time / per-tensor native {r['time_us'] / per['time_us']:6.3f}"
        print(line)
    fused = next((r for r in rows if r["backend"].split(":")[0] == "horovod"
                  and "fusion_threshold=0" not in r["backend"]), None)
    unfused = next((r for r in rows if "fusion_threshold=0" in r["backend"]), None)
    if fused and unfused:
        print(f"\n# fusion: {fused['backend']} is {unfused['time_us'] / fused['time_us']:.2f}x "
              f"faster than {unfused['backend']}")
        if fused.get("groups"):
            print(f"# {fused['backend']}: {fused['zero_copy_groups']} of {fused['groups']} "
                  f"fused groups reduced where they lie (no fusion-buffer copies; "
                  f"--layout flat puts every tensor in one buffer)")
    print(f"\n# per-tensor engine overhead: (time - the native work it does) / {n} "
          f"(target <= 50 us; fused groups against the floor, one call per tensor against "
          f"native:per_tensor)")
    for r in rows:
        name = r["backend"]
        if name.startswith("native") or name == "gloo":
            continue
        unfused_like = name.split(":")[0] == "mpi" or "fusion_threshold=0" in name
        ref = per if unfused_like and per is not None else floor
        print(f"{name:<32} {(r['time_us'] - ref['time_us']) / n:8.1f} us")


if __name__ == "__main__":
    worker(json.loads(sys.argv[1]))
