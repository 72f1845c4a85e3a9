"""Ledger stores behind one small interface (`Store`), a file per backend."""

from dpaccount.storage.base import Store
from dpaccount.storage.memory import MemoryStore
from dpaccount.storage.postgres import PostgresStore  # psycopg is imported lazily
from dpaccount.storage.sqlite import SQLiteStore

__all__ = ["MemoryStore", "PostgresStore", "SQLiteStore", "Store"]
