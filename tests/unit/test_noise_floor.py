"""``ddpbench bench noise``'s sampling floor: what an exact model scores against noisy runs."""

from __future__ import annotations

import pytest

from ddpbench.benchmarks.noise import sampling_floor


def test_identical_launches_leave_no_error():
    f = sampling_floor([40.0] * 7)
    assert f == {"median_error": 0.0, "beyond_15": 0.0, "beyond_25": 0.0, "repeat_10": 1.0,
                 "cv": 0.0}


def test_two_equally_likely_states_match_the_closed_form():
    # Launches land in a fast state (40 ms) or a slow one (60 ms), each with probability
    # 1/2. The median of an odd number of draws is the majority state, which is either
    # state with probability 1/2 by symmetry; calibration and report are independent, so
    # they agree with probability 1/2 (error 0) and otherwise miss by 60/40 - 1 = 0.5 or by
    # 40/60 - 1 = -1/3, each with probability 1/4.
    f = sampling_floor([40.0, 60.0], calibration=3, repetitions=5, draws=200_000, seed=1)
    assert f["beyond_25"] == pytest.approx(0.5, abs=0.01)
    assert f["beyond_15"] == pytest.approx(0.5, abs=0.01)
    assert f["repeat_10"] == pytest.approx(0.5, abs=0.01)
    assert f["median_error"] in (0.0, pytest.approx(1 / 3))  # the median straddles the two
    assert f["cv"] == pytest.approx(10 / 50)


@pytest.mark.parametrize("launches, kw, words", [
    ([], {}, "no launches"),
    ([40.0, 0.0], {}, "> 0"),
    ([40.0], {"calibration": 0}, ">= 1"),
])
def test_bad_input_is_a_clear_error(launches, kw, words):
    with pytest.raises(ValueError, match=words):
        sampling_floor(launches, **kw)
