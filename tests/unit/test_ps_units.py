"""Parameter-server pieces that need no MPI: placement, wire format, gates, SGD, traces."""

from __future__ import annotations

import json

import numpy as np
import pytest

import ddpbench
from ddpbench import trace
from ddpbench.backends.ps import transport, wire
from ddpbench.backends.ps.kvstore import KVStoreBackend
from ddpbench.backends.ps.p3 import P3Store
from ddpbench.rules import placement


class _Sent:
    """A fake MPI request that has completed (for transports on a fake communicator)."""

    def Test(self):  # noqa: N802 - mpi4py's name
        return True


def test_even_split_matches_array_split():
    for n, s in [(10, 3), (7, 7), (1_000_001, 4)]:
        parts = placement.even_split(n, s)
        shares = np.array_split(np.arange(n), s)
        assert [(p.offset, p.count, p.server) for p in parts] == [
            (int(a[0]) if len(a) else p.offset, len(a), i) for i, (a, p) in enumerate(zip(shares, parts))]


# The originals' formulas, written out here independently of ddpbench's placement module.
def p3_formula(key, numel, bound, servers):
    """P3's MXNet fork, src/kvstore/kvstore_dist.h, EncodeDefaultKey."""
    if numel < bound:
        return [(0, numel, (key * 9973) % servers)]
    out, s, i = [], numel, 0
    while True:
        ln = bound if s > bound else s
        out.append((i * bound, ln, i % servers))
        if s <= bound:
            return out
        s -= bound
        i += 1


def byteps_formula(declared, numel, bound, servers):
    """byteps/common/operations.cc (keys) and global.cc (Hash_DJB2, EncodeDefaultKey)."""
    out, start = [], 0
    key = declared << 16
    while start < numel:
        h = 5381
        for ch in str(key):
            h = ((h << 5) + h + ord(ch)) & 0xFFFFFFFFFFFFFFFF
        ln = min(bound, numel - start)
        out.append((start, ln, h % servers))
        start, key = start + ln, key + 1
    return out


SIZES = [1, 39_999, 40_000, 40_001, 120_000, 1_000_003]


@pytest.mark.parametrize("servers", range(1, 9))
def test_p3_placement_is_p3s_formula(servers):
    for key in range(40):
        for n in SIZES:
            got = [(p.offset, p.count, p.server)
                   for p in placement.p3_parts(key, n, 40_000, servers)]
            assert got == p3_formula(key, n, 40_000, servers), (key, n)
    # the slice count restarts for every key: the first slice of a big array is on server 0
    assert {placement.p3_parts(k, 80_000, 40_000, servers)[0].server for k in range(9)} == {0}


@pytest.mark.parametrize("servers", range(1, 9))
def test_byteps_placement_is_byteps_djb2_formula(servers):
    for declared in range(40):
        for n in SIZES:
            got = [(p.offset, p.count, p.server)
                   for p in placement.byteps_parts(declared, n, 1_024_000, servers)]
            assert got == byteps_formula(declared, n, 1_024_000, servers), (declared, n)
    assert placement.djb2(0) == 5381 * 33 + ord("0")


@pytest.mark.parametrize("servers", range(1, 9))
def test_kvstore_placement_is_mxnets(servers):
    for key in range(40):
        assert [(p.offset, p.count, p.server)
                for p in placement.kvstore_parts(key, 999_999, 1_000_000, servers)] == [
            (0, 999_999, key * 9973 % servers)]
    big = placement.kvstore_parts(3, 1_000_003, 1_000_000, servers)
    assert [p.server for p in big] == list(range(servers))
    # MXNet's shares: round(n / S * (i + 1)) - round(n / S * i) in double, halves away
    # from zero (EncodeDefaultKey), not np.array_split's (the first n % S one larger)
    for n in (1_000_003, 1_000_001, 102_760_448, 2_000_002, 1_000_000):
        bounds = [int(np.floor(np.float64(n) / servers * i + 0.5)) for i in range(servers + 1)]
        parts = placement.kvstore_parts(3, n, 1_000_000, servers)
        assert [(p.offset, p.count) for p in parts] == [
            (bounds[i], bounds[i + 1] - bounds[i]) for i in range(servers)]
        assert sum(p.count for p in parts) == n
    assert [p.count for p in placement.mxnet_split(10, 3)] == [3, 4, 3]
    assert [p.count for p in placement.mxnet_split(1_000_001, 2)] == [500_001, 500_000]


