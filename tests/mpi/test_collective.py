"""The ``collective`` backend on 1-4 ranks: reduce kinds, ring order, striping over rings,
Paddle fleet's gradient buckets (``fuse_grad_size_mb``, rules/buckets.py)."""


import pytest
from mpiutil import SCRIPTS, one, run_mpi

import ddpbench


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_collective_ops_ring_order_and_striping(n):
    out = run_mpi(n, SCRIPTS / "collective_check.py", timeout=90)
    assert one(out, "ops")["ranks"] == n
    assert one(out, "ring_order")["bit_identical_to"] == "horovod._ring_allreduce"
    order = one(out, "average_order")  # Paddle divides before the sum: no fp16 overflow
    assert order["before_sum"] == pytest.approx(40000, rel=2e-3)
    assert (order["after_sum"] == float("inf")) == (n > 1)
    assert one(out, "striping", nrings=3)["tensors"] == [3, 2, 2]  # tensor i on ring i % 3
    assert one(out, "striping", nrings=1)["tensors"] == [3]
    if n > 1:
        assert one(out, "striping", nrings=3)["max_active_rings"] == 3
        one(out, "mismatch", ranks=n)
    # Paddle's buckets at 4 KiB: [l3.w l3.b] [l2.w] [l1.w l1.b l0.w] on rings 0, 1, 0 from
    # the second step on (the first, unfused, puts name k on ring k % 2); then incomplete
    # buckets sent by synchronize() and by a synchronous call (itself unfused, on its
    # name's ring)
    got = one(out, "buckets", ranks=n)
    assert got["refused"]
    b0, b2 = ["l3.w", "l3.b"], ["l1.w", "l1.b", "l0.w"]
    assert got["rings"] == [["l3.w", "l2.w", "l1.b", b0, b2, b0, b2, b0, b2, "l1.w", "l2.w",
                             "l0.w", "l1.w"],
                            ["l3.b", "l1.w", "l0.w", "l2.w", "l2.w", "l2.w", "l3.b"]]


def test_collective_options_are_validated():
    cls = ddpbench.api.backend_class("collective")
    assert cls.parse_options({}).nrings == 2
    with pytest.raises(ValueError, match="nrings"):
        cls.parse_options({"nrings": 0})
    with pytest.raises(ValueError, match="mode"):
        cls.parse_options({"mode": "fast"})
    with pytest.raises(ValueError, match="valid options"):
        cls.parse_options({"rings": 2})
