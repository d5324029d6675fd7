"""Parameter-server backends (kvstore, p3, byteps) on real MPI ranks.

Each test is one launch of tests/mpi_scripts/ps_check.py, which asserts many cases against
closed forms (see its docstring); a failing rank aborts the job and fails the test.
"""

from __future__ import annotations

import json
import uuid

import pytest
from mpiutil import SCRIPTS, assert_no_processes, run_mpi

from ddpbench.backends.ps_common import merge_chrome_traces

SCRIPT = SCRIPTS / "ps_check.py"
pytestmark = pytest.mark.mpi


def roles(workers: int, servers: int) -> dict[str, str]:
    return {"DDPBENCH_NUM_WORKERS": str(workers), "DDPBENCH_NUM_SERVERS": str(servers)}


def oks(out: str) -> list[str]:
    return [line[3:] for line in out.splitlines() if line.startswith("OK ")]


def test_kvstore_two_workers_two_servers():
    out = run_mpi(4, SCRIPT, "kvstore", "1000", timeout=60, env=roles(2, 2))
    assert any("big arrays split over all 2 servers" in line for line in oks(out)), out
    assert any("server SGD equals the closed form" in line for line in oks(out)), out
    assert "kvstore: closed" in oks(out)


def test_kvstore_one_server_three_workers():
    out = run_mpi(4, SCRIPT, "kvstore", "500", timeout=60, env=roles(3, 1))
    assert any("exact sums over 3 workers" in line for line in oks(out)), out


def test_p3_dedicated_server_priority_and_pacing():
    out = run_mpi(3, SCRIPT, "p3_dedicated", timeout=60, env=roles(2, 1))
    assert "p3: with water_mark=1 the high-priority slice went at position 1 of 11" in oks(out)
    assert "p3: paced sends do not overlap on the uplink" in oks(out)


def test_colocated_three_workers():
    out = run_mpi(3, SCRIPT, "colocated", timeout=60)
    want = ["byteps: credit_bytes=0 sends FIFO (priorities ignored)",
            "p3: slices round-robin over 3 colocated servers by one counter, local slices "
            "not sent", "byteps: average=True"]
    for line in want:
        assert line in oks(out), out
    assert any(line.startswith("byteps credit: exact sums") for line in oks(out)), out


@pytest.mark.parametrize("backend", ["kvstore", "byteps"])
def test_shutdown_leaves_no_process(backend, tmp_path):
    marker = f"psmark{uuid.uuid4().hex[:12]}"
    out = run_mpi(3, SCRIPT, "shutdown", backend, marker, tmp_path, timeout=60, env=roles(2, 1))
    assert "shutdown: closed" in oks(out)
    files = sorted(p.name for p in tmp_path.glob("sends.*.json"))
    assert files == ["sends.server0.json", "sends.worker0.json", "sends.worker1.json"]
    merged = json.loads(merge_chrome_traces(tmp_path, tmp_path / "all.json").read_text())
    spans = [(e["cat"], e["args"]["peer"], e["args"]["bytes"]) for e in merged["traceEvents"]
             if e["ph"] == "X"]
    want = [("push", "server0", 40)] * 2 + [("pull", "worker0", 40), ("pull", "worker1", 40)]
    assert sorted(spans) == sorted(want), spans
    assert_no_processes(marker)


@pytest.mark.parametrize("how", ["kill", "raise"])
def test_dead_worker_ends_the_job(how):
    marker = f"psmark{uuid.uuid4().hex[:12]}"
    out = run_mpi(3, SCRIPT, "die", how, marker, timeout=60, env=roles(2, 1),
                  expect_fail=True)
    if how == "kill":
        assert "Killed (signal 9)" in out, out
    else:
        assert "[ddpbench rank 1] uncaught exception" in out and "fails on purpose" in out, out
    assert_no_processes(marker)
