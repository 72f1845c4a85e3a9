"""The append paths of a PostgreSQL ledger: compare-and-append in one round trip, the
basic rule decided by a server-side function, decisions under the row lock, and one
charge to several ledgers of the schema (see `PostgresStore` for the locking and commit
modes).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import attrs

from dpaccount.errors import (
    LedgerConflictError,
    LedgerCorruptError,
    StorageError,
)
from dpaccount.records import (
    LedgerRecord,
    canonical_bytes,
    chain_hash,
    chain_hash_payload,
)
from dpaccount.storage._chain import check_not_behind, check_records, missed_records
from dpaccount.storage._sql import (
    LedgerTip,
    RecordRow,
    frac_text,
    renumberable,
    within_limits,
)
from dpaccount.storage.base import AppendResult, GroupAppend
from dpaccount.storage.postgres.session import (
    RECORD_COLUMNS,
    PostgresSession,
    split_anchor,
)

__all__ = ["PostgresAppends"]

#: Records an append brought back (the winners of a lost race, or those appended after
#: ours) answer head() and read() for this long (seconds); later calls ask the database.
PREFETCH_SECONDS = 0.05


class PostgresAppends(PostgresSession):
    """The append paths of `PostgresStore` (its base class)."""

    def append(self, expected_head: int, record: LedgerRecord) -> None:
        """Append ``record`` if the ledger still has ``expected_head`` records.

        The record is committed and its commit flushed to the WAL when this returns.

        Raises:
            LedgerConflictError: Another writer appended first (possibly known without a
                round trip, from records the previous append brought back), or the
                ``query_id`` is already recorded; nothing was written.
            StorageError: Lock timeout, persistent serialization failures, or a database
                error; nothing was written (or, if the connection broke during commit,
                the outcome is unknown and the charge is refused anyway).
        """
        self._writable()
        if record.seq != expected_head:
            raise LedgerConflictError(
                f"record seq {record.seq} does not match the expected head {expected_head}"
            )
        prefetch = self._fresh_prefetch()
        if prefetch is not None and prefetch[0] == expected_head:
            # An append just brought back newer records: fold them in first (no round trip).
            raise LedgerConflictError(
                f"expected {expected_head} records, found {expected_head + len(prefetch[1])}"
            )
        self._prefetch = None
        payload = canonical_bytes(record).decode()
        if self.locking == "conditional":
            tip = self._tip_cache
            if tip is None or tip.head != expected_head:
                tip = self._fetch_tip()
            if tip.head != expected_head:
                raise LedgerConflictError(f"expected {expected_head} records, found {tip.head}")
            self._append_conditional(tip, record, payload)
        else:
            self._append_locked(expected_head, record, payload)

    def append_within(
        self,
        known_head: int,
        record: LedgerRecord,
        epsilon_limit: Fraction | None,
        delta_limit: Fraction,
        delta_below: Fraction | None,
    ) -> AppendResult:
        """Append ``record`` at the current head if the exact sums stay within limits.

        One round trip runs a server-side function (created with the schema) that
        locks the ledger row, adds ``record.cost`` to the cached exact sums, compares
        them with the limits (see `SumLimitedStore`)
        and, if they fit, stores the record re-numbered to the head it found, hashed
        exactly like `chain_hash_payload()` (checked here again).
        Writers queue on the row lock instead of losing races. Durability follows the
        store's ``commit`` mode, as for `append()`.

        Raises:
            LedgerConflictError: ``record.query_id`` is already recorded.
            LedgerCorruptError: The ledger holds fewer records than ``known_head``, or a
                record read back fails validation or the chain.
            StorageError: Lock timeout or a database error; nothing was written (or, if
                the connection broke during commit, the outcome is unknown and the
                charge is refused anyway).
        """
        self._writable()
        if self._key is not None:
            return self._append_within_here(known_head, record, epsilon_limit, delta_limit,
                                            delta_below)
        prefix, suffix = renumberable(record, known_head)
        seen = self._seen
        params = {
            "name": self.name, "known": known_head, "prefix": prefix, "suffix": suffix,
            "anchor": seen[1] if seen is not None and seen[0] == known_head else None,
            "qid": record.query_id, "eps": frac_text(record.cost.epsilon),
            "delta": frac_text(record.cost.delta),
            "eps_limit": None if epsilon_limit is None else frac_text(epsilon_limit),
            "delta_limit": frac_text(delta_limit),
            "delta_below": None if delta_below is None else frac_text(delta_below),
            "meta": self._meta_text,
        }
        self._prefetch = None
        old_tip, self._tip_cache = self._tip_cache, None
        rows, status, barrier_ok = self._call(
            lambda conn: self._within_round_trip(conn, params)
        )
        head, prev, record_hash, state = int(status[0]), status[2], status[3], status[5]
        if state == "migrated":
            raise self._migrated()
        if state == "behind":
            check_not_behind(head, known_head)
        if state == "diverged":
            raise LedgerCorruptError(
                f"record {known_head - 1} is not the one this store read earlier: the "
                "ledger's chain changed (a server crash lost an asynchronous commit?); "
                "nothing was written; reopen the ledger", seq=known_head - 1,
            )
        if head == known_head:
            anchor = prev  # nothing was missed: the function sent no rows
        else:
            anchor, rows = split_anchor(rows, known_head)
        missed = missed_records(rows, known_head, anchor, head, prev)
        appended = state == "appended"
        self._seen = (head + 1, record_hash) if appended else (head, prev)
        if appended:
            if not barrier_ok:
                raise StorageError(
                    f"ledger {self.name!r}: record {head} was not found after its commit; "
                    "the charge is refused"
                )
            if chain_hash_payload(prev, f"{prefix}{head}{suffix}") != record_hash:
                raise StorageError(
                    f"ledger {self.name!r}: the server hashed record {head} differently; "
                    "the charge is refused"
                )
        if (not missed and old_tip is not None and old_tip.head == known_head
                and old_tip.last_hash == anchor):
            # Keep the cached tip (used by append()) current while it costs one addition;
            # after other writers' records the next append() reads it again instead.
            self._tip_cache = old_tip.after(record, record_hash) if appended else old_tip
        return AppendResult(appended, head, tuple(missed))

    def append_decided(
        self,
        known_head: int,
        record: LedgerRecord,
        decide: Callable[[Sequence[LedgerRecord]], bool],
    ) -> AppendResult:
        """Append ``record`` at the current head if ``decide(missed)`` says so, under the
        ledger row's lock (``SELECT ... FOR UPDATE``) in one transaction (see
        `DecidingStore`): the records other writers appended since
        ``known_head`` are read and checked under the lock and handed to ``decide``; the
        record is stored re-numbered to the head found. Commit modes as `append()`.

        Raises:
            LedgerConflictError: ``record.query_id`` is already recorded.
            LedgerCorruptError: Fewer records than ``known_head``, or a record read back
                fails validation.
            StorageError: Lock timeout or a database error; nothing was written.
        """
        return self._append_locked_decided(known_head, record, lambda _tip, missed: decide(missed))

    def append_group(self, parts: Sequence[GroupAppend]) -> list[AppendResult]:
        """Append one record to each of several ledgers of this schema, all or none, in
        one transaction: the ledgers' rows are locked in name order (so concurrent groups
        cannot deadlock), each part's settings are checked, the records appended since
        its ``known_head`` are read and validated and handed to its ``decide``; only if
        every part agrees is each record stored at its ledger's head. Commit modes as
        `append()`.

        Raises:
            ConfigError: A ledger is keyed with another key than this store's.
            LedgerConflictError: A part's ``query_id`` is already recorded in its ledger.
            LedgerCorruptError: A ledger holds fewer records than its ``known_head``, or
                a record read back fails validation.
            StorageError: Lock timeout or a database error; nothing was written.
        """
        self._writable()
        cut = [renumberable(part.record, part.known_head) for part in parts]

        def insert(cur: Any) -> tuple[list[AppendResult], list[LedgerTip]]:
            if self.commit == "group":
                cur.execute("SET LOCAL synchronous_commit = off")
            found: dict[int, tuple[LedgerTip, list[LedgerRecord]]] = {}
            for i in sorted(range(len(parts)), key=lambda i: parts[i].name):
                part = parts[i]
                tip = self._locked_tip(cur, True, part.name, part.settings)
                check_not_behind(tip.head, part.known_head)
                missed: list[LedgerRecord] = []
                if tip.head > part.known_head:
                    prev, rows = self._rows_since(cur, part.known_head, part.name)
                    missed = missed_records(rows, part.known_head, prev, tip.head,
                                            tip.last_hash, self._key)
                found[i] = (tip, missed)
            admitted = all([parts[i].decide(found[i][1]) for i in range(len(parts))])
            new: list[LedgerTip] = []
            if admitted:
                for i, part in enumerate(parts):
                    tip = found[i][0]
                    prefix, suffix = cut[i]
                    numbered = attrs.evolve(part.record, seq=tip.head)
                    new.append(self._store_at(cur, tip, numbered,
                                              f"{prefix}{tip.head}{suffix}", part.name))
            return [AppendResult(admitted, found[i][0].head, tuple(found[i][1]))
                    for i in range(len(parts))], new

        self._tip_cache = None
        self._prefetch = None
        self._seen = None
        results, new = self._write(insert)
        if new and self.commit == "group":  # one barrier flushes the whole commit
            self._barrier(new[-1].last_hash, new[-1].head - 1, parts[-1].name)
        return results

    def _append_within_here(
        self,
        known_head: int,
        record: LedgerRecord,
        epsilon_limit: Fraction | None,
        delta_limit: Fraction,
        delta_below: Fraction | None,
    ) -> AppendResult:
        """`append_within()` decided in this process under the ledger row's lock (for a
        keyed ledger, whose links only this side can compute)."""
        cost = record.cost
        return self._append_locked_decided(
            known_head, record,
            lambda tip, _missed: within_limits(
                tip.epsilon_sum + cost.epsilon, tip.delta_sum + cost.delta,
                epsilon_limit, delta_limit, delta_below,
            ),
        )

    def _append_locked_decided(
        self,
        known_head: int,
        record: LedgerRecord,
        decide: Callable[[LedgerTip, Sequence[LedgerRecord]], bool],
    ) -> AppendResult:
        """Under the ledger row's lock: read the records missed since ``known_head``,
        ask ``decide(tip, missed)``, and store ``record`` at the head found if it agrees.

        Two round trips: the lock and the records read under it, then the decision's
        statements with the commit (and, for ``"group"``, the durability barrier after
        it). The row stays locked from the first to the commit, one round trip.
        """
        prefix, suffix = renumberable(record, known_head)
        group = self.commit == "group"
        lock_sql = (
            ("BEGIN; SET LOCAL synchronous_commit = off; " if group else "BEGIN; ")
            + f"SELECT head, last_hash, epsilon_sum, delta_sum, meta FROM {self._s}.ledgers "
            "WHERE name = %(name)s FOR UPDATE; "
            f"SELECT {RECORD_COLUMNS} FROM {self._s}.records WHERE ledger = %(name)s "
            "AND seq >= %(start)s ORDER BY seq"
        )
        store_sql = (
            f"INSERT INTO {self._s}.records VALUES (%(name)s, %(seq)s, %(payload)s, "
            "%(prev)s, %(hash)s, %(qid)s); "
            f"UPDATE {self._s}.ledgers SET head = %(head)s, last_hash = %(hash)s, "
            "epsilon_sum = %(eps)s, delta_sum = %(delta)s WHERE name = %(name)s; COMMIT"
            + (f"; {self._sql_barrier}" if group else "")
        )

        def run(conn: Any) -> tuple[bool, LedgerTip, list[LedgerRecord]]:
            cur = self._pg.ClientCursor(conn)
            try:
                cur.execute(lock_sql, {"name": self.name, "start": max(known_head - 1, 0)})
                selects = [rows for status, rows in _results(cur) if status.startswith("SELECT")]
                tip = self._tip_of_row(selects[0][0] if len(selects) == 2 and selects[0]
                                       else None)
                check_not_behind(tip.head, known_head)
                prev, rows = split_anchor([tuple(r) for r in selects[1]], known_head)
                missed = missed_records(rows, known_head, prev, tip.head, tip.last_hash,
                                        self._key)
                if not decide(tip, missed):
                    conn.execute("ROLLBACK")
                    return False, tip, missed
                payload = f"{prefix}{tip.head}{suffix}"
                record_hash = chain_hash_payload(tip.last_hash, payload, self._key)
                new = tip.after(record, record_hash)
                cur.execute(store_sql, {
                    "name": self.name, "seq": tip.head, "payload": payload,
                    "prev": tip.last_hash, "hash": record_hash, "qid": record.query_id,
                    "head": new.head, "eps": frac_text(new.epsilon_sum),
                    "delta": frac_text(new.delta_sum),
                })
                done = _results(cur)
                counts = [status for status, _rows in done]
                if counts[:2] != ["INSERT 0 1", "UPDATE 1"] or (
                        group and (len(done) != 4 or len(done[3][1]) != 1)):
                    raise StorageError(
                        f"ledger {self.name!r}: record {tip.head} was not found after its "
                        "commit; the charge is refused"
                    )
            except BaseException:
                self._rollback(conn)
                raise
            return True, new, missed

        self._writable()
        self._tip_cache = None
        self._prefetch = None
        appended, tip, missed = self._call(run)
        if appended:
            self._tip_cache = tip
            self._seen = (tip.head, tip.last_hash)
            return AppendResult(True, tip.head - 1, tuple(missed))
        self._seen = (tip.head, tip.last_hash)
        return AppendResult(False, tip.head, tuple(missed))

    def _append_conditional(self, tip: LedgerTip, record: LedgerRecord, payload: str) -> None:
        record_hash = chain_hash_payload(tip.last_hash, payload, self._key)
        new = tip.after(record, record_hash)
        params = {
            "name": self.name, "seq": tip.head, "prev": tip.last_hash, "head": new.head,
            "hash": record_hash, "eps": frac_text(new.epsilon_sum),
            "delta": frac_text(new.delta_sum), "payload": payload, "qid": record.query_id,
            "meta": self._meta_text,
        }
        self._tip_cache = None
        appended, rows = self._call(lambda conn: self._append_round_trip(conn, params))
        if appended:
            tip, rows = new, rows[1:]  # our own record comes first
        try:
            records = check_records(rows, tip.head, tip.last_hash, self._key)
        except LedgerCorruptError:
            records = []  # the next read() finds and reports it
        self._tip_cache = tip
        if records:
            self._advance_tip_cache(tip.head, tip.last_hash, records, rows[-1][3])
            self._prefetch = (time.monotonic(), tip.head, records)
        if not appended:
            if self._meta_text is not None:  # lost to a migration, not to a writer?
                row = self._fetchone(
                    f"SELECT meta FROM {self._s}.ledgers WHERE name = %s", (self.name,)
                )
                self._check_meta(None if row is None else row[0])
            raise LedgerConflictError(
                f"expected {tip.head} records: another writer appended first"
            )

    def _append_round_trip(
        self, conn: Any, params: dict[str, Any]
    ) -> tuple[bool, list[RecordRow]]:
        """Run one append's statements in one round trip (see ``_sql_append``).

        ``"group"``: ``BEGIN``, ``SET LOCAL synchronous_commit = off``, the
        compare-and-append statement, ``COMMIT`` (the row lock is released here, before
        any flush); then, in one implicit transaction with the session's synchronous
        commit, the barrier (it writes a WAL record only if our record is stored, so the
        commit must flush the WAL through its own commit record, hence through the
        append's) and the read of the records from ``seq`` on. After a lost race the
        barrier writes nothing and the commit costs no flush. ``"sync"``: the append and
        the read in one implicit transaction, committed synchronously while the ledger
        row is still locked.

        Returns:
            Whether the record was appended (and is durable), and the rows read last
            (starting with our own record if it was appended).
        """
        cur = self._run_prepared(conn, self._sql_append[self.commit], params)
        appended = False
        selects: list[list[RecordRow]] = []
        while True:
            status = cur.statusmessage or ""
            if status.startswith("INSERT"):
                appended = cur.rowcount == 1
            elif status.startswith("SELECT"):
                selects.append(cur.fetchall())
            if not cur.nextset():
                break
        rows = selects[-1] if selects else []
        barrier_ok = self.commit == "sync" or len(selects[0]) == 1
        if appended and (not barrier_ok or not rows or rows[0][3] != params["hash"]):
            raise StorageError(
                f"ledger {self.name!r}: record {params['seq']} was not found after its "
                "commit; the charge is refused"
            )
        return appended, rows

    def _within_round_trip(
        self, conn: Any, params: dict[str, Any]
    ) -> tuple[list[RecordRow], tuple[Any, ...], bool]:
        """Run append_within's statements in one round trip (see ``_sql_within``).

        ``"group"``: ``BEGIN``, ``SET LOCAL synchronous_commit = off``, the function
        call, ``COMMIT`` (releasing the row lock before any flush), then the barrier in
        its own synchronous transaction: it writes a WAL record only if our record is
        stored, so its commit flushes the WAL through the append's commit record.
        ``"sync"``: the function call alone, committed synchronously under the lock.

        Returns:
            The record rows the function returned (from ``known - 1``), its status row,
            and whether the barrier found our record (always True for ``"sync"``).
        """
        cur = self._run_prepared(conn, self._sql_within[self.commit], params)
        selects: list[list[Any]] = []
        while True:
            if (cur.statusmessage or "").startswith("SELECT"):
                selects.append(cur.fetchall())
            if not cur.nextset():
                break
        if not selects or not selects[0]:
            raise StorageError(f"ledger {self.name!r}: append_within returned no status")
        rows = selects[0]
        barrier_ok = self.commit == "sync" or (len(selects) == 2 and len(selects[1]) == 1)
        return [tuple(r[:5]) for r in rows[:-1]], tuple(rows[-1]), barrier_ok

    def _fresh_prefetch(self) -> tuple[int, list[LedgerRecord]] | None:
        """The records the last append brought back, if they are recent enough."""
        prefetch = self._prefetch
        if prefetch is None or time.monotonic() - prefetch[0] > PREFETCH_SECONDS:
            return None
        return prefetch[1], prefetch[2]

    def _append_locked(self, expected_head: int, record: LedgerRecord, payload: str) -> None:
        row_lock = self.locking == "row"

        def insert(cur: Any) -> LedgerTip:
            if self.commit == "group":
                cur.execute("SET LOCAL synchronous_commit = off")
            tip = self._locked_tip(cur, lock=row_lock)
            if tip.head != expected_head:
                raise LedgerConflictError(f"expected {expected_head} records, found {tip.head}")
            return self._store_at(cur, tip, record, payload)

        self._tip_cache = None
        new = self._write(insert, serializable=not row_lock)
        if self.commit == "group":
            self._barrier(new.last_hash, expected_head)
        self._tip_cache = new

    def _advance_tip_cache(self, start: int, prev: str, records: Sequence[LedgerRecord],
                           last_hash: str) -> None:
        """Fold records just read (and chain-checked) into the cached tip, if it is theirs.

        After losing a race the accountant reads the winners' records; folding them here
        lets the retried append go straight to the database without re-reading the tip.
        """
        tip = self._tip_cache
        if tip is None or tip.head != start or tip.last_hash != prev or not records:
            return
        for record in records[:-1]:
            tip = tip.after(record, chain_hash(tip.last_hash, record, self._key))
        self._tip_cache = tip.after(records[-1], last_hash)


def _results(cur: Any) -> list[tuple[str, list[Any]]]:
    """Each statement's status and rows (empty unless it returned rows) of the query just
    run on ``cur``, in order."""
    results: list[tuple[str, list[Any]]] = []
    while True:
        status = cur.statusmessage or ""
        results.append((status, cur.fetchall() if cur.description is not None else []))
        if not cur.nextset():
            return results
