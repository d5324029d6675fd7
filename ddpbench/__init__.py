"""ddpbench: simulate and benchmark gradient communication for data-parallel training.

The unified API lives in :mod:`ddpbench.api` and is re-exported here. Heavier parts
(``DistributedTrainer``, ``broadcast_parameters``, ``nn``) are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from ddpbench.api import (
    BackendOptions,
    Handle,
    KVStore,
    NotSupportedError,
    ReduceOp,
    available,
    create,
    register,
)

__version__ = "0.1.0"

# name -> module that defines it, imported lazily so `import ddpbench` stays light.
_LAZY = {
    "DistributedTrainer": "ddpbench.trainer",
    "SGD": "ddpbench.optim",
    "broadcast_parameters": "ddpbench.trainer",
    "init": "ddpbench.comm",
    "nn": "ddpbench.nn",
    "numerics": "ddpbench.numerics",
}

__all__ = [
    "BackendOptions",
    "Handle",
    "KVStore",
    "NotSupportedError",
    "ReduceOp",
    "available",
    "create",
    "register",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(_LAZY[name])
        return module if module.__name__.endswith("." + name) else getattr(module, name)
    raise AttributeError(f"module 'ddpbench' has no attribute {name!r}")
