"""Every backend on every transport over a grid of hosts x GPUs per host (1x1 .. 4x8).

Each point must finish; the bytes on each NIC must be what the scheme's closed form says;
one host with g GPUs must be a g-GPU ring over the intra-host link, whatever the NIC.
"""

from __future__ import annotations

import math

import pytest

from ddpbench import contract, hardware
from ddpbench.rules import placement
from ddpbench.simulator import simulate, simulate_collective
from ddpbench.simulator.workload import ITEMSIZE, Layer, Tensor, Workload

HOSTS = (1, 2, 3, 4)
GPUS = (1, 2, 3, 4, 8)
TRANSPORTS = tuple(sorted(hardware.TRANSPORTS))
ALLREDUCE = ("mpi", "horovod", "collective")
PS = ("kvstore", "p3", "byteps")

# Three layers whose tensors are not multiples of any GPU count; the last one is split by
# every parameter-server placement (over kvstore's big-array bound and p3's slice).
TINY = Workload(
    name="tiny", batch_size=8,
    layers=(Layer(name="a", fwd_s=1e-3, bwd_s=2e-3), Layer(name="b", fwd_s=1e-3, bwd_s=2e-3),
            Layer(name="c", fwd_s=1e-3, bwd_s=2e-3)),
    tensors=(Tensor(name="a.w", numel=10_007, layer=0), Tensor(name="a.b", numel=13, layer=0),
             Tensor(name="b.w", numel=250_001, layer=1),
             Tensor(name="c.w", numel=1_200_007, layer=2)))
N = sum(t.numel for t in TINY.tensors)


def _bytes_per_server(backend: str, servers: int) -> list[int]:
    """Bytes of the gradients each colocated server holds, by the backend's own rule."""
    k = contract.defaults(backend, "sim")
    on = [0] * servers
    keys = placement.declared_keys(backend, [t.name for t in TINY.tensors])
    for key, t in zip(keys, TINY.tensors):
        if backend == "kvstore":
            parts = placement.kvstore_parts(key, t.numel, k["bigarray_bound"], servers)
        elif backend == "p3":
            parts = placement.p3_parts(key, t.numel, k["slice_params"], servers)
        else:
            parts = placement.byteps_parts(key, t.numel, k["partition_bytes"] // ITEMSIZE,
                                           servers)
        for part in parts:
            on[part.server] += part.count * ITEMSIZE
    return on


SIZE = {t.name: t.numel for t in TINY.tensors}


def _mpich_nic_bytes(numel: int, p: int, g: int) -> float:
    """Bytes one host's NIC sends for MPICH's allreduce of ``numel`` elements over ``p``
    ranks, ``g`` per host: recursive doubling up to 2048 bytes (or fewer elements than the
    largest power of two up to p), else Rabenseifner's halving and doubling, with a fold to
    that power of two and back; a step at partner distance d crosses hosts when d >= g."""
    nbytes = numel * ITEMSIZE
    pof2 = 1 << (p.bit_length() - 1)
    k = pof2.bit_length() - 1
    fold = [(1, nbytes)] if p > pof2 else []
    if nbytes <= 2048 or numel < pof2:
        core = [(1 << i, nbytes) for i in range(k)]
    else:
        halves = [(1 << i, nbytes / 2 ** (i + 1)) for i in range(k)]
        core = halves + halves[::-1]
    return sum(g * size for d, size in fold + core + fold if d >= g)


def _run(backend: str, hosts: int, gpus: int, transport: str, **kw):
    return simulate(TINY, backend, hosts=hosts, gpus_per_host=gpus, transport=transport,
                    bandwidth_gbps=10, iterations=2, warmup=1, **kw)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("backend", ALLREDUCE + PS)
