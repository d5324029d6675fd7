"""The ``collective`` backend on 1-4 ranks: reduce kinds, ring order, striping over rings."""


import pytest
from mpiutil import SCRIPTS, run_mpi

import ddpbench


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_collective_ops_ring_order_and_striping(n):
    out = run_mpi(n, SCRIPTS / "collective_check.py", timeout=90)
    assert f"ops on {n} ranks" in out
    assert "bit-identical to horovod's _ring_allreduce" in out
    assert f"striping on {n} ranks, nrings=3: tensor i on ring i % 3 ([3, 2, 2] tensors)" in out
    if n > 1:
        assert "3 rings observed in flight at once" in out
        assert "MismatchError on every rank" in out


def test_collective_options_are_validated():
    cls = ddpbench.api.backend_class("collective")
    assert cls.parse_options({}).nrings == 2
    with pytest.raises(ValueError, match="nrings"):
        cls.parse_options({"nrings": 0})
    with pytest.raises(ValueError, match="mode"):
        cls.parse_options({"mode": "fast"})
    with pytest.raises(ValueError, match="valid options"):
        cls.parse_options({"rings": 2})
