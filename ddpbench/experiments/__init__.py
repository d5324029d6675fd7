"""Experiments: YAML files swept into points, run, stored as rows, rendered as reports.

The layers, each depending only on those above it:

- :mod:`.schema`: YAML with line numbers (SafeLoader), the envelope (``name``, ``kind``,
  ``description``), errors that name file, line and field.
- :mod:`.kinds`: the registry of experiment kinds and the interface a kind implements.
- :mod:`.naming`: deterministic point names.
- :mod:`.runner`: execution only: expand, skip finished points, run (in parallel
  processes, or real points one at a time), store rows atomically, render.
- :mod:`.report`: markdown + escaped HTML documents and matplotlib on Agg.
- one subpackage per kind, owning its spec, point runner and report:
  :mod:`.throughput` (the default), :mod:`.accuracy`, :mod:`.numerics`.
"""
