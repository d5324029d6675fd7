"""What a strategy may use of a running simulation (the simulation implements it).

Strategies are typed against this protocol rather than against the simulation class, so the
simulation (:mod:`.core`) can import the strategies without the two importing each other.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import numpy as np

from ddpbench.hardware import NcclFabric
from ddpbench.simulator.network import CountingEnvironment, Network
from ddpbench.simulator.workload import Workload

__all__ = ["SimContext", "Span", "new_span"]


class Span(NamedTuple):
    """One compute span or transfer on the timeline (times in seconds)."""

    host: str
    kind: str  # forward | backward | allreduce | push | pull | sum
    layer: int
    start: float
    end: float
    bytes: int
    peer: str = ""  # receiver of a transfer, or the worker whose push a sum adds


new_span = tuple.__new__
"""``new_span(Span, (host, kind, layer, start, end, bytes, peer))``: a span without the named
tuple's Python-level constructor, for the few made per message."""


class SimContext(Protocol):
    """The state and helpers of one simulation that strategies read and drive."""

    env: CountingEnvironment
    workload: Workload
    workers: int
    gpus: int
    num_hosts: int
    hosts: list[str]  # host names by index: workers' hosts, then dedicated servers
    latency: float
    per_message: float
    intra_bandwidth: float
    local_bandwidth: float  # each GPU's own path over the intra-host link
    intra_latency: float
    intra_link: str
    nccl: float | None  # the GPUs' compute capability where rings run NCCL's model
    nccl_proto: dict[str, int]  # the protocols NCCL may use (hardware.nccl_protocols)
    nccl_release: tuple[int, int, int]  # the NCCL release (hardware.nccl_release)
    nccl_algo: dict[str, int]  # the allreduce algorithms NCCL may use (hardware.nccl_algorithms)
    nccl_channels: int  # NCCL's channels through each of a host's NICs
    nccl_fabric: NcclFabric  # the network as NCCL's tuner knows it
    nics: int  # NICs per host (rail-optimised)
    nvls_bandwidth: float  # bytes/s of bus bandwidth of an NVLS allreduce in a host, 0 = none
    nic_path_bandwidth: float  # bytes/s the GPUs' PCIe paths take to several NICs at once
    mpich: bool  # the MPI library's allreduce runs MPICH's algorithm (a real transport)
    negotiation: float
    summation: float
    update: float
    server_thread: float  # bytes/s of memory traffic of an MXNet server thread, 0 = free
    itemsize: int
    num_servers: int
    timeline: list[Any]
    trace_steps: bool
    trace_sums: bool
    net: Network | None
    ring_bandwidth: float
    flow_bandwidth: float
    remaining: list[list[int]]  # per group and layer: units not yet back this iteration
    iterations: int  # iterations the training loop runs (set before Strategy.start)

    def host_name(self, h: int) -> str:
        """Return the name of host ``h`` (``worker3``, ``server0``)."""

    def server_host(self, j: int) -> int:
        """Return the host index of parameter server ``j``."""

    def net_seq(self) -> int:
        """Return the next sequence number (deterministic tie-breaks)."""

    def span(self, host: int, kind: str, layer: int, start: float, end: float, nbytes: int,
             peer: int | str = "") -> Any:
        """Return a timeline span of ``host``."""

    def add_sent_all(self, per_rank: np.ndarray) -> None:
        """Count ``per_rank`` bytes sent by every worker of a ring (and received by the next)."""

    def add_sent_hosts(self, nbytes: float) -> None:
        """Count ``nbytes`` sent and received by every worker host's NIC."""

    def unit_done(self, w: int, layer: int) -> None:
        """One unit of ``layer`` is back, updated, on worker ``w``."""

    def comm_begin(self, w: int = 0) -> None:
        """A collective on group ``w``'s GPUs starts now (it slows their compute)."""

    def comm_end(self, w: int = 0) -> None:
        """The collective :meth:`comm_begin` announced ends now."""
