"""Simulator behaviour: priorities, water mark, FIFO, determinism, errors, full traces."""

from __future__ import annotations

import json
import math

import pytest

from ddpbench import simulator
from ddpbench.simulator import simulate
from ddpbench.simulator.network import CountingEnvironment, Message, Network
from ddpbench.simulator.workload import Workload

US = 1e-6


def two_layers(fwd0, bwd0, n0, fwd1, bwd1, n1) -> Workload:
    return Workload.from_dict({"name": "tiny", "batch_size": 1, "layers": [
        {"name": "l0", "fwd_ms": fwd0, "bwd_ms": bwd0, "tensors": [{"name": "a", "numel": n0}]},
        {"name": "l1", "fwd_ms": fwd1, "bwd_ms": bwd1, "tensors": [{"name": "b", "numel": n1}]}]})


def trace(result, scale=US):
    return [(s.host, s.kind, s.layer, round(s.start / scale, 6), round(s.end / scale, 6), s.bytes,
             s.peer) for s in result.timeline]


def test_full_trace_horovod_two_workers():
    # 8 Gbit/s = 1e9 B/s; a ring step is latency (10 us) + half the buffer.
    wl = two_layers(1, 2, 1000, 1, 1, 3000)
    r = simulate(wl, "horovod", workers=2, bandwidth_gbps=8, latency_us=10, iterations=2,
                 warmup=1)
    assert trace(r) == [
        ("worker0", "forward", 0, 0.0, 1000.0, 0, ""),
        ("worker0", "forward", 1, 1000.0, 2000.0, 0, ""),
        ("worker0", "backward", 1, 2000.0, 3000.0, 0, ""),
        ("worker0", "allreduce", 1, 3000.0, 3016.0, 6000, "worker1"),
        ("worker0", "allreduce", 1, 3016.0, 3032.0, 6000, "worker1"),
        ("worker0", "backward", 0, 3000.0, 5000.0, 0, ""),
        ("worker0", "allreduce", 0, 5000.0, 5012.0, 2000, "worker1"),
        ("worker0", "allreduce", 0, 5012.0, 5024.0, 2000, "worker1"),
        # forward of iteration 2 waits for layer 0's parameters
        ("worker0", "forward", 0, 5024.0, 6024.0, 0, ""),
        ("worker0", "forward", 1, 6024.0, 7024.0, 0, ""),
        ("worker0", "backward", 1, 7024.0, 8024.0, 0, ""),
        # the next 1 ms cycle boundary after 8.024 ms (cycles tick at 6, 7, 8, 9 ms)
        ("worker0", "allreduce", 1, 9000.0, 9016.0, 6000, "worker1"),
        ("worker0", "allreduce", 1, 9016.0, 9032.0, 6000, "worker1"),
        ("worker0", "backward", 0, 8024.0, 10024.0, 0, ""),
        ("worker0", "allreduce", 0, 11000.0, 11012.0, 2000, "worker1"),
        ("worker0", "allreduce", 0, 11012.0, 11024.0, 2000, "worker1"),
    ]
    assert r.iteration_time_s == pytest.approx(6e-3)
    assert r.bytes_sent == {"worker0": 16000.0, "worker1": 16000.0}
    assert r.events == 27


NOBUF = {"sndbuf_bytes": 0, "server_sockets": "host"}  # ddpbench's earlier socket model


@pytest.mark.parametrize("knobs,position", [({}, 10), ({"sndbuf_bytes": 16384}, 4),
                                            (NOBUF, 3), ({"water_mark": 1}, 1),
                                            ({"priority": False}, 10)])
def test_p3_send_order_under_a_blocked_socket(knobs, position):
    # The real backend's scenario (tests/mpi_scripts/ps_check.py, case p3_dedicated): ten
    # low-priority slices (80 kB) queued, a high-priority one becomes ready while the first
    # is on the wire. P3's sockets (hwm 1) with Linux's autotuned 4 MiB kernel buffer take
    # all ten before it (position 10); with the initial 16 KiB each slice enters the kernel
    # alone, so the one on the wire, the one in ZeroMQ's engine, the one in the pipe and
    # the one the thread holds go first (position 4); without the buffer, the one in the
    # socket and the one the thread holds (position 3). The water-mark variant lets it
    # overtake everything queued (position 1); without priorities (the paper's slicing-only
    # ablation) it waits behind all ten. Same positions as the real backend's.
    wl = two_layers(0, 0.5, 100, 0, 0.01, 200_000)
    r = simulate(wl, "p3", workers=2, servers=1, bandwidth_gbps=0.5, latency_us=1,
                 slice_params=20_000, iterations=1, warmup=0, **knobs)
    assert push_layers(r).index(0) == position
    assert push_layers(r).count(1) == 10


@pytest.mark.parametrize("knobs,position", [({}, 10), (NOBUF, 3)])
def test_p3_servers_answer_in_completion_order_without_priority(knobs, position):
    wl = two_layers(0, 0.5, 100, 0, 0.01, 200_000)
    r = simulate(wl, "p3", workers=2, servers=1, bandwidth_gbps=0.5, latency_us=1,
                 slice_params=20_000, iterations=1, warmup=0, **knobs)
    pulls = [s for s in r.timeline if s.kind == "pull" and s.peer == "worker0"]
    starts = [s.start for s in pulls]
    assert starts == sorted(starts)
    assert [s.layer for s in pulls].index(0) == position  # the sums complete in push order


