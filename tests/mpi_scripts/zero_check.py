"""Sharded data parallelism on N ranks: allgather/reduce_scatter against NumPy, and the
``zero``/``fsdp`` engines against one process on the whole batch.

Usage: ``mpiexec -n N python zero_check.py CASE`` with CASE ``collectives`` (every backend
that has them, every op and dtype, uneven sizes) or ``train`` (every stage and strategy).
"""

from __future__ import annotations

import os
import sys

import numpy as np
from _results import result

import ddpbench
from ddpbench.api import backend_class
from ddpbench.backends.zero import RANKS_PER_HOST_ENV
from ddpbench.comm import world

BATCH, IN, HIDDEN, OUT, STEPS = 12, 7, 11, 5, 6


# -- allgather and reduce_scatter -------------------------------------------------------------
def _value(seed: int, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "i":
        return rng.integers(-50, 50, size=shape).astype(dtype)
    return rng.uniform(-2, 2, size=shape).astype(dtype)


def check_collectives(kv: ddpbench.KVStore, backend: str) -> int:
    rank, size = kv.rank, kv.num_workers
    checks = 0
    for dtype in ("float32", "float64", "int32", "float16"):
        for n in (0, 1, 5, 7, 13, 64):
            # allgather: rank r sends r + 1 rows of (n % 4 + 1) columns, uneven by design
            cols = n % 4 + 1
            mine = _value(100 * rank + n, (rank + 1, cols), dtype)
            want = np.concatenate([_value(100 * r + n, (r + 1, cols), dtype)
                                   for r in range(size)])
            got = kv.allgather(f"ag.{dtype}.{n}", mine)
            assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape)
            assert np.array_equal(got, want), (backend, dtype, n)
            out = np.empty_like(want)
            assert kv.allgather(f"ago.{dtype}.{n}", mine, out) is out
            assert np.array_equal(out, want)
            checks += 2
            # reduce_scatter: every rank n elements (shape (n,) or (n, 1)); chunk r of the sum
            shape = (n,) if n % 2 else (n, 1)
            parts = [_value(7 * r + n, shape, dtype) for r in range(size)]
            for op in ("sum", "average", "max", "min"):
                if op == "average" and np.dtype(dtype).kind == "i":
                    continue
                ref = np.stack([p.astype(np.float64) for p in parts])
                full = {"sum": ref.sum(0), "average": ref.sum(0) / size,
                        "max": ref.max(0), "min": ref.min(0)}[op].reshape(-1)
                chunk = np.array_split(full, size)[rank]
                got = kv.reduce_scatter(f"rs.{dtype}.{n}.{op}", parts[rank], op=op)
                assert got.shape == chunk.shape and got.dtype == np.dtype(dtype)
                tol = 3e-3 * size if dtype == "float16" else 1e-6 * size
                assert np.allclose(got.astype(np.float64), chunk, rtol=tol, atol=tol), \
                    (backend, dtype, n, op, got, chunk)
                checks += 1
    # a 0-d tensor is one row
    got = kv.allgather("scalar", np.array(float(rank)))
    assert np.array_equal(got, np.arange(size, dtype=np.float64))
    if rank == 0:
        result("collectives", backend=backend, size=size, checks=checks + 1)
    return checks


def check_not_implemented(name: str) -> None:
    cls = backend_class(name)
    stand_in = type("StandIn", (), {"type": name})()  # no servers needed to ask
    for call in (lambda: cls._allgather(stand_in, "x", np.zeros(1), None),
                 lambda: cls._reduce_scatter(stand_in, "x", np.zeros(1), None, "sum")):
        try:
            call()
        except NotImplementedError as err:
            assert "'mpi'" in str(err) and "'zero'" in str(err), err
            if world().rank == 0:
                result("missing", backend=name, message=str(err))


# -- the training problem: a tanh MLP, mean-squared error, manual backprop in float32 -----
def problem() -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(2026)
    params = {
        "w1": rng.normal(0, 0.5, (IN, HIDDEN)).astype(np.float32),
        "b1": rng.normal(0, 0.1, (HIDDEN,)).astype(np.float32),
        "w2": rng.normal(0, 0.5, (HIDDEN, OUT)).astype(np.float32),
        "b2": rng.normal(0, 0.1, (OUT,)).astype(np.float32),
    }
    xs = rng.normal(0, 1, (STEPS, BATCH, IN)).astype(np.float32)
    ys = rng.normal(0, 1, (STEPS, BATCH, OUT)).astype(np.float32)
    return params, xs, ys


