"""``python -m ddpbench.rank PROGRAM ...``: run one rank of a job so that it cannot hang it.

``ddpbench launch`` starts every Python rank through this module (``python -m
ddpbench.rank script.py args``, ``python -m ddpbench.rank -m module args``, ``... -c code``).
It runs the program in this process (MPI and all) and watches how it ends:

- an uncaught exception prints ``[ddpbench rank R] uncaught exception`` with the traceback
  and ends the process at once with code 1, whether or not MPI or ``ddpbench.create`` was
  reached; ``mpiexec`` then ends every other rank (a Python exit would instead block in
  mpi4py's ``MPI_Finalize`` while the others wait for this rank);
- ``sys.exit(code)`` with a code other than 0 ends the process the same way with ``code``;
- a clean end (return, ``sys.exit(0)``) finalizes MPI as usual; if the others never get
  there, the launcher ends the job after its grace period (``--exit-grace``).

Before it ends, the rank writes ``rank<R>.json`` into ``$DDPBENCH_JOB_DIR`` (set by the
launcher): its exit code, the time, and the last lines it wrote to stderr, which the
launcher quotes when it names the first failing rank. ``os._exit(code)`` called from Python
in the rank's own process writes it too (how: ``os._exit``; a forked child's ``os._exit`` is
left alone). A rank killed by a signal, or ended by C code, writes nothing; the launcher
says so and falls back on ``mpiexec``'s exit code, which for ranks ended together can be
the signal ``mpiexec`` sent the others.

Under the launcher a rank also asks the kernel to SIGKILL it when its parent, MPICH's
proxy, dies (``PR_SET_PDEATHSIG``, :func:`ddpbench.watchdog.die_with_parent`): a job
whose launcher was killed (and ``mpiexec`` and the proxy with it) leaves no rank behind.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import runpy
import sys
import threading
import time
import traceback
from pathlib import Path
from types import TracebackType
from typing import NoReturn

TAIL_LINES = 20


def rank_id() -> int:
    """Return this process's rank in the job (from MPICH's ``PMI_RANK``), 0 outside a job."""
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK"):
        if var in os.environ:
            return int(os.environ[var])
    return 0


class StderrTail:
    """Copy fd 2 through a pipe to the real stderr, keeping its last lines."""

    def __init__(self, lines: int = TAIL_LINES) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=lines)
        self._partial = b""
        self._real = os.dup(2)
        read, write = os.pipe()
        os.dup2(write, 2)
        os.close(write)
        self._read = read
        self._thread = threading.Thread(target=self._pump, name="stderr-tail", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        while True:
            try:
                chunk = os.read(self._read, 65536)
            except OSError:
                return
            if not chunk:
                return
            os.write(self._real, chunk)
            text = self._partial + chunk
            *done, self._partial = text.split(b"\n")
            for line in done:
                self.lines.append(line.decode("utf-8", "replace"))

    def close(self) -> list[str]:
        """Stop copying (stderr goes straight to the real one again); return the tail."""
        sys.stderr.flush()
        os.dup2(self._real, 2)  # closes the pipe's last write end: the pump sees EOF
        self._thread.join(2.0)
        tail = list(self.lines)
        if self._partial:
            tail.append(self._partial.decode("utf-8", "replace"))
        return tail[-TAIL_LINES:]


def _write_status(code: int, how: str, tail: list[str]) -> None:
    folder = os.environ.get("DDPBENCH_JOB_DIR")
    if not folder:
        return
    rank = rank_id()
    doc = {"rank": rank, "code": code, "how": how, "time": time.time(), "stderr_tail": tail}
    target = Path(folder) / f"rank{rank}.json"
    tmp = target.with_suffix(".tmp")
    try:
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, target)
    except OSError:
        pass  # the job folder is gone: the launcher has already ended the job


def _report_os_exit(tail: StderrTail | None) -> None:
    """Make ``os._exit`` in this process write the rank's status before it ends."""
    real_exit, pid = os._exit, os.getpid()

    def _exit(status: int) -> NoReturn:
        if os.getpid() == pid:  # not a forked child (a data loader's worker, say)
            with contextlib.suppress(Exception):
                sys.stderr.flush()
                lines = list(tail.lines)[-TAIL_LINES:] if tail is not None else []
                _write_status(status, "os._exit", lines)
        real_exit(status)

    os._exit = _exit


def _run(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: python -m ddpbench.rank (SCRIPT | -m MODULE | -c CODE) [ARGS]")
    if argv[0] == "-m" and len(argv) > 1:
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] == "-c" and len(argv) > 1:
        sys.argv = ["-c", *argv[2:]]
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102
    else:
        sys.argv = list(argv)
        sys.path.insert(0, str(Path(argv[0]).resolve().parent))
        runpy.run_path(argv[0], run_name="__main__")


def _user_frames(tb: TracebackType | None) -> TracebackType | None:
    """Return ``tb`` without the leading frames of this runner and of runpy."""
    while tb is not None and (tb.tb_frame.f_code.co_filename.endswith(("rank.py", "runpy.py"))
                              or tb.tb_frame.f_code.co_filename == "<frozen runpy>"):
        tb = tb.tb_next
    return tb


def _exit_code(err: SystemExit) -> int:
    if err.code is None:
        return 0
    if isinstance(err.code, int):
        return err.code
    print(err.code, file=sys.stderr)  # sys.exit("message") prints it and exits 1
    return 1


def main(argv: list[str] | None = None) -> None:
    """Run the program of ``argv`` as one rank (see the module docstring)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    folder = os.environ.get("DDPBENCH_JOB_DIR")
    if folder:
        from ddpbench.watchdog import die_with_parent

        parent = os.getppid()
        die_with_parent()
        if os.getppid() != parent:  # the proxy died before the request took hold
            os._exit(137)
    if folder:  # the launcher watches this pid: a rank that vanishes without a status failed
        with contextlib.suppress(OSError):
            (Path(folder) / f"rank{rank_id()}.pid").write_text(str(os.getpid()))
    tail = StderrTail() if folder else None
    real_exit = os._exit
    if folder:
        _report_os_exit(tail)
    code, how = 0, "returned"
    try:
        _run(argv)
    except SystemExit as err:
        code, how = _exit_code(err), "sys.exit"
    except BaseException as err:  # noqa: BLE001 - any uncaught exception ends the job
        name = "interrupted" if isinstance(err, KeyboardInterrupt) else "uncaught exception"
        print(f"[ddpbench rank {rank_id()}] {name}:", file=sys.stderr)
        traceback.print_exception(type(err), err, _user_frames(err.__traceback__))
        code, how = (130 if isinstance(err, KeyboardInterrupt) else 1), "exception"
    os._exit = real_exit
    lines = tail.close() if tail is not None else []
    _write_status(code, how, lines)
    if code != 0:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # never block in MPI_Finalize while the other ranks wait for us


if __name__ == "__main__":
    main()

