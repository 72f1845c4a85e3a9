"""A durable ledger in one SQLite file: the embedded default.

The file is opened in WAL mode with ``synchronous=FULL``, so a transaction is on disk
(the WAL fsync'ed) when ``COMMIT`` returns. Every append runs in one ``BEGIN IMMEDIATE``
transaction that reads the ledger's tip, refuses with
`LedgerConflictError` if another writer appended first, inserts
the hash-chained record and updates the cached tip: a true compare-and-append across
threads and processes. Waiting for the write lock uses SQLite's busy timeout plus a retry
loop of our own, so "database is locked" never reaches the caller; when the lock cannot
be had within ``lock_timeout`` seconds a `StorageError` is
raised and nothing is written (fail closed).

`SQLiteStore.append_within()` (used by the accountant for the basic rule) decides in
the same kind of transaction on the cached exact sums and appends at the current head,
so writers never lose a race.

Records cannot be updated or deleted through SQL (triggers refuse it), and the hash chain
plus the cached tip make edits made around the triggers visible to `verify()`, which
runs whenever a ledger is opened.

Examples:
    >>> import tempfile, os
    >>> from dpaccount.costs import Budget
    >>> from dpaccount.records import LedgerMeta
    >>> from dpaccount.charges import Relation
    >>> path = os.path.join(tempfile.mkdtemp(), "ledger.db")
    >>> store = SQLiteStore(path, name="census")
    >>> meta = LedgerMeta.build("census", Budget(1), {"name": "basic"}, Relation.ADD_REMOVE)
    >>> store.initialize(meta) == meta
    True
    >>> store.head()
    0
    >>> store.close()
"""

from __future__ import annotations

import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from fractions import Fraction
from typing import TypeVar

from dpaccount.errors import (
    LedgerConflictError,
    LedgerCorruptError,
    ReadOnlyLedgerError,
    StorageError,
)
from dpaccount.keys import LedgerKey
from dpaccount.records import (
    GENESIS_HASH,
    SCHEMA_VERSION,
    LedgerMeta,
    LedgerRecord,
    canonical_bytes,
    chain_hash_payload,
)
from dpaccount.storage._sql import (
    TABLES_VERSION,
    LedgerTip,
    MetaRow,
    RecordRow,
    Snapshot,
    SnapshotRow,
    check_key,
    check_ledger,
    check_meta_history,
    check_not_behind,
    check_records,
    check_since_snapshot,
    frac_text,
    meta_hash,
    missed_records,
    parse_frac,
    parse_meta,
    renumberable,
    snapshot_link,
    snapshot_of,
    sums_follow,
    within_limits,
)
from dpaccount.storage.base import AppendResult, GroupAppend

__all__ = ["SQLiteStore"]

T = TypeVar("T")

_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6

