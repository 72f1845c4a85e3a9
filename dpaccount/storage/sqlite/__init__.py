"""A durable ledger in one SQLite file: the embedded default.

The file is opened in WAL mode. With ``commit="group"`` (the default) a commit writes
its WAL frames without waiting for the disk (``synchronous=NORMAL``), and the store
fsyncs the WAL after releasing the write lock, before the append returns: a charge is on
disk before its query runs, and writers in other processes do not wait for this one's
flush. With ``commit="sync"`` (``synchronous=FULL``) the fsync happens inside ``COMMIT``.
Writers take turns through a gate beside the file (``.<file>-writers``, see
`dpaccount.storage.sqlite.gate`) instead of sleeping in SQLite's busy handler. Every
append runs in one ``BEGIN IMMEDIATE``
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

from dpaccount.storage.sqlite.files import loose_permissions
from dpaccount.storage.sqlite.store import SQLiteStore

__all__ = ["SQLiteStore", "loose_permissions"]
