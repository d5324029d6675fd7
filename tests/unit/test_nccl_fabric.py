"""Today's clusters: NVSwitch presets, several NICs per host, ib/roce/efa, NCCL's NVLS and
CollNet algorithms. Expected values are closed forms or tuning.cc's formulas worked by hand."""

from __future__ import annotations

import math

import pytest

from ddpbench import contract, hardware, simulator
from ddpbench.simulator import simulate, simulate_collective
from ddpbench.simulator.core import _Sim


def _one_part(numel: int) -> simulator.Workload:
    return simulator.Workload.from_dict({"name": "one", "batch_size": 1, "device": "V100",
                                         "matmul_fraction": 0.5, "layers": [
        {"name": "l0", "fwd_ms": 0, "bwd_ms": 0, "tensors": [{"name": "t0", "numel": numel}]}]})


def _on(states: dict[str, int]) -> set[str]:
    return {a for a, on in states.items() if on}


# ------------------------------------------------------------------ presets and transports


def test_new_presets_name_their_link_row_and_nvls():
    assert hardware.intra_link("pcie4").nccl_hw == "pcie"
    assert hardware.intra_link("nvlink4-nvswitch").nccl_hw == "nvlink"
    assert hardware.intra_link("nvlink").nccl_hw == "nvlink"  # the old presets: their name
    assert hardware.intra_link("nvlink3-nvswitch").nvls_gbps is None  # no NVLink SHARP
    for name in ("nvlink3-nvswitch", "nvlink4-nvswitch", "nvlink5-nvswitch"):
        link = hardware.intra_link(name)
        assert link.nvswitch and link.nvlink_gbytes > 0 and link.source
    # the NVLS bus bandwidth above the ring's, as the maintainer's 480 against 370 GB/s
    h100 = hardware.intra_link("nvlink4-nvswitch")
    assert h100.bandwidth_gbps / 8 == pytest.approx(370.0)
    assert h100.nvls_gbps is not None and h100.nvls_gbps / 8 == pytest.approx(480.0)


def test_the_networks_own_latency_reaches_nccls_net_step():
    efa, ib, tcp = (hardware.transport(t) for t in ("efa", "ib", "tcp"))
    assert hardware.nccl_net_latency_us(efa) == 75.0 + 3.0  # plugin latency + per message
    assert hardware.nccl_net_latency_us(ib) == 0.0 + 1.0
    assert hardware.nccl_net_latency_us(efa, per_message_us=10.0) == 85.0
    assert hardware.nccl_net_latency_us(tcp) == 0.0  # before: NCCL's table alone
    assert hardware.nccl_net_latency_us(tcp, per_message_us=7.0) == 7.0
    # A Simple ring over 4 hosts of one GPU: 2 x 4 steps cross hosts, each adds the
    # network's latency twice (latencyInter, then the flush), times the 1.4 plateau.
    kw = dict(protocols=hardware.nccl_protocols("Simple"))
    _, base, _ = hardware.nccl_ring("allreduce", 1 << 20, 4, 4, "pcie", 8.0, 1e-3, **kw)
    _, more, _ = hardware.nccl_ring("allreduce", 1 << 20, 4, 4, "pcie", 8.0, 1e-3, **kw,
                                    net_us=78.0)
    assert more - base == pytest.approx(2 * 4 * 2 * 78.0 * 1.4 * 1e-6)
    # before 2.18.1 no flush term: the network's latency once per step
    old = dict(kw, release=(2, 17, 1))
    _, base, _ = hardware.nccl_ring("allreduce", 1 << 20, 4, 4, "pcie", 8.0, 1e-3, **old)
    _, more, _ = hardware.nccl_ring("allreduce", 1 << 20, 4, 4, "pcie", 8.0, 1e-3, **old,
                                    net_us=78.0)
    assert more - base == pytest.approx(2 * 4 * 78.0 * 1.4 * 1e-6)