def test_full_trace_p3_water_mark_one_lets_priority_overtake():
    # Layer 1's five slices are queued first; layer 0's slice (higher priority) becomes ready
    # at 20 us, behind them, and leaves before the three still queued.
    wl = two_layers(0, 0.01, 1000, 0, 0.01, 5000)
    r = simulate(wl, "p3", workers=1, servers=1, bandwidth_gbps=8, latency_us=1,
                 slice_params=1000, water_mark=1, iterations=1, warmup=0,
                 summation_gbps=math.inf)
    assert trace(r) == [
        ("worker0", "backward", 1, 0.0, 10.0, 0, ""),
        ("worker0", "push", 1, 10.0, 14.0, 4000, "server0"),
        ("server0", "pull", 1, 15.0, 19.0, 4000, "worker0"),
        # after the ack of the first; 16 us + 4 us rounds to just below 20 us in floating
        # point, so this send is logged before the backward span that ends at 20 us
        ("worker0", "push", 1, 16.0, 20.0, 4000, "server0"),
        ("worker0", "backward", 0, 10.0, 20.0, 0, ""),
        ("server0", "pull", 1, 21.0, 25.0, 4000, "worker0"),
        ("worker0", "push", 0, 22.0, 26.0, 4000, "server0"),  # overtakes
        ("server0", "pull", 0, 27.0, 31.0, 4000, "worker0"),
        ("worker0", "push", 1, 28.0, 32.0, 4000, "server0"),
        ("server0", "pull", 1, 33.0, 37.0, 4000, "worker0"),
        ("worker0", "push", 1, 34.0, 38.0, 4000, "server0"),
        ("server0", "pull", 1, 39.0, 43.0, 4000, "worker0"),
        ("worker0", "push", 1, 40.0, 44.0, 4000, "server0"),
        ("server0", "pull", 1, 45.0, 49.0, 4000, "worker0"),
    ]
    # 14 transfers: a send and a delivery each, one ack per push, process wake-ups
    assert r.events == 50


def network_trace(late_sends):
    """Run the four-host scenario below; ``late_sends``: (time_us, src, dst, bytes, prio, name)."""
    env = CountingEnvironment()
    log = []

    def us(t):
        return round(t * 1e6, 6)

    # 1 GB/s: 1000 bytes take 1 us; latency 0.5 us after the receiver's downlink
    net = Network(env, 4, bandwidth=1e9, latency=0.5e-6,
                  record=lambda m, start, end: log.append((us(end), "sent", m.data, us(start))))

    def arrive(m):
        log.append((us(env.now), "delivered", m.data))

    def send(src, dst, nbytes, prio, name):
        net.send(Message(src, dst, nbytes, prio, "push", 0, arrive, name))

    send(0, 2, 3000, 0, "X")  # holds host 2's downlink from 0 to 3 us
    send(1, 2, 1000, 0, "L")  # host 2 is busy: L waits at its port, host 1 moves on
    send(1, 3, 1000, 0, "M")
    for t, *args in late_sends:
        env.timeout(t * 1e-6).callbacks.append(lambda ev, args=args: send(*args))
    env.run()
    return log, env.events


def test_full_trace_busy_receiver_queues_at_its_port():
    log, events = network_trace([(2, 3, 2, 1000, 5, "H")])
    assert log == [
        (1.0, "sent", "L", 0.0),  # the sender's uplink is free after 1 us, not at 3 us
        (2.0, "sent", "M", 1.0),
        (2.5, "delivered", "M"),
        (3.0, "sent", "X", 0.0),
        (3.0, "sent", "H", 2.0),
        (3.5, "delivered", "X"),
        (4.5, "delivered", "H"),  # the port takes H (priority 5) before L, waiting longer
        (5.5, "delivered", "L"),
    ]
    assert events == 17


def test_port_choice_includes_a_message_arriving_as_it_frees():
    # H starts at 3 us, the instant X leaves the port: it competes with L and wins.
    log, _ = network_trace([(3, 3, 2, 1000, 5, "H")])
    assert [e for e in log if e[1] == "delivered"] == [
        (2.5, "delivered", "M"), (3.5, "delivered", "X"), (4.5, "delivered", "H"),
        (5.5, "delivered", "L")]
    # Equal priorities: the earlier arrival goes first (FIFO at the port).
    log, _ = network_trace([(2, 3, 2, 1000, 0, "H")])
    assert [e[2] for e in log if e[1] == "delivered"] == ["M", "X", "L", "H"]


