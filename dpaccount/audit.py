"""What an auditor reads from a ledger: the spend under its rule over time, summaries by
label, job or share (`dpaccount.spend`, re-exported here), exports that re-verify
offline, and a self-contained HTML report (`dpaccount.report`, re-exported here).

Everything here works on records already read (and verified) from a store; the
``dpaccount ledger`` commands are the front end. Spend is always the ledger's composed
total under its own rule (rebuilt from the stored description), never the plain sum of
charges, which under a tight rule can be many times larger. Where a chart splits the
spend by label, job or share, each group's share is **attributed** in proportion to its
own charges' epsilon (or delta): the parts add up to the spend under the rule, but under
a non-additive rule no group "spent" its part on its own.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Final, TextIO

import attrs

from dpaccount._numeric import exact_sums
from dpaccount.composition import rule_from_description
from dpaccount.composition.states import encode_state
from dpaccount.costs import PrivacyCost
from dpaccount.errors import ConfigError, DPAccountError, LedgerCorruptError
from dpaccount.keys import LedgerKey
from dpaccount.records import GENESIS_HASH, LedgerMeta, LedgerRecord, decode_record
from dpaccount.report import html_report
from dpaccount.spend import (
    DIRECT,
    OTHER,
    GroupSummary,
    ShareAttribution,
    ShareNode,
    Spend,
    SpendPoint,
    attribute_shares,
    group_names,
    group_of,
    share_tree,
    spend_over_time,
    summarize,
)
from dpaccount.storage._chain import VERIFY_CHUNK, Snapshot, check_records, tip_of
from dpaccount.storage._sql import (
    LedgerTip,
    MetaRow,
    RecordRow,
    check_key,
    check_meta_history,
    parse_meta,
)

__all__ = [
    "DIRECT",
    "EXPORT_FORMAT",
    "OTHER",
    "ExportCheck",
    "GroupSummary",
    "ShareAttribution",
    "ShareNode",
    "Spend",
    "SpendPoint",
    "attribute_shares",
    "check_snapshot_states",
    "export_document",
    "group_names",
    "group_of",
    "html_report",
    "share_tree",
    "spend_over_time",
    "summarize",
    "verify_export",
    "write_export",
]

#: The ``format`` field of a ledger export (JSON).
EXPORT_FORMAT: Final = "dpaccount-ledger-export"
#: Version 2: raw payloads, links and the settings history (version 1 had none).
EXPORT_VERSION: Final = 2
#: What a progress callback is: ``progress(done, total)``.
Progress = Callable[[int, int | None], object]


def check_snapshot_states(records: Sequence[LedgerRecord], snapshots: Sequence[Snapshot]
                          ) -> int:
    """Replay the records under each snapshot's rule and relation and compare the rule
    state with the one the snapshot stored (a full verification: opening trusts a
    snapshot's state, whose link only proves who wrote it).

    Each snapshot is replayed from the one before it. A rule whose sums are bounded
    (`Rule.bounded`) is replayed as it runs now and, where that differs, with exact sums
    (`dpaccount._numeric.exact_sums`): a snapshot written before the sums were bounded
    holds the exact ones, never below the bounded sums and a valid bound itself.

    Returns:
        How many snapshot states were checked (those whose rule cannot be rebuilt from
        its description, such as a plan of mechanism charges, are not).

    Raises:
        LedgerCorruptError: A snapshot holds a state its records do not give.
    """
    by_settings: dict[str, dict[int, Snapshot]] = {}
    for snap in snapshots:
        if snap.state is not None:
            by_settings.setdefault(snap.settings, {})[snap.tip.head] = snap
    checked = 0
    for settings, wanted in by_settings.items():
        try:
            rule = rule_from_description(json.loads(settings)["rule"])
        except (DPAccountError, ValueError, KeyError, TypeError):
            continue
        state, done = rule.start(), 0
        for head in sorted(h for h in wanted if h <= len(records)):
            before, part = state, records[done:head]
            state = rule.extend_all(before, (r.charge for r in part))
            if encode_state(state) != wanted[head].state and rule.bounded:
                # written before the rules bounded their sums: they were kept exact then
                with exact_sums():
                    state = rule.extend_all(before, (r.charge for r in part))
            done = head
            if encode_state(state) != wanted[head].state:
                raise LedgerCorruptError(
                    f"the snapshot at record {head} holds a rule state that its records "
                    "do not give (opening from it would misstate the spend)", seq=head - 1)
            checked += 1
    return checked


# -- exports an auditor re-verifies ---------------------------------------------------------


def _share_entries(tree: Sequence[ShareNode]) -> list[dict[str, Any]]:
    """The shares below an exported ledger (its own node excluded), depth first."""
    return [
        {"name": node.name, "parent": node.meta.parent, "depth": depth,
         "records": node.records, "rule": node.rule,
         "budget": {"epsilon": None if node.meta.budget.epsilon is None
                    else str(node.meta.budget.epsilon),
                    "delta": str(node.meta.budget.delta)},
         "spent": {"epsilon": str(node.spent.epsilon), "delta": str(node.spent.delta)}}
        for root in tree for depth, node in root.walk() if depth > 0
    ]


def _head(meta: LedgerMeta, history: Sequence[MetaRow],
          tree: Sequence[ShareNode] | None) -> dict[str, Any]:
    head: dict[str, Any] = {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "exported_at": datetime.now(UTC).isoformat(),
        "ledger": meta.model_dump(mode="json"),
        "settings_history": [
            {"version": v, "at": at, "head": head, "meta": text, "prev_hash": prev,
             "hash": link}
            for v, at, head, text, prev, link in history
        ],
    }
    if tree is not None:
        head["shares"] = _share_entries(tree)
    return head


def _entry(row: RecordRow, share: str | None) -> dict[str, Any]:
    seq, payload, prev, link, query_id = row
    return {"seq": seq, "payload": payload, "prev_hash": prev, "hash": link,
            "query_id": query_id, "record": json.loads(payload), "share": share}


def _share_at(shares: Sequence[str | None] | None, count: int) -> Sequence[str | None]:
    if shares is None:
        return [None] * count
    if len(shares) != count:
        raise ConfigError("give the share behind each record (one name or None each)")
    return shares


def export_document(meta: LedgerMeta, rows: Sequence[RecordRow],
                    history: Sequence[MetaRow], *,
                    shares: Sequence[str | None] | None = None,
                    tree: Sequence[ShareNode] | None = None) -> dict[str, Any]:
    """A JSON-ready export of a ledger that `verify_export` re-checks without the
    database: every record's stored payload, link and previous link, and the settings
    history with its links.

    Args:
        meta: The ledger's settings.
        rows: Its record rows with their links (the store's ``chain_rows``).
        history: Its settings history rows.
        shares: The share behind each record (`ShareAttribution.names`; None: a
            charge made to the ledger itself), exported as each record's ``share``.
            It is derived from the shares' records, not covered by the links.
        tree: The ledger's node of `share_tree`: its shares, their budgets and spend,
            exported as ``shares``.
    """
    names = _share_at(shares, len(rows))
    return {**_head(meta, history, tree),
            "records": [_entry(row, share) for row, share in zip(rows, names, strict=True)]}


def write_export(stream: TextIO, meta: LedgerMeta, rows: Sequence[RecordRow],
                 history: Sequence[MetaRow], *,
                 shares: Sequence[str | None] | None = None,
                 tree: Sequence[ShareNode] | None = None,
                 progress: Progress | None = None) -> None:
    """Write `export_document` as JSON to ``stream``, one record at a time (the text is
    what ``json.dump(document, stream, indent=1, sort_keys=True)`` and a newline write),
    calling ``progress(written, total)`` as it goes."""
    names = _share_at(shares, len(rows))
    head = _head(meta, history, tree)
    marker = f"records-{uuid.uuid4().hex}"
    head["records"] = marker
    before, after = json.dumps(head, indent=1, sort_keys=True).split(f'"{marker}"', 1)
    stream.write(before)
    if not rows:
        stream.write("[]")
    for i, (row, share) in enumerate(zip(rows, names, strict=True)):
        text = json.dumps(_entry(row, share), indent=1, sort_keys=True)
        stream.write(("[\n  " if i == 0 else ",\n  ") + text.replace("\n", "\n  "))
        if progress is not None and (i % 1000 == 999 or i == len(rows) - 1):
            progress(i + 1, len(rows))
    if rows:
        stream.write("\n ]")
    stream.write(after + "\n")


@attrs.frozen
class ExportCheck:
    """What `verify_export` found in an intact export.

    Attributes:
        meta: The ledger's settings (the last entry of its settings history).
        records: The decoded records.
        tip: Their count, exact sums and last link.
        spent: Their composed total under the ledger's rule.
        rule: The rule it was composed under (see `Spend.rule`).
    """

    meta: LedgerMeta
    records: tuple[LedgerRecord, ...]
    tip: LedgerTip
    spent: PrivacyCost
    rule: str

    @property
    def overspent(self) -> bool:
        """Whether the records spend more than the budget under the rule."""
        return not self.spent.fits(self.meta.budget)


def verify_export(document: Any, key: LedgerKey | None = None, *,
                  progress: Progress | None = None) -> ExportCheck:
    """Re-verify an export offline: each record's payload against its link and the
    previous one, the settings history's chain, and that the ledger's settings are its
    last entry. With the ledger's ``key`` (a keyed ledger) every link must be its HMAC.
    ``progress(checked, total)`` is called after each chunk of records.

    Raises:
        ConfigError: The document is not a ledger export of this version, or a keyed
            ledger's export is checked without its key.
        LedgerCorruptError: A record or settings entry was altered, removed or added.
    """
    if not isinstance(document, dict) or document.get("format") != EXPORT_FORMAT:
        raise ConfigError("this is not a dpaccount ledger export (no 'format' field)")
    if document.get("version") != EXPORT_VERSION:
        raise ConfigError(
            f"ledger export version {document.get('version')!r} carries no links to "
            f"verify; export again with this dpaccount (version {EXPORT_VERSION})"
        )
    try:
        current = json.dumps(document["ledger"])
        rows: list[RecordRow] = [
            (int(r["seq"]), str(r["payload"]), str(r["prev_hash"]), str(r["hash"]),
             None if r["query_id"] is None else str(r["query_id"]))
            for r in document["records"]
        ]
        history: list[MetaRow] = [
            (int(h["version"]), str(h["at"]), int(h["head"]), str(h["meta"]),
             str(h["prev_hash"]), str(h["hash"]))
            for h in document["settings_history"]
        ]
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"the ledger export is malformed: {exc!r}") from None
    meta = parse_meta(current)
    check_key(current, key, meta.name)
    records: list[LedgerRecord] = []
    prev = GENESIS_HASH
    for start in range(0, len(rows), VERIFY_CHUNK):
        chunk = check_records(rows[start:start + VERIFY_CHUNK], start, prev, key)
        prev = rows[start + len(chunk) - 1][3]
        copies = document["records"][start:start + VERIFY_CHUNK]
        for row, record in zip(copies, chunk, strict=True):
            if "record" in row and decode_record(json.dumps(row["record"])) != record:
                raise LedgerCorruptError(
                    f"record {record.seq}: its readable copy differs from its payload",
                    seq=record.seq,
                )
        records += chunk
        if progress is not None:
            progress(len(records), len(rows))
    check_meta_history(history, current, key)
    tip = tip_of(records, rows[-1][3] if rows else GENESIS_HASH)
    spend = spend_over_time(meta, records, points=1)
    return ExportCheck(meta, tuple(records), tip, spend.spent, spend.rule)
