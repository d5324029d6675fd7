"""The collective backends (mpi, horovod) on 1-4 ranks against float64 references."""

import json
import re
import subprocess
import sys

import numpy as np
import pytest
from mpiutil import REPO, SCRIPTS, assert_no_processes, results, run_mpi

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("backend", ["mpi", "horovod", "horovod:wait"])
def test_every_op_dtype_shape_scaling_broadcast_fusion_mismatch(backend, n):
    out = run_mpi(n, SCRIPTS / "check_collectives.py", backend, timeout=180)
    done = {rec["rank"]: rec["checks"] for rec in results(out, "done", backend=backend, size=n)}
    assert sorted(done) == list(range(n)), out[-3000:]
    # Every rank made the same number of checks (values, scaling, broadcast, mismatches).
    assert len(set(done.values())) == 1 and done[0] > 590


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_chunked_mpi_allreduce_gives_the_bits_of_one_call(n):
    # Buffers over ALLREDUCE_CHUNK_BYTES go to MPI in chunks (glibc would mmap MPICH's
    # temporary buffer afresh on every call): byte for byte what one bare call gives.
    out = run_mpi(n, SCRIPTS / "chunked_allreduce.py", timeout=180)
    done = results(out, "chunked", size=n)
    assert sorted(r["rank"] for r in done) == list(range(n)), out[-3000:]
    assert all(r["compared"] == 32 and r["differ"] == 0 and r["chunks"] == 2 for r in done)


@pytest.mark.parametrize("backend", ["horovod", "horovod:wait"])
def test_horovod_stall_warning_names_tensor_and_missing_rank(backend):
    out = run_mpi(2, SCRIPTS / "check_collectives.py", backend, "stall", timeout=60)
    assert "tensor 'late' was submitted by ranks [0] but not by ranks [1]" in out


def _launch(*args, timeout=60):
    return subprocess.run(
        [sys.executable, "-m", "ddpbench", "launch", *args], capture_output=True, text=True,
        timeout=timeout, cwd=REPO,
    )


