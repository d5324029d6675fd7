"""The fault suite: every way a job or a run can fail ends in bounded time with a clear message.

Run it alone with ``pytest -m faults``. Each case launches its own job with a timeout (a hang
is a failure) and checks the exit code, the message and that no process of the job is left.
"""

from __future__ import annotations

import csv
import os
import re
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

pytestmark = [pytest.mark.faults, pytest.mark.mpi]

BACKENDS = ["mpi", "horovod", "collective", "kvstore", "p3", "byteps"]


def launch(tmp_path: Path, body: str, *args: str, n: int = 2, timeout: float = 60,
           env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, str]:
    """Launch ``body`` (a Python script) on ``n`` ranks; return the result and its marker.

    Also checks that the job left no MPICH shared-memory segment in /dev/shm (a killed
    rank's segments are the launcher's to remove).
    """
    marker = f"fault{uuid.uuid4().hex[:10]}"
    script = tmp_path / f"{marker}.py"
    script.write_text(textwrap.dedent(body))
    before = mpich_segments()
    proc = subprocess.run(
        [sys.executable, "-m", "ddpbench", "launch", "-n", str(n), *args, "--",
         sys.executable, str(script)],
        capture_output=True, text=True, timeout=timeout, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})
    left = orphaned_segments(before)
    assert not left, f"the job left MPICH segments in /dev/shm: {sorted(left)}"
    return proc, marker


PLAIN = """\
    import os, sys, time
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    if comm.rank == 1:
        time.sleep(0.3)
        {action}
    else:
        comm.recv(source=1)  # waits for rank 1 forever
"""


@pytest.mark.parametrize(("action", "code", "message"), [
    ("raise RuntimeError('rank one gives up')", 1,
     "rank 1 failed first: exit code 1 (an uncaught exception)"),
    ("sys.exit(3)", 3, "rank 1 failed first: exit code 3 (sys.exit)"),
    ("os._exit(3)", 3, "rank 1 failed first: exit code 3 (os._exit)"),
    ("os.kill(os.getpid(), 9)", 9, "vanished without an exit status"),
])
def test_plain_mpi4py_rank_failure_ends_the_job(tmp_path, action, code, message):
    proc, marker = launch(tmp_path, PLAIN.format(action=action))
    assert proc.returncode == code, proc.stderr
    assert message in proc.stderr
    if "raise" in action:
        assert "| RuntimeError: rank one gives up" in proc.stderr  # its last stderr lines
    assert_no_processes(marker)


def test_clean_exit_while_others_wait_ends_the_job_after_the_grace(tmp_path):
    proc, marker = launch(tmp_path, PLAIN.format(action="sys.exit(0)"), "--exit-grace", "2")
    assert proc.returncode == 1
    assert "ranks [1] ended cleanly but ranks [0] were still running 2 s later" in proc.stderr
    assert_no_processes(marker)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rank_killed_mid_push_pull_ends_the_job(tmp_path, backend):
    body = f"""\
        import os, signal
        import numpy as np
        import ddpbench
        kv = ddpbench.create({backend!r})
        for i in range(100_000):
            kv.push_pull("g", np.ones(1000, np.float32))
            if kv.rank == 1 and i == 3:
                os.kill(os.getpid(), signal.SIGKILL)
        kv.close()
    """
    proc, marker = launch(tmp_path, body, n=3)
    assert proc.returncode != 0
    assert "vanished without an exit status" in proc.stderr, proc.stderr
    assert_no_processes(marker)


