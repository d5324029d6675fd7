"""``ddpbench bench allreduce``: nccl-tests-style allreduce timings of the real backends.

The command launches its own ranks (``ddpbench.launch``); rank 0 of the job writes one JSON
row per (backend, size) that the parent prints as a table, CSV or JSON. Timing is OSU-style:
warm-up iterations, then per iteration a barrier, ``MPI.Wtime`` around one ``push_pull``,
and the slowest rank's time kept; the row reports the median with min and max. Every
result is checked against the closed-form reference (#wrong counts differing elements).

``--tensors resnet50`` reduces the 161 gradient tensors of ResNet-50 as one set, in
backward order, with ``mpi`` (the baseline), ``horovod`` fused and ``horovod`` unfused.
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


def _time_one(kv: Any, comm: Any, fn: Any, warmup: int, iters: int) -> list[float]:
    from mpi4py import MPI

    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        comm.Barrier()
        t0 = MPI.Wtime()
        fn()
        samples.append(MPI.Wtime() - t0)
    worst = np.array(samples)
    comm.Allreduce(MPI.IN_PLACE, worst, op=MPI.MAX)
    return worst.tolist()


def _backend_spec(spec: str) -> tuple[str, str, dict[str, Any]]:
    """``'horovod'`` or ``'horovod:fusion_threshold=0'`` -> (label, name, options)."""
    name, _, rest = spec.partition(":")
    options: dict[str, Any] = {}
    for kv in filter(None, rest.split(",")):
        key, _, value = kv.partition("=")
        options[key] = json.loads(value) if value else True
    return spec, name, options


def worker(cfg: dict[str, Any]) -> None:
    import ddpbench
    from ddpbench.comm import world

    comm = world().comm
    dtype = _np_dtype(cfg["dtype"])
    if cfg.get("device") == "gpu":
        from ddpbench import gpu

        gpu.select_device(world().local_rank)
    for label, name, options in (_backend_spec(s) for s in cfg["backends"]):
        if cfg.get("device") == "gpu":
            options = {"gpu_transport": cfg["gpu_transport"], **options}
        kv = ddpbench.create(name, **options)
        if cfg.get("tensors"):
            rows = [_tensor_set(kv, comm, label, cfg, dtype)]
        else:
            rows = [_one_size(kv, comm, label, nbytes, cfg, dtype) for nbytes in cfg["sizes"]]
        kv.close()
        if comm.rank == 0:  # rows go out as each backend finishes: a crash keeps them
            with open(cfg["out"], "a") as out:
                out.writelines(json.dumps(row) + "\n" for row in rows)


def _on_device(cfg: dict[str, Any], x: np.ndarray) -> Any:
    if cfg.get("device") != "gpu":
        return x
    from ddpbench import gpu

    return gpu.cupy_or_raise().asarray(x)


def _to_host(y: Any) -> np.ndarray:
    return y.get() if hasattr(y, "get") and not isinstance(y, np.ndarray) else y


def _one_size(kv, comm, label, nbytes, cfg, dtype) -> dict[str, Any]:
    count = max(1, nbytes // dtype.itemsize)
    x, ref = _inputs(count, comm.rank, comm.size, dtype, cfg["op"])
    x = _on_device(cfg, x)
    y = x.copy()
    name = f"ar{nbytes}"
    samples = _time_one(kv, comm, lambda: kv.push_pull(name, x, output=y, op=cfg["op"]),
                        cfg["warmup"], cfg["iters"])
    wrong = int(np.count_nonzero(_to_host(y).astype(np.float64) != ref))
    wrong = comm.allreduce(wrong)
    if comm.rank == 0:
        print(f"  {label:<28} {human(count * dtype.itemsize):>9}  done", file=sys.stderr,
              flush=True)
    return _row(label, count * dtype.itemsize, count, cfg, samples, wrong, comm.size)


def _tensor_set(kv, comm, label, cfg, dtype) -> dict[str, Any]:
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

    def one_set() -> None:
        handles = [kv.push_pull_async(i, xs[i], output=ys[i], op=cfg["op"], priority=-i)
                   for i in order]
        for h in handles:
            h.wait()

    samples = _time_one(kv, comm, one_set, cfg["warmup"], cfg["iters"])
    wrong = sum(int(np.count_nonzero(_to_host(y).astype(np.float64) != r))
                for y, r in zip(ys, refs))
    wrong = comm.allreduce(wrong)
    total = sum(counts)
    if comm.rank == 0:
        print(f"  {label:<28} {cfg['tensors']} set done", file=sys.stderr, flush=True)
    row = _row(label, total * dtype.itemsize, total, cfg, samples, wrong, comm.size)
    row["tensors"] = len(counts)
    return row


def _row(label, nbytes, count, cfg, samples, wrong, n) -> dict[str, Any]:
    med = float(np.median(samples))
    algbw = nbytes / med / 1e9 if med > 0 else float("inf")
    return {
        "backend": label, "ranks": n, "size": nbytes, "count": count, "type": cfg["dtype"],
        "device": cfg.get("device", "cpu"), "redop": cfg["op"], "time_us": med * 1e6, "min_us": min(samples) * 1e6,
        "max_us": max(samples) * 1e6, "algbw": algbw, "busbw": algbw * 2 * (n - 1) / n,
        "wrong": wrong, "samples_us": [s * 1e6 for s in samples],
    }


# -- parent side ------------------------------------------------------------------------------
def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backends", default="mpi,horovod",
                        help="comma-separated; options as name:key=value (default mpi,horovod)")
    parser.add_argument("-n", "--ranks", type=int, default=2, help="ranks to launch (default 2)")
    parser.add_argument("--sizes", default="1K:64M",
                        help="a range LO:HI (x --factor each step) or a list, e.g. 4K,1M")
    parser.add_argument("--factor", type=int, default=2, help="size step of a range (default 2)")
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument("--op", default="sum", choices=OPS)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--tensors", default=None, choices=["resnet50", "vgg19"],
                        help="reduce a model's gradient tensors as one set instead of --sizes")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="with --tensors: scale every tensor's size by this factor")
    parser.add_argument("--device", default="cpu", choices=["cpu", "gpu"],
                        help="where the tensors live (gpu: CuPy arrays, one GPU per local rank)")
    parser.add_argument("--gpu-transport", default="nccl", choices=["nccl", "host"],
                        help="with --device gpu: NCCL (one rank per GPU) or pinned-host staging")
    parser.add_argument("--format", default="table", choices=["table", "csv", "json"])
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="kill the benchmark job after this many seconds")


def main(args: argparse.Namespace) -> int:
    from ddpbench.cli import UsageError
    from ddpbench.launch import launch

    try:
        sizes = parse_sizes(args.sizes, args.factor)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if args.ranks < 1 or args.warmup < 0 or args.iters < 1:
        raise UsageError("need --ranks >= 1, --warmup >= 0 and --iters >= 1")
    if args.device == "gpu":
        from ddpbench import gpu

        if not gpu.is_available():
            raise UsageError(f"--device gpu needs CuPy and a CUDA device ({gpu.INSTALL_HINT})")
    backends = [b for b in args.backends.split(",") if b]
    if args.tensors and args.backends == "mpi,horovod":
        backends = ["mpi", "horovod", "horovod:fusion_threshold=0"]
    import ddpbench

    for spec in backends:
        name = spec.partition(":")[0]
        try:
            ddpbench.api.backend_class(name)
        except ValueError as err:
            raise UsageError(str(err)) from None
    with tempfile.TemporaryDirectory(prefix="ddpbench-bench-") as tmp:
        out = Path(tmp) / "rows.jsonl"
        cfg = {
            "backends": backends, "sizes": sizes, "dtype": args.dtype, "op": args.op,
            "warmup": args.warmup, "iters": args.iters, "tensors": args.tensors,
            "scale": args.scale, "out": str(out), "device": args.device,
            "gpu_transport": args.gpu_transport,
        }
        print(f"# ddpbench bench allreduce: {args.ranks} ranks, {', '.join(backends)}",
              file=sys.stderr, flush=True)
        rc = launch([sys.executable, "-m", "ddpbench.benchmarks.allreduce", json.dumps(cfg)],
                    args.ranks, timeout=args.timeout)
        rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    if rc != 0:
        print(f"ddpbench bench allreduce: the benchmark job failed (exit {rc})", file=sys.stderr)
        return 1
    _print(rows, args.format, baseline=backends[0])
    return 1 if any(r["wrong"] for r in rows) else 0


def _print(rows: list[dict[str, Any]], fmt: str, baseline: str) -> None:
    if fmt == "json":
        print(json.dumps(rows, indent=1))
        return
    cols = ["backend", "ranks", "size", "count", "type", "redop", "time_us", "min_us",
            "max_us", "algbw", "busbw", "wrong"]
    if fmt == "csv":
        print(",".join(cols))
        for r in rows:
            print(",".join(str(r[c]) for c in cols))
        return
    head = (f"{'backend':<28} {'n':>2} {'size':>9} {'count':>10} {'type':>8} {'redop':>7} "
            f"{'time_us':>10} {'min_us':>10} {'max_us':>10} {'algbw':>7} {'busbw':>7} "
            f"{'#wrong':>6}")
    print(head)
    print("#" + " " * 79 + "(GB/s)  (GB/s)")
    for r in rows:
        print(f"{r['backend']:<28} {r['ranks']:>2} {human(r['size']):>9} {r['count']:>10} "
              f"{r['type']:>8} {r['redop']:>7} {r['time_us']:>10.1f} {r['min_us']:>10.1f} "
              f"{r['max_us']:>10.1f} {r['algbw']:>7.3f} {r['busbw']:>7.3f} {r['wrong']:>6}")
    base = {r["size"]: r for r in rows if r["backend"] == baseline}
    ratios = [(r, base[r["size"]]) for r in rows
              if r["backend"] != baseline and r["size"] in base]
    if ratios:
        print(f"\n# ratios against {baseline} measured in the same run "
              f"(busbw ratio > 1 and time ratio < 1 mean faster than {baseline})")
        for r, b in ratios:
            print(f"{r['backend']:<28} {human(r['size']):>9}  busbw ratio "
                  f"{r['busbw'] / b['busbw']:6.3f}   time ratio {r['time_us'] / b['time_us']:6.3f}")
    tens = [r for r in rows if "tensors" in r]
    fused = next((r for r in tens if r["backend"] == "horovod"), None)
    unfused = next((r for r in tens if "fusion_threshold=0" in r["backend"]), None)
    if fused and unfused:
        print(f"\n# fusion: horovod fused is {unfused['time_us'] / fused['time_us']:.2f}x faster "
              f"than unfused on the {fused['tensors']}-tensor set")


if __name__ == "__main__":
    worker(json.loads(sys.argv[1]))
