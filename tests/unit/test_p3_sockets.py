"""ps-lite's processes and connections (rules.sockets): a colocated worker and server are
separate processes with separate sockets on one uplink; a server's replies count against its
own connections' high-water marks; each connection has its own pipe, ZeroMQ engine and
kernel send buffer."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ddpbench.rules.sockets import Sockets, Wire


def _host(sndbuf: int, own: bool) -> list[tuple[str, float]]:
    # One host: a worker process and its colocated server, hwm 1 each, on one wire that
    # carries a 1000-byte message per microsecond. The server answers three pushes of
    # worker 1 at once; then the worker pushes one slice to server 2.
    wire: Wire = Wire()
    worker: Sockets = Sockets(1, "heap", sndbuf, wire)
    server: Sockets = Sockets(1, "fifo", sndbuf, wire)
    for i, name in enumerate(("r1", "r2", "r3")):
        m = SimpleNamespace(dst=1, nbytes=1000, name=name)
        if own:
            server.queue((0, i, m))
        else:
            server.direct(m)
    worker.queue((0, 3, SimpleNamespace(dst=2, nbytes=1000, name="p1")))
    order, t = [], 0.0
    while (m := wire.take(t)) is not None:
        order.append((m.name, t))
        t += 1.0
        wire.finish(m, t)
    assert worker.idle() and server.idle()
    return order


@pytest.mark.parametrize("sndbuf,own,expect", [
    # The server's own socket to worker 1 (no kernel buffer): r1 is in it, the server's
    # thread blocks on r2 (r3 behind it), so the worker's p1 enters the wire second; r2
    # goes in when r1 starts, r3 when r2 does.
    (0, True, ["r1", "p1", "r2", "r3"]),
    # Two messages' worth of kernel buffer per connection: r1 and r2 enter the kernel, r3
    # waits in ZeroMQ's engine until r1 has left (1 us), behind p1.
    (2000, True, ["r1", "r2", "p1", "r3"]),
    # ddpbench's earlier model: replies straight onto the wire, outside any socket.
    (0, False, ["r1", "r2", "r3", "p1"]),
])
def test_a_colocated_servers_replies_count_against_its_own_sockets(sndbuf, own, expect):
    order = _host(sndbuf, own)
    assert [n for n, _ in order] == expect
    assert [t for _, t in order] == [0.0, 1.0, 2.0, 3.0]  # the wire never idles


def test_each_connection_holds_pipe_engine_and_kernel_buffer():
    # hwm 1, kernel buffer 3000 bytes, 1000-byte messages: before the thread blocks, one
    # connection takes 3 (kernel) + 1 (engine) + 1 (pipe) = 5 messages; the sixth to it
    # blocks the thread, and a message to another connection queued behind it waits.
    s: Sockets = Sockets(1, "fifo", 3000)
    for i in range(6):
        s.queue((0, i, SimpleNamespace(dst=1, nbytes=1000, i=i)))
    s.queue((0, 6, SimpleNamespace(dst=2, nbytes=1000, i=6)))
    assert [m.i for _, m, _ in s.wire.q] == [0, 1, 2]
    assert [m.i for m in s.held[1]] == [3, 4] and s.blocked.i == 5 and len(s.ready) == 1
    first = s.take()
    assert [m.i for _, m, _ in s.wire.q] == [1, 2]  # its bytes stay until it has left
    s.finish(first)
    # 3 enters the kernel, 4 the engine, 5 the pipe; the thread then hands 6 to server 2
    assert [m.i for _, m, _ in s.wire.q] == [1, 2, 3, 6]
    assert [m.i for m in s.held[1]] == [4, 5] and s.blocked is None


def test_a_message_larger_than_the_buffer_enters_it_alone():
    s: Sockets = Sockets(1, "fifo", 16384)
    for i in range(3):
        s.queue((0, i, SimpleNamespace(dst=1, nbytes=160_000, i=i)))
    assert [m.i for _, m, _ in s.wire.q] == [0] and [m.i for m in s.held[1]] == [1, 2]


def test_bad_socket_sizes_are_errors():
    with pytest.raises(ValueError, match="hwm must be >= 1 message"):
        Sockets(0)
    with pytest.raises(ValueError, match="sndbuf must be >= 0 bytes"):
        Sockets(1, "heap", -1)
