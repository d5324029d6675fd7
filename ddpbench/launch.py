"""Start a job of worker (and server) processes over the ``mpiexec`` of the mpich wheel.

World ranks 0..W-1 are workers and W..W+S-1 servers; every process learns the split from
``DDPBENCH_NUM_WORKERS`` and ``DDPBENCH_NUM_SERVERS`` (see :class:`ddpbench.comm.World`).

The launcher owns its job:

- Python ranks run under :mod:`ddpbench.rank`, so an uncaught exception or a non-zero
  ``sys.exit`` ends the job at once, with or without ``ddpbench.create``;
- a rank that vanishes (a signal, C code's ``_exit``) ends the job (``mpiexec`` does that;
  Python's ``os._exit`` is reported by the rank with its code), and a rank that ends
  cleanly while others never do ends it after ``exit_grace`` seconds;
- SIGTERM, SIGINT and SIGHUP take down ``mpiexec`` and every rank (the job runs in a
  process group of its own) and the launcher exits with 128 + the signal;
- the message names the first failing rank, its exit code or how it vanished, and its
  last lines of stderr; the exit code is that rank's, not ``mpiexec``'s;
- ``bind="core"`` binds every rank to one core, round robin over the host's cores (``mpiexec
  -bind-to core``: ranks 0, 2, 4 on core 0 and 1, 3, 5 on core 1 of a 2-core host), threads
  and all; the default ``"none"`` leaves placement to the OS, as MPICH and Horovod do;
- the shared-memory segments MPICH leaves in /dev/shm when its ranks are killed are
  removed (those the job made that no live process maps).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["BINDINGS", "DEFAULT_EXIT_GRACE_S", "launch", "launch_logged", "mpiexec_path"]

# How ranks are placed on cores: left to the OS, or one core each (``mpiexec -bind-to``).
BINDINGS = ("none", "core")

DEFAULT_EXIT_GRACE_S = 10.0
"""Seconds the other ranks get to end after one rank ended cleanly (``--exit-grace``)."""

_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_PY_OPTS_WITH_ARG = ("-X", "-W", "-Q")


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
    for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _is_python(program: str) -> bool:
    name = Path(program).name
    return program == sys.executable or name.startswith("python")


def rank_command(cmd: Sequence[str]) -> list[str]:
    """Return ``cmd`` with a Python program run under :mod:`ddpbench.rank` (others as given)."""
    cmd = list(cmd)
    if not cmd or not _is_python(cmd[0]):
        return cmd
    i = 1
    while i < len(cmd) and cmd[i].startswith("-") and cmd[i] not in ("-m", "-c", "-", "--"):
        i += 2 if cmd[i] in _PY_OPTS_WITH_ARG else 1
    if i >= len(cmd) or cmd[i] == "-":
        return cmd  # an interactive interpreter or a script on stdin: run it as it is
    return [*cmd[:i], "-m", "ddpbench.rank", *cmd[i:]]


_PF_EXITING = 0x4
"""Linux's task flag for a process on its way out (``include/linux/sched.h``)."""