@pytest.mark.parametrize("workload", ["vgg19", "resnet50"])
@pytest.mark.parametrize("servers", [1, 2, 3, 4])
def test_simulator_places_parts_where_the_real_backends_do(workload, servers):
    # The simulator keys each tensor as the original's front end declares it
    # (placement.declared_keys: BytePS-PyTorch's sorted names, MXNet's and P3's definition
    # order), the key the real backends' counter gives it (tests/mpi/test_ps.py::
    # test_the_key_counter_places_as_the_originals_front_ends_declare), so every part lies
    # on the same server in both.
    from types import SimpleNamespace

    from ddpbench.simulator import load_workload
    from ddpbench.simulator.strategies import BytepsStrategy, P3Strategy

    wl = load_workload(workload)
    names = [t.name for t in wl.tensors]
    for cls, knobs, rule in (
            (P3Strategy, {"slice_params": 40_000},
             lambda k, n: placement.p3_parts(k, n, 40_000, servers)),
            (BytepsStrategy, {"partition_bytes": 4_096_000},
             lambda k, n: placement.byteps_parts(k, n, 1_024_000, servers))):
        sim = SimpleNamespace(workload=wl, num_servers=servers, itemsize=4,
                              server_host=lambda j: j)
        strat = cls.__new__(cls)
        strat.sim, strat.knobs = sim, cls.parse_knobs(knobs)
        keys = placement.declared_keys(cls.name, names)
        got = [(p.layer, p.numel, p.server) for p in strat.make_parts()]
        want = [(t.layer, p.count, p.server) for key, t in zip(keys, wl.tensors)
                for p in rule(key, t.numel)]
        assert got == want
    if servers != 3:
        return
    # MXNet's requests are FIFO: kvstore's parts carry no priority
    from ddpbench.simulator.strategies import KvstoreStrategy

    strat = KvstoreStrategy.__new__(KvstoreStrategy)
    strat.sim = SimpleNamespace(workload=wl, num_servers=3, itemsize=4,
                                server_host=lambda j: j)
    strat.knobs = KvstoreStrategy.parse_knobs({})
    parts = strat.make_parts()
    assert {p.priority for p in parts} == {0}
    assert [(p.numel, p.server) for p in parts] == [
        (p.count, p.server) for key, t in enumerate(wl.tensors)
        for p in placement.kvstore_parts(key, t.numel, 1_000_000, 3)]


def test_message_round_trip_keeps_header_and_payload():
    x = np.arange(5, dtype=np.float64) / 3
    msg = wire.Msg(wire.PUSHPULL, 2, key=7, part=3, priority=-4, payload=x, dtype="float64",
                 op="max", postscale=0.25, root=1, flags=wire.FLAG_DATA | wire.FLAG_GATED)
    msg.t_start = 12.5
    head = np.frombuffer(msg.encode(), np.uint8)
    assert head.nbytes == wire.HEADER.size  # the elements travel as their own message
    back = wire.Msg.decode(head, src=1, dst=2)
    assert back.payload is None and back.count == 5
    back.payload = np.frombuffer(msg.data().tobytes(), np.uint8).view(back.dtype)
    got = (back.kind, back.key, back.part, back.priority, back.op, back.postscale, back.root,
           back.flags, back.t_start, back.count, back.src)
    assert got == (wire.PUSHPULL, 7, 3, -4, "max", 0.25, 1, msg.flags, 12.5, 5, 1)
    assert np.array_equal(back.payload, x) and back.payload.dtype == np.float64
    assert back.nbytes == 40
    ctrl = wire.Msg.decode(np.frombuffer(wire.Msg(wire.PULL, 0, key=1).encode(), np.uint8),
                           0, 0)
    assert ctrl.payload is None and ctrl.nbytes == 0


