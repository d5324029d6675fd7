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


def run_cases(cases: dict[str, Any], argv: list[str]) -> None:
    """Run ``CASE[,CASE...] BACKEND[,BACKEND...]`` (``argv``) on every rank.

    A backend is ``name`` or ``name:key=value;key=value`` (integers parsed); each case is
    called with the store and the backend's spec. Server ranks of the parameter-server
    backends serve inside ``ddpbench.create`` and skip the cases.
    """
    import ddpbench

    names, backends = argv[0].split(","), argv[1].split(",")
    for spec in backends:
        name, _, rest = spec.partition(":")
        opts: dict[str, Any] = {}
        for item in filter(None, rest.split(";")):
            k, _, v = item.partition("=")
            opts[k] = int(v) if v.isdigit() else v
        kv = ddpbench.create(name, **opts)
        if kv is None:  # a server rank: it served and is done
            continue
        for case in names:
            cases[case](kv, spec)
        kv.close()
