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
  removed (those the job made that no live process maps);
- it owns the job even when it is killed itself (SIGKILL, the OOM killer): ``mpiexec`` runs
  through a wrapper that makes the kernel kill it with the launcher (``PR_SET_PDEATHSIG``),
  Python ranks ask the same of their proxy, and a watchdog process
  (:mod:`ddpbench.watchdog`) then kills whatever of the job is left, found by the job's tag
  in its environment (hydra gives ``mpiexec``, each proxy and each rank a session of its
  own, so no process group holds them), and removes the job's shared memory;
- a job larger than this host can start is refused before anything starts
  (:func:`check_job`: memory, processes, ranks per core), unless ``allow_large``;
- MPICH's "BAD TERMINATION" banner is kept out of the job's output: the launcher's own
  message comes first and quotes what the banner said in one line; every message is cut to
  a readable length (:func:`ddpbench.messages.bounded`, the full text in a log file).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ddpbench import sizes, watchdog
from ddpbench.watchdog import (  # noqa: F401 - re-exported: the tests' and callers' names
    mapped_segments,
    mpich_segments,
    orphaned_segments,
    remove_orphaned_segments,
)

__all__ = ["BINDINGS", "DEFAULT_EXIT_GRACE_S", "RANKS_PER_CORE", "RANK_BYTES", "check_job",
           "job_cost", "launch", "launch_logged", "mpiexec_path"]

# How ranks are placed on cores: left to the OS, or one core each (``mpiexec -bind-to``).
BINDINGS = ("none", "core")

DEFAULT_EXIT_GRACE_S = 10.0
"""Seconds the other ranks get to end after one rank ended cleanly (``--exit-grace``)."""

_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_PY_OPTS_WITH_ARG = ("-X", "-W", "-Q")

RANK_BYTES = 60 * 2**20
"""Memory one Python rank holds before its own work: the interpreter, NumPy, mpi4py and
MPICH (a rank importing them: 60 MB resident, 40 MB of it its own)."""
RANKS_PER_CORE = 8
"""Most ranks a job may put on each core this process may run on: MPICH's ranks poll while
they wait, so past a few per core a job only thrashes (400 ranks on 2 cores: a load of 142
and no progress in 30 s)."""
TASKS_PER_RANK = 5
"""Kernel tasks one rank costs: its threads (a rank runs 4) and its share of the proxy."""


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _task_headroom() -> float:
    """Return how many more tasks (processes and threads) this machine lets start: the
    least of pid_max, threads-max and RLIMIT_NPROC, less those running now."""
    limits = []
    for path in ("/proc/sys/kernel/pid_max", "/proc/sys/kernel/threads-max"):
        with contextlib.suppress(OSError, ValueError):
            limits.append(float(Path(path).read_text()))
    with contextlib.suppress(ImportError, ValueError, OSError):
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
        if soft != resource.RLIM_INFINITY and os.geteuid() != 0:  # root is not held to it
            limits.append(float(soft))
    if not limits:
        return float("inf")
    running = 0.0
    with contextlib.suppress(OSError, ValueError, IndexError):
        running = float(Path("/proc/loadavg").read_text().split()[3].split("/")[1])
    return min(limits) - running


def job_cost(ranks: int, *, rank_bytes: float = RANK_BYTES,
             hostfile: str | os.PathLike[str] | None = None) -> sizes.Cost:
    """Return what starting ``ranks`` ranks costs this host, with the limits it passes.

    With a host file the ranks run elsewhere too, and only the launcher's own host is
    known: nothing is charged here.
    """
    if hostfile is not None:
        return sizes.Cost("this job", f"{ranks:,} ranks over the host file's hosts", 0.0)
    cores = _cores()
    headroom = _task_headroom()
    over = sizes.overs(
        (ranks > RANKS_PER_CORE * cores,
         f"more than {RANKS_PER_CORE} ranks per core of the {cores} this process may run on "
         f"(MPICH's ranks poll while they wait: past that a job only thrashes)"),
        (ranks * TASKS_PER_RANK > headroom,
         f"more processes and threads ({ranks * TASKS_PER_RANK:,}) than this machine lets "
         f"start now ({max(0, headroom):,.0f}: pid_max, threads-max, RLIMIT_NPROC)"),
    )
    return sizes.Cost("this job", f"{ranks:,} ranks on this host", ranks * rank_bytes,
                      None, over)


def check_job(ranks: int, *, allow: bool = False, rank_bytes: float = RANK_BYTES,
              hostfile: str | os.PathLike[str] | None = None) -> None:
    """Refuse a job larger than this host can start (:func:`job_cost`), unless ``allow``.

    Raises:
        ddpbench.sizes.TooLarge: naming the ranks, the limits passed and ``--allow-large``.
    """
    sizes.check(job_cost(ranks, rank_bytes=rank_bytes, hostfile=hostfile), allow=allow,
                advice="start fewer ranks (or give a --hostfile of more hosts)")


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