def test_real_pacing_delivers_like_the_simulated_port():
    # The real transport's downlink (backends/ps/transport.py) on the same scenario, as seen by
    # host 2: messages are received a little after their senders started them and the
    # engine polls now and then; the deliveries must be the simulator's.
    import heapq
    from types import SimpleNamespace

    import numpy as np

    from ddpbench.backends.ps import transport as pt
    from ddpbench.backends.ps import wire as pw

    t = pt.Transport(SimpleNamespace(rank=2), str, bandwidth_gbps=8, latency_us=0.5)

    def data(src, nbytes, prio, start_us, key):
        m = pw.Msg(pw.PUSHPULL, 2, key, 0, priority=prio, payload=np.zeros(nbytes, np.uint8),
                   flags=pw.FLAG_DATA)
        m.src, m.t_start = src, start_us * US
        return m

    pull = pw.Msg(pw.PULL, 2, 2, 0)
    pull.src = 1
    t._arrive(data(0, 3000, 0, 0.0, 0), 0.1 * US)  # X
    t._arrive(data(1, 1000, 0, 0.0, 1), 0.1 * US)  # L
    t._arrive(pull, 0.2 * US)  # a control message from host 1 stays behind its L
    t._serve_port(2.1 * US)
    t._arrive(data(3, 1000, 5, 2.0, 2), 2.2 * US)  # H
    for now in (2.3, 3.1, 4.0, 6.0):
        t._serve_port(now * US)
    got = []
    while t.arrived:
        at, _, m = heapq.heappop(t.arrived)
        got.append((round(at / US, 6), "XLH"[m.key] if m.kind == pw.PUSHPULL else "pull"))
    sim, _ = network_trace([(2, 3, 2, 1000, 5, "H")])
    assert got[:3] == [(e[0], e[2]) for e in sim if e[1] == "delivered" and e[2] != "M"]
    assert got == [(3.5, "X"), (4.5, "H"), (5.5, "L"), (5.5, "pull")]


def push_layers(result, host="worker0"):
    return [s.layer for s in result.timeline if s.kind == "push" and s.host == host]


def test_byteps_is_fifo_and_the_schedulers_let_priority_overtake():
    wl = two_layers(0, 0.01, 4000, 0, 0.01, 20_000)
    kw = dict(workers=1, servers=1, bandwidth_gbps=8, latency_us=1, partition_bytes=4000,
              iterations=1, warmup=0, force_distributed=True)
    fifo = simulate(wl, "byteps", **kw)
    assert push_layers(fifo) == [1] * 20 + [0] * 4  # ready order, whatever the priority
    window = simulate(wl, "byteps", scheduler="window", credit_bytes=4000, **kw)
    assert push_layers(window).index(0) < 20  # layer 0 overtakes queued layer-1 partitions
    # ByteScheduler: credit of 3000 parameters = 3 partitions of 1000 in flight; layer 0
    # becomes ready at 20 us, when the first credit has come back.
    bs = simulate(wl, "byteps", scheduler="credit", credit_params=3000, **kw)
    assert push_layers(bs).index(0) < 20


def test_credit_scheduler_returns_credit_when_the_push_is_acknowledged():
    # One layer of 4 partitions (1000 parameters, 4 us on the wire each), credit 2000: two
    # go at once (0-4, 4-8 us on the uplink); the third waits for the first push's answer.
    # The server's downlink carries worker 0's first push 0-4 us and worker 1's 4-8 us;
    # worker 0's is in at 5 us, acknowledged at 6 us, but the uplink is busy until 8 us:
    # push 3 at 8. Worker 0's second push waits at the downlink for worker 1's first
    # (8-12 us), is in at 13, acknowledged at 14: push 4 at 14.
    wl = Workload.from_dict({"name": "one", "batch_size": 1, "layers": [
        {"name": "l0", "fwd_ms": 0, "bwd_ms": 0, "tensors": [{"name": "a", "numel": 4000}]}]})
    r = simulate(wl, "byteps", workers=2, servers=1, bandwidth_gbps=8, latency_us=1,
                 partition_bytes=4000, scheduler="credit", credit_params=2000,
                 iterations=1, warmup=0, summation_gbps=math.inf)
    starts = [round(s.start / US, 6) for s in r.timeline if s.kind == "push" and s.host == "worker0"]
    assert starts == [0.0, 4.0, 8.0, 14.0]


@pytest.mark.parametrize("backend", ["kvstore", "byteps"])
def test_separate_push_and_pull_cost_a_round_trip(backend):
    # Latency-bound: one small part, one worker and one dedicated server. Merged: push (4 us
    # + 100 us) and the sum back (4 us + 100 us). MXNet and BytePS add the push's answer
    # and the pull request: 2 x 100 us more.
    wl = Workload.from_dict({"name": "one", "batch_size": 1, "layers": [
        {"name": "l0", "fwd_ms": 0, "bwd_ms": 0, "tensors": [{"name": "a", "numel": 1000}]}]})
    kw = dict(workers=1, servers=1, bandwidth_gbps=8, latency_us=100, iterations=1,
              warmup=0, summation_gbps=math.inf)
    if backend == "byteps":  # (one worker machine pushes only when forced)
        kw["force_distributed"] = True
    merged = simulate(wl, backend, merged_push_pull=True, **kw).iteration_time_s
    original = simulate(wl, backend, **kw).iteration_time_s
    assert merged == pytest.approx(208 * US)
    assert original == pytest.approx(408 * US)


