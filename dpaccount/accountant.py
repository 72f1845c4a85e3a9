"""The Accountant: a budget ledger that refuses a charge before the query runs.

Examples:
    >>> acct = Accountant(Budget(1))
    >>> acct.charge(PrivacyCost("0.75"), label="count").seq
    0
    >>> acct.spent
    PrivacyCost(epsilon=0.75, delta=0)
    >>> acct.charge(PrivacyCost("0.5"))
    Traceback (most recent call last):
    ...
    dpaccount.errors.BudgetExceededError: refused: this charge costs (ε=0.5, δ=0); ...
    >>> acct.remaining()
    Budget(epsilon=0.25, delta=0)
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any, TypeVar

import attrs

from dpaccount._numeric import check_count
from dpaccount.charges import CHARGE_TYPES, Charge, Relation, Repeated, check_relations, cost_of
from dpaccount.composition import RELATION_RULES, BasicRule, Rule, make_rule, max_queries
from dpaccount.composition.base import SpentMeaning
from dpaccount.composition.states import decode_state, encode_state
from dpaccount.costs import Budget, PrivacyCost, format_number
from dpaccount.errors import (
    BudgetExceededError,
    ConfigError,
    DeltaWarning,
    DPAccountError,
    DuplicateQueryError,
    InvalidCostError,
    LedgerConflictError,
    LedgerCorruptError,
    ReadOnlyLedgerError,
    StorageError,
)
from dpaccount.mechanisms.base import Mechanism
from dpaccount.records import LedgerMeta, LedgerRecord, check_ledger_name
from dpaccount.storage._sql import snapshot_settings
from dpaccount.storage.base import DecidingStore, Store, SumLimitedStore
from dpaccount.storage.memory import MemoryStore

__all__ = ["Accountant", "ChargePreview", "ledger_settings"]

F = TypeVar("F", bound=Callable[..., Any])

#: How many times a charge is retried after losing a compare-and-append race before the
#: store's conflict is reported. Each retry folds in the winners' records first.
_MAX_CONFLICT_RETRIES = 10_000
#: After a lost race, charges are decided under the store's lock until this many in a
#: row find that no other writer appended (then compare-and-append again: on PostgreSQL
#: a lone writer's decision under the row lock takes about twice as long).
_QUIET_CHARGES = 8
#: A durable ledger's rule state is snapshotted every this many records (opening then
#: reads at most this many records), and on close after at least SNAPSHOT_ON_CLOSE.
SNAPSHOT_EVERY = 256
SNAPSHOT_ON_CLOSE = 16
#: The charge classes themselves (a mechanism is none of them: no ABC check needed).
_CHARGE_TYPE_SET = frozenset(CHARGE_TYPES)

#: The largest count max_queries searches when the rule alone sets no limit.
_MAX_QUERIES_SEARCH = 10**12


def ledger_settings(
    name: str,
    budget: Budget,
    rule: str | Rule[Any],
    relation: Relation | str,
    plan: Any,
    rule_options: Mapping[str, Any] | None,
    dataset_size: int | None,
    parent: str | None = None,
) -> tuple[Rule[Any], LedgerMeta]:
    """Build a ledger's rule and the metadata stored with it (and compared on open).

    Named rules get the budget (for their defaults) and, where they use it, the
    relation; a declared plan is passed as ``plan``.

    Raises:
        ConfigError: Unknown rule or relation, or options the rule does not take.
    """
    try:
        the_relation = Relation(relation)
    except ValueError:
        raise ConfigError(
            f"unknown relation {relation!r}; use 'add_remove' or 'substitution'"
        ) from None
    options = dict(rule_options or {})
    if plan is not None:
        options["plan"] = plan
    if isinstance(rule, str):
        options.setdefault("budget", budget)  # rules take defaults from it
        if rule in RELATION_RULES:
            options.setdefault("relation", the_relation)
    the_rule = make_rule(rule, **options)
    meta = LedgerMeta.build(name, budget, the_rule.describe(), the_relation, dataset_size,
                            parent)
    return the_rule, meta


def _as_budget(budget: Any) -> Budget:
    if isinstance(budget, Budget):
        return budget
    if isinstance(budget, PrivacyCost):
        return Budget(budget.epsilon, budget.delta)
    if isinstance(budget, tuple) and len(budget) == 2:
        return Budget(*budget)
    return Budget(budget)


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


class Accountant:
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
        check_ledger_name(name)
        if parent is not None:
            check_ledger_name(parent, "parent")
        self._budget = _as_budget(budget)
        self._delta_cap: Fraction | None = None
        if dataset_size is not None:
            self._delta_cap = Fraction(1, check_count(dataset_size, "dataset_size"))
            if self._budget.delta >= self._delta_cap:
                warnings.warn(
                    f"the budget's delta {format_number(self._budget.delta)} is at least "
                    f"1/n = 1/{dataset_size}: a mechanism could publish a whole record "
                    "with that probability. Charges are refused once the total delta "
                    "would reach 1/n; choose delta much smaller than 1/n.",
                    DeltaWarning,
                    stacklevel=2,
                )
        self._rule, meta = ledger_settings(
            name, self._budget, rule, relation, plan, rule_options, dataset_size, parent
        )
        if self._budget.epsilon is None and self._rule.spent_meaning is SpentMeaning.FILTER:
            raise ConfigError(
                f"the {self._rule.name!r} rule is a privacy filter: what it certifies is its "
                "budget, and with an unlimited budget there is nothing to certify (a running "
                "total under run-time parameters would be a privacy odometer, which this "
                "rule's theorem does not cover). Give a finite budget, or use rule='basic' "
                "to track spending without a limit."
            )
        self._relation = meta.relation
        self._store: Store = store if store is not None else MemoryStore()
        # A shared store that can decide the basic rule on its own sums avoids lost
        # races between writers; the in-memory store never races across processes.
        self._sum_store: SumLimitedStore | None = None
        if (
            type(self._rule) is BasicRule
            and isinstance(self._store, SumLimitedStore)
            and not isinstance(self._store, MemoryStore)
        ):
            self._sum_store = self._store
        # Every other rule tries compare-and-append (its decision outside any lock) while
        # it has the ledger to itself. Once it loses a race, it decides under the store's
        # own lock where the store offers it (no lost races), until a charge finds that
        # nobody else appended since its last one.
        self._deciding_store: DecidingStore | None = None
        if (
            self._sum_store is None
            and isinstance(self._store, DecidingStore)
            and not isinstance(self._store, MemoryStore)
        ):
            self._deciding_store = self._store
        #: Whether to fold in other writers' records before asking for the store's lock
        #: (`DecidingStore`: where reading costs no round trip, the lock is held only for
        #: what was appended since).
        self._catch_up_first = bool(getattr(self._deciding_store, "catch_up_first", False))
        #: Whether other writers appended lately (then decide under the store's lock),
        #: and how many charges since found that nobody else had appended.
        self._contended, self._quiet = False, 0
        self._lock = threading.RLock()
        #: The parents a sub-budget's charges also go to (set by `open_ledger`).
        self._linked: list[Accountant] = []
        self._read_only = bool(getattr(self._store, "read_only", False))
        stored = self._store.initialize(meta)
        # The store names its key (if any) in the stored settings and refuses another.
        # A sub-budget opened without naming its parent keeps the stored one.
        expected = meta.model_copy(update={
            "key_id": stored.key_id, "parent": stored.parent if parent is None else parent})
        if stored != expected:
            raise ConfigError(
                f"ledger {name!r} was created with budget {stored.budget}, rule "
                f"{stored.rule}, relation {stored.relation.value}, dataset size "
                f"{stored.dataset_size}; this accountant asks for budget {self._budget}, "
                f"rule {meta.rule}, relation {self._relation.value}, dataset size "
                f"{meta.dataset_size}. Open it with the stored settings (or migrate it "
                "explicitly)."
            )
        self._meta = stored
        self._state: Any = self._rule.start()
        self._head = 0
        #: The head of the store's latest snapshot (see `_maybe_snapshot`).
        self._snap_head = 0
        self._settings = snapshot_settings(stored)
        self._resume_from_snapshot()
        self._catch_up()
        self._maybe_snapshot()

    # -- reading --------------------------------------------------------------------

    @property
    def budget(self) -> Budget:
        """The ledger's total budget."""
        return self._budget

    @property
    def rule(self) -> Rule[Any]:
        """The composition rule in force."""
        return self._rule

    @property
    def spent_meaning(self) -> SpentMeaning:
        """What `spent` is a guarantee of under this ledger's rule."""
        return self._rule.spent_meaning

    @property
    def relation(self) -> Relation:
        """The neighbouring relation every charge is stated for."""
        return self._relation

    @property
    def store(self) -> Store:
        """The store that holds the records."""
        return self._store

    @property
    def spent(self) -> PrivacyCost:
        """The composed total of every recorded charge under the rule.

        What it is a guarantee of depends on the rule (`spent_meaning`): for a
        privacy filter, the value it certifies against its finite budget; for ``basic``
        the exact sums; for a fixed-plan rule the bound for the declared plan.
        """
        with self._lock:
            self._catch_up()
            return self._rule.total(self._state)

    @property
    def records(self) -> Sequence[LedgerRecord]:
        """Every recorded charge, in order."""
        with self._lock:
            self._catch_up()
            return self._store.read()

    def remaining(self, k: int = 1) -> Budget:
        """The largest per-query cost such that ``k`` more equal queries fit.

        For the basic rule this is exact: (budget - spent) / k in each coordinate. Other
        rules solve their own inverse and err toward privacy.

        Examples:
            >>> acct = Accountant((1, "1e-6"))
            >>> acct.remaining(4)
            Budget(epsilon=0.25, delta=2.5e-07)
        """
        k = check_count(k, "k")
        with self._lock:
            self._catch_up()
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
        charge = self._as_charge(charge)
        cost = cost_of(charge)
        _revalidate(cost)
        with self._lock:
            self._catch_up()
            new_state = self._rule.extend(self._state, charge)
            admitted = self._admits(new_state)
            try:
                after: PrivacyCost | None = self._rule.total(new_state)
            except InvalidCostError:  # the composed delta would reach 1
                after = None
            return ChargePreview(cost, admitted, self._rule.total(self._state), after,
                                 self._budget, self._rule.name)

    def can_afford(self, charge: Charge | Mechanism) -> bool:
        """Whether ``charge`` would be admitted now (nothing is recorded)."""
        charge = self._as_charge(charge)
        with self._lock:
            self._catch_up()
            return self._admits(self._rule.extend(self._state, charge))

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
        charge = self._as_charge(charge)
        with self._lock:
            self._catch_up()
            state = self._state
            found = max_queries(self._rule, state, self._budget, charge)
            if self._delta_cap is None or cost_of(charge).delta == 0:
                return found
            # Shrink to the largest count whose total delta stays below 1/n.
            lo, hi = 0, (found if found is not None else _MAX_QUERIES_SEARCH)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self._admits(self._rule.extend(state, Repeated(charge, mid))):
                    lo = mid
                else:
                    hi = mid - 1
            return lo

    def _admits(self, new_state: Any) -> bool:
        """The rule's decision plus the 1/n delta cap of a declared dataset size."""
        if not self._rule.admits(new_state, self._budget):
            return False
        cap = self._delta_cap
        return cap is None or self._rule.total(new_state).delta < cap

    # -- charging -------------------------------------------------------------------

    def charge(
        self,
        charge: Charge | Mechanism,
        *,
        label: str | None = None,
        query_id: str | None = None,
    ) -> LedgerRecord:
        """Check a charge against the budget and record it, as one atomic step.

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
        if self._linked:
            from dpaccount.budgets import charge_together

            return charge_together([self, *self._linked], charge, label=label,
                                   query_id=query_id)[0]
        charge = self._as_charge(charge)
        cost = cost_of(charge)
        _revalidate(cost)
        check_text(label, "label")
        check_text(query_id, "query_id")
        if self._head - self._snap_head >= SNAPSHOT_EVERY:
            self._maybe_snapshot()
        if self._read_only:
            raise ReadOnlyLedgerError(
                f"ledger {self._meta.name!r} was opened read-only (for reading and audit); "
                "nothing was charged and the query must not run. Open it without "
                "read_only=True to charge it."
            )
        with self._lock:
            for _attempt in range(_MAX_CONFLICT_RETRIES):
                if query_id is not None:
                    self._refuse_duplicate(query_id)
                # Writers that met lately decide under the store's lock, on the records
                # as they are there: a decision here first would be made on a stale state.
                deciding = (self._deciding_store
                            if self._contended or _attempt > 0 else None)
                caught_up = False
                if deciding is not None and self._catch_up_first:
                    before = self._head
                    self._catch_up(ask_head=False)  # outside the lock: under it, only
                    # what comes since
                    caught_up = self._head != before
                new_state = None
                if deciding is None:
                    new_state = self._rule.extend_costed(self._state, charge, cost)
                    if not self._rule.admits(new_state, self._budget):
                        if self._store.head() != self._head:
                            self._catch_up()  # refuse on the true totals (refusals are rare)
                            continue
                        raise self._refusal(cost, new_state)
                    if self._delta_cap is not None:
                        self._refuse_large_delta(cost, new_state)
                record = LedgerRecord(
                    seq=self._head,
                    label=label,
                    charge=charge,
                    cost=cost,
                    rule=self._rule.name,
                    timestamp=datetime.now(UTC),
                    query_id=query_id,
                )
                if self._sum_store is not None:
                    return self._append_within_sums(self._sum_store, record, charge, query_id)
                if deciding is not None:
                    return self._append_decided(deciding, record, charge, query_id,
                                                caught_up)
                try:
                    self._store.append(self._head, record)
                except LedgerConflictError:
                    self._contended, self._quiet = True, 0
                    before = self._head
                    self._catch_up()
                    if query_id is not None:
                        self._refuse_duplicate(query_id)
                    if self._head == before:
                        raise
                    continue
                self._state = new_state
                self._head += 1
                return record
        raise LedgerConflictError(
            f"gave up after {_MAX_CONFLICT_RETRIES} lost races; nothing was recorded"
        )

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

    # -- internals ------------------------------------------------------------------

    def _as_charge(self, charge: Any) -> Charge:
        if type(charge) is PrivacyCost:  # the common case, without the ABC checks below
            return charge
        if type(charge) not in _CHARGE_TYPE_SET and isinstance(charge, Mechanism):
            charge = charge.charge
        if not isinstance(charge, CHARGE_TYPES):
            raise InvalidCostError(
                "charge",
                charge,
                "expected a PrivacyCost, a charge from dpaccount.charges, or a mechanism",
            )
        check_relations(charge, self._relation)
        return charge

    def _append_within_sums(
        self, store: SumLimitedStore, record: LedgerRecord, charge: Charge, query_id: str | None
    ) -> LedgerRecord:
        """Let a shared store decide the basic rule itself: no lost races, no retries.

        The basic rule admits a charge exactly when the exact sums of epsilon and delta,
        this charge included, stay within the budget (and strictly below 1/n when a
        dataset size is declared); a store offering `SumLimitedStore` makes that
        comparison on its stored sums and appends in the same atomic step.
        """
        try:
            result = store.append_within(
                self._head, record, self._budget.epsilon, self._budget.delta, self._delta_cap
            )
        except LedgerConflictError:
            self._catch_up()
            if query_id is not None:
                self._refuse_duplicate(query_id)
            raise
        for expected, missed in enumerate(result.missed, self._head):
            if missed.seq != expected:
                raise LedgerCorruptError(
                    f"expected record {expected}, read record {missed.seq}", seq=missed.seq
                )
        if result.missed:
            self._state = self._rule.extend_all(self._state, [m.charge for m in result.missed])
            self._head += len(result.missed)
        new_state = self._rule.extend(self._state, charge)
        if not result.appended:
            if not self._rule.admits(new_state, self._budget):
                raise self._refusal(record.cost, new_state)
            self._refuse_large_delta(record.cost, new_state)
            raise LedgerCorruptError(
                "the store refused a charge that its records show fits the budget: its "
                "cached totals disagree with its records"
            )
        if result.seq != self._head:
            raise LedgerCorruptError(
                f"the store appended at {result.seq}, after reporting {self._head} records",
                seq=result.seq,
            )
        self._state = new_state
        self._head += 1
        return attrs.evolve(record, seq=result.seq)

    def _append_decided(
        self, store: DecidingStore, record: LedgerRecord, charge: Charge, query_id: str | None,
        caught_up: bool = False,
    ) -> LedgerRecord:
        """Decide under the store's write lock: fold in what other writers appended, apply
        the rule, and append at the current head in the same transaction. ``caught_up``:
        other writers' records were folded in just before (they count as a meeting)."""
        seen: dict[str, Any] = {}
        try:
            result = store.append_decided(self._head, record, self._decider(charge, seen))
        except LedgerConflictError:
            self._catch_up()
            if query_id is not None:
                self._refuse_duplicate(query_id)
            raise
        self._state, self._head = seen["state"], seen["head"]
        self._quiet = 0 if result.missed or caught_up else self._quiet + 1
        self._contended = self._quiet < _QUIET_CHARGES
        if not result.appended:
            if not self._rule.admits(seen["new_state"], self._budget):
                raise self._refusal(record.cost, seen["new_state"])
            self._refuse_large_delta(record.cost, seen["new_state"])
            raise LedgerCorruptError("the store refused a charge that its decision admitted")
        if result.seq != self._head:
            raise LedgerCorruptError(
                f"the store appended at {result.seq}, after reporting {self._head} records",
                seq=result.seq,
            )
        self._state = seen["new_state"]
        self._head += 1
        return attrs.evolve(record, seq=result.seq)

    def _refusal(self, cost: PrivacyCost, new_state: Any) -> BudgetExceededError:
        """The error for a refused charge; a total whose delta would reach 1 (so no
        PrivacyCost describes it) is named in words."""
        try:
            would_be: PrivacyCost | None = self._rule.total(new_state)
        except InvalidCostError:
            would_be = None
        return BudgetExceededError(
            requested=cost,
            spent=self._rule.total(self._state),
            budget=self._budget,
            would_be=would_be,
            rule=self._rule.name,
        )

    def _refuse_large_delta(self, cost: PrivacyCost, new_state: Any) -> None:
        would_be = self._rule.total(new_state)
        cap = self._delta_cap
        if cap is not None and would_be.delta >= cap:
            raise BudgetExceededError(
                requested=cost,
                spent=self._rule.total(self._state),
                budget=self._budget,
                would_be=would_be,
                rule=self._rule.name,
                reason=f"whose delta reaches 1/n = {format_number(cap)} for the declared "
                f"dataset size (delta must stay well below 1/n)",
            )

    def _decider(self, charge: Charge, seen: dict[str, Any]
                 ) -> Callable[[Sequence[LedgerRecord]], bool]:
        """The decision a store makes under its lock (`DecidingStore`): fold in the
        records other writers appended since this accountant's head, then whether the
        charge fits. What it saw goes to ``seen`` (state, head, new_state, fits)."""

        def decide(missed: Sequence[LedgerRecord]) -> bool:
            state, head = self._state, self._head
            for other in missed:
                if other.seq != head:
                    raise LedgerCorruptError(
                        f"expected record {head}, read record {other.seq}", seq=other.seq
                    )
                head += 1
            state = self._rule.extend_all(state, [other.charge for other in missed])
            new_state = self._rule.extend(state, charge)
            fits = self._admits(new_state)
            seen.update(state=state, head=head, new_state=new_state, fits=fits)
            return fits

        return decide

    def _refuse_duplicate(self, query_id: str) -> None:
        existing = self._store.find(query_id)
        if existing is not None:
            raise DuplicateQueryError(query_id, existing)

    def _catch_up(self, ask_head: bool = True) -> None:
        """Fold in records appended by other writers since this accountant's head (without
        ``ask_head``, read them straight away: one query instead of two where others
        usually have appended)."""
        if ask_head and self._store.head() == self._head:
            return
        records = list(self._store.read(self._head))
        for expected, record in enumerate(records, self._head):
            if record.seq != expected:
                raise LedgerCorruptError(
                    f"expected record {expected}, read record {record.seq}", seq=record.seq
                )
        self._state = self._rule.extend_all(self._state, [r.charge for r in records])
        self._head += len(records)

    # -- closing ----------------------------------------------------------------------

    def close(self) -> None:
        """Close the store (its database connection); reads and charges then fail.

        A durable ledger first stores a snapshot of the rule's state if more than a few
        records were added since the last one, so the next open starts from here.
        """
        with self._lock:
            self._maybe_snapshot(SNAPSHOT_ON_CLOSE)
        self._store.close()
        for parent in self._linked:
            parent.close()

    # -- snapshots ------------------------------------------------------------------

    def _resume_from_snapshot(self) -> None:
        """Start from the rule state of the store's verified snapshot, if it has one
        folded under this ledger's rule and relation (else from the first record)."""
        snap = getattr(self._store, "snapshot", None)
        if snap is None:
            return
        self._snap_head = snap.tip.head
        if snap.state is None or snap.settings != self._settings:
            return
        if getattr(self._store, "full_verify", False):
            return  # a full verification trusts no stored state: replay every record
        state = decode_state(snap.state)
        if type(state) is type(self._state):
            self._state, self._head = state, snap.tip.head

    def _maybe_snapshot(self, every: int = SNAPSHOT_EVERY) -> None:
        """Store the rule's state at this head if ``every`` records came since the last
        snapshot. A snapshot only speeds up opening: failing to write one (another
        writer moved the head, a lock timeout) never fails a charge."""
        write = getattr(self._store, "write_snapshot", None)
        if write is None or self._read_only or self._head - self._snap_head < every:
            return
        try:
            written = write(self._head, self._settings, encode_state(self._state))
        except StorageError:
            written = False
        self._snap_head = self._head if written else self._head - SNAPSHOT_EVERY // 2

    def __enter__(self) -> Accountant:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        # What this accountant has folded in so far: a repr never touches the store (it
        # must work on a closed or failing one).
        try:
            spent = repr(self._rule.total(self._state))
        except DPAccountError:
            spent = "?"
        return (
            f"Accountant(budget={self._budget!r}, rule={self._rule.name!r}, "
            f"spent={spent}, records={self._head})"
        )


