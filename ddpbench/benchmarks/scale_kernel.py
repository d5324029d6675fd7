"""``ddpbench bench scale-kernel``: the fused scale+copy kernel against a plain GPU copy.

Three ways to move ``n`` bytes into a fusion buffer with a prescale, timed with CUDA events
on one GPU (the median of ``--iters``):

- ``copy``: a plain device-to-device memcpy of the same bytes (no scaling): the ceiling;
- ``fused``: one kernel that reads, multiplies in float32 and writes (what ``horovod`` does);
- ``separate``: the copy, then an in-place scale (two passes over the buffer).

Bandwidth counts bytes read plus bytes written. The fused result is checked bit for bit
against the CPU path (:func:`ddpbench.tensor_ops.scale_`).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

HELP = "time the fused GPU scale+copy kernel against a plain copy and a separate scale"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default="1M:256M", help="byte sizes, e.g. 1M:256M or 4M,64M")
    parser.add_argument("--factor", type=int, default=4, help="size step of a range (default 4)")
    parser.add_argument("--dtype", default="float16", choices=["float16", "float32", "float64"])
    parser.add_argument("--scale", type=float, default=0.125, help="the prescale factor")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--format", default="table", choices=["table", "json"])


def _time(cupy: Any, fn: Any, iters: int) -> float:
    fn()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    samples = []
    for _ in range(iters):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        samples.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    return float(np.median(samples))


def _measure(cupy: Any, gpu: Any, src: Any, dst: Any, scale: float, iters: int) -> dict:
    """Median seconds of the three ways to fill ``dst`` from ``src``."""
    nb = src.nbytes

    def copy() -> None:
        dst.data.copy_from_device(src.data, nb)

    def fused() -> None:
        gpu.scale_copy(src, dst, scale)

    def separate() -> None:
        dst.data.copy_from_device(src.data, nb)
        gpu.scale_(dst, scale)

    return {k: _time(cupy, f, iters) for k, f in
            (("copy", copy), ("fused", fused), ("separate", separate))}


def main(args: argparse.Namespace) -> int:
    from ddpbench import gpu
    from ddpbench.benchmarks.allreduce import human, parse_sizes
    from ddpbench.cli import UsageError
    from ddpbench.tensor_ops import scale_

    try:
        sizes = parse_sizes(args.sizes, args.factor)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if not gpu.is_available():
        raise UsageError(f"no usable GPU: this benchmark needs CuPy and a CUDA device "
                         f"({gpu.INSTALL_HINT})")
    cupy = gpu.cupy_or_raise()
    dtype = np.dtype(args.dtype)
    rows = []
    dev = cupy.cuda.Device()
    name = cupy.cuda.runtime.getDeviceProperties(dev.id)["name"].decode()
    for nbytes in sizes:
        n = max(1, nbytes // dtype.itemsize)
        host = (np.random.default_rng(0).standard_normal(n) * 100).astype(dtype)
        src = cupy.asarray(host)
        dst = cupy.empty_like(src)
        t = _measure(cupy, gpu, src, dst, args.scale, args.iters)
        nb = src.nbytes
        gpu.scale_copy(src, dst, args.scale)
        want = host.copy()
        scale_(want, args.scale)
        wrong = int(np.count_nonzero(cupy.asnumpy(dst).view(np.uint8) != want.view(np.uint8)))
        bw = {k: 2 * nb / v / 1e9 for k, v in t.items()}
        rows.append({
            "device": name, "size": nb, "dtype": args.dtype,
            **{f"{k}_us": v * 1e6 for k, v in t.items()},
            **{f"{k}_GBps": v for k, v in bw.items()},
            "fused_vs_copy": bw["fused"] / bw["copy"],
            "fused_speedup_vs_separate": t["separate"] / t["fused"], "wrong_bytes": wrong,
        })
    if args.format == "json":
        print(json.dumps(rows, indent=1))
    else:
        print(f"# {name}; bandwidth = (bytes read + bytes written) / time; median of "
              f"{args.iters}")
        print(f"{'size':>9} {'type':>8} {'copy GB/s':>10} {'fused GB/s':>11} "
              f"{'separate GB/s':>14} {'fused/copy':>11} {'fused speedup':>14} {'#wrong':>7}")
        for r in rows:
            print(f"{human(r['size']):>9} {r['dtype']:>8} {r['copy_GBps']:>10.1f} "
                  f"{r['fused_GBps']:>11.1f} {r['separate_GBps']:>14.1f} "
                  f"{r['fused_vs_copy']:>11.3f} {r['fused_speedup_vs_separate']:>13.2f}x "
                  f"{r['wrong_bytes']:>7}")
    sys.stdout.flush()
    return 1 if any(r["wrong_bytes"] for r in rows) else 0
