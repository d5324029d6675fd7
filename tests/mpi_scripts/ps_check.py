"""Checks of the parameter-server backends, run on every rank of one launch.

Usage: ps_check.py CASE [ARG]; cases below. Every assertion failure ends the job (the abort
hooks of ddpbench.comm); rank 0 reports each check that passed as a JSON line.
"""

from __future__ import annotations

import itertools
import os
import signal
import sys
import time

import numpy as np
from _results import result

import ddpbench
from ddpbench.comm import world


def say(kv, check, **fields):
    if kv.rank == 0:
        result(check, **fields)


def pattern(n, dtype):
    return ((np.arange(n) % 7) + 1).astype(dtype)


def check_sums(kv, keys, tag):
    """push_pull of rank-dependent tensors sums exactly, single names and lists."""
    w, r = kv.num_workers, kv.rank
    tri = w * (w + 1) // 2
    for key, n, dtype in keys:
        x = pattern(n, dtype) * dtype(r + 1)
        out = kv.push_pull(key, x.copy())
        ref = pattern(n, np.float64) * tri
        assert np.array_equal(out.astype(np.float64), ref), (tag, key, out[:5], ref[:5])
    names = [k for k, _, _ in keys]
    xs = [pattern(n, dt) * (r + 1) for _, n, dt in keys]
    outs = kv.push_pull(names, [x.astype(dt) for x, (_, _, dt) in zip(xs, keys)])
    for out, (_, n, _) in zip(outs, keys):
        assert np.array_equal(out.astype(np.float64), pattern(n, np.float64) * tri)
    # twice more, async and in reverse order: rounds of the same keys follow each other
    for _ in range(2):
        hs = [kv.push_pull_async(k, pattern(n, dt) * dt(r + 1), priority=-j)
              for j, (k, n, dt) in enumerate(keys)]
        for h, (_, n, dt) in zip(hs, keys):
            assert np.array_equal(h.wait(), pattern(n, dt) * dt(tri))
    k0, n0, dt0 = keys[0]
    avg = kv.push_pull(k0, pattern(n0, dt0) * dt0(r + 1), op="average")
    assert np.array_equal(avg, (pattern(n0, np.float64) * (w + 1) / 2).astype(dt0))
    say(kv, "sums", tag=tag, workers=w, names=len(keys))


def check_broadcast(kv, names, tag):
    w, r = kv.num_workers, kv.rank
    for root in range(w):
        xs = [np.full(n, 100 * r + j, dt) for j, (_, n, dt) in enumerate(names)]
        kv.broadcast([k for k, _, _ in names], xs, root_rank=root)
        for j, x in enumerate(xs):
            assert np.all(x == 100 * root + j), (tag, root, x[:3])
    say(kv, "broadcast", tag=tag, roots=w)


def sends(kv, kind="push"):
    return [rec for rec in kv.trace_records if rec.kind == kind]


