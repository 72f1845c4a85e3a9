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

Both use the joint protocol (`dpaccount.accountant.joint`, also as `charge_together`),
which needs all the ledgers in one database (one SQLite file, or one PostgreSQL schema),
or all in memory in one process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dpaccount.accountant import Accountant, charge_jointly
from dpaccount.charges import Charge, Relation
from dpaccount.composition.base import Adaptivity
from dpaccount.costs import Budget
from dpaccount.errors import ConfigError
from dpaccount.keys import LedgerKey
from dpaccount.ledgers import open_ledger
from dpaccount.mechanisms.base import Mechanism
from dpaccount.records import LedgerRecord, check_ledger_name
from dpaccount.storage.memory import MemoryStore

__all__ = ["BlockLedgers", "charge_together", "sub_budget"]


def charge_together(accountants: Sequence[Accountant], charge: Charge | Mechanism, *,
                    label: str | None = None, query_id: str | None = None
                    ) -> list[LedgerRecord]:
    """Charge ``charge`` to every ledger of ``accountants``, all or none, atomically.

    Each ledger decides under its own rule and budget (folding in what other writers
    appended, under the database's lock); the charge is recorded in all of them in one
    transaction only if all admit it. Concurrent writers on other processes or machines
    are serialised by the database as for single charges. This is the joint protocol of
    `dpaccount.accountant.joint`, which a sub-budget's own charges also take.

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
    return charge_jointly(accountants, charge, label=label, query_id=query_id)


def sub_budget(parent: Accountant, name: str, budget: Any, *, rule: str = "basic",
               **options: Any) -> Accountant:
    """A share of an in-memory accountant's budget, in the same process: every charge to
    it also goes to ``parent`` (and its parents), all or nothing. A durable ledger's
    share is made with ``open_ledger(url, name=..., budget=..., parent=...)`` instead,
    which stores the link with the ledger.

    Raises:
        ConfigError: ``parent`` is a durable ledger; ``name`` is not a valid ledger name
            (`dpaccount.records.check_ledger_name`) or is the parent's.
    """
    check_ledger_name(name)
    if name == parent.name:
        raise ConfigError(f"a sub-budget needs a name of its own, not its parent's {name!r}")
    if not isinstance(parent.store, MemoryStore):
        raise ConfigError(
            "a durable ledger's sub-budget is opened with open_ledger(url, name=..., "
            "budget=..., parent=...), so that the link is stored with it"
        )
    child = Accountant(budget, name=name, rule=rule, relation=parent.relation,
                       parent=parent.name, **options)
    child.link_parents([parent, *parent.parents])
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

    Raises:
        ConfigError: ``stream`` is not a valid ledger name (`dpaccount.records.check_ledger_name`);
            a block's name is not a ``str`` without ``/`` that makes a valid ledger name
            with the stream's (checked before its ledger is opened).

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
        check_ledger_name(stream, "stream")
        self.url, self.stream, self.key = url, stream, key
        self.budget = budget_per_block if isinstance(budget_per_block, Budget) else \
            Budget(budget_per_block)
        self.rule, self.relation = rule, relation
        self._open: dict[str, Accountant] = {}

    def ledger(self, block: str) -> Accountant:
        """The accountant of ``block`` (its ledger is created, with a fresh budget, the
        first time the block is charged or asked about)."""
        if type(block) is not str:  # (before it is looked up: a list is not hashable)
            raise ConfigError(f"a block is named by a str, not {type(block).__name__}")
        if block not in self._open:
            if "/" in block:
                raise ConfigError("a block's name cannot hold '/' (it separates the stream "
                                  "from the block in the ledger's name)")
            check_ledger_name(f"{self.stream}/{block}", "block name")
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
