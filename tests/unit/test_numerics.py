"""The numerics emulator against references: a literal ring, fp64 on exact integers, the
closed-form overflow bound."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from ddpbench import numerics as nm
from ddpbench.rules.ring import ring_chunks
from ddpbench.tensor_ops import scale_

FLOATS = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64]


def bits(a: np.ndarray) -> np.ndarray:
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.itemsize])


def literal_ring(x: np.ndarray, op: str = "sum", pre: float = 1.0, post: float = 1.0):
    """The ring of :mod:`ddpbench.rules.ring` step by step: p local buffers, sendrecv per step."""
    p, n = x.shape
    bufs = [x[r].copy() for r in range(p)]
    for b in bufs:
        scale_(b, pre)
    ch = ring_chunks(n, p)

    def part(b, c):
        off, cnt = ch[c]
        return b[off:off + cnt]

    for s in range(p - 1):
        sent = [part(bufs[r], (r - s) % p).copy() for r in range(p)]
        for r in range(p):
            local = part(bufs[r], (r - s - 1) % p)
            np.add(sent[(r - 1) % p], local, out=local)
    for s in range(p - 1):
        sent = [part(bufs[r], (r + 1 - s) % p).copy() for r in range(p)]
        for r in range(p):
            part(bufs[r], (r - s) % p)[...] = sent[(r - 1) % p]
    if op == "average":
        post = post / p
    for b in bufs:
        scale_(b, post)
    for b in bufs[1:]:
        assert np.array_equal(bits(b), bits(bufs[0])), "ranks disagree in the literal ring"
    return bufs[0]


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_emulator_matches_literal_ring_bit_for_bit(dtype):
    rng = np.random.default_rng(7)
    with np.errstate(all="ignore"):
        for p in (1, 2, 3, 4, 5, 8):
            for n in (1, 2, 3, 7, 64, 301):
                mags = rng.choice([1e-7, 1e-3, 1.0, 1e3, 3e4], size=(p, n))
                x = (rng.standard_normal((p, n)) * mags).astype(dtype)
                for op, pre, post in [("sum", 1.0, 1.0), ("average", 1 / 3, 3.0),
                                      ("average", 1 / 8, 8.0), ("sum", 0.1, 7.0)]:
                    want = literal_ring(x, op, pre, post)
                    got = nm.ring_allreduce(x, op, prescale_factor=pre, postscale_factor=post)
                    assert got.dtype == want.dtype
                    assert np.array_equal(bits(got), bits(want)), (p, n, op, pre, post)


def test_blocks_and_threads_do_not_change_bits(monkeypatch):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((13, 1001)) * 300).astype(np.float16)
    whole = nm.ring_allreduce(x, "average", prescale_factor=0.25, postscale_factor=4.0, threads=1)
    monkeypatch.setattr(nm, "BLOCK_ELEMENTS", 13 * 37)  # blocks cut through chunks
    for threads in (1, 3):
        got = nm.ring_allreduce(x, "average", prescale_factor=0.25, postscale_factor=4.0,
                                threads=threads)
        assert np.array_equal(bits(got), bits(whole))
    assert np.array_equal(bits(nm.predivide_allreduce(x, 4.0)), bits(whole))


@pytest.mark.parametrize("dist", nm.DISTRIBUTIONS)
def test_streamed_emulation_equals_explicit_ring(dist, monkeypatch):
    monkeypatch.setattr(nm, "BLOCK_ELEMENTS", 6 * 40)
    p, n = 6, 203
    blocks = nm._plan_blocks(n, p)
    assert len(blocks) > 2
    x = np.concatenate([nm.gradient_block(dist, 10.0, p, lo, hi, np.float16, 5)
                        for lo, hi in blocks], axis=1)
    emu = nm.emulate(lambda lo, hi, out: nm.gradient_block(dist, 10.0, p, lo, hi, "float16", 5,
                                                           out),
                     p, n, "float16", [1.0, 2.5, 64.0], threads=2)
    for f in (1.0, 2.5, 64.0):
        assert np.array_equal(bits(emu.outputs[f]), bits(nm.predivide_allreduce(x, f)))
    np.testing.assert_array_equal(emu.reference, x.astype(np.float64).mean(axis=0))


def test_scale_table_is_the_backends_scaling():
    allbits = np.arange(1 << 16, dtype=np.uint16)
    for dt in (np.float16, ml_dtypes.bfloat16):
        x = allbits.view(dt)
        for f in (1 / 3, 0.125, 1e-6, 7.0, 65504.0):
            want = x.copy()
            with np.errstate(all="ignore"):
                scale_(want, f)
            assert np.array_equal(bits(nm.scale(x, f)), bits(want))


def test_integers_sum_exactly_as_in_fp64():
    """Integers |x| <= 16 on up to 128 ranks: every partial sum is an integer below 2048,
    which fp16 holds exactly, so the ring equals the fp64 sum whatever the order."""
    rng = np.random.default_rng(11)
    for p in (2, 3, 17, 128):
        for n in (1, p - 1, 5 * p + 3):
            x = rng.integers(-16, 17, size=(p, max(n, 1))).astype(np.float16)
            got = nm.ring_allreduce(x, "sum")
            np.testing.assert_array_equal(got.astype(np.float64), x.astype(np.float64).sum(0))
            # power-of-two scaling is exact too (x/8 >= 2^-3 stays normal)
            got = nm.ring_allreduce(x, "sum", prescale_factor=1 / 8, postscale_factor=8)
            np.testing.assert_array_equal(got.astype(np.float64), x.astype(np.float64).sum(0))
            if p & (p - 1) == 0:  # AVERAGE's f/p postscale is exact for p a power of two
                got = nm.predivide_allreduce(x, 8.0)
                np.testing.assert_array_equal(got.astype(np.float64),
                                              x.astype(np.float64).sum(0) / p)


def test_overflow_exactly_where_the_closed_form_says():
    """Positive multiples of 32 keep every fp16 partial sum exact up to 65504; the first
    sum beyond is >= 65536 and rounds to inf. So with no predivide an element overflows iff
    sum(|x|) > 65504, and with predivide f = 64 iff sum(|x|) / 64 > 65504."""
    rng = np.random.default_rng(5)
    for p in (3, 64, 200):
        # sums of m around 2047 = 65504 / 32, the edge
        x = (32 * rng.integers(1, 2 * 2047 // p + 1, size=(p, 500))).astype(np.float16)
        total = x.astype(np.float64).sum(axis=0)
        assert (total > 65504).any() and (total <= 65504).any()
        out = nm.ring_allreduce(x, "sum")
        np.testing.assert_array_equal(np.isinf(out), total > 65504)
        out = nm.predivide_allreduce(x, 64.0)
        np.testing.assert_array_equal(np.isinf(out), total / 64 > 65504)
        assert nm.error_metrics(nm.ring_allreduce(x, "average"), total / p,
                                "float16")["overflow"] == int((total > 65504).sum())


def test_overflow_follows_the_ring_order():
    """3 ranks, one element per chunk: chunk c adds ranks c, c+1, c+2 (mod 3), so
    60000 + 10016 overflows in chunk 0 while chunk 1 cancels first (10016 - 10016 + 60000).
    All values and partial sums are multiples of 32 below 65504: exact in fp16."""
    x = np.array([[60000] * 3, [10016] * 3, [-10016] * 3], np.float16)
    out = nm.ring_allreduce(x, "sum")
    assert np.isinf(out[0]) and out[1] == 60000 and out[2] == 60000  # chunk 2: -10016 + 60000 + 10016
    assert not np.isinf(nm.predivide_allreduce(x, 2.0)).any()


def test_error_metrics_on_a_known_case():
    ref = np.array([1.0, 2.0, 1e-6, 0.0, 3.0])
    out = np.array([1.0, 2.5, 0.0, 0.0, np.inf], np.float16)
    m = nm.error_metrics(out, ref, "float16")
    assert m["overflow"] == 1 and m["underflow"] == 0  # 1e-6 is subnormal in fp16 itself
    assert m["max_rel_err"] == 1.0  # the flushed 1e-6
    assert m["mean_rel_err"] == pytest.approx((0 + 0.25 + 1.0) / 3)
    assert m["rel_l2_err"] == pytest.approx(0.5 / math.sqrt(5 + 1e-12))
    m = nm.error_metrics(np.array([0.0, 1.0], np.float16), np.array([1e-3, 1.0]), "float16")
    assert m["underflow"] == 1


def test_safe_range_marks_overflow_and_underflow():
    rows = nm.mark_safe(nm.sweep_cell("float16", "correlated", 100.0, 1024,
                                      [1.0, 32.0, 1024.0], 2048))
    by_f = {r["factor"]: r for r in rows}
    assert by_f[1.0]["overflow"] > 0 and not by_f[1.0]["safe"]
    assert by_f[32.0]["safe"] and by_f[1024.0]["safe"]
    rows = nm.mark_safe(nm.sweep_cell("float16", "normal", 1e-3, 64, [1.0, 8.0, 2.0**20], 4096))
    assert nm.safe_range(rows) == (1.0, 8.0)
    assert {r["factor"]: r for r in rows}[2.0**20]["underflow_frac"] > 0.5


def test_training_diverges_on_overflow_and_matches_fp64_when_safe():
    # loss scale 2^10: one worker's gradient RMS ~4e3, so 64 of them sum past 65504 at f=1
    base = nm.train_least_squares(None, world_size=64, steps=40, loss_scale=2.0**10)
    safe = nm.train_least_squares(64.0, world_size=64, steps=40, loss_scale=2.0**10)
    bad = nm.train_least_squares(1.0, world_size=64, steps=40, loss_scale=2.0**10)
    assert base["final_loss"] < 1e-3 * base["loss"][0]
    assert safe["final_loss"] == pytest.approx(base["final_loss"], rel=0.5, abs=1e-4)
    assert bad["overflow_steps"] > 0 and not math.isfinite(bad["final_loss"])


@pytest.mark.parametrize("bad, exc, words", [
    (0.0, ValueError, "> 0"), (-2.0, ValueError, "> 0"), (math.nan, ValueError, "finite"),
    (math.inf, ValueError, "finite"), ("8", TypeError, "real number"), (True, TypeError, "real"),
])
def test_bad_factor_is_a_clear_error(bad, exc, words):
    x = np.ones((2, 3), np.float16)
    with pytest.raises(exc, match=words):
        nm.predivide_allreduce(x, bad)
    with pytest.raises(exc, match="prescale_factor"):
        nm.ring_allreduce(x, "sum", prescale_factor=bad)
    with pytest.raises(exc):
        nm.emulate(lambda lo, hi, out: x[:, lo:hi], 2, 3, "float16", [bad])


def test_bad_dtype_and_world_size_are_clear_errors():
    with pytest.raises(ValueError, match=r"unknown dtype 'float8'.*valid dtypes"):
        nm.resolve_dtype("float8")
    with pytest.raises(ValueError, match="unknown dtype"):
        nm.ring_allreduce(np.ones((2, 3), np.int32))
    with pytest.raises(ValueError, match=r"world size must be >= 1, got 0"):
        nm.predivide_safe_range(0)
    with pytest.raises(ValueError, match="world size must be >= 1"):
        nm.ring_allreduce([])
    with pytest.raises(ValueError, match="world size must be >= 1"):
        nm.ring_allreduce(np.ones((0, 3), np.float16))
    with pytest.raises(TypeError, match="world size must be an integer"):
        nm.check_world_size(2.5)
    with pytest.raises(ValueError, match="unknown distribution 'uniform'"):
        nm.gradient_block("uniform", 1.0, 2, 0, 4, "float16")
    assert nm.resolve_dtype("bf16") == np.dtype(ml_dtypes.bfloat16)


def cuda_half_scale(x: np.ndarray, factor: float) -> np.ndarray:
    """Horovod's CUDA fp16 scaling, element by element: ``__float2half((float) f)``, then
    ``__hmul`` (the exact product of two halves, rounded once to half), computed here in
    float64 and rounded straight to half."""
    h = float(np.float16(np.float32(factor)))
    out = np.empty_like(x)
    with np.errstate(all="ignore"):
        for i, v in enumerate(x.astype(np.float64)):
            out[i] = np.float16(v * h)
    return out


def test_gpu_scaling_is_horovods_cuda_kernel_bit_for_bit():
    allbits = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    for f in (1 / 3, 0.125, 1 / 6, 1e-6, 3.0, 1 / 1000, 65504.0):
        want = cuda_half_scale(allbits, f)
        assert np.array_equal(bits(nm.scale(allbits, f, "gpu")), bits(want)), f
    # bf16 and wider dtypes scale the same way on both rules
    x = np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16)
    assert np.array_equal(bits(nm.scale(x, 1 / 3, "gpu")), bits(nm.scale(x, 1 / 3, "cpu")))


def test_gpu_rule_biases_averages_at_world_sizes_not_powers_of_two():
    # 1/3 in half is 0.33325... (2.4e-4 low), so the GPU average of 3 ranks rounds down
    # wherever that bias crosses a rounding boundary, and never up
    x = (np.random.default_rng(1).standard_normal((3, 4001)) * 10).astype(np.float16)
    cpu = nm.ring_allreduce(x, "average")
    gpu = nm.ring_allreduce(x, "average", scaling="gpu")
    summed = nm.ring_allreduce(x, "sum")
    assert np.array_equal(bits(gpu), bits(cuda_half_scale(summed, 1 / 3)))
    lower = np.abs(gpu.astype(np.float64)) < np.abs(cpu.astype(np.float64))
    higher = np.abs(gpu.astype(np.float64)) > np.abs(cpu.astype(np.float64))
    assert lower.sum() > 100 and higher.sum() == 0
    # powers of two are exact in half: both rules agree bit for bit
    y = (np.random.default_rng(2).standard_normal((4, 301)) * 50).astype(np.float16)
    assert np.array_equal(bits(nm.ring_allreduce(y, "average", scaling="gpu")),
                          bits(nm.ring_allreduce(y, "average")))


def test_gpu_rule_ring_and_emulate_agree_with_a_literal_gpu_ring():
    rng = np.random.default_rng(11)
    for p in (2, 3, 5):
        x = (rng.standard_normal((p, 97)) * 1e3).astype(np.float16)
        for f in (1.0, 2.5, 7.0):
            summed = nm.ring_allreduce(np.stack([cuda_half_scale(r, 1 / f) for r in x]), "sum")
            want = cuda_half_scale(summed, f / p) if f / p != 1.0 else summed
            got = nm.predivide_allreduce(x, f, scaling="gpu")
            assert np.array_equal(bits(got), bits(want)), (p, f)
            emu = nm.emulate(lambda lo, hi, out, x=x: x[:, lo:hi], p, 97, "float16", [f],
                             scaling="gpu")
            assert np.array_equal(bits(emu.outputs[f]), bits(want)), (p, f)
    with pytest.raises(ValueError, match="scaling must be one of cpu, gpu, got 'tpu'"):
        nm.ring_allreduce(x, "sum", scaling="tpu")
