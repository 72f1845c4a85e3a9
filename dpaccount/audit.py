"""What an auditor reads from a ledger: the spend under its rule over time, summaries by
label or job, exports that re-verify offline, and a self-contained HTML report.

Everything here works on records already read (and verified) from a store; the
``dpaccount ledger`` commands are the front end. Spend is always the ledger's composed
total under its own rule (rebuilt from the stored description), never the plain sum of
charges, which under a tight rule can be many times larger. Where a chart splits the
spend by label or job, each group's share is **attributed** in proportion to its own
charges' epsilon (or delta): the parts add up to the spend under the rule, but under a
non-additive rule no group "spent" its part on its own.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any, Final, TypeVar

import attrs

from dpaccount._numeric import exact_sums
from dpaccount._redact import redact
from dpaccount.composition import rule_from_description
from dpaccount.composition.base import Rule, count_distinct
from dpaccount.composition.basic import BasicRule
from dpaccount.composition.states import encode_state
from dpaccount.costs import PrivacyCost, format_bound
from dpaccount.errors import ConfigError, DPAccountError, LedgerCorruptError
from dpaccount.keys import LedgerKey
from dpaccount.records import GENESIS_HASH, LedgerMeta, LedgerRecord, decode_record
from dpaccount.storage._chain import Snapshot, check_records, tip_of
from dpaccount.storage._sql import (
    LedgerTip,
    MetaRow,
    RecordRow,
    check_key,
    check_meta_history,
    parse_meta,
)

__all__ = [
    "EXPORT_FORMAT",
    "ExportCheck",
    "GroupSummary",
    "Spend",
    "SpendPoint",
    "check_snapshot_states",
    "export_document",
    "group_of",
    "html_report",
    "spend_over_time",
    "summarize",
    "verify_export",
]

_K = TypeVar("_K")

#: The ``format`` field of a ledger export (JSON).
EXPORT_FORMAT: Final = "dpaccount-ledger-export"
#: Version 2: raw payloads, links and the settings history (version 1 had none).
EXPORT_VERSION: Final = 2
#: The name of the group that holds the charges beyond the largest ones in a chart.
OTHER: Final = "(other)"


def group_of(record: LedgerRecord, by: str) -> str:
    """The group a record belongs to: its ``label``, or its ``job`` (the part of its
    query_id before the first ``/``, as in ``"nightly-2026-11-24/count"``)."""
    if by == "label":
        return record.label or "(no label)"
    if by == "job":
        return (record.query_id or "(no query_id)").split("/", 1)[0]
    raise ConfigError(f"group by 'label' or 'job', not {by!r}")


@attrs.frozen
class SpendPoint:
    """The ledger after record ``seq``.

    Attributes:
        seq: The last record included.
        timestamp: When it was recorded.
        spent: The composed total of records 0..seq under the ledger's rule.
        shares: Per group of `Spend.groups`, the exact sums of its own charges'
            (epsilon, delta) so far (what attribution divides the spend by).
    """

    seq: int
    timestamp: datetime
    spent: PrivacyCost
    shares: tuple[tuple[Fraction, Fraction], ...]

    def attributed(self, index: int, coordinate: str) -> float:
        """Group ``index``'s part of the spend in ``coordinate`` (``"epsilon"`` or
        ``"delta"``), in proportion to its own charges."""
        column = 0 if coordinate == "epsilon" else 1
        total = sum((share[column] for share in self.shares), Fraction(0))
        spent = self.spent.epsilon if column == 0 else self.spent.delta
        if total == 0:
            return 0.0
        return float(spent * self.shares[index][column] / total)


@attrs.frozen
class Spend:
    """A ledger's spend over time under its rule.

    Attributes:
        rule: The rule the spend was composed under (its name, or a note when the stored
            rule could not be rebuilt and the plain sum was used).
        groups: The groups in stacking order (the largest first; `OTHER` last).
        points: Sampled points, the last record always included.
    """

    rule: str
    groups: tuple[str, ...]
    points: tuple[SpendPoint, ...]

    @property
    def spent(self) -> PrivacyCost:
        """The spend after the last record (0 for an empty ledger)."""
        return self.points[-1].spent if self.points else PrivacyCost(0)


def _composer(meta: LedgerMeta) -> tuple[str, Rule[Any]]:
    """The ledger's rule, or basic composition where the stored rule cannot be rebuilt
    (a plan of mechanism charges), named so that the report says which it used."""
    try:
        rule = rule_from_description(meta.rule)
    except DPAccountError:
        return ("basic (the plain sum of charges: the stored rule could not be rebuilt)",
                BasicRule())
    return rule.name, rule


def spend_over_time(meta: LedgerMeta, records: Sequence[LedgerRecord], *, by: str = "label",
                    points: int = 400, top: int = 8) -> Spend:
    """The spend under the ledger's rule after each record, sampled at about ``points``
    records (the rule's total is composed at each; its state is extended at every one).

    Args:
        meta: The ledger's settings.
        records: Its records, in order.
        by: Group charges by ``"label"`` or ``"job"`` (see `group_of`).
        points: How many points to sample at most.
        top: How many of the largest groups to keep; the rest are `OTHER`.
    """
    names = [group_of(record, by) for record in records]
    totals: dict[str, Fraction] = {}
    for (group, cost), count in _counted(names, records):
        totals[group] = totals.get(group, Fraction(0)) + (cost.epsilon + cost.delta) * count
    ranked = sorted(totals, key=lambda g: (-totals[g], g))
    kept = ranked if len(ranked) <= top + 1 else ranked[:top]
    groups = tuple(kept) + ((OTHER,) if len(ranked) > len(kept) else ())
    index = {group: i for i, group in enumerate(kept)}
    slots = [index.get(group, len(groups) - 1) for group in names]
    name, rule = _composer(meta)
    state = rule.start()
    step = max(1, -(-len(records) // max(points, 1)))
    shares = [[Fraction(0), Fraction(0)] for _ in groups]
    sampled: list[SpendPoint] = []
    for start in range(0, len(records), step):
        segment = records[start:start + step]
        state = rule.extend_all(state, (record.charge for record in segment))
        for (slot, cost), count in _counted(slots[start:start + step], segment):
            shares[slot][0] += cost.epsilon * count
            shares[slot][1] += cost.delta * count
        last = segment[-1]
        sampled.append(SpendPoint(last.seq, last.timestamp, rule.total(state),
                                  tuple((e, d) for e, d in shares)))
    return Spend(name, groups, tuple(sampled))


def _counted(keys: Sequence[_K], records: Sequence[LedgerRecord]
             ) -> list[tuple[tuple[_K, PrivacyCost], int]]:
    """How many records have each (key, cost) (`count_distinct`, costs by identity): exact
    sums of many records' costs are then a few multiplications instead of a Fraction
    addition per record."""
    pairs = count_distinct(((key, record.cost) for key, record in zip(keys, records,
                                                                       strict=True)),
                           key=lambda pair: (pair[0], id(pair[1])))
    return [((key, cost), count) for (key, cost), count in pairs]


@attrs.frozen
class GroupSummary:
    """One group's charges.

    Attributes:
        group: The label or job.
        count: How many charges.
        epsilon: The exact sum of their epsilon (their own costs, not composed).
        delta: The exact sum of their delta.
        first: When the first was recorded.
        last: When the last was recorded.
    """

    group: str
    count: int
    epsilon: Fraction
    delta: Fraction
    first: datetime
    last: datetime


def summarize(records: Sequence[LedgerRecord], by: str = "label") -> list[GroupSummary]:
    """The charges grouped by label or job, the largest epsilon first."""
    groups: dict[str, list[LedgerRecord]] = {}
    for record in records:
        groups.setdefault(group_of(record, by), []).append(record)
    rows = [
        GroupSummary(group, len(rs), sum((r.cost.epsilon for r in rs), Fraction(0)),
                     sum((r.cost.delta for r in rs), Fraction(0)), rs[0].timestamp,
                     rs[-1].timestamp)
        for group, rs in groups.items()
    ]
    return sorted(rows, key=lambda row: (-row.epsilon, -row.delta, row.group))


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


def export_document(meta: LedgerMeta, rows: Sequence[RecordRow],
                    history: Sequence[MetaRow]) -> dict[str, Any]:
    """A JSON-ready export of a ledger that `verify_export` re-checks without the
    database: every record's stored payload, link and previous link, and the settings
    history with its links."""
    return {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "exported_at": datetime.now(UTC).isoformat(),
        "ledger": meta.model_dump(mode="json"),
        "settings_history": [
            {"version": v, "at": at, "head": head, "meta": text, "prev_hash": prev,
             "hash": link}
            for v, at, head, text, prev, link in history
        ],
        "records": [
            {"seq": seq, "payload": payload, "prev_hash": prev, "hash": link,
             "query_id": query_id, "record": json.loads(payload)}
            for seq, payload, prev, link, query_id in rows
        ],
    }


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


def verify_export(document: Any, key: LedgerKey | None = None) -> ExportCheck:
    """Re-verify an export offline: each record's payload against its link and the
    previous one, the settings history's chain, and that the ledger's settings are its
    last entry. With the ledger's ``key`` (a keyed ledger) every link must be its HMAC.

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
    records = check_records(rows, 0, GENESIS_HASH, key)
    check_meta_history(history, current, key)
    for row, record in zip(document["records"], records, strict=True):
        if "record" in row and decode_record(json.dumps(row["record"])) != record:
            raise LedgerCorruptError(
                f"record {record.seq}: its readable copy differs from its payload",
                seq=record.seq,
            )
    tip = tip_of(records, rows[-1][3] if rows else GENESIS_HASH)
    spend = spend_over_time(meta, records, points=1)
    return ExportCheck(meta, tuple(records), tip, spend.spent, spend.rule)


# -- the HTML report -----------------------------------------------------------------------

#: Colours of the stacked groups (Okabe–Ito, readable by most colour-blind readers).
_PALETTE: Final = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00",
                   "#F0E442", "#000000", "#999999")


