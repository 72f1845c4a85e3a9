"""The small interface every ledger store implements.

A store keeps one ledger's metadata and its append-only records. It knows nothing of
differential privacy: the accountant decides whether a charge fits, then asks the store
to append it *only if* no other writer appended first (:meth:`Store.append` is an atomic
compare-and-append). On a conflict the accountant reads what was added, folds it into
its running total, decides again and retries.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from dpaccount.records import LedgerMeta, LedgerRecord

__all__ = ["Store"]


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