def _alive(pid: int) -> bool:
    """False for a process that is gone, a zombie, or already exiting: a rank killed by a
    signal can take a while to tear down its memory, while ``mpiexec``, told by the closing
    of its pipes, has already ended the other ranks; seen by its state alone, the killed
    rank would look like the last to go."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0] not in ("Z", "X") and not int(fields[6]) & _PF_EXITING
    except (OSError, IndexError, ValueError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


class _Job:
    """What the ranks of one job have said about themselves in the job folder."""

    def __init__(self, folder: Path, nranks: int) -> None:
        self.folder, self.nranks = folder, nranks
        self.status: dict[int, dict[str, Any]] = {}
        self.pids: dict[int, int] = {}
        self.vanished: dict[int, float] = {}

    def poll(self) -> None:
        for path in self.folder.glob("rank*.json"):
            rank = int(path.stem[4:])
            if rank not in self.status:
                with contextlib.suppress(OSError, ValueError):
                    self.status[rank] = json.loads(path.read_text())
        for path in self.folder.glob("rank*.pid"):
            rank = int(path.stem[4:])
            if rank not in self.pids:
                with contextlib.suppress(OSError, ValueError):
                    self.pids[rank] = int(path.read_text())
        now = time.time()
        for rank, pid in self.pids.items():
            if (rank not in self.status and rank not in self.vanished and not _alive(pid)
                    and not (self.folder / f"rank{rank}.json").exists()):
                self.vanished[rank] = now  # ranks seen gone in one poll share a time

    def first_failure(self) -> tuple[str, str, int | None, list[str]] | None:
        """Return (who, what happened, exit code or None, stderr tail) of the first failure."""
        events: list[tuple[float, str, str, int | None, list[str]]] = []
        for rank, st in self.status.items():
            if st.get("code", 0) != 0:
                how = "an uncaught exception" if st.get("how") == "exception" else st.get("how")
                events.append((st["time"], f"rank {rank} failed first",
                           f"exit code {st['code']} ({how})", st["code"],
                           st.get("stderr_tail", [])))
        if self.vanished:
            when = min(self.vanished.values())
            ranks = sorted(r for r, t in self.vanished.items() if t == when)
            who = (f"rank {ranks[0]} failed first" if len(ranks) == 1 else
                   f"ranks {ranks} ended at the same moment, one of them first")
            events.append((when, who, "vanished without an exit status (killed by a signal "
                           "or ended by C code)", None, []))
        return min(events)[1:] if events else None

    def clean_exits(self) -> list[float]:
        return [st["time"] for st in self.status.values() if st.get("code", 0) == 0]


def launch(
    cmd: Sequence[str],
    workers: int,
    servers: int = 0,
    *,
    hostfile: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
    exit_grace: float = DEFAULT_EXIT_GRACE_S,
    env: dict[str, str] | None = None,
    stdout: int | None = None,
    stderr: int | None = None,
    bind: str = "none",
    signals: list[int] | None = None,
) -> int:
    """Run ``cmd`` on ``workers`` + ``servers`` ranks and return the job's exit code.

    Args:
        cmd: the program and its arguments, e.g. ``["python", "train.py"]``.
        workers: worker processes (>= 1).
        servers: server processes for the parameter-server backends (>= 0).
        hostfile: an MPICH host file (one host per line, ``host:slots``).
        timeout: seconds before the whole job is killed (exit code 124).
        exit_grace: seconds the other ranks get to end once one rank has ended cleanly.
        env: extra environment variables for every rank.
        stdout, stderr: passed to ``subprocess.Popen`` (default: inherit).
        bind: "none" (the OS places the ranks) or "core" (each rank on one core, round
            robin: ``mpiexec -bind-to core``).
        signals: a list the signal that stopped the job is appended to (so that a caller
            can tell 128 + N from a rank's own exit code).

    Returns:
        0, the first failing rank's exit code, 124 on timeout, 128 + N on signal N.

    Raises:
        ValueError: a bad count, an empty command or a missing host file.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < 0:
        raise ValueError(f"servers must be an integer >= 0, got {servers!r}")
    if not (exit_grace > 0):
        raise ValueError(f"exit_grace must be > 0 seconds, got {exit_grace!r}")
    if timeout is not None and not (timeout > 0):
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    if bind not in BINDINGS:
        raise ValueError(f"bind must be one of {', '.join(BINDINGS)}, got {bind!r}")
    cmd = list(cmd)
    if not cmd:
        raise ValueError("no command given: use 'ddpbench launch -n 2 -- python script.py'")
    args = [mpiexec_path(), "-n", str(workers + servers)]
    if hostfile is not None:
        if not Path(hostfile).is_file():
            raise ValueError(f"hostfile {str(hostfile)!r} does not exist")
        args += ["-f", str(hostfile)]
    if bind != "none":
        args += ["-bind-to", bind]
    args += rank_command(cmd)
    folder = Path(tempfile.mkdtemp(prefix="ddpbench-job-"))
    full_env = {
        **os.environ,
        "DDPBENCH_NUM_WORKERS": str(workers),
        "DDPBENCH_NUM_SERVERS": str(servers),
        "DDPBENCH_JOB_DIR": str(folder),
        **(env or {}),
    }
    try:
        return _supervise(args, full_env, folder, workers + servers, timeout, exit_grace,
                          stdout, stderr, signals)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def launch_logged(cmd: Sequence[str], workers: int, servers: int = 0, *, log: Path,
                  timeout: float | None = None, bind: str = "none") -> int:
    """Run ``cmd`` as :func:`launch` does, everything the ranks and the launcher say going
    to the file ``log``; return the job's exit code (124 on timeout).

    For callers that run jobs in their own process (an experiment's real points,
    ``ddpbench calibrate``'s runs), so that a job does not pay a ``ddpbench launch``
    subprocess's imports. A job stopped by SIGINT raises KeyboardInterrupt here, and one
    stopped by SIGTERM or SIGHUP passes that signal on to this process, as if it had had
    no job running: the launcher has already ended the job.
    """
    got: list[int] = []
    with open(log, "a") as fh, contextlib.redirect_stderr(fh):
        rc = launch(cmd, workers, servers, timeout=timeout, bind=bind, stdout=fh.fileno(),
                    stderr=fh.fileno(), signals=got)
    if got:  # (a rank's own exit code 130 is a failed job, not a Ctrl-C)
        if got[0] == signal.SIGINT:
            raise KeyboardInterrupt
        signal.raise_signal(signal.Signals(got[0]))
    return rc


def _supervise(args: list[str], env: dict[str, str], folder: Path, nranks: int,
               timeout: float | None, exit_grace: float, stdout: int | None,
               stderr: int | None, signals: list[int] | None = None) -> int:
    got: list[int] = []
    previous: dict[int, Any] = {}
    if _in_main_thread():
        for sig in _SIGNALS:
            previous[sig] = signal.signal(sig, lambda signum, _frame: got.append(signum))
    job = _Job(folder, nranks)
    segments = mpich_segments()
    proc = subprocess.Popen(args, env=env, start_new_session=True, stdout=stdout,
                            stderr=stderr)
    start = time.monotonic()
    ended_by: str | None = None
    try:
        while proc.poll() is None:
            if got:
                ended_by = "signal"
                break
            if timeout is not None and time.monotonic() - start > timeout:
                ended_by = "timeout"
                break
            job.poll()
            failure = job.first_failure()
            if failure is not None and _wait(proc, 5.0):
                break  # mpiexec ends the others itself; give it a moment, then we do
            if failure is not None:
                ended_by = "failure"
                break
            clean = job.clean_exits()
            if clean and len(clean) < nranks and time.time() - min(clean) > exit_grace:
                ended_by = "stuck"
                break
            time.sleep(0.01)
    finally:
        if proc.poll() is None:
            _kill_group(proc)
        # Ranks that outlived the job's end (a daemon thread stuck in MPI) must not linger.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        remove_orphaned_segments(segments, proc.pid)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    rc = proc.returncode
    if ended_by is None:
        job.poll()  # what the ranks said before mpiexec ended (not the ranks we killed)
    if ended_by == "signal":
        if signals is not None:
            signals.append(got[0])
        name = signal.Signals(got[0]).name
        _say(f"stopped by {name}: mpiexec and every rank were ended")
        return 128 + got[0]
    if ended_by == "timeout":
        _say(f"the job did not finish within {timeout:g} s and was killed")
        return 124
    failure = job.first_failure()
    if ended_by == "stuck":
        done = sorted(st["rank"] for st in job.status.values())
        left = sorted(set(range(nranks)) - set(done))
        _say(f"ranks {done} ended cleanly but ranks {left} were still running "
             f"{exit_grace:g} s later (waiting for a rank that is gone?); the job was "
             f"ended. Raise --exit-grace if ranks legitimately finish far apart.")
        return 1
    if failure is not None:
        who, what, code, tail = failure
        lines = "".join(f"\n  | {line}" for line in tail[-10:])
        where = f"; its last lines of stderr:{lines}" if tail else ""
        _say(f"{who}: {what}{where}")
        if code is None:
            code = rc if rc not in (0, None) else 1
            _say(f"mpiexec's exit code: {rc} (for a rank killed by signal N, MPICH reports N)")
        return code
    if rc != 0:
        what = f"signal {-rc}" if rc < 0 else f"exit code {rc}"
        _say(f"the job failed ({what} from mpiexec; no rank reported a failure)")
    return rc


_SHM_DIR = Path("/dev/shm")
_SHM_PREFIX = "mpich_shm_"


def mpich_segments() -> set[str]:
    """The names of MPICH's shared-memory segments in /dev/shm now (empty off Linux)."""
    try:
        return {p.name for p in _SHM_DIR.iterdir() if p.name.startswith(_SHM_PREFIX)}
    except OSError:
        return set()


def mapped_segments() -> set[str]:
    """The names of the /dev/shm files some live process has mapped (from /proc/*/maps)."""
    prefix = f"{_SHM_DIR}/"
    found = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        for line in text.splitlines():
            at = line.find(prefix)
            if at >= 0:
                found.add(line[at + len(prefix):].removesuffix(" (deleted)"))
    return found


def orphaned_segments(before: set[str]) -> set[str]:
    """The MPICH segments that appeared since ``before`` and no live process maps."""
    new = mpich_segments() - before
    return new - mapped_segments() if new else new


def remove_orphaned_segments(before: set[str], group: int) -> None:
    """Unlink the MPICH segments this job left in /dev/shm.

    A job whose ranks were killed leaves its shared-memory segments behind (MPICH removes
    them only when its ranks finish), a few MiB each that /dev/shm keeps until reboot.
    Removed: a segment that appeared while the job ran, is ours, and no live process maps
    (a job running beside this one keeps its own, which its ranks map).
    """
    if not mpich_segments() - before:
        return
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:  # killed ranks unmap as they exit
        try:
            os.killpg(group, 0)
        except (ProcessLookupError, PermissionError):
            break
        time.sleep(0.02)
    for name in orphaned_segments(before):
        path = _SHM_DIR / name
        with contextlib.suppress(OSError):
            if path.stat().st_uid == os.getuid():
                path.unlink()


def _wait(proc: subprocess.Popen, seconds: float) -> bool:
    try:
        proc.wait(seconds)
        return True
    except subprocess.TimeoutExpired:
        return False


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _say(message: str) -> None:
    print(f"ddpbench launch: {message}", file=sys.stderr, flush=True)
