"""One ledger's logic: its rule decides each charge on the ledger's state, and its store
appends the record atomically.

A `Ledger` holds what one ledger needs between charges: the rule and its running state
(O(1) per charge), the budget, the store and the in-process lock. `Ledger.append` is the
path of a charge to one ledger; a charge to several ledgers at once (a share and its
ancestors, a window of blocks) uses the same decision through the joint protocol of
`dpaccount.accountant.joint`, whose every step is a public method here:

1. `lock` each ledger (in name order) and `refresh` it with what other writers appended;
2. `refuse_duplicate` a query id already recorded;
3. `decision` (a callable the store runs under its write lock with the records it
   missed) for each ledger, passed to the store's ``append_group``;
4. `settle` each ledger with what was appended, or `refusal` names the ledger that said no.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

import attrs

from dpaccount._numeric import check_count
from dpaccount.accountant.settings import ledger_settings
from dpaccount.charges import CHARGE_TYPES, Charge, Relation, check_relations
from dpaccount.composition import BasicRule, Rule
from dpaccount.composition.base import SpentMeaning
from dpaccount.composition.states import decode_state, encode_state
from dpaccount.costs import Budget, PrivacyCost, as_budget, format_number
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

__all__ = ["SNAPSHOT_EVERY", "SNAPSHOT_ON_CLOSE", "Decision", "Ledger"]

_log = logging.getLogger(__name__)
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


class Decision:
    """One ledger's decision on one charge, made where the store holds its write lock.

    Called with the records other writers appended since the ledger's head (validated,
    in order), it folds them in and says whether the charge fits; what it saw stays on
    it (``state``, ``head``: the ledger caught up; ``new_state``: with the charge;
    ``fits``). A store may call it again if it retries its transaction. It is what
    `DecidingStore.append_decided` and `GroupAppend.decide` take.
    """

    __slots__ = ("_ledger", "charge", "fits", "head", "new_state", "state")

    def __init__(self, ledger: Ledger, charge: Charge) -> None:
        self._ledger, self.charge = ledger, charge
        self.state: Any = ledger.state
        self.head = ledger.head
        self.new_state: Any = None
        self.fits = False

    def __call__(self, missed: Sequence[LedgerRecord]) -> bool:
        ledger = self._ledger
        head = ledger.head
        for other in missed:
            if other.seq != head:
                raise LedgerCorruptError(
                    f"expected record {head}, read record {other.seq}", seq=other.seq
                )
            head += 1
        rule = ledger.rule
        state = rule.extend_all(ledger.state, [other.charge for other in missed])
        new_state = rule.extend(state, self.charge)
        self.state, self.head, self.new_state = state, head, new_state
        self.fits = ledger.admits(new_state)
        return self.fits


class Ledger:
    """One ledger: its rule, budget and running state, its store, and the decision and
    append of each charge (the base of `dpaccount.Accountant`, which adds the reading
    API, the guard and the links of a sub-budget).

    Args: as `dpaccount.Accountant`.

    Raises:
        ConfigError: Unknown rule, a store whose ledger was created with other settings,
            a filter rule with an unlimited budget; a ``name`` or ``parent`` that is not a
            valid ledger name (`dpaccount.records.check_ledger_name`).
        InvalidCostError: An invalid budget or dataset size.
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
        stacklevel: int = 2,
    ) -> None:
        # stacklevel: where a DeltaWarning points (2: the caller of this constructor).
        check_ledger_name(name)
        if parent is not None:
            check_ledger_name(parent, "parent")
        self._budget = as_budget(budget)
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
                    stacklevel=stacklevel,
                )
        self._rule, meta = ledger_settings(
            name, self._budget, rule, relation, plan, rule_options, dataset_size, parent
        )
        if self._budget.is_unlimited and self._rule.spent_meaning is SpentMeaning.FILTER:
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
        #: The head of the store's latest snapshot (see `snapshot_if_due`).
        self._snap_head = 0
        self._settings = snapshot_settings(stored)
        self._resume_from_snapshot()
        self.refresh()
        self.snapshot_if_due()

    # -- what the ledger is ---------------------------------------------------------

    @property
    def budget(self) -> Budget:
        """The ledger's total budget."""
        return self._budget

    @property
    def rule(self) -> Rule[Any]:
        """The composition rule in force."""
        return self._rule

    @property
    def relation(self) -> Relation:
        """The neighbouring relation every charge is stated for."""
        return self._relation

    @property
    def store(self) -> Store:
        """The store that holds the records."""
        return self._store

    @property
    def name(self) -> str:
        """The ledger's name."""
        return self._meta.name

    @property
    def meta(self) -> LedgerMeta:
        """The settings stored with the ledger (name, budget, rule, relation, dataset
        size, parent, key id)."""
        return self._meta

    @property
    def read_only(self) -> bool:
        """Whether the ledger was opened read-only (a charge raises
        `ReadOnlyLedgerError`)."""
        return self._read_only

    @property
    def head(self) -> int:
        """How many records this process has folded into `state`."""
        return self._head

    @property
    def state(self) -> Any:
        """The rule's running state over the first `head` records."""
        return self._state

    @property
    def lock(self) -> threading.RLock:
        """The in-process lock that serialises this ledger's charges (a charge to several
        ledgers holds each one's, taken in name order)."""
        return self._lock

    # -- the decision ---------------------------------------------------------------

    def as_charge(self, charge: Any) -> Charge:
        """``charge`` as a charge this ledger can take: a `PrivacyCost`, a charge from
        `dpaccount.charges` or a mechanism's ``.charge``, every level checked against the
        ledger's relation (`dpaccount.charges.check_relations`).

        Raises:
            InvalidCostError: Not a charge.
            UnsupportedChargeError: A level does not fit the ledger's relation.
        """
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

    def admits(self, new_state: Any) -> bool:
        """The rule's decision on ``new_state``, plus the 1/n delta cap of a declared
        dataset size."""
        if not self._rule.admits(new_state, self._budget):
            return False
        cap = self._delta_cap
        return cap is None or self._rule.total(new_state).delta < cap

    def decision(self, charge: Charge) -> Decision:
        """The decision on ``charge`` that a store runs under its write lock."""
        return Decision(self, charge)

    def refusal(self, cost: PrivacyCost, new_state: Any, *, ledger: str | None = None
                ) -> BudgetExceededError | None:
        """The error for a charge of ``cost`` that would take the ledger to
        ``new_state``, or None if the ledger admits that state. ``ledger`` names the
        ledger on the error (a charge to several). A total whose delta would reach 1 (so
        no PrivacyCost describes it) is named in words."""
        if self._rule.admits(new_state, self._budget):
            cap = self._delta_cap
            would_be = self._rule.total(new_state)
            if cap is None or would_be.delta < cap:
                return None
            return BudgetExceededError(
                requested=cost, spent=self._rule.total(self._state), budget=self._budget,
                would_be=would_be, rule=self._rule.name, ledger=ledger,
                reason=f"whose delta reaches 1/n = {format_number(cap)} for the declared "
                f"dataset size (delta must stay well below 1/n)",
            )
        try:
            total: PrivacyCost | None = self._rule.total(new_state)
        except InvalidCostError:
            total = None
        return BudgetExceededError(
            requested=cost, spent=self._rule.total(self._state), budget=self._budget,
            would_be=total, rule=self._rule.name, ledger=ledger,
        )

    def refuse_duplicate(self, query_id: str) -> None:
        """Raise `DuplicateQueryError` if ``query_id`` is already recorded."""
        existing = self._store.find(query_id)
        if existing is not None:
            raise DuplicateQueryError(query_id, existing)

    def refuse_read_only(self) -> None:
        """Raise `ReadOnlyLedgerError` if the ledger was opened read-only."""
        if self._read_only:
            raise ReadOnlyLedgerError(
                f"ledger {self._meta.name!r} was opened read-only (for reading and audit); "
                "nothing was charged and the query must not run. Open it without "
                "read_only=True to charge it."
            )

    # -- keeping up with other writers ---------------------------------------------

    def refresh(self, ask_head: bool = True) -> None:
        """Fold in records appended by other writers since this ledger's head (without
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

    def settle(self, decision: Decision, seq: int | None) -> None:
        """Take what ``decision`` saw: the records it folded in and, when the charge was
        appended at ``seq`` (None: not appended), the charge itself.

        Raises:
            LedgerCorruptError: The store appended at another place than the decision's
                head.
        """
        self._state, self._head = decision.state, decision.head
        if seq is None:
            return
        if seq != self._head:
            raise LedgerCorruptError(
                f"ledger {self._meta.name!r} appended at {seq}, after reporting "
                f"{self._head} records", seq=seq)
        self._state = decision.new_state
        self._head += 1

    # -- appending ------------------------------------------------------------------

    def append(self, charge: Charge, cost: PrivacyCost, label: str | None,
               query_id: str | None) -> LedgerRecord:
        """Decide ``charge`` (already checked: `as_charge`, its cost, label and query
        id) on this ledger alone and record it, as one atomic step.

        Raises:
            BudgetExceededError: The total would exceed the budget; nothing changed.
            DuplicateQueryError: ``query_id`` is already recorded.
            ReadOnlyLedgerError: The ledger was opened read-only.
            StorageError: The store failed; nothing was recorded (fail closed).
        """
        if self._head - self._snap_head >= SNAPSHOT_EVERY:
            self.snapshot_if_due()
        self.refuse_read_only()
        with self._lock:
            for _attempt in range(_MAX_CONFLICT_RETRIES):
                if query_id is not None:
                    self.refuse_duplicate(query_id)
                # Writers that met lately decide under the store's lock, on the records
                # as they are there: a decision here first would be made on a stale state.
                deciding = (self._deciding_store
                            if self._contended or _attempt > 0 else None)
                caught_up = False
                if deciding is not None and self._catch_up_first:
                    before = self._head
                    self.refresh(ask_head=False)  # outside the lock: under it, only
                    # what comes since
                    caught_up = self._head != before
                new_state = None
                if deciding is None:
                    new_state = self._rule.extend_costed(self._state, charge, cost)
                    if not self._rule.admits(new_state, self._budget):
                        if self._store.head() != self._head:
                            self.refresh()  # refuse on the true totals (refusals are rare)
                            continue
                        raise self._refusal(cost, new_state)
                    if self._delta_cap is not None:
                        self._raise_refusal(cost, new_state)
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
                    _log.debug("ledger %r: another writer appended first (attempt %d); "
                               "deciding again on its records", self._meta.name,
                               _attempt + 1)
                    before = self._head
                    self.refresh()
                    if query_id is not None:
                        self.refuse_duplicate(query_id)
                    if self._head == before:
                        raise
                    continue
                self._state = new_state
                self._head += 1
                return record
        raise LedgerConflictError(
            f"gave up after {_MAX_CONFLICT_RETRIES} lost races; nothing was recorded"
        )

    def _refusal(self, cost: PrivacyCost, new_state: Any) -> BudgetExceededError:
        refusal = self.refusal(cost, new_state)
        if refusal is None:  # pragma: no cover - called only for refused states
            raise LedgerCorruptError("a refusal was asked for an admitted charge")
        return refusal

    def _raise_refusal(self, cost: PrivacyCost, new_state: Any) -> None:
        refusal = self.refusal(cost, new_state)
        if refusal is not None:
            raise refusal

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
            self.refresh()
            if query_id is not None:
                self.refuse_duplicate(query_id)
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
            self._raise_refusal(record.cost, new_state)
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
        decision = self.decision(charge)
        try:
            result = store.append_decided(self._head, record, decision)
        except LedgerConflictError:
            self.refresh()
            if query_id is not None:
                self.refuse_duplicate(query_id)
            raise
        self._quiet = 0 if result.missed or caught_up else self._quiet + 1
        self._contended = self._quiet < _QUIET_CHARGES
        if not result.appended:
            self.settle(decision, None)
            self._raise_refusal(record.cost, decision.new_state)
            raise LedgerCorruptError("the store refused a charge that its decision admitted")
        self.settle(decision, result.seq)
        return attrs.evolve(record, seq=result.seq)

    # -- snapshots and closing ------------------------------------------------------

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

    def snapshot_if_due(self, every: int = SNAPSHOT_EVERY) -> None:
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

    def close(self) -> None:
        """Close the store (its database connection); reads and charges then fail.

        A durable ledger first stores a snapshot of the rule's state if more than a few
        records were added since the last one, so the next open starts from here.
        """
        with self._lock:
            self.snapshot_if_due(SNAPSHOT_ON_CLOSE)
        self._store.close()

    def _spent_text(self) -> str:
        """What this ledger has folded in so far, for a repr that never touches the
        store (it must work on a closed or failing one)."""
        try:
            return repr(self._rule.total(self._state))
        except DPAccountError:
            return "?"
