"""Ledger stores behind one small interface (`Store`), a file per backend."""

from typing import TYPE_CHECKING, Any

from dpaccount.storage.base import Store
from dpaccount.storage.memory import MemoryStore
from dpaccount.storage.sqlite import SQLiteStore

if TYPE_CHECKING:
    from dpaccount.storage.postgres import PostgresStore

__all__ = ["MemoryStore", "PostgresStore", "SQLiteStore", "Store"]


def __getattr__(name: str) -> Any:
    # PostgreSQL's store (and psycopg, which it imports lazily in turn) loads on first use
    if name == "PostgresStore":
        from dpaccount.storage.postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module 'dpaccount.storage' has no attribute {name!r}")
