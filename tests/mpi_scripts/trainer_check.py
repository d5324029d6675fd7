"""DistributedTrainer and broadcast_parameters checks, run on every rank of one MPI job.

Usage: python trainer_check.py CASE[,CASE...] BACKEND[,BACKEND...]
Cases: deferred, reference, distributed, predivide, local_sgd. Each reports one JSON
line per check on rank 0 (_results.py) and raises (ending the job non-zero) on a wrong result.
"""

from __future__ import annotations

import sys

import numpy as np
from _results import result, run_cases

import ddpbench
from ddpbench import nn
from ddpbench.comm import world
from ddpbench.data import ShardedLoader, teacher_student

# Same seed, fp32: the distributed trainer reduces in another order than the single full
# batch, so parameters agree to fp32 rounding of sums of a few hundred terms, amplified a
# little by K steps: |w - w_ref| <= ATOL + RTOL |w_ref|.
RTOL, ATOL, K = 1e-5, 1e-6, 5
B, LR = 16, 0.2


def log(check: str, **fields) -> None:
    if world().role_rank == 0:
        result(check, **fields)


def gather_equal(arr: np.ndarray, what: str) -> None:
    """Raise unless every worker holds exactly ``arr``."""
    comm = world().role_comm
    allv = comm.allgather(np.asarray(arr))
    for r, a in enumerate(allv):
        if not np.array_equal(a, allv[0]):
            raise AssertionError(f"{what}: rank {r} differs from rank 0 by "
                                 f"{np.max(np.abs(a - allv[0]))}")


_RUNS = [0]


def model(name: str, seed: int) -> nn.Sequential:
    # A fresh name prefix per model: parameter-server backends fix a name's size for good.
    _RUNS[0] += 1
    return nn.create_model(name, seed=seed, prefix=f"m{_RUNS[0]}.")


def data(model_name: str):
    ds = teacher_student(n_train=512, n_test=64, seed=3)
    return ds.as_images() if model_name == "cnn" else ds


def case_deferred(kv: ddpbench.KVStore, backend: str) -> None:
    rank = kv.rank
    for name in ("mlp", "cnn"):
        ds = data(name)
        m = model(name, seed=100 + rank)  # every rank seeded differently
        deferred = [p.name for p in m.parameters() if not p.initialised]
        assert deferred, "the zoo model should have deferred parameters"
        ddpbench.broadcast_parameters(m.parameters(), root_rank=0, kv=kv)
        m.forward(ds.x_train[:4])
        root = model(name, seed=100)  # what rank 0 initialised
        root.forward(ds.x_train[:4])
        for p, q in zip(m.parameters(), root.parameters()):
            if not np.array_equal(p.data, q.data):
                raise AssertionError(f"{backend}/{name}: {p.name} differs from root's values")
            gather_equal(p.data, f"{backend}/{name} {p.name}")
        log("deferred", backend=backend, model=name, deferred=len(deferred),
            parameters=len(m.parameters()), ranks=kv.num_workers)


def train(kv, backend, name, k=K, seed_of=lambda r: 100 + r, **trainer_kw):
    ds = data(name)
    m = model(name, seed=seed_of(kv.rank))
    ddpbench.broadcast_parameters(m.parameters(), kv=kv)
    tr = ddpbench.DistributedTrainer(m.parameters(), nn.SGD(lr=LR), kv=kv, **trainer_kw)
    loader = ShardedLoader(ds.x_train, ds.y_train, B, rank=kv.rank, num_workers=kv.num_workers,
                           seed=5)
    for step in range(k):
        x, y = loader.batch(step)
        _, d = nn.softmax_cross_entropy(m.forward(x), y)
        m.backward(d)
        tr.step(B)
    tr.close()
    return m


def reference(name: str, workers: int, k: int = K) -> nn.Sequential:
    """A single process on the full global batch, no communication at all."""
    ds = data(name)
    m = model(name, seed=100)
    full = ShardedLoader(ds.x_train, ds.y_train, B * workers, seed=5)
    for step in range(k):
        x, y = full.batch(step)
        _, d = nn.softmax_cross_entropy(m.forward(x), y)
        m.backward(d)
        for p in m.parameters():
            p.data -= np.float32(LR) * (p.grad * np.float32(1.0 / (B * workers)))
    return m