def test_a_push_says_where_its_elements_lie_and_the_server_places_its_buffers_there():
    # MPICH's copy between processes runs at half speed between buffers at different
    # offsets within a cache line: the push carries both offsets, the server follows them.
    from types import SimpleNamespace

    from ddpbench.backends.ps.server import Server

    msg = wire.Msg(wire.PUSHPULL, 1, key=1, flags=wire.FLAG_DATA)
    msg.src_align, msg.dst_align = 16, 48
    back = wire.Msg.decode(np.frombuffer(msg.encode(), np.uint8), src=0, dst=1)
    assert (back.src_align, back.dst_align) == (16, 48)

    server = Server(transport.Transport(SimpleNamespace(rank=2), str), 2, "server0", True)

    def push(src, align, dst_align=0, count=1 << 16):
        m = wire.Msg(wire.PUSHPULL, 2, key=5, flags=wire.FLAG_DATA, dtype="float32")
        m.src, m.count, m.src_align, m.dst_align = src, count, align, dst_align
        buf = server._push_sink(m)
        m.payload, m.sunk = buf, True
        return m, buf

    first = push(0, 16)[1]
    assert first.ctypes.data % wire.ALIGN == 16 and first.size == 1 << 16
    assert push(0, 16)[1] is first  # reused while the push stays where it was
    moved = push(0, 32)[1]
    assert moved is not first and moved.ctypes.data % wire.ALIGN == 32
    assert push(0, 48)[1] is moved  # re-placed once at most: the arena cannot grow
    other = push(1, 0)[1]
    assert other.ctypes.data % wire.ALIGN == 0
    assert push(1, 2)[1] is other  # an offset that float32 cannot start at is ignored
    a, b = push(0, 32, dst_align=48)[0], push(1, 0, dst_align=16)[0]
    a.payload[...], b.payload[...] = 1.0, 2.0
    acc = server._combine(server._slot(a), {0: a, 1: b})
    assert acc.ctypes.data % wire.ALIGN == 48 and np.all(acc == 3.0)  # where rank 0 wants it
    assert push(0, 56, count=10)[1].size == 10  # small buffers are ordinary arrays


def test_an_unpaced_server_answers_each_push_at_once():
    # ps-lite's server answers from its receiving thread straight into the socket
    # (KVServer::Response): unpaced, the reply is on MPI before the handler returns, not
    # held until the receive batch it came in ends; paced, it waits for the uplink's turn.
    from types import SimpleNamespace

    from ddpbench.backends.ps.server import Server

    posted = []
    comm = SimpleNamespace(rank=1, Isend=lambda buf, dst, tag: posted.append((dst, tag)) or _Sent())
    for pacing, at_once in ((None, True), (8.0, False)):
        posted.clear()
        t = transport.Transport(comm, str, bandwidth_gbps=pacing)
        t.serving = True  # a dedicated server rank: no sockets
        server = Server(t, 1, "server0", True)
        for part in range(2):
            m = wire.Msg(wire.PUSHPULL, 1, key=3, part=part, flags=wire.FLAG_DATA,
                         dtype="float32")
            m.src, m.count = 0, 40_000
            m.payload = server._push_sink(m)
            m.sunk = True
            t.handlers[m.kind](m)
            assert (posted == [(0, wire.TAG), (0, wire.TAG_DATA)] * (part + 1)) is at_once
            assert bool(t.queued) is not at_once


def test_a_server_keeps_a_workers_buffer_without_reading_its_address_again():
    # The same push again (size, type, offset) reuses the placed buffer from a table; a
    # new offset still goes through the placement rule (and is re-placed once at most).
    from types import SimpleNamespace

    from ddpbench.backends.ps.server import Server

    server = Server(transport.Transport(SimpleNamespace(rank=2), str), 1, "server0", True)

    def push(align):
        m = wire.Msg(wire.PUSHPULL, 2, key=5, flags=wire.FLAG_DATA, dtype="float32")
        m.src, m.count, m.src_align = 0, 1 << 16, align
        return server._push_sink(m)

    first = push(16)
    assert push(16) is first
    assert server._slot(wire.Msg(wire.PUSH, 2, key=5)).kept[0][0] is first
    assert push(16) is first
    moved = push(32)
    assert moved is not first and moved.ctypes.data % wire.ALIGN == 32
    assert push(48) is moved and push(32) is moved


