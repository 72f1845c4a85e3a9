"""The append paths of a SQLite ledger: compare-and-append, the basic rule decided on
the cached sums, decisions under the write lock, and one charge to several ledgers of
the file; each one ``BEGIN IMMEDIATE`` transaction."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from fractions import Fraction

from dpaccount.errors import LedgerConflictError, LedgerCorruptError
from dpaccount.records import (
    LedgerRecord,
    canonical_bytes,
    chain_hash_payload,
)
from dpaccount.storage._chain import (
    check_adds_up,
    check_extends,
    check_not_behind,
    missed_records,
)
from dpaccount.storage._sql import (
    LedgerTip,
    RecordRow,
    check_key,
    renumberable,
    sums_add_up,
    within_limits,
)
from dpaccount.storage.base import AppendResult, GroupAppend
from dpaccount.storage.sqlite.session import SQLiteSession

__all__ = ["SQLiteAppends"]


class SQLiteAppends(SQLiteSession):
    """The append paths of `SQLiteStore` (its base class)."""

    #: Reading is local: an accountant deciding under the write lock folds in the other
    #: writers' records first, outside it (see `DecidingStore`).
    catch_up_first = True

    def append(self, expected_head: int, record: LedgerRecord) -> None:
        """Append ``record`` if the ledger still has ``expected_head`` records.

        The record is committed (fsync'ed) when this returns.

        Raises:
            LedgerConflictError: Another writer appended first, or ``record.query_id`` is
                already in the ledger; nothing was written.
            StorageError: The write lock could not be had in time, or SQLite failed;
                nothing was written.
        """
        if record.seq != expected_head:
            raise LedgerConflictError(
                f"record seq {record.seq} does not match the expected head {expected_head}"
            )
        payload = canonical_bytes(record).decode()
        query_id = record.query_id

        def insert(cur: sqlite3.Cursor) -> LedgerTip:
            tip = self._locked_tip(cur)
            if tip.head != expected_head:
                raise LedgerConflictError(
                    f"expected {expected_head} records, found {tip.head}"
                )
            record_hash = chain_hash_payload(tip.last_hash, payload, self._key)
            new = tip.after(record, record_hash)
            try:
                cur.execute(
                    "INSERT INTO records VALUES (?, ?, ?, ?, ?, ?)",
                    (self.name, record.seq, payload, tip.last_hash, record_hash, query_id),
                )
            except sqlite3.IntegrityError as exc:
                raise LedgerConflictError(
                    f"query_id {query_id!r} (or seq {record.seq}) is already recorded"
                ) from exc
            self._advance(cur, self.name, new)
            return new

        self._seen[self.name] = self._write(insert)

    def append_within(
        self,
        known_head: int,
        record: LedgerRecord,
        epsilon_limit: Fraction | None,
        delta_limit: Fraction,
        delta_below: Fraction | None,
    ) -> AppendResult:
        """Append ``record`` at the current head if the exact sums stay within limits.

        One ``BEGIN IMMEDIATE`` transaction reads the cached tip, adds ``record.cost`` to
        its exact sums, compares them with the limits (see
        `SumLimitedStore`) and, if they fit, stores the
        record re-numbered to the head it found. Writers are serialised by the lock, so
        none of them loses a race and retries. The records other writers appended since
        ``known_head`` are read in the same transaction and checked after it commits.

        Raises:
            LedgerConflictError: ``record.query_id`` is already recorded.
            LedgerCorruptError: The ledger holds fewer records than ``known_head``, or a
                record read back fails validation.
            StorageError: The write lock could not be had in time, or SQLite failed;
                nothing was written.
        """
        prefix, suffix = renumberable(record, known_head)
        cost = record.cost
        seen = self._seen.get(self.name)

        def insert(cur: sqlite3.Cursor
                   ) -> tuple[LedgerTip | None, LedgerTip, str, list[RecordRow]]:
            tip = self._locked_tip(cur, check_seen=False)
            check_not_behind(tip.head, known_head)
            prev = tip.last_hash  # nothing missed: nothing to read
            rows: list[RecordRow] = []
            if tip.head > known_head:
                prev, rows = self._rows_since(cur, known_head)
            self._check_sums_since(cur, tip, seen, known_head, prev, rows)
            if not within_limits(tip.epsilon_sum + cost.epsilon, tip.delta_sum + cost.delta,
                                 epsilon_limit, delta_limit, delta_below):
                return None, tip, prev, rows
            return self._store_at_head(cur, tip, record, prefix, suffix), tip, prev, rows

        new, tip, prev, rows = self._write(insert)
        self._seen[self.name] = tip if new is None else new
        # Decoded after the commit, so the lock is held only for the arithmetic.
        missed = missed_records(rows, known_head, prev, tip.head, tip.last_hash, self._key)
        return AppendResult(new is not None, tip.head, tuple(missed))

    def _check_sums_since(self, cur: sqlite3.Cursor, tip: LedgerTip, seen: LedgerTip | None,
                          known_head: int, prev: str, rows: list[RecordRow]) -> None:
        """Under the lock, before a decision on the cached sums: the tip extends the one
        seen last, and the records since add up to its sums (only their costs are read;
        ``prev`` and ``rows``: the records from ``known_head`` on, already read)."""
        if seen is None or tip.head <= seen.head:
            check_extends(tip, seen, None)
            return
        since = rows
        if seen.head != known_head:
            prev, since = self._rows_since(cur, seen.head)
        check_extends(tip, seen, prev)
        if not sums_add_up(seen, (row[1] for row in since), tip):
            raise LedgerCorruptError(
                "the ledger's cached sums are not what the records since this writer last "
                "read it add up to: someone reset or edited them around the protective "
                "triggers; nothing was written", seq=seen.head)

    def append_decided(
        self,
        known_head: int,
        record: LedgerRecord,
        decide: Callable[[Sequence[LedgerRecord]], bool],
    ) -> AppendResult:
        """Append ``record`` at the current head if ``decide(missed)`` says so, in one
        ``BEGIN IMMEDIATE`` transaction (see `DecidingStore`): the records
        other writers appended since ``known_head`` are read and validated under the lock,
        handed to ``decide``, and the record is stored re-numbered to the head found.

        Raises:
            LedgerConflictError: ``record.query_id`` is already recorded.
            LedgerCorruptError: The ledger holds fewer records than ``known_head``, or a
                record read back fails validation.
            StorageError: The write lock could not be had in time, or SQLite failed;
                nothing was written.
        """
        prefix, suffix = renumberable(record, known_head)

        def insert(cur: sqlite3.Cursor
                   ) -> tuple[LedgerTip | None, LedgerTip, list[LedgerRecord]]:
            tip = self._locked_tip(cur)
            missed = self._missed_under_lock(cur, self.name, known_head, tip,
                                             self._seen.get(self.name))
            if not decide(missed):
                return None, tip, missed
            return self._store_at_head(cur, tip, record, prefix, suffix), tip, missed

        new, tip, missed = self._write(insert)
        self._seen[self.name] = tip if new is None else new
        return AppendResult(new is not None, tip.head, tuple(missed))

    def append_group(self, parts: Sequence[GroupAppend]) -> list[AppendResult]:
        """Append one record to each of several ledgers of this database file, all or
        none, in one ``BEGIN IMMEDIATE`` transaction: for each part, its ledger's tip is
        read (its settings checked), the records appended since its ``known_head`` are
        read and validated and handed to its ``decide``; only if every part agrees is
        each record stored at its ledger's head.

        Raises:
            ConfigError: A ledger is keyed with another key than this store's.
            LedgerConflictError: A part's ``query_id`` is already recorded in its ledger.
            LedgerCorruptError: A ledger holds fewer records than its ``known_head``, or
                a record read back fails validation.
            StorageError: As `append_decided`; nothing was written.
        """
        cut = [renumberable(part.record, part.known_head) for part in parts]
        seen = [self._seen.get(part.name, part.seen) for part in parts]

        def insert(cur: sqlite3.Cursor) -> tuple[list[AppendResult], list[LedgerTip]]:
            found = []
            for part, saw in zip(parts, seen, strict=True):
                if part.name == self.name:
                    tip = self._locked_tip(cur)
                else:
                    tip = self._locked_tip(cur, part.name, saw)
                    if part.settings is not None and self._settings_text != part.settings:
                        raise self._migrated(part.name)
                check_key(self._settings_text, self._key, part.name)
                found.append((tip, self._missed_under_lock(cur, part.name, part.known_head,
                                                           tip, saw)))
            admitted = all([part.decide(missed) for part, (_, missed) in zip(
                parts, found, strict=True)])
            tips = [tip for tip, _ in found]
            if admitted:
                tips = [self._store_at_head(cur, tip, part.record, prefix, suffix, part.name)
                        for part, tip, (prefix, suffix) in zip(parts, tips, cut, strict=True)]
            return [AppendResult(admitted, tip.head, tuple(missed))
                    for tip, missed in found], tips

        results, tips = self._write(insert)
        for part, tip in zip(parts, tips, strict=True):
            self._seen[part.name] = tip
        return results

    def _missed_under_lock(self, cur: sqlite3.Cursor, name: str, known_head: int,
                           tip: LedgerTip, seen: LedgerTip | None) -> list[LedgerRecord]:
        """The records appended to ``name`` since ``known_head``, read and checked under
        the write lock: against the chain, and adding up to ``tip`` from ``seen``."""
        check_not_behind(tip.head, known_head)
        if tip.head == known_head:
            return []
        prev, rows = self._rows_since(cur, known_head, name)
        missed = missed_records(rows, known_head, prev, tip.head, tip.last_hash, self._key)
        check_adds_up(seen, known_head, missed, rows, tip)
        return missed