def test_per_message_us_now_moves_nccls_pricing_and_the_default_does_not():
    kw: dict = dict(hosts=2, bandwidth_gbps=100, device="V100", transport="tcp",
                    nccl_proto="Simple", nccl_algo="Ring")
    base = simulate_collective("allreduce", 1 << 12, **kw)
    same = simulate_collective("allreduce", 1 << 12, **kw, per_message_us=0.0)
    slower = simulate_collective("allreduce", 1 << 12, **kw, per_message_us=50.0)
    assert same == base
    # 2 hosts of one GPU: 2 x 2 net steps of 2 x 50 us, times the plateau (1.9 on a V100)
    assert slower - base == pytest.approx(4 * 2 * 50e-6 * 1.9, rel=1e-9)


# ------------------------------------------------------------------ several NICs


@pytest.mark.parametrize("nics", [1, 2, 4])
def test_nccl_ring_spreads_over_the_nics_closed_form(nics):
    # 4 hosts of one GPU over ib, NCCL's Simple ring: 2 (p-1) steps of a chunk n/p each,
    # the host's bytes spread over its NICs (rail-optimised channels); the GPU's PCIe 5.0
    # path (48 GB/s) takes four NICs of 12 GB/s.
    n, p = 1 << 22, 4
    kw: dict = dict(workers=p, bandwidth_gbps=100, device="V100", transport="ib",
                    nccl_proto="Simple", nccl_algo="Ring", nics_per_host=nics,
                    intra_link="pcie5")
    t = simulate_collective("allreduce", 4 * n, **kw)
    bw = 100e9 / 8 * hardware.transport("ib").efficiency
    tx = 2 * (p - 1) * (n // p * 4) / (nics * bw)
    _, lat, _ = hardware.nccl_ring("allreduce", 4 * n, p, p, "pcie", 7.0, tx,
                                   hardware.nccl_protocols("Simple"), net_us=1.0)
    assert t == pytest.approx(lat + tx, rel=1e-9)
    r = simulate(_one_part(n), "mpi", iterations=1, warmup=0, trace=False, **kw)
    per_nic = {h: b / nics for h, b in r.bytes_sent.items()}
    net, _ = hardware.nccl_link_bytes("Ring", 4 * n, p, p, nics)
    assert per_nic == {f"worker{h}": pytest.approx(net) for h in range(p)}
    assert net == pytest.approx(2 * (p - 1) / p * 4 * n / nics)
    # over PCIe 3.0 one GPU's x16 path (12 GB/s) cannot feed two NICs of 12 GB/s
    slow = simulate_collective("allreduce", 4 * n, **{**kw, "intra_link": "pcie"})
    tx = 2 * (p - 1) * (n // p * 4) / (min(nics * bw, 96e9 / 8))
    assert slow == pytest.approx(lat + tx, rel=1e-9)


def test_parameter_servers_keep_one_nic_and_mpi_one_per_process():
    wl = _one_part(4_000_000)
    kw: dict = dict(workers=4, bandwidth_gbps=10, transport="tcp", iterations=2, trace=False)
    one = simulate(wl, "kvstore", **kw)
    four = simulate(wl, "kvstore", **kw, nics_per_host=4)
    assert four.iteration_time_s == one.iteration_time_s  # ps-lite binds one interface
    assert four.bytes_sent == one.bytes_sent
    c = contract.Cluster(hosts=2, gpus_per_host=4, nics_per_host=8, transport="tcp")
    from ddpbench.simulator.strategies import _host_nics

    sim = _Sim(None, c)
    assert sim.nccl is None and _host_nics(sim) == 1 and _host_nics(sim, 4) == 4
    c = contract.Cluster(hosts=2, gpus_per_host=4, nics_per_host=8, transport="ib",
                         device="H100")
    assert _host_nics(_Sim(None, c)) == 8


def test_link_bytes_closed_forms():
    n = 1 << 30
    assert hardware.nccl_link_bytes("Tree", n, 16, 2, 4) == (n / 4, n)
    assert hardware.nccl_link_bytes("NVLSTree", n, 16, 2, 8) == (n / 8, n * (1 + 1 / 8))
    assert hardware.nccl_link_bytes("NVLS", n, 8, 1) == (0.0, n * (1 + 1 / 8))
    assert hardware.nccl_link_bytes("CollNetDirect", n, 32, 4, 8) == (n / 8, 2 * 7 / 8 * n)
    with pytest.raises(ValueError, match="algorithm"):
        hardware.nccl_link_bytes("PAT", n, 8, 8)


# ------------------------------------------------------------------ the tuner's choice


def test_which_algorithms_a_topology_allows():
    allowed = hardware.nccl_allowed
    assert allowed("NVLS", 8, 1, "nvlink4-nvswitch", 9.0)
    assert not allowed("NVLS", 8, 1, "nvlink3-nvswitch", 8.0)  # an A100 board: no SHARP
    assert not allowed("NVLS", 8, 1, "nvlink", 9.0)  # no NVSwitch
    assert not allowed("NVLS", 16, 2, "nvlink4-nvswitch", 9.0)  # across hosts: CollNet
    assert allowed("NVLS", 16, 2, "nvlink4-nvswitch", 9.0, collnet=True)
    assert allowed("NVLSTree", 16, 2, "nvlink4-nvswitch", 9.0)
    assert not allowed("NVLSTree", 8, 1, "nvlink4-nvswitch", 9.0)
    assert not allowed("CollNetChain", 16, 2, "pcie", 8.0)
    assert allowed("CollNetChain", 16, 2, "pcie", 8.0, collnet=True)
    assert not allowed("CollNetDirect", 16, 2, "pcie", 8.0, collnet=True)  # no NVSwitch
    # reduce-scatter and allgather across hosts: the network's collective and a NIC per GPU
    rs = dict(coll="reduce_scatter", collnet=True)
    assert allowed("NVLS", 16, 2, "nvlink4-nvswitch", 9.0, nics=8, **rs)
    assert not allowed("NVLS", 16, 2, "nvlink4-nvswitch", 9.0, nics=4, **rs)
    assert not allowed("NVLSTree", 16, 2, "nvlink4-nvswitch", 9.0, coll="all_gather")
    assert allowed("PAT", 8, 8, "pcie", 9.0, coll="all_gather")
    assert not allowed("PAT", 8, 8, "pcie", 9.0)  # never an allreduce


def _nvls_h100_bus() -> float:
    # tuning.cc: 8 channels (one per GPU) at 40 GB/s (8 x 50 > 18 x 20.6 of NVLink) x
    # nvlsEfficiency 0.85 x 7/8, twice for an allreduce
    return 8 * 40 * 0.85 * 7 / 8 * 2


@pytest.mark.parametrize("nbytes", [1 << 16, 1 << 30])
def test_one_h100_node_picks_nvls_for_large_allreduces_by_tuning_cc(nbytes):
    r = 8
    ring_t = 2 * (r - 1) / r * nbytes / 370e9  # the simulator's ring of Simple bytes
    choice = hardware.nccl_allreduce(nbytes, r, 1, "nvlink4-nvswitch", 9.0, ring_t)
    # NVLS: latency 25 us (hwLat NVLink), bandwidth busBw x r / (2 (r-1))
    nvls = 25e-6 + nbytes / (_nvls_h100_bus() * r / (2 * (r - 1)) * 1e9)
    # the ring's protocols (LL at a quarter of the rate, LL128 at 0.92, Simple)
    ring = min(6.6e-6 + 14 * 0.6e-6 + ring_t * 4, 14e-6 + 14 * 1.9e-6 + ring_t / 0.92,
               8.4e-6 + 14 * 3.4e-6 + ring_t)
    # the tree on one host: a chain of 7 hops each way; LL128 at 7/9 on one node
    k = int(math.log2(nbytes >> 6))
    tree_bytes = ring_t * r / (2 * (r - 1)) / 0.46
    ll128 = hardware.NCCL_PROTOCOLS[1].tree_correction[k] if k < 23 else 1.0
    simple = hardware.NCCL_PROTOCOLS[2].tree_correction[k] if k < 23 else 1.0
    ll = hardware.NCCL_PROTOCOLS[0].tree_correction[k] if k < 23 else 1.0
    tree = min(6.8e-6 + 2 * 7 * 0.6e-6 + tree_bytes / (ll / 3.8),
               14e-6 + 2 * 7 * 1.25e-6 + tree_bytes / (7 / 9 * ll128),
               2 * 7 * 28e-6 + tree_bytes / simple)
    expected = min((tree, "Tree"), (ring, "Ring"), (nvls, "NVLS"), key=lambda x: x[0])[1]
    assert choice.algorithm == expected
    assert choice.algorithm == ("NVLS" if nbytes == 1 << 30 else "Ring")
    # releases before NVLS choose as they did
    old = hardware.nccl_allreduce(nbytes, r, 1, "nvlink4-nvswitch", 9.0, ring_t,
                                  release=(2, 16, 5))
    assert old.algorithm in ("Ring", "Tree")


def test_two_h100_nodes_choose_between_ring_and_nvlstree_by_hand():
    n, r = 1 << 30, 16
    ring_t = 2 * (r - 1) / r * n / 384e9  # a ring at 8 NICs of 48 GB/s
    fab = hardware.NcclFabric(net_us=1.0, nics=8, nic_gbytes=50.0)
    simple = hardware.nccl_protocols("Simple")
    algos = hardware.nccl_algorithms("Ring,NVLSTree")
    choice = hardware.nccl_allreduce(n, r, 2, "nvlink4-nvswitch", 9.0, ring_t, simple,
                                     algorithms=algos, fabric=fab)
    # ring Simple: 8.4 + 26 intra steps at 3.4 + 4 net steps at 14 + 2 x 1, x 1.4 plateau
    ring = (8.4 + 26 * 3.4 + 4 * 16.0) * 1.4e-6 + ring_t
    # NVLSTree: min(NVLS in the host, NICs x 2 on two nodes, 8 channels x 57.7) x r/(2(r-1))
    bus = min(_nvls_h100_bus(), 8 * 50.0 * 2, 8 * 57.7)
    nvlstree = (25 + 2 * 1 * (20.9 + 2 * 1.0)) * 1e-6 + n / (bus * r / (2 * (r - 1)) * 1e9)
    assert choice.algorithm == ("NVLSTree" if nvlstree < ring else "Ring") == "NVLSTree"
    assert choice.time_s == pytest.approx(nvlstree)
    # at 64 KiB the latency decides: the ring's (LL on) against NVLSTree's 70.8 us
    small = hardware.nccl_allreduce(1 << 16, r, 2, "nvlink4-nvswitch", 9.0,
                                    ring_t * (1 << 16) / n, algorithms=algos, fabric=fab)
    assert small.algorithm == "Ring"


def test_collnet_needs_the_switch_and_wins_across_hosts_when_it_reduces():
    n, r = 1 << 28, 32
    ring_t = 2 * (r - 1) / r * n / 50e9
    off = hardware.nccl_allreduce(n, r, 4, "nvlink3-nvswitch", 8.0, ring_t,
                                  fabric=hardware.NcclFabric(nics=8, nic_gbytes=25.0))
    assert off.algorithm in ("Ring", "Tree")
    fab = hardware.NcclFabric(nics=8, nic_gbytes=25.0, collnet=True)
    algos = hardware.nccl_algorithms("Ring,CollNetChain", (2, 20, 3))
    on = hardware.nccl_allreduce(n, r, 4, "nvlink3-nvswitch", 8.0, ring_t,
                                 hardware.nccl_protocols("Simple"), algorithms=algos,
                                 fabric=fab)
    # CollNetChain: bus min(ring 50, NICs 200) at half as algorithm bandwidth; latency
    # 2 x 7 x 2.8 + 30 us; the ring: 8.4 + 24 x 3.4 + 8 x 14, x 1.4
    chain = (2 * 7 * 2.8 + 30) * 1e-6 + n / (50 * 0.5 * 1e9)
    ring = (8.4 + (62 - 8) * 3.4 + 8 * 14.0) * 1.4e-6 + ring_t
    assert on.algorithm == ("CollNetChain" if chain < ring else "Ring")


def test_reduce_scatter_and_allgather_costs():
    n, r = 1 << 30, 8
    t = (r - 1) / r * n / 370e9
    rs = hardware.nccl_collective("reduce_scatter", n, r, 1, "nvlink4-nvswitch", 9.0, t)
    # NVLS: 8 x 40 x 0.85 x 7/8 x 7/8 GB/s for the whole buffer, against the ring at 370
    nvls = 25e-6 + n / (8 * 40 * 0.85 * 7 / 8 * 7 / 8 * 1e9)
    ring = 8.4e-6 + 7 * 3.4e-6 + t
    assert rs.algorithm == ("NVLS" if nvls < ring else "Ring") == "Ring"
    only = hardware.nccl_collective("all_gather", n, r, 1, "nvlink4-nvswitch", 9.0, t,
                                    algorithms=hardware.nccl_algorithms("NVLS"))
    assert only.algorithm == "NVLS" and only.time_s == pytest.approx(nvls)
    # PAT (from 2.23.4) with one GPU per host, 0.75 of the ring's bus bandwidth
    pat = hardware.nccl_collective("all_gather", 1 << 12, 64, 64, "pcie", 9.0, 1e-9,
                                   release=(2, 30, 7),
                                   algorithms=hardware.nccl_algorithms("PAT", (2, 30, 7)))
    lat = 8.0 + 6 * 14.0 / 3.5 + 64 * 2.8
    assert pat.algorithm == "PAT" and pat.latency_s == pytest.approx(lat * 1e-6)
    with pytest.raises(ValueError, match="coll"):
        hardware.nccl_collective("alltoall", n, r, 1, "pcie", 9.0, t)


def test_simulator_runs_nvls_at_the_links_rate():
    n, g = 1 << 30, 8
    kw: dict = dict(hosts=1, gpus_per_host=g, device="H100", transport="ib",
                    intra_link="nvlink4-nvswitch", bandwidth_gbps=400)
    t = simulate_collective("allreduce", n, **kw)
    nvls = hardware.intra_link("nvlink4-nvswitch").nvls_gbps
    assert nvls is not None
    assert t == pytest.approx(25e-6 + 2 * (g - 1) / g * n / (nvls * 1e9 / 8), rel=1e-9)
    ring = simulate_collective("allreduce", n, **kw, nccl_algo="Ring")
    assert ring > t


def test_the_dgx2_preset_is_nvlink2_through_nvswitch_without_nvls():
    dgx2, dgx1 = hardware.intra_link("nvlink2-nvswitch"), hardware.intra_link("nvlink")
    assert dgx2.nccl_hw == "nvlink" and dgx2.nvswitch and dgx2.nvls_gbps is None
    assert dgx2.bandwidth_gbps == dgx1.bandwidth_gbps  # the same six NVLink 2 links per V100
    assert dgx2.nvlink_gbytes == 6 * 20.0  # links x SM70_NVLINK_BW
    assert not hardware.nccl_allowed("NVLS", 16, 1, "nvlink2-nvswitch", 7.0)


def test_aws_ofi_nccl_runs_simple_only_where_efa_cannot_order_a_writes_bytes():
    # The plugin sets NCCL_PROTO=simple on p4d/p4de/p3dn (A100, V100) from its v1.6.0 on
    # (NCCL 2.18.1 here), unless the user set NCCL_PROTO; p5 (H100) keeps NCCL's default.
    def states(**kw):
        base = dict(hosts=2, gpus_per_host=8, nics_per_host=4, transport="efa",
                    intra_link="nvlink3-nvswitch", bandwidth_gbps=100, device="A100")
        return _Sim(None, contract.Cluster(**{**base, **kw})).nccl_proto

    simple = hardware.nccl_protocols("Simple")
    assert states() == simple
    assert states(nccl_version="2.17.1") == hardware.nccl_protocols(None)
    assert states(nccl_proto="LL128,Simple") == hardware.nccl_protocols("LL128,Simple")
    assert states(device="H100", intra_link="nvlink4-nvswitch",
                  nics_per_host=8) == hardware.nccl_protocols(None)
    assert states(transport="ib") == hardware.nccl_protocols(None)
    # an 8 MiB allreduce over two p4de hosts: the tree on Simple, as the tuner prices it
    t = simulate_collective("allreduce", 8 << 20, hosts=2, gpus_per_host=8, nics_per_host=4,
                            transport="efa", intra_link="nvlink3-nvswitch",
                            bandwidth_gbps=100, device="A100")
    forced = simulate_collective("allreduce", 8 << 20, hosts=2, gpus_per_host=8,
                                 nics_per_host=4, transport="efa",
                                 intra_link="nvlink3-nvswitch", bandwidth_gbps=100,
                                 device="A100", nccl_proto="Simple")
    assert t == forced
