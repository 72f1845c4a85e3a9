"""Ledger stores behind one small interface (:class:`Store`), a file per backend."""

from dpaccount.storage.base import Store
from dpaccount.storage.memory import MemoryStore

__all__ = ["MemoryStore", "Store"]
