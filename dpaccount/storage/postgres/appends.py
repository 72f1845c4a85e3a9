"""The append paths of a PostgreSQL ledger: compare-and-append in one round trip, the
basic rule decided by a server-side function, decisions under the row lock, and one
charge to several ledgers of the schema (see `PostgresStore` for the locking and commit
modes).

Every write goes through a server-side function (`dpaccount.storage.postgres.functions`)
that compares, under the ledger row's lock, the tip with the one this store saw last,
and every write transaction runs the guard just before its ``COMMIT`` (see
`dpaccount.storage.postgres.protections`). The ``row`` and ``serializable`` locking
modes write the tables directly and so need the owner's privileges.
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
    GENESIS_HASH,
    LedgerRecord,
    canonical_bytes,
    chain_hash_payload,
)
from dpaccount.storage._chain import (
    check_adds_up,
    check_extends,
    check_not_behind,
    check_records,
    fold_tip,
    missed_records,
)
from dpaccount.storage._sql import (
    LedgerTip,
    RecordRow,
    frac_text,
    parse_frac,
    renumberable,
    within_limits,
)
from dpaccount.storage.base import AppendResult, GroupAppend
from dpaccount.storage.postgres.functions import (
    APPEND_AT_FUNCTION,
    APPEND_ONE_FUNCTION,
    LOCK_FUNCTION,
)
from dpaccount.storage.postgres.protections import PostgresProtections
from dpaccount.storage.postgres.session import split_anchor

__all__ = ["PostgresAppends"]

#: Records an append brought back (the winners of a lost race, or those appended after
#: ours) answer head() and read() for this long (seconds); later calls ask the database.
PREFETCH_SECONDS = 0.05

#: A decision under the lock: the ledger's tip and the records missed since the caller's
#: head -> whether to append.
Decide = Callable[[LedgerTip, Sequence[LedgerRecord]], bool]


@attrs.frozen
class _Part:
    """One ledger's part of a decision under the lock (see `_decide_locked`)."""

    name: str
    known_head: int
    record: LedgerRecord
    settings: str | None
    seen: LedgerTip | None
    decide: Decide


