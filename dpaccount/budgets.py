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
Cidon, Geambasu and Lécuyer, OSDI 2021). Each block's budget protects **a record that
lives in one block** (an event). Why it holds: two neighbouring streams differ in one
record, so in one block b, provided a record's block is fixed by something a
neighbouring change does not move (the record's own event time under add/remove, not a
cut every n rows; under substitution, something public such as its arrival: see
``public_blocks``). A query whose window leaves out b does not read b, so its output
distribution is the same on both streams and it costs b nothing; the queries whose
windows include b are exactly those charged to b's ledger. Whether a query's window
includes b is chosen from earlier outputs only, never from b's data, so for b this is
the adaptive composition of its charged queries with a zero charge in between, which
b's rule bounds if it holds for adaptively chosen parameters (a privacy filter: Rogers,
Roth, Ullman and Vadhan 2016, Thm 3.6, for the basic rule; each rule's docstring for the
others). So a block's ledger must use a fully adaptive rule; `BlockLedgers` refuses a
fixed-plan rule.

**A person whose records span blocks** is not covered by adding up the budgets of the
blocks they appear in (the guarantee this module's documentation once gave): their
records may sit in one block (two events in one block: 2 epsilon, not epsilon) and one
query may read several of their blocks at once. `BlockLedgers.unit_guarantee` computes
what such a privacy unit gets, for a declared ``max_blocks_per_unit`` k and
``max_records_per_block`` m, under the blocks' rule: the whole interaction is the
block's guarantee for each of the g = k m records that differ, so group privacy gives
(`dpaccount.composition.groups`): (g epsilon, delta (e^(g eps) - 1) / (e^eps - 1)) for
an (epsilon, delta) block budget under any rule (Dwork and Roth 2014, Thm 2.2; Vadhan
2017, Lemma 2.2); g mu-GDP under ``gdp`` (Dong, Roth and Su 2022, Thm 2.14; for
Gaussians directly: the query's sensitivity is at most g times the record's); g^2
rho-zCDP under ``zcdp`` (Bun and Steinke 2016, Prop. 1.9).

Both use the joint protocol (`dpaccount.accountant.joint`, also as `charge_together`),
which needs all the ledgers in one database (one SQLite file, or one PostgreSQL schema),
or all in memory in one process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import attrs

from dpaccount._numeric import check_count, check_delta, check_float_delta
from dpaccount.accountant import Accountant, charge_jointly
from dpaccount.accountant.settings import ledger_settings
from dpaccount.charges import Charge, Relation
from dpaccount.composition.base import Adaptivity, Rule
from dpaccount.composition.groups import GROUP_THEOREM, group_cost
from dpaccount.composition.zcdp import ZCDPRule, zcdp_conversion
from dpaccount.costs import Budget, PrivacyCost, as_budget
from dpaccount.errors import ConfigError, InvalidCostError
from dpaccount.keys import LedgerKey
from dpaccount.ledgers import open_ledger
from dpaccount.mechanisms.base import Mechanism
from dpaccount.records import LedgerRecord, check_ledger_name
from dpaccount.storage.memory import MemoryStore

__all__ = ["BlockLedgers", "UnitGuarantee", "charge_together", "sub_budget"]


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


@attrs.frozen
class UnitGuarantee:
    """What one privacy unit (a person, say) whose records span blocks gets over the
    stream's whole life, whatever the windows of the queries (see the module docstring).

    Attributes:
        cost: The unit's (epsilon, delta) guarantee, epsilon rounded up.
        group_size: g = max_blocks_per_unit x max_records_per_block, the records of one
            unit that may differ between two streams.
        mu_squared: Under ``gdp``, the unit's mu^2 = g^2 mu_block^2 (it is sqrt of this
            -GDP); None otherwise.
        rho: Under ``zcdp``, the unit's rho = g^2 rho_block (it is rho-zCDP); None
            otherwise.
        theorem: What the bound rests on.
    """

    cost: PrivacyCost
    group_size: int
    mu_squared: Fraction | None
    rho: Fraction | None
    theorem: str


def _unit_guarantee(rule: Rule[Any], budget: Budget, size: int,
                    delta: Any) -> UnitGuarantee:
    """The guarantee of ``size`` records of a block whose ledger runs ``rule`` under
    ``budget`` (group privacy under the rule's own notion where it has one)."""
    if budget.is_unlimited:
        raise ConfigError("an unlimited block budget gives a unit no guarantee; give "
                          "budget_per_block a finite epsilon")
    if isinstance(rule, ZCDPRule):
        rho_block = rule.rho_limit(budget)
        if rho_block is None:
            raise ConfigError("the blocks' zcdp budget has no limit")
        rho = rho_block * size * size
        at = rule.target_delta if delta is None else delta
        return UnitGuarantee(zcdp_conversion(rho, at), size, None, rho,
                             "g^2 rho-zCDP for g records: Bun and Steinke 2016, Prop. "
                             "1.9; conversion Canonne, Kamath and Steinke 2020, Prop. 12")
    if budget.epsilon is None:
        raise ConfigError(f"the {rule.name!r} rule needs an epsilon budget per block")
    from dpaccount.accounting.gdp import GDPFilterRule, gdp_epsilon

    if isinstance(rule, GDPFilterRule):
        # None: not even the smallest mu fits, so the blocks admit no Gaussian at all
        limit = rule.mu_squared_limit(budget.epsilon, budget.delta) or Fraction(0)
        mu_squared = limit * size * size
        at = check_float_delta(check_delta(budget.delta if delta is None else delta))
        if at == 0:
            raise ConfigError("a Gaussian-DP guarantee is stated at a delta > 0")
        epsilon = gdp_epsilon(mu_squared, at) if mu_squared else Fraction(0)
        return UnitGuarantee(PrivacyCost(epsilon, at), size, mu_squared, None,
                             "g mu-GDP for g records: Dong, Roth and Su 2022, Thm 2.14; "
                             "profile Balle and Wang 2018, Thm 8")
    if delta is not None:
        raise ConfigError(f"under the {rule.name!r} rule a unit gets one (epsilon, delta) "
                          "point: delta= is for the gdp and zcdp rules")
    try:
        cost = group_cost(PrivacyCost(budget.epsilon, budget.delta), size)
    except InvalidCostError as exc:
        raise ConfigError(f"a unit of {size} records gets no guarantee: {exc}") from None
    return UnitGuarantee(cost, size, None, None, GROUP_THEOREM)


class BlockLedgers:
    """The blocks of a growing dataset, each with its own ledger and budget; a query over
    a window of blocks is charged to each, all or nothing (see the module docstring for
    the theorem and the privacy unit: a record in one block).

    Args:
        url: The database (every block is a ledger in it).
        stream: The dataset's name; block ``b`` is the ledger ``f"{stream}/{b}"``.
        budget_per_block: The budget each new block starts with.
        rule: A fully adaptive rule (``"basic"`` by default; ``"filter"``, ``"rdp"``,
            ``"gdp"`` and ``"zcdp"`` also qualify).
        relation: The neighbouring relation of every charge.
        key: A keyed ledger's key (default: from the environment).
        rule_options: Further keyword arguments for the blocks' rule (a target delta).
        max_blocks_per_unit: For a privacy unit whose records span blocks (a person): at
            most how many blocks hold its records. Declared with
            ``max_records_per_block``; then `unit_guarantee` says what a unit gets.
        max_records_per_block: At most how many records of one unit a block holds.
        unit_budget: What a unit may lose over the stream's whole life; refused at once
            (`ConfigError`) if `unit_guarantee` is over it (needs the two bounds above).
        public_blocks: The caller's declaration that each record's block is fixed by
            something public that a neighbouring change does not move (its arrival
            time). Required under substitution: a substituted record whose block
            followed its contents could move to another block and change two.

    Raises:
        ConfigError: ``stream`` is not a valid ledger name (`dpaccount.records.check_ledger_name`);
            a block's name is not a ``str`` without ``/`` that makes a valid ledger name
            with the stream's (checked before its ledger is opened); substitution without
            ``public_blocks``; only one of the unit's two bounds; a unit guarantee over
            ``unit_budget``.

    Examples:
        >>> from dpaccount import PrivacyCost
        >>> blocks = BlockLedgers("memory://", "events", budget_per_block=1)
        >>> [r.seq for r in blocks.charge(PrivacyCost("0.5"), ["2026-11-23", "2026-11-24"])]
        [0, 0]
        >>> blocks.remaining("2026-11-24").epsilon, blocks.remaining("2026-11-25").epsilon
        (Fraction(1, 2), Fraction(1, 1))
        >>> blocks.close()

        A person with at most 2 events a day on at most 3 days loses at most 6 epsilon:

        >>> people = BlockLedgers("memory://", "visits", budget_per_block=Budget("0.1"),
        ...                       max_blocks_per_unit=3, max_records_per_block=2)
        >>> people.unit_guarantee().cost
        PrivacyCost(epsilon=0.6, delta=0)
    """

    def __init__(self, url: str, stream: str, *, budget_per_block: Any, rule: str = "basic",
                 relation: Relation | str = Relation.ADD_REMOVE,
                 key: LedgerKey | None = None, rule_options: Mapping[str, Any] | None = None,
                 max_blocks_per_unit: int | None = None,
                 max_records_per_block: int | None = None, unit_budget: Any = None,
                 public_blocks: bool = False) -> None:
        check_ledger_name(stream, "stream")
        self.url, self.stream, self.key = url, stream, key
        self.budget = as_budget(budget_per_block)
        self.rule, self.relation = rule, relation
        self.rule_options = dict(rule_options or {})
        self._open: dict[str, Accountant] = {}
        self._block_rule: Rule[Any] | None = None
        if type(public_blocks) is not bool:
            raise ConfigError("public_blocks is a declaration: True or False")
        self.public_blocks = public_blocks
        if relation in (Relation.SUBSTITUTION, "substitution") and not public_blocks:
            raise ConfigError(
                "under substitution a record's block must be fixed by something public "
                "that a substitution does not change (its arrival, not its contents): "
                "declare it with public_blocks=True, or use add_remove"
            )
        if (max_blocks_per_unit is None) != (max_records_per_block is None):
            raise ConfigError("declare both max_blocks_per_unit and max_records_per_block "
                              "(a unit's records may sit in one block)")
        self.max_blocks_per_unit = None if max_blocks_per_unit is None else check_count(
            max_blocks_per_unit, "max_blocks_per_unit")
        self.max_records_per_block = None if max_records_per_block is None else check_count(
            max_records_per_block, "max_records_per_block")
        self.unit_budget = None if unit_budget is None else as_budget(unit_budget)
        if self.unit_budget is not None:
            self._check_unit_budget(self.unit_budget)

    @staticmethod
    def _check_adaptive(rule: Rule[Any]) -> None:
        if rule.adaptivity is not Adaptivity.FULLY_ADAPTIVE:
            raise ConfigError(
                f"rule {rule.name!r} is not proven for adaptively chosen "
                "parameters; which queries touch a block is chosen at run time, so "
                "block ledgers need a fully adaptive rule (basic, filter, rdp, gdp, zcdp)"
            )

    def block_rule(self) -> Rule[Any]:
        """The rule every block's ledger runs (built as an accountant builds it).

        Raises:
            ConfigError: The rule, its options or the budget are refused, or the rule is
                not fully adaptive.
        """
        if self._block_rule is None:
            rule, _meta = ledger_settings(self.stream, self.budget, self.rule, self.relation,
                                          None, self.rule_options, None)
            self._check_adaptive(rule)
            self._block_rule = rule
        return self._block_rule

    def unit_guarantee(self, delta: Any = None) -> UnitGuarantee:
        """What one privacy unit gets over the stream's whole life: its records in at most
        ``max_blocks_per_unit`` blocks, at most ``max_records_per_block`` in each, and
        every block at most at its budget, whatever windows the queries take.

        Args:
            delta: Under ``gdp`` and ``zcdp``, the delta at which epsilon is stated
                (default the blocks' target delta); the other rules give one point.

        Raises:
            ConfigError: The two bounds were not declared; an unlimited block budget;
                the group's delta reaches 1.

        Examples:
            >>> blocks = BlockLedgers("memory://", "s", budget_per_block=(3, "1e-6"),
            ...                       rule="gdp", max_blocks_per_unit=2,
            ...                       max_records_per_block=1)
            >>> unit = blocks.unit_guarantee(delta="2e-6")   # not (6, 2e-6): more
            >>> unit.group_size, float(unit.cost.epsilon) > 6
            (2, True)
        """
        if self.max_blocks_per_unit is None or self.max_records_per_block is None:
            raise ConfigError("declare max_blocks_per_unit and max_records_per_block to "
                              "compute what a unit whose records span blocks gets")
        size = self.max_blocks_per_unit * self.max_records_per_block
        return _unit_guarantee(self.block_rule(), self.budget, size,
                               None if delta is None else check_delta(delta))

    def _check_unit_budget(self, unit_budget: Budget) -> None:
        if self.max_blocks_per_unit is None:
            raise ConfigError("a unit budget needs max_blocks_per_unit and "
                              "max_records_per_block")
        curve = isinstance(self.block_rule(), ZCDPRule) or self.block_rule().name == "gdp"
        if unit_budget.rho is not None and not isinstance(self.block_rule(), ZCDPRule):
            raise ConfigError("a unit budget in rho needs blocks under the zcdp rule")
        if curve and unit_budget.delta == 0 and unit_budget.rho is None:
            raise ConfigError("under gdp and zcdp a unit budget needs a delta > 0")
        unit = self.unit_guarantee(unit_budget.delta if curve and unit_budget.delta else None)
        fits = unit.cost.fits(unit_budget) if unit_budget.epsilon is not None else True
        if unit_budget.rho is not None:
            fits = fits and unit.rho is not None and unit.rho <= unit_budget.rho
        if not fits:
            raise ConfigError(
                f"a unit with records in {self.max_blocks_per_unit} blocks, "
                f"{self.max_records_per_block} in each, could lose {unit.cost}"
                f"{'' if unit.rho is None else f' (rho {float(unit.rho):.6g})'} over the "
                f"stream's life, more than the unit budget {unit_budget}; lower "
                "budget_per_block or the bounds"
            )

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
                               rule=self.rule, relation=self.relation, key=self.key,
                               rule_options=self.rule_options or None)
            try:
                self._check_adaptive(acct.rule)
            except ConfigError:
                acct.close()
                raise
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
        return self.ledger(block).remaining

    def close(self) -> None:
        """Close every block's ledger."""
        for acct in self._open.values():
            acct.close()
        self._open.clear()

    def __enter__(self) -> BlockLedgers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
