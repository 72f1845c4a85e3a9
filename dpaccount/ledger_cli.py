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
import fnmatch
import gc
import json
import os
import sys
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
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
from dpaccount._ledger_views import (
    list_rows,
    print_shares,
    printable,
    remaining,
    show_rows,
    table,
    up,
    write_csv,
)
from dpaccount._progress import quiet, stage, with_progress
from dpaccount._redact import redact, redact_url
from dpaccount.audit import (
    attribute_shares,
    check_snapshot_states,
    html_report,
    share_tree,
    spend_over_time,
    summarize,
    verify_export,
    write_export,
)
from dpaccount.errors import (
    ConfigError,
    DPAccountError,
    LedgerCorruptError,
    StorageError,
)
from dpaccount.keys import LedgerKey
from dpaccount.ledgers import check_checkpoint, make_checkpoint, missing_ledger, open_store
from dpaccount.records import LedgerMeta, LedgerRecord

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
        p.add_argument("--by", choices=("label", "job", "share"), default="label",
                       help="group charges by label, by job (query_id up to its first /) "
                       "or by the share they were charged through")

    listing = sub.add_parser("list", help="every ledger in a database: spent and remaining")
    common(listing)
    listing.set_defaults(func=with_progress(_list))
    show = sub.add_parser("show", help="the charges, what is spent and what remains")
    common(show)
    show.add_argument("--since", help="only charges at or after this UTC time (ISO 8601)")
    show.add_argument("--label", help="only charges whose label matches (shell wildcards)")
    show.add_argument("--tail", type=int, help="only the last N charges shown")
    show.add_argument("--summary", action="store_true",
                      help="a summary by label (or --by job) instead of every charge")
    grouping(show)
    show.set_defaults(func=with_progress(_show))
    verify = sub.add_parser("verify", help="check records, hash chain, totals and budget")
    verify.add_argument("url", nargs="?", help="the database (or give --export)")
    verify.add_argument("--name", default="default", help="the ledger's name")
    verify.add_argument("--key-file", help="the key of a keyed ledger")
    verify.add_argument("--checkpoint", help="a head checkpoint file the chain must extend")
    verify.add_argument("--export", help="verify an export file offline, without a database")
    verify.set_defaults(func=with_progress(_verify))
    checkpoint = sub.add_parser(
        "checkpoint", help="write a head checkpoint (length and last hash) of a verified ledger"
    )
    common(checkpoint)
    checkpoint.add_argument("--output", required=True, help="the checkpoint file to write")
    checkpoint.set_defaults(func=with_progress(_checkpoint))
    export = sub.add_parser(
        "export", help="every record with its links, and the settings history (JSON or CSV)"
    )
    common(export)
    export.add_argument("--format", choices=("json", "csv"), default="json")
    export.add_argument("--output", "--out", dest="output",
                        help="output file (default: standard output)")
    export.set_defaults(func=with_progress(_export))
    report = sub.add_parser(
        "report", help="spend under the rule over time: .html (self-contained) or an image "
        "(.png, .svg, .pdf: needs dpaccount[plot])"
    )
    common(report)
    report.add_argument("--output", "--out", dest="output", help="the file to write: .html, "
                        "or an image (.png, .svg, .pdf); default: NAME-report.html here")
    report.add_argument("--all", action="store_true", help="every ledger in the database")
    grouping(report)
    report.set_defaults(func=with_progress(_report))
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
    _check_url(args)
    name = args.name if name is None else name
    store: Any = open_store(args.url, name=name, create=False, key=_key(args), read_only=True)
    try:
        meta = store.stored_meta()
        if meta is None:
            raise missing_ledger(name, args.url, store, "--name")
        records: list[LedgerRecord] = []
        with _collector_paused():
            # and the records it checked, decoded once
            tip = store.verify(records, progress=stage(args, f"verifying {printable(name)}"))
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
        reading = stage(args, f"reading {printable(name)}'s rows")
        if rows and reading is not None:
            reading(0, None)
        return _Loaded(meta, records, tip, store.meta_history(),
                       store.chain_rows() if rows else None)
    finally:
        store.close()


def _check_url(args: argparse.Namespace) -> None:
    if args.url is None:
        raise ConfigError("give the database URL (or, for verify, --export FILE)")
    if str(args.url).lower().startswith("memory:"):
        raise ConfigError("a memory:// ledger lives inside one process; there is nothing to read")


def _names(args: argparse.Namespace) -> list[str]:
    _check_url(args)
    store: Any = open_store(args.url, name=args.name, create=False, key=_key(args),
                            read_only=True)
    try:
        return list(store.names())
    finally:
        store.close()


def _family(args: argparse.Namespace, names: Sequence[str], rows: bool = False
            ) -> dict[str, _Loaded]:
    """The ledgers ``names`` and all their shares (ledgers whose parent is one of them,
    and so on down), each loaded and verified (``names`` with their rows if asked)."""
    _check_url(args)
    store: Any = open_store(args.url, name=args.name, create=False, key=_key(args),
                            read_only=True)
    try:
        parents = {name: meta.parent for name, meta in store.metas().items()}
    finally:
        store.close()
    wanted, grew = set(names), True
    while grew:
        below = {child for child, parent in parents.items() if parent in wanted}
        grew = not below <= wanted
        wanted |= below
    return {name: _load(args, name, rows=rows and name in names) for name in sorted(wanted)}


