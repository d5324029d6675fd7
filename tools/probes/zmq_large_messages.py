"""One ZeroMQ PUSH/PULL connection over loopback TCP: receive rate against message size.

Messages above glibc's largest mmap threshold (32 MiB) land in a fresh mapping at the
receiver (libzmq allocates each large message anew), so their rate falls by the page
faults of every 4 KiB (see page_fault_cost.c). Each size is measured three times, in
the order small to large, large to small, small to large, in one run.

    python -m venv /tmp/zq && /tmp/zq/bin/pip install pyzmq
    /tmp/zq/bin/python tools/probes/zmq_large_messages.py
"""

import multiprocessing as mp
import time

import zmq

SIZES = [1 << 20, 4 << 20, 16 << 20, 64 << 20, 128 << 20]
TOTAL = 1 << 30  # bytes per measurement


def sender(port: int, order: list[int]) -> None:
    ctx = zmq.Context()
    s = ctx.socket(zmq.PUSH)
    s.connect(f"tcp://127.0.0.1:{port}")
    bufs = {n: bytearray(n) for n in SIZES}
    for n in order:
        for _ in range(max(2, TOTAL // n)):
            s.send(bufs[n], copy=False)
    s.send(b"x")
    s.close()
    ctx.term()


def main() -> None:
    order = SIZES + SIZES[::-1] + SIZES
    ctx = zmq.Context()
    r = ctx.socket(zmq.PULL)
    port = r.bind_to_random_port("tcp://127.0.0.1")
    p = mp.Process(target=sender, args=(port, order))
    p.start()
    rates: dict[int, list[float]] = {n: [] for n in SIZES}
    for n in order:
        k = max(2, TOTAL // n)
        r.recv(copy=False)  # the clock starts after the first message
        t0 = time.perf_counter()
        for _ in range(k - 1):
            r.recv(copy=False)
        rates[n].append((k - 1) * n / (time.perf_counter() - t0) * 8 / 1e9)
    r.recv()
    p.join()
    for n in SIZES:
        print(f"{n >> 20:4d} MiB " + " ".join(f"{g:6.1f}" for g in rates[n]) + " Gbit/s")


if __name__ == "__main__":
    main()
