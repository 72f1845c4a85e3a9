"""``dpaccount ledger show|verify|checkpoint|export|report|keygen``: read and audit a
durable ledger.

Every command takes the ledger's URL (``sqlite:///path.db``, ``postgresql://...``),
``--name`` (``default`` if omitted) and, for a keyed ledger, ``--key-file`` (default: the
``DPACCOUNT_LEDGER_KEY_FILE`` or ``DPACCOUNT_LEDGER_KEY`` environment variable).
``verify`` exits 0 when the ledger is intact and 1, naming the first bad record, when it
is not. ``keygen`` writes a new random key file (0600).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Sequence
from fractions import Fraction
from typing import Any, TextIO

from dpaccount.charges import describe
from dpaccount.composition import rule_from_description
from dpaccount.costs import PrivacyCost, format_bound, format_number
from dpaccount.errors import (
    ConfigError,
    DPAccountError,
    LedgerCorruptError,
    StorageError,
    missing_extra,
)
from dpaccount.keys import LedgerKey
from dpaccount.ledgers import check_checkpoint, make_checkpoint, open_store, redact_url
from dpaccount.records import LedgerMeta, LedgerRecord, encode_record

__all__ = ["add_ledger_commands", "ledger_main"]


def add_ledger_commands(subparsers: Any) -> None:
    """Register ``ledger show|verify|export|report`` on a ``dpaccount`` subparsers object.

    Args:
        subparsers: What ``ArgumentParser.add_subparsers()`` returned.
    """
    ledger = subparsers.add_parser("ledger", help="show, verify, export or plot a ledger")
    sub = ledger.add_subparsers(dest="ledger_command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("url", help="sqlite:///path.db or postgresql://user@host/db")
        p.add_argument("--name", default="default", help="the ledger's name (default: default)")
        p.add_argument("--key-file", help="the key of a keyed ledger (default: "
                       "$DPACCOUNT_LEDGER_KEY_FILE or $DPACCOUNT_LEDGER_KEY)")

    show = sub.add_parser("show", help="a table of every charge, what is spent and remains")
    common(show)
    show.set_defaults(func=_show)
    verify = sub.add_parser("verify", help="check records, hash chain and totals")
    common(verify)
    verify.add_argument("--checkpoint", help="a head checkpoint file the chain must extend")
    verify.set_defaults(func=_verify)
    checkpoint = sub.add_parser(
        "checkpoint", help="write a head checkpoint (length and last hash) of a verified ledger"
    )
    common(checkpoint)
    checkpoint.add_argument("--output", required=True, help="the checkpoint file to write")
    checkpoint.set_defaults(func=_checkpoint)
    export = sub.add_parser("export", help="write every record as JSON or CSV")
    common(export)
    export.add_argument("--format", choices=("json", "csv"), default="json")
    export.add_argument("--out", help="output file (default: standard output)")
    export.set_defaults(func=_export)
    report = sub.add_parser("report", help="plot the spend over time (needs dpaccount[plot])")
    common(report)
    report.add_argument("--out", required=True, help="the image file to write (e.g. .png)")
    report.set_defaults(func=_report)
    keygen = sub.add_parser("keygen", help="write a new random ledger key file (0600)")
    keygen.add_argument("--output", required=True, help="the key file to create")
    keygen.set_defaults(func=_keygen)


def ledger_main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run ``dpaccount ledger ...`` on its own (what ``dpaccount.cli.main`` will do).

    Returns:
        The exit status: 0 on success, 1 for a corrupt ledger, 2 for other errors.
    """
    parser = argparse.ArgumentParser(prog="dpaccount")
    add_ledger_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    args.stdout = out
    try:
        status: int = args.func(args)
    except DPAccountError as exc:
        print(f"dpaccount: {exc}", file=sys.stderr)
        return 2
    return status


# -- helpers ------------------------------------------------------------------------------


def _out(args: argparse.Namespace) -> TextIO:
    stream = getattr(args, "stdout", None)
    return stream if stream is not None else sys.stdout


def _key(args: argparse.Namespace) -> LedgerKey | None:
    path = getattr(args, "key_file", None)
    return LedgerKey.from_file(path) if path else LedgerKey.from_env()


