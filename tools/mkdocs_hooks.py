"""MkDocs hooks: the reference pages and the results index, written from the code at build time.

A page asks for a generated section with a marker on a line of its own::

    <!-- generated: cli -->

and :func:`on_page_markdown` replaces it with the section's markdown. The sections:

- ``cli``: every ``ddpbench`` command and subcommand with its options, walked from
  :func:`ddpbench.cli.build_parser` (argparse);
- ``backends``, ``knobs``, ``cluster``: the knob contract (:mod:`ddpbench.contract`);
- ``schema``: each experiment kind's ``Spec`` (:mod:`ddpbench.experiments.kinds`), nested
  models included;
- ``hardware``: the device, transport and intra-host link presets (:mod:`ddpbench.hardware`);
- ``floors``: the package's floors, from the layer check's table (``tests/unit/test_layers.py``);
- ``results-index``: every ``docs/results/*.md`` with its first heading, newest first.

:func:`on_page_content` shows the docstrings' reST roles (``:class:`x```), which
mkdocstrings leaves as text, as plain code, and their ``::`` before a literal block as ``:``.

:func:`on_config` also lists the dated results pages under the nav's "Results log", newest
first, so a new results file needs no edit of ``mkdocs.yml``. Nothing here is imported by
ddpbench; ``mkdocs.yml`` names this file under ``hooks:``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import sys
import textwrap
import types
import typing
from pathlib import Path
from typing import Any

MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)
RESULTS = "results"
RESULTS_NAV = "Results log"


# -- helpers ----------------------------------------------------------------------------------
def _escape(text: str) -> str:
    """Return markdown text with ``<`` and ``>`` outside code spans as HTML entities."""
    parts = text.split("`")
    parts[::2] = [p.replace("<", "&lt;").replace(">", "&gt;") for p in parts[::2]]
    return "`".join(parts)


def _cell(text: Any) -> str:
    """Return ``text`` as one markdown table cell: one line, pipes outside code escaped."""
    parts = " ".join(str(text).split()).split("`")
    parts[::2] = [p.replace("|", "\\|") for p in parts[::2]]
    return "`".join(parts)


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _code(value: Any) -> str:
    return f"`{value}`" if value not in ("", None) else ""


def _type(annotation: Any) -> str:
    """Return a type annotation as a YAML writer reads it: ``int | None``, ``[float, ...]``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None) or annotation is None:
        return "None"
    if annotation is typing.Any:
        return "any"
    if origin is typing.Literal:
        return " | ".join(f'"{a}"' if isinstance(a, str) else str(a) for a in args)
    if origin is typing.Union or origin is types.UnionType:
        return " | ".join(_type(a) for a in args)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return f"[{_type(args[0])}, ...]"
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(_type(a) for a in args)}]"
    return getattr(annotation, "__name__", str(annotation))


