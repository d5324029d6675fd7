"""The fault suite, bad inputs: every size bounded, a broken row repaired, a killed launcher
takes its job along (issue 54: 17 inputs a new user tried that did not get a clear error).

Each case runs the command as a user would, with a timeout (a hang is a failure), and checks
the exit code, the message (the estimate and the one flag that overrides it, ``--allow-large``),
that a refused run used under 1 GB of memory, and that no process of a job is left.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from mpiutil import REPO, assert_no_processes

from ddpbench.launch import mpich_segments, orphaned_segments

pytestmark = [pytest.mark.faults]

ALLOW = "--allow-large"
_MEASURE = textwrap.dedent("""\
    import json, resource, subprocess, sys
    p = subprocess.run(sys.argv[1:], capture_output=True, text=True)
    print(json.dumps({"rc": p.returncode, "out": p.stdout, "err": p.stderr,
                      "rss_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
""")


def ddpbench(*args: str, timeout: float = 120, env: dict[str, str] | None = None,
             cwd: Path = REPO) -> tuple[int, str, str, float]:
    """Run ``ddpbench ARGS``; return exit code, stdout, stderr and its peak RSS in MiB."""
    proc = subprocess.run([sys.executable, "-c", _MEASURE, sys.executable, "-m", "ddpbench",
                           *args], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})
    doc = json.loads(proc.stdout)
    return doc["rc"], doc["out"], doc["err"], doc["rss_kb"] / 1024


def refused(rc: int, err: str, rss_mib: float, *words: str) -> None:
    """Assert a refusal before any work: exit 2, one message naming ``words``, no traceback,
    under 1 GB of memory."""
    assert rc == 2, err
    assert err.startswith("ddpbench ") and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)
    assert rss_mib < 1024, f"a refused run used {rss_mib:.0f} MiB"


# -- sizes: one estimate before any work, refused with it and --allow-large ----------------
@pytest.mark.parametrize("args", [
    ["-w", "gpt2_xl", "-b", "p3", "-k", "slice_params=1"],
    ["-w", "gpt2_xl", "-b", "byteps", "-k", "partition_bytes=4"],
], ids=["p3-slice_params=1", "byteps-partition_bytes=4"])
def test_simulate_refuses_a_small_knob_at_four_hosts(args):
    rc, _out, err, rss = ddpbench("simulate", *args)
    refused(rc, err, rss, "this simulation would take about", "events", "GiB of memory",
            f"add {ALLOW} to run it anyway")


def test_simulate_refuses_a_profile_with_a_huge_tensor(tmp_path):
    profile = tmp_path / "huge.yaml"
    profile.write_text("name: huge\nbatch_size: 32\nlayers:\n  - name: fc\n    fwd_ms: 1\n"
                       "    bwd_ms: 2\n    tensors:\n      - {name: fc.weight, "
                       "numel: 94000000000000}\n")  # 376 TB of fp32
    rc, _out, err, rss = ddpbench("simulate", "-w", str(profile), "-b", "p3")
    refused(rc, err, rss, "this simulation would take about", ALLOW)


def test_numerics_query_refuses_a_world_of_1e11():
    rc, _out, err, rss = ddpbench("numerics", "query", "-N", "1e11", "--scale", "1e-3")
    refused(rc, err, rss, "world size must be <= 1,000,000 ranks", "100,000,000,000")
    rc, _out, err, rss = ddpbench("numerics", "query", "-N", "1000000", "--scale", "1e-3",
                                  "--elements", "100000000")
    refused(rc, err, rss, "this emulation would take 1,000,000 ranks x 100,000,000 elements",
            ALLOW)


def test_run_refuses_a_point_past_the_limits_before_any_point(tmp_path):
    exp = tmp_path / "big.yaml"
    exp.write_text("name: big\nworkloads: [resnet50]\nworkers: [4, 1000000]\n"
                   "iterations: 2\nbackends: [horovod]\n")
    out = tmp_path / "out"
    rc, _o, err, rss = ddpbench("run", str(exp), "--outdir", str(out), "--no-progress")
    refused(rc, err, rss, "point horovod[", "workers=1000000", "this simulation would take",
            f"add {ALLOW}")
    assert "--max-events" not in err  # the flag it names is one run takes
    assert not out.exists(), "a refused run wrote its folder"


def test_run_refuses_more_real_workers_than_this_host_can_start(tmp_path):
    exp = tmp_path / "real.yaml"
    exp.write_text("name: real\nmode: real\nworkloads: [resnet50]\nworkers: 400\n"
                   "iterations: 2\nbackends: [horovod]\n")
    rc, _o, err, rss = ddpbench("run", str(exp), "--outdir", str(tmp_path / "out"),
                                "--no-progress")
    refused(rc, err, rss, "this job would take 400 ranks on this host", ALLOW)


@pytest.mark.parametrize(("line", "words"), [
    ("workers: 1000000000", ["workers must be an integer in [1, 1,000,000]"]),
    ("workers: 1e9", ["field 'workers': must be an integer, got the string '1e9' (YAML reads "
                      "1e9 as text: write 1000000000)"]),
    ("workers: [2, true]", ["field 'workers[1]': must be an integer, got True (a boolean"]),
    ("batch_size: 1000000000000", ["batch_size must be a positive integer of at most "
                                   "1,048,576 (samples per worker per iteration)"]),
    ("gpus_per_host: 1000000\nhosts: 1", ["gpus_per_host must be a positive integer of at "
                                          "most 72 (GPUs"]),
    ("bandwidth_gbps: 1.0e-300", ["Gbit/s"]),
    ("horovod.cycle_time: 1.0e+300", ["knob 'cycle_time' of backend 'horovod' must be "
                                      "<= 10000 ms"]),
], ids=["workers=1e9", "workers-text", "workers=true", "batch_size=1e12", "gpus_per_host=1e6",
        "bandwidth=1e-300", "cycle_time=1e300"])
def test_an_experiment_file_out_of_bounds_or_of_the_wrong_type_is_refused(tmp_path, line,
                                                                           words):
    exp = tmp_path / "bad.yaml"
    exp.write_text(f"name: bad\nworkloads: [resnet50]\nbackends: [horovod]\n{line}\n")
    rc, _o, err, rss = ddpbench("run", str(exp), "--outdir", str(tmp_path / "out"))
    refused(rc, err, rss, "bad.yaml:4: field", *words)


def test_simulate_flags_out_of_bounds_are_refused():
    rc, _o, err, rss = ddpbench("simulate", "-b", "horovod", "-k", "cycle_time=1e300")
    refused(rc, err, rss, "knob 'cycle_time' of backend 'horovod' must be <= 10000 ms, got "
                          "1e+300")
    rc, _o, err, rss = ddpbench("simulate", "-b", "kvstore", "--hosts", "1",
                                "--gpus-per-host", "1000000")
    refused(rc, err, rss, "gpus_per_host must be a positive integer of at most 72")


# -- the trace, the report, the README ---------------------------------------------------
def test_simulate_trace_to_a_missing_folder_is_refused_before_the_simulation():
    rc, out, err, rss = ddpbench("simulate", "--trace", "/unwritable/t.json")
    refused(rc, err, rss, "--trace /unwritable/t.json: folder /unwritable does not exist")
    assert out == ""


def test_simulate_prints_its_result_when_the_trace_cannot_be_written(tmp_path):
    # The disk fills between the check and the write (a file-size limit here): the result
    # is printed first, then what happened to the trace; exit 1.
    trace = tmp_path / "t.json"
    limit = "import resource; resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))"
    proc = subprocess.run(
        [sys.executable, "-c", f"{limit}; import sys; from ddpbench.cli import main; "
         f"sys.argv = ['ddpbench', *sys.argv[1:]]; sys.exit(main())", "simulate",
         "--trace", str(trace)], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.startswith("p3 on resnet50, 4 workers") and "iteration" in proc.stdout
    assert "the result above is complete, but its trace could not be written" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_report_refuses_another_experiments_file(tmp_path):
    folder = tmp_path / "p3_vs_ring"
    shutil.copytree(REPO / "reports" / "p3_vs_ring", folder)
    rc, _o, err, rss = ddpbench("report", str(folder), "--experiment",
                                str(REPO / "experiments" / "scaling.yaml"))
    refused(rc, err, rss, "holds the results of experiment 'p3_vs_ring', but",
            "is experiment 'scaling'")


def test_the_readmes_first_command_changes_no_committed_file(tmp_path):
    tracked = subprocess.run(["git", "ls-files", "reports/p3_vs_ring"], capture_output=True,
                             text=True, cwd=REPO, check=True).stdout.split()
    folder = tmp_path / "p3_vs_ring"
    shutil.copytree(REPO / "reports" / "p3_vs_ring", folder)
    before = {f: (REPO / f).read_bytes() for f in tracked}
    rc, out, err, _rss = ddpbench("run", "experiments/p3_vs_ring.yaml", "--outdir",
                                  str(folder))
    assert rc == 0 and "156 already finished" in out, err
    for f, data in before.items():
        assert (folder / Path(f).relative_to("reports/p3_vs_ring")).read_bytes() == data, (
            f"{f} changed")


# -- results.csv: a row that does not parse -----------------------------------------------
TINY = ("name: tiny\nworkloads: [resnet50]\nworkers: 2\nbandwidth_gbps: [1, 2, 4]\n"
        "iterations: 2\nwarmup: 1\nbackends: [horovod]\nreport: {plots: []}\n")


def test_a_truncated_middle_row_is_reported_set_aside_and_recomputed(tmp_path):
    exp = tmp_path / "tiny.yaml"
    exp.write_text(TINY)
    out = tmp_path / "out"
    rc, _o, err, _r = ddpbench("run", str(exp), "--outdir", str(out), "--no-progress", "-j", "1")
    assert rc == 0, err
    good = (out / "results.csv").read_text()
    lines = good.split("\n")
    lines[2] = lines[2][: len(lines[2]) * 4 // 5]  # the middle row, cut short
    (out / "results.csv").write_text("\n".join(lines))
    rc, _o, err, _r = ddpbench("report", str(out))
    assert rc == 0 and "line 3: " in err and "cut short" in err, err
    assert "2 rows in `results.csv`: 2 ok" in (out / "report.md").read_text()
    rc, stdout, err, _r = ddpbench("run", str(exp), "--outdir", str(out), "--no-progress")
    assert rc == 0 and "1 ran ok, 0 failed, 2 already finished" in stdout, (stdout, err)
    assert (out / "results.csv").read_text() == good  # the same rows, in the sweep's order
    assert (out / "results.rejected.csv").read_text().split("\n")[1] == lines[2]


# -- Ctrl-C ---------------------------------------------------------------------------------
def test_ctrl_c_stops_a_run_keeping_its_rows_and_no_worker(tmp_path):
    exp = tmp_path / "many.yaml"
    exp.write_text("name: many\nworkloads: [resnet50, vgg19]\nworkers: 4\n"
                   "bandwidth_gbps: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]\n"
                   "iterations: 3\nbackends: [kvstore, p3, byteps]\nreport: {plots: []}\n")
    out = tmp_path / "out"
    tag = f"ctrlc{uuid.uuid4().hex[:10]}"
    proc = subprocess.Popen([sys.executable, "-m", "ddpbench", "run", str(exp), "--outdir",
                             str(out), "--no-progress", "-j", "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO,
                            start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(REPO), "TEST_TAG": tag})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # some rows written, most of the 72 still to run
        if (out / "results.csv").exists() and len(
                (out / "results.csv").read_text().splitlines()) > 3:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "ddpbench run: interrupted" in err, err
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert 3 <= len(rows) < 72 and all(r["status"] == "ok" for r in rows)
    # No worker of its pool is left (they carry the run's environment).
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if f"TEST_TAG={tag}".encode() in Path(f"/proc/{pid}/environ").read_bytes():
                left.append(pid)
        except OSError:
            pass
    assert not left, f"processes of the interrupted run left: {left}"


# -- the launcher ---------------------------------------------------------------------------
def test_launch_refuses_more_ranks_than_it_can_start():
    rc, out, err, rss = ddpbench("launch", "-n", "100000", "--", sys.executable, "-c", "pass")
    refused(rc, err, rss, "this job would take 100,000 ranks on this host",
            "more than 8 ranks per core", ALLOW)
    assert out == ""


def _wait_for(marker: str, count: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        up = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
        if len(up.stdout.split()) >= count:
            return
        time.sleep(0.05)
    pytest.fail(f"{count} processes matching {marker} never came up")


@pytest.mark.mpi
def test_kill_9_of_the_launcher_takes_its_job_along(tmp_path):
    marker = f"fault{uuid.uuid4().hex[:10]}"
    script = tmp_path / f"{marker}.py"
    script.write_text("from mpi4py import MPI\nwhile True:\n    pass\n")  # ranks that spin
    before = mpich_segments()
    proc = subprocess.Popen([sys.executable, "-m", "ddpbench", "launch", "-n", "2", "--",
                             sys.executable, str(script)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for(f"{marker}.py", 3)  # mpiexec and two ranks
    time.sleep(0.5)  # the ranks in MPI (their shared memory made)
    proc.kill()
    proc.wait()
    assert_no_processes(f"{marker}.py", grace=10.0)  # mpiexec, the proxy, both ranks
    deadline = time.monotonic() + 10  # the watchdog removes them once the ranks are gone
    while orphaned_segments(before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not orphaned_segments(before), "the killed job left its shared memory"


@pytest.mark.mpi
def test_kill_9_of_the_launcher_ends_ranks_that_are_not_python(tmp_path):
    # Ranks the launcher does not wrap (here `sleep`), with more of them than cores: the
    # watchdog finds them by the job's tag in their environment.
    marker = f"{uuid.uuid4().int % 10**9}.125"
    proc = subprocess.Popen([sys.executable, "-m", "ddpbench", "launch", "-n", "12", ALLOW,
                             "--", "sleep", marker], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for(f"sleep {marker}", 12)
    proc.kill()
    proc.wait()
    assert_no_processes(f"sleep {marker}", grace=10.0)
    assert_no_processes(f"-n 12 sleep {marker}", grace=10.0)  # mpiexec


@pytest.mark.mpi
def test_a_timed_out_job_of_many_ranks_leaves_no_process(tmp_path):
    marker = f"{uuid.uuid4().int % 10**9}.25"
    rc, _out, err, _rss = ddpbench("launch", "-n", "24", ALLOW, "--timeout", "3", "--",
                                   "sleep", marker)
    assert rc == 124 and "did not finish within 3 s" in err, err
    assert_no_processes(f"sleep {marker}", grace=10.0)


@pytest.mark.mpi
def test_the_launchers_message_comes_first_without_mpichs_banner(tmp_path):
    script = tmp_path / "die.py"
    script.write_text("import os, time\nfrom mpi4py import MPI\nif MPI.COMM_WORLD.rank == 1:\n"
                      "    time.sleep(0.3)\n    os.kill(os.getpid(), 9)\ntime.sleep(60)\n")
    rc, out, err, _rss = ddpbench("launch", "-n", "2", "--", sys.executable, str(script))
    assert rc == 9, err
    assert "BAD TERMINATION" not in out + err and "=====" not in out, out
    assert err.startswith("ddpbench launch: "), err
    assert "mpiexec reported: " in err and "EXIT CODE: 9" in err, err


@pytest.mark.mpi
def test_a_ranks_endless_stderr_line_is_cut_in_the_launchers_message(tmp_path):
    script = tmp_path / "loud.py"
    script.write_text("import sys\nfrom mpi4py import MPI\nif MPI.COMM_WORLD.rank == 0:\n"
                      "    raise RuntimeError('x' * 700_000)\n")
    logs = tmp_path / "logs"
    rc, _out, err, _rss = ddpbench("launch", "-n", "2", "--", sys.executable, str(script),
                                   env={"DDPBENCH_LOG_DIR": str(logs)})
    assert rc == 1
    message = err[err.index("ddpbench launch: "):]
    assert len(message) < 6000, len(message)
    assert "more characters)" in message and f"the full text: {logs}" in message
    assert any("x" * 700_000 in p.read_text() for p in logs.iterdir())
