"""An in-memory store: the default for a single process; forgets everything at exit."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from dpaccount.errors import LedgerConflictError
from dpaccount.records import LedgerMeta, LedgerRecord

__all__ = ["MemoryStore"]


class MemoryStore:
    """Keeps one ledger in a Python list, guarded by a lock.

    Examples:
        >>> store = MemoryStore()
        >>> store.head()
        0
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._meta: LedgerMeta | None = None
        self._records: list[LedgerRecord] = []
        self._by_query_id: dict[str, LedgerRecord] = {}

    def initialize(self, meta: LedgerMeta) -> LedgerMeta:
        with self._lock:
            if self._meta is None:
                self._meta = meta
            return self._meta

    def head(self) -> int:
        return len(self._records)

    def read(self, start: int = 0) -> Sequence[LedgerRecord]:
        with self._lock:
            return tuple(self._records[start:])

    def append(self, expected_head: int, record: LedgerRecord) -> None:
        with self._lock:
            if len(self._records) != expected_head or record.seq != expected_head:
                raise LedgerConflictError(
                    f"expected {expected_head} records, found {len(self._records)}"
                )
            if record.query_id is not None:
                if record.query_id in self._by_query_id:
                    raise LedgerConflictError(f"query_id {record.query_id!r} already recorded")
                self._by_query_id[record.query_id] = record
            self._records.append(record)

    def find(self, query_id: str) -> LedgerRecord | None:
        return self._by_query_id.get(query_id)

    def close(self) -> None:
        """Nothing to release."""
