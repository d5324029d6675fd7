"""Launch a Python script on N MPI ranks from a test, with a timeout; a hang is a failure.

Usage in a test::

    from mpiutil import run_mpi
    out = run_mpi(3, SCRIPTS / "check_horovod.py", "--case", "fusion")

The script reports what it checked as JSON lines (``mpi_scripts/_results.py``), which
``results(out)`` reads back, and exits non-zero on a wrong result; any failing
rank aborts the job (``mpiexec`` ends the others). On failure the exact command to re-run
is part of the message.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddpbench.launch import mpich_segments, remove_orphaned_segments

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "mpi_scripts"


def mpiexec() -> str:
    """Return the mpiexec beside this interpreter (the mpich wheel's), else the one on PATH."""
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else "mpiexec"


def run_mpi(
    n: int,
    script: str | os.PathLike[str],
    *args: str,
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
    expect_fail: bool = False,
) -> str:
    """Run ``python script args`` on ``n`` ranks; return stdout+stderr.

    Fails the test on a non-zero exit (or on a zero exit when ``expect_fail``) and on a
    timeout, printing the command that reproduces it.
    """
    cmd = [mpiexec(), "-n", str(n), sys.executable, "-u", str(script), *map(str, args)]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env.setdefault("PYTHONPATH", str(REPO))
    rerun = " ".join(shlex.quote(c) for c in cmd)
    segments = mpich_segments()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env,
        cwd=str(REPO), start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        stdout, stderr = proc.communicate()
        pytest.fail(f"hang: {n} ranks did not finish in {timeout} s\nre-run: {rerun}\n"
                    f"{(stdout + stderr)[-4000:]}")
    finally:
        _kill_group(proc)  # every rank of the job, not only mpiexec
        remove_orphaned_segments(segments, proc.pid)  # what an aborted job left in /dev/shm
    out = stdout + stderr
    if expect_fail and proc.returncode == 0:
        pytest.fail(f"expected a failure, got exit 0\nre-run: {rerun}\n{out[-4000:]}")
    if not expect_fail and proc.returncode != 0:
        pytest.fail(f"exit {proc.returncode} on {n} ranks\nre-run: {rerun}\n{out[-6000:]}")
    return out


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def assert_no_processes(pattern: str, grace: float = 5.0) -> None:
    """Fail if processes matching ``pattern`` are still alive after ``grace`` seconds.

    mpiexec returns as soon as it has killed a failed job; the killed ranks can take a few
    milliseconds more to disappear, which is not an orphan. A process still there after
    the grace period is one.
    """
    deadline = time.monotonic() + grace
    while True:
        left = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
        if not left.strip():
            return
        if time.monotonic() > deadline:
            pytest.fail(f"processes left behind after {grace} s: {left.split()}")
        time.sleep(0.05)


def results(out: str, check: str | None = None, **match: object) -> list[dict]:
    """Return the JSON result records in ``out``, those of ``check`` whose fields equal ``match``.

    Ranks print concurrently and ``mpiexec`` may interleave their lines, so records are
    decoded wherever one starts, not line by line.
    """
    decoder = json.JSONDecoder()
    found, pos = [], out.find('{"')
    while pos >= 0:
        try:
            rec, end = decoder.raw_decode(out, pos)
        except ValueError:
            pos = out.find('{"', pos + 2)
            continue
        pos = out.find('{"', end)
        if not isinstance(rec, dict) or "check" not in rec:
            continue
        if check is not None and rec["check"] != check:
            continue
        if all(rec.get(k) == v for k, v in match.items()):
            found.append(rec)
    return found


def one(out: str, check: str, **match: object) -> dict:
    """Return the single record of ``check`` matching ``match``; fail the test otherwise."""
    found = results(out, check, **match)
    if len(found) != 1:
        pytest.fail(f"expected one {check!r} record with {match}, found {len(found)}:\n{out[-3000:]}")
    return found[0]
