"""DistributedTrainer and broadcast_parameters across backends and world sizes.

Tolerance of the reference check (stated in mpi_scripts/trainer_check.py): after 5 SGD
steps in fp32 every backend's parameters equal a single process on the full global batch
within 1e-6 + 1e-5 |w| (the reduction order differs).
"""


import pytest
from mpiutil import SCRIPTS, one, run_mpi

import ddpbench

ALLREDUCE = ["mpi", "horovod", "collective"]
PS = ["kvstore", "p3", "byteps"]
ALL_CASES = "deferred,reference,distributed,predivide"


def assert_trainer_cases(out: str, backend: str, n: int) -> None:
    """The deferred, reference, distributed and predivide checks all passed for ``backend``."""
    for model in ("mlp", "cnn"):
        rec = one(out, "deferred", backend=backend, model=model)
        assert (rec["deferred"], rec["parameters"], rec["ranks"]) == (3, 6, n)
        rec = one(out, "reference", backend=backend, model=model)
        assert (rec["steps"], rec["ranks"]) == (5, n) and rec["max_err"] <= 1e-5
    one(out, "distributed", backend=backend)
    rec = one(out, "predivide", backend=backend, factor=4)
    assert rec["max_err"] <= rec["bound"]


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 3])
def test_trainer_allreduce_backends(n):
    out = run_mpi(n, SCRIPTS / "trainer_check.py", ALL_CASES, ",".join(ALLREDUCE), timeout=120)
    for b in ALLREDUCE:
        assert_trainer_cases(out, b, n)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_local_sgd_communicates_every_period(n):
    spec = "collective:mode=local_sgd;local_sgd_period=3"
    out = run_mpi(n, SCRIPTS / "trainer_check.py", "local_sgd", spec, timeout=60)
    rec = one(out, "local_sgd")
    # Paddle's schedule (k_steps 3, begin_step 1): steps 1, 4, 7
    assert rec["synced_steps"] == [1, 4, 7] and rec["operations"] == 3 * rec["parameters"] == 18
    one(out, "local_sgd_fp16")
    # period 1 averages every step: the same as averaging gradients, for plain SGD
    out = run_mpi(n, SCRIPTS / "trainer_check.py", "reference",
                  "collective:mode=local_sgd;local_sgd_period=1", timeout=60)
    assert one(out, "reference", model="mlp")["ranks"] == n


@pytest.mark.mpi
@pytest.mark.parametrize("backend", PS)
def test_trainer_parameter_server_backends(backend):
    if backend not in ddpbench.available():
        pytest.skip(f"backend {backend!r} is not written yet (backends/{backend}.py missing)")
    # colocated servers (one inside each of the 3 workers)
    out = run_mpi(3, SCRIPTS / "trainer_check.py", ALL_CASES, backend, timeout=120)
    assert_trainer_cases(out, backend, 3)


@pytest.mark.mpi
def test_update_on_kvstore_dedicated_server():
    if "kvstore" not in ddpbench.available():
        pytest.skip("backend 'kvstore' is not written yet (backends/ps/kvstore.py missing)")
    workers, servers = 2, 1
    out = run_mpi(workers + servers, SCRIPTS / "trainer_check.py", "deferred,onserver",
                  "kvstore", env={"DDPBENCH_NUM_WORKERS": str(workers),
                                  "DDPBENCH_NUM_SERVERS": str(servers)}, timeout=120)
    rec = one(out, "deferred", backend="kvstore", model="mlp")
    assert (rec["deferred"], rec["parameters"], rec["ranks"]) == (3, 6, 2)
    for model in ("mlp", "cnn"):
        assert one(out, "onserver", backend="kvstore", model=model)["steps"] == 5
