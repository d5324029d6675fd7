"""NCCL's cost model of its rings (ddpbench.hardware.nccl_ring) and where the simulator uses it.

Expected values are worked by hand from NVIDIA/nccl src/graph/tuning.cc (hardware.NCCL_SOURCE).
"""

import pytest

from ddpbench import hardware
from ddpbench.simulator import simulate_collective


def test_large_allreduce_across_hosts_takes_simple_with_the_ring_plateau():
    # 4 hosts x 1 Pascal GPU: 6 steps, NCCL counts 2 x 4 = 8 of them between hosts and
    # -2 inside (its formula as written), intra steps at least 3 x 1 us of network overhead
    name, lat, share = hardware.nccl_ring("allreduce", 64 << 20, 4, 4, "pcie", 6.0, 10e-3)
    assert name == "Simple" and share == 1.0
    assert lat == pytest.approx((8.4 + (6 - 8) * 5.7 + 8 * 14.0) * 1.9 * 1e-6)
    # from compute capability 8.0 the plateau is 1.4
    _, lat_a100, _ = hardware.nccl_ring("allreduce", 64 << 20, 4, 4, "pcie", 8.0, 10e-3)
    assert lat_a100 == pytest.approx((8.4 + (6 - 8) * 5.7 + 8 * 14.0) * 1.4 * 1e-6)


def test_small_allreduce_takes_ll_at_a_quarter_of_the_bandwidth():
    name, lat, share = hardware.nccl_ring("allreduce", 1024, 4, 4, "pcie", 6.0, 1e-6)
    assert (name, share) == ("LL", 0.25)
    assert lat == pytest.approx((6.6 + (6 - 8) * 1.0 + 8 * 2.7) * 1e-6)


def test_ll128_only_over_nvlink_on_the_gpus_nccl_enables_it_for():
    # 2 hosts x 8 GPUs: 30 steps, 4 between hosts; at 100 us of bytes LL128 is the fastest
    args = ("allreduce", 8 << 20, 16, 2)
    name, lat, share = hardware.nccl_ring(*args, "nvlink", 7.0, 100e-6)
    assert (name, share) == ("LL128", 0.92)
    assert lat == pytest.approx((14.0 + 26 * 1.9 + 4 * 4.0) * 1e-6)
    assert hardware.nccl_ring(*args, "nvlink", 6.0, 100e-6)[0] == "Simple"  # P100: no LL128
    assert hardware.nccl_ring(*args, "pcie", 7.0, 100e-6)[0] == "LL"  # PCIe: no LL128


def test_one_host_reduce_scatter_has_no_network_steps_and_no_plateau():
    name, lat, share = hardware.nccl_ring("reduce_scatter", 64 << 20, 8, 1, "pcie", 7.0, 5e-3)
    assert (name, share) == ("Simple", 1.0)
    assert lat == pytest.approx((8.4 + 7 * 5.7) * 1e-6)
    with pytest.raises(ValueError, match="coll"):
        hardware.nccl_ring("broadcast", 1, 2, 1, "pcie", 7.0, 1e-6)


def test_simulated_ring_on_a_named_gpu_over_tcp_pays_nccls_latency_instead_of_per_step_costs():
    n, kw = 64 << 20, {"workers": 4, "bandwidth_gbps": 10.0, "transport": "tcp"}
    plain = simulate_collective("allreduce", n, **kw)
    # (one channel: NCCL's own connections through the NIC are another test's subject)
    nccl = simulate_collective("allreduce", n, device="P100", nccl_channels=1, **kw)
    tcp = hardware.transport("tcp")
    per_step = 5e-6 + tcp.per_message_us * 1e-6  # latency_us 5 + the transport's cost
    want = plain - 6 * per_step + (8.4 + (6 - 8) * 5.7 + 8 * 14.0) * 1.9e-6
    assert nccl == pytest.approx(want, rel=1e-12)
    # the ideal transport keeps the closed forms, whatever the device
    ideal = {"workers": 4, "bandwidth_gbps": 10.0}
    assert (simulate_collective("allreduce", n, device="P100", **ideal)
            == simulate_collective("allreduce", n, **ideal))


