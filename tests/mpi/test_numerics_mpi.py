"""The numerics emulator bit for bit against the real ``horovod`` backend on 2-4 ranks."""

from __future__ import annotations

import pytest
from mpiutil import SCRIPTS, one, results, run_mpi


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3, 4])
def test_bit_exact_against_the_horovod_backend(n):
    out = run_mpi(n, SCRIPTS / "numerics_bitexact.py", timeout=120.0,
                  env={"PYTHONWARNINGS": "ignore"})
    assert results(out, "mismatch") == []
    rec = one(out, "bit_exact")
    assert rec["ranks"] == n and rec["cases"] > 0