_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS ledgers (
        name TEXT PRIMARY KEY NOT NULL,
        meta TEXT NOT NULL,
        schema_version INTEGER NOT NULL,
        head INTEGER NOT NULL CHECK (head >= 0),
        epsilon_sum TEXT NOT NULL,
        delta_sum TEXT NOT NULL,
        last_hash TEXT NOT NULL
    ) STRICT
    """,
    """
    CREATE TABLE IF NOT EXISTS records (
        ledger TEXT NOT NULL REFERENCES ledgers (name),
        seq INTEGER NOT NULL CHECK (seq >= 0),
        payload TEXT NOT NULL,
        prev_hash TEXT NOT NULL,
        hash TEXT NOT NULL,
        query_id TEXT,
        PRIMARY KEY (ledger, seq),
        UNIQUE (ledger, query_id)
    ) STRICT, WITHOUT ROWID
    """,
    """
    CREATE TABLE IF NOT EXISTS meta_history (
        ledger TEXT NOT NULL REFERENCES ledgers (name),
        version INTEGER NOT NULL CHECK (version >= 0),
        at TEXT NOT NULL,
        head INTEGER NOT NULL,
        meta TEXT NOT NULL,
        prev_hash TEXT NOT NULL,
        hash TEXT NOT NULL,
        PRIMARY KEY (ledger, version)
    ) STRICT, WITHOUT ROWID
    """,
    """
    CREATE TABLE IF NOT EXISTS snapshots (
        ledger TEXT NOT NULL REFERENCES ledgers (name),
        head INTEGER NOT NULL CHECK (head > 0),
        last_hash TEXT NOT NULL,
        epsilon_sum TEXT NOT NULL,
        delta_sum TEXT NOT NULL,
        settings TEXT NOT NULL,
        state TEXT,
        hash TEXT NOT NULL,
        PRIMARY KEY (ledger, head)
    ) STRICT, WITHOUT ROWID
    """,
    """
    CREATE TRIGGER IF NOT EXISTS snapshots_append_only_update BEFORE UPDATE ON snapshots
    BEGIN SELECT RAISE(ABORT, 'dpaccount snapshots are append-only'); END
    """,
    """
    CREATE TRIGGER IF NOT EXISTS snapshots_append_only_delete BEFORE DELETE ON snapshots
    BEGIN SELECT RAISE(ABORT, 'dpaccount snapshots are append-only'); END
    """,
    """
    CREATE TRIGGER IF NOT EXISTS records_append_only_update BEFORE UPDATE ON records
    BEGIN SELECT RAISE(ABORT, 'dpaccount ledger records are append-only'); END
    """,
    """
    CREATE TRIGGER IF NOT EXISTS records_append_only_delete BEFORE DELETE ON records
    BEGIN SELECT RAISE(ABORT, 'dpaccount ledger records are append-only'); END
    """,
    """
    CREATE TRIGGER IF NOT EXISTS meta_history_append_only_update BEFORE UPDATE ON meta_history
    BEGIN SELECT RAISE(ABORT, 'dpaccount meta history is append-only'); END
    """,
    """
    CREATE TRIGGER IF NOT EXISTS meta_history_append_only_delete BEFORE DELETE ON meta_history
    BEGIN SELECT RAISE(ABORT, 'dpaccount meta history is append-only'); END
    """,
    """
    CREATE TRIGGER IF NOT EXISTS ledgers_keep BEFORE DELETE ON ledgers
    BEGIN SELECT RAISE(ABORT, 'dpaccount ledgers cannot be deleted'); END
    """,
    # The cached tip only moves forward, one record at a time, to a recorded hash: a
    # reset of the cached sums (to admit more charges) is refused by the database.
    """
    CREATE TRIGGER IF NOT EXISTS ledgers_tip_moves_forward
    BEFORE UPDATE OF head, epsilon_sum, delta_sum, last_hash ON ledgers
    WHEN NEW.head NOT IN (OLD.head, OLD.head + 1)
      OR (NEW.head = OLD.head AND (NEW.epsilon_sum IS NOT OLD.epsilon_sum
          OR NEW.delta_sum IS NOT OLD.delta_sum OR NEW.last_hash IS NOT OLD.last_hash))
      OR (NEW.head = OLD.head + 1 AND (SELECT hash FROM records
          WHERE ledger = NEW.name AND seq = OLD.head) IS NOT NEW.last_hash)
    OR (NEW.head = OLD.head + 1 AND dpaccount_sums_follow(OLD.epsilon_sum, OLD.delta_sum,
          NEW.epsilon_sum, NEW.delta_sum, (SELECT payload FROM records
          WHERE ledger = NEW.name AND seq = OLD.head)) IS NOT 1)
    BEGIN SELECT RAISE(ABORT, 'dpaccount ledger tips only move forward to a recorded hash,
        adding that record''s cost');
    END
    """,
)

#: Statements run when a file made by an earlier dpaccount is opened (tables version 2:
#: the tip trigger did not check that the sums add the new record's cost).
_UPGRADE = ("DROP TRIGGER IF EXISTS ledgers_tip_moves_forward",)

_RECORD_COLUMNS = "seq, payload, prev_hash, hash, query_id"


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)
    text = str(exc)
    return "locked" in text or "busy" in text


class SQLiteStore:
    """One named ledger in a SQLite database file (many ledgers may share the file).

    A new file is created readable and writable by its owner only (0600). Before every
    write the store checks that its path still names the file it opened (device and
    inode): a ledger file deleted or replaced under a running writer fails closed with
    `StorageError` instead of committing into a file nobody
    will read while a new file starts with a fresh budget.

    Args:
        path: The database file, or ``":memory:"`` for a private in-memory database (not
            durable; for tests).
        name: The ledger's name within the file.
        lock_timeout: Seconds to wait for the write lock before failing closed (kept to
            within a few tens of milliseconds).
        create: Create the file if it is missing; with ``False`` a missing file is a
            `StorageError` naming the path, and nothing is
            created (for readers: ``dpaccount ledger show`` of a mistyped path).
        key: The ledger's `LedgerKey` if it is keyed (its chain is then an HMAC chain
            under the key); a new ledger made with a key is keyed for good.
        read_only: Open for reading only (dashboards, auditors): nothing is created or
            upgraded, the connection refuses writes (``PRAGMA query_only``), and every
            write raises `ReadOnlyLedgerError`.
        full_verify: Check the whole ledger when it is opened (`verify`) instead of
            from its latest snapshot on (`verify_recent`, O(records since)).

    Raises:
        StorageError: The file cannot be opened as a dpaccount ledger database.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        name: str = "default",
        *,
        lock_timeout: float = 30.0,
        create: bool = True,
        key: LedgerKey | None = None,
        read_only: bool = False,
        full_verify: bool = False,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise StorageError(f"a ledger name must be a non-empty string, not {name!r}")
        self.read_only = bool(read_only)
        self.full_verify = bool(full_verify)
        #: The snapshot opening verified from (the accountant reopens from its state).
        self.snapshot: Snapshot | None = None
        self._has_snapshots = True
        create = create and not self.read_only
        self.path = os.fspath(path)
        self.name = name
        self.lock_timeout = float(lock_timeout)
        self._key = key
        self._lock = threading.RLock()
        self._identity: tuple[int, int] | None = None
        #: The stored settings when this store initialized the ledger; a write finding
        #: others (a migration by another process) fails closed.
        self._meta_text: str | None = None
        self._settings_text: str | None = None
        if self.path != ":memory:":
            self._create_private(create)
        try:
            self._conn = sqlite3.connect(
                self.path,
                timeout=self._busy_seconds(),
                isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open the SQLite ledger {self.path!r}: {exc}") from exc
        # The tip trigger checks the new sums with it (a connection without it, such as
        # the sqlite3 shell, cannot move a ledger's tip at all).
        self._conn.create_function("dpaccount_sums_follow", 5, sums_follow, deterministic=True)
        if self.path != ":memory:":
            self._identity = self._file_identity()
        self._retry(self._setup)

    def _busy_seconds(self) -> float:
        # Short waits inside SQLite; the retry loop keeps the overall deadline.
        return max(0.001, min(0.05, self.lock_timeout / 50))

    def _create_private(self, create: bool) -> None:
        if os.path.exists(self.path):
            return
        if not create:
            raise StorageError(
                f"there is no SQLite ledger file at {self.path!r} (nothing was created; "
                "check the path, or create the ledger by opening it with its settings)"
            )
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            return  # another process created it first
        except OSError as exc:
            raise StorageError(f"cannot create the SQLite ledger {self.path!r}: {exc}") from exc
        os.close(fd)

    def _file_identity(self) -> tuple[int, int] | None:
        try:
            info = os.stat(self.path)
        except OSError:
            return None
        return info.st_dev, info.st_ino

    def _check_identity(self) -> None:
        if self._identity is not None and self._file_identity() != self._identity:
            raise StorageError(
                f"the SQLite ledger file {self.path!r} was deleted or replaced since this "
                "store opened it; nothing was written and the query must not run. Reopen "
                "the ledger (and find out what happened to the file)."
            )

    # -- the Store interface ------------------------------------------------------------

    def initialize(self, meta: LedgerMeta) -> LedgerMeta:
        """Create the ledger if it is new, verify it, and return its stored metadata.

        Raises:
            StorageError: ``meta`` names another ledger than this store's.
            LedgerCorruptError: The stored ledger fails verification.
        """
        if meta.name != self.name:
            raise StorageError(f"this store holds ledger {self.name!r}, not {meta.name!r}")
        meta_json = self._keyed(meta).model_dump_json()
        if self.read_only:
            return self._open_existing()

        def create(cur: sqlite3.Cursor) -> None:
            row = cur.execute("SELECT meta FROM ledgers WHERE name = ?", (self.name,)).fetchone()
            if row is not None:
                check_key(str(row[0]), self._key, self.name)
                return
            cur.execute(
                "INSERT INTO ledgers VALUES (?, ?, ?, 0, '0/1', '0/1', ?)",
                (self.name, meta_json, SCHEMA_VERSION, GENESIS_HASH),
            )
            self._insert_meta(cur, 0, GENESIS_HASH, 0, meta_json)

        self._write(create)
        self._verify_on_open()
        text = self._read(lambda cur: cur.execute(
            "SELECT meta FROM ledgers WHERE name = ?", (self.name,)).fetchone())
        if text is None:  # pragma: no cover - the row was just written
            raise StorageError(f"ledger {self.name!r} vanished after it was created")
        self._meta_text = str(text[0])
        return parse_meta(self._meta_text)

    def _open_existing(self) -> LedgerMeta:
        """`initialize` without writing: the ledger must exist; it is verified."""
        text = self._read(lambda cur: cur.execute(
            "SELECT meta FROM ledgers WHERE name = ?", (self.name,)).fetchone())
        if text is None:
            raise StorageError(
                f"there is no ledger named {self.name!r} in {self.path!r} (opened "
                "read-only: nothing was created)"
            )
        self._verify_on_open()
        self._meta_text = str(text[0])
        return parse_meta(self._meta_text)

    def head(self) -> int:
        """The number of records in the ledger (0 if it does not exist yet)."""

        def get(cur: sqlite3.Cursor) -> int:
            row = cur.execute("SELECT head FROM ledgers WHERE name = ?", (self.name,)).fetchone()
            return 0 if row is None else int(row[0])

        return self._read(get)

    def read(self, start: int = 0) -> Sequence[LedgerRecord]:
        """The records with ``seq >= start``, decoded and checked against the chain.

        Raises:
            LedgerCorruptError: A record is missing, fails to decode or breaks the chain.
        """
        start = max(int(start), 0)

        def get(cur: sqlite3.Cursor) -> list[LedgerRecord]:
            if start == 0:
                self._check_key(cur)
            prev, rows = self._rows_since(cur, start)
            return check_records(rows, start, prev, self._key)

        return self._read(get)

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

        def insert(cur: sqlite3.Cursor) -> None:
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
            cur.execute(
                "UPDATE ledgers SET head = ?, epsilon_sum = ?, delta_sum = ?, last_hash = ? "
                "WHERE name = ?",
                (new.head, frac_text(new.epsilon_sum), frac_text(new.delta_sum),
                 new.last_hash, self.name),
            )

        self._write(insert)

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

        def insert(cur: sqlite3.Cursor) -> tuple[bool, LedgerTip, str, list[RecordRow]]:
            tip = self._locked_tip(cur)
            check_not_behind(tip.head, known_head)
            prev = tip.last_hash  # nothing missed: nothing to read
            rows: list[RecordRow] = []
            if tip.head > known_head:
                prev, rows = self._rows_since(cur, known_head)
            if not within_limits(tip.epsilon_sum + cost.epsilon, tip.delta_sum + cost.delta,
                                 epsilon_limit, delta_limit, delta_below):
                return False, tip, prev, rows
            self._store_at_head(cur, tip, record, prefix, suffix)
            return True, tip, prev, rows

        appended, tip, prev, rows = self._write(insert)
        # Decoded after the commit, so the lock is held only for the arithmetic.
        missed = missed_records(rows, known_head, prev, tip.head, tip.last_hash, self._key)
        return AppendResult(appended, tip.head, tuple(missed))

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

        def insert(cur: sqlite3.Cursor) -> tuple[bool, int, list[LedgerRecord]]:
            tip = self._locked_tip(cur)
            check_not_behind(tip.head, known_head)
            missed: list[LedgerRecord] = []
            if tip.head > known_head:
                prev, rows = self._rows_since(cur, known_head)
                missed = missed_records(rows, known_head, prev, tip.head, tip.last_hash,
                                        self._key)
            if not decide(missed):
                return False, tip.head, missed
            self._store_at_head(cur, tip, record, prefix, suffix)
            return True, tip.head, missed

        appended, seq, missed = self._write(insert)
        return AppendResult(appended, seq, tuple(missed))

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

        def insert(cur: sqlite3.Cursor) -> list[AppendResult]:
            found = []
            for part in parts:
                tip = self._tip(cur, part.name)
                if tip is None:
                    raise StorageError(f"ledger {part.name!r} is not initialized")
                if part.settings is not None and self._settings_text != part.settings:
                    raise self._migrated(part.name)
                check_key(self._settings_text, self._key, part.name)
                check_not_behind(tip.head, part.known_head)
                missed: list[LedgerRecord] = []
                if tip.head > part.known_head:
                    prev, rows = self._rows_since(cur, part.known_head, part.name)
                    missed = missed_records(rows, part.known_head, prev, tip.head,
                                            tip.last_hash, self._key)
                found.append((tip, missed))
            admitted = all([part.decide(missed) for part, (_, missed) in zip(
                parts, found, strict=True)])
            if admitted:
                for part, (tip, _), (prefix, suffix) in zip(parts, found, cut, strict=True):
                    self._store_at_head(cur, tip, part.record, prefix, suffix, part.name)
            return [AppendResult(admitted, tip.head, tuple(missed)) for tip, missed in found]

        return self._write(insert)

    def _locked_tip(self, cur: sqlite3.Cursor) -> LedgerTip:
        """The tip, read inside a write transaction, after checking that the stored
        settings are still the ones this store opened under."""
        tip = self._tip(cur)
        if tip is None:
            raise StorageError(f"ledger {self.name!r} is not initialized")
        self._check_settings()
        return tip

    def _rows_since(self, cur: sqlite3.Cursor, start: int, name: str | None = None
                    ) -> tuple[str, list[RecordRow]]:
        """The hash of record ``start - 1`` and the rows from ``start`` on."""
        name = self.name if name is None else name
        prev = self._prev_hash(cur, start, name)
        rows: list[RecordRow] = cur.execute(
            f"SELECT {_RECORD_COLUMNS} FROM records WHERE ledger = ? AND seq >= ? ORDER BY seq",
            (name, start),
        ).fetchall()
        return prev, rows

    def _store_at_head(self, cur: sqlite3.Cursor, tip: LedgerTip, record: LedgerRecord,
                       prefix: str, suffix: str, name: str | None = None) -> None:
        """Insert ``record`` numbered with the tip's head and advance the tip (in the
        caller's write transaction)."""
        name = self.name if name is None else name
        payload = f"{prefix}{tip.head}{suffix}"
        record_hash = chain_hash_payload(tip.last_hash, payload, self._key)
        new = tip.after(record, record_hash)
        try:
            cur.execute(
                "INSERT INTO records VALUES (?, ?, ?, ?, ?, ?)",
                (name, tip.head, payload, tip.last_hash, record_hash, record.query_id),
            )
        except sqlite3.IntegrityError as exc:
            raise LedgerConflictError(
                f"query_id {record.query_id!r} (or seq {tip.head}) is already recorded"
            ) from exc
        cur.execute(
            "UPDATE ledgers SET head = ?, epsilon_sum = ?, delta_sum = ?, last_hash = ? "
            "WHERE name = ?",
            (new.head, frac_text(new.epsilon_sum), frac_text(new.delta_sum), new.last_hash,
             name),
        )

    def find(self, query_id: str) -> LedgerRecord | None:
        """The record carrying ``query_id``, checked against its own hash, or None."""

        def get(cur: sqlite3.Cursor) -> LedgerRecord | None:
            row: RecordRow | None = cur.execute(
                f"SELECT {_RECORD_COLUMNS} FROM records WHERE ledger = ? AND query_id = ?",
                (self.name, query_id),
            ).fetchone()
            if row is None:
                return None
            return check_records([row], row[0], row[2], self._key)[0]

        return self._read(get)

    def close(self) -> None:
        """Close the database connection."""
        with self._lock:
            self._conn.close()

    @property
    def key(self) -> LedgerKey | None:
        """The key of this keyed ledger (None: a SHA-256 chain)."""
        return self._key

    # -- beyond the interface: audit and migration --------------------------------------

    def stored_meta(self) -> LedgerMeta | None:
        """The ledger's stored metadata, or None if the ledger does not exist."""

        def get(cur: sqlite3.Cursor) -> str | None:
            row = cur.execute("SELECT meta FROM ledgers WHERE name = ?", (self.name,)).fetchone()
            return None if row is None else str(row[0])

        text = self._read(get)
        return None if text is None else parse_meta(text)

    def chain_rows(self) -> tuple[list[RecordRow], list[MetaRow]]:
        """The raw record rows and settings-history rows, with their links, read in one
        snapshot (for an export an auditor can re-verify offline)."""

        def get(cur: sqlite3.Cursor) -> tuple[list[RecordRow], list[MetaRow]]:
            rows = cur.execute(
                f"SELECT {_RECORD_COLUMNS} FROM records WHERE ledger = ? ORDER BY seq",
                (self.name,),
            ).fetchall()
            history = cur.execute(
                "SELECT version, at, head, meta, prev_hash, hash FROM meta_history "
                "WHERE ledger = ? ORDER BY version",
                (self.name,),
            ).fetchall()
            return rows, history

        return self._read(get)

    def names(self) -> list[str]:
        """The names of every ledger in the database file."""
        return self._read(
            lambda cur: [str(r[0]) for r in cur.execute("SELECT name FROM ledgers ORDER BY name")]
        )

    def verify(self) -> LedgerTip:
        """Check the whole ledger: records, chain, cached tip and metadata history.

        Returns:
            The verified tip (record count, exact sums, last hash).

        Raises:
            LedgerCorruptError: With ``.seq`` set to the first bad record.
            StorageError: The ledger does not exist.
        """

        def check(cur: sqlite3.Cursor) -> LedgerTip:
            cached = self._tip(cur)
            if cached is None:
                raise StorageError(f"there is no ledger named {self.name!r} in {self.path!r}")
            self._check_key(cur)
            rows: list[RecordRow] = cur.execute(
                f"SELECT {_RECORD_COLUMNS} FROM records WHERE ledger = ? ORDER BY seq",
                (self.name,),
            ).fetchall()
            check_ledger(rows, cached, self._snapshot_rows(cur), self._key)
            meta_rows = cur.execute(
                "SELECT version, at, head, meta, prev_hash, hash FROM meta_history "
                "WHERE ledger = ? ORDER BY version",
                (self.name,),
            ).fetchall()
            current = cur.execute(
                "SELECT meta FROM ledgers WHERE name = ?", (self.name,)
            ).fetchone()[0]
            check_meta_history(meta_rows, current, self._key)
            return cached

        return self._read(check)

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

        def check(cur: sqlite3.Cursor) -> LedgerTip | None:
            cached = self._tip(cur)
            if cached is None:
                raise StorageError(f"there is no ledger named {self.name!r} in {self.path!r}")
            self._check_key(cur)
            rows = self._snapshot_rows(cur, latest=True)
            if not rows:
                return None
            snap = snapshot_of(rows[0], self._key)
            anchor = cur.execute(
                "SELECT hash FROM records WHERE ledger = ? AND seq = ?",
                (self.name, snap.tip.head - 1),
            ).fetchone()
            since: list[RecordRow] = cur.execute(
                f"SELECT {_RECORD_COLUMNS} FROM records WHERE ledger = ? AND seq >= ? "
                "ORDER BY seq", (self.name, snap.tip.head),
            ).fetchall()
            check_since_snapshot(snap, None if anchor is None else str(anchor[0]), since,
                                 cached, self._key)
            meta_rows = cur.execute(
                "SELECT version, at, head, meta, prev_hash, hash FROM meta_history "
                "WHERE ledger = ? ORDER BY version", (self.name,),
            ).fetchall()
            current = cur.execute(
                "SELECT meta FROM ledgers WHERE name = ?", (self.name,)).fetchone()[0]
            check_meta_history(meta_rows, current, self._key)
            self.snapshot = snap
            return cached

        tip = self._read(check)
        return self.verify() if tip is None else tip

    def snapshots(self) -> list[Snapshot]:
        """Every stored snapshot, oldest first, each link checked."""
        rows = self._read(lambda cur: self._snapshot_rows(cur))
        return [snapshot_of(row, self._key) for row in rows]

    def write_snapshot(self, head: int, settings: str, state: str | None) -> bool:
        """Store a snapshot of the ledger after ``head`` records, if that is still its
        head (else nothing is written and False is returned)."""

        def insert(cur: sqlite3.Cursor) -> bool:
            tip = self._locked_tip(cur)
            if tip.head != head or head == 0:
                return False
            link_ = snapshot_link(tip, settings, state, self._key)
            cur.execute(
                "INSERT OR IGNORE INTO snapshots VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (self.name, head, tip.last_hash, frac_text(tip.epsilon_sum),
                 frac_text(tip.delta_sum), settings, state, link_),
            )
            return cur.rowcount == 1

        return self._write(insert)

    def _snapshot_rows(self, cur: sqlite3.Cursor, latest: bool = False) -> list[SnapshotRow]:
        if not self._has_snapshots:
            return []  # a file made before snapshots, opened read-only (not upgraded)
        return cur.execute(
            "SELECT head, last_hash, epsilon_sum, delta_sum, settings, state, hash FROM "
            "snapshots WHERE ledger = ? ORDER BY head" + (" DESC LIMIT 1" if latest else ""),
            (self.name,),
        ).fetchall()

    def migrate(self, meta: LedgerMeta) -> bool:
        """Replace the ledger's metadata, recording the change in its meta history.

        The records are kept; the accountant replays them under the new rule and budget.

        Returns:
            True if the metadata changed, False if it already was ``meta``.

        Raises:
            StorageError: The ledger does not exist or ``meta`` names another ledger.
        """
        if meta.name != self.name:
            raise StorageError(f"this store holds ledger {self.name!r}, not {meta.name!r}")
        self.verify()
        meta = self._keyed(meta)
        meta_json = meta.model_dump_json()

        def change(cur: sqlite3.Cursor) -> bool:
            row = cur.execute(
                "SELECT meta, head FROM ledgers WHERE name = ?", (self.name,)
            ).fetchone()
            if row is None:
                raise StorageError(f"there is no ledger named {self.name!r} to migrate")
            if parse_meta(row[0]) == meta:
                return False
            version, prev = cur.execute(
                "SELECT version, hash FROM meta_history WHERE ledger = ? "
                "ORDER BY version DESC LIMIT 1",
                (self.name,),
            ).fetchone()
            self._insert_meta(cur, int(version) + 1, str(prev), int(row[1]), meta_json)
            cur.execute("UPDATE ledgers SET meta = ? WHERE name = ?", (meta_json, self.name))
            return True

        changed = self._write(change)
        if self._meta_text is not None:
            self._meta_text = meta_json  # this store made the change: it writes under it
        return changed

    def missing_protections(self) -> list[str]:
        """The names of the protective triggers that are not in the database (dropped)."""
        expected = {"records_append_only_update", "records_append_only_delete",
                    "meta_history_append_only_update", "meta_history_append_only_delete",
                    "ledgers_keep", "ledgers_tip_moves_forward",
                    "snapshots_append_only_update", "snapshots_append_only_delete"}
        present = set(self._read(lambda cur: [
            str(r[0]) for r in cur.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")
        ]))
        return sorted(expected - present)

    def meta_history(self) -> list[tuple[int, datetime, int, LedgerMeta]]:
        """Every metadata the ledger had: (version, when, head at that time, meta)."""
        rows = self._read(
            lambda cur: cur.execute(
                "SELECT version, at, head, meta FROM meta_history WHERE ledger = ? "
                "ORDER BY version",
                (self.name,),
            ).fetchall()
        )
        return [
            (int(v), datetime.fromisoformat(at), int(h), parse_meta(m)) for v, at, h, m in rows
        ]

    # -- internals ----------------------------------------------------------------------

    def _setup(self) -> None:
        conn = self._conn
        conn.execute(f"PRAGMA busy_timeout = {max(1, int(self._busy_seconds() * 1000))}")
        if self.read_only:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if not 1 <= version <= TABLES_VERSION:
                raise StorageError(
                    f"{self.path!r} is not a ledger database this dpaccount can read "
                    f"(tables version {version})"
                )
            conn.execute("PRAGMA query_only = ON")
            self._has_snapshots = version >= 3
            return
        if self.path != ":memory:":
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StorageError(f"cannot switch {self.path!r} to WAL mode (got {mode})")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > TABLES_VERSION:
            raise StorageError(
                f"{self.path!r} was written by a newer dpaccount (tables version {version})"
            )
        if version < TABLES_VERSION:
            conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in (_UPGRADE if version >= 2 else ()) + _SCHEMA:
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {TABLES_VERSION}")
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def _tip(self, cur: sqlite3.Cursor, name: str | None = None) -> LedgerTip | None:
        row = cur.execute(
            "SELECT head, last_hash, epsilon_sum, delta_sum, meta FROM ledgers WHERE name = ?",
            (self.name if name is None else name,),
        ).fetchone()
        if row is None:
            return None
        self._settings_text = str(row[4])
        return LedgerTip(
            int(row[0]),
            str(row[1]),
            parse_frac(row[2], "epsilon_sum"),
            parse_frac(row[3], "delta_sum"),
        )

    def _verify_on_open(self) -> None:
        if self.full_verify:
            self.verify()
            latest = self._read(lambda cur: self._snapshot_rows(cur, latest=True))
            self.snapshot = snapshot_of(latest[0], self._key) if latest else None
        else:
            self.verify_recent()

    def _keyed(self, meta: LedgerMeta) -> LedgerMeta:
        """``meta`` naming this store's key (or none)."""
        return meta.model_copy(update={"key_id": None if self._key is None else self._key.key_id})

    def _check_key(self, cur: sqlite3.Cursor) -> None:
        row = cur.execute("SELECT meta FROM ledgers WHERE name = ?", (self.name,)).fetchone()
        check_key(None if row is None else str(row[0]), self._key, self.name)

    def _check_settings(self) -> None:
        """Fail closed if another process migrated the settings since this store opened
        the ledger (call after `_tip()` in a write transaction)."""
        if self._meta_text is not None and self._settings_text != self._meta_text:
            raise self._migrated(self.name)

    def _migrated(self, name: str) -> StorageError:
        return StorageError(
            f"ledger {name!r} was migrated to other settings (budget, rule or relation) "
            "since it was opened; nothing was written. Reopen it, so that every charge is "
            "decided under the stored settings."
        )

    def _prev_hash(self, cur: sqlite3.Cursor, start: int, name: str | None = None) -> str:
        if start == 0:
            return GENESIS_HASH
        row = cur.execute(
            "SELECT hash FROM records WHERE ledger = ? AND seq = ?",
            (self.name if name is None else name, start - 1),
        ).fetchone()
        if row is None:
            raise LedgerCorruptError(f"record {start - 1} is missing", seq=start - 1)
        return str(row[0])

    def _insert_meta(
        self, cur: sqlite3.Cursor, version: int, prev: str, head: int, meta_json: str
    ) -> None:
        at = datetime.now(UTC).isoformat()
        cur.execute(
            "INSERT INTO meta_history VALUES (?, ?, ?, ?, ?, ?, ?)",
            (self.name, version, at, head, meta_json, prev,
             meta_hash(prev, version, at, head, meta_json, self._key)),
        )

    def _retry(self, action: Callable[[], T]) -> T:
        """Run ``action``, retrying while SQLite reports a lock, until the deadline."""
        deadline = time.monotonic() + self.lock_timeout
        pause = 0.001
        while True:
            try:
                return action()
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc):
                    raise StorageError(f"SQLite failed on {self.path!r}: {exc}") from exc
                if time.monotonic() >= deadline:
                    raise StorageError(
                        f"could not lock the SQLite ledger {self.path!r} within "
                        f"{self.lock_timeout:g} s; nothing was written"
                    ) from exc
            except sqlite3.Error as exc:
                raise StorageError(f"SQLite failed on {self.path!r}: {exc}") from exc
            left = deadline - time.monotonic()
            time.sleep(max(0.0, min(pause * (0.5 + random.random()), left)))
            pause = min(pause * 2, 0.05)

    def _write(self, body: Callable[[sqlite3.Cursor], T]) -> T:
        """Run ``body`` in one BEGIN IMMEDIATE transaction and commit it durably."""
        if self.read_only:
            raise ReadOnlyLedgerError(
                f"ledger {self.name!r} in {self.path!r} was opened read-only; nothing "
                "was written"
            )

        def attempt() -> T:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                self._check_identity()
                result = body(conn.cursor())
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return result

        with self._lock:
            return self._retry(attempt)

    def _read(self, body: Callable[[sqlite3.Cursor], T]) -> T:
        """Run ``body`` in one read transaction (a consistent snapshot)."""

        def attempt() -> T:
            conn = self._conn
            conn.execute("BEGIN")
            try:
                return body(conn.cursor())
            finally:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")

        with self._lock:
            return self._retry(attempt)

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r}, name={self.name!r})"
