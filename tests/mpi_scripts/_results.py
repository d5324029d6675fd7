"""How MPI check scripts report: one JSON object per line, read by ``mpiutil.results``.

Tests assert on these records (names and values), never on prose; a script still fails
with a non-zero exit and a traceback when a check's own assertion does not hold.
"""

from __future__ import annotations

import json
from typing import Any


def result(check: str, **fields: Any) -> None:
    """Print the outcome of one check as a JSON line: ``{"check": ..., **fields}``."""
    print(json.dumps({"check": check, **fields}, sort_keys=True, default=str), flush=True)