def test_equal_priorities_reduce_p3_to_fifo():
    # One layer: every slice has the same priority, so slices leave in creation order.
    wl = Workload.from_dict({"name": "one", "batch_size": 1, "layers": [
        {"name": "l0", "fwd_ms": 0, "bwd_ms": 0,
         "tensors": [{"name": "a", "numel": 3000}, {"name": "b", "numel": 2000}]}]})
    r = simulate(wl, "p3", workers=1, servers=1, bandwidth_gbps=8, slice_params=1000,
                 water_mark=1, iterations=1, warmup=0)
    pushes = [s for s in r.timeline if s.kind == "push"]
    assert [s.start for s in pushes] == sorted(s.start for s in pushes)
    assert [s.bytes for s in pushes] == [4000] * 5


_FAST = ("resnet50", "vgg19", "seq2seq_lstm", "bert_base")


@pytest.mark.parametrize("workload", [w if w in _FAST else pytest.param(w, marks=pytest.mark.slow)
                                      for w in simulator.WORKLOADS])
def test_p3_never_slower_than_kvstore(workload):
    kw = dict(workers=4, bandwidth_gbps=10)
    p3 = simulate(workload, "p3", **kw).iteration_time_s
    kv = simulate(workload, "kvstore", **kw).iteration_time_s
    assert p3 <= 1.01 * kv
    if workload == "vgg19":
        assert p3 < 0.95 * kv


def test_deterministic():
    a = simulate("resnet50", "p3", workers=3, bandwidth_gbps=10, iterations=2)
    b = simulate("resnet50", "p3", workers=3, bandwidth_gbps=10, iterations=2)
    assert a.timeline == b.timeline and a.events == b.events and a.bytes_sent == b.bytes_sent


@pytest.mark.parametrize("kwargs,field", [
    (dict(bandwidth_gbps=-1), "bandwidth_gbps"),
    (dict(bandwidth_gbps=0), "bandwidth_gbps"),
    (dict(latency_us=-1), "latency_us"),
    (dict(workers=0), "workers"),
    (dict(servers=0), "servers"),
    (dict(iterations=2, warmup=2), "warmup"),
    (dict(compute_scale=0), "compute_scale"),
    (dict(backend="p3", slice_params=0), "slice_params"),
    (dict(backend="p3", water_mark=-1), "water_mark"),
    (dict(backend="p3", send_hwm=0), "send_hwm"),
    (dict(backend="byteps", credit_bytes=0), "credit_bytes"),
    (dict(backend="byteps", scheduler="credit", merged_push_pull=True),
     "merged_push_pull"),
    (dict(backend="p3", fusion_threshold=1), "fusion_threshold"),
    (dict(backend="nccl"), "backend"),
    (dict(workload="googlenet"), "workload"),
])
def test_bad_input_names_the_field(kwargs, field):
    args = dict(workload="resnet50", backend="kvstore", workers=2, bandwidth_gbps=10)
    args.update(kwargs)
    with pytest.raises(ValueError, match=field):
        simulate(args.pop("workload"), args.pop("backend"), **args)


def test_collective_bad_input():
    with pytest.raises(ValueError, match="op"):
        simulator.simulate_collective("gather", 10, workers=2, bandwidth_gbps=1)
    with pytest.raises(ValueError, match="nbytes"):
        simulator.simulate_collective("allreduce", 0, workers=2, bandwidth_gbps=1)
    with pytest.raises(ValueError, match="bandwidth_gbps"):
        simulator.simulate_collective("allreduce", 10, workers=2, bandwidth_gbps=-1)


def test_strategies_table_matches_contract():
    assert simulator.STRATEGIES == {
        "mpi": {},
        "horovod": {"fusion_threshold": 134217728, "cycle_time": 1.0, "hierarchical": False,
                    "coordinator": "cache", "algorithm": "mpi", "compression": "none",
                    "gradient_predivide_factor": 1.0},
        "kvstore": {"bigarray_bound": 1_000_000, "merged_push_pull": False,
                    "system": "mxnet", "local_reduce": "cpu", "scheduler": "none",
                    "partition_params": 1_000_000, "credit_params": 4_000_000,
                    "grpc_gbps": 1.3},
        "p3": {"slice_params": 40_000, "send_hwm": 1, "water_mark": 0, "priority": True,
               "local_reduce": "cpu", "ties": "heap", "sndbuf_bytes": 4_194_304,
               "server_sockets": "own"},
        "byteps": {"partition_bytes": 4_096_000, "scheduler": "byteps",
                   "credit_params": 4_000_000, "credit_bytes": 4_096_000,
                   "compression": "none", "merged_push_pull": False,
                   "force_distributed": False},
        "collective": {"nrings": 2, "fuse_grad_size_mb": 0.0},
        "zero": {"stage": 0, "reduce_bucket_size": 500_000_000,
                 "allgather_bucket_size": 500_000_000, "overlap_comm": None,
                 "reduce_scatter": True, "prefetch_bucket_size": 50_000_000,
                 "max_live_parameters": 1_000_000_000, "param_persistence_threshold": 100_000},
        "fsdp": {"sharding_strategy": "FULL_SHARD", "backward_prefetch": "BACKWARD_PRE",
                 "forward_prefetch": False, "limit_all_gathers": True, "wrap": "layer",
                 "min_num_params": 100_000_000},
    }


