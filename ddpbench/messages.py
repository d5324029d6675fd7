"""Messages a user reads, cut to a readable length; the full text kept in a log file.

A message built from something unbounded (a rank's stderr, an exception's text, mpiexec's
complaint about 100,000 processes it could not start) is cut by :func:`bounded`: every line
to :data:`LINE_CHARS` characters and the whole to :data:`MESSAGE_CHARS`, and when anything
was cut, the full text goes to a file under :func:`log_dir` that the message names.
"""

from __future__ import annotations

import datetime as _dt
import os
import tempfile
from pathlib import Path

__all__ = ["ERROR_CELL_CHARS", "LINE_CHARS", "MESSAGE_CHARS", "bounded", "cut", "log_dir"]

MESSAGE_CHARS = 4000
"""Most characters of one message (about 50 lines of a terminal)."""
LINE_CHARS = 1000
"""Most characters of one line of a message."""
ERROR_CELL_CHARS = 1000
"""Most characters of a failed point's error in results.csv (the run log keeps it whole)."""


def log_dir() -> Path:
    """Return the folder of the full texts: ``$DDPBENCH_LOG_DIR``, else
    ``<tmp>/ddpbench-logs``."""
    return Path(os.environ.get("DDPBENCH_LOG_DIR")
                or Path(tempfile.gettempdir()) / "ddpbench-logs")


def cut(line: str, limit: int = LINE_CHARS) -> str:
    """Return ``line`` cut to ``limit`` characters, saying how many were left out."""
    if len(line) <= limit:
        return line
    return f"{line[:limit]}... ({len(line) - limit:,} more characters)"


_cut_line = cut


def bounded(text: str, *, name: str = "ddpbench", limit: int = MESSAGE_CHARS,
            line_limit: int = LINE_CHARS) -> str:
    """Return ``text`` cut to ``limit`` characters and its lines to ``line_limit``.

    When something is cut, the full text is written to ``log_dir()/NAME-<UTC time>-<pid>.log``
    and the returned text ends by naming that file (or by saying it could not be written).
    """
    lines = [_cut_line(line, line_limit) for line in text.split("\n")]
    out = "\n".join(lines)
    if len(out) > limit:
        head = out[: limit * 3 // 4].rsplit("\n", 1)[0] if "\n" in out[: limit * 3 // 4] \
            else out[: limit * 3 // 4]
        tail = out[-(limit // 4):].split("\n", 1)[-1] if "\n" in out[-(limit // 4):] \
            else out[-(limit // 4):]
        out = f"{head}\n... ({len(text):,} characters in all) ...\n{tail}"
    if out == text:
        return text
    return f"{out}\n(cut to a readable length; the full text: {_keep(text, name)})"


def _keep(text: str, name: str) -> str:
    """Write ``text`` to a new log file; return its path (or why it could not be written)."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in name) or "ddpbench"
    try:
        folder = log_dir()
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{safe}-{stamp}-{os.getpid()}.log"
        n = 1
        while path.exists():
            n += 1
            path = folder / f"{safe}-{stamp}-{os.getpid()}-{n}.log"
        path.write_text(text, encoding="utf-8", errors="replace")
        return str(path)
    except OSError as err:
        return f"not kept: cannot write to {log_dir()}: {err.strerror or err}"
