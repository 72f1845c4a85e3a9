"""The ``dpaccount`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from dpaccount.errors import DPAccountError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    from dpaccount._demo import add_demo_command
    from dpaccount.ledger_cli import add_ledger_commands

    parser = argparse.ArgumentParser(
        prog="dpaccount", description="A differential-privacy budget guard."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_demo_command(sub)
    add_ledger_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status: int = args.func(args)
    except DPAccountError as exc:
        print(f"dpaccount: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and closed early
        sys.stderr.close()
        return 0
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
