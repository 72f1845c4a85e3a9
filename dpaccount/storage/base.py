"""The small interface every ledger store implements.

A store keeps one ledger's metadata and its append-only records. It knows nothing of
differential privacy: the accountant decides whether a charge fits, then asks the store
to append it *only if* no other writer appended first (`Store.append()` is an atomic
compare-and-append). On a conflict the accountant reads what was added, folds it into
its running total, decides again and retries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Protocol, runtime_checkable

import attrs

from dpaccount.records import LedgerMeta, LedgerRecord
from dpaccount.storage._sql import LedgerTip

__all__ = ["AppendResult", "DecidingStore", "GroupAppend", "Store", "SumLimitedStore"]


@runtime_checkable
class Store(Protocol):
    """Storage for one ledger: metadata, append-only records, compare-and-append."""

    def initialize(self, meta: LedgerMeta) -> LedgerMeta:
        """Create the ledger with ``meta`` if it does not exist; return the stored meta.

        The caller compares the returned metadata with its own and refuses a mismatch.
        """
        ...

    def head(self) -> int:
        """The number of records (the ``seq`` the next record will carry)."""
        ...

    def read(self, start: int = 0) -> Sequence[LedgerRecord]:
        """The records with ``seq >= start``, in order, validated.

        Raises:
            LedgerCorruptError: A record fails validation or the chain is broken.
        """
        ...

    def append(self, expected_head: int, record: LedgerRecord) -> None:
        """Append ``record`` (whose seq is ``expected_head``) atomically and durably.

        Raises:
            LedgerConflictError: Another writer appended first; nothing was written.
            StorageError: The store failed; nothing was written.
        """
        ...

    def find(self, query_id: str) -> LedgerRecord | None:
        """The record carrying ``query_id``, if one was appended."""
        ...

    def close(self) -> None:
        """Release the store's resources."""
        ...


@attrs.frozen
class AppendResult:
    """What `SumLimitedStore.append_within()` did.

    Attributes:
        appended: Whether the record was written.
        seq: The seq the record was written at (the head it was refused at otherwise).
        missed: The records other writers appended from the caller's ``known_head`` up to
            ``seq``, in order, validated.
    """

    appended: bool
    seq: int
    missed: tuple[LedgerRecord, ...]


@runtime_checkable
class SumLimitedStore(Protocol):
    """An optional capability: append only while the stored sums stay within limits.

    A store keeps exact running sums of its records' ``cost.epsilon`` and
    ``cost.delta``. This call appends ``record`` at the current head, whatever it is,
    if those sums plus ``record.cost`` stay within the limits, in one atomic step, so
    concurrent writers never lose a race and retry. It is plain arithmetic on stored
    numbers; the accountant uses it only when its rule's decision is exactly that (the
    basic rule).
    """

    def append_within(
        self,
        known_head: int,
        record: LedgerRecord,
        epsilon_limit: Fraction | None,
        delta_limit: Fraction,
        delta_below: Fraction | None,
    ) -> AppendResult:
        """Append ``record`` (re-numbered to the current head) if the sums stay within.

        Args:
            known_head: How many records the caller has seen; ``missed`` starts there.
            record: The record, numbered ``known_head``; stored with the actual head.
            epsilon_limit: The epsilon sum may not exceed this (None: no limit).
            delta_limit: The delta sum may not exceed this.
            delta_below: If given, the delta sum must stay strictly below it.

        Raises:
            LedgerConflictError: The record's ``query_id`` is already stored.
            StorageError: The store failed; nothing was written.
        """
        ...


@runtime_checkable
class DecidingStore(Protocol):
    """An optional capability: let the caller decide under the store's own write lock.

    For rules whose state is not a pair of sums (the filters, Renyi DP, plans), the
    accountant's decision is a function of the records. This call takes the store's
    write lock, reads the records other writers appended since ``known_head``, calls
    ``decide(missed)`` while still holding the lock, and appends ``record`` at the current
    head if it returns True, all in one transaction: concurrent writers are serialised,
    so none of them loses a compare-and-append race and retries.

    A store may also set ``catch_up_first = True``: the accountant then reads and folds
    in the records other writers appended *before* asking for the lock, so that under
    it only those appended since remain (worth it where a read costs no round trip, as
    on SQLite; on PostgreSQL the extra round trip costs more than it saves).
    """

    def append_decided(
        self,
        known_head: int,
        record: LedgerRecord,
        decide: Callable[[Sequence[LedgerRecord]], bool],
    ) -> AppendResult:
        """Append ``record`` (re-numbered to the current head) if ``decide`` says so.

        Args:
            known_head: How many records the caller has seen; ``missed`` starts there.
            record: The record, numbered ``known_head``; stored with the actual head.
            decide: Called under the lock with the missed records, validated, in order;
                it may be called again if the store retries the transaction, so it must
                depend only on its argument.

        Raises:
            LedgerConflictError: The record's ``query_id`` is already stored.
            StorageError: The store failed; nothing was written.
        """
        ...


@attrs.frozen
class GroupAppend:
    """One ledger's part of an all-or-nothing append to several ledgers of a database
    (`SQLiteStore.append_group`, `PostgresStore.append_group`).

    Attributes:
        name: The ledger.
        known_head: How many of its records the caller has folded in.
        record: The record to append (re-numbered to the head found).
        settings: The stored settings (JSON text) the caller opened the ledger under;
            the append fails closed if they changed (None: not checked).
        decide: Called with the records appended since ``known_head``; the group is
            appended only if every part's ``decide`` says so.
        seen: The ledger's tip as the caller's own store last read or wrote it (its
            ``seen_tip``): under the lock the ledger's tip must extend it, else
            `LedgerCorruptError` and nothing is written (None: only ``known_head`` is
            checked, unless the appending store saw the ledger itself).
    """

    name: str
    known_head: int
    record: LedgerRecord
    settings: str | None
    decide: Callable[[Sequence[LedgerRecord]], bool]
    seen: LedgerTip | None = None