def _yaml(value: Any) -> str:
    """Return a default as an experiment file writes it: lists for tuples, ``null``, ``true``."""
    def plain(v: Any) -> Any:
        if hasattr(v, "model_dump"):
            return plain(v.model_dump(mode="json"))
        if isinstance(v, (tuple, list)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {str(k): plain(x) for k, x in v.items()}
        return v if isinstance(v, (str, int, float, bool)) or v is None else str(v)

    value = plain(value)
    return value if isinstance(value, str) else json.dumps(value)


def _bounds(metadata: list[Any]) -> str:
    signs = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    out = [f"{sign} {getattr(m, key)}" for m in metadata for key, sign in signs.items()
           if hasattr(m, key) and getattr(m, key) is not None]
    return ", ".join(out)


def _attribute_docs(cls: type) -> dict[str, str]:
    """Return the ``Attributes:`` section of a Google-style class docstring: name -> text."""
    doc = inspect.cleandoc(cls.__doc__ or "")
    match = re.search(r"^Attributes:\n((?:[ \t]+.*\n?|\n)+)", doc, re.MULTILINE)
    if not match:
        return {}
    out: dict[str, str] = {}
    name = None
    for line in match.group(1).splitlines():
        item = re.match(r"^    (\w+)(?: \([^)]*\))?: (.*)$", line)
        if item:
            name = item.group(1)
            out[name] = item.group(2)
        elif name and line.strip():
            out[name] += " " + line.strip()
    return out


def _rst_to_md(text: str) -> str:
    """Return docstring text with reST roles and double backticks as markdown code."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    return _escape(text.replace("``", "`"))


def _rst_blocks(doc: str) -> str:
    """Return a reST docstring as markdown: a paragraph ending in ``::`` introduces a YAML
    block (the indented lines after it), fenced."""
    out: list[str] = []
    lines = inspect.cleandoc(doc).splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.rstrip().endswith("::"):
            out.append(_rst_to_md(line.rstrip()[:-1]))
            i += 1
            block = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith(" ")):
                block.append(lines[i])
                i += 1
            out += ["", "```yaml", textwrap.dedent("\n".join(block)).strip("\n"), "```", ""]
            continue
        out.append(_rst_to_md(line))
        i += 1
    return "\n".join(out)


# -- cli --------------------------------------------------------------------------------------
def _option_rows(parser: argparse.ArgumentParser) -> list[tuple[str, list[list[Any]]]]:
    formatter = parser._get_formatter()
    groups = []
    for group in parser._action_groups:
        rows = []
        for action in group._group_actions:
            if isinstance(action, (argparse._SubParsersAction, argparse._HelpAction)) \
                    or action.help == argparse.SUPPRESS:
                continue
            name = ", ".join(action.option_strings) or action.dest
            if action.choices is not None:
                value = "{" + ",".join(str(c) for c in action.choices) + "}"
            elif action.nargs == 0:
                value = ""
            else:
                value = formatter._format_args(action, action.dest.upper())
            default = action.default
            if default in (None, argparse.SUPPRESS, False) or action.nargs == 0 \
                    or not action.option_strings:
                default = ""
            help_text = _escape(formatter._expand_help(action)) if action.help else ""
            rows.append([_code(name), _code(value), _code(default), help_text])
        if rows:
            groups.append((group.title or "", rows))
    return groups


def _command(parser: argparse.ArgumentParser, summary: str, level: int) -> list[str]:
    out = [f"{'#' * level} `{parser.prog}`", ""]
    if parser.description:
        out += [_escape(parser.description), ""]
    out += ["```text", parser.format_usage().strip(), "```", ""]
    for title, rows in _option_rows(parser):
        if title not in ("options", "optional arguments"):
            out += [f"*{title}*", ""]
        out += [_table(["option", "value", "default", "help"], rows), ""]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                out += _command(sub, helps.get(name) or "", level + 1)
    return out


def cli() -> str:
    from ddpbench.cli import COMMANDS, build_parser

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps usage at the terminal's width
    try:
        parser = build_parser()
        subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        helps = {a.dest: a.help for a in subs._choices_actions}
        out = [_table(["command", "what it does"],
                      [[f"[`ddpbench {name}`](#ddpbench-{name})", helps.get(name, "")]
                       for name in COMMANDS if name in subs.choices]), ""]
        for name, sub in subs.choices.items():
            out += _command(sub, helps.get(name) or "", 2)
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old
    return "\n".join(out)


# -- the knob contract ------------------------------------------------------------------------
def backends() -> str:
    from ddpbench import contract

    return contract.markdown_table()


def _fields_table(model: Any, docs: dict[str, str] | None = None,
                  fallback: dict[str, str] | None = None, knobs: bool = False) -> str:
    from pydantic import BaseModel
    from pydantic_core import PydanticUndefined

    docs = docs or {}
    fallback = fallback or {}
    rows = []
    for name, field in model.model_fields.items():
        extra = dict(field.json_schema_extra or {}) if knobs else {}
        if field.default_factory is not None:
            default = field.get_default(call_default_factory=True)
        else:
            default = field.default
        if default is PydanticUndefined:
            shown = "required"
        elif isinstance(default, BaseModel):
            shown = f"see `{type(default).__name__}`"
        else:
            shown = _code(_yaml(default))
        doc = field.description or docs.get(name) or fallback.get(name) or ""
        row = [_code(name), _code(_type(field.annotation)), _bounds(field.metadata), shown]
        if knobs:
            env = extra.get("env")
            row += [extra.get("side", ""), extra.get("source", "")
                    + (f" (`{env}`)" if env else ""), extra.get("unit", "")]
        rows.append(row + [_rst_to_md(doc)])
    header = ["name", "type", "bounds", "default"]
    header += ["side", "source (environment variable)", "unit"] if knobs else []
    return _table(header + ["meaning"], rows)


def knobs() -> str:
    from ddpbench import contract

    out = []
    for name, c in contract.BACKENDS.items():
        out += [f"## `{name}`", "", f"{c.summary}. Real backend: `{c.module}`"
                f"{'; runs parameter servers' if c.uses_servers else ''}; knobs model "
                f"`{c.knobs.__name__}`.", "", _fields_table(c.knobs, knobs=True), ""]
    return "\n".join(out)


def cluster() -> str:
    from ddpbench import contract

    out = []
    for model in (contract.Cluster, contract.Schedule):
        out += [f"### `{model.__name__}`", "",
                _rst_to_md(inspect.cleandoc(model.__doc__ or "").split("\n\n")[0]), "",
                _fields_table(model, _attribute_docs(model)), ""]
    return "\n".join(out)


# -- the experiment schema --------------------------------------------------------------------
def _models_in(annotation: Any) -> list[type]:
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def schema() -> str:
    from ddpbench import contract
    from ddpbench.experiments.kinds import EXPERIMENT_KINDS, load_kind

    cluster_docs = {**_attribute_docs(contract.Cluster), **_attribute_docs(contract.Schedule)}
    axes = {a for a in contract.COMMON_AXES if a != "workload"}
    out = []
    for kind in EXPERIMENT_KINDS:
        spec = load_kind(kind).Spec
        # a kind whose keys are the cluster's axes (throughput) means by them what Cluster does
        fallback = cluster_docs if axes <= set(spec.model_fields) else {}
        out += [f"## `kind: {kind}`", ""]
        module_doc = sys.modules[spec.__module__].__doc__ or ""
        package_doc = sys.modules[spec.__module__.rsplit(".", 1)[0]].__doc__ or ""
        if "::" in module_doc:  # the spec's module is about the keys: all of it
            out += [_rst_blocks(module_doc.split("\n", 1)[1]), ""]
        elif "::" in package_doc:  # the kind's package: only its annotated example file
            example = _rst_blocks(package_doc).split("```yaml", 1)[1].split("```", 1)[0]
            out += ["An example file:", "", "```yaml" + example + "```", ""]
        doc = inspect.cleandoc(spec.__doc__ or "").split("\n\nAttributes:")[0]
        out += [_rst_to_md(doc), "", _fields_table(spec, _attribute_docs(spec), fallback), ""]
        seen: set[type] = {spec}
        queue = [m for f in spec.model_fields.values() for m in _models_in(f.annotation)]
        while queue:
            model = queue.pop(0)
            if model in seen:
                continue
            seen.add(model)
            out += [f"### `{model.__name__}` ({kind})", ""]
            doc = inspect.cleandoc(model.__doc__ or "").split("\n\nAttributes:")[0]
            if doc:
                out += [_rst_to_md(doc), ""]
            out += [_fields_table(model, _attribute_docs(model)), ""]
            queue += [m for f in model.model_fields.values() for m in _models_in(f.annotation)]
    return "\n".join(out)


# -- hardware presets -------------------------------------------------------------------------
def _precision_peaks(hw: Any) -> list[str]:
    """Return the devices' dense peaks per precision (``precision`` of a point) as lines."""
    rows = [[_code(d.name), *(d.peak_tflops(p) or "-" for p in hw.PRECISIONS),
             hw.device(d.name).peaks_source or "-"]
            for d in hw.DEVICES.values() if any(d.peak_tflops(p) for p in hw.PRECISIONS[1:])]
    return ["## Dense peaks per precision (`precision`)", "",
            "TFLOP/s of matrix products without sparsity; `-`: the device has no such "
            "arithmetic. Bytes per gradient element: " + ", ".join(
                f"{p} {b}" for p, b in hw.GRADIENT_BYTES.items()) + ".", "",
            _table(["name", *hw.PRECISIONS, "source"], rows)]


def hardware() -> str:
    from ddpbench import hardware as hw

    devices = [[_code(d.name), d.fp32_tflops, d.mem_gbps, d.saturation_batch,
                d.compute_capability or "", "; ".join(f"{b}: {ips:g}" for b, ips in d.resnet50),
                _code(d.like), d.overlap_slowdown, d.source] for d in hw.DEVICES.values()]
    transports = [[_code(t.name), t.efficiency, t.per_message_us, t.duplex,
                   t.socket_gbps or "", "" if t.nccl_net_us is None else t.nccl_net_us,
                   t.source] for t in hw.TRANSPORTS.values()]
    links = [[_code(x.name), x.bandwidth_gbps, x.latency_us, x.switch_gpus or "",
              x.cross_gbps or "", x.nccl_hw, "yes" if x.nvswitch else "",
              x.nvls_gbps or "", x.host_gbps, x.host_share, x.source]
             for x in hw.INTRA_LINKS.values()]
    return "\n".join([
        "## Devices (`device`)", "",
        _table(["name", "fp32 TFLOP/s", "memory GB/s", "b0 (batch)", "compute capability",
                "ResNet-50 (batch: images/s)", "like", "overlap slowdown", "source"], devices),
        "", *_precision_peaks(hw),
        "", "## Transports (`transport`)", "",
        _table(["name", "efficiency", "per message (us)", "duplex", "one connection (Gbit/s)",
                "NCCL latency (us)", "source"], transports),
        "", "## Intra-host links (`intra_link`)", "",
        _table(["name", "Gbit/s per GPU", "latency per step (us)", "GPUs per switch",
                "across switches (Gbit/s)", "NCCL's row", "NVSwitch", "NVLS (Gbit/s)",
                "to host memory (Gbit/s)", "GPUs per host path", "source"], links), ""])


# -- the floors -------------------------------------------------------------------------------
def floors() -> str:
    """Return the package's floors from the layer check's own table (tests/unit), read as
    literals (the test is not run)."""
    import ast

    path = Path(__file__).resolve().parents[1] / "tests" / "unit" / "test_layers.py"
    tables: dict[str, Any] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            if isinstance(target, ast.Name) and target.id in ("FLOORS", "APART"):
                tables[target.id] = ast.literal_eval(node.value)
    rows = [[floor, what, ", ".join(f"`{m}`" for m in modules)]
            for floor, (what, modules) in sorted(tables["FLOORS"].items())]
    apart = [f"- `{a}` never imports `{b}`: {why}." for a, b, why in tables.get("APART", ())]
    return "\n".join([_table(["floor", "what lives there", "modules (`x.*`: the package x)"],
                              rows), "", *apart])


# -- the results log --------------------------------------------------------------------------
def _results(docs_dir: str) -> list[tuple[str, str]]:
    """Return (file name, first heading) of each results page, newest (by name) first."""
    out = []
    for path in sorted(Path(docs_dir, RESULTS).glob("*.md"), reverse=True):
        if path.name == "index.md":
            continue
        heading = next((line.lstrip("#").strip() for line in
                        path.read_text(encoding="utf-8").splitlines()
                        if line.startswith("#")), path.stem)
        out.append((path.name, heading))
    return out


def results_index(docs_dir: str) -> str:
    return "\n".join(f"- [{heading}]({name})" for name, heading in _results(docs_dir))


SECTIONS = {"cli": cli, "backends": backends, "knobs": knobs, "cluster": cluster,
            "schema": schema, "hardware": hardware, "floors": floors}


# -- mkdocs events ----------------------------------------------------------------------------
def on_config(config: Any) -> Any:
    """List the dated results pages under the nav's results section, newest first."""
    for entry in config["nav"] or []:
        if isinstance(entry, dict) and RESULTS_NAV in entry:
            pages = entry[RESULTS_NAV]
            pages = [pages] if isinstance(pages, str) else list(pages)
            listed = {p if isinstance(p, str) else next(iter(p.values())) for p in pages}
            pages += [f"{RESULTS}/{name}" for name, _ in _results(config["docs_dir"])
                      if f"{RESULTS}/{name}" not in listed]
            entry[RESULTS_NAV] = pages
    return config


ROLE = re.compile(r":(?:class|func|data|mod|meth|attr|exc|obj):(<code>)~?")


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """Show the docstrings' reST cross-references (``:class:`x```) as the code they name,
    and a paragraph that introduces a literal block (``...::``) with one colon."""
    return ROLE.sub(r"\1", html).replace("::</p>", ":</p>")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace each ``<!-- generated: NAME -->`` line with that section's markdown."""
    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        if name == "results-index":
            return results_index(config["docs_dir"])
        if name not in SECTIONS:
            raise ValueError(f"{page.file.src_path}: unknown generated section {name!r}; "
                             f"known: {sorted([*SECTIONS, 'results-index'])}")
        return SECTIONS[name]()

    return MARKER.sub(fill, markdown)
