"""The one ring driver (ddpbench.rules.ring) through both backends that run it, on every rank.

Usage: python ring_driver_check.py
``horovod`` (``algorithm="ring"``, unfused: blocking ``Sendrecv``) and ``collective`` (one
ring: ``Isend``/``Irecv`` polled by the engine) reduce the same tensors: each result equals
:func:`ddpbench.numerics.ring_allreduce` bit for bit (fp16, where the order shows) and the
exact sum (small integers in fp32), and each backend's ``bytes_sent`` counter grows by what
:func:`ddpbench.rules.ring.bytes_per_rank` gives this rank. Reports one JSON line per rank
and backend (_results.py); raises (ending the job non-zero) on a wrong result.
"""

from __future__ import annotations

import numpy as np
from _results import result

import ddpbench
from ddpbench import numerics
from ddpbench.rules.ring import bytes_per_rank


def inputs(rank: int, n: int, dtype: str) -> np.ndarray:
    """Rank ``rank``'s tensor of ``n`` elements: every rank can make every rank's."""
    rng = np.random.default_rng([rank, n])
    if dtype == "float16":
        return (rng.standard_normal(n) * 300).astype(np.float16)
    return rng.integers(-1000, 1000, n).astype(np.float32)


def sent(kv, backend: str) -> int:
    st = kv.stats
    return st["bytes_sent"] if backend == "horovod" else sum(r["bytes_sent"] for r in st["rings"])


def check(backend: str, opts: dict) -> None:
    kv = ddpbench.create(backend, **opts)
    p, r = kv.num_workers, kv.rank
    sizes = sorted({1, max(p - 1, 1), 1000, 4099})
    expect_bytes = 0
    before = sent(kv, backend)
    for dtype in ("float16", "float32"):
        for n in sizes:
            xs = np.stack([inputs(k, n, dtype) for k in range(p)])
            got = kv.push_pull(f"{dtype}.{n}", xs[r].copy())
            if dtype == "float16":
                want = numerics.ring_allreduce(xs, "sum", threads=1)
                same = np.array_equal(got.view(np.uint16), want.view(np.uint16))
            else:
                want = xs.astype(np.float64).sum(axis=0).astype(np.float32)
                same = np.array_equal(got, want)
            if not same:
                raise AssertionError(f"{backend} {dtype} n={n} rank {r}: {got[:4]} != {want[:4]}")
            expect_bytes += int(bytes_per_rank(n, p, xs.itemsize)[r])
    counted = sent(kv, backend) - before
    if counted != expect_bytes:
        raise AssertionError(f"{backend} rank {r}: bytes_sent {counted}, ring rule {expect_bytes}")
    kv.close()
    result("ring_driver", backend=backend, ranks=p, rank=r, bytes_sent=counted,
           tensors=2 * len(sizes))


def main() -> None:
    check("horovod", {"algorithm": "ring", "fusion_threshold": 0})
    check("collective", {"nrings": 1})


if __name__ == "__main__":
    main()
