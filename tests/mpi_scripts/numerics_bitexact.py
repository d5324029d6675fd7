"""Check ddpbench.numerics.ring_allreduce against the real ``horovod`` backend, bit for bit.

Every rank draws the same (p x n) data from one seeded generator, pushes its own row
through ``kv.push_pull`` and compares what it gets back with the emulator run on the whole
matrix. Prints one line per case; exits 1 on the first mismatch (naming the case, the first
differing element and both bit patterns).

Usage: mpiexec -n P python numerics_bitexact.py [--sizes 1,2,7,...]
"""

from __future__ import annotations

import argparse
import math
import sys

import ml_dtypes
import numpy as np
from _results import result

import ddpbench
from ddpbench import numerics

DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}


def data(p: int, n: int, dtype: np.dtype, seed: int) -> np.ndarray:
    """Return the (p, n) test matrix: magnitudes from 1e-6 to 3e4 so sums round,
    subnormals appear and fp16 partial sums can overflow."""
    rng = np.random.default_rng([seed, p, n])
    mags = rng.choice([1e-6, 1e-3, 1.0, 3.0, 1e3, 3e4], size=(p, n), p=[.1, .15, .35, .2, .15, .05])
    return (rng.standard_normal((p, n)) * mags).astype(dtype)


def bits(a: np.ndarray) -> np.ndarray:
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.itemsize])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="")
    args = parser.parse_args()
    # The emulator models the ring (the simulator's and the point-to-point data path);
    # the default algorithm=mpi reduces in the MPI library's own order.
    kv = ddpbench.create("horovod", fusion_threshold=0, algorithm="ring")
    p, rank = kv.num_workers, kv.rank
    sizes = [int(s) for s in args.sizes.split(",") if s] or sorted(
        {1, 2, max(1, p - 1), p, p + 1, 7, 1000, 4099})
    cases = [("sum", 1.0, 1.0), ("average", 1.0, 1.0), ("sum", 1 / 3, 3.0),
             ("average", 1 / p, float(p)), ("average", 1 / math.sqrt(p), math.sqrt(p)),
             ("average", 0.125, 8.0), ("sum", 1024.0, 1 / 1024)]
    checked = nonfinite = 0
    seed = 0
    for dname, dt in DTYPES.items():
        for n in sizes:
            for op, pre, post in cases:
                seed += 1
                x = data(p, n, np.dtype(dt), seed)
                mine = x[rank].copy()
                with np.errstate(all="ignore"):  # fp16 overflow is part of what is checked
                    got = kv.push_pull(f"{dname}-{n}-{seed}", mine, op=op,
                                       prescale_factor=pre, postscale_factor=post)
                    want = numerics.ring_allreduce(x, op, prescale_factor=pre,
                                                   postscale_factor=post)
                got = np.asarray(got).reshape(-1)
                diff = np.flatnonzero(bits(got) != bits(want))
                if got.dtype != want.dtype or diff.size:
                    i = int(diff[0]) if diff.size else 0
                    result("mismatch", rank=rank, dtype=dname, n=n, op=str(op), pre=pre,
                           post=post, differ=int(diff.size), first=i,
                           backend=f"{got[i]!r} (0x{int(bits(got)[i]):x}) {got.dtype}",
                           emulator=f"{want[i]!r} (0x{int(bits(want)[i]):x}) {want.dtype}")
                    return 1
                checked += 1
                nonfinite += int(np.count_nonzero(~np.isfinite(want.astype(np.float64))))
    kv.close()
    if rank == 0:
        result("bit_exact", cases=checked, ranks=p, dtypes=["float16", "bfloat16", "float32"],
               sizes=list(sizes), nonfinite=nonfinite)
    return 0


if __name__ == "__main__":
    sys.exit(main())