def test_hierarchical_allreduce_prices_only_its_intra_host_phases_with_nccl():
    n = 64 << 20
    kw = {"hosts": 4, "gpus_per_host": 4, "bandwidth_gbps": 25.0, "transport": "rdma",
          "intra_link": "pcie", "hierarchical": True}
    plain = simulate_collective("allreduce", n, **kw)
    nccl = simulate_collective("allreduce", n, device="V100", **kw)
    link = hardware.intra_link("pcie")
    bw = link.bandwidth_gbps * 1e9 / 8
    shard = n // 4
    moved = 3 * shard / bw
    old_local = 3 * (link.latency_us * 1e-6 + shard / bw)
    new_local = (8.4 + 3 * 5.7) * 1e-6 + moved  # Simple on one host, full bandwidth
    assert nccl == pytest.approx(plain + 2 * (new_local - old_local), rel=1e-12)


def test_nccl_proto_reads_as_nccl_reads_its_variable():
    assert hardware.nccl_protocols(None) == {"LL": 1, "LL128": 2, "Simple": 1}
    assert hardware.nccl_protocols("^LL128") == {"LL": 1, "LL128": 0, "Simple": 1}
    assert hardware.nccl_protocols("ll, simple") == {"LL": 1, "LL128": 0, "Simple": 1}
    # named, LL128 is on whatever the GPU (NCCL's explicit setting skips its own check)
    assert hardware.nccl_protocols("^LL") == {"LL": 0, "LL128": 1, "Simple": 1}
    args = ("allreduce", 8 << 20, 16, 2, "pcie", 6.0, 100e-6)
    assert hardware.nccl_ring(*args)[0] == "LL"
    assert hardware.nccl_ring(*args, hardware.nccl_protocols("LL128"))[0] == "LL128"
    assert hardware.nccl_ring(*args, hardware.nccl_protocols("Simple"))[0] == "Simple"
    for bad in ("LL256", "", "^", "^LL,LL128,Simple"):
        with pytest.raises(ValueError, match="nccl_proto"):
            hardware.nccl_protocols(bad)


def test_nccl_proto_is_a_cluster_field_that_changes_only_nccl_rings():
    n, kw = 64 << 20, {"workers": 4, "bandwidth_gbps": 10.0, "transport": "tcp",
                       "device": "P100", "nccl_channels": 1}
    small = 4096
    # a small allreduce takes LL; without LL it pays Simple's latency
    assert (simulate_collective("allreduce", small, nccl_proto="^LL", **kw)
            > simulate_collective("allreduce", small, **kw))
    # Simple is NCCL's choice for 64 MiB either way
    assert (simulate_collective("allreduce", n, nccl_proto="Simple", **kw)
            == simulate_collective("allreduce", n, **kw))
    with pytest.raises(ValueError, match="nccl_proto"):
        simulate_collective("allreduce", n, nccl_proto="LL256", **kw)


def test_nccl_channels_through_one_nic_by_release():
    # 2.3: one ring per NIC; 2.4: doubled on NVLink hosts; 2.5 on: doubled everywhere.
    assert hardware.nccl_channels((2, 3, 7), "nvlink") == 1
    assert hardware.nccl_channels((2, 4, 8), "nvlink") == 2
    assert hardware.nccl_channels((2, 4, 8), "pcie") == 1
    assert hardware.nccl_channels((2, 5, 6), "pcie") == 2
    assert hardware.nccl_channels(hardware.NCCL_NEWEST, "nvlink") == 2


@pytest.mark.parametrize("value", ["2.3", "3.0.1", "two", "2.x.1", "-2.1.1"])
def test_a_bad_nccl_version_names_the_field(value):
    with pytest.raises(ValueError, match="nccl_version"):
        hardware.nccl_release(value)
    with pytest.raises(ValueError, match="nccl_version"):
        simulate_collective("allreduce", 1 << 20, hosts=2, bandwidth_gbps=10, device="V100",
                            transport="tcp", nccl_version=value)


