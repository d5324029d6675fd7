"""Checks of the ``collective`` backend on every rank of one MPI job.

Usage: python collective_check.py
Reports each check on rank 0 as a JSON line (_results.py); raises (ending the job non-zero) on a wrong result.
"""

from __future__ import annotations

import math

import numpy as np
from _results import result

import ddpbench
from ddpbench.api import ReduceOp
from ddpbench.backends._common import MismatchError
from ddpbench.backends.horovod import _ring_allreduce
from ddpbench.comm import engine, world
from ddpbench.rules.ring import ring_chunks


def log(check: str, **fields) -> None:
    if world().role_rank == 0:
        result(check, **fields)


def check_ops(kv) -> None:
    """Every reduce kind, as its own method and through push_pull(op=...), exact."""
    p, r = kv.num_workers, kv.rank
    ranks = np.arange(1, p + 1, dtype=np.float64)
    pattern = (np.arange(37) % 5) + 1.0
    methods = {"sum": kv.allreduce_sum, "max": kv.allreduce_max, "min": kv.allreduce_min,
               "product": kv.allreduce_prod}
    expect = {"sum": ranks.sum(), "max": ranks.max(), "min": ranks.min(),
              "product": float(math.factorial(p)), "average": ranks.mean()}
    for dtype in ("float32", "float16", "float64", "int32"):
        for op, factor in expect.items():
            if op == "average" and dtype == "int32":
                continue
            x = (pattern * (r + 1)).astype(dtype) if op != "product" else \
                np.full(37, r + 1, dtype=dtype)
            ref = pattern * factor if op != "product" else np.full(37, factor)
            outs = [kv.push_pull(f"{op}.{dtype}", x.copy(), op=op)]
            if op in methods:
                outs.append(methods[op](f"{op}.{dtype}.m", x.copy()))
            # AVERAGE divides before the sum (Paddle): exact only when 1/p is
            tol = 0.0 if op != "average" else p * np.finfo(dtype).eps * float(ref.max())
            for y in outs:
                if y.dtype != np.dtype(dtype) or not np.allclose(y.astype(np.float64), ref,
                                                                 rtol=0, atol=tol):
                    raise AssertionError(f"{op} {dtype}: got {y[:5]}, expected {ref[:5]}")
    # pre/postscale in float32 on halves: (x * 0.5) summed, * 3
    x = np.full(8, r + 1, np.float16)
    y = kv.push_pull("scaled", x, prescale_factor=0.5, postscale_factor=3.0)
    assert np.array_equal(y, np.full(8, 1.5 * ranks.sum(), np.float16)), y
    log("ops", ranks=p, ops=sorted(expect), dtypes=["float16", "float32", "float64", "int32"])


def check_average_order(kv) -> None:
    """AVERAGE scales before the sum, as Paddle does: 40000 fp16 on every rank averages to
    40000 (each rank's 40000/p is summed), where Horovod's sum-then-divide overflows."""
    p = kv.num_workers
    x = np.full(6, 40000, np.float16)
    y = kv.push_pull("order", x.copy(), op="average")
    assert np.all(np.abs(y.astype(np.float64) - 40000) <= 40000 * 2e-3), y
    after = ddpbench.create("collective", average_scaling="after_sum")
    z = after.push_pull("order", x.copy(), op="average")
    after.close()
    assert np.all(np.isinf(z)) == (p > 1), z
    log("average_order", ranks=p, before_sum=float(y[0]), after_sum=float(z[0]))


def check_bitwise_vs_horovod_ring(kv) -> None:
    """The nonblocking ring reduces in horovod's order: fp16 results equal bit for bit."""
    p, r = kv.num_workers, kv.rank
    rng = np.random.default_rng(r)
    eng = engine()
    comm = eng.call(world().role_comm.Dup).wait()
    for n in (1, p - 1, 1000, 4099):
        if n < 1:
            continue
        x = (rng.standard_normal(n) * 300).astype(np.float16)
        ours = kv.push_pull(f"bit{n}", x.copy())
        theirs = x.copy()
        eng.call(lambda b=theirs: _ring_allreduce(comm, b, ReduceOp.SUM)).wait()
        if not np.array_equal(ours.view(np.uint16), theirs.view(np.uint16)):
            raise AssertionError(f"n={n}: collective ring differs from horovod's ring")
    eng.call(comm.Free).wait()
    log("ring_order", ranks=p, dtype="float16", bit_identical_to="horovod._ring_allreduce")