def case_reference(kv, backend: str, label: str = "reference", **trainer_kw) -> None:
    for name in ("mlp", "cnn"):
        m = train(kv, backend, name, **trainer_kw)
        ref = reference(name, kv.num_workers)
        worst = 0.0
        for p, q in zip(m.parameters(), ref.parameters()):
            gather_equal(p.data, f"{backend}/{name} {p.name} after {K} steps")
            err = np.abs(p.data.astype(np.float64) - q.data)
            bound = ATOL + RTOL * np.abs(q.data.astype(np.float64))
            if np.any(err > bound):
                raise AssertionError(f"{backend}/{name} {p.name}: max error {err.max():.3g} "
                                     f"exceeds {ATOL:g} + {RTOL:g}|w|")
            worst = max(worst, float(err.max()))
        log(label, backend=backend, model=name, steps=K, ranks=kv.num_workers, max_err=worst)


def case_distributed(kv, backend: str) -> None:
    ds = data("mlp")
    rank = kv.rank
    layers = [nn.Dense(32), nn.ReLU(), nn.Dense(32, distributed=True), nn.ReLU(), nn.Dense(10)]
    m = nn.Sequential(layers, seed=100 + rank, prefix="dist.")
    ddpbench.broadcast_parameters(m.parameters(), kv=kv)
    tr = ddpbench.DistributedTrainer(m.parameters(), nn.SGD(lr=LR), kv=kv)
    local = [p for p in m.parameters() if p.distributed]
    loader = ShardedLoader(ds.x_train, ds.y_train, B, rank=rank, num_workers=kv.num_workers,
                           seed=5)
    for step in range(3):
        x, y = loader.batch(step)
        _, d = nn.softmax_cross_entropy(m.forward(x), y)
        if step == 0:
            init = {p.name: p.data.copy() for p in local}
            # rank r's model-parallel weights started from its own seed: not broadcast
            ref = nn.Sequential([nn.Dense(32), nn.ReLU(), nn.Dense(32, distributed=True),
                                 nn.ReLU(), nn.Dense(10)], seed=100 + rank)
            ref.forward(x)
            for p, q in zip(local, [p for p in ref.parameters() if p.distributed]):
                assert np.array_equal(init[p.name], q.data), f"{p.name} was overwritten"
        m.backward(d)
        expect = {p.name: p.data - np.float32(LR) * (p.grad * np.float32(1 / B)) for p in local}
        grads = {p.name: p.grad.copy() for p in local}
        tr.step(B)
        for p in local:
            assert np.array_equal(p.grad, grads[p.name]), f"{p.name}: gradient was reduced"
            assert np.array_equal(p.data, expect[p.name]), f"{p.name}: not a local update"
    comm = world().role_comm
    if kv.num_workers > 1:
        differ = comm.allgather(local[0].data)
        assert not np.array_equal(differ[0], differ[1]), "model-parallel weights were synced"
    for p in m.parameters():
        if not p.distributed:
            gather_equal(p.data, f"{backend} replicated {p.name}")
    log("distributed", backend=backend)


def case_predivide(kv, backend: str) -> None:
    for op in ("sum", "max", "min", "product"):
        try:
            ddpbench.DistributedTrainer([], nn.SGD(), kv=kv, gradient_predivide_factor=2.0, op=op)
        except ValueError as err:
            assert "AVERAGE" in str(err), err
        else:
            raise AssertionError(f"predivide 2 with op {op} did not raise")
    ddpbench.DistributedTrainer([], nn.SGD(), kv=kv, gradient_predivide_factor=1.0, op="sum")
    base = train(kv, backend, "mlp", k=3)
    for f in (0.5, 4.0, float(kv.num_workers)):
        got = train(kv, backend, "mlp", k=3, gradient_predivide_factor=f)
        worst = max(float(np.max(np.abs(p.data - q.data)))
                    for p, q in zip(got.parameters(), base.parameters()))
        scale = max(float(np.max(np.abs(q.data))) for q in base.parameters())
        # prescale 1/f and postscale f/size each round once in fp32: a few ulps per step
        if worst > 1e-6 * scale:
            raise AssertionError(f"{backend} predivide {f}: differs from AVERAGE by {worst}")
        log("predivide", backend=backend, factor=f, max_err=worst, bound=1e-6 * scale)