def test_chrome_trace_export(tmp_path):
    r = simulate("vgg19", "kvstore", workers=2, servers=1, bandwidth_gbps=10, iterations=2)
    path = r.to_chrome_trace(tmp_path / "t.json")
    data = json.loads(path.read_text())
    spans = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == len(r.timeline)
    assert {e["ph"] for e in data["traceEvents"]} == {"M", "X"}
    assert all(e["dur"] >= 0 for e in spans)
    names = {e["args"]["name"] for e in data["traceEvents"] if e["name"] == "process_name"}
    assert names == {"worker0", "worker1", "server0"}


def test_collective_rings_share_the_nic():
    # Two rings on one NIC move the same bytes as one ring: no faster when bandwidth-bound.
    wl = two_layers(0, 0, 8_000_000, 0, 0, 8_000_000)
    one = simulate(wl, "collective", workers=4, bandwidth_gbps=10, nrings=1)
    two = simulate(wl, "collective", workers=4, bandwidth_gbps=10, nrings=2)
    assert two.iteration_time_s == pytest.approx(one.iteration_time_s, rel=0.01)
    assert two.bytes_sent == one.bytes_sent


def test_collective_rings_share_the_senders_message_cost():
    # The transport's per-message cost occupies the sender like bytes do: two rings on one
    # host pay it one after the other. Two tiny tensors on two rings, 2 workers, tcp (5 us
    # per message, 5 us latency): each ring's 2 steps hold the sender for 5 us each, the
    # latency overlaps; 4 messages x 5 us + the last step's latency.
    wl = two_layers(0, 0, 1, 0, 0, 1)
    r = simulate(wl, "collective", workers=2, bandwidth_gbps=1e6, latency_us=5,
                 transport="tcp", nrings=2, iterations=1, warmup=0)
    assert r.iteration_time_s == pytest.approx(4 * 5e-6 + 5e-6, rel=1e-3)
    one = simulate(wl, "collective", workers=2, bandwidth_gbps=1e6, latency_us=5,
                   transport="tcp", nrings=1, iterations=1, warmup=0)
    assert one.iteration_time_s == pytest.approx(4 * (5e-6 + 5e-6), rel=1e-3)


def test_a_ps_lite_process_receives_at_its_socket_rate():
    # NICs of 4 GB/s, each receiving process 1 GB/s (ps-lite's one ZeroMQ socket): two
    # 1000-byte pushes from two hosts to host 2's server queue at its socket, 1 us each,
    # while a pull to host 2's worker, through the NIC's port third (0.5-0.75 us), goes
    # through the worker's own socket without waiting for theirs.
    env = CountingEnvironment()
    done: dict[str, float] = {}
    net = Network(env, 4, bandwidth=4e9, latency=0.0, record=lambda m, s, e: None,
                  socket_bandwidth=1e9)

    def send(src, dst, kind, name):
        net.send(Message(src, dst, 1000, 0, kind, 0,
                         lambda m: done.__setitem__(m.data, round(env.now * 1e6, 6)), name))

    send(0, 2, "push", "A")
    send(1, 2, "push", "B")
    send(3, 2, "pull", "C")
    env.run()
    assert done == {"A": 1.0, "B": 2.0, "C": 1.5}
    # Without the cap (or a cap above the NIC) the NIC's port alone: 0.25 us per message.
    for cap in (None, 8e9):
        env = CountingEnvironment()
        done.clear()
        net = Network(env, 4, bandwidth=4e9, latency=0.0, record=lambda m, s, e: None,
                      socket_bandwidth=cap)
        send(0, 2, "push", "A")
        send(1, 2, "push", "B")
        send(3, 2, "pull", "C")
        env.run()
        assert done == {"A": 0.25, "B": 0.5, "C": 0.75}
    with pytest.raises(ValueError, match="socket_bandwidth"):
        Network(CountingEnvironment(), 2, 1e9, 0.0, lambda m, s, e: None, socket_bandwidth=0)


def test_tcp_caps_ps_receivers_but_not_rings():
    # 30 Gbit/s over tcp: a kvstore server's socket (15 Gbit/s) is slower than its NIC, so
    # the push-pull takes longer than on a network without the cap; horovod's ring has no
    # such socket.
    from ddpbench import hardware

    assert hardware.transport("tcp").socket_gbps == 15.0
    assert hardware.transport("rdma").socket_gbps is None
    # (servers free of CPU costs, so that the network alone sets the pace)
    kw = dict(workload="vgg19", bandwidth_gbps=30, workers=4, iterations=2, warmup=1,
              summation_gbps=math.inf)
    tcp = simulate(backend="kvstore", transport="tcp", **kw).iteration_time_s
    at15 = simulate(backend="kvstore", transport="tcp", **{**kw, "bandwidth_gbps": 15})
    assert at15.iteration_time_s > tcp  # the NIC still sends at 30
    assert simulate(backend="kvstore", transport="tcp",
                    **{**kw, "bandwidth_gbps": 10}).iteration_time_s > at15.iteration_time_s


