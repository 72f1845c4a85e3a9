"""`SQLiteStore`: the ledger's interface, verification, migrations and snapshots (see
`dpaccount.storage.sqlite` for the transactions)."""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Literal

from dpaccount.errors import (
    ConfigError,
    StorageError,
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
    snapshot_link,
    snapshot_of,
)
from dpaccount.storage._sql import (
    TABLES_VERSION,
    LedgerTip,
    MetaRow,
    RecordRow,
    SnapshotRow,
    check_key,
    check_meta_history,
    frac_text,
    meta_hash,
    parse_meta,
    sums_follow,
)
from dpaccount.storage.sqlite.appends import SQLiteAppends
from dpaccount.storage.sqlite.gate import WriterGate
from dpaccount.storage.sqlite.schema import SCHEMA, UPGRADE
from dpaccount.storage.sqlite.session import RECORD_COLUMNS

__all__ = ["SQLiteStore"]


class SQLiteStore(SQLiteAppends):
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
        commit: How a write is made durable before it returns: ``"group"`` (the
            default: ``synchronous=NORMAL``, then an fsync of the WAL after the write
            lock is released, so writers in other processes do not wait for this one's
            disk flush) or ``"sync"`` (``synchronous=FULL``: the fsync inside the lock).
            Either way a write is on disk when the call returns. See the module
            docstring.

    Raises:
        StorageError: The file cannot be opened as a dpaccount ledger database.
        ConfigError: An unknown ``commit`` mode.
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
        commit: Literal["group", "sync"] = "group",
    ) -> None:
        if commit not in ("group", "sync"):
            raise ConfigError(f"unknown commit mode {commit!r}; use 'group' or 'sync'")
        self.commit = commit
        self._gate = None
        self._wal_fd = None
        check_ledger_name(name)  # before anything is opened or created (ConfigError)
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
        self._seen: dict[str, LedgerTip] = {}
        self._pinned_schema: int | None = None
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
        # The WAL and the gate by absolute path: a later chdir must not point them elsewhere.
        absolute = self.path if self.path == ":memory:" else os.path.abspath(self.path)
        self._wal_path = f"{absolute}-wal"
        if not self.read_only:
            self._gate = WriterGate.beside(absolute)

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

        stored = self._read(lambda cur: cur.execute(
            "SELECT meta FROM ledgers WHERE name = ?", (self.name,)).fetchone())
        if stored is None:
            self._write(create)  # (a write: the protections are checked first)
        else:
            check_key(str(stored[0]), self._key, self.name)
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
            records = check_records(rows, start, prev, self._key)
            seen = seen_after_read(self._seen.get(self.name), start, prev, rows, records)
            if seen is not None:
                self._seen[self.name] = seen
            return records

        return self._read(get)

    def find(self, query_id: str) -> LedgerRecord | None:
        """The record carrying ``query_id``, checked against its own hash, or None."""

        def get(cur: sqlite3.Cursor) -> LedgerRecord | None:
            row: RecordRow | None = cur.execute(
                f"SELECT {RECORD_COLUMNS} FROM records WHERE ledger = ? AND query_id = ?",
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
            if self._gate is not None:
                self._gate.close()
            if self._wal_fd is not None:
                os.close(self._wal_fd)
                self._wal_fd = None

    @property
    def key(self) -> LedgerKey | None:
        """The key of this keyed ledger (None: a SHA-256 chain)."""
        return self._key

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
                f"SELECT {RECORD_COLUMNS} FROM records WHERE ledger = ? ORDER BY seq",
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
            lambda cur: [stored_name(r[0])
                         for r in cur.execute("SELECT name FROM ledgers ORDER BY name")]
        )

    def metas(self) -> dict[str, LedgerMeta]:
        """Every ledger's stored settings, by name, in one read (how the auditor's view
        finds a ledger's shares: their ``parent``)."""
        rows = self._read(
            lambda cur: cur.execute("SELECT name, meta FROM ledgers ORDER BY name").fetchall()
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

        Returns:
            The verified tip (record count, exact sums, last hash).

        Raises:
            LedgerCorruptError: With ``.seq`` set to the first bad record.
            StorageError: The ledger does not exist.
        """

        def check(cur: sqlite3.Cursor) -> tuple[LedgerTip, list[LedgerRecord]]:
            got: list[LedgerRecord] = []
            cached = self._tip(cur)
            if cached is None:
                raise StorageError(f"there is no ledger named {self.name!r} in {self.path!r}")
            self._check_key(cur)
            snapshots = self._snapshot_rows(cur)
            rows = cur.connection.execute(
                f"SELECT {RECORD_COLUMNS} FROM records WHERE ledger = ? ORDER BY seq",
                (self.name,),
            )
            check_ledger(iter(lambda: rows.fetchmany(VERIFY_CHUNK), []), cached, snapshots,
                         self._key, None if collect is None else got.extend, progress)
            self._check_history(cur)
            return cached, got

        tip, got = self._read(check)
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
                f"SELECT {RECORD_COLUMNS} FROM records WHERE ledger = ? AND seq >= ? "
                "ORDER BY seq", (self.name, snap.tip.head),
            ).fetchall()
            check_since_snapshot(snap, None if anchor is None else str(anchor[0]), since,
                                 cached, self._key)
            self._check_history(cur)
            self.snapshot = snap
            return cached

        tip = self._read(check)
        if tip is None:
            return self.verify()
        self._saw_verified(tip)
        return tip

    def _saw_verified(self, tip: LedgerTip) -> None:
        """Remember a verified tip as seen (`seen_after_verify`)."""
        seen = seen_after_verify(self._seen.get(self.name), tip)
        if seen is not None:
            self._seen[self.name] = seen

    def snapshots(self) -> list[Snapshot]:
        """Every stored snapshot, oldest first, each link checked."""
        rows = self._read(lambda cur: self._snapshot_rows(cur))
        return [snapshot_of(row, self._key) for row in rows]

    def _check_history(self, cur: sqlite3.Cursor) -> None:
        """The settings history is intact and ends at the current settings."""
        history = cur.execute(
            "SELECT version, at, head, meta, prev_hash, hash FROM meta_history "
            "WHERE ledger = ? ORDER BY version", (self.name,),
        ).fetchall()
        current = cur.execute("SELECT meta FROM ledgers WHERE name = ?",
                              (self.name,)).fetchone()[0]
        check_meta_history(history, current, self._key)

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
            self._locked_tip(cur)  # the settings and the tip are as this store saw them
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
        """The names of the protective triggers that are not in the database (dropped) or
        were re-created with other SQL than dpaccount's."""
        return self._read(self._broken_triggers)

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
        conn.execute(f"PRAGMA synchronous = {'NORMAL' if self.commit == 'group' else 'FULL'}")
        conn.execute("PRAGMA foreign_keys = ON")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > TABLES_VERSION:
            raise StorageError(
                f"{self.path!r} was written by a newer dpaccount (tables version {version})"
            )
        if version < TABLES_VERSION:
            conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in (UPGRADE if version >= 2 else ()) + SCHEMA:
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {TABLES_VERSION}")
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def _verify_on_open(self) -> None:
        if self.full_verify:
            self.verify()
            latest = self._read(lambda cur: self._snapshot_rows(cur, latest=True))
            self.snapshot = snapshot_of(latest[0], self._key) if latest else None
        else:
            self.verify_recent()

    def _insert_meta(
        self, cur: sqlite3.Cursor, version: int, prev: str, head: int, meta_json: str
    ) -> None:
        at = datetime.now(UTC).isoformat()
        cur.execute(
            "INSERT INTO meta_history VALUES (?, ?, ?, ?, ?, ?, ?)",
            (self.name, version, at, head, meta_json, prev,
             meta_hash(prev, version, at, head, meta_json, self._key)),
        )

    @property
    def meta_text(self) -> str | None:
        """The stored settings (JSON text) this store opened its ledger under; an append
        that names them fails closed if they changed since (`GroupAppend.settings`)."""
        return self._meta_text

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r}, name={self.name!r})"
