"""Start a job of worker (and server) processes over the ``mpiexec`` of the mpich wheel.

World ranks 0..W-1 are workers and W..W+S-1 servers; every process learns the split from
``DDPBENCH_NUM_WORKERS`` and ``DDPBENCH_NUM_SERVERS`` (see :class:`ddpbench.comm.World`).
A rank that fails takes the job down (mpiexec ends the others; ranks that die with a
Python exception call ``MPI_Abort`` through :mod:`ddpbench.comm`'s hooks), and the whole
process group is killed on timeout or Ctrl-C, so no process is left behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["launch", "mpiexec_path"]


def mpiexec_path() -> str:
    """Return the ``mpiexec`` installed beside this Python (the mpich wheel's), or on PATH.

    Raises:
        RuntimeError: none is installed.
    """
    local = Path(sys.executable).parent / "mpiexec"
    if local.exists():
        return str(local)
    found = shutil.which("mpiexec")
    if found is None:
        raise RuntimeError(
            "mpiexec not found: install the MPI wheel into this environment with "
            "'pip install mpich' (ddpbench depends on it)"
        )
    return found


def _kill_group(proc: subprocess.Popen) -> None:
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(grace)
            return
        except subprocess.TimeoutExpired:
            continue


def launch(
    cmd: Sequence[str],
    workers: int,
    servers: int = 0,
    *,
    hostfile: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
    env: dict[str, str] | None = None,
    stdout: int | None = None,
    stderr: int | None = None,
) -> int:
    """Run ``cmd`` on ``workers`` + ``servers`` ranks and return the job's exit code.

    Args:
        cmd: the program and its arguments, e.g. ``["python", "train.py"]``.
        workers: worker processes (>= 1).
        servers: server processes for the parameter-server backends (>= 0).
        hostfile: an MPICH host file (one host per line, ``host:slots``).
        timeout: seconds before the whole job is killed (exit code 124).
        env: extra environment variables for every rank.
        stdout, stderr: passed to ``subprocess.Popen`` (default: inherit).

    Raises:
        ValueError: a bad count, an empty command or a missing host file.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < 0:
        raise ValueError(f"servers must be an integer >= 0, got {servers!r}")
    cmd = list(cmd)
    if not cmd:
        raise ValueError("no command given: use 'ddpbench launch -n 2 -- python script.py'")
    args = [mpiexec_path(), "-n", str(workers + servers)]
    if hostfile is not None:
        if not Path(hostfile).is_file():
            raise ValueError(f"hostfile {str(hostfile)!r} does not exist")
        args += ["-f", str(hostfile)]
    args += cmd
    full_env = {
        **os.environ,
        "DDPBENCH_NUM_WORKERS": str(workers),
        "DDPBENCH_NUM_SERVERS": str(servers),
        **(env or {}),
    }
    proc = subprocess.Popen(args, env=full_env, start_new_session=True,
                            stdout=stdout, stderr=stderr)
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        print(f"ddpbench launch: the job did not finish within {timeout:g} s and was killed",
              file=sys.stderr)
        return 124
    except KeyboardInterrupt:
        _kill_group(proc)
        raise
    finally:
        if proc.poll() is None:
            _kill_group(proc)
    # Ranks that outlived the job's end (a daemon thread stuck in MPI) must not linger.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    if rc != 0:
        what = f"signal {-rc}" if rc < 0 else f"exit code {rc}"
        print(f"ddpbench launch: the job failed ({what}); the failing rank's message is above",
              file=sys.stderr)
    return rc