def _load(args: argparse.Namespace) -> tuple[LedgerMeta, list[LedgerRecord], Any]:
    """The verified ledger: its settings, records and tip (``args.history`` is set to
    its settings history)."""
    if str(args.url).lower().startswith("memory:"):
        raise ConfigError("a memory:// ledger lives inside one process; there is nothing to read")
    store: Any = open_store(args.url, name=args.name, create=False, key=_key(args),
                            read_only=True)
    try:
        meta = store.stored_meta()
        if meta is None:
            raise StorageError(
                f"there is no ledger named {args.name!r} at {redact_url(args.url)}"
            )
        tip = store.verify()
        if hasattr(store, "check_functions"):
            store.check_functions()
        missing: list[str] = getattr(store, "missing_protections", list)()
        if missing:
            raise LedgerCorruptError(
                f"protective triggers are dropped or disabled: {', '.join(missing)}; the "
                "database no longer refuses edits, so its records cannot be trusted"
            )
        records = list(store.read())
        args.history = store.meta_history()
    finally:
        store.close()
    return meta, records, tip


def _spent(meta: LedgerMeta, records: Sequence[LedgerRecord]) -> tuple[PrivacyCost, str]:
    """The total under the ledger's rule (or the plain sum if the rule cannot be rebuilt)."""
    try:
        rule = rule_from_description(meta.rule)
        state = rule.start()
        for record in records:
            state = rule.extend(state, record.charge)
        return rule.total(state), rule.name
    except DPAccountError:
        total = PrivacyCost(0)
        for record in records:
            total = total + record.cost
        return total, "basic (sum of record costs; the ledger's rule could not be rebuilt)"


def _down(value: Fraction) -> str:
    """What is left, rounded down to at most 6 significant digits (exact when short)."""
    return format_bound(value, upward=False)[0]


def _up(value: Fraction) -> str:
    """What was spent, rounded up to at most 6 significant digits (exact when short)."""
    return format_bound(value, upward=True)[0]


def _describe(charge: Any) -> str:
    text = describe(charge)
    return text if len(text) <= 44 else text[:41] + "..."


