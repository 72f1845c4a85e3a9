"""`PostgresStore`: the ledger's interface and verification (migrations and snapshots are
in `history`; see `dpaccount.storage.postgres` for how appends lock and commit)."""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

from dpaccount.errors import (
    ConfigError,
    LedgerCorruptError,
    StorageError,
    missing_extra,
)
from dpaccount.keys import LedgerKey
from dpaccount.records import (
    GENESIS_HASH,
    SCHEMA_VERSION,
    LedgerMeta,
    LedgerRecord,
    check_ledger_name,
    stored_name,
)
from dpaccount.storage._chain import (
    VERIFY_CHUNK,
    Snapshot,
    check_ledger,
    check_records,
    check_since_snapshot,
    seen_after_read,
    seen_after_verify,
    snapshot_of,
)
from dpaccount.storage._sql import (
    LedgerTip,
    MetaRow,
    RecordRow,
    parse_meta,
)
from dpaccount.storage.postgres.functions import (
    APPEND_ONE_FUNCTION,
    WITHIN_V4_FUNCTION,
)
from dpaccount.storage.postgres.history import PostgresHistory
from dpaccount.storage.postgres.protections import Pins
from dpaccount.storage.postgres.roles import PostgresRoles
from dpaccount.storage.postgres.schema import present_sql, schema_sql
from dpaccount.storage.postgres.session import RECORD_COLUMNS, Commit, Locking

__all__ = ["PostgresStore"]

_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


