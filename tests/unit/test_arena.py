"""The server's receive-buffer arena: distinct, aligned, correctly typed buffers."""

import numpy as np
import pytest

from ddpbench.tensor_ops import Arena


def test_arena_buffers_are_disjoint_aligned_and_typed():
    arena = Arena(chunk_bytes=1 << 20, min_bytes=1024)
    bufs = [arena.empty(n, dt) for n, dt in ((40_000, np.float32), (100_000, np.float64),
                                             (3, np.float32), (70_001, np.float16),
                                             (300_000, np.float32))]
    assert [b.size for b in bufs] == [40_000, 100_000, 3, 70_001, 300_000]
    assert [b.dtype for b in bufs] == [np.float32, np.float64, np.float32, np.float16,
                                       np.float32]
    for b in bufs:
        assert b.flags.c_contiguous and b.flags.writeable
        if b.nbytes >= 1024:
            assert b.ctypes.data % Arena.ALIGN == 0
    for i, b in enumerate(bufs):  # writing one leaves every other as it was
        b[...] = i
    for i, b in enumerate(bufs):
        assert np.all(b == i)
    for i, a in enumerate(bufs):
        for b in bufs[i + 1:]:
            assert not np.shares_memory(a, b)


def test_arena_gives_a_buffer_larger_than_a_chunk_its_own_chunk():
    arena = Arena(chunk_bytes=4096, min_bytes=16)
    a = arena.empty(10_000, np.float32)
    b = arena.empty(10, np.float32)
    a[...] = 1.0
    b[...] = 2.0
    assert a.size == 10_000 and np.all(a == 1.0) and np.all(b == 2.0)


def test_arena_places_a_buffer_at_an_offset_past_a_page():
    arena = Arena(chunk_bytes=1 << 20, min_bytes=1024)
    bufs = [arena.empty(10_000, np.float32, offset) for offset in (16, 0, 48, 4)]
    assert [b.ctypes.data % Arena.ALIGN for b in bufs] == [16, 0, 48, 4]
    for i, b in enumerate(bufs):
        b[...] = i
    assert all(np.all(b == i) for i, b in enumerate(bufs))
    for bad in (2, -16, Arena.ALIGN):
        with pytest.raises(ValueError, match="offset"):
            arena.empty(10_000, np.float32, bad)
