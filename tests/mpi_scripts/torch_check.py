"""ddpbench.torch checks, run on every rank of one MPI job.

Usage: python torch_check.py CASE[,CASE...] BACKEND[,BACKEND...]
Cases: reference, lazy, errors, variants, local_sgd, onserver. Each reports one JSON line per
check on rank 0 (_results.py) and raises (ending the job non-zero) on a wrong result.

Tolerance of the reference check: N workers each on B samples, gradients averaged, equal
one process on the N*B concatenated samples up to the reduction order of fp32 sums; after
20 SGD steps (momentum 0.9) every tensor satisfies max|w - w_ref| <= 1e-5 max|w_ref|.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
import torch.nn.functional as F
from _results import result, run_cases
from torch import nn

import ddpbench.torch as dt
from ddpbench.comm import world
from ddpbench.data import ShardedLoader, mnist5k

torch.set_num_threads(1)
RTOL, K, B, LR, MOM = 1e-5, 20, 8, 0.05, 0.9
DATA = mnist5k()
_RUNS = [0]


def log(check: str, **fields) -> None:
    if world().role_rank == 0:
        result(check, **fields)


def gather_equal(t: torch.Tensor, what: str) -> None:
    """Raise unless every worker holds exactly ``t``."""
    allv = world().role_comm.allgather(t.detach().numpy())
    for r, a in enumerate(allv):
        if not np.array_equal(a, allv[0]):
            raise AssertionError(f"{what}: rank {r} differs from rank 0 by "
                                 f"{np.max(np.abs(a - allv[0]))}")


def make(kind: str, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 32), nn.ReLU(), nn.Linear(32, 10))
    if kind == "cnn":
        return nn.Sequential(nn.Conv2d(1, 4, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(4 * 12 * 12, 10))
    # lazy: input sizes inferred at the first forward
    return nn.Sequential(nn.LazyConv2d(4, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.LazyLinear(16), nn.ReLU(), nn.LazyLinear(10))


def prefix() -> str:
    _RUNS[0] += 1  # parameter-server stores fix a key's size for good: fresh keys per model
    return f"m{_RUNS[0]}."


def train(kv, kind, *, k=K, lr=LR, momentum=MOM, **opt_kw) -> nn.Module:
    m = make(kind, seed=100 + kv.rank)  # every rank seeded differently
    pre = prefix()
    dt.broadcast_parameters(m, kv=kv, prefix=pre)
    opt = dt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=lr, momentum=momentum),
                                  [(pre + n, p) for n, p in m.named_parameters()], kv=kv,
                                  **opt_kw)
    loader = ShardedLoader(DATA.x_train, DATA.y_train, B, rank=kv.rank,
                           num_workers=kv.num_workers, seed=5)
    for step in range(k):
        x, y = loader.batch(step)
        opt.zero_grad()
        F.cross_entropy(m(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        opt.step()
    opt.close()
    return m


def reference(kind, workers, *, k=K, lr=LR, momentum=MOM) -> nn.Module:
    """One process on the concatenated batch of all workers; no communication."""
    m = make(kind, seed=100)
    full = ShardedLoader(DATA.x_train, DATA.y_train, B * workers, seed=5)
    opt = torch.optim.SGD(m.parameters(), lr=lr, momentum=momentum)
    for step in range(k):
        x, y = full.batch(step)
        opt.zero_grad()
        F.cross_entropy(m(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        opt.step()
    return m


def compare(m, ref, what, rtol=RTOL) -> float:
    worst = 0.0
    for (name, p), q in zip(m.state_dict().items(), ref.state_dict().values()):
        gather_equal(p, f"{what} {name}")
        rel = float((p.double() - q.double()).abs().max() / q.double().abs().max())
        if rel > rtol:
            raise AssertionError(f"{what} {name}: max|w - w_ref| / max|w_ref| = {rel:.3g} > "
                                 f"{rtol:g}")
        worst = max(worst, rel)
    return worst


def case_reference(kv, backend: str) -> None:
    for kind in ("mlp", "cnn", "lazy"):
        m = train(kv, kind)
        worst = compare(m, reference(kind, kv.num_workers), f"{backend}/{kind}")
        log("reference", backend=backend, model=kind, steps=K, ranks=kv.num_workers,
            worst=worst)


def case_lazy(kv, backend: str) -> None:
    m = make("lazy", seed=100 + kv.rank)
    lazy = sum(isinstance(p, nn.parameter.UninitializedParameter) for p in m.parameters())
    dt.broadcast_parameters(m, kv=kv, prefix=prefix())
    x = torch.from_numpy(DATA.x_train[:4])
    m(x)
    root = make("lazy", seed=100)
    root(x)
    for (name, p), q in zip(m.state_dict().items(), root.state_dict().values()):
        if not torch.equal(p, q):
            raise AssertionError(f"{backend} lazy {name}: differs from root's initial values")
        gather_equal(p, f"{backend} lazy {name}")
    log("lazy", backend=backend, uninitialised=lazy, ranks=kv.num_workers)


def expect_error(fn, kind, *needles) -> str:
    try:
        fn()
    except kind as err:
        msg = str(err)
        missing = [n for n in needles if n not in msg]
        if missing:
            raise AssertionError(f"error lacks {missing}: {msg}") from None
        return msg
    raise AssertionError(f"expected {kind.__name__} with {needles}")


def case_errors(kv, backend: str) -> None:
    m = make("mlp", seed=1)
    expect_error(lambda: dt.broadcast_parameters(list(m.parameters()), kv=kv), ValueError,
                 "has no name", "named_parameters()")
    params = list(m.parameters())
    expect_error(lambda: dt.DistributedOptimizer(torch.optim.SGD(params, lr=0.1),
                                                 list(m.named_parameters())[1:], kv=kv),
                 ValueError, "no name in named_parameters", "index 0", "[32, 784]")
    flags = nn.Parameter(torch.zeros(3, dtype=torch.complex64))
    expect_error(lambda: dt.DistributedOptimizer(torch.optim.SGD([flags], lr=0.1),
                                                 [("flags", flags)], kv=kv),
                 TypeError, "'flags'", "complex64", "cannot reduce")
    # rank 1 builds a wider model: every rank gets the error, naming rank 1
    odd = kv.num_workers - 1
    bad = nn.Sequential(nn.Linear(784, 32 if kv.rank != odd else 33))
    msg = expect_error(lambda: dt.broadcast_parameters(bad, kv=kv, prefix=prefix()),
                       ValueError, f"ranks [{odd}]", "root rank 0", "0.weight'",
                       "float32[33, 784]", "float32[32, 784]")
    log("errors", backend=backend, example=msg)


def case_variants(kv, backend: str) -> None:
    n = kv.num_workers
    base = train(kv, "mlp", k=5)
    for f in (4.0, 16.0):
        got = train(kv, "mlp", k=5, gradient_predivide_factor=f)
        worst = compare(got, base, f"{backend} predivide {f:g}", rtol=1e-6)
        log("predivide", backend=backend, factor=f, worst=worst)
    for comp, eps in (("fp16", 2.0 ** -11), ("bf16", 2.0 ** -8)):
        got = train(kv, "mlp", k=1, momentum=0.0, compression=comp)
        ref = reference("mlp", n, k=1, momentum=0.0)
        start = make("mlp", seed=100)
        # One step: w = w0 - lr g; each rank's gradient rounds once to the wire dtype and
        # the sum of n rounds once per ring step: |dw| <= lr (n + 1) eps max|g| per tensor.
        for (name, p), q, s in zip(got.state_dict().items(), ref.state_dict().values(),
                                   start.state_dict().values()):
            gather_equal(p, f"{comp} {name}")
            gmax = float((q - s).abs().max()) / LR
            err = float((p - q).abs().max())
            bound = LR * (n + 1) * eps * gmax * 4 + 1e-7
            if err > bound:
                raise AssertionError(f"{comp} {name}: error {err:.3g} > bound {bound:.3g}")
        log("compression", backend=backend, compression=comp)
    # two backward passes of half batches accumulate into one reduction of the full batch
    m = make("mlp", seed=100 + kv.rank)
    pre = prefix()
    dt.broadcast_parameters(m, kv=kv, prefix=pre)
    opt = dt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=LR),
                                  [(pre + k, p) for k, p in m.named_parameters()], kv=kv,
                                  backward_passes_per_step=2)
    loader = ShardedLoader(DATA.x_train, DATA.y_train, B, rank=kv.rank, num_workers=n, seed=5)
    for step in range(3):
        x, y = loader.batch(step)
        opt.zero_grad()
        for half in (slice(0, B // 2), slice(B // 2, B)):
            loss = F.cross_entropy(m(torch.from_numpy(x[half])), torch.from_numpy(y[half]))
            (loss / 2).backward()
        opt.step()
    worst = compare(m, reference("mlp", n, k=3, momentum=0.0), f"{backend} accumulate")
    log("backward_passes", backend=backend, passes=2, worst=worst)
    # optimizer state and hyperparameters: root's win
    m = make("mlp", seed=100 + kv.rank)
    opt = torch.optim.SGD(m.parameters(), lr=0.1 * (kv.rank + 1), momentum=0.5 + 0.1 * kv.rank)
    for p in m.parameters():
        p.grad = torch.full_like(p, float(kv.rank + 1))
    opt.step()
    dt.broadcast_optimizer_state(opt, kv=kv, prefix=prefix())
    assert opt.param_groups[0]["lr"] == 0.1 and opt.param_groups[0]["momentum"] == 0.5
    for p in m.parameters():
        buf = opt.state[p]["momentum_buffer"]
        assert torch.equal(buf, torch.ones_like(p)), "momentum buffer is not root's"
    log("optimizer_state", backend=backend)


def case_local_sgd(kv, backend: str) -> None:
    # period 1 with plain SGD averages after every step: the same as averaging gradients
    m = train(kv, "mlp", k=5, momentum=0.0)
    worst = compare(m, reference("mlp", kv.num_workers, k=5, momentum=0.0), backend)
    log("local_sgd", backend=backend, period=1, worst=worst)


def case_onserver(kv, backend: str) -> None:
    m = train(kv, "mlp", update_on_kvstore=True)
    worst = compare(m, reference("mlp", kv.num_workers), f"{backend} onserver")
    log("onserver", backend=backend, momentum=MOM, steps=K, worst=worst)


CASES = {"reference": case_reference, "lazy": case_lazy, "errors": case_errors,
         "variants": case_variants, "local_sgd": case_local_sgd, "onserver": case_onserver}


if __name__ == "__main__":
    run_cases(CASES, sys.argv[1:])
