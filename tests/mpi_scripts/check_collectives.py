"""Run on N ranks: every op x dtype x shape of a collective backend against a reference.

Usage: check_collectives.py BACKEND[:wait] [CASE ...]   (cases: values, scaling, broadcast,
fusion, flat, mismatch, inline, stall; default all but stall). Exits non-zero on the first wrong result;
reports each case and rank as a JSON line (_results.py). ``horovod:wait`` runs horovod with
cycle_time=0 and idle="wait" (a synchronous call on an idle rank cycles on its own thread).
"""

import sys
import threading
import time
import warnings

import ml_dtypes
import numpy as np
from _results import result

import ddpbench
from ddpbench.api import ReduceOp

LABEL = sys.argv[1]
BACKEND, _, VARIANT = LABEL.partition(":")
CASES = sys.argv[2:] or ["values", "scaling", "broadcast", "fusion", "flat", "mismatch",
                         "inline"]
DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.int32, np.int64]
SHAPES = [(), (1,), (2,), (17,), (2, 3, 5), (0,)]
# Tolerance per dtype for results that are not exact integers (AVERAGE): about 2 ulp.
RTOL = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 1e-6, "float64": 1e-13}

options: dict = {"cycle_time": 5.0} if BACKEND == "horovod" else {}
if VARIANT == "wait":
    options = {"cycle_time": 0.0, "idle": "wait"}
kv = ddpbench.create(BACKEND, **options)
rank, size = kv.rank, kv.num_workers
checks = 0


def inputs(shape, dtype, q, op):
    """Rank q's input: small integers, so sums, products and extremes are exact everywhere."""
    count = int(np.prod(shape))
    base = np.asarray(np.arange(count, dtype=np.int64).reshape(shape) % 5)
    if op is ReduceOp.PRODUCT:
        base = (base + q) % 3 + 1  # products stay <= 3**4 = 81
    else:
        base = base + 2 * q - 3
        if np.dtype(dtype).kind == "u":
            base = np.abs(base)
    return np.asarray(base).astype(dtype)


def reference(shape, dtype, op, pre=1.0, post=1.0):
    xs = np.stack([inputs(shape, dtype, q, op).astype(np.float64) * pre for q in range(size)])
    red = {
        ReduceOp.SUM: xs.sum(0), ReduceOp.AVERAGE: xs.sum(0), ReduceOp.MIN: xs.min(0),
        ReduceOp.MAX: xs.max(0), ReduceOp.PRODUCT: xs.prod(0),
    }[op]
    post = post / size if op is ReduceOp.AVERAGE else post
    return red * post


def check(name, got, want, dtype, exact):
    global checks
    checks += 1
    got64 = np.asarray(got).astype(np.float64)
    want = np.asarray(want)
    kind = np.dtype(dtype).kind
    if kind in "iu" and not exact:
        want = np.trunc(want)
    if exact or kind in "iu":
        ok = np.array_equal(got64, want)
    else:
        ok = np.allclose(got64, want, rtol=RTOL[np.dtype(dtype).name], atol=0)
    if not ok or got.shape != want.shape or got.dtype != np.dtype(dtype):
        raise AssertionError(
            f"rank {rank}/{size} {BACKEND} {name}: got {got!r}, expected {want!r}"
        )


def case_values():
    for dtype in DTYPES:
        for shape in SHAPES:
            for op in ReduceOp:
                x = inputs(shape, dtype, rank, op)
                name = f"v-{np.dtype(dtype).name}-{shape}-{op.value}"
                out = kv.push_pull(name, x.copy(), op=op)  # in place
                check(name, out, reference(shape, dtype, op), dtype, op is not ReduceOp.AVERAGE)
                y = np.empty_like(x)
                kv.push_pull(name + "-out", x, output=y, op=op)  # into output, input kept
                check(name + "-out", y, reference(shape, dtype, op), dtype,
                      op is not ReduceOp.AVERAGE)
                check(name + "-input-kept", x, inputs(shape, dtype, rank, op).astype(np.float64),
                      dtype, True)


def case_scaling():
    for dtype in (np.float16, ml_dtypes.bfloat16, np.float32, np.float64):
        for pre, post in ((0.5, 3.0), (0.25, 1.0), (1.0, 0.5)):
            for op in (ReduceOp.SUM, ReduceOp.AVERAGE):
                shape = (23,)
                x = inputs(shape, dtype, rank, op)
                name = f"s-{np.dtype(dtype).name}-{pre}-{post}-{op.value}"
                kv.push_pull(name, x, op=op, prescale_factor=pre, postscale_factor=post)
                # Powers of two keep SUM exact; AVERAGE divides by size (3 is not exact).
                exact = op is ReduceOp.SUM or size in (1, 2, 4)
                check(name, x, reference(shape, dtype, op, pre, post), dtype, exact)


