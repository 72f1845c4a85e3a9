"""What a PostgreSQL ledger keeps besides its records: the history of its settings
(migrations) and the snapshots of its rule's state that let it open in the same time at any
length. Both are written through the pinned server-side functions and the guard, as
appends are (`dpaccount.storage.postgres.appends`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from dpaccount.errors import StorageError
from dpaccount.records import LedgerMeta
from dpaccount.storage._chain import Snapshot, snapshot_link, snapshot_of
from dpaccount.storage._sql import (
    LedgerTip,
    SnapshotRow,
    check_meta_history,
    frac_text,
    meta_hash,
    parse_meta,
)
from dpaccount.storage.postgres.appends import PostgresAppends
from dpaccount.storage.postgres.functions import SNAPSHOT_FUNCTION

__all__ = ["PostgresHistory"]


class PostgresHistory(PostgresAppends):
    """The settings history and the snapshots of one ledger (a part of `PostgresStore`)."""

    def verify(self, collect: Any = None, *,  # pragma: no cover - PostgresStore
               progress: Any = None) -> LedgerTip:
        raise NotImplementedError

    def snapshots(self) -> list[Snapshot]:
        """Every stored snapshot, oldest first, each link checked."""
        rows = self._read(lambda cur: self._snapshot_rows(cur))
        return [snapshot_of(row, self._key) for row in rows]

    def _check_history(self, cur: Any) -> None:
        """The settings history is intact and ends at the current settings."""
        history = cur.execute(
            f"SELECT version, at, head, meta, prev_hash, hash FROM {self._s}.meta_history "
            "WHERE ledger = %s ORDER BY version", (self.name,),
        ).fetchall()
        current = cur.execute(f"SELECT meta FROM {self._s}.ledgers WHERE name = %s",
                              (self.name,)).fetchone()[0]
        check_meta_history(history, current, self._key)

    def write_snapshot(self, head: int, settings: str, state: str | None) -> bool:
        """Store a snapshot of the ledger after ``head`` records, if that is still its
        head and exactly the tip this store saw last (else nothing is written and False
        is returned). A role granted the ledger writes it through a server-side function;
        a share's writer may not write its ancestors' snapshots (False).

        Raises:
            LedgerCorruptError: The tip does not extend the one seen last, the settings
                changed, or the protections do not stand; nothing was written.
        """
        self._writable()
        seen = self._seen.get(self.name)
        if seen is None or seen.head != head or head == 0:
            return False
        args = (self.name, seen.head, seen.last_hash, frac_text(seen.epsilon_sum),
                frac_text(seen.delta_sum), self._meta_text, settings, state,
                snapshot_link(seen, settings, state, self._key))

        def insert(cur: Any) -> str:
            status = cur.execute(
                f"SELECT {self._s}.{SNAPSHOT_FUNCTION}(%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                args).fetchone()[0]
            self._run_guard(cur)
            return str(status)

        status = self._write(insert)
        if status in ("written", "exists", "moved", "refused"):
            return status == "written"
        raise self._refused_by(status, self.name, head)

    def _snapshot_rows(self, cur: Any, latest: bool = False) -> list[SnapshotRow]:
        rows = cur.execute(
            "SELECT head, last_hash, epsilon_sum, delta_sum, settings, state, hash FROM "
            f"{self._s}.snapshots WHERE ledger = %s ORDER BY head"
            + (" DESC LIMIT 1" if latest else ""), (self.name,),
        ).fetchall()
        return [tuple(r) for r in rows]

    def migrate(self, meta: LedgerMeta) -> bool:
        """Replace the ledger's metadata, recording the change in its meta history.

        Returns:
            True if the metadata changed, False if it already was ``meta``.
        """
        if meta.name != self.name:
            raise StorageError(f"this store holds ledger {self.name!r}, not {meta.name!r}")
        self.verify()
        meta = self._keyed(meta)
        meta_json = meta.model_dump_json()
        s = self._s

        def change(cur: Any) -> bool:
            cur.execute(
                f"SELECT meta, head FROM {s}.ledgers WHERE name = %s FOR UPDATE", (self.name,)
            )
            row = cur.fetchone()
            if row is None:
                raise StorageError(f"there is no ledger named {self.name!r} to migrate")
            self._locked_tip(cur, lock=True)  # the settings and tip as this store saw them
            self._run_guard(cur)
            if parse_meta(row[0]) == meta:
                return False
            cur.execute(
                f"SELECT version, hash FROM {s}.meta_history WHERE ledger = %s "
                "ORDER BY version DESC LIMIT 1",
                (self.name,),
            )
            version, prev = cur.fetchone()
            self._insert_meta(cur, int(version) + 1, prev, int(row[1]), meta_json)
            cur.execute(f"UPDATE {s}.ledgers SET meta = %s WHERE name = %s", (meta_json, self.name))
            return True

        changed = self._write(change)
        if self._meta_text is not None:
            self._meta_text = meta_json  # this store made the change: it writes under it
        return changed

    def meta_history(self) -> list[tuple[int, datetime, int, LedgerMeta]]:
        """Every metadata the ledger had: (version, when, head at that time, meta)."""
        rows = self._read(
            lambda cur: cur.execute(
                f"SELECT version, at, head, meta FROM {self._s}.meta_history "
                "WHERE ledger = %s ORDER BY version",
                (self.name,),
            ).fetchall()
        )
        return [
            (int(v), datetime.fromisoformat(at), int(h), parse_meta(m)) for v, at, h, m in rows
        ]

    def _insert_meta(self, cur: Any, version: int, prev: str, head: int, meta_json: str) -> None:
        at = datetime.now(UTC).isoformat()
        cur.execute(
            f"INSERT INTO {self._s}.meta_history VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (self.name, version, at, head, meta_json, prev,
             meta_hash(prev, version, at, head, meta_json, self._key)),
        )