@pytest.mark.parametrize("backend", ["kvstore", "p3", "byteps"])
def test_server_killed_ends_the_job(tmp_path, backend):
    body = f"""\
        import os, signal, threading
        import numpy as np
        import ddpbench
        from ddpbench.comm import world
        if world().role == "server":
            threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGKILL)).start()
        kv = ddpbench.create({backend!r})  # a server rank serves here until the job ends
        for i in range(1_000_000):
            kv.push_pull("g", np.ones(1000, np.float32))
        kv.close()
    """
    proc, marker = launch(tmp_path, body, "--servers", "1", n=2,
                          env={"DDPBENCH_NUM_SERVERS": "1"})
    assert proc.returncode != 0
    # The server is rank 2; mpiexec ends the workers within milliseconds, so on a loaded
    # machine they may be seen gone in the same poll (the message then names them all).
    assert re.search(r"rank 2 failed first|ranks \[[0-9, ]*2\] ended at the same moment",
                     proc.stderr) and "vanished" in proc.stderr, proc.stderr
    assert_no_processes(marker)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_to_launch_takes_down_the_whole_job(tmp_path, sig):
    marker = f"fault{uuid.uuid4().hex[:10]}"
    script = tmp_path / f"{marker}.py"
    script.write_text("import time\nfrom mpi4py import MPI\ntime.sleep(120)\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddpbench", "launch", "-n", "2", "--", sys.executable,
         str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # wait for the ranks to be up
        up = subprocess.run(["pgrep", "-f", f"{marker}.py"], capture_output=True, text=True)
        if len(up.stdout.split()) >= 3:  # mpiexec and two ranks
            break
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig, err
    assert f"stopped by {signal.Signals(sig).name}" in err
    assert_no_processes(f"{marker}.py", grace=10.0)



def test_in_process_launch_logs_the_failure_and_passes_signals_on(tmp_path):
    """launch_logged (experiments' real points, calibrate): a failing rank's message lands
    in the log; Ctrl-C while a job runs raises KeyboardInterrupt in the caller, SIGTERM
    ends it as SIGTERM would; either way no rank is left."""
    marker = f"fault{uuid.uuid4().hex[:10]}"
    failing = tmp_path / f"{marker}fail.py"
    failing.write_text("from mpi4py import MPI\nraise RuntimeError('rank gives up')\n")
    sleeping = tmp_path / f"{marker}.py"
    sleeping.write_text("import time\nfrom mpi4py import MPI\ntime.sleep(120)\n")
    caller = tmp_path / "caller.py"
    caller.write_text(textwrap.dedent("""\
        import sys
        from pathlib import Path
        from ddpbench.launch import launch_logged
        log = Path(sys.argv[2])
        rc = launch_logged([sys.executable, sys.argv[1]], 2, log=log, timeout=60)
        print("rc", rc, flush=True)
    """))
    log = tmp_path / "fail.log"
    done = subprocess.run([sys.executable, str(caller), str(failing), str(log)],
                          capture_output=True, text=True, timeout=90, cwd=REPO)
    assert done.returncode == 0 and "rc 1" in done.stdout, done.stderr
    text = log.read_text()
    assert "RuntimeError: rank gives up" in text and "failed first" in text, text
    # A rank's own exit code 130 is a failed job, not a Ctrl-C of the caller.
    exits = tmp_path / f"{marker}exit.py"
    exits.write_text("import sys\nfrom mpi4py import MPI\nsys.exit(130)\n")
    done = subprocess.run([sys.executable, str(caller), str(exits), str(tmp_path / "x.log")],
                          capture_output=True, text=True, timeout=90, cwd=REPO)
    assert done.returncode == 0 and "rc 130" in done.stdout, done.stderr
    for sig in (signal.SIGINT, signal.SIGTERM):
        proc = subprocess.Popen([sys.executable, str(caller), str(sleeping),
                                 str(tmp_path / f"{sig.name}.log")],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=REPO)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # wait for the ranks to be up
            up = subprocess.run(["pgrep", "-f", f"{marker}.py"], capture_output=True,
                                text=True)
            if len(up.stdout.split()) >= 3:  # mpiexec and two ranks
                break
            time.sleep(0.05)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
        assert "rc" not in out, out
        if sig == signal.SIGINT:
            # An uncaught KeyboardInterrupt ends Python by SIGINT (3.8+).
            assert proc.returncode == -signal.SIGINT and "KeyboardInterrupt" in err, err
        else:
            assert proc.returncode == -signal.SIGTERM, (proc.returncode, err)
        assert_no_processes(f"{marker}.py", grace=10.0)

def test_results_under_a_file_size_limit_lose_no_written_row(tmp_path):
    """A full disk or quota mid-run: the run fails with a message, written rows stay."""
    exp = tmp_path / "tiny.yaml"
    exp.write_text("name: tiny\nworkloads: [resnet50]\nworkers: 2\n"
                   "bandwidth_gbps: [1, 2, 4, 8, 16, 32]\niterations: 2\nwarmup: 1\n"
                   "backends:\n  horovod: {}\nreport:\n  plots: []\n")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "ddpbench", "run", str(exp), "--outdir", str(out), "-j", "1",
           "--no-progress", "--no-report", "--only", "bandwidth_gbps=1,"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert first.returncode == 0, first.stderr
    size = (out / "results.csv").stat().st_size
    limit = f"import resource; resource.setrlimit(resource.RLIMIT_FSIZE, ({size + 200}, " \
            f"{size + 200}))"
    runner = [sys.executable, "-c", f"{limit}; import sys; from ddpbench.cli import main; "
              f"sys.argv = ['ddpbench', *sys.argv[1:]]; sys.exit(main())", *cmd[3:-2]]
    proc = subprocess.run(runner, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode != 0
    assert "cannot write the results" in proc.stderr and "File too large" in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert "horovod[bandwidth_gbps=1," in rows[0]["point"] and rows[0]["status"] == "ok"
    rerun = subprocess.run(cmd[:-2], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert rerun.returncode == 0, rerun.stderr
    with open(out / "results.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == 6


AFFINITY = """\
    import json, os
    from pathlib import Path
    from mpi4py import MPI
    rank = MPI.COMM_WORLD.rank
    # One file per rank: mpiexec may interleave lines that ranks print at once.
    out = Path(__file__).with_name(f"{Path(__file__).stem}.affinity{rank}")
    out.write_text(json.dumps(sorted(os.sched_getaffinity(0))))
"""


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux only")
def test_bind_core_puts_each_rank_on_one_core_round_robin(tmp_path):
    import json

    def affinities(marker: str, n: int) -> list[set[int]]:
        return [set(json.loads((tmp_path / f"{marker}.affinity{r}").read_text()))
                for r in range(n)]

    ours = os.sched_getaffinity(0)
    proc, marker = launch(tmp_path, AFFINITY, "--bind", "core", n=3)
    assert proc.returncode == 0, proc.stderr
    sets = affinities(marker, 3)
    width = len(sets[0])  # the processing units of one core (2 with hyper-threads)
    cores = len(ours) // width
    assert all(s <= ours and len(s) == width for s in sets)
    for r in range(3):
        for s in range(r + 1, 3):
            same = (s - r) % cores == 0
            assert (sets[r] == sets[s]) if same else not (sets[r] & sets[s]), (r, s, sets)
    proc, marker = launch(tmp_path, AFFINITY, n=2)  # the default leaves placement to the OS
    assert proc.returncode == 0, proc.stderr
    assert affinities(marker, 2) == [ours, ours]
    with pytest.raises(ValueError, match="bind must be one of none, core, got 'socket'"):
        from ddpbench.launch import launch as run_job

        run_job([sys.executable, "-c", "pass"], 1, bind="socket")