def rank_list(ranks: Sequence[int], most: int = 8) -> str:
    """Return ``[0, 1, 2]`` for a few ranks, runs collapsed for many (``[0-99999]``), at
    most ``most`` runs shown: a message about 100,000 ranks stays one short line."""
    ranks = sorted(ranks)
    if len(ranks) <= most:
        return f"[{', '.join(map(str, ranks))}]"
    runs: list[str] = []
    start = prev = ranks[0]
    for r in [*ranks[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    shown = ", ".join(runs[:most]) + (", ..." if len(runs) > most else "")
    return f"[{shown}] ({len(ranks):,} ranks)"


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
                   f"ranks {rank_list(ranks)} ended at the same moment, one of them first")
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
    allow_large: bool = False,
    rank_bytes: float = RANK_BYTES,
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
        allow_large: start the job even when it passes :func:`check_job`'s limits.
        rank_bytes: the memory each rank will hold (:data:`RANK_BYTES` plus its tensors),
            for :func:`check_job`.

    Returns:
        0, the first failing rank's exit code, 124 on timeout, 128 + N on signal N.

    Raises:
        ValueError: a bad count, an empty command or a missing host file.
        ddpbench.sizes.TooLarge: more ranks than this host can start (a ValueError).
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
    check_job(workers + servers, allow=allow_large, rank_bytes=rank_bytes, hostfile=hostfile)
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
        **(env or {}),
        watchdog.JOB_VAR: str(folder),  # the job's tag: never overridden
    }
    try:
        return _supervise(args, full_env, folder, workers + servers, timeout, exit_grace,
                          stdout, stderr, signals)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def launch_logged(cmd: Sequence[str], workers: int, servers: int = 0, *, log: Path,
                  timeout: float | None = None, bind: str = "none",
                  allow_large: bool = False, rank_bytes: float = RANK_BYTES) -> int:
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
                    stderr=fh.fileno(), signals=got, allow_large=allow_large,
                    rank_bytes=rank_bytes)
    if got:  # (a rank's own exit code 130 is a failed job, not a Ctrl-C)
        if got[0] == signal.SIGINT:
            raise KeyboardInterrupt
        signal.raise_signal(signal.Signals(got[0]))
    return rc


_WATCHDOG = str(Path(watchdog.__file__).resolve())


def _start_watchdog(folder: Path) -> subprocess.Popen | None:
    """Start the job's watchdog (:mod:`ddpbench.watchdog`) on a pipe only we write to.

    It runs in a session of its own, so a Ctrl-C at the terminal or a kill of this process
    group leaves it to do its work; its environment lacks the job's tag, so its own scan
    (or an outer job's) does not end it first.
    """
    env = {k: v for k, v in os.environ.items() if k != watchdog.JOB_VAR}
    try:
        return subprocess.Popen([sys.executable, "-I", "-S", _WATCHDOG, str(folder)],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True, env=env)
    except OSError:
        return None  # no process to spare: the job still runs, without the watchdog


def _release_watchdog(dog: subprocess.Popen | None) -> None:
    """Tell the watchdog the job was ended here, and let it go."""
    if dog is None or dog.stdin is None:
        return
    with contextlib.suppress(OSError):
        dog.stdin.write(b"done")
        dog.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        dog.wait(5.0)


_BANNER_RULE = re.compile(rb"^={40,}\s*$")
_BANNER_START = b"=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES"
_BANNER_TAIL = (b"YOUR APPLICATION TERMINATED WITH THE EXIT STRING:",
                b"This typically refers to a problem with your application.",
                b"Please see the FAQ page for debugging suggestions")


