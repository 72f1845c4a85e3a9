"""A PostgreSQL ledger's session and the row-level steps every append path shares.

`PostgresSession` owns the connection (one per store, re-opened after a break; behind a
pooler, refused unless the pooler gives it a session of its own), maps database errors
to the error tree, runs transactions (retrying serialization failures) and the prepared
statements of an append's single round trip, and reads, locks and advances a ledger's
row. `dpaccount.storage.postgres.appends` builds the append paths on it, and
`PostgresStore` the rest of the store.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from dpaccount._redact import redact_driver_error
from dpaccount.errors import (
    ConfigError,
    LedgerConflictError,
    LedgerCorruptError,
    ReadOnlyLedgerError,
    StorageError,
)
from dpaccount.keys import LedgerKey
from dpaccount.records import (
    GENESIS_HASH,
    LedgerMeta,
    LedgerRecord,
    chain_hash_payload,
)
from dpaccount.storage._chain import Snapshot, check_extends
from dpaccount.storage._sql import LedgerTip, RecordRow, check_key, frac_text, parse_frac
from dpaccount.storage.postgres.functions import GUARD_TAG, FunctionChangedError

__all__ = ["RECORD_COLUMNS", "PostgresSession", "split_anchor"]

T = TypeVar("T")
_log = logging.getLogger(__name__)
Locking = Literal["conditional", "row", "serializable"]
Commit = Literal["group", "sync"]

SERIALIZATION_RETRIES = 50
RECORD_COLUMNS = "seq, payload, prev_hash, hash, query_id"
#: How long a connection behind a pooler may wait for its own server session (seconds)
#: before the pooler is taken to hand out sessions per transaction.
POOLER_PROBE_SECONDS = 2.0


class PostgresSession:
    """The connection and row-level steps of a `PostgresStore` (its base class; the
    attributes are set by `PostgresStore.__init__`)."""

    name: str
    schema: str
    locking: Locking
    commit: Commit
    lock_timeout: float
    read_only: bool
    full_verify: bool
    snapshot: Snapshot | None
    _pg: Any
    _key: LedgerKey | None
    _conninfo: str
    _s: str
    _prepare_sql: dict[str, str]
    _sql_append: dict[str, str]
    _sql_within: dict[str, str]
    _sql_barrier: str
    _prepared_on: Any
    _prepared_pins: Any
    _prefetch: tuple[float, int, list[LedgerRecord]] | None
    _lock: threading.RLock
    _meta_text: str | None
    #: The tip of each ledger this store last read or wrote (see `seen_tip`).
    _seen: dict[str, LedgerTip]
    #: The functions and triggers pinned for the guard (set by `_pin`).
    _pins: Any
    _conn: Any

    @property
    def seen_tip(self) -> LedgerTip | None:
        """The tip of this store's ledger as it last read or wrote it (None: not yet).

        Every write checks, under the ledger row's lock, that the ledger's tip still
        extends it (`dpaccount.storage._chain.check_extends`)."""
        return self._seen.get(self.name)

    def _pin(self, repin: bool = False) -> Any:  # pragma: no cover - PostgresProtections
        raise NotImplementedError

    def _connection(self) -> Any:
        if self._conn is None or self._conn.closed or self._conn.broken:
            if self._conn is not None:
                _log.debug("PostgreSQL ledger %r: the connection was closed or broken; "
                           "reconnecting", self.name)
            conn = self._pg.connect(self._conninfo, autocommit=True)
            try:
                pid, sync = conn.execute(
                    "SELECT pg_backend_pid(), current_setting('synchronous_commit')"
                ).fetchone()
                if pid != conn.info.backend_pid:  # a pooler answered the connection
                    self._refuse_transaction_pooling(conn)
                ms = max(int(self.lock_timeout * 1000), 1)
                conn.execute(f"SET lock_timeout = {ms}")
                if self.read_only:
                    conn.execute("SET default_transaction_read_only = on")
                # A charge must be flushed before append() returns: never run with the
                # server's synchronous_commit = off (stricter settings are kept).
                if sync == "off":
                    conn.execute("SET synchronous_commit = on")
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _refuse_transaction_pooling(self, conn: Any) -> None:
        """Refuse a pooler that does not give this connection one server session.

        Behind PgBouncer (or a similar pooler) the backend key the client was sent is
        not the server process's id. In session mode the connection keeps its server
        process for its whole life, which the store needs (session settings, prepared
        statements, a session advisory lock while creating the schema). To tell: a
        second connection opens a transaction, which pins the server process that
        ``conn`` just released if the pooler hands processes out per transaction; then
        ``conn`` asks for its process id. The same id as before means a session of its
        own. Another id, or waiting until the second transaction ends, means
        transaction (or statement) pooling.

        Raises:
            ConfigError: The pooler hands out server processes per transaction or
                statement.
        """
        first = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        result: list[Any] = []
        probe = self._pg.connect(self._conninfo, autocommit=True)
        try:
            try:
                probe.execute("BEGIN")
                probe.execute("SELECT pg_backend_pid()")
            except self._pg.Error:
                result.append("statement")  # a multi-statement transaction is refused
            else:
                asker = threading.Thread(
                    target=lambda: result.append(
                        conn.execute("SELECT pg_backend_pid()").fetchone()[0]
                    ),
                    daemon=True,
                )
                asker.start()
                asker.join(POOLER_PROBE_SECONDS)
                if asker.is_alive():
                    result.append("waited for the other transaction")
                probe.execute("COMMIT")
                asker.join()
        finally:
            probe.close()
        if result != [first]:
            raise ConfigError(
                f"ledger {self.name!r}: the connection goes through a pooler (PgBouncer?) "
                "that hands out server sessions per transaction or statement; a ledger "
                "needs one server session per connection. Use the pooler's session mode "
                "(pool_mode = session) for the ledger's database, or connect to "
                "PostgreSQL directly"
            )

    def _call(self, body: Callable[[Any], T]) -> T:
        """Run ``body(connection)``, mapping database errors to the error tree.

        When the guard found only a pinned function's row changed (`FunctionChangedError`),
        the functions are checked again and, if they are still dpaccount's (a ``GRANT``
        changed their privileges), pinned anew and ``body`` run once more: its
        transaction was rolled back, so nothing was written.
        """
        with self._lock:
            try:
                return self._call_once(body)
            except FunctionChangedError:
                _log.debug("PostgreSQL ledger %r: a server-side function changed since it "
                           "was checked; checking the functions again and retrying once",
                           self.name)
                self._pin(repin=True)
            return self._call_once(body)

    def _call_once(self, body: Callable[[Any], T]) -> T:
        errors = self._pg.errors
        with self._lock:
            try:
                return body(self._connection())
            except errors.InvalidTextRepresentation as exc:
                raise self._guard_failure(exc) from exc
            except errors.LockNotAvailable as exc:
                raise StorageError(
                    f"could not lock ledger {self.name!r} within {self.lock_timeout:g} s; "
                    "nothing was written"
                ) from exc
            except errors.UniqueViolation as exc:
                raise LedgerConflictError(f"a concurrent writer recorded first: {exc}") from exc
            except self._pg.Error as exc:
                # libpq's text may quote the connection string: redacted, and chained
                # only if nothing along its chain quotes a secret.
                message, chain = redact_driver_error(exc, self._conninfo)
                if chain:
                    raise StorageError(
                        f"PostgreSQL failed for ledger {self.name!r}: {message}"
                    ) from exc
            raise StorageError(f"PostgreSQL failed for ledger {self.name!r}: {message}")

    def _guard_failure(self, exc: Exception) -> StorageError:
        """The error for a failed statement: the guard's (see `GUARD_TAG`), or any other."""
        text = str(exc)
        if GUARD_TAG not in text:
            return StorageError(f"PostgreSQL failed for ledger {self.name!r}: {exc}")
        what = text.split(GUARD_TAG, 1)[1]
        if what.startswith("functions"):
            return FunctionChangedError(
                f"a server-side function of schema {self.schema!r} changed since this "
                "writer checked it; nothing was written")
        if what.startswith("triggers"):
            return LedgerCorruptError(
                f"the protective triggers of schema {self.schema!r} were changed "
                "(disabled, dropped, re-created or enabled again) since this writer opened "
                "the ledger; nothing was written and the query must not run. Check the "
                "ledger with `dpaccount ledger verify`, then reopen it")
        return LedgerCorruptError(
            "this session's session_replication_role is not 'origin', so the protective "
            "triggers do not fire in it; nothing was written and the query must not run. "
            "Remove the setting (ALTER ROLE/DATABASE ... RESET session_replication_role)")

    def _write(self, body: Callable[[Any], T], serializable: bool = False) -> T:
        """Run ``body(cursor)`` in one write transaction (retrying serialization
        failures); every such body ends with the guard, so the protections are checked
        and pinned first, outside the transaction."""
        self._writable()
        if self._pins is None:
            self._pin()

        def run(conn: Any) -> T:
            for _attempt in range(SERIALIZATION_RETRIES):
                try:
                    with conn.transaction():
                        if serializable:
                            conn.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
                        return body(conn.cursor())
                except (
                    self._pg.errors.SerializationFailure,
                    self._pg.errors.DeadlockDetected,
                ) as exc:
                    _log.debug("PostgreSQL ledger %r: %s (attempt %d of %d); retrying the "
                               "transaction", self.name, type(exc).__name__, _attempt + 1,
                               SERIALIZATION_RETRIES)
                    continue
            raise StorageError(
                f"ledger {self.name!r}: serialization failures persisted after "
                f"{SERIALIZATION_RETRIES} retries; nothing was written"
            )

        return self._call(run)

    def _read(self, body: Callable[[Any], T], repeatable: bool = False) -> T:
        def run(conn: Any) -> T:
            with conn.transaction():
                if repeatable:
                    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                return body(conn.cursor())

        return self._call(run)

    def _prepare(self, conn: Any) -> None:
        """Prepare the append statements once per connection (again after they are lost).

        The connection is this store's own, so ``DEALLOCATE ALL`` first makes preparing
        idempotent: after psycopg (or a pooler) dropped some or all of them, they are
        prepared afresh.
        """
        pins = self._pins
        if self._prepared_on is conn and self._prepared_pins is pins:
            return
        try:
            conn.execute("DEALLOCATE ALL")
            for name, sql in self._prepare_sql.items():
                conn.execute(f"PREPARE {name} {sql}")
            if pins is not None:  # the guard, for the pins it checks (see protections)
                conn.execute(f"PREPARE dpaccount_guard AS {pins.guard()}")
        except self._pg.Error:
            conn.close()  # start over on a fresh connection next time
            raise
        self._prepared_on, self._prepared_pins = conn, pins

    def _run_prepared(self, conn: Any, sql: str, params: dict[str, Any]) -> Any:
        """Execute one round trip of prepared statements; survive lost statements.

        A failed transaction makes psycopg reset the session's prepared statements
        (``DEALLOCATE ALL``), e.g. after losing a ``query_id`` race: they are prepared
        again and the round trip retried once, so the writer keeps working.
        """
        for attempt in (1, 2):
            self._prepare(conn)
            cur = self._pg.ClientCursor(conn)
            try:
                cur.execute(sql, params)
            except self._pg.errors.InvalidSqlStatementName:
                self._rollback(conn)
                self._prepared_on = None
                if attempt == 2:
                    raise
                _log.debug("PostgreSQL ledger %r: the session lost its prepared "
                           "statements; preparing them again", self.name)
                continue
            except self._pg.Error:
                self._rollback(conn)
                self._prepared_on = None  # the session may have lost them: re-prepare
                raise
            return cur
        raise StorageError("unreachable")  # pragma: no cover

    def _rollback(self, conn: Any) -> None:
        """End a failed explicit transaction so the connection can be reused."""
        idle = self._pg.pq.TransactionStatus.IDLE
        if conn.closed or conn.broken or conn.info.transaction_status == idle:
            return
        try:
            conn.execute("ROLLBACK")
        except self._pg.Error:
            conn.close()  # reconnect on the next call

    def _fetchone(self, query: str, params: tuple[Any, ...]) -> Any:
        return self._call(lambda conn: conn.execute(query, params).fetchone())

    def _writable(self) -> None:
        if self.read_only:
            raise ReadOnlyLedgerError(
                f"ledger {self.name!r} was opened read-only; nothing was written"
            )

    def _keyed(self, meta: LedgerMeta) -> LedgerMeta:
        """``meta`` naming this store's key (or none)."""
        return meta.model_copy(update={"key_id": None if self._key is None else self._key.key_id})

    def _check_key(self) -> None:
        row = self._fetchone(f"SELECT meta FROM {self._s}.ledgers WHERE name = %s", (self.name,))
        check_key(None if row is None else str(row[0]), self._key, self.name)

    def _migrated(self, name: str | None = None) -> StorageError:
        return LedgerCorruptError(
            f"ledger {self.name if name is None else name!r} was migrated to other settings "
            "(budget, rule or relation) since it was opened; nothing was written. Reopen "
            "it, so that every charge is decided under the stored settings."
        )

    def _check_meta(self, stored: Any) -> None:
        """Fail closed if the stored settings are not the ones this store opened under
        (call with the ledger row locked)."""
        if self._meta_text is not None and str(stored) != self._meta_text:
            raise self._migrated()

    def _locked_tip(self, cur: Any, lock: bool, name: str | None = None,
                    settings: str | None = None) -> LedgerTip:
        """The ledger row's tip (``FOR UPDATE`` when ``lock``), after checking that its
        settings are the ones this store opened under (for another ledger of the schema,
        ``name``: that they are ``settings``, and keyed with this store's key)."""
        cur.execute(
            f"SELECT head, last_hash, epsilon_sum, delta_sum, meta FROM {self._s}.ledgers "
            "WHERE name = %s" + (" FOR UPDATE" if lock else ""),
            (self.name if name is None else name,),
        )
        tip = self._tip_of_row(cur.fetchone(), name, settings)
        seen = self._seen.get(self.name if name is None else name)
        anchor = None
        if seen is not None and tip.head > seen.head:
            anchor = self._hash_at(cur, seen.head - 1, name)
        check_extends(tip, seen, anchor)
        return tip

    def _hash_at(self, cur: Any, seq: int, name: str | None = None) -> str | None:
        """The stored link of record ``seq`` (the genesis hash for -1; None: missing)."""
        if seq < 0:
            return GENESIS_HASH
        row = cur.execute(
            f"SELECT hash FROM {self._s}.records WHERE ledger = %s AND seq = %s",
            (self.name if name is None else name, seq),
        ).fetchone()
        return None if row is None else str(row[0])

    def _tip_of_row(self, row: Any, name: str | None = None,
                    settings: str | None = None) -> LedgerTip:
        """The tip in a ``(head, last_hash, epsilon_sum, delta_sum, meta)`` row of the
        ledgers table, its settings checked as `_locked_tip` says."""
        if row is None:
            raise StorageError(f"ledger {self.name if name is None else name!r} is not "
                               "initialized")
        if name is None:
            self._check_meta(row[4])
        else:
            if settings is not None and str(row[4]) != settings:
                raise self._migrated(name)
            check_key(str(row[4]), self._key, name)
        return LedgerTip(int(row[0]), row[1], parse_frac(row[2], "epsilon_sum"),
                         parse_frac(row[3], "delta_sum"))

    def _rows_since(self, executor: Any, start: int, name: str | None = None
                    ) -> tuple[str, list[RecordRow]]:
        """The hash of record ``start - 1`` and the rows from ``start`` on, in one
        statement (one snapshot, one round trip)."""
        rows: list[RecordRow] = executor.execute(
            f"SELECT {RECORD_COLUMNS} FROM {self._s}.records WHERE ledger = %s "
            "AND seq >= %s ORDER BY seq",
            (self.name if name is None else name, start - 1 if start > 0 else 0),
        ).fetchall()
        return split_anchor(rows, start)

    def _store_at(self, cur: Any, tip: LedgerTip, record: LedgerRecord, payload: str,
                  name: str | None = None) -> LedgerTip:
        """Insert ``record`` (numbered ``tip.head``) and advance the ledger row; the new
        tip (in the caller's transaction, with the row locked)."""
        name = self.name if name is None else name
        record_hash = chain_hash_payload(tip.last_hash, payload, self._key)
        new = tip.after(record, record_hash)
        self._insert_record(cur, record, payload, tip.last_hash, record_hash, name)
        cur.execute(
            f"UPDATE {self._s}.ledgers SET head = %s, last_hash = %s, epsilon_sum = %s, "
            "delta_sum = %s WHERE name = %s",
            (new.head, new.last_hash, frac_text(new.epsilon_sum), frac_text(new.delta_sum),
             name),
        )
        return new

    def _insert_record(self, cur: Any, record: LedgerRecord, payload: str, prev: str,
                       record_hash: str, name: str | None = None) -> None:
        cur.execute(
            f"INSERT INTO {self._s}.records VALUES (%s, %s, %s, %s, %s, %s)",
            (self.name if name is None else name, record.seq, payload, prev, record_hash,
             record.query_id),
        )

    def _tip_row(self, cur: Any) -> LedgerTip | None:
        cur.execute(
            f"SELECT head, last_hash, epsilon_sum, delta_sum FROM {self._s}.ledgers "
            "WHERE name = %s",
            (self.name,),
        )
        row = cur.fetchone()
        if row is None:
            return None
        return LedgerTip(
            int(row[0]), row[1], parse_frac(row[2], "epsilon_sum"),
            parse_frac(row[3], "delta_sum"),
        )

    def _fetch_tip(self) -> LedgerTip:
        """The ledger's tip as stored now, checked to extend the one seen last."""

        def get(conn: Any) -> LedgerTip:
            cur = conn.cursor()
            tip = self._tip_row(cur)
            if tip is None:
                raise StorageError(f"ledger {self.name!r} is not initialized")
            seen = self._seen.get(self.name)
            anchor = None
            if seen is not None and tip.head > seen.head:
                anchor = self._hash_at(cur, seen.head - 1)
            check_extends(tip, seen, anchor)
            return tip

        tip: LedgerTip = self._call(get)
        return tip

    def _barrier(self, record_hash: str, seq: int, name: str | None = None) -> None:
        """Wait until the append of record ``seq`` is flushed (see ``_append_round_trip``)."""
        params = {"name": self.name if name is None else name, "seq": seq, "hash": record_hash}

        def run(conn: Any) -> None:
            if conn.execute(self._sql_barrier, params).fetchone() is None:
                raise StorageError(
                    f"ledger {self.name!r}: record {seq} vanished before its durability "
                    "barrier; the charge is refused"
                )

        self._call(run)


def split_anchor(rows: list[RecordRow], start: int) -> tuple[str, list[RecordRow]]:
    """Rows read from ``seq >= start - 1``: the hash of record ``start - 1`` (the genesis
    hash for 0) and the rows from ``start`` on (``rows`` loses its first row).

    Raises:
        LedgerCorruptError: Record ``start - 1`` is not the first row.
    """
    if start == 0:
        return GENESIS_HASH, rows
    if not rows or rows[0][0] != start - 1:
        raise LedgerCorruptError(f"record {start - 1} is missing", seq=start - 1)
    return str(rows.pop(0)[3]), rows
