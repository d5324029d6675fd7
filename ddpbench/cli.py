"""The ``ddpbench`` command line: one subcommand per module in :mod:`ddpbench.commands`.

Each command module defines ``HELP`` (one line), ``configure(parser)`` and
``main(args) -> int``; heavy imports stay inside ``main`` so ``--help`` is instant.
Exit codes: 0 success, 1 the work failed (a failed point, a wrong result), 2 bad usage or
bad input (unknown backend, malformed experiment file).
"""

from __future__ import annotations

import argparse
import importlib
import sys

# The order here is the order in --help.
COMMANDS = ["run", "report", "list", "simulate", "tune", "launch", "bench", "numerics", "train",
            "profile", "calibrate"]


class UsageError(Exception):
    """Bad input from the user: printed without a traceback, exit code 2."""


def check_writable_file(path: str, option: str) -> None:
    """Refuse an output file that cannot be written, before a long run rather than after.

    Raises:
        UsageError: ``path`` is a folder, its folder does not exist, or it is not writable.
    """
    import os

    full = os.path.abspath(path)
    folder = os.path.dirname(full)
    if os.path.isdir(full):
        raise UsageError(f"{option} {path}: is a folder; give a file name")
    if not os.path.isdir(folder):
        raise UsageError(f"{option} {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (os.path.exists(full) and not os.access(full, os.W_OK)):
        raise UsageError(f"{option} {path}: not writable")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ddpbench",
        description="Simulate and benchmark gradient communication for data-parallel training.",
    )
    parser.add_argument("--version", action="version", version="ddpbench 0.1.0")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"ddpbench.commands.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"ddpbench.commands.{name}":
                raise
            continue
        cmd = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.configure(cmd)
        cmd.set_defaults(_main=module.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_main", None):
        parser.print_help()
        return 2
    try:
        return int(args._main(args) or 0)
    except UsageError as err:
        from ddpbench.messages import bounded

        print(bounded(f"ddpbench {args.command}: error: {err}", name=str(args.command)),
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"ddpbench {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`ddpbench list | head`): stop quietly, as `cat` does.
        # Python would otherwise report the flush at exit as a second broken pipe.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