def test_every_backend_finishes_on_every_grid_point_with_the_closed_form_nic_bytes(
        backend, transport):
    for hosts in HOSTS:
        for gpus in GPUS:
            r = _run(backend, hosts, gpus, transport)
            where = f"{backend} on {hosts} x {gpus} over {transport}"
            assert r.iteration_time_s > 0 and math.isfinite(r.iteration_time_s), where
            assert r.hosts == hosts and r.gpus_per_host == gpus, where
            sent, recv = r.bytes_sent, r.bytes_received
            assert len(sent) == hosts, where  # colocated servers: no server hosts
            if backend in ("mpi", "horovod") and transport != "ideal":
                # MPI_Allreduce as MPICH runs it: every step whose partner lies on another
                # host sends each of the host's ranks' share through its NIC.
                p = hosts * gpus
                msgs = ([t.numel for t in TINY.tensors] if backend == "mpi" else
                        [sum(SIZE[name] for name in names) for _, names in r.fusion_groups])
                per_iteration = len(msgs) / (1 if backend == "mpi" else 2)
                want = sum(_mpich_nic_bytes(m, p, gpus) for m in msgs) / len(msgs) \
                    * per_iteration if hosts > 1 else 0.0
                for v in sent.values():
                    assert v == pytest.approx(want, rel=1e-12), where
            elif backend in ALLREDUCE:
                # A flat ring over p = hosts x gpus ranks: each host's one cross-host edge
                # carries 2 (p-1)/p of the gradients; one host has no cross-host edge.
                p = hosts * gpus
                want = 0.0 if hosts == 1 else 2 * (p - 1) / p * N * ITEMSIZE
                if gpus == 1:  # per rank, the ring's chunking: the sum is exact
                    assert sum(sent.values()) == pytest.approx(hosts * want, rel=1e-12), where
                    for v in sent.values():
                        assert v == pytest.approx(want, rel=1e-4), where
                else:
                    for v in sent.values():
                        assert v == pytest.approx(want, rel=1e-12), where
            else:
                # Host j pushes every part placed elsewhere and answers the other hosts'
                # pushes of the parts placed on it; its own parts never cross its NIC.
                on = _bytes_per_server(backend, hosts)
                for j, name in enumerate(sent):
                    want = (N * ITEMSIZE - on[j]) + (hosts - 1) * on[j]
                    assert sent[name] == pytest.approx(want, rel=1e-12), (where, name)
                    assert recv[name] == pytest.approx(want, rel=1e-12), (where, name)
            assert sum(sent.values()) == pytest.approx(sum(recv.values()), rel=1e-12), where


@pytest.mark.parametrize("gpus", [2, 3, 4, 8])
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_one_host_with_g_gpus_is_a_g_gpu_ring_over_the_intra_host_link(gpus, transport):
    # The flat ring and Horovod's hierarchical allreduce both reduce over the host's link:
    # 2 (g-1) steps of latency plus the largest chunk, whatever the NIC and transport.
    n = 1_000_003
    link = hardware.intra_link("nvlink")
    step = link.latency_us * 1e-6 + math.ceil(n / gpus) / (link.bandwidth_gbps * 1e9 / 8)
    want = 2 * (gpus - 1) * step
    for hierarchical in (False, True):
        for bw in (1, 100):
            got = simulate_collective("allreduce", n, hosts=1, gpus_per_host=gpus,
                                      bandwidth_gbps=bw, transport=transport,
                                      intra_link="nvlink", hierarchical=hierarchical)
            assert got == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("backend", ALLREDUCE)
@pytest.mark.parametrize("gpus", [2, 3, 8])
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_training_on_one_host_does_not_depend_on_the_nic(backend, gpus, transport):
    def run(bw: float) -> float:
        return simulate(TINY, backend, hosts=1, gpus_per_host=gpus, transport=transport,
                        bandwidth_gbps=bw, iterations=2, warmup=1).iteration_time_s

    assert run(1) == run(100)


def test_mpi_on_one_host_with_one_tensor_is_compute_plus_mpichs_allreduce_in_the_host():
    # One tensor: the allreduce starts when backward ends and the next forward waits for it.
    # MPICH's Rabenseifner at 4 ranks: halves of 1/2 and 1/4 of the message at distances 1
    # and 2, then back, every partner on the host (its link); the ideal network's ring.
    one = Workload(name="one", batch_size=8, layers=(Layer(name="a", fwd_s=1e-3, bwd_s=2e-3),),
                   tensors=(Tensor(name="a.w", numel=3_000_001, layer=0),))
    g = 4
    link = hardware.intra_link("pcie")
    a, bw = link.latency_us * 1e-6, link.bandwidth_gbps * 1e9 / 8
    nbytes = 3_000_001 * ITEMSIZE
    mpich = 4 * a + 2 * (nbytes / 2 + nbytes / 4) / bw
    r = simulate(one, "mpi", hosts=1, gpus_per_host=g, bandwidth_gbps=10, transport="tcp",
                 iterations=3, warmup=1)
    assert r.iteration_time_s == pytest.approx(3e-3 + mpich, rel=1e-12)
    ring = 2 * (g - 1) * (a + math.ceil(3_000_001 / g) * ITEMSIZE / bw)
    ideal = simulate(one, "mpi", hosts=1, gpus_per_host=g, bandwidth_gbps=10,
                     iterations=3, warmup=1)
    assert ideal.iteration_time_s == pytest.approx(3e-3 + ring, rel=1e-12)


