"""Safe YAML for the large data files (published points, workload profiles).

:func:`load` parses with PyYAML's safe loader, through libyaml (``yaml.CSafeLoader``) where
the installed PyYAML was built with it and with the pure-Python ``yaml.SafeLoader``
otherwise: both construct only plain data (mappings, lists, strings, numbers, booleans,
null, timestamps), never objects, so a file stays data and never becomes code. :func:`dump`
writes with the matching safe dumper. User experiment files keep
:func:`ddpbench.experiments.schema.load_yaml`, which records line numbers for its errors.
"""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["LOADER", "dump", "load"]

LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""The safe loader :func:`load` uses: libyaml's where PyYAML has it."""

_DUMPER: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def load(text: str) -> Any:
    """Return the plain data of the YAML document ``text`` (a safe loader: no objects).

    Raises:
        yaml.YAMLError: the text is not valid YAML.
    """
    return yaml.load(text, Loader=LOADER)  # noqa: S506 - SafeLoader or its libyaml twin


def dump(data: Any, **kwargs: Any) -> str:
    """Return ``data`` as YAML text written by the safe dumper (``kwargs``: yaml.dump's)."""
    return yaml.dump(data, Dumper=_DUMPER, **kwargs)
