"""ddpbench.torch on real ranks: gradients against one process on the whole batch (fp64
reference tolerance stated in mpi_scripts/torch_check.py), lazy modules, errors, variants."""

from __future__ import annotations

import pytest
from mpiutil import SCRIPTS, one, run_mpi

pytest.importorskip("torch", reason="the torch extra is part of the dev install")

pytestmark = pytest.mark.mpi
SCRIPT = SCRIPTS / "torch_check.py"


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_horovod_reference_and_lazy_modules(n):
    out = run_mpi(n, SCRIPT, "reference,lazy", "horovod", timeout=240)
    for model in ("mlp", "cnn"):
        rec = one(out, "reference", backend="horovod", model=model)
        assert rec["ranks"] == n and rec["worst"] <= 1e-5
    assert one(out, "lazy", backend="horovod")["ranks"] == n


def test_every_backend_matches_the_single_process():
    backends = ["mpi", "collective", "kvstore", "p3", "byteps"]
    out = run_mpi(3, SCRIPT, "reference", ",".join(backends), timeout=300)
    for b in backends:
        for model in ("mlp", "cnn"):
            assert one(out, "reference", backend=b, model=model)["worst"] <= 1e-5


def test_errors_and_variants():
    out = run_mpi(2, SCRIPT, "errors,variants", "horovod", timeout=240)
    assert one(out, "errors", backend="horovod")["example"]
    for f in (4, 16):
        assert one(out, "predivide", backend="horovod", factor=f)["worst"] <= 1e-5
    for comp in ("fp16", "bf16"):
        one(out, "compression", backend="horovod", compression=comp)
    assert one(out, "backward_passes", backend="horovod")["worst"] <= 1e-5
    one(out, "optimizer_state", backend="horovod")


def test_local_sgd_and_server_side_optimizer():
    spec = "collective:mode=local_sgd;local_sgd_period=1"
    out = run_mpi(2, SCRIPT, "local_sgd", spec, timeout=240)
    assert one(out, "local_sgd", backend=spec)["worst"] <= 1e-5
    out = run_mpi(3, SCRIPT, "onserver", "kvstore", timeout=240,
                  env={"DDPBENCH_NUM_WORKERS": "2", "DDPBENCH_NUM_SERVERS": "1"})
    assert one(out, "onserver", backend="kvstore")["worst"] <= 1e-5