def grads(p: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """Gradients of the mean over the batch of 0.5 * |mlp(x) - y|^2."""
    h = np.tanh(x @ p["w1"] + p["b1"])
    d = (h @ p["w2"] + p["b2"] - y) / np.float32(len(x))
    dh = (d @ p["w2"].T) * (1 - h * h)
    return {"w1": x.T @ dh, "b1": dh.sum(0), "w2": h.T @ d, "b2": d.sum(0)}


def reference(opt: ddpbench.SGD) -> dict[str, np.ndarray]:
    """One process on the whole batch."""
    p, xs, ys = problem()
    state = {k: opt.create_state(v) for k, v in p.items()}
    for s in range(STEPS):
        g = grads(p, xs[s], ys[s])
        for k in p:
            opt.update(p[k], g[k], state[k])
    return p


def train(kv: ddpbench.KVStore, opt: ddpbench.SGD, use_store_optimizer: bool
          ) -> dict[str, np.ndarray]:
    """N ranks, each on its batch / N; the store's optimizer or (DDP) a local one."""
    rank, size = kv.rank, kv.num_workers
    p, xs, ys = problem()
    if rank != 0:  # only rank 0's initial weights count: the broadcast brings them
        for v in p.values():
            v[...] = 0
    names = list(p)
    kv.broadcast(names, [p[k] for k in names])
    state = {k: opt.create_state(v) for k, v in p.items()}
    if use_store_optimizer:
        kv.set_optimizer(opt)
    lo, hi = rank * BATCH // size, (rank + 1) * BATCH // size
    sharded = getattr(kv, "gather", None) is not None
    for s in range(STEPS):
        if sharded:
            kv.gather(names, [p[k] for k in names])  # stage 3: the forward's parameters
        g = grads(p, xs[s, lo:hi], ys[s, lo:hi])
        gl = [np.ascontiguousarray(g[k]) for k in names]
        if use_store_optimizer:
            kv.push_pull(names, gl, output=[p[k] for k in names], op="average")
        else:
            kv.push_pull(names, gl, op="average")
            for k, gk in zip(names, gl):
                opt.update(p[k], gk, state[k])
    if sharded:
        kv.gather(names, [p[k] for k in names])
    return p


CONFIGS = [
    ("mpi", {}, False),  # DDP: allreduce, local step
    ("zero", {"stage": 0}, True),
    ("zero", {"stage": 1}, True),
    ("zero", {"stage": 2}, True),
    ("zero", {"stage": 2, "reduce_bucket_size": 40, "allgather_bucket_size": 30}, True),
    ("zero", {"stage": 1, "reduce_scatter": False}, True),
    ("zero", {"stage": 3}, True),  # default threshold: every parameter here persists
    ("zero", {"stage": 3, "param_persistence_threshold": 0, "reduce_bucket_size": 40,
              "prefetch_bucket_size": 20}, True),
    ("zero", {"stage": 3, "param_persistence_threshold": 20}, True),
    ("fsdp", {}, True),
    ("fsdp", {"sharding_strategy": "SHARD_GRAD_OP"}, True),
    ("fsdp", {"sharding_strategy": "NO_SHARD"}, True),
    ("fsdp", {"sharding_strategy": "HYBRID_SHARD"}, True),
]


def check_train() -> None:
    from mpi4py import MPI

    size = MPI.COMM_WORLD.size
    configs = list(CONFIGS)
    if size % 2 == 0:
        configs.append(("fsdp", {"sharding_strategy": "HYBRID_SHARD", "ranks_per_host": 2}, True))
    if size > 1:
        configs.append(("fsdp", {"sharding_strategy": "HYBRID_SHARD", "ranks_per_host": 1}, True))
    if size % 2 == 0:
        configs.append(("fsdp", {"sharding_strategy": "HYBRID_SHARD", "_env": "2"}, True))
    for opt in (ddpbench.SGD(lr=0.1, momentum=0.9, wd=1e-3),
                ddpbench.SGD(lr=0.2, clip_gradient=0.05)):
        ref = reference(opt)
        ddp: dict[str, np.ndarray] = {}
        for name, knobs, store_opt in configs:
            env = knobs.pop("_env", None)  # HYBRID_SHARD's host size from the environment
            if env:
                os.environ[RANKS_PER_HOST_ENV] = env
            kv = ddpbench.create(name, **knobs)
            os.environ.pop(RANKS_PER_HOST_ENV, None)
            if env:
                knobs = {**knobs, "_env": env}
            got = train(kv, opt, store_opt)
            diff = max(float(np.max(np.abs(got[k] - ref[k]))) for k in ref)
            ddp = got if name == "mpi" else ddp  # CONFIGS starts with DDP
            diff_ddp = max(float(np.max(np.abs(got[k] - ddp[k]))) for k in ref)
            stats = kv.stats if hasattr(kv, "_zero") else {}
            shard = sum(p.shard.size for p in kv._zero.params.values()
                        if p.shard is not None) if hasattr(kv, "_zero") else 0
            kv.close()
            assert diff < 1e-5 and diff_ddp < 1e-5, (name, knobs, diff, diff_ddp)
            if MPI.COMM_WORLD.rank == 0:  # one writer: lines of several ranks interleave
                    result("train", backend=name, knobs=knobs, momentum=opt.momentum,
                       size=size, max_abs_diff=diff, diff_to_ddp=diff_ddp,
                       stats=stats, shard_elements=shard)


def check_gpu() -> None:
    """CuPy arrays through the sharding stores (staged through the host), against NumPy."""
    import cupy

    cupy.cuda.Device(world().local_rank % cupy.cuda.runtime.getDeviceCount()).use()
    for name, knobs in (("zero", {"stage": 2}),
                        ("zero", {"stage": 3, "param_persistence_threshold": 0}),
                        ("fsdp", {})):
        kv = ddpbench.create(name, **knobs)
        rank, size = kv.rank, kv.num_workers
        w = cupy.asarray(np.arange(10, dtype=np.float32) * (rank == 0))
        kv.broadcast(["w"], [w])
        kv.set_optimizer(ddpbench.SGD(lr=0.5))
        g = cupy.full(10, float(rank + 1), dtype=cupy.float32)
        kv.push_pull(["w"], [g], output=[w], op="average")
        if kv.holds_sharded_params:
            kv.gather(["w"], [w])
        want = np.arange(10, dtype=np.float32) - np.float32(0.5 * (size + 1) / 2)
        assert np.allclose(cupy.asnumpy(w), want, atol=1e-6), (name, cupy.asnumpy(w), want)
        got = kv.allgather("ag", cupy.full((rank + 1, 2), rank, dtype=cupy.float32))
        assert isinstance(got, cupy.ndarray)
        assert np.array_equal(cupy.asnumpy(got), np.concatenate(
            [np.full((r + 1, 2), r, np.float32) for r in range(size)]))
        part = kv.reduce_scatter("rs", cupy.ones(7, dtype=cupy.float32))
        assert np.array_equal(cupy.asnumpy(part), np.array_split(np.full(7, size, np.float32),
                                                                 size)[rank])
        kv.close()
        if rank == 0:
            result("gpu", backend=name, knobs=knobs, size=size)


def check_mismatch() -> None:
    """Ranks that disagree get the same error on every rank, naming both sides."""
    from ddpbench.backends._common import MismatchError

    for name in ("zero", "fsdp"):
        kv = ddpbench.create(name, stage=2) if name == "zero" else ddpbench.create(name)
        rank = kv.rank
        kv.broadcast(["a"], [np.zeros(4, np.float32)])
        grad = np.ones(4 + (rank == 1), np.float32)
        try:
            kv.push_pull(["a"], [grad])
        except MismatchError as err:
            assert "rank 0 sent (4,), rank 1 sent (5,)" in str(err), err
            if rank == 0:
                result("mismatch", backend=name, message=str(err))
        else:
            raise AssertionError(f"{name}: no error for shapes that differ across ranks")
        kv.close()


def main() -> None:
    case = sys.argv[1]
    if case == "collectives":
        for name in ("mpi", "horovod", "collective", "zero", "fsdp"):
            with ddpbench.create(name) as kv:
                check_collectives(kv, name)
        for name in ("kvstore", "p3", "byteps"):
            check_not_implemented(name)
    elif case == "train":
        check_train()
    elif case == "gpu":
        check_gpu()
    elif case == "mismatch":
        check_mismatch()
    else:
        raise SystemExit(f"unknown case {case!r}")


if __name__ == "__main__":
    main()