class PostgresAppends(PostgresProtections):
    """The append paths of `PostgresStore` (its base class)."""

    def append(self, expected_head: int, record: LedgerRecord) -> None:
        """Append ``record`` if the ledger still has ``expected_head`` records.

        The record is committed and its commit flushed to the WAL when this returns.

        Raises:
            LedgerConflictError: Another writer appended first (possibly known without a
                round trip, from records the previous append brought back), or the
                ``query_id`` is already recorded; nothing was written.
            LedgerCorruptError: The ledger's tip does not extend the one this store saw
                last, its settings changed, or the protections do not stand (see
                docs/ledgers.md, "Fail closed"); nothing was written.
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
        if self.locking != "conditional":
            self._append_locked(expected_head, record, payload)
            return
        tip = self._seen.get(self.name)
        if tip is None or tip.head != expected_head:
            tip = self._fetch_tip()
        if tip.head != expected_head:
            raise LedgerConflictError(f"expected {expected_head} records, found {tip.head}")
        self._append_conditional(tip, record, payload)

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
        locks the ledger row, checks that its tip extends the one this store saw last,
        adds ``record.cost`` to the cached exact sums, compares them with the limits
        (see `SumLimitedStore`) and, if they fit, stores the record re-numbered to the
        head it found, hashed exactly like `chain_hash_payload()` (checked here again).
        Writers queue on the row lock instead of losing races. Durability follows the
        store's ``commit`` mode, as for `append()`.

        Raises:
            LedgerConflictError: ``record.query_id`` is already recorded.
            LedgerCorruptError: The ledger holds fewer records than ``known_head``, its
                tip does not extend the one seen last (the records since it do not add
                up to the cached sums), its settings changed, or the protections do not
                stand; nothing was written.
            StorageError: Lock timeout or a database error; nothing was written (or, if
                the connection broke during commit, the outcome is unknown and the
                charge is refused anyway).
        """
        self._writable()
        if self._key is not None:
            return self._append_within_here(known_head, record, epsilon_limit, delta_limit,
                                            delta_below)
        prefix, suffix = renumberable(record, known_head)
        seen = self._seen.get(self.name)
        params = {
            "name": self.name, "known": known_head, "prefix": prefix, "suffix": suffix,
            "qid": record.query_id, "eps": frac_text(record.cost.epsilon),
            "delta": frac_text(record.cost.delta),
            "eps_limit": None if epsilon_limit is None else frac_text(epsilon_limit),
            "delta_limit": frac_text(delta_limit),
            "delta_below": None if delta_below is None else frac_text(delta_below),
            "meta": self._meta_text, **_seen_params(seen),
        }
        self._prefetch = None
        self._pinned()  # (the guard is prepared with the pins, again after a re-pin)
        rows, status, barrier_ok = self._call(
            lambda conn: self._within_round_trip(conn, params)
        )
        head, prev, record_hash, state = int(status[0]), status[2], status[3], status[5]
        if state not in ("appended", "refused"):
            raise self._refused_by(state, self.name, known_head)
        tip = LedgerTip(head, prev, parse_frac(status[6], "epsilon_sum"),
                        parse_frac(status[7], "delta_sum"))
        if head == known_head:
            anchor = prev  # nothing was missed: the function sent no rows
        else:
            anchor, rows = split_anchor(rows, known_head)
        missed = missed_records(rows, known_head, anchor, head, prev)
        appended = state == "appended"
        self._seen[self.name] = tip.after(record, record_hash) if appended else tip
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
        return AppendResult(appended, head, tuple(missed))

    def append_decided(
        self,
        known_head: int,
        record: LedgerRecord,
        decide: Callable[[Sequence[LedgerRecord]], bool],
    ) -> AppendResult:
        """Append ``record`` at the current head if ``decide(missed)`` says so, under the
        ledger row's lock in one transaction (see `DecidingStore`): the records other
        writers appended since ``known_head`` are read and checked under the lock
        (against the chain, and adding up from the tip seen last to the tip found) and
        handed to ``decide``; the record is stored re-numbered to the head found.
        Commit modes as `append()`.

        Raises:
            LedgerConflictError: ``record.query_id`` is already recorded.
            LedgerCorruptError: Fewer records than ``known_head``, a tip that does not
                extend the one seen last, other settings, a record read back that fails
                validation, or protections that do not stand; nothing was written.
            StorageError: Lock timeout or a database error; nothing was written.
        """
        self._writable()
        part = _Part(self.name, known_head, record, self._meta_text,
                     self._seen.get(self.name), lambda _tip, missed: decide(missed))
        return self._decide_locked([part])[0]

    def append_group(self, parts: Sequence[GroupAppend]) -> list[AppendResult]:
        """Append one record to each of several ledgers of this schema, all or none, in
        one transaction: the ledgers' rows are locked in name order (so concurrent groups
        cannot deadlock), each part's settings and tip are checked, the records appended
        since its ``known_head`` are read and validated and handed to its ``decide``;
        only if every part agrees is each record stored at its ledger's head. Commit
        modes as `append()`.

        Raises:
            ConfigError: A ledger is keyed with another key than this store's.
            LedgerConflictError: A part's ``query_id`` is already recorded in its ledger.
            LedgerCorruptError: As `append_decided`, for any part; nothing was written.
            StorageError: Lock timeout or a database error; nothing was written.
        """
        self._writable()
        self._prefetch = None
        return self._decide_locked([
            _Part(p.name, p.known_head, p.record,
                  self._meta_text if p.name == self.name else p.settings,
                  self._seen.get(p.name, p.seen),
                  (lambda decide: lambda _tip, missed: decide(missed))(p.decide))
            for p in parts])

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
        part = _Part(self.name, known_head, record, self._meta_text, self._seen.get(self.name),
                     lambda tip, _missed: within_limits(
                         tip.epsilon_sum + cost.epsilon, tip.delta_sum + cost.delta,
                         epsilon_limit, delta_limit, delta_below))
        return self._decide_locked([part])[0]

    def _decide_locked(self, parts: list[_Part]) -> list[AppendResult]:
        """Under the rows' locks: check each part's tip and read the records it missed,
        ask each ``decide``, and store every record at its ledger's head if all agree.

        Two round trips: ``BEGIN`` and the lock function (locks in name order, tips and
        records); then the compare-and-append function for every part, the guard and
        ``COMMIT`` (and, for ``"group"``, the durability barrier). The rows stay locked
        from the first to the commit, one round trip.
        """
        cut = [renumberable(part.record, part.known_head) for part in parts]
        group = self.commit == "group"
        starts = [part.known_head if part.seen is None else min(part.known_head,
                                                                   part.seen.head)
                  for part in parts]
        # (Arrays spelled ARRAY[%(x_0)s, ...]: psycopg adapts scalars much faster than lists.)
        n = len(parts)
        lock_sql = (("BEGIN; SET LOCAL synchronous_commit = off; " if group else "BEGIN; ")
                    + f"SELECT * FROM {self._s}.{LOCK_FUNCTION}({_array('names', n, 'text')}, "
                    f"{_array('starts', n, 'bigint')})")
        columns = (("names", "text"), ("heads", "bigint"), ("prevs", "text"), ("epss", "text"),
                   ("deltas", "text"), ("metas", "text"), ("payloads", "text"),
                   ("hashes", "text"), ("qids", "text"), ("new_epss", "text"),
                   ("new_deltas", "text"))
        if n == 1:  # one statement, not the loop over ledgers (see functions.py)
            store_call = (f"SELECT %(names_0)s::text, {self._s}.{APPEND_ONE_FUNCTION}("
                          + ", ".join(f"%({key}_0)s::{kind}" for key, kind in columns) + ")")
        else:
            store_call = (f"SELECT r_name, r_status FROM {self._s}.{APPEND_AT_FUNCTION}("
                          + ", ".join(_array(key, n, kind) for key, kind in columns) + ")")
        store_sql = (store_call + "; EXECUTE dpaccount_guard; COMMIT"
                     + (f"; {self._sql_barrier}" if group else ""))
        lock_params = {**_scalars("names", [p.name for p in parts]),
                       **_scalars("starts", starts)}

        def run(conn: Any) -> tuple[list[tuple[LedgerTip, list[LedgerRecord]]],
                                    list[LedgerTip] | None]:
            self._prepare(conn)
            cur = self._pg.ClientCursor(conn)
            try:
                cur.execute(lock_sql, lock_params)
                locked = [rows for status, rows in _results(cur) if status.startswith("SELECT")]
                found = self._check_locked(parts, locked[0] if locked else [])
                if not all([part.decide(tip, missed)
                            for part, (tip, missed) in zip(parts, found, strict=True)]):
                    conn.execute("ROLLBACK")
                    return found, None
                new, params = self._store_params(parts, cut, found)
                values = {k: v for key, column in params.items()
                          for k, v in _scalars(key, column).items()}
                cur.execute(store_sql, {**values, "name": parts[-1].name,
                                        "seq": new[-1].head - 1, "hash": new[-1].last_hash})
                done = _results(cur)
                statuses = {str(row[0]): str(row[1]) for row in done[0][1]}
                for part in parts:
                    if statuses.get(part.name) not in ("appended", "ok"):
                        raise self._refused_by(str(statuses.get(part.name)), part.name,
                                               part.known_head)
                if set(statuses.values()) != {"appended"}:
                    raise StorageError("a ledger's row changed while it was locked; "
                                       "nothing was written")
                if group and (len(done) != 4 or len(done[3][1]) != 1):
                    raise StorageError(
                        f"ledger {parts[-1].name!r}: record {new[-1].head - 1} was not found "
                        "after its commit; the charge is refused"
                    )
            except BaseException:
                self._rollback(conn)
                raise
            return found, new

        self._pinned()  # pinned now, outside the transaction that runs the guard
        found, new = self._call(run)
        for i, part in enumerate(parts):
            self._seen[part.name] = found[i][0] if new is None else new[i]
        return [AppendResult(new is not None, tip.head, tuple(missed)) for tip, missed in found]

    def _check_locked(self, parts: list[_Part], rows: list[Any]
                      ) -> list[tuple[LedgerTip, list[LedgerRecord]]]:
        """Each part's tip (as the lock function returned it, with its records from
        ``min(known_head, seen.head) - 1`` on), checked: settings, key, extending the tip
        seen last, and the records missed since ``known_head`` valid and adding up to it."""
        tips: dict[str, Any] = {}
        records: dict[str, list[RecordRow]] = {}
        for row in rows:
            if row[8] is not None:  # a tip row: (head, last_hash, eps, delta, meta)
                tips[row[0]] = (row[1], row[4], row[6], row[7], row[8])
            else:
                records.setdefault(row[0], []).append(tuple(row[1:6]))
        found = []
        for part in parts:
            own = part.name == self.name
            tip = self._tip_of_row(tips.get(part.name), None if own else part.name,
                                   None if own else part.settings)
            check_not_behind(tip.head, part.known_head)
            stored = records.get(part.name, [])
            by_seq = {row[0]: row for row in stored}
            seen = part.seen
            if seen is not None and tip.head > seen.head:
                anchor = GENESIS_HASH if seen.head == 0 else (
                    str(by_seq[seen.head - 1][3]) if seen.head - 1 in by_seq else None)
                check_extends(tip, seen, anchor)
            else:
                check_extends(tip, seen, None)
            since = [row for row in stored if row[0] >= part.known_head - 1]
            prev, since = split_anchor(since, part.known_head)
            missed = missed_records(since, part.known_head, prev, tip.head, tip.last_hash,
                                    self._key)
            check_adds_up(seen, part.known_head, missed, since, tip)
            found.append((tip, missed))
        return found

    def _store_params(self, parts: list[_Part], cut: list[tuple[str, str]],
                      found: list[tuple[LedgerTip, list[LedgerRecord]]]
                      ) -> tuple[list[LedgerTip], dict[str, Any]]:
        """The new tips and the compare-and-append function's arguments."""
        new: list[LedgerTip] = []
        params: dict[str, list[Any]] = {key: [] for key in (
            "names", "heads", "prevs", "epss", "deltas", "metas", "payloads", "hashes",
            "qids", "new_epss", "new_deltas")}
        for part, (prefix, suffix), (tip, _) in zip(parts, cut, found, strict=True):
            payload = f"{prefix}{tip.head}{suffix}"
            record_hash = chain_hash_payload(tip.last_hash, payload, self._key)
            after = tip.after(part.record, record_hash)
            new.append(after)
            for key, value in (("names", part.name), ("heads", tip.head),
                               ("prevs", tip.last_hash), ("epss", frac_text(tip.epsilon_sum)),
                               ("deltas", frac_text(tip.delta_sum)), ("metas", part.settings),
                               ("payloads", payload), ("hashes", record_hash),
                               ("qids", part.record.query_id),
                               ("new_epss", frac_text(after.epsilon_sum)),
                               ("new_deltas", frac_text(after.delta_sum))):
                params[key].append(value)
        return new, params

    def _refused_by(self, status: str, name: str, known_head: int) -> StorageError:
        """The error for a server-side function's status other than appended/refused."""
        if status == "migrated":
            return self._migrated(None if name == self.name else name)
        if status == "behind":
            return LedgerCorruptError(
                f"ledger {name!r} holds fewer records than this writer has already seen "
                f"({known_head} or more): someone truncated it; nothing was written",
                seq=known_head)
        if status == "diverged":
            return LedgerCorruptError(
                f"ledger {name!r}: the record before the head this writer read is not the "
                "one it read: the ledger's chain changed (a server crash lost an "
                "asynchronous commit, or someone rewrote it); nothing was written; reopen "
                "the ledger", seq=max(known_head - 1, 0))
        if status == "tampered":
            return LedgerCorruptError(
                f"ledger {name!r}: its cached tip (last link or sums) is not the one this "
                "writer saw and does not extend it: someone reset or edited it around the "
                "protective triggers; nothing was written and the query must not run",
                seq=max(known_head - 1, 0))
        return StorageError(f"ledger {name!r}: unexpected status {status!r} from the "
                            "server; nothing was written")

    def _append_conditional(self, tip: LedgerTip, record: LedgerRecord, payload: str) -> None:
        record_hash = chain_hash_payload(tip.last_hash, payload, self._key)
        new = tip.after(record, record_hash)
        params = {
            "name": self.name, "seq": tip.head, "prev": tip.last_hash,
            "eps": frac_text(tip.epsilon_sum), "delta": frac_text(tip.delta_sum),
            "meta": self._meta_text, "payload": payload, "hash": record_hash,
            "qid": record.query_id, "new_eps": frac_text(new.epsilon_sum),
            "new_delta": frac_text(new.delta_sum),
        }
        self._pinned()
        status, rows = self._call(lambda conn: self._append_round_trip(conn, params))
        if status == "appended":
            tip, rows = new, rows[1:]  # our own record comes first
        elif status != "conflict":
            raise self._refused_by(status, self.name, tip.head)
        try:
            records = check_records(rows, tip.head, tip.last_hash, self._key)
        except LedgerCorruptError:
            records, rows = [], []  # the next read() finds and reports it
        self._seen[self.name] = fold_tip(tip, records, rows)
        if records:
            self._prefetch = (time.monotonic(), tip.head, records)
        if status == "conflict":
            raise LedgerConflictError(
                f"expected {tip.head} records: another writer appended first"
            )

    def _append_round_trip(
        self, conn: Any, params: dict[str, Any]
    ) -> tuple[str, list[RecordRow]]:
        """Run one append's statements in one round trip (see ``_sql_append``).

        ``"group"``: ``BEGIN``, ``SET LOCAL synchronous_commit = off``, the
        compare-and-append function, the guard, ``COMMIT`` (the row lock is released
        here, before any flush); then, in one implicit transaction with the session's
        synchronous commit, the barrier (it writes a WAL record only if our record is
        stored, so the commit must flush the WAL through its own commit record, hence
        through the append's) and the read of the records from ``seq`` on. After a lost
        race the barrier writes nothing and the commit costs no flush. ``"sync"``: the
        append, the guard and the read in one implicit transaction, committed
        synchronously while the ledger row is still locked.

        Returns:
            The function's status (``appended``, ``conflict`` or why it refused) and the
            rows read last (starting with our own record if it was appended).
        """
        cur = self._run_prepared(conn, self._sql_append[self.commit], params)
        selects: list[list[Any]] = []
        while True:
            if (cur.statusmessage or "").startswith("SELECT"):
                selects.append(cur.fetchall())
            if not cur.nextset():
                break
        status = str(selects[0][0][0]) if selects and selects[0] else "missing"
        rows: list[RecordRow] = [tuple(r) for r in selects[-1]]
        barrier_ok = self.commit == "sync" or len(selects[2]) == 1
        if status == "appended" and (not barrier_ok or not rows
                                     or rows[0][3] != params["hash"]):
            raise StorageError(
                f"ledger {self.name!r}: record {params['seq']} was not found after its "
                "commit; the charge is refused"
            )
        return status, rows

    def _within_round_trip(
        self, conn: Any, params: dict[str, Any]
    ) -> tuple[list[RecordRow], tuple[Any, ...], bool]:
        """Run append_within's statements in one round trip (see ``_sql_within``).

        ``"group"``: ``BEGIN``, ``SET LOCAL synchronous_commit = off``, the function
        call, the guard, ``COMMIT`` (releasing the row lock before any flush), then the
        barrier in its own synchronous transaction: it writes a WAL record only if our
        record is stored, so its commit flushes the WAL through the append's commit
        record. ``"sync"``: the function call and the guard, committed synchronously
        under the lock.

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
        barrier_ok = self.commit == "sync" or (len(selects) == 3 and len(selects[2]) == 1)
        return [tuple(r[:5]) for r in rows[:-1]], tuple(rows[-1]), barrier_ok

    def _fresh_prefetch(self) -> tuple[int, list[LedgerRecord]] | None:
        """The records the last append brought back, if they are recent enough."""
        prefetch = self._prefetch
        if prefetch is None or time.monotonic() - prefetch[0] > PREFETCH_SECONDS:
            return None
        return prefetch[1], prefetch[2]

    def _append_locked(self, expected_head: int, record: LedgerRecord, payload: str) -> None:
        """The ``row`` and ``serializable`` locking modes: the statements one by one, on
        the tables directly (the owner's privileges), then the guard."""
        row_lock = self.locking == "row"

        def insert(cur: Any) -> LedgerTip:
            if self.commit == "group":
                cur.execute("SET LOCAL synchronous_commit = off")
            tip = self._locked_tip(cur, lock=row_lock)
            if tip.head != expected_head:
                raise LedgerConflictError(f"expected {expected_head} records, found {tip.head}")
            new = self._store_at(cur, tip, record, payload)
            self._run_guard(cur)
            return new

        new = self._write(insert, serializable=not row_lock)
        self._seen[self.name] = new
        if self.commit == "group":
            self._barrier(new.last_hash, expected_head)


def _array(key: str, n: int, kind: str) -> str:
    """``ARRAY[%(key_0)s, ...]::kind[]``: an array argument of ``n`` scalar parameters."""
    return "ARRAY[" + ", ".join(f"%({key}_{i})s" for i in range(n)) + f"]::{kind}[]"


def _scalars(key: str, values: Sequence[Any]) -> dict[str, Any]:
    """The parameters of `_array` ``key``."""
    return {f"{key}_{i}": value for i, value in enumerate(values)}


def _seen_params(seen: LedgerTip | None) -> dict[str, Any]:
    """A server-side function's ``p_seen_*`` arguments (all NULL: nothing seen yet)."""
    if seen is None:
        return {"seen_head": None, "seen_hash": None, "seen_eps": None, "seen_delta": None}
    return {"seen_head": seen.head, "seen_hash": seen.last_hash,
            "seen_eps": frac_text(seen.epsilon_sum), "seen_delta": frac_text(seen.delta_sum)}


def _results(cur: Any) -> list[tuple[str, list[Any]]]:
    """Each statement's status and rows (empty unless it returned rows) of the query just
    run on ``cur``, in order."""
    results: list[tuple[str, list[Any]]] = []
    while True:
        status = cur.statusmessage or ""
        results.append((status, cur.fetchall() if cur.description is not None else []))
        if not cur.nextset():
            return results