def check_striping(nrings: int) -> None:
    kv = ddpbench.create("collective", nrings=nrings)
    p = kv.num_workers
    sizes = [50_000 + 1000 * i for i in range(2 * nrings + 1)]
    # two steps over the same names: a name keeps its ring (Paddle assigns rings once), so
    # with an odd number of tensors the second step does not shift them
    for _ in range(2):
        xs = [np.ones(s, np.float32) for s in sizes]
        handles = [kv.push_pull_async(f"g{i}", x, priority=-i) for i, x in enumerate(xs)]
        for h, x in zip(handles, xs):
            assert np.array_equal(h.wait(), np.full(x.size, p, np.float32))
    st = kv.stats
    for k, ring in enumerate(st["rings"]):
        names = [f"g{i}" for i in range(k, len(sizes), nrings)] * 2
        assert ring["names"] == names, (k, ring["names"], names)
        # bytes this rank sent on ring k: the ring formula over its tensors (check off)
        expect = 0
        for i in range(k, len(sizes), nrings):
            ch = ring_chunks(sizes[i], p)
            expect += sum(c for _, c in ch) * 2 * 4 if p > 1 else 0
            if p > 1:
                expect -= (ch[(kv.rank + 1) % p][1] + ch[(kv.rank + 2) % p][1]) * 4
        assert ring["bytes_sent"] == 2 * expect, (k, ring["bytes_sent"], expect)
    if p > 1 and nrings > 1:
        assert st["max_active_rings"] >= 2, f"rings never ran concurrently: {st}"
    kv.close()
    log("striping", ranks=p, nrings=nrings, tensors=[len(r["names"]) // 2 for r in st["rings"]],
        max_active_rings=st["max_active_rings"])


def check_mismatch() -> None:
    """``check_consistency=True`` (ddpbench's, off by default as in Paddle) turns a
    disagreement into the same error on every rank."""
    kv = ddpbench.create("collective", check_consistency=True)
    p, r = kv.num_workers, kv.rank
    if p == 1:
        kv.close()
        return
    x = np.zeros(4 + (r == p - 1), np.float32)
    try:
        kv.push_pull("bad", x)
    except MismatchError as err:
        assert "shape" in str(err) and f"rank {p - 1}" in str(err), err
    else:
        raise AssertionError("a shape mismatch did not raise")
    y = kv.push_pull("after", np.ones(3, np.float32))  # the store still works
    assert np.array_equal(y, np.full(3, p, np.float32))
    kv.close()
    log("mismatch", ranks=p, error="MismatchError")


def check_buckets() -> None:
    """Paddle's buckets: learnt in the first step, one fused ring sum per bucket after it,
    the same sums as unfused; incomplete buckets go at a synchronous call and at
    synchronize(); a tensor submitted twice while its bucket waits is refused."""
    from ddpbench.rules.buckets import MB

    p, r = world().num_workers, world().role_rank
    kv = ddpbench.create("collective", nrings=2, fuse_grad_size_mb=4096 / MB)
    names = ["l3.w", "l3.b", "l2.w", "l1.w", "l1.b", "l0.w"]  # [l3] [l2] [l1 l0] at 4 KiB
    sizes = [900, 124, 1500, 300, 7, 13]
    pattern = [(np.arange(s) % 7 + 1.0).astype(np.float32) for s in sizes]

    def step(op=ReduceOp.SUM, only=None):
        picked = [i for i in range(len(names)) if only is None or i in only]
        xs = {i: pattern[i] * (r + 1) for i in picked}
        hs = {i: kv.push_pull_async(names[i], xs[i], op=op) for i in picked}
        return xs, hs

    total = p * (p + 1) / 2
    for _ in range(3):
        xs, hs = step()
        for i, h in hs.items():
            h.wait()
            assert np.array_equal(xs[i], pattern[i] * total), names[i]
    xs, hs = step(ReduceOp.AVERAGE)  # divided before the sum, fused like the sums
    for i, h in hs.items():
        h.wait()
        assert np.allclose(xs[i], pattern[i] * (p + 1) / 2, rtol=1e-6)
    xs, hs = step(only={3})  # l1.w without l1.b and l0.w: synchronize() sends it alone
    kv.synchronize()
    assert np.array_equal(xs[3], pattern[3] * total)
    x = pattern[2] * (r + 1)
    kv.push_pull("l2.w", x)  # synchronous calls are never fused: on its own ring
    assert np.array_equal(x, pattern[2] * total)
    w = pattern[5] * (r + 1)
    h = kv.push_pull_async("l0.w", w)  # waits in its bucket for l1.w and l1.b ...
    x = pattern[1] * (r + 1)
    kv.push_pull("l3.b", x)  # ... until a synchronous call sends it as it is
    h.wait()
    assert np.array_equal(x, pattern[1] * total) and np.array_equal(w, pattern[5] * total)
    h = kv.push_pull_async("l1.w", pattern[3] * (r + 1))
    again = kv.push_pull_async("l1.w", pattern[3] * (r + 1))
    try:
        again.wait()
        raise AssertionError("a second l1.w while its bucket waits was accepted")
    except RuntimeError as err:
        refused = "submitted again" in str(err)
    kv.close()  # sends the first l1.w, alone
    assert h.done()
    rings = [ring["names"] for ring in kv.stats["rings"]]
    log("buckets", ranks=p, refused=refused, rings=rings)


def main() -> None:
    check_buckets()
    kv = ddpbench.create("collective")
    check_ops(kv)
    check_average_order(kv)
    check_bitwise_vs_horovod_ring(kv)
    # Paddle's default: no per-operation check, so no 16-byte allreduce per call
    assert not kv.options.check_consistency
    kv.close()
    check_mismatch()
    for nrings in (1, 3):
        check_striping(nrings)


if __name__ == "__main__":
    main()