def test_simulate_cli_says_when_the_receiving_socket_binds(capsys):
    from ddpbench.cli import main as cli_main

    args = ["simulate", "--workload", "resnet50", "--workers", "2", "--transport", "tcp",
            "--iterations", "2", "--warmup", "1"]
    assert cli_main([*args, "--backend", "kvstore", "--bandwidth-gbps", "40"]) == 0
    assert "each kvstore process receives at most 15 Gbit/s" in capsys.readouterr().out
    for backend, bw in (("kvstore", "10"), ("horovod", "40")):  # below the cap; a ring
        assert cli_main([*args, "--backend", backend, "--bandwidth-gbps", bw]) == 0
        assert "receives at most" not in capsys.readouterr().out


def test_simulate_cli_says_when_a_colocated_server_is_reached_over_the_loopback(capsys):
    from ddpbench.cli import main as cli_main

    args = ["simulate", "--workload", "resnet50", "--workers", "2", "--iterations", "2",
            "--warmup", "1", "--bandwidth-gbps", "10"]
    assert cli_main([*args, "--backend", "p3", "--transport", "tcp"]) == 0
    assert "reaches the server on its own host over the loopback" in capsys.readouterr().out
    for extra in (["--backend", "p3", "--transport", "tcp", "--servers", "2"],  # dedicated
                  ["--backend", "p3", "--transport", "ideal"],  # the local shortcut
                  ["--backend", "horovod", "--transport", "tcp"]):  # no servers
        assert cli_main([*args, *extra]) == 0
        assert "loopback" not in capsys.readouterr().out


def test_engine_orders_callbacks_and_simpy_events_on_one_heap():
    # Scheduled callbacks (call_later) and simpy events share one heap of
    # (time, priority, id, function, value): one instant runs urgent first, then in order
    # of scheduling; run(until=...) steps through the same heap; a failure nobody handles
    # crashes the run with its own type.
    from ddpbench.simulator.network import call_later

    env = CountingEnvironment()
    seen: list[tuple[float, str]] = []

    def proc():
        yield env.timeout(2)
        seen.append((env.now, "timeout"))
        call_later(env, 0, lambda v: seen.append((env.now, v)), "same instant, later id")

    call_later(env, 2, lambda v: seen.append((env.now, v)), "callback before")
    env.process(proc())
    call_later(env, 2, lambda v: seen.append((env.now, v)), "urgent", 0)
    call_later(env, 1, lambda v: seen.append((env.now, v)), "earlier")
    env.run(until=1.5)
    assert seen == [(1, "earlier")] and env.now == 1.5
    env.run()
    assert seen == [(1, "earlier"), (2, "urgent"), (2, "callback before"), (2, "timeout"),
                    (2, "same instant, later id")]
    # 4 callbacks; the process's start, its timeout and its end; the until event; and the
    # final look at an empty heap that run() counts as step() did
    assert env.events == 9

    def failing():
        yield env.timeout(1)
        raise KeyError("lost")

    env.process(failing())
    with pytest.raises(KeyError, match="lost"):
        env.run()


@pytest.mark.parametrize("latency", [0.0, 2e-6])
def test_a_fifo_port_delivers_as_the_priority_port_does(latency):
    # Hosts 0..3 send messages of different sizes to host 3, some at the same instant and
    # some while the port is busy, all of priority 0. A FIFO port fixes each turn on
    # arrival (no event when it frees) and keeps its deliveries beside the heap; the times
    # are those of the deciding port, since nothing arrives in the same instant out of
    # order here, and the FIFO port needs fewer events.
    def run(fifo):
        env = CountingEnvironment()
        done: dict[str, float] = {}
        net = Network(env, 4, bandwidth=1e9, latency=latency, record=lambda m, s, e: None)
        if fifo:
            assert net.use_fifo_ports()

        def send(src, nbytes, name):
            net.send(Message(src, 3, nbytes, 0, "push", 0,
                             lambda m: done.__setitem__(m.data, round(env.now * 1e9, 3)), name))

        for i, (src, nbytes) in enumerate([(0, 1000), (1, 3000), (0, 500), (2, 2000),
                                           (1, 100), (2, 700)]):
            send(src, nbytes, f"m{i}")
        env.run()
        return done, env.events

    fifo, fifo_events = run(True)
    deciding, deciding_events = run(False)
    assert fifo == deciding
    # hand-worked: the port carries 1000 B (host 0's first) from t=0, then host 1's
    # 3000 B, which reached it at t=0 too, then host 2's 2000 B, in arrival order
    assert fifo["m0"] == pytest.approx(1000 + latency * 1e9)
    assert fifo["m1"] == pytest.approx(4000 + latency * 1e9)
    assert fifo_events < deciding_events


def test_a_fifo_port_refuses_a_prioritised_message():
    env = CountingEnvironment()
    net = Network(env, 2, bandwidth=1e9, latency=0.0, record=lambda m, s, e: None)
    net.use_fifo_ports()
    net.send(Message(0, 1, 100, 2, "push", 0, lambda m: None))
    with pytest.raises(RuntimeError, match="FIFO port"):
        env.run()


