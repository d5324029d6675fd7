"""Gradient accumulation in the simulator: micro-batches that communicate once a step or
every micro-batch, as the originals do (ddpbench.simulator.core.communicates_every_micro_batch)."""

from __future__ import annotations

import pytest

from ddpbench import contract
from ddpbench.emulation import real_job_size
from ddpbench.simulator import simulate
from ddpbench.simulator.workload import load_workload

KW = dict(hosts=2, gpus_per_host=4, bandwidth_gbps=25, transport="tcp", iterations=3, warmup=1)


@pytest.mark.parametrize("backend,knobs", [("horovod", {}), ("mpi", {}), ("collective", {}),
                                           ("kvstore", {}), ("byteps", {}),
                                           ("zero", {"stage": 1})])
@pytest.mark.parametrize("k", [2, 5])
def test_once_a_step_backends_add_the_other_micro_batches_compute_only(backend, knobs, k):
    # F1 B1 ... Fk Bk: the k - 1 extra passes are compute; the communication of the last
    # backward is the same, so the step takes (k - 1)(F + B) more (Horovod's: within one
    # cycle, 1 ms, as its cycles' grid falls elsewhere against the backward)
    wl = load_workload("resnet50")
    passes = sum(x.fwd_s + x.bwd_s for x in wl.layers)
    one = simulate("resnet50", backend, **KW, **knobs)
    many = simulate("resnet50", backend, **KW, grad_accumulation=k, **knobs)
    tol = dict(abs=1e-3) if backend == "horovod" else dict(rel=1e-6)
    assert many.iteration_time_s == pytest.approx(one.iteration_time_s + (k - 1) * passes,
                                                  **tol)
    assert many.batch_size == k * wl.batch_size
    assert many.throughput == pytest.approx(8 * k * wl.batch_size / many.iteration_time_s)
    # one step's bytes, sent once (Horovod's: and its cycles' control messages)
    assert many.bytes_sent == pytest.approx(one.bytes_sent, rel=1e-3 if backend == "horovod"
                                            else 1e-9)


@pytest.mark.parametrize("backend,knobs", [("fsdp", {}), ("fsdp", {"sharding_strategy":
                                                                   "NO_SHARD"}),
                                           ("zero", {"stage": 2}), ("zero", {"stage": 3})])
def test_every_micro_batch_backends_repeat_the_step(backend, knobs):
    # FSDP and ZeRO-2/3 communicate after every micro-batch: a step is k iterations
    one = simulate("resnet50", backend, **KW, **knobs)
    many = simulate("resnet50", backend, **KW, grad_accumulation=3, **knobs)
    assert many.iteration_time_s == pytest.approx(3 * one.iteration_time_s, rel=1e-12)
    assert many.throughput == pytest.approx(one.throughput, rel=1e-12)
    assert many.bytes_sent == pytest.approx({h: 3 * b for h, b in one.bytes_sent.items()})


def test_grad_accumulation_is_checked_and_simulated_only():
    with pytest.raises(ValueError, match="grad_accumulation"):
        contract.Schedule(grad_accumulation=0)
    assert contract.Schedule().grad_accumulation == contract.NEUTRAL_AT_DEFAULT[
        "grad_accumulation"]
    # a real run cannot accumulate: the point is refused (its run says why)
    assert real_job_size({"backend": "mpi", "workload": "resnet50", "workers": 2,
                          "bandwidth_gbps": 1, "grad_accumulation": 4}) is None
