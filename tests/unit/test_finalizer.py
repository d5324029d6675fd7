"""The finalizer thread of Horovod's GPU path (comm.Finalizer, after gpu_operations.cc
FinalizeGPUQueue): the submitting thread goes on while completions wait, in order."""

from __future__ import annotations

import threading

import pytest

from ddpbench.comm import Finalizer


def test_submit_returns_while_the_completion_waits_and_jobs_finish_in_order():
    fin = Finalizer()
    gates = [threading.Event() for _ in range(3)]
    log: list[tuple[int, BaseException | None]] = []
    for i, gate in enumerate(gates):
        # (the background cycle: it submits and goes on planning; nothing has finished)
        fin.submit(lambda g=gate: g.wait(30), lambda err, i=i: log.append((i, err)))
    assert fin.pending() == 3 and log == []
    gates[2].set()  # the last group's event fires first: it still completes after the others
    assert not fin.drain(timeout=0.05) and log == []
    gates[0].set()
    gates[1].set()
    assert fin.drain(timeout=30)
    assert log == [(0, None), (1, None), (2, None)] and fin.pending() == 0
    fin.close()


def test_a_failed_wait_is_handed_to_done_and_the_thread_goes_on():
    fin = Finalizer()
    got: list[BaseException | None] = []

    def fails() -> None:
        raise RuntimeError("an illegal memory access was encountered")

    fin.submit(fails, got.append)
    fin.submit(lambda: None, got.append)
    assert fin.drain(timeout=30)
    assert isinstance(got[0], RuntimeError) and "illegal memory" in str(got[0])
    assert got[1] is None
    fin.close()


def test_close_finishes_what_is_queued_then_refuses_more():
    fin = Finalizer()
    gate = threading.Event()
    done: list[int] = []
    fin.submit(lambda: gate.wait(30), lambda err: done.append(1))
    closer = threading.Thread(target=fin.close)
    closer.start()
    gate.set()
    closer.join(30)
    assert not closer.is_alive() and done == [1]
    with pytest.raises(RuntimeError, match="finalizer is closed"):
        fin.submit(lambda: None, lambda err: None)