#: The longest label or query_id a record takes (characters).
MAX_TEXT_LENGTH = 1000


def check_text(value: Any, field: str) -> None:
    """Refuse a label or query_id that could break a ledger or forge its output.

    It must be None or a ``str`` of at most `MAX_TEXT_LENGTH` printable characters
    (`str.isprintable`): no lone surrogates, which every backend would store but no reader
    could decode, and no control, format or separator characters (newlines and terminal
    escapes would forge lines in ``dpaccount ledger show``); the ASCII space is allowed.
    Checked before anything is charged, the same for every store.

    Raises:
        InvalidCostError: Naming the field and what is wrong with it.
    """
    if value is None:
        return
    if type(value) is not str:
        raise InvalidCostError(field, type(value).__name__, "must be a string or None")
    if len(value) > MAX_TEXT_LENGTH:
        raise InvalidCostError(
            field, f"<{len(value)} characters>", f"is longer than {MAX_TEXT_LENGTH} characters"
        )
    if not value.isprintable():
        raise InvalidCostError(
            field, ascii(value)[:80],
            "holds characters that are not printable (newlines, tabs, terminal escapes, "
            "lone surrogates, format or separator characters other than the space)",
        )


def _revalidate(cost: PrivacyCost) -> None:
    """Check a cost again as it enters the ledger (values can be forged past attrs)."""
    eps, delta = cost.epsilon, cost.delta
    if type(eps) is not Fraction or type(delta) is not Fraction:
        raise InvalidCostError("charge", cost, "epsilon and delta must be exact values")
    # Fractions are normalised with a positive denominator: compare numerators directly.
    if eps.numerator < 0:
        raise InvalidCostError("epsilon", eps, "must be >= 0")
    if delta.numerator < 0 or delta.numerator >= delta.denominator:
        raise InvalidCostError("delta", delta, "must be in [0, 1)")
