"""The engine's polling rules (:class:`ddpbench.comm.Engine`), with a fake protocol."""

from __future__ import annotations

import threading
import time

import pytest

from ddpbench import comm
from ddpbench.comm import Engine, Protocol


class _Transfer(Protocol):
    """A transfer under way for ``seconds`` from the engine's first poll of it: busy and
    moving until then, and progress reports nothing (as ``Testall`` of a large message
    moving in chunks)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end: float | None = None  # set by the first poll
        self.done = threading.Event()

    def busy(self) -> bool:
        return self.end is not None and not self.done.is_set()

    def moving(self) -> bool:
        return self.busy()

    def progress(self) -> bool:
        now = time.monotonic()
        if self.end is None:
            self.end = now + self.seconds
            return True
        if not self.done.is_set() and now >= self.end:
            self.done.set()
            return True
        return False


def _waits_while_busy(monkeypatch, hot_spin_s: float, proto: _Transfer) -> list[float | None]:
    """Run ``proto`` on a fresh engine until it is done; return the timeout of every wait
    the engine made while ``proto`` was busy."""
    waits: list[float | None] = []

    class Recording(threading.Condition):
        def wait(self, timeout: float | None = None) -> bool:
            if proto.busy():
                waits.append(timeout)
            return super().wait(timeout)

    monkeypatch.setattr(comm.threading, "Condition", Recording)
    eng = Engine(hot_spin_s=hot_spin_s)
    monkeypatch.undo()
    eng.register(proto)
    try:
        assert proto.done.wait(10)
    finally:
        eng.unregister(proto)
        eng.stop()
    return waits


@pytest.mark.parametrize("hot_spin_s", [2e-3, 1e-4], ids=["core_per_rank", "oversubscribed"])
def test_the_engine_keeps_polling_while_a_transfer_is_under_way(monkeypatch, hot_spin_s):
    """Without single-copy shared memory a large message moves only while its sender polls:
    the engine never backs off to its 1 ms idle poll then (it did after 10 ms of no
    completions, which made a 16 MiB allreduce of ``collective`` 100x slower)."""
    # 30 ms: well past the 10 ms after which an idle engine polls every 1 ms
    waits = _waits_while_busy(monkeypatch, hot_spin_s, _Transfer(0.03))
    if hot_spin_s > 1e-4:
        assert waits == []  # a core of its own: it spins
    else:
        assert waits and all(t is not None and t <= 5e-5 for t in waits), sorted(waits)[-3:]


def test_an_idle_engine_still_backs_off(monkeypatch):
    """Busy but not moving (a reply awaited, nothing in flight): after 10 ms of quiet the
    engine polls every 1 ms, as before, so an idle coordinator does not burn a core."""

    class Waiting(_Transfer):
        def moving(self) -> bool:
            return False

    assert 1e-3 in _waits_while_busy(monkeypatch, 1e-4, Waiting(0.05))