def case_kvstore(bound):
    """2 workers, 2 servers, int keys: sums, broadcast, split big arrays, server optimizer."""
    from ddpbench import SGD

    kv = ddpbench.create("kvstore", bigarray_bound=bound, trace=True)
    assert kv.is_capable("optimizer")
    w, r, s = kv.num_workers, kv.rank, kv.num_servers
    keys = [(3, 10, np.float32), (8, 3 * bound + 1, np.float32), (5, 7, np.int32),
            (6, 40, np.float16), (4, bound - 1, np.float64)]
    check_sums(kv, keys, "kvstore")
    check_broadcast(kv, [(3, 10, np.float32), (8, 3 * bound + 1, np.float32)], "kvstore")
    # placement: small keys whole on (key*9973) % S, big ones split over all servers
    recs = sends(kv)
    for key, n, _ in keys:
        got = sorted((rec.part, rec.dst, rec.bytes) for rec in recs if rec.key == key)
        item = np.dtype(np.float32).itemsize
        if n < bound:
            assert {d for _, d, _ in got} == {f"server{(key * 9973) % s}"}, (key, got)
        else:
            shares = [len(a) for a in np.array_split(np.arange(n), s)]
            want = {(i, f"server{i}", shares[i] * item) for i in range(s)}
            assert set(got) == want, (key, got, want)
    say(kv, "kvstore_placement", servers=s, keys=len(keys))
    # server-side SGD: closed form without momentum (exact in binary fractions)
    n_small, n_big, k = 10, 2 * bound + 3, 4
    w0 = {100: np.arange(n_small, dtype=np.float64), 101: np.arange(n_big, dtype=np.float64)}
    kv.broadcast(list(w0), [v.copy() for v in w0.values()])
    kv.set_optimizer(SGD(lr=0.5, rescale_grad=0.25))
    for t in range(1, k + 1):
        for key, v in w0.items():
            out = kv.push_pull(key, np.full(v.size, t * (r + 1.0)))
    tri = w * (w + 1) / 2
    for key, v in w0.items():
        out = kv.push_pull(key, np.zeros(v.size))
        ref = v - 0.5 * 0.25 * tri * k * (k + 1) / 2
        assert np.array_equal(out, ref), (key, out[:3], ref[:3])
    # momentum and weight decay: against an fp64 reference of MXNet's update
    opt = {"lr": 0.1, "momentum": 0.9, "wd": 0.01, "rescale_grad": 0.5}
    kv.set_optimizer(opt)
    kv.broadcast(list(w0), [v.copy() for v in w0.values()])
    for key, v in w0.items():
        ref, mom = v.copy(), np.zeros_like(v)
        for t in range(1, k + 1):
            g = 0.5 * (t * tri + np.sin(np.arange(v.size)) * w) + 0.01 * ref
            mom = 0.9 * mom - 0.1 * g
            ref = ref + mom
            out = kv.push_pull(key, t * (r + 1.0) + np.sin(np.arange(v.size)))
        np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)
    say(kv, "kvstore_server_sgd", steps=k, momentum=0.9, wd=0.01)
    try:
        kv.set_optimizer(lambda w, g: w)
    except TypeError as err:
        assert "SGD" in str(err)
    kv.close()
    say(kv, "closed", tag="kvstore")


_LEAD = {"sockets_16k": 4, "sockets_nobuf": 3}


def _expected_lows(variant, position):
    """The ten low slices' send order. P3's sockets with the kernel buffer (default, 4 MiB)
    take all ten as they come, like the FIFO variants. With a smaller buffer the thread
    blocks: 16 KiB (each 80 kB slice enters the kernel alone): 0 leaves, 1 waits in
    ZeroMQ's engine, 2 in the pipe, 3 in the thread; no buffer: 0 on the wire, 1 in the
    socket, 2 in the thread. The rest tie in the thread's heap and come out in heap order
    (rules.sockets.StlHeap, checked against libstdc++ in tests/unit/test_p3_ties.py); the
    high slice joins above them after ``position - lead`` were popped (none while slice 0
    is on the wire; more on a loaded machine) and pops next."""
    lead = _LEAD.get(variant)
    if lead is None:
        return list(range(10))
    from ddpbench.rules.sockets import StlHeap

    heap = StlHeap()
    for i in range(lead, 10):
        heap.push((5, i, i))
    before = [heap.pop()[-1] for _ in range(max(position - lead, 0))]
    heap.push((0, 10, "high"))
    assert heap.pop()[-1] == "high"
    return list(range(lead)) + before + [heap.pop()[-1] for _ in range(10 - lead - len(before))]


