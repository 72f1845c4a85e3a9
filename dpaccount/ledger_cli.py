"""``dpaccount ledger list|show|verify|checkpoint|export|report|keygen|grant|revoke``: read
and audit durable ledgers, and give roles least privilege on them.

Every command takes the database's URL (``sqlite:///path.db``, ``postgresql://...``),
``--name`` (``default`` if omitted) and, for a keyed ledger, ``--key-file`` (default: the
``DPACCOUNT_LEDGER_KEY_FILE`` or ``DPACCOUNT_LEDGER_KEY`` environment variable); ledgers
are opened read-only. Files are written with ``--output`` (report: NAME-report.html by
default). ``verify`` exits 0 when the ledger (or an export, ``--export FILE``, checked
offline) is intact and 1, naming the first bad record, when it is not, or over budget.
``keygen`` writes a new random key file (0600). ``grant`` and ``revoke`` (PostgreSQL,
run as the schema's owner) let a role write (``--as writer``) or read (``--as
auditor``) one ledger; see docs/ledgers.md, "Least privilege".

A failure is one line on standard error and exit status 2, never a traceback: it names
the file or option and what to do. Every error line, and every line that names the
database, goes through the one redaction (`dpaccount._redact`): a password in the URL,
in a libpq keyword/value string or in a shell fragment is printed as ``***``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import fnmatch
import gc
import json
import os
import sys
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any, TextIO

import attrs

from dpaccount._cli_files import (
    RedactingArgumentParser,
    cannot_write,
    check_output,
    default_output,
    error_line,
    read_json,
    writing,
)
from dpaccount._redact import redact, redact_url
from dpaccount.audit import (
    check_snapshot_states,
    export_document,
    html_report,
    spend_over_time,
    summarize,
    verify_export,
)
from dpaccount.charges import describe
from dpaccount.costs import PrivacyCost, format_bound, format_number
from dpaccount.errors import (
    ConfigError,
    DPAccountError,
    LedgerCorruptError,
    StorageError,
    missing_extra,
)
from dpaccount.keys import LedgerKey
from dpaccount.ledgers import check_checkpoint, make_checkpoint, missing_ledger, open_store
from dpaccount.records import LedgerMeta, LedgerRecord, encode_record

__all__ = ["add_ledger_commands", "ledger_main"]

#: The suffixes ``ledger report --output`` writes: a page, or an image (dpaccount[plot]).
REPORT_PAGE_SUFFIXES = (".html", ".htm")
REPORT_IMAGE_SUFFIXES = (".png", ".svg", ".pdf")


def add_ledger_commands(subparsers: Any) -> None:
    """Register the ``ledger`` commands on a ``dpaccount`` subparsers object.

    Args:
        subparsers: What ``ArgumentParser.add_subparsers()`` returned.
    """
    ledger = subparsers.add_parser(
        "ledger", help="list, show, verify, checkpoint, export or report ledgers"
    )
    sub = ledger.add_subparsers(dest="ledger_command", required=True)

    def common(p: argparse.ArgumentParser, url: str = "the database") -> None:
        p.add_argument("url", help=f"{url}: sqlite:///path.db or postgresql://user@host/db")
        p.add_argument("--name", default="default", help="the ledger's name (default: default)")
        p.add_argument("--key-file", help="the key of a keyed ledger (default: "
                       "$DPACCOUNT_LEDGER_KEY_FILE or $DPACCOUNT_LEDGER_KEY)")

    def grouping(p: argparse.ArgumentParser) -> None:
        p.add_argument("--by", choices=("label", "job"), default="label",
                       help="group charges by label, or by job (query_id up to its first /)")

    listing = sub.add_parser("list", help="every ledger in a database: spent and remaining")
    common(listing)
    listing.set_defaults(func=_list)
    show = sub.add_parser("show", help="the charges, what is spent and what remains")
    common(show)
    show.add_argument("--since", help="only charges at or after this UTC time (ISO 8601)")
    show.add_argument("--label", help="only charges whose label matches (shell wildcards)")
    show.add_argument("--tail", type=int, help="only the last N charges shown")
    show.add_argument("--summary", action="store_true",
                      help="a summary by label (or --by job) instead of every charge")
    grouping(show)
    show.set_defaults(func=_show)
    verify = sub.add_parser("verify", help="check records, hash chain, totals and budget")
    verify.add_argument("url", nargs="?", help="the database (or give --export)")
    verify.add_argument("--name", default="default", help="the ledger's name")
    verify.add_argument("--key-file", help="the key of a keyed ledger")
    verify.add_argument("--checkpoint", help="a head checkpoint file the chain must extend")
    verify.add_argument("--export", help="verify an export file offline, without a database")
    verify.set_defaults(func=_verify)
    checkpoint = sub.add_parser(
        "checkpoint", help="write a head checkpoint (length and last hash) of a verified ledger"
    )
    common(checkpoint)
    checkpoint.add_argument("--output", required=True, help="the checkpoint file to write")
    checkpoint.set_defaults(func=_checkpoint)
    export = sub.add_parser(
        "export", help="every record with its links, and the settings history (JSON or CSV)"
    )
    common(export)
    export.add_argument("--format", choices=("json", "csv"), default="json")
    export.add_argument("--output", "--out", dest="output",
                        help="output file (default: standard output)")
    export.set_defaults(func=_export)
    report = sub.add_parser(
        "report", help="spend under the rule over time: .html (self-contained) or an image "
        "(.png, .svg, .pdf: needs dpaccount[plot])"
    )
    common(report)
    report.add_argument("--output", "--out", dest="output", help="the file to write: .html, "
                        "or an image (.png, .svg, .pdf); default: NAME-report.html here")
    report.add_argument("--all", action="store_true", help="every ledger in the database")
    grouping(report)
    report.set_defaults(func=_report)
    keygen = sub.add_parser("keygen", help="write a new random ledger key file (0600)")
    keygen.add_argument("--output", required=True, help="the key file to create")
    keygen.set_defaults(func=_keygen)
    _add_role_commands(sub)


def ledger_main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run ``dpaccount ledger ...`` on its own (what ``dpaccount.cli.main`` will do).

    Returns:
        The exit status: 0 on success, 1 for a corrupt ledger, 2 for other errors.
    """
    parser = RedactingArgumentParser(prog="dpaccount")
    add_ledger_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    args.stdout = out
    try:
        status: int = args.func(args)
    except BrokenPipeError:  # output piped into `head` and closed early
        return 0
    # OSError: a file the command reads or writes (never a traceback). A missing extra's
    # ImportError goes to the caller (`dpaccount.cli.main` prints its one line).
    except (DPAccountError, OSError) as exc:
        print(error_line(exc), file=sys.stderr)
        return 2
    return status