def test_racks_keep_the_deciding_ports():
    env = CountingEnvironment()
    net = Network(env, 4, bandwidth=1e9, latency=0.0, record=lambda m, s, e: None,
                  oversubscription=2.0, rack_size=2)
    assert not net.use_fifo_ports()
    assert not any(p.fifo for p in net.down)


@pytest.mark.parametrize("workers", [2, 3, 8])
def test_horovod_coordinators_of_each_era_closed_form(workers):
    # One tensor, no compute, cycle_time 0: an iteration is one cycle, its coordination,
    # the tensor's response cost and the ring. 'cache' (v0.16.2 on): one bitwise allreduce
    # of ceil(log2 p) rounds once the tensor is cached (the warm-up iteration's is not);
    # 'gather' (v0.13.4-v0.16.1): three collectives of as many rounds; 'p2p'
    # (v0.9-v0.13.3): rank 0 takes p-1 requests one by one, then sends the response to p-1
    # ranks one by one.
    wl = simulator.Workload.from_dict({"name": "one", "batch_size": 1, "layers": [
        {"name": "l0", "fwd_ms": 0, "bwd_ms": 0, "tensors": [{"name": "t0", "numel": 1000}]}]})
    kw = dict(workers=workers, bandwidth_gbps=10, transport="rdma", latency_us=5,
              iterations=3, warmup=1, cycle_time=0.0)
    t = {c: simulate(wl, "horovod", coordinator=c, **kw).iteration_time_s
         for c in ("cache", "gather", "p2p")}
    hop, msg = 5e-6 + 2e-6, 2e-6
    rounds = math.ceil(math.log2(workers))
    assert t["gather"] - t["cache"] == pytest.approx(2 * rounds * hop, rel=1e-9)
    p2p = 2 * (hop + (workers - 1) * msg)
    assert t["p2p"] - t["cache"] == pytest.approx(p2p - rounds * hop, rel=1e-9)
    # the warm-up iteration's uncached tensor went the gather way under 'cache' too
    first = simulate(wl, "horovod", coordinator="cache", **{**kw, "iterations": 1,
                                                             "warmup": 0})
    gathered = simulate(wl, "horovod", coordinator="gather", **{**kw, "iterations": 1,
                                                                 "warmup": 0})
    assert first.iteration_time_s == pytest.approx(gathered.iteration_time_s + rounds * hop,
                                                   rel=1e-9)


def test_byteps_on_one_worker_machine_reduces_and_broadcasts_without_servers():
    # BytePS with DMLC_NUM_WORKER=1 is not a distributed job: no push, no pull, whatever the
    # network; with force_distributed (BYTEPS_FORCE_DISTRIBUTED) it pushes as usual.
    wl = Workload.from_dict({"name": "one", "batch_size": 1, "layers": [
        {"name": "l0", "fwd_ms": 0, "bwd_ms": 0, "tensors": [{"name": "a", "numel": 1_000_000}]}]})
    kw = dict(workers=1, servers=1, bandwidth_gbps=1, latency_us=100, iterations=2)
    alone = simulate(wl, "byteps", **kw)
    assert alone.iteration_time_s == 0 and alone.bytes_sent["worker0"] == 0
    forced = simulate(wl, "byteps", force_distributed=True, **kw)
    assert forced.iteration_time_s > 0.06 and forced.bytes_sent["worker0"] == 4_000_000
    # a host of 8 GPUs still reduces and broadcasts over its own link
    host = simulate(wl, "byteps", hosts=1, gpus_per_host=8, bandwidth_gbps=1, iterations=2)
    assert host.iteration_time_s > 0 and host.bytes_sent["host0"] == 0


def test_simulate_cli_counts_ncclss_connections_in_the_ring_note(capsys):
    from ddpbench.cli import main as cli_main

    args = ["simulate", "--workload", "resnet50", "--backend", "horovod", "--hosts", "2",
            "--gpus-per-host", "2", "--intra-link", "nvlink", "--transport", "tcp",
            "--device", "V100", "--iterations", "2", "--warmup", "1"]
    assert cli_main([*args, "--bandwidth-gbps", "40"]) == 0  # two channels: 30 Gbit/s
    assert "at most 30 Gbit/s (2 TCP connections of 15" in capsys.readouterr().out
    assert cli_main([*args, "--bandwidth-gbps", "25"]) == 0  # 30 is above a 25 Gbit/s NIC
    assert "moves at most" not in capsys.readouterr().out
    assert cli_main([*args, "--bandwidth-gbps", "40", "--nccl-version", "2.3.7"]) == 0
    assert "at most 15 Gbit/s (one TCP connection" in capsys.readouterr().out