def test_gate_lets_one_oversized_message_through_alone():
    g = transport.Gate(100)
    assert g.fits(500)  # nothing in flight
    g.used = 60
    assert g.fits(40) and not g.fits(41)


def test_a_dedicated_server_is_hot_while_a_quiet_worker_is_not():
    # The engine spins longer only while a protocol is hot: a worker with nothing in
    # flight may sleep between polls, a server rank waits for the next push.
    from types import SimpleNamespace

    t = transport.Transport(SimpleNamespace(rank=1), str)
    assert not t.hot()
    t.serving = True
    assert t.hot()
    t.serving, t.expecting = False, lambda: True
    assert t.hot()


def test_sgd_update_is_mxnets_update():
    opt = ddpbench.SGD(lr=0.1, momentum=0.9, wd=0.01, rescale_grad=0.5, clip_gradient=1.0)
    w = np.array([1.0, -2.0, 3.0])
    g = np.array([4.0, 0.5, -1.0])
    ref_w, mom = w.copy(), np.zeros(3)
    for _ in range(3):
        r = np.clip(0.5 * g, -1, 1) + 0.01 * ref_w
        mom = 0.9 * mom - 0.1 * r
        ref_w = ref_w + mom
    state = opt.create_state(w)
    for _ in range(3):
        opt.update(w, g, state)
    np.testing.assert_allclose(w, ref_w, rtol=1e-15)
    assert g.tolist() == [4.0, 0.5, -1.0]  # the caller's gradient is left alone
    plain = np.array([1.0, 2.0])
    assert ddpbench.SGD(lr=0.5).create_state(plain) is None
    ddpbench.SGD(lr=0.5).update(plain, np.array([2.0, 4.0]), None)
    assert plain.tolist() == [0.0, 0.0]


def _sgd_kernel_reference(w, g, mom, lr, m, wd, r, clip):
    """MXNet 1.x's SGDKernel / SGDMomKernel (src/operator/optimizer_op-inl.h), one element
    at a time in float32 scalars, in the kernel's order of operations."""
    f = np.float32
    lr, m, wd, r = f(lr), f(m), f(wd), f(r)
    w, mom = w.copy(), None if mom is None else mom.copy()
    for i in range(w.size):
        rg = r * g[i]
        if clip is not None:
            rg = min(max(rg, -f(clip)), f(clip))
            gterm = lr * rg
        else:
            gterm = lr * r * g[i]
        if mom is None:
            w[i] = (f(1) - lr * wd) * w[i] - gterm
        else:
            mom[i] = m * mom[i] - lr * wd * w[i] - gterm
            w[i] = w[i] + mom[i]
    return w, mom


@pytest.mark.parametrize("momentum,clip", [(0.9, None), (0.9, 0.05), (0.0, None), (0.0, 0.05)])
def test_sgd_is_mxnets_kernel_bit_for_bit(momentum, clip):
    rng = np.random.default_rng(7)
    w = rng.standard_normal(4096).astype(np.float32)
    opt = ddpbench.SGD(lr=0.1, momentum=momentum, wd=1e-4, rescale_grad=1 / 3,
                       clip_gradient=clip)
    state, ref_w = opt.create_state(w), w.copy()
    ref_mom = None if state is None else state.copy()
    for _ in range(3):
        g = rng.standard_normal(4096).astype(np.float32)
        opt.update(w, g, state)
        ref_w, ref_mom = _sgd_kernel_reference(ref_w, g, ref_mom, 0.1, momentum, 1e-4,
                                               1 / 3, clip)
        assert w.dtype == np.float32 and np.array_equal(w, ref_w)
        if state is not None:
            assert np.array_equal(state, ref_mom)
    if momentum and clip is None:
        # the form ddpbench computed before, m*mom - lr*(r*g + wd*w), rounds otherwise
        g = rng.standard_normal(4096).astype(np.float32)
        f = np.float32
        old = f(0.9) * state - f(0.1) * (f(1 / 3) * g + f(1e-4) * w)
        new = f(0.9) * state - (f(0.1) * f(1e-4)) * w - (f(0.1) * f(1 / 3)) * g
        assert np.count_nonzero(old != new) > 100


