"""What a ledger spent, read from its records: the spend under its rule over time, its
charges grouped by label, job or share, and which share of a dataset's budget each of its
charges was made through.

Spend is always the ledger's composed total under its own rule (rebuilt from the stored
description), never the plain sum of charges, which under a tight rule can be many times
larger. Where a chart splits the spend by group, each group's share is **attributed** in
proportion to its own charges' epsilon (or delta): the parts add up to the spend under
the rule, but under a non-additive rule no group "spent" its part on its own.

**Shares.** A charge to a team's share (``open_ledger(..., parent=...)``, docs/budgets.md)
is recorded, in one transaction, in the share and in each ancestor, as the same record
(the same time to the microsecond, label, query id and cost). The records do not name
the share; `attribute_shares` finds, for each record of a ledger, the share (and the
share within it, for nested shares) whose record it is, by matching each share's
records, in order, to the ledger's. A charge made to the ledger itself matches none.
(Two records that agree in all of those fields would be told apart only by order; they
are equal in everything an auditor reads.) The share's name is one its creator chose,
never a value from the data.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from fractions import Fraction
from typing import Any, Final, TypeVar

import attrs

from dpaccount.composition import rule_from_description
from dpaccount.composition.base import Rule, count_distinct
from dpaccount.composition.basic import BasicRule
from dpaccount.costs import Budget, PrivacyCost
from dpaccount.errors import ConfigError, DPAccountError
from dpaccount.records import LedgerMeta, LedgerRecord

__all__ = [
    "DIRECT",
    "OTHER",
    "GroupSummary",
    "ShareAttribution",
    "ShareNode",
    "Spend",
    "SpendPoint",
    "attribute_shares",
    "group_names",
    "group_of",
    "share_tree",
    "spend_over_time",
    "summarize",
]

_K = TypeVar("_K")

#: The name of the group that holds the charges beyond the largest ones in a chart.
OTHER: Final = "(other)"
#: The group of a ledger's charges made to it directly, through none of its shares.
DIRECT: Final = "(direct)"
#: How nested shares are written in one name: ``team-a > team-a/nlp``.
SHARE_SEPARATOR: Final = " > "


def group_of(record: LedgerRecord, by: str) -> str:
    """The group a record belongs to: its ``label``, or its ``job`` (the part of its
    query_id before the first ``/``, as in ``"nightly-2026-11-24/count"``). (Grouping
    by ``"share"`` needs the ledger's shares: see `group_names`.)"""
    if by == "label":
        return record.label or "(no label)"
    if by == "job":
        return (record.query_id or "(no query_id)").split("/", 1)[0]
    raise ConfigError(f"group by 'label', 'job' or 'share', not {by!r}")


def group_names(records: Sequence[LedgerRecord], by: str,
                shares: Sequence[str | None] | None = None) -> list[str]:
    """Each record's group (`group_of`); with ``by="share"``, the share it was charged
    through (``shares``, as `ShareAttribution.names` gives them) or `DIRECT`.

    Raises:
        ConfigError: An unknown ``by``, or ``"share"`` without one name per record.
    """
    if by != "share":
        return [group_of(record, by) for record in records]
    if shares is None or len(shares) != len(records):
        raise ConfigError("grouping by share needs the share behind each record")
    return [DIRECT if share is None else share for share in shares]


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
        left: For a budget with a ρ (zCDP): what one more query may still cost, as the
            rule answers it (`Accountant.remaining`: ε, and ρ left); None otherwise
            (what is left is then the budget less `spent`).
    """

    rule: str
    groups: tuple[str, ...]
    points: tuple[SpendPoint, ...]
    left: Budget | None = None

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
                    points: int = 400, top: int = 8,
                    shares: Sequence[str | None] | None = None,
                    progress: Callable[[int, int | None], object] | None = None) -> Spend:
    """The spend under the ledger's rule after each record, sampled at about ``points``
    records (the rule's total is composed at each; its state is extended at every one).

    Args:
        meta: The ledger's settings.
        records: Its records, in order.
        by: Group charges by ``"label"``, ``"job"`` (see `group_of`) or ``"share"``.
        points: How many points to sample at most.
        top: How many of the largest groups to keep; the rest are `OTHER`.
        shares: With ``by="share"``: the share behind each record (`group_names`).
        progress: Called as ``progress(replayed, total)`` after each sampled point.
    """
    names = group_names(records, by, shares)
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
    parts = [[Fraction(0), Fraction(0)] for _ in groups]
    sampled: list[SpendPoint] = []
    for start in range(0, len(records), step):
        segment = records[start:start + step]
        state = rule.extend_all(state, (record.charge for record in segment))
        for (slot, cost), count in _counted(slots[start:start + step], segment):
            parts[slot][0] += cost.epsilon * count
            parts[slot][1] += cost.delta * count
        last = segment[-1]
        sampled.append(SpendPoint(last.seq, last.timestamp, rule.total(state),
                                  tuple((e, d) for e, d in parts)))
        if progress is not None:
            progress(start + len(segment), len(records))
    left = None
    if meta.budget.rho is not None:
        try:
            left = rule.remaining(state, meta.budget, 1)
        except DPAccountError:  # nothing more fits
            left = Budget(0, 0, rho=0)
    return Spend(name, groups, tuple(sampled), left)


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


def summarize(records: Sequence[LedgerRecord], by: str = "label",
              shares: Sequence[str | None] | None = None) -> list[GroupSummary]:
    """The charges grouped by label, job or share (`group_names`), the largest epsilon
    first."""
    groups: dict[str, list[LedgerRecord]] = {}
    for record, group in zip(records, group_names(records, by, shares), strict=True):
        groups.setdefault(group, []).append(record)
    rows = [
        GroupSummary(group, len(rs), sum((r.cost.epsilon for r in rs), Fraction(0)),
                     sum((r.cost.delta for r in rs), Fraction(0)), rs[0].timestamp,
                     rs[-1].timestamp)
        for group, rs in groups.items()
    ]
    return sorted(rows, key=lambda row: (-row.epsilon, -row.delta, row.group))




# -- shares: who spent a dataset's budget -------------------------------------------------


@attrs.frozen
class ShareAttribution:
    """Which share each of a ledger's records was charged through.

    Attributes:
        paths: Per record, in order: the chain of shares it was charged through (the
            ledger's share first, then the share within it, ...), or ``()`` for a charge
            made to the ledger itself.
        unmatched: Per share, how many of its records have no record in this ledger
            (always 0 for an intact database: a share's charge is recorded in every
            ancestor in one transaction).
    """

    paths: tuple[tuple[str, ...], ...]
    unmatched: Mapping[str, int]

    @property
    def names(self) -> list[str | None]:
        """Per record, its chain of shares as one name (``team-a > team-a/nlp``), or
        None for a charge made directly."""
        return [SHARE_SEPARATOR.join(path) if path else None for path in self.paths]


def _key(record: LedgerRecord) -> tuple[Any, ...]:
    """What a share's record and its ancestor's copy have in common (the cost as
    integers: a Fraction's hash is slow to compute)."""
    cost = record.cost
    return (record.timestamp, record.label, record.query_id, cost.epsilon.numerator,
            cost.epsilon.denominator, cost.delta.numerator, cost.delta.denominator)


#: The exact matching's work bound: it steps through at most this many parent positions
#: per parent record (plus `MATCH_SLACK`), revisits included, before it settles for the
#: greedy match (ties need records equal to the microsecond; see `_embed`).
MATCH_STEPS_PER_RECORD: Final = 4
MATCH_SLACK: Final = 100_000


def _latest(parent: Sequence[Any], child: Sequence[Any]) -> list[int] | None:
    """For each record j of ``child``, the latest position in ``parent`` it can take
    with all of ``child[j:]`` still fitting after it (None: ``child`` is not a
    subsequence of ``parent`` at all)."""
    late = [0] * len(child)
    j = len(child) - 1
    for i in range(len(parent) - 1, -1, -1):
        if j < 0:
            break
        if parent[i] == child[j]:
            late[j] = i
            j -= 1
    return late if j < 0 else None


def _unique(parent: Sequence[Any], where: Mapping[Any, int],
            children: Sequence[Sequence[Any]]) -> list[int] | None:
    """`_embed` where no two parent keys are equal (the usual case: times differ by a
    microsecond at least; ``where`` maps each to its position): each child key has one
    place, which must be free and after the child's previous one. None if one has
    none."""
    owner = [-1] * len(parent)
    for c, child in enumerate(children):
        last = -1
        for key in child:
            i = where.get(key, -1)
            if i <= last or owner[i] != -1:
                return None
            owner[i], last = c, i
    return owner


def _embed(parent: Sequence[Any], children: Sequence[Sequence[Any]]) -> list[int] | None:
    """Which child (an index into ``children``, or -1 for none) each ``parent`` key
    belongs to, such that every child's keys are a subsequence of the parent's at
    positions no other child takes; None if there is no such assignment (or it was not
    found within `MATCH_STEPS_PER_RECORD` steps a parent record, plus `MATCH_SLACK`: the
    work stays linear in the ledger, whatever its ties).

    A depth-first search over the parent's positions: at each, the children whose next
    key it is (then none, a direct charge) are the choices; a choice point is kept only
    where there are several (equal keys: the same microsecond, label, query id and
    cost), and a branch is cut as soon as a child's next key is past the latest
    position where the rest of it could still fit (`_latest`).
    """
    where = {key: i for i, key in enumerate(parent)}
    if len(where) == len(parent):
        return _unique(parent, where, children)
    late = []
    for child in children:
        bound = _latest(parent, child)
        if bound is None:
            return None
        late.append(bound)
    owner = [-1] * len(parent)
    at = [0] * len(children)
    stack: list[tuple[int, list[int], list[int]]] = []  # (position, pointers, choices)
    i, steps = 0, 0
    most = MATCH_STEPS_PER_RECORD * len(parent) + MATCH_SLACK
    while True:
        steps += 1
        if steps > most:
            return None
        dead = any(at[c] < len(child) and i > late[c][at[c]]
                   for c, child in enumerate(children))
        if not dead and i == len(parent):
            return owner
        if not dead:
            choices = [c for c, child in enumerate(children)
                       if at[c] < len(child) and child[at[c]] == parent[i]]
            choices.append(-1)
            if len(choices) > 1:
                stack.append((i, list(at), choices[1:]))
            pick = choices[0]
        else:
            while stack and not stack[-1][2]:
                stack.pop()
            if not stack:
                return None
            i, saved, rest = stack[-1]
            at = list(saved)
            pick = rest.pop(0)
        owner[i] = pick
        if pick >= 0:
            at[pick] += 1
        i += 1


def attribute_shares(name: str, ledgers: Mapping[str, tuple[LedgerMeta,
                                                              Sequence[LedgerRecord]]]
                     ) -> ShareAttribution:
    """For each record of ledger ``name``, the share it was charged through (see the
    module docstring: each share's records are matched, in order, to the ledger's).

    The match is exact: every share's records in order, at positions no other share
    takes (`_embed`). Where there is none (a share's record missing from the ledger: a
    damaged database), each share is matched greedily on its own and its records that
    found no place are counted in `ShareAttribution.unmatched`.

    Args:
        name: The ledger.
        ledgers: Settings and records of ``name`` and of its shares (any other ledgers
            are ignored); a share is a ledger whose ``parent`` is ``name``, and so on
            down.
    """
    children: dict[str, list[str]] = {}
    for other, (meta, _records) in ledgers.items():
        if meta.parent is not None and other != meta.parent:
            children.setdefault(meta.parent, []).append(other)
    done: dict[str, ShareAttribution] = {}

    def attribute(ledger: str, seen: frozenset[str]) -> ShareAttribution:
        if ledger in done:
            return done[ledger]
        records = ledgers[ledger][1]
        paths: list[tuple[str, ...]] = [()] * len(records)
        # a cycle of parents is skipped (stored settings forbid one)
        shares = [child for child in sorted(children.get(ledger, ())) if child not in seen]
        below = [attribute(child, seen | {child}) for child in shares]
        keys = [_key(record) for record in records]
        wanted = [[_key(record) for record in ledgers[child][1]] for child in shares]
        owner = _embed(keys, wanted)
        unmatched: dict[str, int] = {}
        if owner is not None:
            seq = [0] * len(shares)
            for i, c in enumerate(owner):
                if c >= 0:
                    paths[i] = (shares[c], *below[c].paths[seq[c]])
                    seq[c] += 1
            unmatched = dict.fromkeys(shares, 0)
        else:
            taken = [False] * len(records)
            at: dict[tuple[Any, ...], list[int]] = {}
            for i, key in enumerate(keys):
                at.setdefault(key, []).append(i)
            for c, child in enumerate(shares):
                last, missed = -1, 0
                for key, path in zip(wanted[c], below[c].paths, strict=True):
                    match = next((i for i in at.get(key, []) if i > last and not taken[i]),
                                 None)
                    if match is None:
                        missed += 1
                        continue
                    taken[match], paths[match], last = True, (child, *path), match
                unmatched[child] = missed
        done[ledger] = ShareAttribution(tuple(paths), unmatched)
        return done[ledger]

    return attribute(name, frozenset({name}))


@attrs.frozen
class ShareNode:
    """One ledger in the tree of a database's ledgers and their shares.

    Attributes:
        name: The ledger.
        meta: Its settings (``meta.budget`` is what the share may spend).
        records: How many records it holds.
        spent: Its spend under its own rule.
        rule: The rule it was composed under (see `Spend.rule`).
        children: Its shares, by name.
        left: What one more query may cost where the budget has a ρ (`Spend.left`).
    """

    name: str
    meta: LedgerMeta
    records: int
    spent: PrivacyCost
    rule: str
    children: tuple[ShareNode, ...]
    left: Budget | None = None

    def walk(self, depth: int = 0) -> list[tuple[int, ShareNode]]:
        """This node and every share below it, depth first, with their depth."""
        out = [(depth, self)]
        for child in self.children:
            out += child.walk(depth + 1)
        return out


def share_tree(ledgers: Mapping[str, tuple[LedgerMeta, Sequence[LedgerRecord]]]
               ) -> list[ShareNode]:
    """The ledgers as a forest: each ledger under its parent (a parent that is not among
    ``ledgers`` makes its share a root), roots and shares by name."""
    children: dict[str | None, list[str]] = {}
    for name, (meta, _records) in ledgers.items():
        parent = meta.parent if meta.parent in ledgers and meta.parent != name else None
        children.setdefault(parent, []).append(name)

    def node(name: str, seen: frozenset[str]) -> ShareNode:
        meta, records = ledgers[name]
        spend = spend_over_time(meta, records, points=1)
        below = tuple(node(child, seen | {child}) for child in sorted(children.get(name, ()))
                      if child not in seen)
        return ShareNode(name, meta, len(records), spend.spent, spend.rule, below,
                         spend.left)

    return [node(name, frozenset({name})) for name in sorted(children.get(None, ()))]