def test_horovod_on_a_gpu_goes_on_cycling_while_its_allreduces_run():
    # A big gradient is ready first, then two small ones while it is reduced. On the CPU the
    # loop waits for the big allreduce, so the two small ones fuse in the next cycle; on a GPU
    # the loop hands the allreduce to the stream and its finalizer (horovod's
    # finalizer_thread, FinalizeGPUQueue) and goes on cycling, so each small one goes in a
    # cycle of its own while the big one is still on the wire, and the stream runs them after.
    wl = simulator.Workload.from_dict({"name": "three", "batch_size": 1, "device": "pipedream",
                                       "matmul_fraction": 1.0, "layers": [
        {"name": "l0", "fwd_ms": 0, "bwd_ms": 2, "tensors": [{"name": "a", "numel": 1000}]},
        {"name": "l1", "fwd_ms": 0, "bwd_ms": 2, "tensors": [{"name": "b", "numel": 1000}]},
        {"name": "l2", "fwd_ms": 0, "bwd_ms": 1, "tensors": [{"name": "big", "numel": 25_000_000}]},
    ]})
    kw = dict(workers=4, bandwidth_gbps=10, transport="rdma", iterations=1, warmup=0,
              cycle_time=1.0, overlap_slowdown=0.0)
    cpu = simulate(wl, "horovod", **kw)
    gpu = simulate(wl, "horovod", device="pipedream", **kw)
    assert [names for _, names in cpu.fusion_groups] == [["big"], ["b", "a"]]
    assert [names for _, names in gpu.fusion_groups] == [["big"], ["b"], ["a"]]
    starts = [start for start, _ in gpu.fusion_groups]
    big_done = cpu.fusion_groups[1][0]  # the CPU's second cycle starts when big is done
    assert starts[1] < big_done and starts[2] < big_done  # planned while big was reduced


@pytest.mark.parametrize("workers", [2, 3, 4])
def test_bytescheduler_over_the_kvstore_follows_rank_0s_priority_order(workers):
    # Three layers of one 1M-element tensor (one ByteScheduler partition each), ready at
    # once in backward order (l2, l1, l0), one partition of credit: rank 0 starts l2, then,
    # when its push and pull are done, l0 (the best) before l1; every worker pushes in that
    # order, the barrier keys holding them until rank 0 has started each partition. Without
    # ByteScheduler MXNet pushes in the order the gradients came (FIFO).
    wl = simulator.Workload.from_dict({"name": "three", "batch_size": 1, "layers": [
        {"name": f"l{i}", "fwd_ms": 0, "bwd_ms": 0,
         "tensors": [{"name": f"t{i}", "numel": 1_000_000}]} for i in range(3)]})
    kw = dict(workers=workers, bandwidth_gbps=10, transport="rdma", iterations=1, warmup=0)
    bs = simulate(wl, "kvstore", scheduler="bytescheduler", credit_params=1_000_000, **kw)
    plain = simulate(wl, "kvstore", **kw)

    def order(r, w):
        pushes = sorted((s.start, s.layer) for s in r.timeline
                        if s.kind == "push" and s.host == f"worker{w}" and s.bytes > 4)
        return list(dict.fromkeys(layer for _, layer in pushes))

    for w in range(workers):
        assert order(bs, w) == [2, 0, 1], w
        assert order(plain, w) == [2, 1, 0], w
    # each partition's barrier (one element) went to its server from every worker
    barriers = [s for s in bs.timeline if s.kind == "push" and s.bytes == 4]
    assert len(barriers) <= 3 * workers


def test_bytescheduler_cuts_arrays_and_numbers_keys_as_its_kvstore_wrapper_inits_them():
    from ddpbench.rules import placement

    assert placement.bytescheduler_partitions(1_000_000, 1_000_000) == [1_000_000]
    assert placement.bytescheduler_partitions(2_500_001, 1_000_000) == [833_333, 833_334,
                                                                        833_334]
    # per array: its own barrier, its partitions' barriers (when cut), then the partitions
    keys, barriers = placement.bytescheduler_keys([[10], [3, 3, 4], [5]])
    assert keys == [[1], [6, 7, 8], [10]]
    assert barriers == [[0], [3, 4, 5], [9]]
    assert placement.bytescheduler_keys([[10]], start=4) == ([[5]], [[4]])


def test_collective_fuses_fleets_buckets_into_one_allreduce_each():
    # Two layers of small gradients, 32 MB buckets (Paddle fleet's fuse_all_reduce_ops): both
    # layers fit one bucket, which goes as one ring allreduce of their sum once the last
    # gradient is ready; unfused, each gradient is its own allreduce (two rings of the same
    # bytes). On the ideal network the fused iteration is backward plus that one ring.
    wl = simulator.Workload.from_dict({"name": "two", "batch_size": 1, "layers": [
        {"name": "l0", "fwd_ms": 1, "bwd_ms": 1, "tensors": [{"name": "l0.w", "numel": 300_000},
                                                             {"name": "l0.b", "numel": 1000}]},
        {"name": "l1", "fwd_ms": 1, "bwd_ms": 1, "tensors": [{"name": "l1.w", "numel": 200_000}]},
    ]})
    kw = dict(workers=4, bandwidth_gbps=10, iterations=3, warmup=1, nrings=1)
    fused = simulate(wl, "collective", fuse_grad_size_mb=32.0, **kw)
    plain = simulate(wl, "collective", **kw)
    assert fused.bytes_sent == plain.bytes_sent
    p, n = 4, 501_000
    ring = 2 * (p - 1) * (5e-6 + math.ceil(n / p) * 4 / (10e9 / 8))
    assert fused.iteration_time_s == pytest.approx(4e-3 + ring, rel=1e-9)
    assert plain.iteration_time_s != fused.iteration_time_s
