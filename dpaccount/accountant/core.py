"""The Accountant: the user's handle on a ledger, its reading API and its guard."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import attrs

from dpaccount._numeric import check_count
from dpaccount.accountant.joint import charge_jointly
from dpaccount.accountant.ledger import Ledger
from dpaccount.accountant.logs import log_admitted, log_duplicate, log_refused
from dpaccount.accountant.settings import check_text, revalidate
from dpaccount.charges import Charge, Relation, Repeated, cost_of
from dpaccount.composition import Rule, max_queries
from dpaccount.composition.base import SpentMeaning
from dpaccount.costs import Budget, PrivacyCost, RemainingBudget
from dpaccount.errors import (
    BudgetExceededError,
    ConfigError,
    DuplicateQueryError,
    InvalidCostError,
)
from dpaccount.mechanisms.base import Mechanism
from dpaccount.records import LedgerRecord
from dpaccount.storage.base import Store

__all__ = ["Accountant", "ChargePreview"]

F = TypeVar("F", bound=Callable[..., Any])
_log = logging.getLogger(__name__)
#: ``_log.isEnabledFor`` and INFO, looked up once (the charge path asks on every charge).
_enabled, _INFO = _log.isEnabledFor, logging.INFO

#: The largest count max_queries searches when the rule alone sets no limit.
_MAX_QUERIES_SEARCH = 10**12


@attrs.frozen
class ChargePreview:
    """What a charge would do to a ledger (`Accountant.preview`); nothing was recorded.

    Attributes:
        cost: The charge's own (epsilon, delta).
        admitted: Whether the ledger would take it now.
        spent: The ledger's composed total before it.
        spent_after: The composed total with it (None when its delta would reach 1).
        budget: The ledger's budget.
        rule: The rule that decides.
    """

    cost: PrivacyCost
    admitted: bool
    spent: PrivacyCost
    spent_after: PrivacyCost | None
    budget: Budget
    rule: str


class Accountant(Ledger):
    """A privacy-budget ledger that checks and records each charge in one atomic step.

    A charge is admitted only if the composed total, under the accountant's rule, stays
    within the budget; otherwise `BudgetExceededError` is raised
    and nothing changes. The running state of the rule is kept, so a charge costs O(1)
    whatever the ledger's length. The default rule, ``"basic"``, is valid even when each
    query's epsilon and delta are chosen at run time (Rogers, Roth, Ullman and Vadhan
    2016, Thm 3.6).

    Args:
        budget: The total budget: a `Budget`, a number (epsilon only) or an
            ``(epsilon, delta)`` tuple.
        rule: A rule name (``"basic"`` and those in `dpaccount.composition.RULES`)
            or a `Rule`.
        store: Where records live; an in-memory store by default.
        relation: The neighbouring relation all charges are stated for.
        name: The ledger's name (stored with it).
        plan: A declared plan, required by fixed-plan rules.
        rule_options: Further keyword arguments for the rule.
        dataset_size: The number of records n, if known. Then a charge that would take
            the total delta to 1/n or more is refused, and a budget whose delta is at
            least 1/n gives a `DeltaWarning` (delta must be
            much smaller than 1/n: see the catastrophe mechanism in the docs).
        parent: For a sub-budget, the parent ledger's name (stored with the ledger; see
            `dpaccount.budgets`). `dpaccount.open_ledger` links the accountant to its
            parents, so that every charge goes to all of them or to none.

    Raises:
        ConfigError: Unknown rule, a store whose ledger was created with another budget,
            rule or relation; a ``name`` or ``parent`` that is not a valid ledger name
            (`dpaccount.records.check_ledger_name`).
        InvalidCostError: An invalid budget.
    """

    def __init__(
        self,
        budget: Any,
        *,
        rule: str | Rule[Any] = "basic",
        store: Store | None = None,
        relation: Relation | str = Relation.ADD_REMOVE,
        name: str = "default",
        plan: Any = None,
        rule_options: Mapping[str, Any] | None = None,
        dataset_size: int | None = None,
        parent: str | None = None,
    ) -> None:
        #: The ledgers a sub-budget's charges also go to (`link_parents`).
        self._parents: list[Accountant] = []
        super().__init__(budget, rule=rule, store=store, relation=relation, name=name,
                         plan=plan, rule_options=rule_options, dataset_size=dataset_size,
                         parent=parent, stacklevel=3)

    # -- sub-budgets ----------------------------------------------------------------

    @property
    def parents(self) -> tuple[Accountant, ...]:
        """The ledgers every charge to this one also goes to (a sub-budget's ancestors,
        nearest first); empty for a ledger of its own."""
        return tuple(self._parents)

    def link_parents(self, parents: Sequence[Accountant]) -> None:
        """Make every later charge to this ledger go to ``parents`` too, all or nothing
        (`dpaccount.open_ledger` and `dpaccount.budgets.sub_budget` do this for a
        sub-budget; closing this accountant closes them).

        Raises:
            ConfigError: A parent is this ledger, or the ledgers are not in one database
                (checked at the first charge).
        """
        if any(parent is self for parent in parents):
            raise ConfigError(f"ledger {self.name!r} cannot be its own parent")
        self._parents = list(parents)

    # -- reading --------------------------------------------------------------------

    @property
    def spent_meaning(self) -> SpentMeaning:
        """What `spent` is a guarantee of under this ledger's rule."""
        return self._rule.spent_meaning

    @property
    def spent(self) -> PrivacyCost:
        """The composed total of every recorded charge under the rule.

        What it is a guarantee of depends on the rule (`spent_meaning`): for a
        privacy filter, the value it certifies against its finite budget; for ``basic``
        the exact sums; for a fixed-plan rule the bound for the declared plan.
        """
        with self._lock:
            self.refresh()
            return self._rule.total(self._state)

    @property
    def records(self) -> Sequence[LedgerRecord]:
        """Every recorded charge, in order."""
        with self._lock:
            self.refresh()
            return self._store.read()

    @property
    def remaining(self) -> RemainingBudget:
        """What is left: the largest cost one more query may have now (a `Budget`, read
        like `spent`; ``remaining_for(k)`` splits it over k queries).

        Calling it, ``acct.remaining()`` or ``acct.remaining(k)``, is the method it used
        to be: it still works, with a `DeprecationWarning`
        (`dpaccount.costs.RemainingBudget`).

        Examples:
            >>> acct = Accountant((1, "1e-6"))
            >>> acct.remaining
            Budget(epsilon=1, delta=1e-06)
        """
        return RemainingBudget.of(self.remaining_for(1), self.remaining_for)

    def remaining_for(self, k: int) -> Budget:
        """The largest per-query cost such that ``k`` more equal queries fit.

        For the basic rule this is exact: (budget - spent) / k in each coordinate. Other
        rules solve their own inverse and err toward privacy.

        Raises:
            InvalidCostError: ``k`` is not a positive integer.

        Examples:
            >>> acct = Accountant((1, "1e-6"))
            >>> acct.remaining_for(4)
            Budget(epsilon=0.25, delta=2.5e-07)
        """
        k = check_count(k, "k")
        with self._lock:
            self.refresh()
            return self._rule.remaining(self._state, self._budget, k)

    def preview(self, charge: Charge | Mechanism) -> ChargePreview:
        """What charging ``charge`` now would do, without recording anything.

        The same checks as `charge()` (type, relation), the ledger caught up with
        other writers, then the rule's decision and totals: the cost of the charge, the
        total spent before and after it, and whether it would be admitted.

        Examples:
            >>> acct = Accountant(1)
            >>> p = acct.preview(PrivacyCost("0.75"))
            >>> p.admitted, p.spent_after
            (True, PrivacyCost(epsilon=0.75, delta=0))
            >>> acct.records, acct.preview(PrivacyCost(2)).admitted
            ((), False)
        """
        charge = self.as_charge(charge)
        cost = cost_of(charge)
        revalidate(cost)
        with self._lock:
            self.refresh()
            new_state = self._rule.extend(self._state, charge)
            admitted = self.admits(new_state)
            try:
                after: PrivacyCost | None = self._rule.total(new_state)
            except InvalidCostError:  # the composed delta would reach 1
                after = None
            return ChargePreview(cost, admitted, self._rule.total(self._state), after,
                                 self._budget, self._rule.name)

    def can_afford(self, charge: Charge | Mechanism) -> bool:
        """Whether ``charge`` would be admitted now (nothing is recorded)."""
        charge = self.as_charge(charge)
        with self._lock:
            self.refresh()
            return self.admits(self._rule.extend(self._state, charge))

    def max_queries(self, charge: Charge | Mechanism) -> int | None:
        """How many more charges of ``charge`` would be admitted now (nothing is recorded).

        Returns:
            The count, or None when more than 10**12 fit (e.g. a zero cost).

        Examples:
            >>> Accountant(1).max_queries(PrivacyCost("0.3"))
            3
            >>> Accountant((1, "1e-5"), rule="filter").max_queries(PrivacyCost("0.01"))
            393
        """
        charge = self.as_charge(charge)
        with self._lock:
            self.refresh()
            state = self._state
            found = max_queries(self._rule, state, self._budget, charge)
            if self._delta_cap is None or cost_of(charge).delta == 0:
                return found
            # Shrink to the largest count whose total delta stays below 1/n.
            lo, hi = 0, (found if found is not None else _MAX_QUERIES_SEARCH)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self.admits(self._rule.extend(state, Repeated(charge, mid))):
                    lo = mid
                else:
                    hi = mid - 1
            return lo

    # -- charging -------------------------------------------------------------------

    def charge(
        self,
        charge: Charge | Mechanism,
        *,
        label: str | None = None,
        query_id: str | None = None,
    ) -> LedgerRecord:
        """Check a charge against the budget and record it, as one atomic step.

        A sub-budget's charge goes to it and to every ancestor (`parents`), each deciding
        under its own rule and budget, all or nothing (`dpaccount.accountant.joint`).

        Args:
            charge: A `PrivacyCost`, a charge from `dpaccount.charges`, or a
                mechanism (its ``.charge`` is used).
            label: A label stored with the record.
            query_id: An idempotency key: a second charge with the same key is refused
                with `DuplicateQueryError` (it never charges
                twice, and the query must not be re-run for fresh noise).

        Returns:
            The stored record (``.seq``, ``.label``, ``.cost``, ``.timestamp``).

        Raises:
            BudgetExceededError: The total would exceed the budget; nothing changed.
            UnsupportedChargeError: The rule or relation cannot compose this charge.
            InvalidCostError: The charge is not a valid charge.
            ReadOnlyLedgerError: The ledger was opened read-only; nothing was recorded.
            StorageError: The store failed; nothing was recorded (fail closed).
        """
        if self._parents:
            return charge_jointly([self, *self._parents], charge, label=label,
                                  query_id=query_id)[0]
        charge = self.as_charge(charge)
        cost = cost_of(charge)
        revalidate(cost)
        check_text(label, "label")
        check_text(query_id, "query_id")
        try:
            if not _enabled(_INFO):  # nobody listens at INFO: nothing is built
                return self.append(charge, cost, label, query_id)
            with self._lock:  # the record states this ledger's totals with this charge
                record = self.append(charge, cost, label, query_id)
                log_admitted(_log, (self,), (record,))
            return record
        except BudgetExceededError as error:
            log_refused(_log, (self,), error, label, query_id, charge)
            raise
        except DuplicateQueryError as error:
            log_duplicate(_log, (self,), error, label)
            raise

    # -- wrapping user code ---------------------------------------------------------

    def guard(
        self,
        mechanism: Mechanism,
        *,
        label: str | None = None,
        query_id: str | Callable[..., str] | None = None,
        public_index: Any = None,
        public_columns: Any = None,
    ) -> Callable[[F], F]:
        """Decorate a query: charge first, run it only if admitted, then add noise.

        Only noised numbers are released; labels come back only when declared with
        ``public_index=`` (and ``public_columns=``). See `dpaccount.guard.guard()` for
        the full contract (sync and async, ``query_id``, declared labels).
        """
        from dpaccount.guard import guard

        return guard(self, mechanism, label=label, query_id=query_id,
                     public_index=public_index, public_columns=public_columns)

    def run(self, mechanism: Mechanism, query: Callable[..., Any], /, *args: Any,
            **kwargs: Any) -> Any:
        """Charge ``mechanism``, then run ``query(*args, **kwargs)`` and release its result.

        ``query_id=``, ``label=``, ``public_index=`` and ``public_columns=`` are taken by
        ``run`` itself (not passed to the query). See `dpaccount.guard.run()`.
        """
        from dpaccount.guard import run

        return run(self, mechanism, query, *args, **kwargs)

    # -- closing ----------------------------------------------------------------------

    def close(self) -> None:
        """Close the store (its database connection) and those of its `parents`; reads
        and charges then fail.

        A durable ledger first stores a snapshot of the rule's state if more than a few
        records were added since the last one, so the next open starts from here.
        """
        super().close()
        for parent in self._parents:
            parent.close()

    def __enter__(self) -> Accountant:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Accountant(budget={self._budget!r}, rule={self._rule.name!r}, "
            f"spent={self._spent_text()}, records={self._head})"
        )