def _up(value: Fraction | None) -> str:
    return "unlimited" if value is None else format_bound(value, upward=True)[0]


def _down(value: Fraction) -> str:
    return format_bound(max(value, Fraction(0)), upward=False)[0]


def _chart(spend: Spend, coordinate: str, budget: Fraction | None) -> str:
    """An inline SVG: the spend in one coordinate over time, its attribution to groups
    stacked below it, and the budget as a dashed line."""
    width, height, left, right, top, bottom = 720, 220, 70, 10, 12, 34
    points = spend.points
    values = [float(getattr(p.spent, coordinate)) for p in points]
    ceiling = max([*values, float(budget) if budget is not None else 0.0, 0.0])
    ceiling = ceiling * 1.08 if ceiling > 0 else 1.0
    start = points[0].timestamp.timestamp() if points else 0.0
    span = (points[-1].timestamp.timestamp() - start) if points else 0.0

    def x(i: int) -> float:
        if span > 0:
            at = (points[i].timestamp.timestamp() - start) / span
        else:
            at = i / max(len(points) - 1, 1)
        return left + at * (width - left - right)

    def y(value: float) -> float:
        return top + (1 - value / ceiling) * (height - top - bottom)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'role="img" aria-label="{coordinate} spent over time">',
             f'<rect x="{left}" y="{top}" width="{width - left - right}" '
             f'height="{height - top - bottom}" fill="#fafafa" stroke="#ccc"/>']
    lower = [0.0] * len(points)
    for g, group in enumerate(spend.groups):
        upper = [lower[i] + p.attributed(g, coordinate) for i, p in enumerate(points)]
        outline = [f"{x(i):.1f},{y(upper[i]):.1f}" for i in range(len(points))]
        outline += [f"{x(i):.1f},{y(lower[i]):.1f}" for i in reversed(range(len(points)))]
        if len(points) > 1 and any(u > lo for u, lo in zip(upper, lower, strict=True)):
            parts.append(f'<polygon points="{" ".join(outline)}" '
                         f'fill="{_PALETTE[g % len(_PALETTE)]}" fill-opacity="0.55">'
                         f"<title>{html.escape(group)}</title></polygon>")
        lower = upper
    if points:
        line = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values))
        parts.append(f'<polyline points="{line}" fill="none" stroke="#222" stroke-width="2"/>')
    if budget is not None:
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(float(budget)):.1f}" '
                     f'y2="{y(float(budget)):.1f}" stroke="#c00" stroke-dasharray="6 4"/>'
                     f'<text x="{width - right - 4}" y="{y(float(budget)) - 4:.1f}" '
                     f'text-anchor="end" fill="#c00" font-size="12">budget {_up(budget)}</text>')
    for value in (0.0, ceiling / 1.08):
        parts.append(f'<text x="{left - 6}" y="{y(value) + 4:.1f}" text-anchor="end" '
                     f'font-size="11">{value:.4g}</text>')
    if points:
        for i, anchor in ((0, "start"), (len(points) - 1, "end")):
            label = points[i].timestamp.strftime("%Y-%m-%d %H:%M")
            parts.append(f'<text x="{x(i):.1f}" y="{height - 12}" text-anchor="{anchor}" '
                         f'font-size="11">{label}</text>')
    parts.append(f'<text x="12" y="{top + 14}" font-size="12" transform="rotate(-90 12 '
                 f'{top + 14})" text-anchor="end">{coordinate}</text></svg>')
    return "".join(parts)