class _Output:
    """Copy mpiexec's stdout (the ranks' stdout and mpiexec's own) to ``fd`` as it comes,
    holding back MPICH's termination banner: the launcher's message says first what
    happened, with the banner's facts in one line (:attr:`banner`).

    A line that could open the banner (an empty line, a rule of ``=``) waits until the next
    line tells; everything else goes through at once, partial lines included.
    """

    def __init__(self, source: Any, fd: int) -> None:
        self.source, self.fd = source, fd
        self.banner: list[str] = []
        self._held: list[bytes] = []
        self._in_banner = False
        self._mid_line = False  # part of the current line went out already
        self._thread = threading.Thread(target=self._run, name="mpiexec-stdout", daemon=True)
        self._thread.start()

    def _write(self, data: bytes) -> None:
        while data and self.fd >= 0:
            try:
                n = os.write(self.fd, data)
            except InterruptedError:
                continue
            except OSError:  # the reader went away: keep draining, write nothing more
                self.fd = -1
                return
            data = data[n:]

    def _line(self, line: bytes) -> None:
        """Route one whole line (without its newline)."""
        text = line.rstrip(b"\r")
        if self._in_banner:
            if text.startswith(b"=") or text.startswith(_BANNER_TAIL) or not text.strip():
                fact = text[4:].strip() if text.startswith(b"=   ") else b""
                if fact.startswith((b"RANK", b"PID", b"EXIT CODE", b"KILLED BY SIGNAL")):
                    self.banner.append(fact.decode("utf-8", "replace"))
                elif text.startswith(_BANNER_TAIL[0]):
                    self.banner.append("exit string:" + text[len(_BANNER_TAIL[0]):].decode(
                        "utf-8", "replace"))
                return
            self._in_banner = False
        if text.startswith(_BANNER_START) and self._held and _BANNER_RULE.match(self._held[-1]):
            self._in_banner, self._held = True, []
            return
        if not text.strip() or _BANNER_RULE.match(text):
            self._held.append(line)
            return
        self._flush_held()
        self._write(line + b"\n")

    def _flush_held(self) -> None:
        if self._held:
            self._write(b"".join(h + b"\n" for h in self._held))
            self._held = []

    def _run(self) -> None:
        pending = b""
        fd = self.source.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except InterruptedError:
                continue
            except OSError:
                break
            if not chunk:
                break
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                if self._mid_line:
                    self._write(line + b"\n")
                    self._mid_line = False
                else:
                    self._line(line)
            if pending and (self._mid_line or not (self._held or self._in_banner
                                                   or pending.startswith(b"="))):
                self._flush_held()
                self._write(pending)  # a partial line (a progress bar): out at once
                self._mid_line, pending = True, b""
        if pending:
            self._line(pending) if not self._mid_line else self._write(pending)
        if not self._in_banner:
            self._flush_held()

    def close(self) -> None:
        """Wait (up to 5 s) for the rest of the output once mpiexec has ended."""
        self._thread.join(5.0)
        with contextlib.suppress(OSError):
            self.source.close()


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
    (folder / watchdog.SEGMENTS_FILE).write_text(json.dumps(sorted(segments)))
    dog = _start_watchdog(folder)
    # mpiexec dies with this process (the wrapper sets PR_SET_PDEATHSIG, then execs it).
    wrapped = [sys.executable, "-I", "-S", _WATCHDOG, "--exec", str(os.getpid()), *args]
    pump = stdout is None or (isinstance(stdout, int) and stdout >= 0)
    if pump:
        sys.stdout.flush()
    proc = subprocess.Popen(wrapped, env=env, start_new_session=True,
                            stdout=subprocess.PIPE if pump else stdout, stderr=stderr)
    output = _Output(proc.stdout, 1 if stdout is None else stdout) if pump else None
    ended_by: str | None = None
    try:
        ended_by = _watch(proc, job, got, timeout, nranks, exit_grace)
    finally:
        if proc.poll() is None:
            _kill_group(proc)
        # Every process of the job, wherever it went (hydra gives each a session of its
        # own): a proxy still starting ranks, a rank stuck in MPI. After a clean end one
        # scan that finds none is enough; otherwise a few, as a proxy may still fork.
        clean_end = ended_by is None and proc.returncode == 0
        watchdog.kill_tagged(str(folder), quiet_scans=1 if clean_end else 3)
        if output is not None:
            output.close()
        remove_orphaned_segments(segments, folder=str(folder))
        _release_watchdog(dog)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    rc = proc.returncode
    if ended_by is None:
        job.poll()  # what the ranks said before mpiexec ended (not the ranks we killed)
    banner = output.banner if output is not None else []
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
        _say(f"ranks {rank_list(done)} ended cleanly but ranks {rank_list(left)} were still running "
             f"{exit_grace:g} s later (waiting for a rank that is gone?); the job was "
             f"ended. Raise --exit-grace if ranks legitimately finish far apart.")
        return 1
    said = f"; mpiexec reported: {', '.join(banner)}" if banner else ""
    if failure is not None:
        who, what, code, tail = failure
        lines = "".join(f"\n  | {line}" for line in tail[-10:])
        where = f"; its last lines of stderr:{lines}" if tail else ""
        _say(f"{who}: {what}{where}")
        if code is None:
            code = rc if rc not in (0, None) else 1
            _say(f"mpiexec's exit code: {rc} (for a rank killed by signal N, MPICH reports N)"
                 f"{said}")
        return code
    if rc != 0:
        what = f"signal {-rc}" if rc < 0 else f"exit code {rc}"
        _say(f"the job failed ({what} from mpiexec; no rank reported a failure){said}")
    return rc


def _watch(proc: subprocess.Popen, job: _Job, got: list[int], timeout: float | None,
           nranks: int, exit_grace: float) -> str | None:
    """Poll the job until mpiexec ends or a reason to end it comes: a signal (``got``), the
    timeout, a rank's failure that mpiexec does not end within 5 s, or ranks still running
    ``exit_grace`` s after others ended cleanly. Return that reason (None: mpiexec ended)."""
    start = time.monotonic()
    while proc.poll() is None:
        if got:
            return "signal"
        if timeout is not None and time.monotonic() - start > timeout:
            return "timeout"
        job.poll()
        if job.first_failure() is not None:
            # mpiexec ends the others itself; give it a moment, then we do
            return None if _wait(proc, 5.0) else "failure"
        clean = job.clean_exits()
        if clean and len(clean) < nranks and time.time() - min(clean) > exit_grace:
            return "stuck"
        time.sleep(0.01)
    return None


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
    from ddpbench.messages import bounded

    print(bounded(f"ddpbench launch: {message}", name="launch"), file=sys.stderr, flush=True)
