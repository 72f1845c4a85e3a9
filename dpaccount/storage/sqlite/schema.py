"""The tables and triggers of a SQLite ledger file (``PRAGMA user_version`` is
`TABLES_VERSION`); every statement is idempotent."""

from __future__ import annotations

import re

__all__ = ["SCHEMA", "TRIGGERS", "UPGRADE", "trigger_sql"]

SCHEMA = (
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
UPGRADE = ("DROP TRIGGER IF EXISTS ledgers_tip_moves_forward",)


def trigger_sql(sql: str) -> str:
    """A trigger's SQL as compared with what dpaccount wrote: whitespace collapsed, and
    without ``IF NOT EXISTS`` (SQLite stores ``CREATE TRIGGER name ...``)."""
    text = " ".join(sql.split())
    return text.replace("CREATE TRIGGER IF NOT EXISTS ", "CREATE TRIGGER ", 1)


def _triggers() -> dict[str, str]:
    found: dict[str, str] = {}
    for statement in SCHEMA:
        text = trigger_sql(statement)
        match = re.match(r"CREATE TRIGGER (\w+) ", text)
        if match:
            found[match[1]] = text
    return found


#: The protective triggers by name, with their SQL as `trigger_sql` writes it: a write
#: checks under the lock that each stands with exactly this SQL.
TRIGGERS = _triggers()