def _ledger_section(meta: LedgerMeta, records: Sequence[LedgerRecord], by: str,
                    status: str) -> str:
    spend = spend_over_time(meta, records, by=by)
    budget = meta.budget
    spent = spend.spent
    left_eps = "unlimited" if budget.epsilon is None else _down(budget.epsilon - spent.epsilon)
    esc = html.escape
    figures = [
        ("records", str(len(records))),
        ("rule", spend.rule),
        ("relation", meta.relation.value),
        ("budget", f"ε {_up(budget.epsilon)}, δ {_up(budget.delta)}"),
        ("spent under the rule (rounded up)", f"ε {_up(spent.epsilon)}, δ {_up(spent.delta)}"),
        ("remaining (rounded down)", f"ε {left_eps}, δ {_down(budget.delta - spent.delta)}"),
        ("verification", status),
    ]
    if records:
        figures.append(("first and last charge",
                        f"{records[0].timestamp:%Y-%m-%d %H:%M} – "
                        f"{records[-1].timestamp:%Y-%m-%d %H:%M} UTC"))
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in figures)
    legend = "".join(
        f'<span class="key"><i style="background:{_PALETTE[g % len(_PALETTE)]}"></i>'
        f"{esc(group)}</span>" for g, group in enumerate(spend.groups)
    )
    summary = "".join(
        f"<tr><td>{esc(row.group)}</td><td>{row.count}</td><td>{_up(row.epsilon)}</td>"
        f"<td>{_up(row.delta)}</td><td>{row.last:%Y-%m-%d %H:%M}</td></tr>"
        for row in summarize(records, by)[:50]
    )
    overspent = ' <span class="alarm">OVERSPENT</span>' if not spent.fits(budget) else ""
    return (
        f'<section class="ledger"><h2>ledger {esc(meta.name)}{overspent}</h2>'
        f'<table class="figures">{rows}</table>'
        f"<h3>epsilon spent under the rule</h3>{_chart(spend, 'epsilon', budget.epsilon)}"
        f"<h3>delta spent under the rule</h3>{_chart(spend, 'delta', budget.delta)}"
        f'<p class="legend">{legend}</p><p class="note">The black line is the spend under '
        f"the ledger's rule; the coloured areas attribute it to each {esc(by)} in "
        f"proportion to that {esc(by)}'s own charges.</p>"
        f"<h3>charges by {esc(by)}</h3><table class=\"groups\"><tr><th>{esc(by)}</th>"
        "<th>charges</th><th>ε (own, summed)</th><th>δ (own, summed)</th><th>last (UTC)</th>"
        f"</tr>{summary}</table></section>"
    )


