"""The package's floors: a module imports only from its own floor and the floors below.

Every module of ``ddpbench`` (``backends/`` and ``simulator/`` included, through their
links) is parsed with :mod:`ast`, and every import of a ddpbench module is checked, at
module level and inside functions alike (a function-level import is an arrow all the same;
it only runs later). Relative imports are resolved. Importing a module also runs its
packages' ``__init__`` files, so those are checked too, except the root ``ddpbench``'s:
every import runs it, and it is the API's front door (floor 1), which imports only
:mod:`ddpbench.api` and the rest on first use. Imports under ``if TYPE_CHECKING:`` are
exempt (the type checker reads them, the interpreter never runs them); they are counted.
Imports by name at run time (``importlib.import_module``: the CLI's commands, the backend
registry, ``ddpbench``'s lazy names) are not import statements and are not read.

Run with ``-s`` to see the counts.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import ddpbench

# floor -> (what lives there, its modules). "x.*" is the package x and everything in it;
# a name without ".*" is that module only. A module takes the exact entry, else the
# longest package entry that holds it.
FLOORS: dict[int, tuple[str, tuple[str, ...]]] = {
    0: ("the knob contract, the hardware presets, the staging buffers, the size check, "
        "bounded messages, the launcher's watchdog (run by path, standard library only) and "
        "the safe YAML loader: no other ddpbench module",
        ("ddpbench.contract", "ddpbench.hardware", "ddpbench.staging", "ddpbench.sizes",
         "ddpbench.messages", "ddpbench.watchdog", "ddpbench.safeyaml")),
    1: ("building blocks: the API and its registry (and the package's front door), the MPI "
        "world and engine, the launcher, the per-rank runner, kernels, CuPy helpers, the "
        "numerics emulator, the optimizer, the trace writer, the profiler, the rules the "
        "backends and the simulator share, and the machine profile's schema (which the "
        "simulator reads)",
        ("ddpbench", "ddpbench.api", "ddpbench.comm", "ddpbench.launch", "ddpbench.rank",
         "ddpbench.tensor_ops", "ddpbench.gpu", "ddpbench.numerics", "ddpbench.optim",
         "ddpbench.trace", "ddpbench.profiling.*", "ddpbench.rules.*",
         "ddpbench.calibration", "ddpbench.calibration.machine")),
    2: ("what runs a workload: the real backends, the NumPy network, the trainer and its "
        "data, the PyTorch front end (Horovod's names over the trainer's stores), the "
        "simulator, and the compute emulation (the real-mode worker program)",
        ("ddpbench.backends.*", "ddpbench.nn", "ddpbench.trainer", "ddpbench.data",
         "ddpbench.torch.*", "ddpbench.simulator.*", "ddpbench.emulation")),
    3: ("what measures: the experiments (kinds, runner, reports), the calibration "
        "(ping-pong, ring steps, fits through the simulator) and the tune (optuna's search "
        "over simulations, its report)",
        ("ddpbench.experiments.*", "ddpbench.calibration.*", "ddpbench.tune.*")),
    4: ("the command line: the CLI, one module per command, and the programs behind "
        "`ddpbench bench` (they run experiment points and calibration rounds, and report "
        "bad options as the CLI's UsageError)",
        ("ddpbench.cli", "ddpbench.__main__", "ddpbench.commands.*", "ddpbench.benchmarks.*")),
}

# (importer, imported, why): arrows refused within a floor.
APART: tuple[tuple[str, str, str], ...] = (
    ("ddpbench.calibration.*", "ddpbench.experiments.*",
     "the calibration uses the simulator, the backends and the emulation, never the "
     "experiments (which use its profiles)"),
)


@dataclass(frozen=True)
class Arrow:
    """One import of a ddpbench module."""

    module: str
    line: int
    imported: str
    in_function: bool
    type_checking: bool


def _package_root() -> Path:
    return Path(ddpbench.__file__).parent


def _modules() -> dict[str, tuple[Path, bool]]:
    """Return module name -> (file, is a package's ``__init__``), following the links."""
    root = _package_root()
    out: dict[str, tuple[Path, bool]] = {}
    for folder, dirs, files in os.walk(root, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = Path(folder) / name
            parts = ["ddpbench", *path.relative_to(root).with_suffix("").parts]
            is_init = parts[-1] == "__init__"
            out[".".join(parts[:-1] if is_init else parts)] = (path, is_init)
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"
            or isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _arrows(name: str, path: Path, is_init: bool, modules: set[str]) -> list[Arrow]:
    """Return every import of a ddpbench module in module ``name``, at any depth."""
    tree = ast.parse(path.read_text(), str(path))
    out: list[Arrow] = []

    def visit(nodes: Iterable[ast.AST], in_function: bool, type_checking: bool) -> None:
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(node, name, is_init, modules):
                    out.append(Arrow(name, node.lineno, target, in_function, type_checking))
                continue
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                visit(node.body, in_function, True)  # only this branch is exempt
                visit(node.orelse, in_function, type_checking)
                continue
            fn = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            visit(ast.iter_child_nodes(node), fn, type_checking)

    visit(tree.body, False, False)
    return out


def _targets(node: ast.Import | ast.ImportFrom, name: str, is_init: bool,
             modules: set[str]) -> list[str]:
    """Return the ddpbench modules an import statement names (relative ones resolved)."""
    if isinstance(node, ast.Import):
        found = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = name.split(".") if is_init else name.split(".")[:-1]
            package = package[:len(package) - (node.level - 1)]
            base = ".".join([*package, *([node.module] if node.module else [])])
        # "from package import module" names the module; "from module import name" the module
        found = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                 for a in node.names]
    return [t for t in found if t == "ddpbench" or t.startswith("ddpbench.")]


def _matches(module: str, entry: str) -> bool:
    if entry.endswith(".*"):
        package = entry[:-2]
        return module == package or module.startswith(package + ".")
    return module == entry


def floor_of(module: str) -> int | None:
    """Return ``module``'s floor: its exact entry, else its longest package entry."""
    exact = [f for f, (_, entries) in FLOORS.items() if module in entries]
    if exact:
        return exact[0]
    held = [(len(entry), f) for f, (_, entries) in FLOORS.items() for entry in entries
            if entry.endswith(".*") and _matches(module, entry)]
    return max(held)[1] if held else None


def _parents(module: str) -> list[str]:
    """Return the packages whose ``__init__`` importing ``module`` runs (the root's aside)."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts))]


def _all_arrows() -> tuple[dict[str, tuple[Path, bool]], list[Arrow]]:
    modules = _modules()
    names = set(modules)
    arrows = [a for name, (path, is_init) in modules.items()
              for a in _arrows(name, path, is_init, names)]
    return modules, arrows


def test_every_module_has_a_floor():
    modules, _ = _all_arrows()
    unplaced = sorted(m for m in modules if floor_of(m) is None)
    assert not unplaced, (f"modules without a floor: {unplaced}; add each to FLOORS in "
                          f"{__file__}")


def test_no_import_goes_up_a_floor():
    modules, arrows = _all_arrows()
    names = set(modules)
    offending, checked = [], 0
    for a in arrows:
        if a.type_checking:
            continue
        here = floor_of(a.module)
        # the module itself, and the packages whose __init__ the import runs
        for target in (a.imported, *(p for p in _parents(a.imported) if p in names)):
            there = floor_of(target)
            checked += 1
            if here is not None and there is not None and there > here:
                offending.append(f"{a.module}:{a.line} (floor {here}) imports {target} "
                                 f"(floor {there})" + (" inside a function" if a.in_function
                                                       else ""))
    for importer, imported, why in APART:
        for a in arrows:
            if (not a.type_checking and _matches(a.module, importer)
                    and _matches(a.imported, imported)
                    and floor_of(a.imported) == floor_of(a.module)):
                offending.append(f"{a.module}:{a.line} imports {a.imported}: {why}")
    print(f"\nlayer check: {len(modules)} modules, {len(arrows)} imports of ddpbench modules "
          f"({sum(a.in_function for a in arrows)} inside functions, "
          f"{sum(a.type_checking for a in arrows)} under TYPE_CHECKING, exempt), "
          f"{checked} arrows checked with their packages, {len(offending)} going up")
    assert not offending, "imports from a lower floor to a higher one:\n" + "\n".join(offending)


def test_the_check_sees_function_level_and_relative_imports(tmp_path):
    source = ("import ddpbench.cli\n"
              "def f():\n    from ddpbench.experiments import runner\n"
              "    from . import machine\n"
              "from typing import TYPE_CHECKING\n"
              "if TYPE_CHECKING:\n    from ddpbench import commands\n")
    path = tmp_path / "run.py"
    path.write_text(source)
    names = {"ddpbench.cli", "ddpbench.experiments", "ddpbench.experiments.runner",
             "ddpbench.calibration.machine", "ddpbench.commands"}
    got = [(a.line, a.imported, a.in_function, a.type_checking)
           for a in _arrows("ddpbench.calibration.run", path, False, names)]
    assert got == [(1, "ddpbench.cli", False, False),
                   (3, "ddpbench.experiments.runner", True, False),
                   (4, "ddpbench.calibration.machine", True, False),
                   (7, "ddpbench.commands", False, True)]
    assert [floor_of(m) for m in ("ddpbench.calibration.run", "ddpbench.calibration",
                                  "ddpbench.backends.ps.server", "ddpbench.cli")] == [3, 1, 2, 4]