def case_local_sgd(kv, backend: str) -> None:
    period = kv.options.local_sgd_period
    ds = data("mlp")
    m = model("mlp", seed=100 + kv.rank)
    ddpbench.broadcast_parameters(m.parameters(), kv=kv)
    tr = ddpbench.DistributedTrainer(m.parameters(), nn.SGD(lr=LR), kv=kv)
    loader = ShardedLoader(ds.x_train, ds.y_train, B, rank=kv.rank,
                           num_workers=kv.num_workers, seed=5)
    comm = world().role_comm
    n = len(m.parameters())
    x, y = loader.batch(0)
    m.forward(x)
    ops0 = sum(r["ops"] for r in kv.stats["rings"])
    for step in range(1, 2 * period + 2):
        x, y = loader.batch(step)
        _, d = nn.softmax_cross_entropy(m.forward(x), y)
        m.backward(d)
        before = sum(r["ops"] for r in kv.stats["rings"])
        tr.step(B)
        sent = sum(r["ops"] for r in kv.stats["rings"]) - before
        synced = step == 1 or (step - 1) % period == 0  # Paddle: steps 1, 1 + k, 1 + 2k
        assert sent == (n if synced else 0), f"step {step}: {sent} operations, period {period}"
        views = comm.allgather(m.parameters()[0].data)
        same = all(np.array_equal(v, views[0]) for v in views)
        if kv.num_workers > 1:
            assert same == synced, f"step {step}: identical={same}, expected {synced}"
    total = sum(r["ops"] for r in kv.stats["rings"]) - ops0
    log("local_sgd", backend=backend, period=period, steps=2 * period + 1,
        synced_steps=list(range(1, 2 * period + 2, period)), operations=total,
        parameters=n)

    # fp16 compression of the averaged deltas: one period, against the fp32 average. Each
    # delta is rounded to fp16 (2^-11 relative), summed in fp16 over p ranks and scaled in
    # fp32, so |w16 - w32| <= (p + 1) 2^-11 max|delta| (+ fp32 rounding of snapshot + delta).
    def one_period(compression):
        m = model("mlp", seed=100 + kv.rank)
        ddpbench.broadcast_parameters(m.parameters(), kv=kv)
        tr = ddpbench.DistributedTrainer(m.parameters(), nn.SGD(lr=LR), kv=kv,
                                         compression=compression)
        m.forward(loader.batch(0)[0])
        for step in range(period + 1):
            if step == 1:  # step 1 averaged (Paddle's schedule): the snapshot from here on
                start = [p.data.copy() for p in m.parameters()]
            x, y = loader.batch(step)
            _, d = nn.softmax_cross_entropy(m.forward(x), y)
            m.backward(d)
            # this rank's delta as the average will see it (plain SGD: the local update)
            own = [p.data - np.float32(LR) * (p.grad * np.float32(1 / B)) - s0
                   for p, s0 in zip(m.parameters(), start)] if step else []
            tr.step(B)
        return m, start, own

    m32, start, deltas = one_period(None)
    m16, _, _ = one_period("fp16")
    p_ = kv.num_workers
    for p, q, d in zip(m16.parameters(), m32.parameters(), deltas):
        gather_equal(p.data, f"local_sgd fp16 {p.name}")
        own = np.array([np.max(np.abs(d))], np.float32)
        dmax = float(kv.allreduce_max(f"dmax.{p.name}", own)[0])
        err = float(np.max(np.abs(p.data - q.data)))
        bound = (p_ + 1) * 2.0 ** -11 * dmax + 1e-6 * float(np.max(np.abs(q.data)))
        assert err <= bound, f"fp16 local SGD {p.name}: error {err} > bound {bound}"
    log("local_sgd_fp16", backend=backend, bound="(p+1) 2^-11 max|delta|")


def case_onserver(kv, backend: str) -> None:
    """update_on_kvstore=True: the servers run the optimizer; same parameters as the
    reference (SGD in MXNet's form on the servers)."""
    case_reference(kv, backend, "onserver", update_on_kvstore=True)


CASES = {"deferred": case_deferred, "reference": case_reference, "onserver": case_onserver,
         "distributed": case_distributed, "predivide": case_predivide,
         "local_sgd": case_local_sgd}


if __name__ == "__main__":
    run_cases(CASES, sys.argv[1:])
