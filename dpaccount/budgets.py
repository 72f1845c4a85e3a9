"""Budgets over teams and time: one charge to several ledgers, all or nothing.

**Sub-budgets.** A ledger may be a share of another's budget (``open_ledger(url,
name="census/team-a", budget=..., parent="census")``): its parent is stored with it, and
every charge to it is checked against it *and* every ancestor, each under its own rule
and budget, and recorded in all of them in one transaction (or in none). The guarantee
for the dataset is the root's: the root records every charge made through any of its
descendants, and its rule composes them as for any other ledger. A share is an
administrative quota on top of that: shares may add up to more than the parent's budget
(the parent still refuses what would take it over).

**Data that keeps arriving** (`BlockLedgers`): each block of a growing dataset (a day of
events, say) has its own ledger and budget; a query over a window of blocks is charged
to every block of the window, all or nothing, and a new block comes with a fresh budget.
This is block composition as in Sage (Lécuyer, Spahn, Vodrahalli, Geambasu and Hsu,
SOSP 2019, §4, "block composition") and PrivateKube's privacy blocks (Luo, Pan, Tholoniat,
Cidon, Geambasu and Lécuyer, OSDI 2021). The privacy unit is **a record that lives in
exactly one block** (an event, not a user whose events span blocks). Why it holds: two
neighbouring streams differ in one record, so in one block b. A query whose window leaves
out b does not read b, so its output distribution is the same on both streams and it
costs b nothing; the queries whose windows include b are exactly those charged to b's
ledger. Whether a query's window includes b is chosen from earlier outputs only, never
from b's data, so for b this is the adaptive composition of its charged queries with a
zero charge in between, which b's rule bounds if it holds for adaptively chosen
parameters (a privacy filter: Rogers, Roth, Ullman and Vadhan 2016, Thm 3.6, for the
basic rule; each rule's docstring for the others). So a block's ledger must use a fully
adaptive rule; `BlockLedgers` refuses a fixed-plan rule.

Both use `charge_together`, which needs all the ledgers in one database (one SQLite file,
or one PostgreSQL schema), or all in memory in one process.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from dpaccount.accountant import Accountant, _revalidate, check_text
from dpaccount.charges import Charge, Relation, cost_of
from dpaccount.composition.base import Adaptivity
from dpaccount.costs import Budget
from dpaccount.errors import (
    BudgetExceededError,
    ConfigError,
    LedgerConflictError,
    LedgerCorruptError,
    ReadOnlyLedgerError,
)
from dpaccount.keys import LedgerKey
from dpaccount.mechanisms.base import Mechanism
from dpaccount.records import LedgerRecord
from dpaccount.storage.base import GroupAppend
from dpaccount.storage.memory import MemoryStore

__all__ = ["BlockLedgers", "charge_together", "sub_budget"]

#: How many ancestors a sub-budget may have (a cycle in stored parents is corruption).
MAX_DEPTH = 32


def _database(acct: Accountant) -> tuple[Any, ...]:
    store: Any = acct.store
    if isinstance(store, MemoryStore):
        return ("memory",)
    path = getattr(store, "path", None)
    if path is not None:
        return ("sqlite", os.path.realpath(path))
    return ("postgresql", getattr(store, "_conninfo", None), getattr(store, "schema", None))


def charge_together(accountants: Sequence[Accountant], charge: Charge | Mechanism, *,
                    label: str | None = None, query_id: str | None = None
                    ) -> list[LedgerRecord]:
    """Charge ``charge`` to every ledger of ``accountants``, all or none, atomically.

    Each ledger decides under its own rule and budget (folding in what other writers
    appended, under the database's lock); the charge is recorded in all of them in one
    transaction only if all admit it. Concurrent writers on other processes or machines
    are serialised by the database as for single charges.

    Returns:
        The stored records, one per accountant, in the order given.

    Raises:
        BudgetExceededError: A ledger would go over its budget (``.ledger`` names it);
            nothing was recorded anywhere.
        ConfigError: The ledgers are not in one database, or the same ledger twice.
        DuplicateQueryError: ``query_id`` is already recorded in one of them.
        ReadOnlyLedgerError: One was opened read-only.
    """
    if not accountants:
        raise ConfigError("charge_together needs at least one ledger")
    names = [acct._meta.name for acct in accountants]
    if len(set(names)) != len(names):
        raise ConfigError(f"the same ledger appears twice in {names}")
    databases = {_database(acct) for acct in accountants}
    if len(databases) != 1:
        raise ConfigError(
            f"ledgers {names} are not in one database: a charge to several ledgers is "
            "atomic only within one SQLite file, one PostgreSQL schema or one process"
        )
    for acct in accountants:
        if acct._read_only:
            raise ReadOnlyLedgerError(f"ledger {acct._meta.name!r} was opened read-only; "
                                      "nothing was charged")
    charges = [acct._as_charge(charge) for acct in accountants]
    cost = cost_of(charges[0])
    _revalidate(cost)
    check_text(label, "label")
    check_text(query_id, "query_id")
    ordered = sorted(accountants, key=lambda a: a._meta.name)
    for acct in ordered:
        acct._lock.acquire()
    try:
        return _charge_locked(accountants, charges, label, query_id)
    finally:
        for acct in reversed(ordered):
            acct._lock.release()


def _charge_locked(accountants: Sequence[Accountant], charges: list[Charge],
                   label: str | None, query_id: str | None) -> list[LedgerRecord]:
    """One decision and append for all (no lost race to retry: the store decides under
    its lock with what other writers appended, as `DecidingStore` does)."""
    now = datetime.now(UTC)
    for acct in accountants:
        acct._catch_up()
        if query_id is not None:
            acct._refuse_duplicate(query_id)
    records = [
        LedgerRecord(seq=acct._head, label=label, charge=c, cost=cost_of(c),
                     rule=acct.rule.name, timestamp=now, query_id=query_id)
        for acct, c in zip(accountants, charges, strict=True)
    ]
    seen: list[dict[str, Any]] = [{} for _ in accountants]
    if isinstance(accountants[0].store, MemoryStore):
        admitted = all([acct._decider(c, box)(())
                        for acct, c, box in zip(accountants, charges, seen, strict=True)])
        if admitted:
            for acct, record in zip(accountants, records, strict=True):
                acct.store.append(acct._head, record)
        seqs = [acct._head for acct in accountants]
    else:
        store: Any = accountants[0].store
        parts = [GroupAppend(acct._meta.name, acct._head, record,
                             getattr(acct.store, "_meta_text", None), acct._decider(c, box),
                             getattr(acct.store, "seen_tip", None))
                 for acct, record, c, box in zip(accountants, records, charges, seen,
                                                 strict=True)]
        try:
            results = store.append_group(parts)
        except LedgerConflictError:
            for acct in accountants:
                acct._catch_up()
                if query_id is not None:
                    acct._refuse_duplicate(query_id)
            raise
        admitted = all(result.appended for result in results)
        seqs = [result.seq for result in results]
        for acct, info in zip(accountants, seen, strict=True):
            acct._state, acct._head = info["state"], info["head"]
    if not admitted:
        for acct, info, charge in zip(accountants, seen, charges, strict=True):
            if not info["fits"]:
                if not acct.rule.admits(info["new_state"], acct.budget):
                    refusal = acct._refusal(cost_of(charge), info["new_state"])
                    raise BudgetExceededError(
                        refusal.requested, refusal.spent, refusal.budget,
                        refusal.would_be, refusal.rule, ledger=acct._meta.name,
                    )
                acct._refuse_large_delta(cost_of(charge), info["new_state"])
        raise LedgerCorruptError("a ledger refused a charge that its decision admitted")
    out = []
    for acct, info, record, seq in zip(accountants, seen, records, seqs, strict=True):
        if seq != acct._head:
            raise LedgerCorruptError(
                f"ledger {acct._meta.name!r} appended at {seq}, after reporting "
                f"{acct._head} records", seq=seq)
        acct._state = info["new_state"]
        acct._head += 1
        acct._maybe_snapshot()
        out.append(record if record.seq == seq else _renumbered(record, seq))
    return out


def _renumbered(record: LedgerRecord, seq: int) -> LedgerRecord:
    import attrs

    return attrs.evolve(record, seq=seq)


def link_parents(acct: Accountant, url: str, key: LedgerKey | None) -> None:
    """Open a sub-budget's ancestors (by name, from the same database) and link them to
    ``acct``, so that its charges go to all of them or to none.

    Raises:
        LedgerCorruptError: The stored parents form a cycle or a chain longer than
            `MAX_DEPTH`.
        ConfigError: A parent does not exist.
    """
    from dpaccount.ledgers import open_ledger

    seen = {acct._meta.name}
    parent = acct._meta.parent
    try:
        while parent is not None:
            if parent in seen or len(seen) > MAX_DEPTH:
                raise LedgerCorruptError(
                    f"ledger {acct._meta.name!r}'s parents form a cycle or a chain longer "
                    f"than {MAX_DEPTH} ({sorted(seen)})")
            seen.add(parent)
            ancestor = open_ledger(url, name=parent, key=key, read_only=acct._read_only)
            acct._linked.append(ancestor)
            parent = ancestor._meta.parent
    except BaseException:
        for ancestor in acct._linked:
            ancestor.close()
        acct._linked.clear()
        raise


def sub_budget(parent: Accountant, name: str, budget: Any, *, rule: str = "basic",
               **options: Any) -> Accountant:
    """A share of an in-memory accountant's budget, in the same process: every charge to
    it also goes to ``parent`` (and its parents), all or nothing. A durable ledger's
    share is made with ``open_ledger(url, name=..., budget=..., parent=...)`` instead,
    which stores the link with the ledger.

    Raises:
        ConfigError: ``parent`` is a durable ledger.
    """
    if not isinstance(parent.store, MemoryStore):
        raise ConfigError(
            "a durable ledger's sub-budget is opened with open_ledger(url, name=..., "
            "budget=..., parent=...), so that the link is stored with it"
        )
    child = Accountant(budget, name=name, rule=rule, relation=parent.relation,
                       parent=parent._meta.name, **options)
    child._linked = [parent, *parent._linked]
    return child


class BlockLedgers:
    """The blocks of a growing dataset, each with its own ledger and budget; a query over
    a window of blocks is charged to each, all or nothing (see the module docstring for
    the theorem and the privacy unit: a record in one block).

    Args:
        url: The database (every block is a ledger in it).
        stream: The dataset's name; block ``b`` is the ledger ``f"{stream}/{b}"``.
        budget_per_block: The budget each new block starts with.
        rule: A fully adaptive rule (``"basic"`` by default; ``"filter"``, ``"rdp"`` and
            ``"gdp"`` also qualify).
        relation: The neighbouring relation of every charge.
        key: A keyed ledger's key (default: from the environment).

    Examples:
        >>> from dpaccount import PrivacyCost
        >>> blocks = BlockLedgers("memory://", "events", budget_per_block=1)
        >>> [r.seq for r in blocks.charge(PrivacyCost("0.5"), ["2026-11-23", "2026-11-24"])]
        [0, 0]
        >>> blocks.remaining("2026-11-24").epsilon, blocks.remaining("2026-11-25").epsilon
        (Fraction(1, 2), Fraction(1, 1))
        >>> blocks.close()
    """

    def __init__(self, url: str, stream: str, *, budget_per_block: Any, rule: str = "basic",
                 relation: Relation | str = Relation.ADD_REMOVE,
                 key: LedgerKey | None = None) -> None:
        if not isinstance(stream, str) or not stream:
            raise ConfigError("a block stream needs a non-empty name")
        self.url, self.stream, self.key = url, stream, key
        self.budget = budget_per_block if isinstance(budget_per_block, Budget) else \
            Budget(budget_per_block)
        self.rule, self.relation = rule, relation
        self._open: dict[str, Accountant] = {}

    def ledger(self, block: str) -> Accountant:
        """The accountant of ``block`` (its ledger is created, with a fresh budget, the
        first time the block is charged or asked about)."""
        if block not in self._open:
            from dpaccount.ledgers import open_ledger

            if not isinstance(block, str) or not block:
                raise ConfigError(f"a block is named by a non-empty string, not {block!r}")
            acct = open_ledger(self.url, name=f"{self.stream}/{block}", budget=self.budget,
                               rule=self.rule, relation=self.relation, key=self.key)
            if acct.rule.adaptivity is not Adaptivity.FULLY_ADAPTIVE:
                acct.close()
                raise ConfigError(
                    f"rule {acct.rule.name!r} is not proven for adaptively chosen "
                    "parameters; which queries touch a block is chosen at run time, so "
                    "block ledgers need a fully adaptive rule (basic, filter, rdp, gdp)"
                )
            self._open[block] = acct
        return self._open[block]

    def charge(self, charge: Charge | Mechanism, window: Sequence[str], *,
               label: str | None = None, query_id: str | None = None) -> list[LedgerRecord]:
        """Charge a query over the blocks of ``window`` to each of them, all or nothing.

        Raises:
            BudgetExceededError: A block's budget would be exceeded (``.ledger`` names
                it); nothing was recorded in any block.
        """
        blocks = list(dict.fromkeys(window))
        if not blocks:
            raise ConfigError("a window needs at least one block")
        return charge_together([self.ledger(b) for b in blocks], charge, label=label,
                               query_id=query_id)

    def remaining(self, block: str) -> Budget:
        """What ``block`` has left (a new block has its whole budget)."""
        return self.ledger(block).remaining()

    def close(self) -> None:
        """Close every block's ledger."""
        for acct in self._open.values():
            acct.close()
        self._open.clear()

    def __enter__(self) -> BlockLedgers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