_STYLE: Final = (
    "body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:780px}"
    "table{border-collapse:collapse;margin:8px 0}th,td{text-align:left;padding:3px 10px;"
    "border-bottom:1px solid #ddd;font-size:14px}.key{margin-right:14px;font-size:13px}"
    ".key i{display:inline-block;width:12px;height:12px;margin-right:4px;opacity:.7}"
    ".alarm{color:#fff;background:#c00;padding:2px 6px;font-size:14px}"
    ".note{color:#555;font-size:13px}section{margin-bottom:40px}"
)


def html_report(ledgers: Sequence[tuple[LedgerMeta, Sequence[LedgerRecord], str]], *,
                title: str, by: str = "label") -> str:
    """A self-contained HTML page (inline CSS and SVG, no script, nothing fetched) with
    one section per ledger: its figures, the spend in epsilon and delta over time under
    its rule with the budget, and its charges grouped by ``by``.

    Args:
        ledgers: (settings, records, verification status) of each ledger.
        title: The page's title (e.g. the database); it goes through the one
            redaction (`dpaccount._redact.redact`), so a password in a URL in it is
            shown as ``***``.
        by: Group charges by ``"label"`` or ``"job"``.
    """
    title = redact(title)
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    sections = "".join(_ledger_section(meta, records, by, status)
                       for meta, records, status in ledgers)
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>Privacy budget report</h1><p>{html.escape(title)} · generated {generated} · "
        f"{len(ledgers)} ledger(s)</p>{sections}</body></html>"
    )
