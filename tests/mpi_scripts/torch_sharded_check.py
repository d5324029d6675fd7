"""ddpbench.torch.FullyShardedDataParallel on N ranks against one process on the whole batch.

Usage: mpiexec -n N python torch_sharded_check.py. A torch MLP (two Linear layers, Tanh,
mean-squared error); each rank trains on its batch / N, the store updates with ddpbench.SGD;
the reference is one process on the whole batch with the same SGD on the same gradients.
Reports one JSON line per configuration on rank 0 and fails on a difference over 1e-5.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from _results import result
from torch import nn

import ddpbench
import ddpbench.torch as dt
from ddpbench.comm import world

torch.set_num_threads(1)
BATCH, STEPS = 12, 8
OPT = ddpbench.SGD(lr=0.1, momentum=0.9, wd=1e-3)


def net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(7, 11), nn.Tanh(), nn.Linear(11, 9), nn.Tanh(),
                         nn.Linear(9, 5))


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(55)
    return torch.randn(STEPS, BATCH, 7, generator=g), torch.randn(STEPS, BATCH, 5, generator=g)


def reference() -> dict[str, np.ndarray]:
    model = net(0)
    xs, ys = data()
    params = dict(model.named_parameters())
    state = {k: OPT.create_state(p.detach().numpy()) for k, p in params.items()}
    for s in range(STEPS):
        model.zero_grad()
        F.mse_loss(model(xs[s]), ys[s]).backward()
        for k, p in params.items():
            OPT.update(p.detach().numpy(), p.grad.numpy(), state[k])
    return {k: p.detach().numpy().copy() for k, p in params.items()}


def run(backend: str, knobs: dict) -> tuple[float, dict]:
    rank, size = world().role_rank, world().num_workers
    model = dt.FullyShardedDataParallel(net(rank * 100), OPT, backend=backend, **knobs)
    xs, ys = data()
    lo, hi = rank * BATCH // size, (rank + 1) * BATCH // size
    for s in range(STEPS):
        model.zero_grad()
        F.mse_loss(model(xs[s, lo:hi]), ys[s, lo:hi]).backward()
        model.step()
    if model.sharded:
        assert all(p.numel() == 0 for p in model.module.parameters())  # freed after the step
        model.gather_parameters()
    got = {k: p.detach().numpy().copy() for k, p in model.module.named_parameters()}
    stats = {**model.kv.stats, **model.stats}
    model.kv.close()
    ref = reference()
    return max(float(np.max(np.abs(got[k] - ref[k]))) for k in ref), stats


CONFIGS = [
    ("zero", {"stage": 0}), ("zero", {"stage": 1}), ("zero", {"stage": 2}),
    ("zero", {"stage": 1, "reduce_bucket_size": 100}),
    ("zero", {"stage": 1, "reduce_bucket_size": 100, "overlap_comm": True}),
    ("zero", {"stage": 2, "reduce_bucket_size": 100}),
    ("zero", {"stage": 3, "param_persistence_threshold": 0}),
    ("zero", {"stage": 3, "param_persistence_threshold": 0, "prefetch_bucket_size": 100}),
    ("zero", {"stage": 3}),
    ("zero", {"stage": 3, "param_persistence_threshold": 0, "max_live_parameters": 100,
              "prefetch_bucket_size": 100}),
    ("fsdp", {}), ("fsdp", {"forward_prefetch": True}),
    ("fsdp", {"backward_prefetch": "BACKWARD_POST"}), ("fsdp", {"backward_prefetch": "none"}),
    ("fsdp", {"sharding_strategy": "SHARD_GRAD_OP"}), ("fsdp", {"sharding_strategy": "NO_SHARD"}),
    ("fsdp", {"sharding_strategy": "HYBRID_SHARD", "ranks_per_host": 1}),
]


def main() -> None:
    size = world().num_workers
    for backend, knobs in CONFIGS:
        diff, stats = run(backend, knobs)
        assert diff < 1e-5, (backend, knobs, diff)
        if world().role_rank == 0:
            result("torch_sharded", backend=backend, knobs=knobs, size=size,
                   max_abs_diff=diff, stats=stats)


if __name__ == "__main__":
    main()