def test_ll128_only_from_the_release_that_added_it():
    args = ("allreduce", 10 << 20, 16, 2, "nvlink", 7.0, 1e-4)
    assert hardware.nccl_ring(*args, release=(2, 5, 6))[0] == "LL128"
    assert hardware.nccl_ring(*args, release=(2, 4, 8))[0] != "LL128"


def test_slowest_connection_share_tracks_the_measured_spread():
    # iperf3 with 2, 4 and 8 parallel connections (NVIDIA/nccl issue #450): the slowest at
    # 0.85, 0.89 and 0.70 of the mean.
    for flows, measured in ((2, 0.846), (4, 0.886), (8, 0.705)):
        got = hardware.slowest_share(flows, hardware.TCP_FLOW_SPREAD)
        assert got == pytest.approx(measured, abs=0.09)
    assert hardware.slowest_share(1, hardware.TCP_FLOW_SPREAD) == 1.0
    assert hardware.slowest_share(8, 0.0) == 1.0


@pytest.mark.parametrize("channels,sockets", [(1, 1), (2, 1), (4, 1), (2, 12)])
def test_a_tcp_ring_moves_at_its_connections_slowest_times_their_number(channels, sockets):
    # Two hosts of one V100 over 100 Gbit/s tcp: the ring's bytes cross channels x sockets
    # connections, each at most 15 Gbit/s, striped evenly, so at F x the slowest. The
    # difference of two large messages (NCCL's Simple protocol) leaves the bytes' time.
    tr = hardware.transport("tcp")
    kw = dict(hosts=2, gpus_per_host=1, bandwidth_gbps=100, device="V100", transport="tcp",
              nccl_version="2.3.7", nccl_channels=channels, nccl_socket_flows=sockets)
    n = 1 << 30
    t1 = simulate_collective("allreduce", n, **kw)
    t2 = simulate_collective("allreduce", 2 * n, **kw)
    flows = channels * sockets
    rate = (hardware.slowest_share(flows, tr.flow_spread)
            * min(100e9 / 8 * tr.efficiency, flows * tr.socket_gbps * 1e9 / 8))
    assert t2 - t1 == pytest.approx(2 * (2 - 1) * (n / 2) / rate, rel=1e-9)


# -- NCCL's trees (hardware.nccl_allreduce, strategies.nccl_tree_allreduce)


def test_tree_latency_is_a_chain_per_host_and_a_binary_tree_between_hosts():
    simple = next(p for p in hardware.NCCL_PROTOCOLS if p.name == "Simple")
    ll = next(p for p in hardware.NCCL_PROTOCOLS if p.name == "LL")
    # 16 hosts x 8 GPUs over NVLink: 7 chain hops and log2(16) = 4 tree levels, up and down
    assert hardware.nccl_tree_latency(simple, 128, 16, "nvlink") == pytest.approx(
        0.0 + 2 * (7 * 28.0 + 4 * 28.0))
    assert hardware.nccl_tree_latency(ll, 128, 16, "nvlink") == pytest.approx(
        6.8 + 2 * (7 * 0.6 + 4 * 5.0))
    # 6 hosts: NCCL's log2i rounds down (2 levels)
    assert hardware.nccl_tree_latency(ll, 6, 6, "pcie") == pytest.approx(6.8 + 2 * 2 * 5.0)


def test_tuner_takes_the_tree_where_its_latency_wins_and_the_ring_for_large_messages():
    # 32 hosts x 4 P100s over PCIe (512 rings steps of Simple at ~1.9 x 10 ms of latency):
    # a 1 KiB allreduce and a 4 MiB one go on the tree, 1 GiB on the ring.
    ranks, nodes = 128, 32

    def pick(nbytes):
        transfer = 2 * (ranks - 1) / ranks * nbytes / 12e9
        return hardware.nccl_allreduce(nbytes, ranks, nodes, "pcie", 6.0, transfer, channels=2)

    small, medium, large = pick(1024), pick(4 << 20), pick(1 << 30)
    assert (small.algorithm, small.protocol) == ("Tree", "LL")
    assert (medium.algorithm, medium.protocol) == ("Tree", "Simple")
    simple = next(p for p in hardware.NCCL_PROTOCOLS if p.name == "Simple")
    # 4 MiB = 64 B x 2**16: Simple's correction there is 0.7, times the tree's 0.92, and the
    # tree's busBw (0.92 x 12 GB/s) capped at one channel's perChMaxTreeBw, Volta's row (a
    # P100 takes it) for more than two hosts: 10 GB/s
    assert medium.share == pytest.approx(0.92 * 0.7 * 10.0 / (0.92 * 12.0))
    assert medium.latency_s == pytest.approx(
        hardware.nccl_tree_latency(simple, ranks, nodes, "pcie") * 1e-6)
    assert large.algorithm == "Ring"
    # on one host the ring's latency is small: no tree at 4 MiB over NVLink
    assert hardware.nccl_allreduce(4 << 20, 8, 1, "nvlink", 7.0, 4e-5).algorithm == "Ring"


