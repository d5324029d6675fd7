"""PyTorch front end: Horovod's ``DistributedOptimizer`` and broadcasts on any backend.

The names and arguments are Horovod's (``horovod.torch``); the store is any backend that
``ddpbench.create`` makes, so switching the communication scheme is a change of one name::

    import ddpbench
    import ddpbench.torch as dt

    kv = ddpbench.create("p3")                       # or mpi, horovod, collective, kvstore, byteps
    model = Net()                                    # lazy modules welcome
    dt.broadcast_parameters(model, root_rank=0, kv=kv)
    opt = dt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  model.named_parameters(), kv=kv,
                                  compression=dt.Compression.fp16)
    dt.broadcast_optimizer_state(opt, root_rank=0, kv=kv)
    for x, y in loader:                              # this rank's shard
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()     # gradients leave as they are ready
        opt.step()                                   # waits for them, then updates

Sharded data parallelism (ZeRO stages, FSDP's strategies) is
:class:`FullyShardedDataParallel` over a ``zero`` or ``fsdp`` store (``ddpbench.torch.sharded``).

Needs the ``torch`` extra (``pip install 'ddpbench[torch]'``). CPU tensors are shared with
the backends as NumPy arrays (no copies); CUDA tensors go to CuPy through DLPack.
"""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401 - fail here with the install hint
except ImportError as err:  # pragma: no cover - the torch extra is missing
    raise ImportError("ddpbench.torch needs PyTorch: pip install 'ddpbench[torch]'") from err

from ddpbench.torch.compression import Compression, Compressor
from ddpbench.torch.functions import broadcast_optimizer_state, broadcast_parameters
from ddpbench.torch.optimizer import DistributedOptimizer
from ddpbench.torch.sharded import FullyShardedDataParallel

__all__ = ["Compression", "Compressor", "DistributedOptimizer", "FullyShardedDataParallel",
           "broadcast_optimizer_state", "broadcast_parameters"]