# -- helpers ------------------------------------------------------------------------------


def _out(args: argparse.Namespace) -> TextIO:
    stream = getattr(args, "stdout", None)
    return stream if stream is not None else sys.stdout


def _key(args: argparse.Namespace) -> LedgerKey | None:
    path = getattr(args, "key_file", None)
    return LedgerKey.from_file(path) if path else LedgerKey.from_env()


@attrs.frozen
class _Loaded:
    meta: LedgerMeta
    records: list[LedgerRecord]
    tip: Any
    history: list[Any]
    rows: tuple[list[Any], list[Any]] | None


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a command loads a whole ledger, then
    restore it. Loading makes no reference cycles, but keeping a million decoded records
    triggers full collections that walk all of them (a tenth of a verification's time);
    reference counting frees everything as usual. (Only the command line does this: it
    owns its process; the library never touches the collector.)"""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _load(args: argparse.Namespace, name: str | None = None, rows: bool = False) -> _Loaded:
    """A verified ledger, opened read-only: settings, records, tip, settings history and
    (with ``rows``) the raw rows with their links."""
    if args.url is None:
        raise ConfigError("give the database URL (or, for verify, --export FILE)")
    if str(args.url).lower().startswith("memory:"):
        raise ConfigError("a memory:// ledger lives inside one process; there is nothing to read")
    name = args.name if name is None else name
    store: Any = open_store(args.url, name=name, create=False, key=_key(args), read_only=True)
    try:
        meta = store.stored_meta()
        if meta is None:
            raise missing_ledger(name, args.url, store, "--name")
        records: list[LedgerRecord] = []
        with _collector_paused():
            tip = store.verify(records)  # and the records it checked, decoded once
        if hasattr(store, "check_functions"):
            store.check_functions()
        missing: list[str] = getattr(store, "missing_protections", list)()
        if missing:
            raise LedgerCorruptError(
                f"protective triggers are dropped or disabled: {', '.join(missing)}; the "
                "database no longer refuses edits, so its records cannot be trusted"
            )
        with _collector_paused():
            check_snapshot_states(records, store.snapshots())
        return _Loaded(meta, records, tip, store.meta_history(),
                       store.chain_rows() if rows else None)
    finally:
        store.close()


def _names(args: argparse.Namespace) -> list[str]:
    store: Any = open_store(args.url, name=args.name, create=False, key=_key(args),
                            read_only=True)
    try:
        return list(store.names())
    finally:
        store.close()


def _down(value: Fraction) -> str:
    """What is left, rounded down to at most 6 significant digits (exact when short)."""
    return format_bound(max(value, Fraction(0)), upward=False)[0]


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


def _table(rows: Sequence[Sequence[str]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip(),
              file=out)
        if n == 0:
            print("  ".join("-" * w for w in widths), file=out)


def _remaining(meta: LedgerMeta, spent: PrivacyCost) -> str:
    budget = meta.budget
    eps = "inf" if budget.epsilon is None else _down(budget.epsilon - spent.epsilon)
    return f"epsilon {eps}, delta {_down(budget.delta - spent.delta)}"


def _since(text: str) -> datetime:
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"--since takes an ISO 8601 time (2026-11-24T00:00), not "
                          f"{text!r}") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


# -- the commands -------------------------------------------------------------------------


def _list(args: argparse.Namespace) -> int:
    out = _out(args)
    rows = [("ledger", "records", "rule", "budget", "spent (under the rule)", "remaining",
             "last charge (UTC)")]
    for name in _names(args):
        loaded = _load(args, name)
        spend = spend_over_time(loaded.meta, loaded.records, points=1)
        last = loaded.records[-1].timestamp.strftime("%Y-%m-%d %H:%M") if loaded.records else ""
        rows.append((_printable(name), str(len(loaded.records)), spend.rule.split(" ")[0],
                     str(loaded.meta.budget), str(spend.spent),
                     _remaining(loaded.meta, spend.spent), last))
    if len(rows) == 1:
        print(f"no ledgers at {redact_url(args.url)}", file=out)
        return 0
    _table(rows, out)
    return 0


def _show(args: argparse.Namespace) -> int:
    loaded = _load(args)
    meta, records = loaded.meta, loaded.records
    out = _out(args)
    print(f"ledger {meta.name!r}: rule {meta.rule}, relation {meta.relation.value}, "
          f"budget {meta.budget}", file=out)
    shown = records
    if args.since:
        since = _since(args.since)
        shown = [r for r in shown if r.timestamp >= since]
    if args.label:
        shown = [r for r in shown if fnmatch.fnmatchcase(r.label or "", args.label)]
    if args.tail is not None:
        shown = shown[-args.tail:] if args.tail > 0 else []
    rows: list[tuple[str, ...]]
    if args.summary:
        rows = [(args.by, "charges", "epsilon (own, summed)", "delta (own, summed)",
                 "first (UTC)", "last (UTC)")]
        rows += [(_printable(g.group), str(g.count), _up(g.epsilon), _up(g.delta),
                  f"{g.first:%Y-%m-%d %H:%M}", f"{g.last:%Y-%m-%d %H:%M}")
                 for g in summarize(shown, args.by)]
    else:
        rows = [("seq", "when (UTC)", "label", "charge", "epsilon", "delta", "rule",
                 "query_id")]
        rows += [(str(r.seq), r.timestamp.strftime("%Y-%m-%d %H:%M:%S"),
                  _printable(r.label or ""), _describe(r.charge), _up(r.cost.epsilon),
                  _up(r.cost.delta), r.rule, _printable(r.query_id or "")) for r in shown]
    _table(rows, out)
    spend = spend_over_time(meta, records, points=1)
    if len(shown) != len(records):
        print(f"shown: {len(shown)} of {len(records)} records", file=out)
    print(f"records: {len(records)}   spent: {spend.spent} under {spend.rule}", file=out)
    print(f"remaining (shown rounded down): {_remaining(meta, spend.spent)}", file=out)
    print(f"last hash: {loaded.tip.last_hash}", file=out)
    return 0


def _verify(args: argparse.Namespace) -> int:
    out = _out(args)
    where = f"at {redact_url(args.url)}" if args.url else f"in {args.export!r}"
    _warn_loose_files(args, out)
    try:
        if args.export:
            document = read_json(args.export, "export", "give the file `dpaccount ledger "
                                 "export --format json` wrote")
            check = verify_export(document, key=_key(args))
            meta, records, tip, history = check.meta, list(check.records), check.tip, None
        else:
            loaded = _load(args)
            meta, records, tip, history = (loaded.meta, loaded.records, loaded.tip,
                                           loaded.history)
        if args.checkpoint:
            hint = "give the file `dpaccount ledger checkpoint --output` wrote"
            point = read_json(args.checkpoint, "checkpoint file", hint)
            if not isinstance(point, dict):
                raise ConfigError(f"the checkpoint file {args.checkpoint!r} is not a "
                                  f"dpaccount head checkpoint; {hint}")
            check_checkpoint(records, point, meta.name, key=_key(args), history=history)
    except LedgerCorruptError as exc:
        first = "" if exc.seq is None else f" first bad record: {exc.seq};"
        print(f"CORRUPT: ledger {args.name!r} {where}:{first} {redact(str(exc))}", file=out)
        return 1
    spend = spend_over_time(meta, records, points=1)
    if not spend.spent.fits(meta.budget):
        print(f"OVERSPENT: ledger {meta.name!r} {where}: under the {spend.rule!r} rule its "
              f"{len(records)} records spend {spend.spent}, over the budget {meta.budget}",
              file=out)
        return 1
    print(f"ok: ledger {meta.name!r} has {len(records)} intact records; "
          f"sum epsilon {_up(tip.epsilon_sum)}, sum delta "
          f"{_up(tip.delta_sum)}; last hash {tip.last_hash}", file=out)
    return 0


def _checkpoint(args: argparse.Namespace) -> int:
    check_output(args.output, "--output")
    loaded = _load(args)
    point = make_checkpoint(loaded.records, loaded.meta.name, key=_key(args),
                            history=loaded.history)
    with writing(args.output, "--output") as stream:
        json.dump(point, stream, indent=2, sort_keys=True)
        stream.write("\n")
    print(f"wrote {args.output}: ledger {loaded.meta.name!r}, {point['head']} records, last "
          f"hash {point['last_hash']}", file=_out(args))
    return 0


def _keygen(args: argparse.Namespace) -> int:
    if os.path.lexists(args.output):
        raise ConfigError(
            f"--output {args.output!r} exists, and a key file is never overwritten: give a "
            "new file name (and keep the old key: a ledger keyed with it cannot be verified "
            "or written without it)"
        )
    check_output(args.output, "--output")
    key = LedgerKey.generate()
    key.write(args.output)
    print(f"wrote {args.output}: a new ledger key, id {key.key_id} (readable by you only; "
          "keep it outside the database and back it up: a keyed ledger cannot be verified "
          "or written without it)", file=_out(args))
    return 0


def _export(args: argparse.Namespace) -> int:
    if args.output:
        check_output(args.output, "--output")
    loaded = _load(args, rows=True)
    assert loaded.rows is not None
    record_rows, history = loaded.rows
    with (writing(args.output, "--output", newline="") if args.output
          else contextlib.nullcontext(_out(args))) as target:
        if args.format == "json":
            json.dump(export_document(loaded.meta, record_rows, history), target,
                      indent=1, sort_keys=True)
            target.write("\n")
        else:
            writer = csv.writer(target)
            writer.writerow(["seq", "timestamp", "label", "query_id", "rule", "epsilon",
                             "delta", "epsilon_float_up", "delta_float_up", "charge",
                             "prev_hash", "hash"])
            for r, row in zip(loaded.records, record_rows, strict=True):
                encoded = encode_record(r).model_dump(mode="json")
                writer.writerow([
                    r.seq, r.timestamp.isoformat(), _cell(r.label or ""),
                    _cell(r.query_id or ""), r.rule,
                    encoded["cost"]["epsilon"], encoded["cost"]["delta"],
                    format_number(r.cost.epsilon), format_number(r.cost.delta),
                    json.dumps(encoded["charge"], sort_keys=True, separators=(",", ":")),
                    row[2], row[3],
                ])
    return 0


def _report(args: argparse.Namespace) -> int:
    given = args.output  # None: <name>-report.html in the current folder (said below)
    args.output = given or default_output("ledgers" if args.all else args.name, "-report.html")
    suffix = os.path.splitext(str(args.output))[1].lower()
    if suffix not in REPORT_PAGE_SUFFIXES + REPORT_IMAGE_SUFFIXES:
        raise ConfigError(
            f"--output {args.output!r}: a report is a page (.html) or an image (.png, .svg, "
            f".pdf), not {suffix or 'a file without a suffix'}; give a file name ending in one"
        )
    check_output(args.output, "--output")
    names = _names(args) if args.all else [args.name]
    ledgers = []
    for name in names:
        loaded = _load(args, name)
        ledgers.append((loaded.meta, loaded.records,
                        f"verified {datetime.now(UTC):%Y-%m-%d %H:%M} UTC: "
                        f"{len(loaded.records)} intact records"))
    if not ledgers:
        raise StorageError(f"there are no ledgers at {redact_url(args.url)}")
    if suffix in REPORT_PAGE_SUFFIXES:
        page = html_report(ledgers, title=f"dpaccount ledgers at {redact_url(args.url)}",
                           by=args.by)
        with writing(args.output, "--output") as stream:
            stream.write(page)
    else:
        try:
            _plot(ledgers, args.by, args.output)
        except OSError as exc:
            raise cannot_write(args.output, "--output", exc.errno, exc.strerror) from None
    print(f"wrote {args.output}" + ("" if given else " (the default, as no --output was given)"),
          file=_out(args))
    return 0


def _plot(ledgers: Sequence[tuple[LedgerMeta, Sequence[LedgerRecord], str]], by: str,
          output: str) -> None:
    try:
        import matplotlib
    except ImportError:
        raise missing_extra("matplotlib", "plot") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(ledgers), 2, figsize=(11, 3.4 * len(ledgers)), squeeze=False)
    for row, (meta, records, _status) in zip(axes, ledgers, strict=True):
        spend = spend_over_time(meta, records, by=by)
        times = [p.timestamp for p in spend.points]
        for ax, coordinate, limit in ((row[0], "epsilon", meta.budget.epsilon),
                                      (row[1], "delta", meta.budget.delta)):
            if spend.points:
                stacks = [[p.attributed(g, coordinate) for p in spend.points]
                          for g in range(len(spend.groups))]
                ax.stackplot(times, stacks, labels=list(spend.groups), alpha=0.55)
                ax.plot(times, [float(getattr(p.spent, coordinate)) for p in spend.points],
                        color="black", label=f"spent under {spend.rule.split(' ')[0]}")
            if limit is not None:
                ax.axhline(float(limit), color="red", linestyle="--", label="budget")
            spent = getattr(spend.spent, coordinate)
            left = "unlimited" if limit is None else _down(limit - spent)
            ax.set_title(f"{meta.name}: {coordinate} {_up(spent)} spent, {left} left",
                         fontsize=10)
            ax.set_ylabel(coordinate)
        row[0].legend(fontsize=7, loc="upper left")
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(output)
    plt.close(fig)


# -- least privilege ------------------------------------------------------------------------


def _add_role_commands(sub: Any) -> None:
    """``grant`` and ``revoke`` (registered by `add_ledger_commands`)."""
    grant = sub.add_parser(
        "grant", help="let a PostgreSQL role charge (writer) or read (auditor) one ledger; "
        "run as the schema's owner")
    grant.add_argument("url", help="the database: postgresql://owner@host/db")
    grant.add_argument("--name", default="default", help="the ledger's name (default: default)")
    grant.add_argument("--role", required=True, help="an existing role")
    grant.add_argument("--as", dest="access", choices=("writer", "auditor"), required=True,
                       help="writer: open by name and charge; auditor: read and verify")
    grant.set_defaults(func=_grant)
    revoke = sub.add_parser("revoke", help="remove a role's grant of one ledger")
    revoke.add_argument("url", help="the database: postgresql://owner@host/db")
    revoke.add_argument("--name", default="default", help="the ledger's name (default: default)")
    revoke.add_argument("--role", required=True, help="the role")
    revoke.set_defaults(func=_revoke)


def _owner_store(args: argparse.Namespace) -> Any:
    """The ledger's PostgreSQL store, opened as the connecting role (the owner)."""
    scheme = str(args.url).split(":", 1)[0].lower()
    if scheme == "sqlite":
        raise ConfigError(
            "SQLite has no roles: whoever can write the ledger file (its -wal and -shm "
            "files, its directory) can do anything to it. Restrict the files instead: "
            "see docs/ledgers.md, 'SQLite: file permissions' (and `dpaccount ledger "
            "verify` warns about loose ones)")
    if scheme not in ("postgresql", "postgres"):
        raise ConfigError("grant and revoke work on PostgreSQL ledgers (postgresql://...)")
    store: Any = open_store(args.url, name=args.name, create=False)
    if store.stored_meta() is None:
        with contextlib.closing(store):
            raise missing_ledger(args.name, args.url, store, "--name")
    return store


def _grant(args: argparse.Namespace) -> int:
    store = _owner_store(args)
    try:
        readable = store.grant(args.role, args.access)
    finally:
        store.close()
    also = (f"; it may also read {', '.join(map(repr, readable[1:]))}, charged together "
            "with it (never alone)" if readable[1:] else "")
    what = "charge (writer)" if args.access == "writer" else "read and verify (auditor)"
    print(f"granted: role {args.role!r} may {what} ledger {args.name!r}{also}",
          file=_out(args))
    return 0


def _revoke(args: argparse.Namespace) -> int:
    store = _owner_store(args)
    try:
        removed = store.revoke(args.role)
    finally:
        store.close()
    print(f"revoked: role {args.role!r} on ledger {args.name!r}" if removed else
          f"role {args.role!r} had no grant of ledger {args.name!r}", file=_out(args))
    return 0


def _warn_loose_files(args: argparse.Namespace, out: TextIO) -> None:
    """Warn (standard error, and a line in the output) about a SQLite ledger's files or
    directory that the group or others may write; the exit code is the verification's."""
    if not args.url or not str(args.url).lower().startswith("sqlite:"):
        return
    from dpaccount.storage.sqlite import loose_permissions

    try:
        store: Any = open_store(args.url, name=args.name, create=False, read_only=True)
    except DPAccountError:
        return  # the verification itself reports it
    path = store.path
    store.close()
    for line in loose_permissions(path):
        print(f"warning: {line}", file=out)
        print(f"dpaccount: warning: {line}", file=sys.stderr)
