"""The ``zero`` and ``fsdp`` backends: sharded data parallelism over MPI (being built)."""

from __future__ import annotations

from typing import Any

from ddpbench.api import register
from ddpbench.backends.mpi import MPIStore
from ddpbench.contract import FsdpKnobs, ZeroKnobs


@register("zero")
class ZeroStore(MPIStore):
    """DeepSpeed's ZeRO over MPI (the engine follows in the next commits)."""

    Options = ZeroKnobs  # type: ignore[assignment]

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)


@register("fsdp")
class FsdpStore(ZeroStore):
    """PyTorch FSDP's sharding strategies on the ``zero`` engine."""

    Options = FsdpKnobs  # type: ignore[assignment]