def test_one_sgd_class_for_workers_and_servers():
    assert ddpbench.nn.SGD is ddpbench.SGD
    opt = ddpbench.SGD(lr=0.25, momentum=0.5)
    assert ddpbench.SGD(**opt.model_dump()) == opt  # what crosses the wire to the servers
    with pytest.raises(ValueError, match="lr"):
        ddpbench.SGD(lr=0)


def test_options_validate_with_the_valid_names():
    with pytest.raises(ValueError, match="valid options"):
        P3Store.parse_options({"slice": 5})
    with pytest.raises(ValueError, match="water_mark"):
        P3Store.parse_options({"water_mark": -1})
    with pytest.raises(ValueError, match="servers"):
        KVStoreBackend.parse_options({"servers": "remote"})
    assert KVStoreBackend.parse_options({}).bigarray_bound == 1_000_000
    assert P3Store.parse_options({}).slice_params == 40_000


def test_chrome_trace_has_the_simulators_layout(tmp_path):
    recs = [transport.SendRecord(10.0, 10.5, "push", 3, 0, -2, 400, "worker0", "server0"),
            transport.SendRecord(10.2, 10.3, "pull", 3, 0, -2, 400, "server0", "worker0")]
    out = trace.chrome_trace([r.span(lambda k: k - 1) for r in recs])
    spans = [e for e in out["traceEvents"] if e["ph"] == "X"]
    assert [(e["name"], e["cat"], e["tid"], round(e["ts"], 3), round(e["dur"], 3))
            for e in spans] == [("push L2", "push", 1, 0.0, 0.5e6), ("pull L2", "pull", 1, 0.2e6,
                                                                      0.1e6)]
    assert spans[0]["args"]["bytes"] == 400 and spans[0]["args"]["peer"] == "server0"
    for host, rec in (("worker0", recs[0]), ("server0", recs[1])):
        trace.write(tmp_path / f"sends.{host}.json", trace.chrome_trace([rec.span()]))
    merged = json.loads(trace.merge_chrome_traces(tmp_path, tmp_path / "all.json").read_text())
    names = {e["args"]["name"] for e in merged["traceEvents"] if e["name"] == "process_name"}
    assert names == {"worker0", "server0"}
    starts = sorted((e["ts"], e["cat"]) for e in merged["traceEvents"] if e["ph"] == "X")
    assert [(round(ts, 3), cat) for ts, cat in starts] == [(0.0, "push"), (0.2e6, "pull")]


def test_real_and_simulated_traces_come_from_one_writer(tmp_path):
    from ddpbench.simulator import simulate

    res = simulate("resnet50", "p3", workers=2, bandwidth_gbps=10, iterations=1, warmup=0)
    sim = json.loads(res.to_chrome_trace(tmp_path / "sim.json").read_text())
    rec = transport.SendRecord(1.0, 1.5, "push", 0, 0, 0, 8, "worker0", "worker1")
    real = trace.chrome_trace([rec.span()])
    lanes = {(e["pid"], e["tid"], e["args"]["name"]) for e in real["traceEvents"]
             if e["name"] == "thread_name"}
    sim_lanes = {(e["pid"], e["tid"], e["args"]["name"]) for e in sim["traceEvents"]
                 if e["name"] == "thread_name" and e["pid"] == 0}
    assert lanes == sim_lanes == {(0, 0, "compute"), (0, 1, "send"), (0, 2, "server sum")}
    assert sim["otherData"]["backend"] == "p3"