def _printable(text: str) -> str:
    """Escape control and format characters (a stored label cannot forge a line or
    drive the terminal; labels written before they were refused at input included)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def _cell(text: str) -> str:
    """A CSV cell a spreadsheet will not run: formula prefixes get a leading quote."""
    return f"'{text}" if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def _show(args: argparse.Namespace) -> int:
    meta, records, tip = _load(args)
    out = _out(args)
    budget = meta.budget
    print(f"ledger {meta.name!r}: rule {meta.rule}, relation {meta.relation.value}, "
          f"budget {budget}", file=out)
    rows = [("seq", "when (UTC)", "label", "charge", "epsilon", "delta", "rule", "query_id")]
    for r in records:
        rows.append((
            str(r.seq), r.timestamp.strftime("%Y-%m-%d %H:%M:%S"), _printable(r.label or ""),
            _describe(r.charge), _up(r.cost.epsilon), _up(r.cost.delta),
            r.rule, _printable(r.query_id or ""),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip(),
              file=out)
        if n == 0:
            print("  ".join("-" * w for w in widths), file=out)
    spent, how = _spent(meta, records)
    print(f"records: {len(records)}   spent: {spent} under {how}", file=out)
    left_eps = (
        "inf" if budget.epsilon is None else _down(max(budget.epsilon - spent.epsilon, Fraction(0)))
    )
    left_delta = _down(max(budget.delta - spent.delta, Fraction(0)))
    print(f"remaining (shown rounded down): epsilon {left_eps}, delta {left_delta}", file=out)
    print(f"last hash: {tip.last_hash}", file=out)
    return 0


def _verify(args: argparse.Namespace) -> int:
    out = _out(args)
    try:
        meta, records, tip = _load(args)
    except LedgerCorruptError as exc:
        where = "" if exc.seq is None else f" first bad record: {exc.seq};"
        print(f"CORRUPT: ledger {args.name!r} at {redact_url(args.url)}:{where} {exc}",
              file=out)
        return 1
    if args.checkpoint:
        try:
            with open(args.checkpoint, encoding="utf-8") as stream:
                point = json.load(stream)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read the checkpoint file {args.checkpoint!r}: "
                              f"{exc}") from None
        try:
            if not isinstance(point, dict):
                raise ConfigError("the checkpoint file is not a dpaccount head checkpoint")
            check_checkpoint(records, point, meta.name, key=_key(args), history=args.history)
        except LedgerCorruptError as exc:
            print(f"CORRUPT: ledger {args.name!r} at {redact_url(args.url)}: {exc}", file=out)
            return 1
    spent, rule_name = _spent(meta, records)
    if not spent.fits(meta.budget):
        print(f"OVERSPENT: ledger {meta.name!r} at {redact_url(args.url)}: under the "
              f"{rule_name!r} rule its {len(records)} records spend {spent}, over the "
              f"budget {meta.budget}", file=out)
        return 1
    print(f"ok: ledger {meta.name!r} has {len(records)} intact records; "
          f"sum epsilon {_up(tip.epsilon_sum)}, sum delta "
          f"{_up(tip.delta_sum)}; last hash {tip.last_hash}", file=out)
    return 0


def _checkpoint(args: argparse.Namespace) -> int:
    meta, records, _tip = _load(args)
    point = make_checkpoint(records, meta.name, key=_key(args), history=args.history)
    with open(args.output, "w", encoding="utf-8") as stream:
        json.dump(point, stream, indent=2, sort_keys=True)
        stream.write("\n")
    print(f"wrote {args.output}: ledger {meta.name!r}, {point['head']} records, last hash "
          f"{point['last_hash']}", file=_out(args))
    return 0


def _keygen(args: argparse.Namespace) -> int:
    key = LedgerKey.generate()
    key.write(args.output)
    print(f"wrote {args.output}: a new ledger key, id {key.key_id} (readable by you only; "
          "keep it outside the database and back it up: a keyed ledger cannot be verified "
          "or written without it)", file=_out(args))
    return 0


def _export(args: argparse.Namespace) -> int:
    meta, records, _tip = _load(args)
    rows = [encode_record(r).model_dump(mode="json") for r in records]
    target: TextIO = open(args.out, "w", newline="") if args.out else _out(args)  # noqa: SIM115
    try:
        if args.format == "json":
            json.dump({"ledger": meta.model_dump(mode="json"), "records": rows}, target,
                      indent=2, sort_keys=True)
            target.write("\n")
        else:
            writer = csv.writer(target)
            writer.writerow(["seq", "timestamp", "label", "query_id", "rule", "epsilon",
                             "delta", "epsilon_float_up", "delta_float_up", "charge"])
            for r, row in zip(records, rows, strict=True):
                writer.writerow([
                    r.seq, r.timestamp.isoformat(), _cell(r.label or ""),
                    _cell(r.query_id or ""), r.rule,
                    row["cost"]["epsilon"], row["cost"]["delta"],
                    format_number(r.cost.epsilon), format_number(r.cost.delta),
                    json.dumps(row["charge"], sort_keys=True, separators=(",", ":")),
                ])
    finally:
        if args.out:
            target.close()
    return 0


def _report(args: argparse.Namespace) -> int:
    try:
        import matplotlib
    except ImportError:
        raise missing_extra("matplotlib", "plot") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    meta, records, _tip = _load(args)
    times, eps = [], []
    total = PrivacyCost(0)
    for r in records:
        total = total + r.cost
        times.append(r.timestamp)
        eps.append(float(total.epsilon))
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.step(
        times,  # type: ignore[arg-type]
        eps,
        where="post",
        label="epsilon spent (sum of charges)",
    )
    if meta.budget.epsilon is not None:
        ax.axhline(float(meta.budget.epsilon), color="red", linestyle="--", label="budget")
    ax.set_title(f"ledger {meta.name!r}: {len(records)} charges")
    ax.set_xlabel("time (UTC)")
    ax.set_ylabel("epsilon")
    ax.legend()
    fig.autofmt_xdate()
    fig.savefig(args.out)
    plt.close(fig)
    print(f"wrote {args.out}", file=_out(args))
    return 0
