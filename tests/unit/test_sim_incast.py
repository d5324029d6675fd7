"""TCP incast: a switch port with a shallow buffer over a lossy transport.

Checked against closed forms: the most senders a port takes (buffer and path over four
segments each, RFC 5681's fast retransmit), the delivery times of a synchronised fan-in
(the first flows in order at line rate, every later one a retransmission timeout later),
the goodput collapse of a barrier-synchronised block read, and a deep buffer (or none given)
changing nothing, bit for bit.
"""

from __future__ import annotations

import math

import pytest

from ddpbench import contract, hardware, simulator
from ddpbench.simulator.network import IncastPort, Message, Network


def test_senders_a_port_takes_is_buffer_and_path_over_four_segments():
    # 32 KiB of buffer and a 10 Gbit/s path of 20 us round trip: 32768 + 25000 bytes held,
    # 4 x 1448 = 5792 per flow -> 9 flows
    assert hardware.incast_senders(32 * 1024, 10e9 / 8, 20e-6) == (32768 + 25000) // 5792 == 9
    assert hardware.FAST_RETRANSMIT_SEGMENTS == 4 and hardware.TCP_MSS_BYTES == 1448
    # never below one flow; jumbo frames hold fewer segments
    assert hardware.incast_senders(1, 1e3, 0.0) == 1
    assert hardware.incast_senders(4 << 20, 12.5e9, 0.0, mss_bytes=8948) == (4 << 20) // 35792
    with pytest.raises(ValueError, match="buffer"):
        hardware.incast_senders(0, 1e9, 0.0)


def test_only_tcp_drops_and_waits_linux_minimum_timeout():
    assert hardware.TCP_RTO_MIN_MS == 200.0
    lossy = {n for n, t in hardware.TRANSPORTS.items() if t.rto_min_ms is not None}
    assert lossy == {"tcp"}
    assert hardware.transport("tcp").rto_min_ms == 200.0


def _fan_in(n: int, nbytes: int, incast: tuple[int, float] | None, latency: float = 0.0):
    env = simulator.core.CountingEnvironment()
    net = Network(env, n + 1, 1e9, latency, lambda *a: None, incast=incast)
    done: dict[int, float] = {}
    for src in range(1, n + 1):  # every sender at t = 0 to host 0
        net.send(Message(src, 0, nbytes, 0, "push", 0,
                         lambda msg: done.__setitem__(msg.src, env.now)))
    env.run()
    return net, [done[s] for s in range(1, n + 1)]


@pytest.mark.parametrize("n,senders", [(6, 2), (5, 4), (3, 1), (4, 3)])
def test_a_synchronised_fan_in_past_the_limit_waits_one_timeout_per_late_flow(n, senders):
    nbytes, rto, lat = 1_000_000, 0.2, 5e-6
    one = nbytes / 1e9  # 1 ms on the port
    net, got = _fan_in(n, nbytes, (senders, rto), lat)
    # The first `senders` flows reach the port with fewer than that many others on it and go
    # through in order; each later one finds the port full, waits the timer, then goes in
    # order behind the others that timed out (the port is idle again by then).
    first = [k * one + lat for k in range(1, senders + 1)]
    late = [rto + j * one + lat for j in range(1, n - senders + 1)]
    assert sorted(got) == pytest.approx(first + late)
    assert net.timeouts == n - senders
    assert all(isinstance(p, IncastPort) for p in net.down)


def test_within_the_limit_a_fan_in_is_the_deep_buffer_switch_exactly():
    _, deep = _fan_in(5, 750_000, None, 3e-6)
    net, shallow = _fan_in(5, 750_000, (5, 0.2), 3e-6)
    assert shallow == deep and net.timeouts == 0


def test_one_sender_many_messages_is_one_flow_and_never_times_out():
    env = simulator.core.CountingEnvironment()
    net = Network(env, 2, 1e9, 0.0, lambda *a: None, incast=(1, 0.2))
    done: list[float] = []
    for _ in range(8):
        net.send(Message(1, 0, 100_000, 0, "push", 0, lambda msg: done.append(env.now)))
    env.run()
    assert net.timeouts == 0
    assert done == pytest.approx([k * 1e-4 for k in range(1, 9)])


def test_goodput_of_a_block_read_collapses_past_the_limit():
    # Phanishayee et al.'s barrier-synchronised read: n servers each send their 256 KB
    # share of a block to one client (here at 1e9 bytes/s); the block is done when the last
    # share is. Within the limit the goodput is the line rate; one flow past it, the block
    # waits the 200 ms timer and the goodput falls by the ratio of the two times.
    sru, rto, limit = 256_000, 0.2, 8

    def goodput(n: int) -> float:
        _, got = _fan_in(n, sru, (limit, rto))
        return n * sru / max(got)

    for n in (2, 4, 8):
        assert goodput(n) == pytest.approx(1e9)
    n = limit + 1
    assert goodput(n) == pytest.approx(n * sru / (rto + sru / 1e9))
    assert goodput(n) < 0.02 * 1e9


def _ps(hosts: int, buffer_kb: float | None, backend: str = "byteps") -> simulator.SimResult:
    c = contract.Cluster(hosts=hosts, transport="tcp", bandwidth_gbps=10, servers=hosts,
                         switch_buffer_kb=buffer_kb)
    return simulator.simulate("resnet50", backend, cluster=c, iterations=3)


@pytest.mark.parametrize("backend", ["byteps", "kvstore", "p3"])
def test_a_deep_buffer_or_none_given_changes_nothing(backend):
    base = _ps(8, None, backend)
    deep = _ps(8, 64 * 1024.0, backend)  # 64 MiB per port: hundreds of flows
    assert deep.iteration_time_s == base.iteration_time_s
    assert deep.bytes_sent == base.bytes_sent
    assert deep.timeouts == base.timeouts == 0


def test_a_shallow_buffer_slows_a_wide_fan_in_and_counts_its_timeouts():
    # 32 KiB at 10 Gbit/s x 0.94 and a 10 us round trip: 7 flows per port. On 7 hosts a
    # port hears from at most the 6 others (a host's own server is over the loopback).
    senders = hardware.incast_senders(32 * 1024, 10e9 / 8 * 0.94, 10e-6)
    assert senders == (32768 + 11750) // 5792 == 7
    narrow, wide = _ps(senders, 32.0), _ps(16, 32.0)
    assert narrow.timeouts == 0
    assert narrow.iteration_time_s == _ps(senders, None).iteration_time_s
    assert wide.timeouts > 0
    assert wide.iteration_time_s > _ps(16, None).iteration_time_s + 0.05


def test_switch_buffer_needs_a_lossy_transport_and_a_positive_size():
    with pytest.raises(ValueError, match="switch_buffer_kb applies to a lossy transport"):
        contract.Cluster(hosts=2, transport="rdma", switch_buffer_kb=32.0)
    for bad in (0.0, -1.0, math.inf):
        with pytest.raises(ValueError, match="switch_buffer_kb"):
            contract.Cluster.from_point({"hosts": 2, "transport": "tcp",
                                         "switch_buffer_kb": bad})
    assert contract.check_axis("switch_buffer_kb", 128.0) == 128.0
    assert contract.NEUTRAL_AT_DEFAULT["switch_buffer_kb"] is None