@pytest.mark.parametrize("ties,order", [
    # P3's heap (rules.sockets.StlHeap): 2, 3, 4, 10, 11 tie in the thread's heap and come
    # out 11, 4, 2, 3, 10 unless a better one arrives: 11 goes when 1 leaves the socket, 4
    # blocks the thread; 99 (1.5 us) and 98 (2.5 us) enter the heap above them; when 4
    # leaves, 2 (held) goes in, then 98, and the thread blocks on 99; then 3 and 10.
    ("heap", [0, 1, 11, 4, 2, 98, 99, 3, 10]),
    # ddpbench's FIFO ties: the thread blocks on server 1's full socket, so server 2's
    # slices (10, 11) wait behind all of server 1's; key 99 (priority 0, queued at 1.5 us)
    # is popped only when the thread unblocks and leaves fifth.
    ("fifo", [0, 1, 2, 3, 99, 98, 4, 10, 11]),
    # A kernel buffer of two messages per connection (2000 bytes): server 1's connection
    # takes 0 and 1 into the kernel, 2 into ZeroMQ's engine, 3 into the pipe; the thread
    # blocks on 4 and 10, 11 wait in its heap. At 1 us 0 has left: 2 enters the kernel, 3
    # the engine, 4 the pipe, and the thread hands 11 and 10 (heap order) into server 2's
    # empty buffer. 99 (1.5 us) blocks the thread until 1 has left (2 us); 98 (2.5 us)
    # waits in server 2's engine until 11 has left (4 us), then enters behind 4.
    ("heap+2000", [0, 1, 2, 11, 10, 3, 4, 98, 99]),
])
def test_real_sockets_send_like_the_simulated_sockets(ties, order):
    # P3's sockets (hwm 1) in the real transport and in the simulator's sender: the same
    # messages queued at the same times leave in the same order at the same times.
    import heapq
    from types import SimpleNamespace

    from ddpbench.simulator.network import CountingEnvironment, Message, Network

    nbytes, bw = 1000, 1e9  # 1 us per message at 8 Gbit/s
    # (queued at, destination, priority, key)
    sends = [(0.0, 1, -1, k) for k in range(5)] + [(0.0, 2, -1, 10 + k) for k in range(2)]
    sends += [(1.5e-6, 1, 0, 99), (2.5e-6, 2, 5, 98)]

    comm = SimpleNamespace(rank=0, Isend=lambda buf, dst, tag: _Sent())
    t = transport.Transport(comm, str, bandwidth_gbps=8, trace=True)
    ties, _, sndbuf = ties.partition("+")
    t.use_sockets(1, ties, int(sndbuf or 0))
    for i, (at, dst, prio, key) in enumerate(sends):
        m = wire.Msg(wire.PUSHPULL, dst, key, 0, priority=prio,
                     payload=np.zeros(nbytes, np.uint8), flags=wire.FLAG_DATA)
        m.src, m.seq, m.t_enq = 0, i, at
        heapq.heappush(t.queued, (at, i, (-prio, i, m)))
    t._drain_ready(1.0)
    real = [(r.key, round(r.start * 1e6, 6)) for r in t.records]

    env = CountingEnvironment()
    log = []
    net = Network(env, 3, bw, 0.0, lambda m, s, e: log.append((m.data, round(s * 1e6, 6))))
    net.senders[0].use_sockets(1, ties, int(sndbuf or 0))
    for at, dst, prio, key in sends:
        msg = Message(0, dst, nbytes, prio, "push", 0, lambda m: None, key)
        env.timeout(at).callbacks.append(lambda ev, msg=msg: net.send(msg))
    env.run()
    assert real == log
    assert [k for k, _ in real] == order
    assert [s for _, s in real] == [float(i) for i in range(9)]  # the link never idles


def test_declared_keys_follow_the_originals_front_ends():
    """BytePS-PyTorch declares "Gradient." + name for the sorted names (byteps/torch/
    __init__.py); BytePS-MXNet parameter_i, gradient_i in turn (byteps/mxnet/__init__.py);
    MXNet and P3 key by definition index."""
    from ddpbench.simulator import load_workload

    names = ["fc.weight", "conv1.weight", "bn1.bias", "layer1.0.conv1.weight"]
    assert placement.declaration_order("byteps", names) == [2, 1, 0, 3]
    assert placement.declared_keys("byteps", names) == [2, 1, 0, 3]
    assert placement.declared_keys("byteps", names, "mxnet") == [1, 3, 5, 7]
    for backend in ("p3", "kvstore"):
        assert placement.declared_keys(backend, names) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="front end"):
        placement.declaration_order("byteps", names, "jax")
    wl = load_workload("vgg19")
    vgg = [t.name for t in wl.tensors]
    keys = placement.declared_keys("byteps", vgg)
    assert [vgg[i] for i in sorted(range(len(vgg)), key=keys.__getitem__)] == sorted(vgg)
    assert vgg[keys.index(0)] == "classifier.0.bias"  # "classifier" < "features"
    assert keys[vgg.index("features.10.weight")] < keys[vgg.index("features.2.weight")]