def case_p3_dedicated():
    """2 workers, 1 server: str keys, broadcast, the send order of P3's sockets (argv[2] =
    "sockets"), of the water-mark variant ("water_mark") or without priorities ("fifo"),
    and pacing."""
    ddpbench.init()  # on the server rank: serves, then exits
    variant = sys.argv[2]
    knobs = {"water_mark": {"water_mark": 1}, "fifo": {"priority": False},
             "sockets_16k": {"sndbuf_bytes": 16384},
             "sockets_nobuf": {"sndbuf_bytes": 0, "server_sockets": "host"}}.get(variant, {})
    kv = ddpbench.create("p3", slice_params=20_000, bandwidth_gbps=0.1, trace=True, **knobs)
    try:
        kv.set_optimizer(lambda w, g: w)
    except TypeError as err:
        assert "SGD" in str(err)
    else:
        raise AssertionError("p3 accepted code as an optimizer")
    keys = [("conv1.weight", 45_000, np.float32), ("conv1.bias", 64, np.float32),
            ("fc.weight", 20_001, np.float64)]
    check_sums(kv, keys, "p3")
    check_broadcast(kv, [("conv1.weight", 45_000, np.float32), ("fc.weight", 20_001, np.float64)],
                    "p3")
    # ten low-priority slices, then one high-priority slice queued while the first is on
    # the wire. P3's sockets (hwm 1) with Linux's 4 MiB kernel buffer take all ten as they
    # come (position 10); with 16 KiB, three are held in the socket, its engine and the
    # thread (position 4); without a buffer, one in the socket and one in the thread
    # (position 3). Water mark 1: it goes next (position 1). priority=False (the paper's
    # slicing-only ablation): FIFO, after all ten (position 10).
    before = len(sends(kv))
    low = kv.push_pull_async("low", np.ones(200_000, np.float32), priority=-5)
    while len(sends(kv)) == before:  # the first low slice is on the wire
        time.sleep(1e-4)
    high = kv.push_pull_async("high", np.ones(100, np.float32), priority=0)
    low.wait(), high.wait()
    order = [(rec.key, rec.part) for rec in sends(kv)[before:]]
    key_high = kv._keys["high"]
    pos = order.index((key_high, 0))
    lows = [p for k, p in order if k != key_high]
    assert lows == _expected_lows(variant, pos), order
    say(kv, "p3_send_order", variant=variant, position=pos, slices=len(order))
    # server-side optimizer (P3's ApplyUpdates): the reply is the updated weights
    w0 = np.arange(30, dtype=np.float64)
    kv.broadcast("w", w0.copy())
    kv.set_optimizer(ddpbench.SGD(lr=0.5, rescale_grad=0.25))
    out = kv.push_pull("w", np.full(30, kv.rank + 1.0))
    assert np.array_equal(out, w0 - 0.5 * 0.25 * 3.0), out[:3]  # 2 workers: 1 + 2
    kv.set_optimizer(None)
    say(kv, "p3_server_sgd", workers=kv.num_workers)
    # pacing: each send holds the uplink for bytes / bandwidth
    recs = sends(kv)[before:]
    for a, b in zip(recs, recs[1:]):
        assert b.start >= a.end - 1e-9, (a, b)
        assert abs((a.end - a.start) - a.bytes / (0.1e9 / 8)) < 1e-9
    say(kv, "p3_paced", sends=len(recs))
    kv.close()