def test_nccl_2_4_runs_its_trees_below_the_threshold_its_init_computes():
    # v2.4.8-1 src/init.cc ncclTreeThreshold, worked by hand:
    # 4 x 8 NVLink, 2 channels: ring 10000 B/us, tree 7500, latencies 6 x 31 and 15 x 2 +
    # 4 x 7 -> 10000 x 7500 / 2500 x 128 = 3,840,000 bytes
    assert hardware._nccl24_tree_threshold(32, 4, "nvlink", 2) == pytest.approx(3.84e6)
    # 4 x 4 PCIe: 5000 against 3333.3, latencies 90 and 42 -> 480,000
    assert hardware._nccl24_tree_threshold(16, 4, "pcie", 1) == pytest.approx(4.8e5)
    # two NVLink hosts: trees twice as fast, every size; one host: never
    assert hardware._nccl24_tree_threshold(16, 2, "nvlink", 2) == float("inf")
    assert hardware._nccl24_tree_threshold(8, 1, "nvlink", 2) == 0.0
    release = (2, 4, 8)
    below = hardware.nccl_allreduce(3_000_000, 32, 4, "nvlink", 7.0, 1e-3, release=release,
                                    channels=2)
    above = hardware.nccl_allreduce(4_000_000, 32, 4, "nvlink", 7.0, 1e-3, release=release,
                                    channels=2)
    assert (below.algorithm, above.algorithm) == ("Tree", "Ring")
    assert below.protocol != "LL128"  # not before 2.5.6
    # before 2.4: rings only, whatever the size
    assert hardware.nccl_allreduce(1024, 32, 4, "nvlink", 7.0, 1e-6,
                                   release=(2, 3, 7)).algorithm == "Ring"


def _on(states):
    return {a for a, on in states.items() if on}


def test_nccl_algo_reads_as_nccl_reads_its_variable():
    every = set(hardware.NCCL_ALGORITHMS)
    assert _on(hardware.nccl_algorithms(None)) == every - {"PAT"}  # PAT from 2.23.4
    assert _on(hardware.nccl_algorithms(None, (2, 30, 7))) == every
    assert _on(hardware.nccl_algorithms("ring")) == {"Ring"}
    assert _on(hardware.nccl_algorithms("^Tree")) == every - {"Tree", "PAT"}
    assert _on(hardware.nccl_algorithms("Ring,Tree")) == {"Ring", "Tree"}
    assert _on(hardware.nccl_algorithms("^nvls,NVLSTree")) == every - {"NVLS", "NVLSTree",
                                                                       "PAT"}
    assert _on(hardware.nccl_algorithms(None, (2, 3, 7))) == {"Ring"}
    # releases before NVLS have none; "CollNet" is 2.6-2.13's name of CollNetDirect
    assert _on(hardware.nccl_algorithms(None, (2, 16, 5))) == {"Tree", "Ring", "CollNetDirect",
                                                               "CollNetChain"}
    assert _on(hardware.nccl_algorithms("^CollNet", (2, 7, 8))) == {"Tree", "Ring"}
    for bad in ("Rings", "", "CollNet", "^Tree,Ring,CollNetDirect,CollNetChain,NVLS,NVLSTree"):
        with pytest.raises(ValueError, match="nccl_algo"):
            hardware.nccl_algorithms(bad)
    with pytest.raises(ValueError, match="2.3.7"):
        hardware.nccl_algorithms("Tree", (2, 3, 7))
    with pytest.raises(ValueError, match="2.16.5"):
        hardware.nccl_algorithms("NVLS", (2, 16, 5))
    with pytest.raises(ValueError, match="nccl_algo"):  # nothing on is possible on PCIe
        hardware.nccl_allreduce(1 << 20, 16, 2, "pcie", 7.0, 1e-3,
                                algorithms=hardware.nccl_algorithms("NVLS"))
    with pytest.raises(ValueError, match="nccl_algo"):
        simulate_collective("allreduce", 1 << 20, hosts=2, bandwidth_gbps=10, device="V100",
                            transport="tcp", nccl_algo="Tree", nccl_version="2.3.7")


