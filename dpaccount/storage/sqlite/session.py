"""A SQLite ledger file's connection and the row-level steps every append path shares:
the write lock with its deadline, the file's identity, and reading, checking and
advancing a ledger's row."""

from __future__ import annotations

import logging
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable
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
    LedgerMeta,
    LedgerRecord,
    chain_hash_payload,
)
from dpaccount.storage._chain import Snapshot, check_extends
from dpaccount.storage._sql import LedgerTip, RecordRow, check_key, frac_text, parse_frac
from dpaccount.storage.sqlite.gate import WriterGate
from dpaccount.storage.sqlite.schema import TRIGGERS, trigger_sql

__all__ = ["RECORD_COLUMNS", "SQLiteSession"]

_log = logging.getLogger(__name__)

T = TypeVar("T")

_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6

RECORD_COLUMNS = "seq, payload, prev_hash, hash, query_id"


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)
    text = str(exc)
    return "locked" in text or "busy" in text


class SQLiteSession:
    """The connection and row-level steps of a `SQLiteStore` (its base class; the
    attributes are set by `SQLiteStore.__init__`)."""

    path: str
    name: str
    lock_timeout: float
    read_only: bool
    full_verify: bool
    snapshot: Snapshot | None
    _key: LedgerKey | None
    _lock: threading.RLock
    _identity: tuple[int, int] | None
    _meta_text: str | None
    _settings_text: str | None
    _has_snapshots: bool
    _conn: sqlite3.Connection
    #: ``"group"`` (fsync after the write lock) or ``"sync"`` (``synchronous=FULL``).
    commit: str
    _gate: WriterGate | None
    _wal_fd: int | None
    _wal_path: str
    #: The tip of each ledger this store last read or wrote (see `seen_tip`).
    _seen: dict[str, LedgerTip]
    #: ``PRAGMA schema_version`` when the protective triggers were last found standing.
    _pinned_schema: int | None

    @property
    def seen_tip(self) -> LedgerTip | None:
        """The tip of this store's ledger as it last read or wrote it (None: not yet).

        Every write checks, under the write lock, that the ledger's tip still extends
        it (`dpaccount.storage._chain.check_extends`)."""
        return self._seen.get(self.name)

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

    def _retry(self, action: Callable[[], T], deadline: float | None = None) -> T:
        """Run ``action``, retrying while SQLite reports a lock, until the deadline
        (``lock_timeout`` from now unless given)."""
        if deadline is None:
            deadline = time.monotonic() + self.lock_timeout
        pause = 0.001
        tries = 0
        while True:
            try:
                result = action()
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc):
                    raise StorageError(f"SQLite failed on {self.path!r}: {exc}") from exc
                if time.monotonic() >= deadline:
                    _log.debug("SQLite ledger %r: still locked after %d tries; giving up "
                               "(lock_timeout %g s)", self.name, tries + 1, self.lock_timeout)
                    raise self._lock_timed_out() from exc
            except sqlite3.Error as exc:
                raise StorageError(f"SQLite failed on {self.path!r}: {exc}") from exc
            else:
                if tries:
                    _log.debug("SQLite ledger %r: the database was locked; went through "
                               "after %d retries", self.name, tries)
                return result
            tries += 1
            if tries == 1:
                _log.debug("SQLite ledger %r: the database is locked by another "
                           "connection; retrying for up to %g s", self.name, self.lock_timeout)
            left = deadline - time.monotonic()
            time.sleep(max(0.0, min(pause * (0.5 + random.random()), left)))
            pause = min(pause * 2, 0.05)

    def _lock_timed_out(self) -> StorageError:
        return StorageError(
            f"could not lock the SQLite ledger {self.path!r} within {self.lock_timeout:g} s; "
            "nothing was written"
        )

    def _write(self, body: Callable[[sqlite3.Cursor], T]) -> T:
        """Run ``body`` in one BEGIN IMMEDIATE transaction and commit it durably.

        The transaction runs inside the writers' gate (`WriterGate`); with
        ``commit="group"`` the WAL is fsync'ed after the gate and the write lock are
        released, before this returns."""
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
                cur = conn.cursor()
                self._check_protections(cur)
                result = body(cur)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return result

        with self._lock:
            deadline = time.monotonic() + self.lock_timeout
            gate = self._gate
            if gate is None:
                result = self._retry(attempt, deadline)
            else:
                if not gate.enter(deadline):
                    raise self._lock_timed_out()
                try:
                    result = self._retry(attempt, deadline)
                finally:
                    gate.leave()
            if self.commit == "group":
                self._flush_wal()
            return result

    def _check_protections(self, cur: sqlite3.Cursor) -> None:
        """Under the write lock: the protective triggers stand (each present, with
        dpaccount's SQL). ``PRAGMA schema_version`` changes with every schema change, so
        they are read again only when it differs from the one last found standing.

        Raises:
            LedgerCorruptError: A trigger is missing or was re-created with other SQL;
                nothing is written.
        """
        version = int(cur.execute("PRAGMA schema_version").fetchone()[0])
        if version == self._pinned_schema:
            return
        broken = self._broken_triggers(cur)
        if broken:
            raise LedgerCorruptError(
                f"the protective triggers {', '.join(broken)} of {self.path!r} are dropped or "
                "were re-created with other SQL; nothing was written and the query must "
                "not run. Someone bypassed them: check the ledger with `dpaccount ledger "
                "verify` (against a head checkpoint) and restore the file from a backup"
            )
        self._pinned_schema = version

    def _broken_triggers(self, cur: sqlite3.Cursor) -> list[str]:
        """The names of the protective triggers that are missing or not dpaccount's."""
        found = {str(name): trigger_sql(str(sql)) for name, sql in cur.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'trigger'")}
        return sorted(name for name, sql in TRIGGERS.items() if found.get(name) != sql)

    def _flush_wal(self) -> None:
        """Make the committed transaction durable: fsync the WAL it was written to.

        With ``synchronous=NORMAL`` a commit writes its WAL frames without an fsync; this
        fsync, after the write lock is released, flushes them (and those of any writer
        that committed before). A checkpoint fsyncs the WAL before it copies frames into
        the database, and the database before the WAL is reused, so frames that leave the
        WAL are already on disk.

        Raises:
            StorageError: The WAL cannot be opened or flushed. The transaction is
                committed (the charge stands and is counted) but is not known to be on
                disk, so the guarded query must not run.
        """
        if self.path == ":memory:":
            return
        try:
            if self._wal_fd is None:  # (opened once: the WAL stays while we are open)
                self._wal_fd = os.open(self._wal_path, os.O_RDONLY | os.O_CLOEXEC)
            os.fsync(self._wal_fd)
        except OSError as exc:
            raise StorageError(
                f"a write to the SQLite ledger {self.path!r} was committed but could not be "
                f"flushed to disk ({type(exc).__name__}: {exc.strerror}); it stays on "
                "record (counted as spent) and the query must not run"
            ) from exc

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

    def _locked_tip(self, cur: sqlite3.Cursor, name: str | None = None,
                    seen: LedgerTip | None = None, check_seen: bool = True) -> LedgerTip:
        """The tip, read inside a write transaction, after checking that the stored
        settings are still the ones this store opened under and (unless ``check_seen``
        is False) that it extends the tip this store saw last (``seen``, for another
        ledger of the file than this store's).

        Raises:
            LedgerCorruptError: The settings changed (a migration by another process),
                or the tip does not extend what was seen (`check_extends`).
        """
        name = self.name if name is None else name
        tip = self._tip(cur, name)
        if tip is None:
            raise StorageError(f"ledger {name!r} is not initialized")
        if name == self.name:
            self._check_settings()
            seen = self._seen.get(name)
        if not check_seen:  # the caller checks it (with the rows it reads anyway)
            return tip
        if seen is not None and tip.head > seen.head:
            check_extends(tip, seen, self._prev_hash(cur, seen.head, name))
        else:
            check_extends(tip, seen, None)
        return tip

    def _check_settings(self) -> None:
        """Fail closed if another process migrated the settings since this store opened
        the ledger (call after `_tip()` in a write transaction)."""
        if self._meta_text is not None and self._settings_text != self._meta_text:
            raise self._migrated(self.name)

    def _migrated(self, name: str) -> StorageError:
        return LedgerCorruptError(
            f"ledger {name!r} was migrated to other settings (budget, rule or relation) "
            "since it was opened; nothing was written. Reopen it, so that every charge is "
            "decided under the stored settings."
        )

    def _rows_since(self, cur: sqlite3.Cursor, start: int, name: str | None = None
                    ) -> tuple[str, list[RecordRow]]:
        """The hash of record ``start - 1`` and the rows from ``start`` on."""
        name = self.name if name is None else name
        prev = self._prev_hash(cur, start, name)
        rows: list[RecordRow] = cur.execute(
            f"SELECT {RECORD_COLUMNS} FROM records WHERE ledger = ? AND seq >= ? ORDER BY seq",
            (name, start),
        ).fetchall()
        return prev, rows

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

    def _store_at_head(self, cur: sqlite3.Cursor, tip: LedgerTip, record: LedgerRecord,
                       prefix: str, suffix: str, name: str | None = None) -> LedgerTip:
        """Insert ``record`` numbered with the tip's head and advance the tip (in the
        caller's write transaction); the new tip."""
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
        self._advance(cur, name, new)
        return new

    def _advance(self, cur: sqlite3.Cursor, name: str, new: LedgerTip) -> None:
        """Move ledger ``name``'s cached tip to ``new`` (one record on; the trigger checks)."""
        cur.execute(
            "UPDATE ledgers SET head = ?, epsilon_sum = ?, delta_sum = ?, last_hash = ? "
            "WHERE name = ?",
            (new.head, frac_text(new.epsilon_sum), frac_text(new.delta_sum), new.last_hash,
             name),
        )

    def _keyed(self, meta: LedgerMeta) -> LedgerMeta:
        """``meta`` naming this store's key (or none)."""
        return meta.model_copy(update={"key_id": None if self._key is None else self._key.key_id})

    def _check_key(self, cur: sqlite3.Cursor) -> None:
        row = cur.execute("SELECT meta FROM ledgers WHERE name = ?", (self.name,)).fetchone()
        check_key(None if row is None else str(row[0]), self._key, self.name)