def check_sum_order(n, r):
    """Servers add pushes as they arrive (MXNet, BytePS); sum_order="rank" by worker rank.
    BytePS's average divides the sum on the worker (true division, not * 1/n)."""
    xs = [np.random.default_rng(q).standard_normal(3000).astype(np.float32) for q in range(n)]
    orders = list(itertools.permutations(range(n)))

    def ordered(order):
        acc = xs[order[0]].copy()
        for q in order[1:]:
            acc = acc + xs[q]
        return acc

    ranked = ordered(range(n))
    for order_knob in ("rank", "arrival"):
        bp = ddpbench.create("byteps", partition_bytes=4000, sum_order=order_knob)
        kv = ddpbench.create("kvstore", servers="colocated", bigarray_bound=1000,
                             sum_order=order_knob)
        got = bp.push_pull("avg", xs[r].copy(), average=True)
        total = kv.push_pull("sum", xs[r].copy())
        parts = [p for p in kv.placement("sum")]
        bp.close(), kv.close()
        want_avg = np.divide(ranked, np.float32(n))
        if order_knob == "rank":
            assert np.array_equal(got, want_avg), (got[:3], want_avg[:3])
            assert np.array_equal(total, ranked)
        for p in parts:  # each part's sum is one arrival order's, whole
            span = slice(p.offset, p.offset + p.count)
            assert any(np.array_equal(total[span], ordered(o)[span]) for o in orders), p
    if n == 3:  # the worker's division is not a multiply by 1/3 (it rounds otherwise)
        assert np.count_nonzero(np.divide(ranked, np.float32(3)) != ranked * np.float32(1 / 3))
    if r == 0:
        result("sum_order", workers=n)


def case_colocated():
    """3 workers, servers in the worker processes: byteps FIFO/credit, p3 placement, kvstore."""
    w = world()
    r, n = w.role_rank, w.num_workers
    bp = ddpbench.create("byteps", partition_bytes=4000, trace=True)
    assert bp.num_servers == n
    check_sums(bp, [(0, 2500, np.float32), (1, 999, np.float64), (2, 33, np.int64)], "byteps")
    x = pattern(2500, np.float64) * (r + 1)
    out = bp.push_pull(0, x.astype(np.float32), average=True)
    assert np.array_equal(out, (pattern(2500, np.float64) * (n + 1) / 2).astype(np.float32))
    say(bp, "byteps_average", workers=n)
    bp.close()
    check_sum_order(n, r)
    bp = ddpbench.create("byteps", partition_bytes=4000, trace=True)
    bp.declare(range(9))  # int names 0..8 as declared keys 0..8
    # credit 0: FIFO whatever the priorities
    before = len(sends(bp))
    hs = [bp.push_pull_async(k, np.ones(2500, np.float32), priority=k) for k in range(3, 9)]
    [h.wait() for h in hs]
    order = [rec.key for rec in sends(bp)[before:]]
    assert order == sorted(order), order
    say(bp, "byteps_fifo", credit_bytes=0, order=order)
    # placement: partition i of the d-th declared tensor on djb2((d << 16) + i) % S
    def djb2(key):
        h = 5381
        for c in str(key):
            h = (h * 33 + ord(c)) % 2**64
        return h

    for rec in sends(bp):
        assert rec.dst == f"worker{djb2((rec.key << 16) + rec.part) % n}", rec
    say(bp, "byteps_placement", servers=n)
    bp.close()
    # p3: P3's placement (kvstore_dist.h): under slice_params whole on (key * 9973) % S,
    # else slice i on server i % S, restarting for every key; local slices cost no message
    p3 = ddpbench.create("p3", slice_params=1000, trace=True)
    sizes = [("a", 2500), ("b", 10), ("c", 4001)]
    for name, size in sizes:
        p3.push_pull(name, np.full(size, r + 1.0, np.float32))
    placed = []  # (key, part, server, elements)
    for key, (_, size) in enumerate(sizes):
        if size < 1000:
            placed.append((key, 0, key * 9973 % n, size))
        else:
            placed += [(key, i, i % n, min(1000, size - lo))
                       for i, lo in enumerate(range(0, size, 1000))]
    want = [(k, i, f"worker{srv}", cnt * 4) for k, i, srv, cnt in placed if srv != r]
    got = [(rec.key, rec.part, rec.dst, rec.bytes) for rec in sends(p3)]
    assert got == want, (got, want)
    pulls = sum(rec.bytes for rec in sends(p3, "pull"))
    sent = sum(rec.bytes for rec in p3.trace_records)
    assert sent == p3.bytes_sent
    # each host sends the others the sums of the slices it serves
    assert pulls == 4 * sum(cnt for _, _, srv, cnt in placed if srv == r) * (n - 1)
    say(p3, "p3_placement", servers=n, sends=len(got))
    p3.close()
    kv = ddpbench.create("kvstore", servers="colocated", bigarray_bound=100)
    check_sums(kv, [("x", 50, np.float32), ("y", 301, np.float32)], "kvstore colocated")
    check_broadcast(kv, [("x", 50, np.float32), ("y", 301, np.float32)], "kvstore colocated")
    kv.close()
    bc = ddpbench.create("byteps", partition_bytes=400, scheduler="window", credit_bytes=800,
                         bandwidth_gbps=0.2)
    check_sums(bc, [(0, 1000, np.float32), (1, 77, np.float32)], "byteps credit")
    bc.close()
    # ByteScheduler's credit loop over BytePS (100 parameters = one partition in flight) and
    # the merged variant: the same sums
    bs = ddpbench.create("byteps", partition_bytes=400, scheduler="credit",
                         credit_params=100, bandwidth_gbps=0.2)
    check_sums(bs, [(0, 1000, np.float32), (1, 77, np.float32)], "credit scheduler")
    bs.close()
    bm = ddpbench.create("byteps", partition_bytes=400, merged_push_pull=True)
    check_sums(bm, [(0, 1000, np.float32), (1, 77, np.float32)], "byteps merged")
    bm.close()