def test_launch_failing_rank_ends_job_with_its_message(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text(
        "import numpy as np, ddpbench\n"
        "kv = ddpbench.create('horovod')\n"
        "if kv.rank == 2:\n"
        "    raise RuntimeError('rank two gives up')\n"
        "kv.push_pull('x', np.ones(3, np.float32))  # the others would wait for rank 2\n"
    )
    proc = _launch("-n", "3", "--timeout", "50", "--", sys.executable, str(script))
    assert proc.returncode == 1
    assert "rank two gives up" in proc.stderr
    assert "rank 2 failed first: exit code 1 (an uncaught exception)" in proc.stderr
    assert_no_processes(str(script))


def test_launch_timeout_kills_the_job(tmp_path):
    script = tmp_path / "sleep.py"
    script.write_text("import time\ntime.sleep(60)\n")
    proc = _launch("-n", "2", "--timeout", "2", "--", sys.executable, str(script))
    assert proc.returncode == 124
    assert "did not finish within 2 s" in proc.stderr
    assert_no_processes(str(script))


def test_launch_sets_roles(tmp_path):
    script = tmp_path / "roles.py"
    script.write_text(
        "from ddpbench.comm import world\n"
        "w = world()\n"
        "print(f'ROLE {w.rank} {w.role} {w.role_rank} {w.num_workers} {w.num_servers}', flush=True)\n"
    )
    proc = _launch("-n", "2", "--servers", "1", "--", sys.executable, str(script))
    assert proc.returncode == 0, proc.stderr
    # Ranks print concurrently, so lines may interleave: pick the records out by pattern.
    roles = sorted(m.split() for m in re.findall(r"ROLE (\d \w+ \d \d \d)", proc.stdout))
    assert roles == [["0", "worker", "0", "2", "1"], ["1", "worker", "1", "2", "1"],
                     ["2", "server", "0", "2", "1"]]


def test_launch_rejects_bad_usage():
    proc = _launch("-n", "0", "--", "true")
    assert proc.returncode == 2 and "workers must be an integer >= 1" in proc.stderr
    proc = _launch("-n", "1")
    assert proc.returncode == 2 and "no command given" in proc.stderr


def test_bench_allreduce_runs_and_checks_results():
    # two tensors of each size in flight per timed call, every result checked
    proc = subprocess.run(
        [sys.executable, "-m", "ddpbench", "bench", "allreduce", "-n", "3", "--sizes", "1K,64K",
         "--warmup", "1", "--iters", "3", "--format", "json", "--dtype", "float16",
         "--inflight", "2"],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [(r["backend"], r["size"]) for r in rows] == [
        ("native", 1024), ("native", 65536), ("mpi", 1024), ("mpi", 65536), ("horovod", 1024),
        ("horovod", 65536)]  # native: a bare comm.Allreduce, the baseline of the ratios
    for r in rows:
        assert r["wrong"] == 0 and r["count"] == r["size"] // 2 and r["ranks"] == 3
        assert r["min_us"] <= r["time_us"] <= r["max_us"]
        assert r["inflight"] == 2
        assert r["algbw"] == pytest.approx(2 * r["size"] / r["time_us"] / 1e3)
        assert r["busbw"] == pytest.approx(r["algbw"] * 4 / 3)
        # Each row but native's carries the bare allreduces timed right before each call,
        # except horovod's: its engine cycles, and a bare call on the caller's thread would
        # end only as a cycle's allreduce returns (MPICH under MPI_THREAD_MULTIPLE).
        paired = r.get("paired_native_us", [])
        assert len(paired) == (0 if r["backend"] in ("native", "horovod")
                               else len(r["samples_us"]))
        if paired:
            assert r["paired_native_time_us"] == pytest.approx(float(np.median(paired)))


def test_bench_allreduce_adds_one_call_native_above_the_chunk_size():
    # Above ALLREDUCE_CHUNK_BYTES native goes in the backends' chunks and native:one_call
    # times one bare call of the whole buffer; both checked against the reference.
    proc = subprocess.run(
        [sys.executable, "-m", "ddpbench", "bench", "allreduce", "-n", "2", "--sizes", "4K,20M",
         "--backends", "mpi", "--warmup", "1", "--iters", "2", "--format", "json"],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [(r["backend"], r["size"]) for r in rows] == [
        ("native", 4096), ("native", 20 << 20), ("native:one_call", 4096),
        ("native:one_call", 20 << 20), ("mpi", 4096), ("mpi", 20 << 20)]
    assert all(r["wrong"] == 0 for r in rows)


@pytest.mark.parametrize("layout", ["flat", "separate"])
def test_bench_allreduce_tensor_set_checks_results_and_reduces_flat_gradients_in_place(layout):
    proc = subprocess.run(
        [sys.executable, "-m", "ddpbench", "bench", "allreduce", "-n", "3", "--tensors",
         "resnet50", "--scale", "0.001", "--layout", layout, "--warmup", "1", "--iters", "2",
         "--rounds", "1", "--format", "json"],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {r["backend"]: r for r in json.loads(proc.stdout)}
    assert set(rows) == {"native", "native:per_tensor", "mpi", "horovod",
                         "horovod:fusion_threshold=0"}
    for r in rows.values():
        assert r["wrong"] == 0 and r["ranks"] == 3
        assert r["tensors"] == (1 if r["backend"] == "native" else 161)
    fused = rows["horovod"]
    assert fused["groups"] >= 1
    # Flat gradients are their own fusion buffer; separate arrays are always copied (a group
    # of one tensor is never copied and is not counted).
    if layout == "flat":
        assert fused["zero_copy_groups"] >= 1
    else:
        assert fused["zero_copy_groups"] == 0


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_large_transfers_without_single_copy_shared_memory(n):
    """MPICH without cross-memory attach (its default before 5.0, and wherever ptrace is
    restricted) moves a large message only while its sender calls into MPI: every backend
    whose engine polls transfers still sums 4 MiB tensors exactly there."""
    out = run_mpi(n, SCRIPTS / "large_transfers.py", timeout=120,
                  env={"MPIR_CVAR_CH4_CMA_ENABLE": "0"})
    done = results(out, "large")
    assert [r["backend"] for r in done] == ["collective", "kvstore", "p3", "byteps"]
    assert all(r["workers"] == n and r["steps"] == 3 for r in done)
