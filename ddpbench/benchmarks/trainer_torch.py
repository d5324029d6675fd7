"""``ddpbench bench trainer --framework torch``: ddpbench.torch on each backend beside torch DDP.

Every rank builds the same torchvision model (no weights downloaded) and the same batch;
then, in one job, the training step (forward, backward, optimizer step) is timed with:

- ``ddp``: ``torch.nn.parallel.DistributedDataParallel`` over ``torch.distributed`` on gloo
  (its default 25 MB gradient buckets), the library users know;
- each backend: ``ddpbench.torch.DistributedOptimizer`` over ``ddpbench.create(name)``.

One store is open at a time (as in a user's job): each backend's block alternates its steps
with DDP's, step by step, so a change in the machine's load hits both alike, and the ratio
is taken within the block. Each backend's model starts from DDP's current parameters (plain
SGD keeps no state) and steps beside it on the same batches, so at the end of the block its
parameters must equal DDP's up to the summation order (``max|dw|``). Timing: barrier,
``MPI.Wtime`` around one step, the slowest rank's time kept; medians.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddpbench.benchmarks import allreduce_scalar, init_gloo


def worker(cfg: dict[str, Any]) -> None:
    """Run the comparison on this rank; rank 0 writes the rows to ``cfg["out"]``."""
    import torch
    import torch.distributed as tdist

    from ddpbench.comm import world
    from ddpbench.profiling.model import build_model

    comm = world().role_comm
    torch.set_num_threads(cfg["threads"])
    init_gloo(comm)
    torch.manual_seed(0)
    template, _ = build_model(cfg["model"])
    batches = _batches(cfg, comm.rank)
    loss_fn = torch.nn.CrossEntropyLoss()
    ddp_model = torch.nn.parallel.DistributedDataParallel(_fresh(template))
    ddp_opt = torch.optim.SGD(ddp_model.parameters(), lr=cfg["lr"])
    ddp_step = _stepper(ddp_model, ddp_opt, loss_fn)
    rows = []
    done = 0  # DDP's steps so far (which batch comes next)
    for spec in cfg["backends"]:
        rows.append(_backend_block(cfg, spec, comm, template, ddp_model, ddp_step, loss_fn,
                                   batches, done))
        done += cfg["warmup"] + cfg["iters"]
    tdist.destroy_process_group()
    if comm.rank == 0:
        ref = _flat(ddp_model.module)
        for r in rows:
            r.update(params=int(ref.numel()), tensors=len(list(ddp_model.parameters())))
        Path(cfg["out"]).write_text(json.dumps(rows))


def _batches(cfg: dict[str, Any], rank: int) -> list[tuple[Any, Any]]:
    """Draw this rank's four batches of random inputs and labels (seeded by rank)."""
    import torch

    gen = torch.Generator().manual_seed(1000 + rank)
    shape = (cfg["batch"], *cfg["input_shape"])
    return [(torch.randn(shape, generator=gen), torch.randint(0, 10, (cfg["batch"],),
                                                                generator=gen))
            for _ in range(4)]


def _fresh(template: Any) -> Any:
    """Return a copy of ``template`` in training mode."""
    import copy

    model = copy.deepcopy(template)
    model.train()
    return model


def _stepper(model: Any, opt: Any, loss_fn: Any) -> Callable[[Any, Any], None]:
    """Return one training step (forward, backward, optimizer step) of ``model`` on a batch."""
    def step(x: Any, y: Any) -> None:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    return step


def _flat(model: Any) -> Any:
    """Return ``model``'s parameters as one flat tensor."""
    import torch

    with torch.no_grad():
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _timed(comm: Any, steppers: dict[str, Any], batches: list[tuple[Any, Any]], steps: int,
           first: int) -> dict[str, list[float]]:
    """Time ``steps`` steps of each stepper, alternating, from batch ``first`` on.

    Who goes first rotates each step; each step starts at a barrier and counts the slowest
    rank's time.
    """
    from mpi4py import MPI

    samples: dict[str, list[float]] = {k: [] for k in steppers}
    order = list(steppers)
    for it in range(steps):
        x, y = batches[(first + it) % len(batches)]
        turn = order[it % len(order):] + order[:it % len(order)]  # rotate who goes first
        for label in turn:
            comm.Barrier()
            t0 = MPI.Wtime()
            steppers[label](x, y)
            samples[label].append(allreduce_scalar(comm, MPI.Wtime() - t0, "max"))
    return samples


def _backend_block(cfg: dict[str, Any], spec: str, comm: Any, template: Any, ddp_model: Any,
                   ddp_step: Callable[[Any, Any], None], loss_fn: Any,
                   batches: list[tuple[Any, Any]], done: int) -> dict[str, Any]:
    """Time one backend beside DDP in a block of their own; return the block's row.

    ``spec`` is ``name`` or ``name:knob=json,...``; its model starts where DDP is now and
    ``done`` is how many steps DDP has taken (which batch comes next).
    """
    import numpy as np
    import torch

    import ddpbench
    import ddpbench.torch as dt

    # One store at a time, as a user's job has: each block pairs a backend with DDP.
    name, _, rest = spec.partition(":")
    opts = {k: json.loads(v) for k, _, v in (o.partition("=") for o in rest.split(",") if o)}
    kv = ddpbench.create(name, **opts)
    model = _fresh(template)
    model.load_state_dict(ddp_model.module.state_dict())  # where DDP is now
    dt.broadcast_parameters(model, root_rank=0, kv=kv)
    opt = dt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=cfg["lr"]),
                                  model.named_parameters(), kv=kv)
    steps = cfg["warmup"] + cfg["iters"]
    samples = _timed(comm, {"ddp": ddp_step, spec: _stepper(model, opt, loss_fn)}, batches,
                     steps, done)
    diff = float((_flat(model) - _flat(ddp_model.module)).abs().max())
    kv.close()
    warm = cfg["warmup"]
    return {"variant": spec, "ranks": comm.size,
            "step_ms": 1e3 * float(np.median(samples[spec][warm:])),
            "ddp_ms": 1e3 * float(np.median(samples["ddp"][warm:])),
            "min_ms": 1e3 * min(samples[spec][warm:]),
            "ddp_min_ms": 1e3 * min(samples["ddp"][warm:]),
            "max_param_diff": diff}


def print_table(rows: list[dict[str, Any]]) -> None:
    """Print each backend's step beside DDP's from the same block, and their ratio."""
    print(f"{'variant':<22} {'n':>2} {'tensors':>7} {'params':>10} {'step_ms':>9} "
          f"{'ddp_ms':>8} {'vs_ddp':>7} {'min_ratio':>9} {'max|dw|':>8}")
    for r in rows:
        print(f"{r['variant']:<22} {r['ranks']:>2} {r['tensors']:>7} {r['params']:>10} "
              f"{r['step_ms']:>9.2f} {r['ddp_ms']:>8.2f} {r['step_ms'] / r['ddp_ms']:>7.3f} "
              f"{r['min_ms'] / r['ddp_min_ms']:>9.3f} {r['max_param_diff']:>8.2g}")
    print("\n# step = forward + backward + optimizer step, median of the slowest rank per step; "
          "ddp = torch DistributedDataParallel on gloo, timed in the same block, steps "
          "alternating; vs_ddp = step / ddp (< 1: faster); min_ratio = the same on the "
          "fastest steps; max|dw| = parameters against DDP's after the same steps")


if __name__ == "__main__":
    worker(json.loads(sys.argv[1]))