def case_broadcast():
    for root in range(size):
        for dtype in (np.float16, np.float32, np.int64):
            t = np.full((3, 4), rank, dtype=dtype)
            kv.broadcast(f"b-{root}-{np.dtype(dtype).name}", t, root_rank=root)
            check(f"broadcast root {root}", t, np.full((3, 4), float(root)), dtype, True)
    ts = [np.full(5, rank * 10 + i, np.float32) for i in range(3)]
    kv.broadcast(["bl0", "bl1", "bl2"], ts, root_rank=size - 1)
    for i, t in enumerate(ts):
        check("broadcast list", t, np.full(5, float((size - 1) * 10 + i)), np.float32, True)


def case_fusion():
    """Tensors submitted in a different order on every rank still reduce correctly."""
    names = [f"f{i}" for i in range(24)]
    dtypes = [np.float32 if i % 3 else np.float16 for i in range(24)]
    shapes = [(i % 7 + 1, 3) for i in range(24)]
    order = names[rank:] + names[:rank]  # rotated by rank
    if rank % 2:
        order.reverse()
    if not kv.is_capable("fusion"):
        # Without negotiation calls must come in one order; a different order is reported
        # on every rank (naming both sides) instead of mixing up tensors.
        if size > 1:
            h = kv.push_pull_async(f"o-{rank}", np.ones(2, np.float32))
            expect_mismatch("order", h.wait, "Mismatched name", "rank 0 sent 'o-0'")
        order = names
    before = dict(kv.stats) if hasattr(kv, "stats") else None
    xs = {n: inputs(s, d, rank, ReduceOp.SUM) for n, s, d in zip(names, shapes, dtypes)}
    handles = {n: kv.push_pull_async(n, xs[n]) for n in order}
    for n, s, d in zip(names, shapes, dtypes):
        handles[n].wait()
        check(f"fusion {n}", xs[n], reference(s, d, ReduceOp.SUM), d, True)
    if before is not None and size > 1:
        groups = kv.stats["groups"] - before["groups"]
        tensors = kv.stats["fused_tensors"] - before["fused_tensors"]
        assert tensors == 24, (tensors, groups)
        assert groups < 24, f"no fusion happened: {groups} groups for 24 tensors"
    kv.synchronize()


def case_flat():
    """Tensors that are views of one flat buffer (as DDP's bucket views): reduced where they
    lie by a fusing backend, with the same bits as the same tensors in separate arrays."""
    shapes = [(i % 5 + 1, 4) for i in range(12)]
    counts = [int(np.prod(s)) for s in shapes]
    for dtype in (np.float32, np.float16):
        for op, pre, post, inplace in ((ReduceOp.SUM, 1.0, 1.0, True),
                                       (ReduceOp.AVERAGE, 0.5, 3.0, True),
                                       (ReduceOp.SUM, 1.0, 1.0, False),
                                       (ReduceOp.AVERAGE, 0.25, 1.0, False)):
            results = []
            for layout in ("flat", "separate"):
                src = np.empty(sum(counts), dtype)
                dst = np.empty(sum(counts), dtype)
                xs, ys, off = [], [], 0
                for s, c in zip(shapes, counts):
                    if layout == "flat":
                        x, y = src[off:off + c].reshape(s), dst[off:off + c].reshape(s)
                    else:
                        x, y = np.empty(s, dtype), np.empty(s, dtype)
                    x[...] = inputs(s, dtype, rank, op)
                    xs.append(x)
                    ys.append(x if inplace else y)
                    off += c
                before = kv.stats.get("zero_copy_groups", 0) if hasattr(kv, "stats") else 0
                tag = f"{layout}-{np.dtype(dtype).name}-{op.value}-{pre}-{post}-{inplace}"
                handles = [kv.push_pull_async(f"{tag}-{i}", x, output=y, op=op,
                                              prescale_factor=pre, postscale_factor=post)
                           for i, (x, y) in enumerate(zip(xs, ys))]
                for h in handles:
                    h.wait()
                for i, (s, y) in enumerate(zip(shapes, ys)):
                    check(f"{tag} {i}", y, reference(s, dtype, op, pre, post), dtype,
                          op is ReduceOp.SUM)
                if not inplace:
                    for i, (s, x) in enumerate(zip(shapes, xs)):
                        check(f"{tag} input {i} untouched", x, inputs(s, dtype, rank, op),
                              dtype, True)
                if hasattr(kv, "stats") and kv.is_capable("fusion") and layout == "flat":
                    assert kv.stats["zero_copy_groups"] > before, f"{tag}: copied"
                results.append([y.copy() for y in ys])
            for i, (a, b) in enumerate(zip(*results)):
                assert a.tobytes() == b.tobytes(), f"rank {rank}: flat and separate differ ({i})"
    kv.synchronize()


