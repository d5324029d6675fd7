"""The accuracy kind's training job: configuration, launch, and the program every rank runs.

:func:`make_config` checks a training configuration, :func:`run_training` launches its
ranks (``ddpbench.launch``) and returns worker 0's result, and :func:`worker` is what each
rank runs (``python -m ddpbench.experiments.accuracy.worker CONFIG OUT``). Every worker
seeds its model differently on purpose (seed + 1000 x rank):
:func:`ddpbench.broadcast_parameters` makes them equal at the first forward, and the job
checks at the end that the replicas agree. Worker 0 evaluates its replica on the test set
every ``eval_every`` steps and writes the curve as JSON. ``ddpbench train`` and the
``accuracy`` experiment kind both run through here.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ddpbench.contract import PS_BACKENDS

DEFAULTS: dict[str, Any] = {
    "model": "mlp", "dataset": "synthetic", "backend": "mpi", "workers": 2, "servers": None,
    "knobs": {}, "steps": 300, "batch_size": 32, "lr": 0.1, "lr_schedule": "cosine",
    "momentum": 0.0,
    "compression": "none", "predivide": 1.0, "local_sgd_period": 0, "update_on_kvstore": False,
    "seed": 0, "eval_every": 20,
}


def make_config(**kw: Any) -> dict[str, Any]:
    """Return a full, validated training config from ``DEFAULTS`` updated by ``kw``.

    Raises:
        ValueError: an unknown key, model, dataset or backend, or a bad number.
    """
    import ddpbench
    from ddpbench.data import DATASETS
    from ddpbench.nn import MODELS

    unknown = sorted(set(kw) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown training setting {unknown[0]!r}; valid: {sorted(DEFAULTS)}")
    cfg = {**DEFAULTS, **kw}
    if is_torch_model(cfg["model"]):
        from ddpbench.profiling.model import build_model

        build_model(cfg["model"])  # a bad spec or a factory that fails: its message
        if cfg["update_on_kvstore"]:
            raise ValueError("update_on_kvstore is for the NumPy trainer; torch models "
                             "update locally")
    elif cfg["model"] not in MODELS:
        raise ValueError(f"unknown model {cfg['model']!r}; valid models: {sorted(MODELS)}, "
                         "or a torch model: torchvision:NAME or package.module:factory")
    if cfg["dataset"] not in DATASETS and not (
            str(cfg["dataset"]).endswith(".npz") or Path(str(cfg["dataset"])).is_dir()):
        raise ValueError(f"unknown dataset {cfg['dataset']!r}; valid: {sorted(DATASETS)}, a "
                         ".npz file or an image folder")
    ddpbench.api.backend_class(cfg["backend"])  # unknown backend: lists the available ones
    for key in ("workers", "steps", "batch_size", "eval_every"):
        if int(cfg[key]) < 1:
            raise ValueError(f"{key} must be >= 1, got {cfg[key]}")
    for key, lower in (("lr", "> 0"), ("momentum", ">= 0"), ("predivide", "> 0")):
        value = cfg[key]
        if (not isinstance(value, (int, float)) or isinstance(value, bool)
                or not math.isfinite(value) or value < 0 or (lower == "> 0" and value == 0)):
            raise ValueError(f"{key} must be a finite number {lower}, got {value!r}")
    if cfg["lr_schedule"] not in ("cosine", "constant"):
        raise ValueError(f"lr_schedule must be 'cosine' or 'constant', got {cfg['lr_schedule']!r}")
    if cfg["lr_schedule"] == "cosine" and cfg["update_on_kvstore"]:
        raise ValueError("update_on_kvstore runs a fixed optimizer on the servers: use "
                         "lr_schedule='constant' with it")
    if cfg["local_sgd_period"] < 0:
        raise ValueError(f"local_sgd_period must be >= 0 (0 = off), got {cfg['local_sgd_period']}")
    knobs = dict(cfg["knobs"])
    if cfg["local_sgd_period"]:
        if cfg["backend"] != "collective":
            raise ValueError(f"local SGD is a mode of the 'collective' backend, not of "
                             f"{cfg['backend']!r}")
        knobs.update(mode="local_sgd", local_sgd_period=int(cfg["local_sgd_period"]))
    if cfg["backend"] in PS_BACKENDS and cfg["servers"] is None:
        cfg["servers"] = "colocated"
    if cfg["servers"] not in (None, "colocated"):
        try:
            cfg["servers"] = int(cfg["servers"])
        except (TypeError, ValueError):
            raise ValueError(f"servers must be a number of server ranks or 'colocated', got "
                             f"{cfg['servers']!r}") from None
        if cfg["servers"] < 0:
            raise ValueError(f"servers must be >= 0 or 'colocated', got {cfg['servers']}")
    ddpbench.api.backend_class(cfg["backend"]).parse_options(
        {k: v for k, v in knobs.items() if k != "servers"})
    cfg["knobs"] = knobs
    return cfg


def run_training(cfg: dict[str, Any], *, timeout: float = 600.0) -> dict[str, Any]:
    """Launch the job for ``cfg`` (from :func:`make_config`) and return worker 0's result.

    Raises:
        RuntimeError: the job failed (the failing rank's message is included).
        TimeoutError: it ran past ``timeout`` seconds.
    """
    from ddpbench.launch import launch_logged

    servers = cfg["servers"] if isinstance(cfg["servers"], int) else 0
    with tempfile.TemporaryDirectory(prefix="ddpbench-train-") as tmp:
        out = Path(tmp) / "result.json"
        log = Path(tmp) / "log.txt"
        cmd = [sys.executable, "-m", "ddpbench.experiments.accuracy.worker", json.dumps(cfg), str(out)]
        rc = launch_logged(cmd, int(cfg["workers"]), servers, log=log, timeout=timeout)
        text = log.read_text(errors="replace")
        if rc == 124:
            raise TimeoutError(f"training did not finish in {timeout:g} s: {_tail(text)}")
        if rc != 0 or not out.exists():
            raise RuntimeError(f"training job failed (exit {rc}): {_tail(text)}")
        return json.loads(out.read_text())


def _tail(text: str, lines: int = 4) -> str:
    kept = [ln for ln in text.strip().splitlines() if ln.strip()]
    errs = [ln for ln in kept if "Error" in ln or "error" in ln]
    return " | ".join((errs or kept)[-lines:]) or "no output"


def is_torch_model(model: str) -> bool:
    """Return whether ``model`` names a PyTorch model (``torchvision:NAME``, ``pkg.mod:fn``)."""
    return ":" in str(model)


# -- worker side ------------------------------------------------------------------------------
def worker(cfg: dict[str, Any], out: str) -> None:
    """Train on this rank; worker 0 writes the result JSON to ``out``."""
    if is_torch_model(cfg["model"]):
        _torch_worker(cfg, out)
        return
    import numpy as np

    import ddpbench
    from ddpbench import nn
    from ddpbench.data import ShardedLoader, load_dataset

    knobs = dict(cfg["knobs"])
    if cfg["backend"] in PS_BACKENDS:
        knobs["servers"] = cfg["servers"]
    kv = ddpbench.create(cfg["backend"], **knobs)  # a server rank serves and exits here
    rank, size = kv.rank, kv.num_workers
    ds = load_dataset(cfg["dataset"], seed=cfg["seed"])
    if cfg["model"] == "cnn":
        ds = ds.as_images()
    model = nn.create_model(cfg["model"], num_classes=ds.num_classes,
                            seed=cfg["seed"] + 1000 * rank)
    ddpbench.broadcast_parameters(model.parameters(), root_rank=0, kv=kv)
    optimizer = nn.SGD(lr=cfg["lr"], momentum=cfg["momentum"])
    trainer = ddpbench.DistributedTrainer(
        model.parameters(), optimizer, kv=kv,
        gradient_predivide_factor=float(cfg["predivide"]),
        compression=None if cfg["compression"] == "none" else cfg["compression"],
        update_on_kvstore=bool(cfg["update_on_kvstore"]),
    )
    loader = ShardedLoader(ds.x_train, ds.y_train, cfg["batch_size"], rank=rank,
                           num_workers=size, seed=cfg["seed"])
    curve: dict[str, list] = {"step": [], "test_acc": [], "test_loss": [], "train_loss": []}
    step_times = []
    window = np.zeros(2, np.float64)  # loss sum and sample count since the last evaluation
    running = float("nan")

    def evaluate(step: int) -> None:
        logits = model.forward(ds.x_test)
        loss, _ = nn.softmax_cross_entropy(logits, ds.y_test)
        curve["step"].append(step)
        curve["test_acc"].append(100.0 * nn.accuracy(logits, ds.y_test))
        curve["test_loss"].append(loss / len(ds.y_test))
        curve["train_loss"].append(running)

    t_start = time.perf_counter()
    for step in range(cfg["steps"]):
        x, y = loader.batch(step)
        if cfg["lr_schedule"] == "cosine":
            # Decaying to 0 makes the final accuracy a property of the run, not of where
            # the last noisy step happened to land.
            trainer.set_learning_rate(
                cfg["lr"] * 0.5 * (1 + math.cos(math.pi * step / cfg["steps"])) or 1e-12)
        t0 = time.perf_counter()
        loss, d = nn.softmax_cross_entropy(model.forward(x), y)
        model.backward(d)
        trainer.step(cfg["batch_size"])
        step_times.append(time.perf_counter() - t0)
        window += (loss, len(y))
        last = step + 1 == cfg["steps"]
        if (step + 1) % cfg["eval_every"] == 0 or last:
            # Through the store, not a blocking MPI call on this thread: with colocated
            # parameter servers this process's engine must keep serving the others. With
            # an optimizer on the servers every push updates weights, so then the loss is
            # this worker's own.
            total = window if trainer.update_on_kvstore else \
                kv.push_pull("train.loss_window", window.copy(), op="sum")
            running, window[:] = float(total[0] / total[1]), 0.0
            if rank == 0:
                evaluate(step + 1)
    wall = time.perf_counter() - t_start
    flat = np.concatenate([p.data.reshape(-1) for p in model.parameters() if not p.distributed])
    if trainer.update_on_kvstore:
        kv.set_optimizer(None)  # plain reductions again (collective)
    _finish(kv, cfg, out, flat, curve=curve, running=running, wall=wall,
            step_times=step_times)


def _finish(kv: Any, cfg: dict[str, Any], out: str, flat: Any, **figures: Any) -> None:
    """Check that the replicas agree, close the store, and write worker 0's result.

    Root's parameters go out through the store, then every rank's largest difference comes
    back as a SUM of one-hot slots (an op every backend has). All of it through the store:
    after close() this process makes no MPI call of its own.
    """
    import numpy as np

    rank, size = kv.rank, kv.num_workers
    flat = np.ascontiguousarray(flat, np.float64)
    root = kv.broadcast("train.replica_check", flat.copy(), root_rank=0)
    diffs = np.zeros(size, np.float64)
    diffs[rank] = float(np.max(np.abs(root - flat), initial=0.0))
    diffs = kv.push_pull("train.replica_diffs", diffs, op="sum")
    kv.close()
    if rank != 0:
        return
    curve = figures["curve"]
    result = {
        "config": cfg, "curve": curve, "final_test_acc": curve["test_acc"][-1],
        "final_test_loss": curve["test_loss"][-1], "final_train_loss": figures["running"],
        "replica_max_diff": float(diffs.max()), "wall_s": figures["wall"],
        "step_time_ms": 1e3 * float(np.median(figures["step_times"])),
        "parameters": int(flat.size), "framework": figures.get("framework", "numpy"),
    }
    Path(out).write_text(json.dumps(result))


def _torch_worker(cfg: dict[str, Any], out: str) -> None:
    """Train a PyTorch model through :mod:`ddpbench.torch` on this rank (as :func:`worker`)."""
    import numpy as np
    import torch

    import ddpbench
    import ddpbench.torch as dt
    from ddpbench.data import ShardedLoader, load_dataset
    from ddpbench.profiling.model import build_model

    knobs = dict(cfg["knobs"])
    if cfg["backend"] in PS_BACKENDS:
        knobs["servers"] = cfg["servers"]
    kv = ddpbench.create(cfg["backend"], **knobs)  # a server rank serves and exits here
    rank, size = kv.rank, kv.num_workers
    torch.set_num_threads(1)  # several ranks share the cores
    ds = load_dataset(cfg["dataset"], seed=cfg["seed"]).as_images()
    torch.manual_seed(cfg["seed"] + 1000 * rank)  # replicas differ until the broadcast
    model, _ = build_model(cfg["model"])
    dt.broadcast_parameters(model, root_rank=0, kv=kv)
    base = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"])
    opt = dt.DistributedOptimizer(
        base, model.named_parameters(), kv=kv,
        compression="none" if cfg["compression"] == "none" else cfg["compression"],
        gradient_predivide_factor=float(cfg["predivide"]))
    loader = ShardedLoader(ds.x_train, ds.y_train, cfg["batch_size"], rank=rank,
                           num_workers=size, seed=cfg["seed"])
    x_test = torch.from_numpy(np.ascontiguousarray(ds.x_test, np.float32))
    y_test = torch.from_numpy(np.asarray(ds.y_test, np.int64))
    loss_fn = torch.nn.CrossEntropyLoss()
    curve: dict[str, list] = {"step": [], "test_acc": [], "test_loss": [], "train_loss": []}
    step_times = []
    window = np.zeros(2, np.float64)
    running = float("nan")

    def evaluate(step: int) -> None:
        model.eval()
        with torch.no_grad():
            logits = model(x_test)
            curve["test_loss"].append(float(loss_fn(logits, y_test)))
            curve["test_acc"].append(100.0 * float((logits.argmax(1) == y_test).float().mean()))
        model.train()
        curve["step"].append(step)
        curve["train_loss"].append(running)

    t_start = time.perf_counter()
    for step in range(cfg["steps"]):
        xb, yb = loader.batch(step)
        x = torch.from_numpy(np.ascontiguousarray(xb, np.float32))
        y = torch.from_numpy(np.asarray(yb, np.int64))
        if cfg["lr_schedule"] == "cosine":
            lr = cfg["lr"] * 0.5 * (1 + math.cos(math.pi * step / cfg["steps"])) or 1e-12
            for group in opt.param_groups:
                group["lr"] = lr
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        step_times.append(time.perf_counter() - t0)
        window += (float(loss) * len(y), len(y))
        if (step + 1) % cfg["eval_every"] == 0 or step + 1 == cfg["steps"]:
            total = kv.push_pull("train.loss_window", window.copy(), op="sum")
            running, window[:] = float(total[0] / total[1]), 0.0
            if rank == 0:
                evaluate(step + 1)
    wall = time.perf_counter() - t_start
    with torch.no_grad():
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    _finish(kv, cfg, out, flat, curve=curve, running=running, wall=wall,
            step_times=step_times, framework="torch")


if __name__ == "__main__":
    worker(json.loads(sys.argv[1]), sys.argv[2])
