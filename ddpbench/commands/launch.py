"""``ddpbench launch -n W [--servers S] -- CMD ...``."""

from __future__ import annotations

import argparse

HELP = "start W worker (and S server) processes running CMD over MPI"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--workers", type=int, required=True, help="worker processes")
    parser.add_argument("--servers", type=int, default=0,
                        help="server processes for kvstore/p3/byteps (default 0)")
    parser.add_argument("--hostfile", help="MPICH host file (host:slots per line)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="kill the whole job after this many seconds (exit 124)")
    parser.add_argument("--exit-grace", type=float, default=None, metavar="S",
                        help="once a rank has ended cleanly, end the job if the others have "
                             "not ended within S seconds (default 10)")
    from ddpbench.launch import BINDINGS

    parser.add_argument("--bind", choices=BINDINGS, default="none",
                        help="none: the OS places the ranks (default, as MPICH and Horovod "
                             "do); core: each rank on one core, round robin (mpiexec "
                             "-bind-to core)")
    from ddpbench.sizes import add_allow_flag

    add_allow_flag(parser, "the job")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...",
                        help="the program to run on every rank")


def main(args: argparse.Namespace) -> int:
    from ddpbench.cli import UsageError
    from ddpbench.launch import launch

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    try:
        from ddpbench.launch import DEFAULT_EXIT_GRACE_S

        grace = DEFAULT_EXIT_GRACE_S if args.exit_grace is None else args.exit_grace
        return launch(cmd, args.workers, args.servers, hostfile=args.hostfile,
                      timeout=args.timeout, exit_grace=grace, bind=args.bind,
                      allow_large=args.allow_large)
    except ValueError as err:
        raise UsageError(str(err)) from None
