"""Ledger stores behind one small interface (`Store`), a file per backend."""

from typing import TYPE_CHECKING, Any

from dpaccount.storage.base import Store
from dpaccount.storage.memory import MemoryStore

if TYPE_CHECKING:
    from dpaccount.storage.postgres import PostgresStore
    from dpaccount.storage.sqlite import SQLiteStore

__all__ = ["MemoryStore", "PostgresStore", "SQLiteStore", "Store"]


def __getattr__(name: str) -> Any:
    # The SQL stores load on first use: an in-memory ledger needs neither sqlite3 nor
    # PostgreSQL's store (nor psycopg, which that imports lazily in turn)
    if name == "SQLiteStore":
        from dpaccount.storage.sqlite import SQLiteStore

        return SQLiteStore
    if name == "PostgresStore":
        from dpaccount.storage.postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module 'dpaccount.storage' has no attribute {name!r}")