class PostgresStore(PostgresHistory, PostgresRoles):
    """One named ledger in a PostgreSQL database (many ledgers may share a schema).

    Args:
        conninfo: A libpq connection string or URL (``postgresql://user@host/db``).
        name: The ledger's name.
        schema: The schema holding the tables (created if missing).
        lock_timeout: Seconds to wait for the ledger row's lock before failing closed.
        locking: How appends exclude each other (see the module docstring).
        commit: How an append is made durable before `append()` returns:
            ``"group"`` (asynchronous commit, then a shared synchronous barrier) or
            ``"sync"`` (a synchronous commit under the row lock). See the module
            docstring.
        key: The ledger's `LedgerKey` if it is keyed (its chain is then an HMAC chain
            under the key); a new ledger made with a key is keyed for good. A keyed
            ledger's `append_within()` decides in this process under the row lock, since
            the server never sees the key.
        read_only: Open for reading only (dashboards, auditors): nothing is created,
            the session refuses writes (``default_transaction_read_only``), and every
            write raises `ReadOnlyLedgerError`.
        full_verify: Check the whole ledger when it is opened (`verify`) instead of
            from its latest snapshot on (`verify_recent`, O(records since)).

    Raises:
        ImportError: psycopg is not installed (``pip install "dpaccount[postgres]"``).
        ConfigError: An invalid schema name, locking mode or commit mode.
        StorageError: The server cannot be reached or the tables cannot be created.
    """

    def __init__(
        self,
        conninfo: str,
        name: str = "default",
        *,
        schema: str = "dpaccount",
        lock_timeout: float = 30.0,
        locking: Locking = "conditional",
        commit: Commit = "group",
        key: LedgerKey | None = None,
        read_only: bool = False,
        full_verify: bool = False,
    ) -> None:
        try:
            import psycopg
        except ImportError:
            raise missing_extra("psycopg", "postgres") from None
        self._pg: Any = psycopg
        if not isinstance(schema, str) or not _SCHEMA_NAME.match(schema):
            raise ConfigError(f"invalid PostgreSQL schema name {schema!r}")
        if locking not in ("conditional", "row", "serializable"):
            raise ConfigError(
                f"unknown locking {locking!r}; use 'conditional', 'row' or 'serializable'"
            )
        if commit not in ("group", "sync"):
            raise ConfigError(f"unknown commit mode {commit!r}; use 'group' or 'sync'")
        check_ledger_name(name)  # before anything is opened or created (ConfigError)
        self.name = name
        self.schema = schema
        self.locking: Locking = locking
        self.commit: Commit = commit
        self.lock_timeout = float(lock_timeout)
        self._key = key
        self.read_only = bool(read_only)
        self.full_verify = bool(full_verify)
        #: The snapshot opening verified from (the accountant reopens from its state).
        self.snapshot: Snapshot | None = None
        self._conninfo = conninfo
        self._s = f'"{schema}"'
        # Prepared once per connection (see _prepare), run from one multi-statement
        # query per append.
        self._prepare_sql = {
            # Compare-and-append of one record (see functions.APPEND_ONE_FUNCTION): ($1
            # name, $2 seq, $3 prev, $4 eps, $5 delta: the tip expected; $6 the settings
            # expected (NULL: not checked); $7 payload, $8 hash, $9 query_id, $10 and
            # $11 the new sums.
            "dpaccount_append": "(text, bigint, text, text, text, text, text, text, text, "
            f"text, text) AS SELECT {self._s}.{APPEND_ONE_FUNCTION}($1, $2, $3, $4, $5, $6, "
            "$7, $8, $9, $10, $11)",
            # Writes one WAL record (so its commit must flush) only if our record is stored.
            "dpaccount_barrier": "(text, bigint, text) AS SELECT pg_logical_emit_message(true, "
            f"'dpaccount', '') FROM {self._s}.records "
            "WHERE ledger = $1 AND seq = $2 AND hash = $3",
            # The records from seq on, in a fresh snapshot taken after the commits: ours
            # first if we won, else the winners'.
            "dpaccount_since": f"(text, bigint) AS SELECT {RECORD_COLUMNS} FROM "
            f"{self._s}.records WHERE ledger = $1 AND seq >= $2 ORDER BY seq",
            # append_within: see functions._within_sql for the arguments.
            "dpaccount_within": "(text, bigint, text, text, text, text, text, text, text, "
            f"text, text, bigint, text, text, text) AS SELECT * FROM {self._s}."
            f"{WITHIN_V4_FUNCTION}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, "
            "$14, $15)",
            # Flushes only if our record is stored (at the head the function found; a
            # concurrent record may share our payload up to its seq, hence EXISTS).
            "dpaccount_within_barrier": "(text, bigint, text, text) AS SELECT "
            "pg_logical_emit_message(true, 'dpaccount', '') WHERE EXISTS (SELECT 1 FROM "
            f"{self._s}.records WHERE ledger = $1 AND seq >= $2 "
            "AND payload = $3 || seq::text || $4)",
        }
        append = (
            "EXECUTE dpaccount_append(%(name)s, %(seq)s, %(prev)s, %(eps)s, %(delta)s, "
            "%(meta)s, %(payload)s, %(hash)s, %(qid)s, %(new_eps)s, %(new_delta)s)"
        )
        # Fails unless the pinned functions and triggers stand (prepared with the pins,
        # see protections.Pins.guard).
        guard = "EXECUTE dpaccount_guard"
        barrier = "EXECUTE dpaccount_barrier(%(name)s, %(seq)s, %(hash)s)"
        since = "EXECUTE dpaccount_since(%(name)s, %(seq)s)"
        #: The statements of one append, sent as one simple query (one round trip); the
        #: results come back in this order. Statements outside BEGIN/COMMIT form one
        #: implicit transaction, committed (synchronously) at the end of the query.
        self._sql_append = {
            "group": "BEGIN; SET LOCAL synchronous_commit = off; "
            f"{append}; {guard}; COMMIT; {barrier}; {since}",
            "sync": f"{append}; {guard}; {since}",
        }
        within = (
            "EXECUTE dpaccount_within(%(name)s, %(known)s, %(prefix)s, %(suffix)s, "
            "%(qid)s, %(eps)s, %(delta)s, %(eps_limit)s, %(delta_limit)s, %(delta_below)s, "
            "%(meta)s, %(seen_head)s, %(seen_hash)s, %(seen_eps)s, %(seen_delta)s)"
        )
        within_barrier = (
            "EXECUTE dpaccount_within_barrier(%(name)s, %(known)s, %(prefix)s, %(suffix)s)"
        )
        #: append_within in one round trip, as ``_sql_append``.
        self._sql_within = {
            "group": "BEGIN; SET LOCAL synchronous_commit = off; "
            f"{within}; {guard}; COMMIT; {within_barrier}",
            "sync": f"{within}; {guard}",
        }
        self._prepared_on: Any = None
        self._prepared_pins: Any = None
        self._sql_barrier = (
            f"SELECT pg_logical_emit_message(true, 'dpaccount', '') FROM {self._s}.records "
            "WHERE ledger = %(name)s AND seq = %(seq)s AND hash = %(hash)s"
        )
        #: (when, start, records): records with seq >= start, read ``when``.
        self._prefetch: tuple[float, int, list[LedgerRecord]] | None = None
        self._lock = threading.RLock()
        #: The settings this store opened the ledger under (its writes refuse others).
        self._meta_text: str | None = None
        #: The tip of each ledger as this store last read or wrote it: every write
        #: checks, under the row lock, that the ledger's tip still extends it (see the
        #: docs on tampering and on crashes).
        self._seen: dict[str, LedgerTip] = {}
        #: The functions and triggers checked before the first write (the guard's pins).
        self._pins: Pins | None = None
        self._conn: Any = None
        self._call(lambda conn: self._setup(conn))

    def initialize(self, meta: LedgerMeta) -> LedgerMeta:
        """Create the ledger if it is new, verify it, and return its stored metadata."""
        if meta.name != self.name:
            raise StorageError(f"this store holds ledger {self.name!r}, not {meta.name!r}")
        meta_json = self._keyed(meta).model_dump_json()
        s = self._s
        if self.read_only:
            if self.stored_meta() is None:
                raise StorageError(
                    f"there is no ledger named {self.name!r} in schema {self.schema!r} "
                    "(opened read-only: nothing was created)"
                )
            self._check_key()
            self.check_functions()
            self._verify_on_open()
            row = self._fetchone(f"SELECT meta FROM {s}.ledgers WHERE name = %s", (self.name,))
            self._meta_text = str(row[0])
            return parse_meta(self._meta_text)

        def create(cur: Any) -> None:
            cur.execute(
                f"INSERT INTO {s}.ledgers VALUES (%s, %s, %s, 0, '0/1', '0/1', %s) "
                "ON CONFLICT (name) DO NOTHING",
                (self.name, meta_json, SCHEMA_VERSION, GENESIS_HASH),
            )
            if cur.rowcount == 1:
                self._insert_meta(cur, 0, GENESIS_HASH, 0, meta_json)
            self._run_guard(cur)

        self.check_functions()
        if self.stored_meta() is None:  # created by the owner; a granted role only opens
            self._write(create)  # (a write: the guard checks the protections first)
        self._check_key()
        self._verify_on_open()
        row = self._fetchone(f"SELECT meta FROM {s}.ledgers WHERE name = %s", (self.name,))
        if row is None:  # pragma: no cover - the row was just written
            raise StorageError(f"ledger {self.name!r} vanished after it was created")
        self._meta_text = str(row[0])
        return parse_meta(self._meta_text)

    def head(self) -> int:
        """The number of records in the ledger (0 if it does not exist yet)."""
        prefetch = self._fresh_prefetch()
        if prefetch is not None:
            return prefetch[0] + len(prefetch[1])
        row = self._fetchone(f"SELECT head FROM {self._s}.ledgers WHERE name = %s", (self.name,))
        return 0 if row is None else int(row[0])

    def read(self, start: int = 0) -> Sequence[LedgerRecord]:
        """The records with ``seq >= start``, decoded and checked against the chain."""
        start = max(int(start), 0)
        prefetch = self._fresh_prefetch()
        self._prefetch = None
        if prefetch is not None and prefetch[0] == start:
            return prefetch[1]

        if start == 0:
            self._check_key()

        def get(conn: Any) -> list[LedgerRecord]:
            prev, rows = self._rows_since(conn, start)
            seen = self._seen.get(self.name)
            if seen is not None and seen.head == start and seen.last_hash != prev:
                raise LedgerCorruptError(
                    f"record {start - 1} is not the one this store read earlier: the "
                    "ledger's chain changed (a server crash lost an asynchronous commit?); "
                    "reopen the ledger", seq=start - 1,
                )
            records = check_records(rows, start, prev, self._key)
            after = seen_after_read(seen, start, prev, rows, records)
            if after is not None:
                self._seen[self.name] = after
            return records

        return self._call(get)

    def find(self, query_id: str) -> LedgerRecord | None:
        """The record carrying ``query_id``, checked against its own hash, or None."""
        row = self._fetchone(
            f"SELECT {RECORD_COLUMNS} FROM {self._s}.records "
            "WHERE ledger = %s AND query_id = %s",
            (self.name, query_id),
        )
        if row is None:
            return None
        return check_records([tuple(row)], row[0], row[2], self._key)[0]

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    @property
    def key(self) -> LedgerKey | None:
        """The key of this keyed ledger (None: a SHA-256 chain)."""
        return self._key

    def stored_meta(self) -> LedgerMeta | None:
        """The ledger's stored metadata, or None if the ledger does not exist."""
        row = self._fetchone(f"SELECT meta FROM {self._s}.ledgers WHERE name = %s", (self.name,))
        return None if row is None else parse_meta(row[0])

    def chain_rows(self) -> tuple[list[RecordRow], list[MetaRow]]:
        """The raw record rows and settings-history rows, with their links, read in one
        snapshot (for an export an auditor can re-verify offline)."""
        s = self._s

        def get(cur: Any) -> tuple[list[RecordRow], list[MetaRow]]:
            rows = cur.execute(
                f"SELECT {RECORD_COLUMNS} FROM {s}.records WHERE ledger = %s ORDER BY seq",
                (self.name,),
            ).fetchall()
            history = cur.execute(
                f"SELECT version, at, head, meta, prev_hash, hash FROM {s}.meta_history "
                "WHERE ledger = %s ORDER BY version",
                (self.name,),
            ).fetchall()
            return [tuple(r) for r in rows], [tuple(r) for r in history]

        return self._read(get, repeatable=True)

    def names(self) -> list[str]:
        """The names of every ledger in the schema."""
        return self._read(
            lambda cur: [
                stored_name(r[0])
                for r in cur.execute(f"SELECT name FROM {self._s}.ledgers ORDER BY name")
            ]
        )

    def metas(self) -> dict[str, LedgerMeta]:
        """Every ledger's stored settings, by name, in one read (how the auditor's view
        finds a ledger's shares: their ``parent``)."""
        rows = self._read(
            lambda cur: cur.execute(
                f"SELECT name, meta FROM {self._s}.ledgers ORDER BY name").fetchall()
        )
        return {stored_name(name): parse_meta(text) for name, text in rows}

    def verify(self, collect: list[LedgerRecord] | None = None, *,
               progress: Callable[[int, int | None], object] | None = None) -> LedgerTip:
        """Check the whole ledger: records, chain, cached tip and metadata history.

        The records are read and checked in chunks of `VERIFY_CHUNK`. Given a list
        ``collect``, the decoded records are added to it once the whole check passed (so
        a caller that needs them decodes once; a retried read adds them only once).
        ``progress(checked, total)`` is called after each chunk (a retried read starts
        its count again).

        Raises:
            LedgerCorruptError: With ``.seq`` set to the first bad record.
            StorageError: The ledger does not exist.
        """
        s = self._s
        self._check_key()

        def check(cur: Any) -> tuple[LedgerTip, list[LedgerRecord]]:
            got: list[LedgerRecord] = []
            cached = self._tip_row(cur)
            if cached is None:
                raise StorageError(f"there is no ledger named {self.name!r}")
            snapshots = self._snapshot_rows(cur)
            with cur.connection.cursor(name="dpaccount_verify") as rows:  # server-side
                rows.execute(
                    f"SELECT {RECORD_COLUMNS} FROM {s}.records WHERE ledger = %s ORDER BY seq",
                    (self.name,),
                )
                check_ledger(iter(lambda: rows.fetchmany(VERIFY_CHUNK), []), cached,
                             snapshots, self._key,
                             None if collect is None else got.extend, progress)
            self._check_history(cur)
            return cached, got

        tip, got = self._read(check, repeatable=True)
        self._saw_verified(tip)
        if collect is not None:
            collect.extend(got)
        return tip

    def verify_recent(self) -> LedgerTip:
        """Check a ledger from its latest snapshot on (what opening does): the record
        before the snapshot still has the link it recorded, the records since continue
        the chain, the cached tip is the snapshot's plus theirs, and the settings history
        is intact. Without a snapshot, the whole ledger is checked (`verify`).
        Sets `snapshot` to the snapshot it started from.

        Raises:
            LedgerCorruptError: With ``.seq`` set to the first bad record.
            StorageError: The ledger does not exist.
        """
        s = self._s
        self._check_key()

        def check(cur: Any) -> LedgerTip | None:
            cached = self._tip_row(cur)
            if cached is None:
                raise StorageError(f"there is no ledger named {self.name!r}")
            latest = self._snapshot_rows(cur, latest=True)
            if not latest:
                return None
            snap = snapshot_of(latest[0], self._key)
            rows: list[RecordRow] = cur.execute(
                f"SELECT {RECORD_COLUMNS} FROM {s}.records WHERE ledger = %s AND seq >= %s "
                "ORDER BY seq", (self.name, snap.tip.head - 1),
            ).fetchall()
            anchor = None
            if rows and rows[0][0] == snap.tip.head - 1:
                anchor = str(rows.pop(0)[3])
            check_since_snapshot(snap, anchor, rows, cached, self._key)
            self._check_history(cur)
            self.snapshot = snap
            return cached

        tip = self._read(check, repeatable=True)
        if tip is None:
            return self.verify()
        self._saw_verified(tip)
        return tip

    def _saw_verified(self, tip: LedgerTip) -> None:
        """Remember a verified tip as seen (`seen_after_verify`)."""
        seen = seen_after_verify(self._seen.get(self.name), tip)
        if seen is not None:
            self._seen[self.name] = seen

    def _verify_on_open(self) -> None:
        if self.full_verify:
            self.verify()
            latest = self._read(lambda cur: self._snapshot_rows(cur, latest=True))
            self.snapshot = snapshot_of(latest[0], self._key) if latest else None
        else:
            self.verify_recent()

    def _setup(self, conn: Any) -> None:
        # Every statement is idempotent; a schema made by an earlier dpaccount gets what
        # it lacks here (by its owner: a granted role cannot, and is told so).
        query, params = present_sql(self._s)

        def present() -> bool:
            return bool(conn.execute(query, params).fetchone()[0])

        if present():
            return
        if self.read_only:
            raise StorageError(
                f"schema {self.schema!r} holds no dpaccount ledger tables this version can "
                "read (opened read-only: nothing was created; a schema made by an earlier "
                "dpaccount is upgraded by opening it once, as its owner, without read_only)"
            )
        # A session lock, then a fresh transaction: a process that waited while another
        # created the schema checks again in a transaction that starts after that one
        # committed, and does not re-run the DDL (CREATE TRIGGER's table locks deadlock
        # with the first process's charges).
        conn.execute("SELECT pg_advisory_lock(7346287161)")
        try:
            with conn.transaction():
                if not present():
                    for statement in schema_sql(self.schema):
                        conn.execute(statement)
        except self._pg.errors.InsufficientPrivilege as exc:
            raise StorageError(
                f"schema {self.schema!r} must be created or upgraded to this version of "
                "dpaccount by its owner (open a ledger in it once as the owner); this role "
                f"may not: {exc}"
            ) from exc
        finally:
            conn.execute("SELECT pg_advisory_unlock(7346287161)")

    @property
    def meta_text(self) -> str | None:
        """The stored settings (JSON text) this store opened its ledger under; an append
        that names them fails closed if they changed since (`GroupAppend.settings`)."""
        return self._meta_text

    @property
    def database(self) -> str:
        """Which server and database this store is connected to, as a digest of its
        connection string (two stores with the same digest share one database; the
        connection string itself, which may hold a password, is never shown)."""
        return hashlib.sha256(self._conninfo.encode()).hexdigest()[:16]

    def __repr__(self) -> str:
        return f"PostgresStore(name={self.name!r}, schema={self.schema!r})"