@pytest.mark.parametrize("backend", ALLREDUCE)
def test_the_simulate_command_on_one_host_of_four_gpus_prints_a_result(backend, capsys):
    from ddpbench.cli import main

    assert main(["simulate", "-w", "resnet50", "-b", backend, "--hosts", "1",
                 "--gpus-per-host", "4"]) == 0
    out = capsys.readouterr().out
    assert "1 hosts x 4 GPUs" in out and "samples/s" in out


@pytest.mark.parametrize("gpus", [2, 4, 5, 8])
def test_a_pcie_ring_beyond_one_switch_runs_at_the_cross_switch_rate(gpus):
    # Four GPUs share a PCIe switch; a ring over more crosses between the two switches
    # through the CPU at the cross-switch figure (NVIDIA/nccl issue #44: 8.23 GB/s).
    link = hardware.intra_link("pcie")
    assert link.switch_gpus == 4
    gbps = link.bandwidth_gbps if gpus <= 4 else link.cross_gbps
    n = 10_000_001
    want = 2 * (gpus - 1) * (link.latency_us * 1e-6 + math.ceil(n / gpus) / (gbps * 1e9 / 8))
    got = simulate_collective("allreduce", n, hosts=1, gpus_per_host=gpus, bandwidth_gbps=10,
                              intra_link="pcie")
    assert got == pytest.approx(want, rel=1e-12)
    assert hardware.intra_link("nvlink").ring_gbps(8) == hardware.intra_link("nvlink").bandwidth_gbps


def test_a_parameter_server_host_reduces_its_gpus_without_crossing_the_switches():
    # One layer, one host of 8 PCIe GPUs, ideal network, free servers: the host reduces its
    # GPUs' gradients and broadcasts the sum back, each at one GPU's own path to the host.
    one = Workload(name="one", batch_size=8, layers=(Layer(name="a", fwd_s=0.0, bwd_s=0.0),),
                   tensors=(Tensor(name="a.w", numel=8_000_000, layer=0),))
    link = hardware.intra_link("pcie")
    each = link.latency_us * 1e-6 + 7 / 8 * 32e6 / (link.bandwidth_gbps * 1e9 / 8)
    r = simulate(one, "byteps", hosts=1, gpus_per_host=8, bandwidth_gbps=10, iterations=2,
                 summation_gbps=math.inf)
    assert r.iteration_time_s == pytest.approx(2 * each, rel=1e-12)


@pytest.mark.parametrize("hosts,steps", [(2, 1), (3, 3), (4, 2), (5, 4), (8, 3)])
def test_a_small_mpi_allreduce_across_hosts_goes_by_mpichs_recursive_doubling(hosts, steps):
    # 500 elements (2000 bytes, within MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE): log2(pof2)
    # exchanges of the whole message, plus a fold and an unfold when the ranks are not a
    # power of two; each step a latency, the transport's message cost and the bytes.
    one = Workload(name="one", batch_size=8, layers=(Layer(name="a", fwd_s=0.0, bwd_s=0.0),),
                   tensors=(Tensor(name="a.w", numel=500, layer=0),))
    r = simulate(one, "mpi", hosts=hosts, bandwidth_gbps=10, latency_us=5, transport="rdma",
                 iterations=3, warmup=1)
    tr = hardware.transport("rdma")
    step = 5e-6 + tr.per_message_us * 1e-6 + 2000 / (10e9 / 8 * tr.efficiency * tr.duplex)
    assert r.iteration_time_s == pytest.approx(steps * step, rel=1e-12)
