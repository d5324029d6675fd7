"""Names of points and values: deterministic, sorted, shared by the runner and the reports."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["format_value", "make_name", "public"]


def format_value(value: Any) -> str:
    """Format a param value for names and tables: ``10.0 -> '10'``, ``0.25 -> '0.25'``."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        if math.isfinite(value) and value == int(value) and abs(value) < 1e15:
            return str(int(value))
        return repr(value)
    return str(value)


def make_name(label: str, params: dict[str, Any]) -> str:
    """Return ``label[k=v,...]`` with keys sorted, values formatted by :func:`format_value`."""
    inner = ",".join(f"{k}={format_value(params[k])}" for k in sorted(params))
    return f"{label}[{inner}]"


def public(params: dict[str, Any]) -> dict[str, Any]:
    """Return ``params`` without the runner-private ``_`` keys."""
    return {k: v for k, v in params.items() if not k.startswith("_")}