def expect_mismatch(name, fn, *needles):
    global checks
    try:
        fn()
    except ValueError as err:
        text = str(err)
        for needle in needles:
            if needle not in text:
                raise AssertionError(f"rank {rank}: message {text!r} lacks {needle!r}") from err
        checks += 1
        return
    raise AssertionError(f"rank {rank}: {name} did not raise")


def case_mismatch():
    if size == 1:
        return
    odd = size - 1  # the rank that disagrees
    expect_mismatch(
        "shape", lambda: kv.push_pull("m-shape", np.ones(4 + (rank == odd), np.float32)),
        "Mismatched shape", "rank 0 sent (4,)", f"rank {odd} sent (5,)",
    )
    expect_mismatch(
        "dtype",
        lambda: kv.push_pull("m-dtype", np.ones(4, np.float64 if rank == odd else np.float32)),
        "Mismatched dtype", "rank 0 sent float32", f"rank {odd} sent float64",
    )
    expect_mismatch(
        "factors",
        lambda: kv.push_pull("m-scale", np.ones(4, np.float32),
                             prescale_factor=1.0 if rank == odd else 0.5),
        "Mismatched prescale and/or postscale", "rank 0 sent prescale 0.5",
        f"rank {odd} sent prescale 1.0",
    )
    expect_mismatch(
        "op", lambda: kv.push_pull("m-op", np.ones(4, np.float32),
                                   op="max" if rank == odd else "min"),
        "Mismatched reduce op",
    )
    # The store is still usable afterwards.
    x = np.full(3, rank, np.float32)
    kv.push_pull("after", x)
    check("after mismatch", x, np.full(3, float(sum(range(size)))), np.float32, True)


def case_inline():
    """horovod:wait: a synchronous call on an idle rank cycles on the caller's thread; a list
    (which may fuse) and an asynchronous call go to the engine thread."""
    if VARIANT != "wait":
        return
    proto = kv._proto
    ran_on: list[int] = []
    execute = proto._execute

    def spy(group):
        ran_on.append(threading.get_ident())
        execute(group)

    proto._execute = spy
    me = threading.get_ident()
    x = np.full(5, rank + 1.0, np.float32)
    want = np.full(5, size * (size + 1) / 2)
    for _ in range(20):
        y = kv.push_pull("inline", x, np.empty_like(x))
        check("inline", y, want, np.float32, True)
    # The engine may hold the cycle for an idle cycle (every 10 ms) at the moment of a call:
    # that call then goes to the engine, so most (at least half here), not all, run here.
    assert sum(t == me for t in ran_on) >= 10, f"rank {rank}: {len(ran_on)} groups, " \
        f"{sum(t == me for t in ran_on)} on the caller's thread"
    ran_on.clear()
    ys = kv.push_pull(["l0", "l1"], [x, x.copy()], [np.empty_like(x), np.empty_like(x)])
    kv.push_pull_async("a0", x, np.empty_like(x)).wait()
    for y in ys:
        check("inline list", y, want, np.float32, True)
    assert ran_on and all(t != me for t in ran_on), f"rank {rank}: list ran on the caller"
    proto._execute = execute


def case_stall():
    """Rank 1 holds back a tensor longer than stall_timeout: the coordinator warns."""
    global kv
    kv.close()
    kv = ddpbench.create("horovod", **{**options, "stall_timeout": 0.5})
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        if rank == 1:
            time.sleep(2.0)
        kv.push_pull("late", np.ones(2, np.float32))


for case in CASES:
    globals()[f"case_{case}"]()
    result("case", backend=LABEL, rank=rank, size=size, case=case)
kv.close()
result("done", backend=LABEL, rank=rank, size=size, checks=checks)