def case_bytescheduler():
    """ByteScheduler over MXNet's kvstore at any world size: rank 0 starts the partitions
    (300 elements, 600 of credit: two in flight), the others wait at the barrier keys; sums
    exact, whatever order each rank posts its arrays in (rank 0 one way, the others the
    other), with and without the servers' optimizer."""
    kv = ddpbench.create("kvstore", scheduler="bytescheduler", partition_params=300,
                         credit_params=600, bigarray_bound=500, bandwidth_gbps=0.2)
    keys = [("a", 1000, np.float32), ("b", 77, np.float32), ("c", 2501, np.float32)]
    check_sums(kv, keys, "bytescheduler")
    w, r = kv.num_workers, kv.rank
    tri = w * (w + 1) // 2
    mine = keys if r == 0 else keys[::-1]
    for _ in range(3):
        hs = [(kv.push_pull_async(k, pattern(n, dt) * dt(r + 1), priority=-j), n, dt)
              for j, (k, n, dt) in enumerate(mine)]
        for h, n, dt in hs:
            assert np.array_equal(h.wait(), pattern(n, dt) * dt(tri))
    # the servers' SGD (MXNet's: rescale_grad on the summed gradient) under ByteScheduler
    w0 = np.full(1000, 1.0, np.float32)
    kv.broadcast("w", w0.copy())
    kv.set_optimizer(ddpbench.SGD(lr=0.5, rescale_grad=1.0 / w))
    out = kv.push_pull("w", np.full(1000, r + 1.0, np.float32))
    assert np.allclose(out, 1.0 - 0.5 * tri / w), out[:3]
    kv.set_optimizer(None)
    say(kv, "bytescheduler", workers=w)
    kv.close()


def case_die():
    """Worker 1 dies mid-run (SIGKILL, or an exception); the job must end, not hang."""
    how = sys.argv[2]
    kv = ddpbench.create("p3", slice_params=100)
    for i in range(100_000):
        kv.push_pull(0, np.ones(1000, np.float32))
        if kv.rank == 1 and i == 3:
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError("worker 1 fails on purpose")
    kv.close()


def case_shutdown():
    kv = ddpbench.create(sys.argv[2], trace=sys.argv[4])  # every process writes its sends
    kv.push_pull("g", np.ones(10, np.float32))
    kv.close()
    say(kv, "closed", tag="shutdown")
    time.sleep(0.1)


if __name__ == "__main__":
    case = sys.argv[1]
    if case == "kvstore":
        case_kvstore(int(sys.argv[2]))
    else:
        globals()[f"case_{case}"]()
