"""A ledger in PostgreSQL, shared by writers on many machines (the ``postgres`` extra).

The tables (see `dpaccount.storage._sql`) live in one schema, ``dpaccount`` by
default. An append is one transaction; how it excludes other writers is chosen with
``locking`` (measured in ``benchmarks/bench_storage.py``, documented in docs/ledgers.md):

``"conditional"`` (default)
    one call of the server-side function ``dpaccount_append_at_v1``: it locks the ledger
    row, appends only if the row still holds the head, last hash, sums and settings the
    writer expects, and inserts the record; a ``conflict`` status means another writer
    won.
``"row"``
    ``SELECT ... FOR UPDATE`` on the ledger row, compare, insert, update (the tables
    directly: the schema owner's privileges).
``"serializable"``
    the same statements without ``FOR UPDATE`` in a SERIALIZABLE transaction; a
    serialization failure is retried (the owner's privileges too).

How an append is made durable is chosen with ``commit``:

``"group"`` (default)
    the append transaction commits with ``SET LOCAL synchronous_commit = off``, which
    releases the ledger row's lock as soon as the commit record is in the WAL buffers;
    then, before `PostgresStore.append()` returns, a *durability barrier* (a second,
    synchronous transaction that writes one WAL record, a transactional
    ``pg_logical_emit_message``) commits. Its commit flushes the WAL up to its own commit
    record, hence up to and including the append's, which precedes it. Writers waiting
    on barriers at the same time share one WAL flush (group commit). Each charge costs
    one extra transaction id and a WAL record of a few dozen bytes; logical decoding
    consumers see (and may ignore) messages with the prefix ``dpaccount``.
``"sync"``
    the append transaction commits synchronously while holding the row lock.

With ``"conditional"`` locking, an append is a single function call, sent with the guard
and its commit(s) as one multi-statement query: one round trip, whose last statement
reads, in a fresh snapshot, the records from ``seq`` on. After a lost race those are the
winners' records, which then answer the accountant's catch-up (`head()`,
`read()`) without another round trip; after a win, the records appended since let
the next charge start from a fresh tip.

`PostgresStore.append_within()` (used by the accountant for the basic rule) decides
on the cached exact sums instead of comparing heads: one round trip calls a PL/pgSQL
function, created with the tables, that locks the ledger row, adds the record's cost to
the sums, compares them with the limits and, if they fit, stores the record at the
current head. Writers queue on the row lock instead of losing races. The commit modes
apply to it as above.

Either way the append is flushed to the WAL (under the session's ``synchronous_commit``,
raised to ``on`` if the server default is ``off``) before ``append()`` returns, so no
answer is released before its charge is durable. docs/ledgers.md argues the crash cases.

Every write fails closed inside its own transaction (docs/ledgers.md, "Fail closed inside
the deciding transaction"): the server-side functions compare the ledger's tip under the
row lock with the one this store saw last, and a guard statement run just before each
``COMMIT`` checks that the functions and triggers are the ones pinned when the store
first wrote and that ``session_replication_role`` is ``origin``
(`dpaccount.storage.postgres.protections`); otherwise `LedgerCorruptError` and nothing
is written. A role granted a ledger with `PostgresStore.grant` (``dpaccount ledger
grant``) writes only through those ``SECURITY DEFINER`` functions
(`dpaccount.storage.postgres.roles`).

A lock wait longer than ``lock_timeout``, a serialization failure that persists, a lost
connection or any other database error raises `StorageError`
and the charge is refused (fail closed). A commit whose outcome is unknown (the
connection broke during ``COMMIT``) is also refused: the charge may be on record, which
errs toward more spent, never less.
"""

from dpaccount.storage.postgres.store import PostgresStore

__all__ = ["PostgresStore"]