@pytest.mark.parametrize("hosts", [2, 3, 4])
def test_simulated_tree_moves_its_bytes_at_the_busiest_nic_or_chain(hosts):
    # hosts x 8 V100s over NVLink and 100 Gbit/s RDMA, the tree forced (NCCL_ALGO=Tree):
    # latency + max(NIC bytes / NIC rate, 2 x message / NVLink rate) / share, with the NIC
    # carrying the message once on two hosts and twice on more, and each GPU of a host's
    # chain sending the message up and the result down.
    n = 256 << 20
    kw = dict(hosts=hosts, gpus_per_host=8, bandwidth_gbps=100, device="V100",
              transport="rdma", intra_link="nvlink")
    t = simulate_collective("allreduce", n, nccl_algo="Tree", **kw)
    ranks = hosts * 8
    nic = 100e9 / 8 * hardware.transport("rdma").efficiency
    # the ring's Simple bytes (2 (ranks-1) steps of its largest float32 chunk) at the NIC's
    # rate: on more than two hosts the tree's busBw (0.92 of it) passes Volta's per-channel
    # cap, 10 GB/s, and is held there
    ring = 2 * (ranks - 1) * -(-(n // 4) // ranks) * 4 / nic
    choice = hardware.nccl_allreduce(n, ranks, hosts, "nvlink", 7.0, ring,
                                     algorithms=hardware.nccl_algorithms("Tree"))
    capped = min(1.0, 10.0e9 / (0.92 * nic)) if hosts > 2 else 1.0
    proto = next(p for p in hardware.NCCL_PROTOCOLS if p.name == choice.protocol)
    assert choice.share == pytest.approx(0.92 * capped * proto.tree_share)
    nic_bytes = n if hosts == 2 else 2 * n
    want = choice.latency_s + max(nic_bytes / nic, 2 * n / 130e9) / choice.share
    assert t == pytest.approx(want, rel=1e-6)  # the ring's bytes as the simulator rounds them
    # forcing the ring gives the ring of before; the default takes the faster of the two
    ring = simulate_collective("allreduce", n, nccl_algo="Ring", **kw)
    default = simulate_collective("allreduce", n, **kw)
    assert default in (t, ring)


def test_tree_counts_the_average_nic_bytes_of_its_two_trees():
    from ddpbench.simulator import simulate

    kw = dict(hosts=4, gpus_per_host=2, bandwidth_gbps=100, device="V100", transport="rdma",
              intra_link="nvlink", iterations=1, warmup=0)
    tree = simulate("resnet50", "mpi", nccl_algo="Tree", **kw)
    ring = simulate("resnet50", "mpi", nccl_algo="Ring", **kw)
    grads = 25_557_032 * 4
    # each of the two trees' 3 edges carries half the message both ways: 2 (h-1)/h of it
    assert tree.bytes_sent["host0"] == pytest.approx(2 * 3 / 4 * grads, rel=1e-9)
    # a ring of 8 GPUs over 4 hosts: 2 (p-1)/p of it
    assert ring.bytes_sent["host0"] == pytest.approx(2 * 7 / 8 * grads, rel=1e-9)


def test_per_channel_caps_follow_tuning_cc_by_release_compute_capability_and_hosts():
    cap = hardware.nccl_per_channel_cap
    # perChMaxTreeBws: none before 2.8.3; Ampere's two-host entry 22.5 until 2.10.3, then 23.6
    assert cap("tree", (2, 7, 8), 8.0, 2) is None
    assert cap("tree", (2, 8, 3), 8.0, 2) == 22.5
    assert cap("tree", (2, 20, 3), 8.0, 2) == 23.6
    # a P100 takes Volta's row, a Hopper Ampere's until its own (2.17.1), a B200 Hopper's
    # until 2.25.1; one host, two hosts, more
    assert cap("tree", (2, 20, 3), 6.0, 3) == 10.0
    assert cap("tree", (2, 16, 5), 9.0, 2) == 23.6
    assert [cap("tree", (2, 20, 3), 10.0, h) for h in (1, 2, 4)] == [38.7, 41.4, 36.0]
    assert [cap("tree", (2, 30, 7), 10.0, h) for h in (1, 2, 4)] == [70.0, 42.8, 24.0]
    # LL128: the allreduce's 16.7 from 2.7.3, 20 from 2.10.3; ring and tree apart from 2.18.3
    assert cap("ring_ll128", (2, 7, 3), 8.0, 2) == 16.7
    assert cap("tree_ll128", (2, 12, 12), 7.0, 4) == 20.0
    assert cap("tree_ll128", (2, 20, 3), 9.0, 4) == 29.0
    assert cap("ring_ll128", (2, 30, 7), 10.0, 2) == 40.0


def test_a_two_host_tree_is_held_at_its_channels_per_channel_cap():
    # 2 x 8 A100 over 4 NICs: the ring's bus bandwidth 90 GB/s; the tree's graph runs at up
    # to twice that inside the hosts (230 GB/s there), 0.92 x 180 = 165.6 GB/s, but its
    # 4 channels are held at 23.6 GB/s each: 94.4, a share of 94.4 / 165.6 of the tree's rate
    ranks, nodes, n = 16, 2, 1 << 30
    ring = 2 * (ranks - 1) / ranks * n / 90e9
    fab = hardware.NcclFabric(nics=4, nic_gbytes=25.0, intra_gbytes=230.0)
    tree = hardware.nccl_allreduce(n, ranks, nodes, "nvlink3-nvswitch", 8.0, ring,
                                   algorithms=hardware.nccl_algorithms("Tree"), fabric=fab)
    assert (tree.algorithm, tree.protocol) == ("Tree", "Simple")
    assert tree.share == pytest.approx(0.92 * 94.4 / 165.6)
    uncapped = hardware.nccl_allreduce(n, ranks, nodes, "nvlink3-nvswitch", 8.0, ring,
                                       algorithms=hardware.nccl_algorithms("Tree"),
                                       fabric=fab, release=(2, 7, 8))
    assert uncapped.share == pytest.approx(0.92)
    # the time at the cap: latency + the message at half the capped busBw
    assert tree.time_s == pytest.approx(tree.latency_s + n / (0.5 * 94.4e9))


def test_a_chain_through_a_hosts_gpus_carries_the_message_up_and_the_result_down():
    # 8 x 8 H100 over 8 NDR NICs with SHARP, CollNetChain forced: each NIC sends its share
    # once and gets the reduced share back (the host's NICs at 0.96 x 8 x 50 GB/s), while
    # each GPU of the chain sends 2 GiB up and 2 GiB down through its NVLink (370 GB/s):
    # the chain sets the pace, latency + 2 x 2 GiB / 370 GB/s
    n = 2 << 30
    kw = dict(hosts=8, gpus_per_host=8, bandwidth_gbps=400, device="H100", transport="ib",
              intra_link="nvlink4-nvswitch", nics_per_host=8, collnet=True,
              nccl_algo="CollNetChain")
    t = simulate_collective("allreduce", n, **kw)
    nic_total = 8 * 400e9 / 8 * hardware.transport("ib").efficiency
    chain = 2 * n / 370e9
    assert chain > n / nic_total
    lat = t - chain
    assert 50e-6 < lat < 100e-6  # the tuner's CollNetChain latency (about 71 us here)
    tree = simulate_collective("allreduce", n, **{**kw, "nccl_algo": "Tree"})
    assert tree > chain  # the tree's chains carry the same, behind its own NICs
