"""Parameter-server backends (kvstore, p3, byteps) on real MPI ranks.

Each test is one launch of tests/mpi_scripts/ps_check.py, which asserts many cases against
closed forms (see its docstring); a failing rank aborts the job and fails the test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest
from mpiutil import REPO, SCRIPTS, assert_no_processes, one, results, run_mpi

from ddpbench.trace import merge_chrome_traces

SCRIPT = SCRIPTS / "ps_check.py"
pytestmark = pytest.mark.mpi


def roles(workers: int, servers: int) -> dict[str, str]:
    return {"DDPBENCH_NUM_WORKERS": str(workers), "DDPBENCH_NUM_SERVERS": str(servers)}


def test_kvstore_two_workers_two_servers():
    out = run_mpi(4, SCRIPT, "kvstore", "1000", timeout=60, env=roles(2, 2))
    assert one(out, "sums", tag="kvstore")["workers"] == 2
    assert one(out, "kvstore_placement")["servers"] == 2
    assert one(out, "kvstore_server_sgd")["steps"] == 4
    one(out, "closed", tag="kvstore")


def test_kvstore_one_server_three_workers():
    out = run_mpi(4, SCRIPT, "kvstore", "500", timeout=60, env=roles(3, 1))
    assert one(out, "sums", tag="kvstore") == {
        "check": "sums", "tag": "kvstore", "workers": 3, "names": 5}
    assert one(out, "broadcast", tag="kvstore")["roots"] == 3


@pytest.mark.parametrize("variant,position", [("sockets", 10), ("sockets_16k", 4),
                                              ("sockets_nobuf", 3), ("water_mark", 1),
                                              ("fifo", 10)])
def test_p3_dedicated_server_send_order_and_pacing(variant, position):
    out = run_mpi(3, SCRIPT, "p3_dedicated", variant, timeout=60, env=roles(2, 1))
    order = one(out, "p3_send_order")
    assert (order["variant"], order["position"], order["slices"]) == (variant, position, 11)
    assert one(out, "p3_paced")["sends"] > 1
    assert one(out, "p3_server_sgd")["workers"] == 2
    assert one(out, "sums", tag="p3")["workers"] == 2


def test_colocated_three_workers():
    out = run_mpi(3, SCRIPT, "colocated", timeout=60)
    order = one(out, "byteps_fifo")["order"]  # keys 3..8, each in its partitions
    assert order == sorted(order) and set(order) == set(range(3, 9))
    assert one(out, "p3_placement")["servers"] == 3
    assert one(out, "byteps_placement")["servers"] == 3
    assert one(out, "sum_order")["workers"] == 3
    assert one(out, "byteps_average")["workers"] == 3
    for tag in ("byteps", "kvstore colocated", "byteps credit", "credit scheduler",
                "byteps merged"):
        assert one(out, "sums", tag=tag)["workers"] == 3


@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_bytescheduler_over_the_kvstore_sums_exactly_without_deadlock(workers):
    # rank 0 schedules, the others follow at the barrier keys, posting in another order
    out = run_mpi(workers, SCRIPT, "bytescheduler", timeout=90)
    assert one(out, "sums", tag="bytescheduler")["workers"] == workers
    assert one(out, "bytescheduler")["workers"] == workers


@pytest.mark.parametrize("backend", ["kvstore", "byteps"])
def test_shutdown_leaves_no_process(backend, tmp_path):
    marker = f"psmark{uuid.uuid4().hex[:12]}"
    out = run_mpi(3, SCRIPT, "shutdown", backend, marker, tmp_path, timeout=60, env=roles(2, 1))
    one(out, "closed", tag="shutdown")
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


@pytest.mark.parametrize("workers,servers", [(1, 1), (2, 1), (2, 2)])
def test_bench_pushpull_checks_every_sum_against_the_closed_form(workers, servers):
    # 2, 3 and 4 ranks; a 4 KiB key, and a 1 MiB key cut by every backend (p3's slices, byteps'
    # partitions, kvstore's split over servers): each timed result is compared with the
    # sum of the workers' inputs, and the command fails on any wrong element.
    proc = subprocess.run(
        [sys.executable, "-m", "ddpbench", "bench", "pushpull", "--size", "4K,1M", "--workers",
         str(workers), "--servers", str(servers), "--iters", "2", "--warmup", "1",
         "--rounds", "1", "--backends", "kvstore,p3,byteps:partition_bytes=300000"],
        capture_output=True, text=True, timeout=180, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()[1:] if not line.startswith("#")]
    assert [(r[0], r[1]) for r in rows] == [
        (b, size) for b in ("kvstore", "p3", "byteps:partition_bytes=300000")
        for size in ("4KiB", "1MiB")]
    assert all(r[-1] == "0" for r in rows)  # #wrong


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_the_key_counter_places_as_the_originals_front_ends_declare(n):
    """byteps declares the gradients sorted by name (BytePS-PyTorch), p3 in definition
    order (MXNet's kv.init), whatever order they are first pushed in: every part of VGG-19
    and ResNet-50 (sizes / 1,000) lies on the server rules.placement.declared_keys gives,
    at 1-4 servers (colocated)."""
    out = run_mpi(n, SCRIPTS / "ps_declare.py", timeout=180)
    got = results(out, "declared")
    assert [(g["backend"], g["model"]) for g in got] == [
        ("byteps", "vgg19"), ("p3", "vgg19"), ("byteps", "resnet50"), ("p3", "resnet50")]
    assert all(g["servers"] == n for g in got)
    # p3's keys are the definition index; byteps' sorted names move parts off it
    assert all(g["off_definition_order"] == 0 for g in got if g["backend"] == "p3")
    assert all((g["off_definition_order"] > 0) == (n > 1) for g in got
               if g["backend"] == "byteps")