def _shares(name: str, family: dict[str, _Loaded]) -> list[str | None] | None:
    """The share behind each of ``name``'s records, or None when it has no shares."""
    if not any(loaded.meta.parent == name for loaded in family.values()):
        return None
    found = attribute_shares(name, {n: (f.meta, f.records) for n, f in family.items()})
    return found.names


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
    loaded = {name: _load(args, name) for name in _names(args)}
    quiet(args)
    if not loaded:
        print(f"no ledgers at {redact_url(args.url)}", file=out)
        return 0
    table(list_rows(share_tree({n: (f.meta, f.records) for n, f in loaded.items()}),
                    {n: f.records for n, f in loaded.items()}), out)
    return 0


def _show(args: argparse.Namespace) -> int:
    family = _family(args, [args.name])
    loaded = family[args.name]
    meta, records = loaded.meta, loaded.records
    shares = _shares(args.name, family)
    if args.by == "share" and shares is None:
        shares = [None] * len(records)
    spend = spend_over_time(meta, records, points=1, progress=stage(args, "composing"))
    quiet(args)
    out = _out(args)
    print(f"ledger {meta.name!r}: rule {meta.rule}, relation {meta.relation.value}, "
          f"budget {meta.budget}" + (f", a share of {meta.parent!r}" if meta.parent else ""),
          file=out)
    shown = list(range(len(records)))
    if args.since:
        since = _since(args.since)
        shown = [i for i in shown if records[i].timestamp >= since]
    if args.label:
        shown = [i for i in shown if fnmatch.fnmatchcase(records[i].label or "", args.label)]
    if args.tail is not None:
        shown = shown[-args.tail:] if args.tail > 0 else []
    picked = [records[i] for i in shown]
    rows: list[tuple[str, ...]]
    if args.summary:
        rows = [(args.by, "charges", "epsilon (own, summed)", "delta (own, summed)",
                 "first (UTC)", "last (UTC)")]
        rows += [(printable(g.group), str(g.count), up(g.epsilon), up(g.delta),
                  f"{g.first:%Y-%m-%d %H:%M}", f"{g.last:%Y-%m-%d %H:%M}")
                 for g in summarize(picked, args.by,
                                    None if shares is None else [shares[i] for i in shown])]
    else:
        rows = show_rows(picked, None if shares is None else [shares[i] for i in shown])
    table(rows, out)
    if len(shown) != len(records):
        print(f"shown: {len(shown)} of {len(records)} records", file=out)
    print(f"records: {len(records)}   spent: {spend.spent} under {spend.rule}", file=out)
    print(f"remaining (shown rounded down): {remaining(meta, spend.spent, spend.left)}",
          file=out)
    tree = share_tree({n: (f.meta, f.records) for n, f in family.items()})
    print_shares(next((r for r in tree if r.name == args.name), None),
                 {n: f.records for n, f in family.items()}, out)
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
            check = verify_export(document, key=_key(args),
                                  progress=stage(args, "verifying the export"))
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
    spend = spend_over_time(meta, records, points=1, progress=stage(args, "composing"))
    quiet(args)
    if not spend.spent.fits(meta.budget):
        print(f"OVERSPENT: ledger {meta.name!r} {where}: under the {spend.rule!r} rule its "
              f"{len(records)} records spend {spend.spent}, over the budget {meta.budget}",
              file=out)
        return 1
    print(f"ok: ledger {meta.name!r} has {len(records)} intact records; "
          f"sum epsilon {up(tip.epsilon_sum)}, sum delta "
          f"{up(tip.delta_sum)}; last hash {tip.last_hash}", file=out)
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
    family = _family(args, [args.name], rows=True)
    loaded = family[args.name]
    assert loaded.rows is not None
    record_rows, history = loaded.rows
    shares = _shares(args.name, family)
    tree = None
    if shares is not None:
        tree = [node for node in share_tree({n: (f.meta, f.records)
                                             for n, f in family.items()})
                if node.name == args.name]
    writing_rows = stage(args, f"writing {printable(args.name)}")
    with (writing(args.output, "--output", newline="") if args.output
          else contextlib.nullcontext(_out(args))) as target:
        if args.format == "json":
            write_export(target, loaded.meta, record_rows, history, shares=shares,
                         tree=tree, progress=writing_rows)
        else:
            write_csv(target, loaded.records, record_rows,
                      shares or [None] * len(loaded.records), writing_rows)
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
    family = _family(args, _names(args) if args.all else [args.name])
    if not family:
        raise StorageError(f"there are no ledgers at {redact_url(args.url)}")
    tree = share_tree({n: (f.meta, f.records) for n, f in family.items()})
    ledgers = [(family[node.name].meta, family[node.name].records,
                f"verified {datetime.now(UTC):%Y-%m-%d %H:%M} UTC: {node.records} intact "
                "records") for root in tree for _depth, node in root.walk()]
    shares = {name: found for name in family
              if (found := _shares(name, family)) is not None}
    quiet(args)
    if suffix in REPORT_PAGE_SUFFIXES:
        page = html_report(ledgers, title=f"dpaccount ledgers at {redact_url(args.url)}",
                           by=args.by, tree=tree, shares=shares)
        with writing(args.output, "--output") as stream:
            stream.write(page)
    else:
        from dpaccount.plot import plot_ledgers

        try:
            plot_ledgers(ledgers, args.by, args.output, shares)
        except OSError as exc:
            raise cannot_write(args.output, "--output", exc.errno, exc.strerror) from None
    print(f"wrote {args.output}" + ("" if given else " (the default, as no --output was given)"),
          file=_out(args))
    return 0


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
