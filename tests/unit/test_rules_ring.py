"""The ring driver of ddpbench.rules.ring, its ranks run in lockstep in one process.

Each rank's generator yields a step's (send, recv) views; the test moves every rank's send
into its right neighbour's recv, as a transport would, then resumes them all.
"""

from __future__ import annotations

import numpy as np
import pytest

from ddpbench import numerics
from ddpbench.rules.ring import (
    LINE,
    Scratch,
    bytes_per_rank,
    chunk_sizes,
    ring_chunks,
    ring_steps,
    send_chunk,
)

SIZES = [0, 1, 2, 3, 5, 1000, 4099]


def run_ring(bufs: list[np.ndarray], combine: np.ufunc = np.add,
             scratches: list[Scratch] | None = None) -> tuple[list[int], list[list[int]]]:
    """Reduce ``bufs`` (one per rank) in place; return each rank's bytes sent and the
    recv offset within a cache line (relative to the chunk's) of every reduce-scatter step."""
    p = len(bufs)
    gens = [ring_steps(b, r, p, combine, scratches[r] if scratches else None)
            for r, b in enumerate(bufs)]
    sent = [0] * p
    lines: list[list[int]] = [[] for _ in range(p)]
    for step in range(2 * (p - 1)):
        pairs = [next(g) for g in gens]
        for r, (send, recv) in enumerate(pairs):
            _, dst = pairs[(r + 1) % p]
            assert dst.nbytes == send.nbytes, (step, r)
            dst[...] = send
            sent[r] += send.nbytes
            if step < p - 1 and recv.nbytes:  # reduce-scatter: into the scratch buffer
                off = ring_chunks(bufs[r].size, p)[send_chunk(r - 1, step, p)][0]
                chunk_at = bufs[r].ctypes.data + off * bufs[r].itemsize
                lines[r].append((recv.ctypes.data - chunk_at) % LINE)
    for g in gens:
        assert next(g, None) is None, "the ring yields 2(p - 1) steps, then ends"
    return sent, lines


@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("n", SIZES)
def test_ring_sums_exactly_and_sends_the_chunks_it_should(p, n):
    rng = np.random.default_rng(100 * p + n)
    xs = [rng.integers(-1000, 1000, n).astype(np.float32) for _ in range(p)]
    bufs = [x.copy() for x in xs]
    sent, lines = run_ring(bufs)
    want = np.sum(np.stack(xs).astype(np.float64), axis=0)
    for b in bufs:  # small integers: every order sums exactly in float32
        np.testing.assert_array_equal(b, want.astype(np.float32))
    assert sent == list(bytes_per_rank(n, p, 4))
    # each reduce-scatter step receives at its chunk's offset within a cache line
    assert all(k == 0 for ks in lines for k in ks)


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("op", ["sum", "max", "min", "product"])
def test_ring_reduces_in_the_order_the_numerics_emulator_models(p, op):
    # fp16: the order of the partial sums shows in the bits
    rng = np.random.default_rng(p)
    xs = [(rng.standard_normal(4099) * 300).astype(np.float16) for _ in range(p)]
    if op == "product":
        xs = [(1 + rng.standard_normal(4099) / 8).astype(np.float16) for _ in range(p)]
    bufs = [x.copy() for x in xs]
    ufunc = {"sum": np.add, "max": np.maximum, "min": np.minimum, "product": np.multiply}[op]
    run_ring(bufs, ufunc, [Scratch() for _ in range(p)])
    want = numerics.ring_allreduce(np.stack(xs), op, threads=1)
    for b in bufs:
        np.testing.assert_array_equal(b.view(np.uint16), want.view(np.uint16))


def test_scratch_is_kept_and_grown_to_the_largest_request():
    s = Scratch()
    a = s(100)
    assert a.dtype == np.uint8 and a.size == 100
    assert s(50).ctypes.data == a.ctypes.data  # reused
    assert s(200).size == 200 and s(10).size == 10


@pytest.mark.parametrize("p", [1, 2, 3, 5])
def test_chunks_and_steps_follow_baidus_ring(p):
    for n in SIZES:
        chunks = ring_chunks(n, p)
        assert [c for _, c in chunks] == [len(a) for a in np.array_split(np.arange(n), p)]
        assert list(chunk_sizes(n, p)) == [c for _, c in chunks]
    for r in range(p):
        # collectives.cu RingAllreduce: send (r - i), then in the allgather (r - i + 1)
        assert [send_chunk(r, s, p) for s in range(2 * (p - 1))] == (
            [(r - i) % p for i in range(p - 1)] + [(r - i + 1) % p for i in range(p - 1)])


def test_horovod_rounds_the_threshold_and_pads_gpu_tensors():
    """controller.cc TensorFusionThresholdBytes (local_size x 8 x 64, rounded up, on a
    homogeneous cluster) and the 16-byte BATCHED_D2D_PADDING of a CUDA build."""
    from ddpbench.rules.fusion import fusion_threshold_bytes, padded_bytes, padded_offsets

    mib128 = 128 << 20
    assert [fusion_threshold_bytes(mib128, n) for n in (1, 2, 4, 8)] == [mib128] * 4
    assert fusion_threshold_bytes(mib128, 3) == 134_218_752 == 87_382 * 1536
    assert fusion_threshold_bytes(mib128, 3, homogeneous=False) == mib128
    assert fusion_threshold_bytes(0, 3) == 0  # fusion off stays off
    assert fusion_threshold_bytes(1, 6) == 3072
    assert [padded_bytes(n) for n in (0, 1, 16, 17, 34)] == [0, 16, 16, 32, 48]
    # float16 tensors of 3, 8 and 1 elements: 6, 16 and 2 bytes at 16-byte offsets
    assert padded_offsets([6, 16, 2]) == ([0, 16, 32], 48)
