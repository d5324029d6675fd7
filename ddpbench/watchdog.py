"""The processes of one ``ddpbench launch`` job, found and ended wherever they went; and the
watchdog that ends them if the launcher dies first.

Every process of a job carries the job's folder in its environment (``DDPBENCH_JOB_DIR``:
the launcher sets it for ``mpiexec``, which hands its environment to its proxies and they to
the ranks). That tag, not a process group, is what finds them: MPICH's ``mpiexec`` puts
itself, each ``hydra_pmi_proxy`` and each rank in a session of its own, and a process whose
parent died is adopted by init, so neither a group nor the process tree holds the job
together. :func:`tagged` reads ``/proc/<pid>/environ`` (the environment a process started
with) for the tag; :func:`kill_tagged` sends SIGKILL to every tagged process until none has
been seen for a few scans (a proxy may still be starting ranks while it dies).

``python -I -S watchdog.py FOLDER`` (started by the launcher before ``mpiexec``, in a session
of its own, with a pipe as stdin whose write end only the launcher holds) waits for its
stdin to close. The launcher writes ``done`` before closing it once it has ended the job
itself; an end of file without it means the launcher died (SIGKILL, the OOM killer): the
watchdog then kills every tagged process, removes the MPICH shared-memory segments that
appeared since the job started (``FOLDER/segments.json`` lists those there before) and that
no live process maps, removes the job folder, and exits.

``python -I -S watchdog.py --exec PARENT PROGRAM ARGS...`` is the small wrapper the launcher
starts ``mpiexec`` through: it asks the kernel to SIGKILL it when its parent (the launcher)
dies (Linux's ``PR_SET_PDEATHSIG``, which survives ``exec``), checks that the parent is
still ``PARENT``, and execs ``PROGRAM``. Python ranks ask the same in :mod:`ddpbench.rank`
(their parent is the proxy), so a dead launcher takes ``mpiexec`` along at once and a dead
proxy its ranks; the watchdog's scan catches whatever is left.

This file imports the standard library only (the launcher runs it by path, ``python -I -S``,
without importing the package).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

__all__ = ["JOB_VAR", "SEGMENTS_FILE", "die_with_parent", "kill_tagged", "mapped_segments",
           "mpich_segments", "orphaned_segments", "remove_orphaned_segments", "tagged"]

JOB_VAR = "DDPBENCH_JOB_DIR"
"""The environment variable whose value (the job's folder) tags every process of a job."""
SEGMENTS_FILE = "segments.json"
"""In the job folder: the MPICH segments in /dev/shm before the job started."""

SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "mpich_shm_"
_PR_SET_PDEATHSIG = 1  # include/uapi/linux/prctl.h


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when the thread that started it ends
    (``prctl(PR_SET_PDEATHSIG)``); return whether it could (False off Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def tagged(folder: str, *, skip: int | None = None) -> list[int]:
    """Return the pids of the live processes whose environment has ``DDPBENCH_JOB_DIR=folder``
    (those of this user; a zombie's environment cannot be read, so it is not listed)."""
    tag = f"{JOB_VAR}={folder}".encode()
    me = os.getpid()
    found: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for name in entries:
        if not name.isdigit() or int(name) in (me, skip):
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:  # gone meanwhile, or another user's
            continue
        if tag in env.split(b"\0"):
            found.append(int(name))
    return found


def kill_tagged(folder: str, *, quiet_scans: int = 3, timeout: float = 10.0) -> int:
    """SIGKILL every process of the job ``folder`` until none is seen for ``quiet_scans``
    scans in a row (or ``timeout`` seconds pass); return how many were killed."""
    killed, quiet = 0, 0
    deadline = time.monotonic() + timeout
    while quiet < quiet_scans and time.monotonic() < deadline:
        pids = tagged(folder)
        if not pids:
            quiet += 1
            if quiet < quiet_scans:
                time.sleep(0.01)
            continue
        quiet = 0
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        time.sleep(0.01)
    return killed


def mpich_segments() -> set[str]:
    """The names of MPICH's shared-memory segments in /dev/shm now (empty off Linux)."""
    try:
        return {p.name for p in SHM_DIR.iterdir() if p.name.startswith(SHM_PREFIX)}
    except OSError:
        return set()


def mapped_segments() -> set[str]:
    """The names of the /dev/shm files some live process has mapped (from /proc/*/maps)."""
    prefix = f"{SHM_DIR}/"
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


def remove_orphaned_segments(before: set[str], group: int | None = None,
                             folder: str | None = None) -> None:
    """Unlink the MPICH segments a job left in /dev/shm.

    A job whose ranks were killed leaves its shared-memory segments behind (MPICH removes
    them only when its ranks finish), a few MiB each that /dev/shm keeps until reboot.
    Removed: a segment that appeared while the job ran, is ours, and no live process maps
    (a job running beside this one keeps its own, which its ranks map). Killed ranks unmap
    as they exit: up to 2 s is given to the process group ``group`` or the processes of the
    job ``folder`` to be gone first.
    """
    if not mpich_segments() - before:
        return
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        if folder is not None and tagged(folder):
            time.sleep(0.02)
            continue
        if group is not None:
            try:
                os.killpg(group, 0)
                time.sleep(0.02)
                continue
            except (ProcessLookupError, PermissionError):
                pass
        break
    for name in orphaned_segments(before):
        path = SHM_DIR / name
        with contextlib.suppress(OSError):
            if path.stat().st_uid == os.getuid():
                path.unlink()


def _watch(folder: str) -> None:
    """Wait for the launcher's pipe to close; end the job unless it said ``done``."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # only the pipe ends the watch
    said = b""
    while True:
        try:
            chunk = os.read(0, 64)
        except InterruptedError:
            continue
        except OSError:
            break
        if not chunk:
            break
        said += chunk
    if b"done" in said:
        return
    kill_tagged(folder)
    try:
        before = set(json.loads((Path(folder) / SEGMENTS_FILE).read_text()))
    except (OSError, ValueError):
        before = None
    if before is not None:
        remove_orphaned_segments(before, folder=folder)
    shutil.rmtree(folder, ignore_errors=True)


def _exec(parent: int, argv: list[str]) -> None:
    """Exec ``argv`` so that it dies with ``parent`` (the launcher), which must still live."""
    die_with_parent()
    if os.getppid() != parent:  # the launcher died before the request took hold
        os._exit(128 + signal.SIGKILL)
    os.execv(argv[0], argv)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--exec"]:
        _exec(int(sys.argv[2]), sys.argv[3:])
    else:
        _watch(sys.argv[1])
