"""What ``dpaccount ledger list|show|export`` print and write, from ledgers already read
and verified by `dpaccount.ledger_cli`: plain-text tables, the tree of ledgers and their
shares, and the CSV export.

Every cell that holds a stored text (a label, a query id, a ledger or share name) is
escaped for the terminal (`printable`) or for a spreadsheet (`cell`); every number spent
is rounded up and every number remaining rounded down.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Any, Final, TextIO

from dpaccount.charges import describe
from dpaccount.costs import Budget, PrivacyCost, format_bound, format_number
from dpaccount.records import LedgerMeta, LedgerRecord, encode_record
from dpaccount.spend import DIRECT, ShareNode

__all__ = [
    "CSV_COLUMNS",
    "cell",
    "down",
    "list_rows",
    "print_shares",
    "printable",
    "remaining",
    "short_charge",
    "table",
    "up",
    "write_csv",
]

#: The columns of ``ledger export --format csv``: the decimal figures first (rounded
#: up), each with its exact fraction beside it, then the record's links.
CSV_COLUMNS: Final = ("seq", "timestamp", "share", "label", "query_id", "rule", "epsilon",
                      "epsilon_exact", "delta", "delta_exact", "charge", "prev_hash", "hash")


def down(value: Fraction) -> str:
    """What is left, rounded down to at most 6 significant digits (exact when short)."""
    return format_bound(max(value, Fraction(0)), upward=False)[0]


def up(value: Fraction) -> str:
    """What was spent, rounded up to at most 6 significant digits (exact when short)."""
    return format_bound(value, upward=True)[0]


def short_charge(charge: Any) -> str:
    """A charge's description, cut to 44 characters."""
    text = describe(charge)
    return text if len(text) <= 44 else text[:41] + "..."


def printable(text: str) -> str:
    """Escape control and format characters (a stored label cannot forge a line or
    drive the terminal; labels written before they were refused at input included)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def cell(text: str) -> str:
    """A CSV cell a spreadsheet will not run: formula prefixes get a leading quote."""
    return f"'{text}" if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def table(rows: Sequence[Sequence[str]], out: TextIO) -> None:
    """Rows as aligned columns, the first a header underlined with dashes."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        print("  ".join(text.ljust(w) for text, w in zip(row, widths, strict=True)).rstrip(),
              file=out)
        if n == 0:
            print("  ".join("-" * w for w in widths), file=out)


def remaining(meta: LedgerMeta, spent: PrivacyCost, left: Budget | None = None) -> str:
    """What the ledger may still spend, rounded down: the budget less what was spent, or,
    for a budget with a ρ, what the rule says one more query may cost (``left``)."""
    if left is not None:
        eps = "inf" if left.epsilon is None else down(left.epsilon)
        rho = "" if left.rho is None else f", rho {down(left.rho)}"
        return f"epsilon {eps}, delta {down(left.delta)}{rho}"
    budget = meta.budget
    eps = "inf" if budget.epsilon is None else down(budget.epsilon - spent.epsilon)
    return f"epsilon {eps}, delta {down(budget.delta - spent.delta)}"


def _used(node: ShareNode) -> str:
    """The part of the epsilon budget spent, in percent rounded up (a tenth)."""
    budget = node.meta.budget.epsilon
    if budget is None or budget == 0:
        return ""
    tenths = int(-(-node.spent.epsilon * 1000 // budget))
    return f"{tenths // 10}.{tenths % 10}%" if tenths % 10 else f"{tenths // 10}%"


def list_rows(roots: Sequence[ShareNode], records: Mapping[str, Sequence[LedgerRecord]]
              ) -> list[tuple[str, ...]]:
    """``ledger list``'s table: each ledger with its shares indented below it (a tree),
    each with its spend under its rule against its budget and the time of its last
    charge (from ``records``, by ledger name)."""

    def last(name: str) -> str:
        mine = records[name]
        return mine[-1].timestamp.strftime("%Y-%m-%d %H:%M") if mine else ""

    rows: list[tuple[str, ...]] = [("ledger", "records", "rule", "budget",
                                    "spent (under the rule)", "of budget", "remaining",
                                    "last charge (UTC)")]

    def walk(node: ShareNode, lead: str, branch: str) -> None:
        rows.append((branch + printable(node.name), str(node.records),
                     node.rule.split(" ")[0], str(node.meta.budget), str(node.spent),
                     _used(node), remaining(node.meta, node.spent, node.left),
                     last(node.name)))
        for i, child in enumerate(node.children):
            end = i == len(node.children) - 1
            walk(child, lead + ("   " if end else "│  "), lead + ("└─ " if end else "├─ "))

    for root in roots:
        walk(root, "", "")
    return rows


def write_csv(target: TextIO, records: Sequence[LedgerRecord], links: Sequence[Sequence[Any]],
              shares: Sequence[str | None],
              progress: Callable[[int, int | None], object] | None = None) -> None:
    """The CSV export (`CSV_COLUMNS`): a row per record with the share behind it (empty
    for a charge made to the ledger itself)."""
    writer = csv.writer(target)
    writer.writerow(CSV_COLUMNS)
    for i, (r, row, share) in enumerate(zip(records, links, shares, strict=True)):
        encoded = encode_record(r).model_dump(mode="json")
        writer.writerow([
            r.seq, r.timestamp.isoformat(), cell(share or ""), cell(r.label or ""),
            cell(r.query_id or ""), r.rule,
            format_number(r.cost.epsilon), encoded["cost"]["epsilon"],
            format_number(r.cost.delta), encoded["cost"]["delta"],
            json.dumps(encoded["charge"], sort_keys=True, separators=(",", ":")),
            row[2], row[3],
        ])
        if progress is not None and (i % 1000 == 999 or i == len(records) - 1):
            progress(i + 1, len(records))


def show_rows(records: Sequence[LedgerRecord], shares: Sequence[str | None] | None
              ) -> list[tuple[str, ...]]:
    """``ledger show``'s table of charges; with ``shares`` (a ledger that has shares), a
    column naming the share behind each charge."""
    head = ("seq", "when (UTC)", *(("share",) if shares is not None else ()), "label",
            "charge", "epsilon", "delta", "rule", "query_id")
    rows: list[tuple[str, ...]] = [head]
    for i, r in enumerate(records):
        share = () if shares is None else (printable(shares[i] or DIRECT),)
        rows.append((str(r.seq), r.timestamp.strftime("%Y-%m-%d %H:%M:%S"), *share,
                     printable(r.label or ""), short_charge(r.charge), up(r.cost.epsilon),
                     up(r.cost.delta), r.rule, printable(r.query_id or "")))
    return rows


def print_shares(node: ShareNode | None, records: Mapping[str, Sequence[LedgerRecord]],
                 out: TextIO) -> None:
    """Under ``ledger show``: the ledger's shares, as ``ledger list`` draws them."""
    if node is None or not node.children:
        return
    print("the ledger and its shares (a charge to a share is also charged to every "
          "ledger above it):", file=out)
    table(list_rows([node], records), out)
