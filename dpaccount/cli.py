"""The ``dpaccount`` command line.

Subcommands: ``demo``; ``compose`` (compose k equal queries with a named rule and say
which theorem was used); ``plot composition``; ``ledger show|verify|export|report``.

A failure is one line on standard error and exit status 2 (never a traceback for a file
that cannot be read or written); every such line goes through the one redaction
(`dpaccount._cli_files.error_line`), so a password in a ledger URL is printed as ``***``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from dpaccount._cli_files import RedactingArgumentParser, error_line
from dpaccount.costs import PrivacyCost, format_number
from dpaccount.errors import ConfigError, DPAccountError, InvalidCostError

__all__ = ["build_parser", "main"]


#: Bounds on every count the command line takes, so no input can hang it or exhaust
#: memory: closed-form rules take up to 10^12 queries; the exact optimum (and 'best',
#: which tries it) up to 10^6 (about a tenth of a second); a plot up to 10^5 points.
MAX_COMPOSE_COUNT = 10**12
MAX_OPTIMAL_CLI_COUNT = 10**6
MAX_PLOT_COUNT = 10**5


#: The flag of each parameter an error may name, so that its message says what to fix.
FLAGS = {"epsilon": "--epsilon", "delta": "--delta", "delta_slack": "--delta-slack",
         "k": "--count"}


def _flagged(exc: InvalidCostError) -> ConfigError:
    """``exc`` restated with the command line's flag for its field (``--delta-slack``,
    not ``delta_slack``)."""
    flag = FLAGS.get(exc.field, exc.field)
    if exc.value is None:  # a flag that was not given, which this rule needs
        return ConfigError(f"give {flag}: {exc.reason} (e.g. {flag} 1e-6)")
    return ConfigError(f"{flag} {str(exc.value)!r}: {exc.reason}")


def _count(limit: int) -> Any:
    def parse(text: str) -> int:
        if not text.isascii() or not text.isdigit() or len(text) > 13:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a whole number of queries from 1 to {limit:,}"
            )
        value = int(text)
        if not 1 <= value <= limit:
            raise argparse.ArgumentTypeError(f"{value:,} is outside 1 to {limit:,}")
        return value

    return parse


def _add_compose_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from dpaccount.composition import COMPOSE_RULES

    parser = sub.add_parser(
        "compose",
        help="compose k equal (epsilon, delta) queries with a named rule",
        description="Print the composed (epsilon, delta) of --count queries of "
        "(--epsilon, --delta) under --rule, and the theorem it rests on.",
    )
    parser.add_argument("--rule", required=True, choices=COMPOSE_RULES)
    parser.add_argument("--epsilon", required=True, help="per-query epsilon (e.g. 0.1)")
    parser.add_argument("--delta", default="0", help="per-query delta (default 0)")
    parser.add_argument("--count", required=True, type=_count(MAX_COMPOSE_COUNT),
                        help=f"number of queries k (1 to {MAX_COMPOSE_COUNT:,}; the "
                        f"'optimal' rule up to {MAX_OPTIMAL_CLI_COUNT:,})")
    parser.add_argument("--delta-slack", default=None, help="delta' for advanced rules")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=_cmd_compose)


def _cmd_compose(args: argparse.Namespace) -> int:
    from dpaccount.composition import compose_by_name

    if args.rule == "optimal" and args.count > MAX_OPTIMAL_CLI_COUNT:
        raise ConfigError(
            f"--count {args.count:,} is above {MAX_OPTIMAL_CLI_COUNT:,}, the largest k the "
            "exact optimum is computed for here; use --rule heterogeneous or advanced"
        )
    try:
        total, theorem = compose_by_name(
            args.rule, PrivacyCost(args.epsilon, args.delta), args.count, args.delta_slack,
            optimal_limit=MAX_OPTIMAL_CLI_COUNT,
        )
    except InvalidCostError as exc:
        raise _flagged(exc) from None
    if args.json:
        print(json.dumps({
            "rule": args.rule,
            "epsilon": format_number(total.epsilon),
            "delta": format_number(total.delta),
            "epsilon_exact": f"{total.epsilon.numerator}/{total.epsilon.denominator}",
            "delta_exact": f"{total.delta.numerator}/{total.delta.denominator}",
            "theorem": theorem,
        }))
    else:
        print(f"{args.count} x (ε={args.epsilon}, δ={args.delta}) under {args.rule!r}: "
              f"{total}")
        print(f"theorem: {theorem}")
    return 0


def _add_plot_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("plot", help="draw figures (needs the plot extra)")
    what = parser.add_subparsers(dest="figure", required=True)
    comp = what.add_parser(
        "composition",
        help="total epsilon against k for basic, advanced, filter and optimal",
    )
    comp.add_argument("--epsilon", required=True, help="per-query epsilon")
    comp.add_argument("--delta", default="0", help="per-query delta")
    comp.add_argument("--count", required=True, type=_count(MAX_PLOT_COUNT),
                      help=f"largest k drawn (1 to {MAX_PLOT_COUNT:,})")
    comp.add_argument("--delta-slack", default="1e-6", help="delta' (default 1e-6)")
    comp.add_argument("--output", default="composition.png", help="output file")
    comp.set_defaults(func=_cmd_plot_composition)


def _cmd_plot_composition(args: argparse.Namespace) -> int:
    from dpaccount.plot import plot_composition

    try:
        path = plot_composition(args.epsilon, args.delta, args.count, args.delta_slack,
                                args.output)
    except InvalidCostError as exc:
        raise _flagged(exc) from None
    print(f"wrote {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    from dpaccount._demo import add_demo_command
    from dpaccount.ledger_cli import add_ledger_commands

    parser: argparse.ArgumentParser = RedactingArgumentParser(
        prog="dpaccount", description="A differential-privacy budget guard."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_demo_command(sub)
    _add_compose_command(sub)
    _add_plot_command(sub)
    add_ledger_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status: int = args.func(args)
    except BrokenPipeError:  # output piped into `head` and closed early
        sys.stderr.close()
        return 0
    # ImportError: a missing optional extra names its install command; OSError: a file
    # a command reads or writes (plot --output, ...), one line and never a traceback
    except (DPAccountError, ImportError, OSError) as exc:
        print(error_line(exc), file=sys.stderr)
        return 2
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
