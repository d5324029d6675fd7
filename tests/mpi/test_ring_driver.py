"""horovod's and collective's rings (one driver, ddpbench.rules.ring) at 1-4 ranks."""

import pytest
from mpiutil import SCRIPTS, results, run_mpi

from ddpbench.rules.ring import bytes_per_rank

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_both_backends_reduce_in_the_ring_order_and_count_the_ring_bytes(n):
    out = run_mpi(n, SCRIPTS / "ring_driver_check.py", timeout=120)
    sizes = sorted({1, max(n - 1, 1), 1000, 4099})
    for backend in ("horovod", "collective"):
        got = {rec["rank"]: rec for rec in results(out, "ring_driver", backend=backend, ranks=n)}
        assert sorted(got) == list(range(n)), out[-3000:]
        for r, rec in got.items():
            # fp16 and fp32 tensors of every size: the ring rule's bytes for this rank
            want = sum(int(bytes_per_rank(m, n, size)[r]) for m in sizes for size in (2, 4))
            assert rec["bytes_sent"] == want and rec["tensors"] == 2 * len(sizes)
