"""A ledger in PostgreSQL, shared by writers on many machines (the ``postgres`` extra).

The tables (see `dpaccount.storage._sql`) live in one schema, ``dpaccount`` by
default. An append is one transaction; how it excludes other writers is chosen with
``locking`` (measured in ``benchmarks/bench_storage.py``, documented in docs/ledgers.md):

``"conditional"`` (default)
    ``UPDATE ledgers SET head = n + 1, ... WHERE name = ? AND head = n AND last_hash = h``
    then ``INSERT`` the record: the update takes the ledger row's lock and checks the
    head in one statement; zero rows updated means another writer won.
``"row"``
    ``SELECT ... FOR UPDATE`` on the ledger row, compare, insert, update.
``"serializable"``
    the same statements without ``FOR UPDATE`` in a SERIALIZABLE transaction; a
    serialization failure is retried.

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

With ``"conditional"`` locking, an append is a single statement (a CTE updates the
ledger row ``WHERE head = n AND last_hash = h`` and inserts the record from it), sent
with its commit(s) as one multi-statement query: one round trip, whose last statement
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

A lock wait longer than ``lock_timeout``, a serialization failure that persists, a lost
connection or any other database error raises `StorageError`
and the charge is refused (fail closed). A commit whose outcome is unknown (the
connection broke during ``COMMIT``) is also refused: the charge may be on record, which
errs toward more spent, never less.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any, Literal, TypeVar

import attrs

from dpaccount.errors import (
    ConfigError,
    LedgerConflictError,
    LedgerCorruptError,
    ReadOnlyLedgerError,
    StorageError,
    missing_extra,
)
from dpaccount.keys import LedgerKey
from dpaccount.records import (
    GENESIS_HASH,
    SCHEMA_VERSION,
    LedgerMeta,
    LedgerRecord,
    canonical_bytes,
    chain_hash,
    chain_hash_payload,
)
from dpaccount.storage._sql import (
    SUM_BITS,
    LedgerTip,
    MetaRow,
    RecordRow,
    Snapshot,
    SnapshotRow,
    check_key,
    check_ledger,
    check_meta_history,
    check_not_behind,
    check_records,
    check_since_snapshot,
    frac_text,
    meta_hash,
    missed_records,
    parse_frac,
    parse_meta,
    renumberable,
    snapshot_link,
    snapshot_of,
    within_limits,
)
from dpaccount.storage.base import AppendResult, GroupAppend

__all__ = ["PostgresStore"]

T = TypeVar("T")
Locking = Literal["conditional", "row", "serializable"]
Commit = Literal["group", "sync"]

_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_SERIALIZATION_RETRIES = 50
#: Records an append brought back (the winners of a lost race, or those appended after
#: ours) answer head() and read() for this long (seconds); later calls ask the database.
_PREFETCH_SECONDS = 0.05
_RECORD_COLUMNS = "seq, payload, prev_hash, hash, query_id"
#: How long a connection behind a pooler may wait for its own server session (seconds)
#: before the pooler is taken to hand out sessions per transaction.
_POOLER_PROBE_SECONDS = 2.0


def _schema_sql(schema: str) -> list[str]:
    s = f'"{schema}"'
    refuse = (
        f"CREATE OR REPLACE FUNCTION {s}.dpaccount_append_only() RETURNS trigger "
        "LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION "
        "'dpaccount % is append-only', TG_TABLE_NAME; END $$"
    )
    statements = [
        f"CREATE SCHEMA IF NOT EXISTS {s}",
        f"""CREATE TABLE IF NOT EXISTS {s}.ledgers (
            name text PRIMARY KEY,
            meta text NOT NULL,
            schema_version integer NOT NULL,
            head bigint NOT NULL CHECK (head >= 0),
            epsilon_sum text NOT NULL,
            delta_sum text NOT NULL,
            last_hash text NOT NULL)""",
        f"""CREATE TABLE IF NOT EXISTS {s}.records (
            ledger text NOT NULL REFERENCES {s}.ledgers (name),
            seq bigint NOT NULL CHECK (seq >= 0),
            payload text NOT NULL,
            prev_hash text NOT NULL,
            hash text NOT NULL,
            query_id text,
            PRIMARY KEY (ledger, seq),
            UNIQUE (ledger, query_id))""",
        f"""CREATE TABLE IF NOT EXISTS {s}.meta_history (
            ledger text NOT NULL REFERENCES {s}.ledgers (name),
            version integer NOT NULL CHECK (version >= 0),
            at text NOT NULL,
            head bigint NOT NULL,
            meta text NOT NULL,
            prev_hash text NOT NULL,
            hash text NOT NULL,
            PRIMARY KEY (ledger, version))""",
        f"""CREATE TABLE IF NOT EXISTS {s}.snapshots (
            ledger text NOT NULL REFERENCES {s}.ledgers (name),
            head bigint NOT NULL CHECK (head > 0),
            last_hash text NOT NULL,
            epsilon_sum text NOT NULL,
            delta_sum text NOT NULL,
            settings text NOT NULL,
            state text,
            hash text NOT NULL,
            PRIMARY KEY (ledger, head))""",
        refuse,
    ]
    for table in ("records", "meta_history", "snapshots"):
        statements.append(
            f"CREATE OR REPLACE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE "
            f"ON {s}.{table} FOR EACH ROW EXECUTE FUNCTION {s}.dpaccount_append_only()"
        )
        statements.append(
            f"CREATE OR REPLACE TRIGGER {table}_no_truncate BEFORE TRUNCATE "
            f"ON {s}.{table} FOR EACH STATEMENT EXECUTE FUNCTION {s}.dpaccount_append_only()"
        )
    statements.append(
        f"CREATE OR REPLACE TRIGGER ledgers_keep BEFORE DELETE ON {s}.ledgers "
        f"FOR EACH ROW EXECUTE FUNCTION {s}.dpaccount_append_only()"
    )
    # The cached tip only moves forward, one record at a time: resetting the cached sums
    # (to admit more charges) is refused by the database.
    statements.append(
        f"""CREATE OR REPLACE FUNCTION {s}.{_TIP_FUNCTION}() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.head NOT IN (OLD.head, OLD.head + 1) OR (NEW.head = OLD.head AND (
                NEW.epsilon_sum IS DISTINCT FROM OLD.epsilon_sum
                OR NEW.delta_sum IS DISTINCT FROM OLD.delta_sum
                OR NEW.last_hash IS DISTINCT FROM OLD.last_hash)) THEN
                RAISE EXCEPTION 'dpaccount ledger tips only move forward to a recorded hash';
            END IF;
            RETURN NEW;
        END $$"""
    )
    statements.append(
        f"CREATE OR REPLACE TRIGGER ledgers_tip_moves_forward BEFORE UPDATE ON {s}.ledgers "
        f"FOR EACH ROW EXECUTE FUNCTION {s}.{_TIP_FUNCTION}()"
    )
    # ... and when it moves forward by one record, to that record's hash with that
    # record's cost added to the sums (checked at commit, when the record is there).
    statements.append(
        f"""CREATE OR REPLACE FUNCTION {s}.{_ADD_FUNCTION}(a text, b text) RETURNS text
        LANGUAGE plpgsql IMMUTABLE AS $$
        DECLARE
            an numeric := split_part(a, '/', 1)::numeric;
            ad numeric := coalesce(nullif(split_part(a, '/', 2), ''), '1')::numeric;
            bn numeric := split_part(b, '/', 1)::numeric;
            bd numeric := coalesce(nullif(split_part(b, '/', 2), ''), '1')::numeric;
            n numeric; d numeric; g numeric;
            v_scale numeric := trunc(2::numeric ^ {SUM_BITS});
        BEGIN
            n := an * bd + bn * ad; d := ad * bd;
            g := gcd(n, d); n := div(n, g); d := div(d, g);
            IF d >= v_scale THEN
                n := div(n * v_scale + d - 1, d); d := v_scale;
                g := gcd(n, d); n := div(n, g); d := div(d, g);
            END IF;
            RETURN n::text || '/' || d::text;
        END $$"""
    )
    statements.append(
        f"""CREATE OR REPLACE FUNCTION {s}.{_SUMS_FUNCTION}() RETURNS trigger
        LANGUAGE plpgsql AS $$
        DECLARE
            v_cost text[];
        BEGIN
            IF NEW.head = OLD.head THEN
                RETURN NULL;
            END IF;
            -- The canonical payload's top-level cost (sorted keys: delta, then epsilon);
            -- a quote inside a JSON string is always escaped, so only the structure
            -- matches. (Parsing the payload as json would fail on an escaped NUL.)
            SELECT regexp_match(r.payload, '"cost":\\{{"delta":"(-?[0-9]+(?:/[0-9]+)?)",'
                                           '"epsilon":"(-?[0-9]+(?:/[0-9]+)?)"')
                INTO v_cost FROM {s}.records r
                WHERE r.ledger = NEW.name AND r.seq = OLD.head AND r.hash = NEW.last_hash;
            IF v_cost IS NULL OR NEW.epsilon_sum IS DISTINCT FROM
                    {s}.{_ADD_FUNCTION}(OLD.epsilon_sum, v_cost[2])
                OR NEW.delta_sum IS DISTINCT FROM
                    {s}.{_ADD_FUNCTION}(OLD.delta_sum, v_cost[1]) THEN
                RAISE EXCEPTION 'dpaccount ledger tips only move forward to a recorded '
                    'hash, adding that record''s cost';
            END IF;
            RETURN NULL;
        END $$"""
    )
    statements.append(  # (constraint triggers have no CREATE OR REPLACE)
        f"""DO $$ BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'ledgers_sums_follow_records'
                       AND tgrelid = '{s}.ledgers'::regclass) THEN
            CREATE CONSTRAINT TRIGGER ledgers_sums_follow_records AFTER UPDATE
            ON {s}.ledgers DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
            EXECUTE FUNCTION {s}.{_SUMS_FUNCTION}();
        END IF;
        END $$"""
    )
    statements.append(_append_within_sql(s))
    return statements


#: The trigger function that keeps a ledger's cached tip moving forward only.
_TIP_FUNCTION = "dpaccount_tip_moves_forward_v1"
#: The deferred trigger function that checks a tip moved by one record adds its cost,
#: and the bounded exact addition of two ``"num/den"`` texts it uses.
_SUMS_FUNCTION = "dpaccount_sums_follow_records_v1"
_ADD_FUNCTION = "dpaccount_add_bounded_v1"

#: The server-side function behind `PostgresStore.append_within()` (its signature;
#: the name carries a version so a changed body gets a new function).
_WITHIN_FUNCTION = "dpaccount_append_within_v3"
_WITHIN_SIGNATURE = f"{_WITHIN_FUNCTION}(text, bigint, text, text, text, text, text, text, " \
    "text, text, text, text)"


def _function_sources(schema: str) -> dict[str, str]:
    """name -> the body (pg_proc.prosrc) of every function dpaccount installs in ``schema``."""
    sources: dict[str, str] = {}
    for statement in _schema_sql(schema):
        if "CREATE OR REPLACE FUNCTION" not in statement:
            continue
        name = statement.split("FUNCTION", 1)[1].split("(", 1)[0].split(".")[-1].strip()
        for quote in ("$fn$", "$$"):
            if quote in statement:
                sources[name] = statement.split(quote)[1]
                break
    return sources


def _append_within_sql(s: str) -> str:
    """The PL/pgSQL function that decides and appends at the head it finds.

    Arguments: ledger name, the caller's known head, the hash the caller believes
    record ``known - 1`` has (NULL: unknown; if it differs, nothing is appended and the
    status is ``'diverged'``), the record's canonical payload
    split around its seq (prefix, suffix), its query_id, its cost's epsilon and delta,
    and the limits (``"num/den"`` text; a NULL epsilon limit or delta bound is absent).
    Under the ledger row's lock it adds the cost to the cached exact sums
    (``a/b + c/d = (ad + cb)/(bd)``, reduced by their gcd, as Python's Fraction does),
    compares them with the limits by cross-multiplication, and if they fit stores the
    sums (rounded up as `bounded_sum` rounds them where their denominators exceed
    ``2**SUM_BITS``) and the
    payload numbered with the head and hashed like ``chain_hash_payload``. It returns
    the records from ``known - 1`` (the anchor of the chain) to the head it found when
    the caller missed any (else none), then one status row: (head, NULL, the last hash
    before ours, our hash or NULL, NULL, and ``'appended'``, ``'refused'``, ``'behind'``
    or ``'diverged'``).
    """
    return f"""
CREATE OR REPLACE FUNCTION {s}.{_WITHIN_FUNCTION}(
    p_name text, p_known bigint, p_anchor text, p_prefix text, p_suffix text, p_qid text,
    p_eps text, p_delta text, p_eps_limit text, p_delta_limit text, p_delta_below text,
    p_meta text)
RETURNS TABLE (r_seq bigint, r_payload text, r_prev text, r_hash text, r_qid text,
               r_status text)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_head bigint; v_last text; v_eps text; v_delta text;
    en numeric; ed numeric; dn numeric; dd numeric; g numeric; v_scale numeric;
    ren numeric; red numeric; rdn numeric; rdd numeric;
    v_ok boolean; v_payload text; v_hash text; v_anchor text; v_meta text;
BEGIN
    SELECT l.head, l.last_hash, l.epsilon_sum, l.delta_sum, l.meta
      INTO v_head, v_last, v_eps, v_delta, v_meta
      FROM {s}.ledgers l WHERE l.name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'dpaccount ledger % is not initialized', p_name;
    END IF;
    IF p_meta IS NOT NULL AND v_meta IS DISTINCT FROM p_meta THEN
        r_seq := v_head; r_prev := v_last; r_status := 'migrated';
        RETURN NEXT;
        RETURN;
    END IF;
    IF v_head < p_known THEN
        r_seq := v_head; r_prev := v_last; r_status := 'behind';
        RETURN NEXT;
        RETURN;
    END IF;
    IF p_anchor IS NOT NULL THEN
        IF v_head = p_known THEN
            v_anchor := v_last;
        ELSE
            SELECT r.hash INTO v_anchor FROM {s}.records r
                WHERE r.ledger = p_name AND r.seq = p_known - 1;
        END IF;
        IF v_anchor IS DISTINCT FROM p_anchor THEN
            r_seq := v_head; r_prev := v_last; r_status := 'diverged';
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    en := split_part(v_eps, '/', 1)::numeric * split_part(p_eps, '/', 2)::numeric
        + split_part(p_eps, '/', 1)::numeric * split_part(v_eps, '/', 2)::numeric;
    ed := split_part(v_eps, '/', 2)::numeric * split_part(p_eps, '/', 2)::numeric;
    g := gcd(en, ed); en := div(en, g); ed := div(ed, g);
    dn := split_part(v_delta, '/', 1)::numeric * split_part(p_delta, '/', 2)::numeric
        + split_part(p_delta, '/', 1)::numeric * split_part(v_delta, '/', 2)::numeric;
    dd := split_part(v_delta, '/', 2)::numeric * split_part(p_delta, '/', 2)::numeric;
    g := gcd(dn, dd); dn := div(dn, g); dd := div(dd, g);
    -- Stored sums keep denominators below 2^{SUM_BITS}: bigger ones are rounded up to a
    -- multiple of 2^-{SUM_BITS} (as _sql.bounded_sum does); limits see the exact sums.
    v_scale := trunc(2::numeric ^ {SUM_BITS});
    IF ed >= v_scale THEN
        ren := div(en * v_scale + ed - 1, ed); red := v_scale;
        g := gcd(ren, red); ren := div(ren, g); red := div(red, g);
    ELSE
        ren := en; red := ed;
    END IF;
    IF dd >= v_scale THEN
        rdn := div(dn * v_scale + dd - 1, dd); rdd := v_scale;
        g := gcd(rdn, rdd); rdn := div(rdn, g); rdd := div(rdd, g);
    ELSE
        rdn := dn; rdd := dd;
    END IF;
    v_ok := (p_eps_limit IS NULL
             OR en * split_part(p_eps_limit, '/', 2)::numeric
                <= split_part(p_eps_limit, '/', 1)::numeric * ed)
        AND dn * split_part(p_delta_limit, '/', 2)::numeric
            <= split_part(p_delta_limit, '/', 1)::numeric * dd
        AND (p_delta_below IS NULL
             OR dn * split_part(p_delta_below, '/', 2)::numeric
                < split_part(p_delta_below, '/', 1)::numeric * dd);
    IF v_head > p_known THEN
        RETURN QUERY SELECT r.seq, r.payload, r.prev_hash, r.hash, r.query_id, NULL::text
            FROM {s}.records r
            WHERE r.ledger = p_name AND r.seq >= greatest(p_known - 1, 0) AND r.seq < v_head
            ORDER BY r.seq;
    END IF;
    IF NOT v_ok THEN
        r_seq := v_head; r_prev := v_last; r_status := 'refused';
        RETURN NEXT;
        RETURN;
    END IF;
    v_payload := p_prefix || v_head::text || p_suffix;
    v_hash := encode(sha256(convert_to(v_last || E'\\n' || v_payload, 'UTF8')), 'hex');
    INSERT INTO {s}.records VALUES (p_name, v_head, v_payload, v_last, v_hash, p_qid);
    UPDATE {s}.ledgers SET head = v_head + 1, last_hash = v_hash,
        epsilon_sum = ren::text || '/' || red::text, delta_sum = rdn::text || '/' || rdd::text
        WHERE name = p_name;
    r_seq := v_head; r_prev := v_last; r_hash := v_hash; r_status := 'appended';
    RETURN NEXT;
END
$fn$"""


class PostgresStore:
    """One named ledger in a PostgreSQL database (many ledgers may share a schema).

    Args:
        conninfo: A libpq connection string or URL (``postgresql://user@host/db``).
        name: The ledger's name.
        schema: The schema holding the tables (created if missing).
        lock_timeout: Seconds to wait for the ledger row's lock before failing closed.
        locking: How appends exclude each other (see the module docstring).
        commit: How an append is made durable before `append()` returns:
            ``"group"`` (asynchronous commit, then a shared synchronous barrier) or
            ``"sync"`` (a synchronous commit under the row lock). See the module
            docstring.
        key: The ledger's `LedgerKey` if it is keyed (its chain is then an HMAC chain
            under the key); a new ledger made with a key is keyed for good. A keyed
            ledger's `append_within()` decides in this process under the row lock, since
            the server never sees the key.
        read_only: Open for reading only (dashboards, auditors): nothing is created,
            the session refuses writes (``default_transaction_read_only``), and every
            write raises `ReadOnlyLedgerError`.
        full_verify: Check the whole ledger when it is opened (`verify`) instead of
            from its latest snapshot on (`verify_recent`, O(records since)).

    Raises:
        ImportError: psycopg is not installed (``pip install "dpaccount[postgres]"``).
        ConfigError: An invalid schema name, locking mode or commit mode.
        StorageError: The server cannot be reached or the tables cannot be created.
    """

    def __init__(
        self,
        conninfo: str,
        name: str = "default",
        *,
        schema: str = "dpaccount",
        lock_timeout: float = 30.0,
        locking: Locking = "conditional",
        commit: Commit = "group",
        key: LedgerKey | None = None,
        read_only: bool = False,
        full_verify: bool = False,
    ) -> None:
        try:
            import psycopg
        except ImportError:
            raise missing_extra("psycopg", "postgres") from None
        self._pg: Any = psycopg
        if not isinstance(schema, str) or not _SCHEMA_NAME.match(schema):
            raise ConfigError(f"invalid PostgreSQL schema name {schema!r}")
        if locking not in ("conditional", "row", "serializable"):
            raise ConfigError(
                f"unknown locking {locking!r}; use 'conditional', 'row' or 'serializable'"
            )
        if commit not in ("group", "sync"):
            raise ConfigError(f"unknown commit mode {commit!r}; use 'group' or 'sync'")
        if not isinstance(name, str) or not name:
            raise StorageError(f"a ledger name must be a non-empty string, not {name!r}")
        self.name = name
        self.schema = schema
        self.locking: Locking = locking
        self.commit: Commit = commit
        self.lock_timeout = float(lock_timeout)
        self._key = key
        self.read_only = bool(read_only)
        self.full_verify = bool(full_verify)
        #: The snapshot opening verified from (the accountant reopens from its state).
        self.snapshot: Snapshot | None = None
        self._conninfo = conninfo
        self._s = f'"{schema}"'
        # Prepared once per connection (see _prepare), run from one multi-statement
        # query per append: ($1 name, $2 seq, $3 prev, $4 head, $5 hash, $6 eps,
        # $7 delta, $8 payload, $9 query_id).
        self._prepare_sql = {
            # Appends only if the head, the last hash and the settings ($10; NULL: not
            # checked) are what this store expects.
            "dpaccount_append": "(text, bigint, text, bigint, text, text, text, text, text, "
            f"text) AS WITH u AS (UPDATE {self._s}.ledgers SET head = $4, last_hash = $5, "
            "epsilon_sum = $6, delta_sum = $7 WHERE name = $1 AND head = $2 AND last_hash = $3 "
            "AND ($10::text IS NULL OR meta = $10) "
            f"RETURNING name) INSERT INTO {self._s}.records SELECT name, $2, $8, $3, $5, $9 "
            "FROM u",
            # Writes one WAL record (so its commit must flush) only if our record is stored.
            "dpaccount_barrier": "(text, bigint, text) AS SELECT pg_logical_emit_message(true, "
            f"'dpaccount', '') FROM {self._s}.records "
            "WHERE ledger = $1 AND seq = $2 AND hash = $3",
            # The records from seq on, in a fresh snapshot taken after the commits: ours
            # first if we won, else the winners'.
            "dpaccount_since": f"(text, bigint) AS SELECT {_RECORD_COLUMNS} FROM "
            f"{self._s}.records WHERE ledger = $1 AND seq >= $2 ORDER BY seq",
            # append_within: see _append_within_sql for the arguments.
            "dpaccount_within": "(text, bigint, text, text, text, text, text, text, text, "
            f"text, text, text) AS SELECT * FROM {self._s}.{_WITHIN_FUNCTION}($1, $2, $3, "
            "$4, $5, $6, $7, $8, $9, $10, $11, $12)",
            # Flushes only if our record is stored (at the head the function found; a
            # concurrent record may share our payload up to its seq, hence EXISTS).
            "dpaccount_within_barrier": "(text, bigint, text, text) AS SELECT "
            "pg_logical_emit_message(true, 'dpaccount', '') WHERE EXISTS (SELECT 1 FROM "
            f"{self._s}.records WHERE ledger = $1 AND seq >= $2 "
            "AND payload = $3 || seq::text || $4)",
        }
        append = (
            "EXECUTE dpaccount_append(%(name)s, %(seq)s, %(prev)s, %(head)s, %(hash)s, "
            "%(eps)s, %(delta)s, %(payload)s, %(qid)s, %(meta)s)"
        )
        barrier = "EXECUTE dpaccount_barrier(%(name)s, %(seq)s, %(hash)s)"
        since = "EXECUTE dpaccount_since(%(name)s, %(seq)s)"
        #: The statements of one append, sent as one simple query (one round trip); the
        #: results come back in this order. Statements outside BEGIN/COMMIT form one
        #: implicit transaction, committed (synchronously) at the end of the query.
        self._sql_append = {
            "group": "BEGIN; SET LOCAL synchronous_commit = off; "
            f"{append}; COMMIT; {barrier}; {since}",
            "sync": f"{append}; {since}",
        }
        within = (
            "EXECUTE dpaccount_within(%(name)s, %(known)s, %(anchor)s, %(prefix)s, "
            "%(suffix)s, %(qid)s, %(eps)s, %(delta)s, %(eps_limit)s, %(delta_limit)s, "
            "%(delta_below)s, %(meta)s)"
        )
        within_barrier = (
            "EXECUTE dpaccount_within_barrier(%(name)s, %(known)s, %(prefix)s, %(suffix)s)"
        )
        #: append_within in one round trip, as ``_sql_append``.
        self._sql_within = {
            "group": "BEGIN; SET LOCAL synchronous_commit = off; "
            f"{within}; COMMIT; {within_barrier}",
            "sync": within,
        }
        self._prepared_on: Any = None
        self._sql_barrier = (
            f"SELECT pg_logical_emit_message(true, 'dpaccount', '') FROM {self._s}.records "
            "WHERE ledger = %(name)s AND seq = %(seq)s AND hash = %(hash)s"
        )
        #: (when, start, records): records with seq >= start, read ``when``.
        self._prefetch: tuple[float, int, list[LedgerRecord]] | None = None
        self._lock = threading.RLock()
        self._tip_cache: LedgerTip | None = None
        #: The settings this store opened the ledger under (its writes refuse others).
        self._meta_text: str | None = None
        #: (n, hash of record n - 1) as this store last read or wrote it: append_within
        #: checks that the chain it continues still ends there (see the docs on crashes).
        self._seen: tuple[int, str] | None = None
        self._conn: Any = None
        self._call(lambda conn: self._setup(conn))

    # -- the Store interface ------------------------------------------------------------

    def initialize(self, meta: LedgerMeta) -> LedgerMeta:
        """Create the ledger if it is new, verify it, and return its stored metadata."""
        if meta.name != self.name:
            raise StorageError(f"this store holds ledger {self.name!r}, not {meta.name!r}")
        meta_json = self._keyed(meta).model_dump_json()
        s = self._s
        if self.read_only:
            if self.stored_meta() is None:
                raise StorageError(
                    f"there is no ledger named {self.name!r} in schema {self.schema!r} "
                    "(opened read-only: nothing was created)"
                )
            self._check_key()
            self.check_functions()
            self._verify_on_open()
            row = self._fetchone(f"SELECT meta FROM {s}.ledgers WHERE name = %s", (self.name,))
            self._meta_text = str(row[0])
            return parse_meta(self._meta_text)

        def create(cur: Any) -> None:
            cur.execute(
                f"INSERT INTO {s}.ledgers VALUES (%s, %s, %s, 0, '0/1', '0/1', %s) "
                "ON CONFLICT (name) DO NOTHING",
                (self.name, meta_json, SCHEMA_VERSION, GENESIS_HASH),
            )
            if cur.rowcount == 1:
                self._insert_meta(cur, 0, GENESIS_HASH, 0, meta_json)

        self._write(create)
        self._check_key()
        self.check_functions()
        self._verify_on_open()
        row = self._fetchone(f"SELECT meta FROM {s}.ledgers WHERE name = %s", (self.name,))
        if row is None:  # pragma: no cover - the row was just written
            raise StorageError(f"ledger {self.name!r} vanished after it was created")
        self._meta_text = str(row[0])
        return parse_meta(self._meta_text)

    def check_functions(self) -> None:
        """Refuse server-side functions whose definitions are not the ones dpaccount wrote.

        The append function decides charges and the trigger functions guard the tables;
        a replaced body (``CREATE OR REPLACE FUNCTION`` by anyone with the privilege)
        could admit charges past the budget. Each function's source is compared with
        the one this version of dpaccount installs.

        Raises:
            LedgerCorruptError: A function is missing or its source differs.
        """
        expected = _function_sources(self.schema)

        def get(conn: Any) -> dict[str, str]:
            rows = conn.execute(
                "SELECT p.proname, p.prosrc FROM pg_proc p JOIN pg_namespace n "
                "ON n.oid = p.pronamespace WHERE n.nspname = %s", (self.schema,)
            ).fetchall()
            return {str(name): str(src) for name, src in rows}

        found = self._call(get)
        changed = sorted(name for name, src in expected.items() if found.get(name) != src)
        if changed:
            raise LedgerCorruptError(
                f"the server-side function(s) {', '.join(changed)} of schema "
                f"{self.schema!r} are missing or were replaced; charges decided by them "
                "cannot be trusted. Restore them (open the ledger with a fresh schema or "
                "drop and re-create the functions) and revoke CREATE on the schema from "
                "everyone but the ledger's owner"
            )

    def head(self) -> int:
        """The number of records in the ledger (0 if it does not exist yet)."""
        prefetch = self._fresh_prefetch()
        if prefetch is not None:
            return prefetch[0] + len(prefetch[1])
        row = self._fetchone(f"SELECT head FROM {self._s}.ledgers WHERE name = %s", (self.name,))
        return 0 if row is None else int(row[0])

    def read(self, start: int = 0) -> Sequence[LedgerRecord]:
        """The records with ``seq >= start``, decoded and checked against the chain."""
        start = max(int(start), 0)
        prefetch = self._fresh_prefetch()
        self._prefetch = None
        if prefetch is not None and prefetch[0] == start:
            return prefetch[1]

        if start == 0:
            self._check_key()

        def get(conn: Any) -> list[LedgerRecord]:
            prev, rows = self._rows_since(conn, start)
            seen = self._seen
            if seen is not None and seen[0] == start and seen[1] != prev:
                raise LedgerCorruptError(
                    f"record {start - 1} is not the one this store read earlier: the "
                    "ledger's chain changed (a server crash lost an asynchronous commit?); "
                    "reopen the ledger", seq=start - 1,
                )
            records = check_records(rows, start, prev, self._key)
            self._seen = (start + len(records), rows[-1][3] if rows else prev)
            self._advance_tip_cache(start, prev, records, rows[-1][3] if rows else prev)
            return records

        return self._call(get)

    def append(self, expected_head: int, record: LedgerRecord) -> None:
        """Append ``record`` if the ledger still has ``expected_head`` records.

        The record is committed and its commit flushed to the WAL when this returns.

        Raises:
            LedgerConflictError: Another writer appended first (possibly known without a
                round trip, from records the previous append brought back), or the
                ``query_id`` is already recorded; nothing was written.
            StorageError: Lock timeout, persistent serialization failures, or a database
                error; nothing was written (or, if the connection broke during commit,
                the outcome is unknown and the charge is refused anyway).
        """
        self._writable()
        if record.seq != expected_head:
            raise LedgerConflictError(
                f"record seq {record.seq} does not match the expected head {expected_head}"
            )
        prefetch = self._fresh_prefetch()
        if prefetch is not None and prefetch[0] == expected_head:
            # An append just brought back newer records: fold them in first (no round trip).
            raise LedgerConflictError(
                f"expected {expected_head} records, found {expected_head + len(prefetch[1])}"
            )
        self._prefetch = None
        payload = canonical_bytes(record).decode()
        if self.locking == "conditional":
            tip = self._tip_cache
            if tip is None or tip.head != expected_head:
                tip = self._fetch_tip()
            if tip.head != expected_head:
                raise LedgerConflictError(f"expected {expected_head} records, found {tip.head}")
            self._append_conditional(tip, record, payload)
        else:
            self._append_locked(expected_head, record, payload)

    def append_within(
        self,
        known_head: int,
        record: LedgerRecord,
        epsilon_limit: Fraction | None,
        delta_limit: Fraction,
        delta_below: Fraction | None,
    ) -> AppendResult:
        """Append ``record`` at the current head if the exact sums stay within limits.

        One round trip runs a server-side function (created with the schema) that
        locks the ledger row, adds ``record.cost`` to the cached exact sums, compares
        them with the limits (see `SumLimitedStore`)
        and, if they fit, stores the record re-numbered to the head it found, hashed
        exactly like `chain_hash_payload()` (checked here again).
        Writers queue on the row lock instead of losing races. Durability follows the
        store's ``commit`` mode, as for `append()`.

        Raises:
            LedgerConflictError: ``record.query_id`` is already recorded.
            LedgerCorruptError: The ledger holds fewer records than ``known_head``, or a
                record read back fails validation or the chain.
            StorageError: Lock timeout or a database error; nothing was written (or, if
                the connection broke during commit, the outcome is unknown and the
                charge is refused anyway).
        """
        self._writable()
        if self._key is not None:
            return self._append_within_here(known_head, record, epsilon_limit, delta_limit,
                                            delta_below)
        prefix, suffix = renumberable(record, known_head)
        seen = self._seen
        params = {
            "name": self.name, "known": known_head, "prefix": prefix, "suffix": suffix,
            "anchor": seen[1] if seen is not None and seen[0] == known_head else None,
            "qid": record.query_id, "eps": frac_text(record.cost.epsilon),
            "delta": frac_text(record.cost.delta),
            "eps_limit": None if epsilon_limit is None else frac_text(epsilon_limit),
            "delta_limit": frac_text(delta_limit),
            "delta_below": None if delta_below is None else frac_text(delta_below),
            "meta": self._meta_text,
        }
        self._prefetch = None
        old_tip, self._tip_cache = self._tip_cache, None
        rows, status, barrier_ok = self._call(
            lambda conn: self._within_round_trip(conn, params)
        )
        head, prev, record_hash, state = int(status[0]), status[2], status[3], status[5]
        if state == "migrated":
            raise self._migrated()
        if state == "behind":
            check_not_behind(head, known_head)
        if state == "diverged":
            raise LedgerCorruptError(
                f"record {known_head - 1} is not the one this store read earlier: the "
                "ledger's chain changed (a server crash lost an asynchronous commit?); "
                "nothing was written; reopen the ledger", seq=known_head - 1,
            )
        anchor = GENESIS_HASH
        if head == known_head:
            anchor = prev  # nothing was missed: the function sent no rows
        elif known_head > 0:
            if not rows or rows[0][0] != known_head - 1:
                raise LedgerCorruptError(f"record {known_head - 1} is missing",
                                         seq=known_head - 1)
            anchor = rows.pop(0)[3]
        missed = missed_records(rows, known_head, anchor, head, prev)
        appended = state == "appended"
        self._seen = (head + 1, record_hash) if appended else (head, prev)
        if appended:
            if not barrier_ok:
                raise StorageError(
                    f"ledger {self.name!r}: record {head} was not found after its commit; "
                    "the charge is refused"
                )
            if chain_hash_payload(prev, f"{prefix}{head}{suffix}") != record_hash:
                raise StorageError(
                    f"ledger {self.name!r}: the server hashed record {head} differently; "
                    "the charge is refused"
                )
        if old_tip is not None and old_tip.head == known_head and old_tip.last_hash == anchor:
            # Keep the cached tip (used by append()) current: fold what was read.
            tip = old_tip
            for row, missed_record in zip(rows, missed, strict=True):
                tip = tip.after(missed_record, row[3])
            self._tip_cache = tip.after(record, record_hash) if appended else tip
        return AppendResult(appended, head, tuple(missed))

    def append_decided(
        self,
        known_head: int,
        record: LedgerRecord,
        decide: Callable[[Sequence[LedgerRecord]], bool],
    ) -> AppendResult:
        """Append ``record`` at the current head if ``decide(missed)`` says so, under the
        ledger row's lock (``SELECT ... FOR UPDATE``) in one transaction (see
        `DecidingStore`): the records other writers appended since
        ``known_head`` are read and checked under the lock and handed to ``decide``; the
        record is stored re-numbered to the head found. Commit modes as `append()`.

        Raises:
            LedgerConflictError: ``record.query_id`` is already recorded.
            LedgerCorruptError: Fewer records than ``known_head``, or a record read back
                fails validation.
            StorageError: Lock timeout or a database error; nothing was written.
        """
        return self._append_locked_decided(known_head, record, lambda _tip, missed: decide(missed))

    def append_group(self, parts: Sequence[GroupAppend]) -> list[AppendResult]:
        """Append one record to each of several ledgers of this schema, all or none, in
        one transaction: the ledgers' rows are locked in name order (so concurrent groups
        cannot deadlock), each part's settings are checked, the records appended since
        its ``known_head`` are read and validated and handed to its ``decide``; only if
        every part agrees is each record stored at its ledger's head. Commit modes as
        `append()`.

        Raises:
            ConfigError: A ledger is keyed with another key than this store's.
            LedgerConflictError: A part's ``query_id`` is already recorded in its ledger.
            LedgerCorruptError: A ledger holds fewer records than its ``known_head``, or
                a record read back fails validation.
            StorageError: Lock timeout or a database error; nothing was written.
        """
        self._writable()
        cut = [renumberable(part.record, part.known_head) for part in parts]

        def insert(cur: Any) -> tuple[list[AppendResult], list[LedgerTip]]:
            if self.commit == "group":
                cur.execute("SET LOCAL synchronous_commit = off")
            found: dict[int, tuple[LedgerTip, list[LedgerRecord]]] = {}
            for i in sorted(range(len(parts)), key=lambda i: parts[i].name):
                part = parts[i]
                tip = self._locked_tip(cur, True, part.name, part.settings)
                check_not_behind(tip.head, part.known_head)
                missed: list[LedgerRecord] = []
                if tip.head > part.known_head:
                    prev, rows = self._rows_since(cur, part.known_head, part.name)
                    missed = missed_records(rows, part.known_head, prev, tip.head,
                                            tip.last_hash, self._key)
                found[i] = (tip, missed)
            admitted = all([parts[i].decide(found[i][1]) for i in range(len(parts))])
            new: list[LedgerTip] = []
            if admitted:
                for i, part in enumerate(parts):
                    tip = found[i][0]
                    prefix, suffix = cut[i]
                    numbered = attrs.evolve(part.record, seq=tip.head)
                    new.append(self._store_at(cur, tip, numbered,
                                              f"{prefix}{tip.head}{suffix}", part.name))
            return [AppendResult(admitted, found[i][0].head, tuple(found[i][1]))
                    for i in range(len(parts))], new

        self._tip_cache = None
        self._prefetch = None
        self._seen = None
        results, new = self._write(insert)
        if new and self.commit == "group":  # one barrier flushes the whole commit
            self._barrier(new[-1].last_hash, new[-1].head - 1, parts[-1].name)
        return results

    def _append_within_here(
        self,
        known_head: int,
        record: LedgerRecord,
        epsilon_limit: Fraction | None,
        delta_limit: Fraction,
        delta_below: Fraction | None,
    ) -> AppendResult:
        """`append_within()` decided in this process under the ledger row's lock (for a
        keyed ledger, whose links only this side can compute)."""
        cost = record.cost
        return self._append_locked_decided(
            known_head, record,
            lambda tip, _missed: within_limits(
                tip.epsilon_sum + cost.epsilon, tip.delta_sum + cost.delta,
                epsilon_limit, delta_limit, delta_below,
            ),
        )

    def _append_locked_decided(
        self,
        known_head: int,
        record: LedgerRecord,
        decide: Callable[[LedgerTip, Sequence[LedgerRecord]], bool],
    ) -> AppendResult:
        """Under the ledger row's lock: read the records missed since ``known_head``,
        ask ``decide(tip, missed)``, and store ``record`` at the head found if it agrees."""
        prefix, suffix = renumberable(record, known_head)

        def insert(cur: Any) -> tuple[bool, LedgerTip, list[LedgerRecord]]:
            if self.commit == "group":
                cur.execute("SET LOCAL synchronous_commit = off")
            tip = self._locked_tip(cur, lock=True)
            check_not_behind(tip.head, known_head)
            missed: list[LedgerRecord] = []
            if tip.head > known_head:
                prev, rows = self._rows_since(cur, known_head)
                missed = missed_records(rows, known_head, prev, tip.head, tip.last_hash,
                                        self._key)
            if not decide(tip, missed):
                return False, tip, missed
            numbered = attrs.evolve(record, seq=tip.head)
            return True, self._store_at(cur, tip, numbered, f"{prefix}{tip.head}{suffix}"), missed

        self._tip_cache = None
        self._prefetch = None
        appended, tip, missed = self._write(insert)
        if appended:
            if self.commit == "group":
                self._barrier(tip.last_hash, tip.head - 1)
            self._tip_cache = tip
            self._seen = (tip.head, tip.last_hash)
            return AppendResult(True, tip.head - 1, tuple(missed))
        self._seen = (tip.head, tip.last_hash)
        return AppendResult(False, tip.head, tuple(missed))

    def find(self, query_id: str) -> LedgerRecord | None:
        """The record carrying ``query_id``, checked against its own hash, or None."""
        row = self._fetchone(
            f"SELECT {_RECORD_COLUMNS} FROM {self._s}.records "
            "WHERE ledger = %s AND query_id = %s",
            (self.name, query_id),
        )
        if row is None:
            return None
        return check_records([tuple(row)], row[0], row[2], self._key)[0]

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    @property
    def key(self) -> LedgerKey | None:
        """The key of this keyed ledger (None: a SHA-256 chain)."""
        return self._key

    # -- beyond the interface -----------------------------------------------------------

    def stored_meta(self) -> LedgerMeta | None:
        """The ledger's stored metadata, or None if the ledger does not exist."""
        row = self._fetchone(f"SELECT meta FROM {self._s}.ledgers WHERE name = %s", (self.name,))
        return None if row is None else parse_meta(row[0])

    def chain_rows(self) -> tuple[list[RecordRow], list[MetaRow]]:
        """The raw record rows and settings-history rows, with their links, read in one
        snapshot (for an export an auditor can re-verify offline)."""
        s = self._s

        def get(cur: Any) -> tuple[list[RecordRow], list[MetaRow]]:
            rows = cur.execute(
                f"SELECT {_RECORD_COLUMNS} FROM {s}.records WHERE ledger = %s ORDER BY seq",
                (self.name,),
            ).fetchall()
            history = cur.execute(
                f"SELECT version, at, head, meta, prev_hash, hash FROM {s}.meta_history "
                "WHERE ledger = %s ORDER BY version",
                (self.name,),
            ).fetchall()
            return [tuple(r) for r in rows], [tuple(r) for r in history]

        return self._read(get, repeatable=True)

    def names(self) -> list[str]:
        """The names of every ledger in the schema."""
        return self._read(
            lambda cur: [
                r[0] for r in cur.execute(f"SELECT name FROM {self._s}.ledgers ORDER BY name")
            ]
        )

    def verify(self) -> LedgerTip:
        """Check the whole ledger: records, chain, cached tip and metadata history.

        Raises:
            LedgerCorruptError: With ``.seq`` set to the first bad record.
            StorageError: The ledger does not exist.
        """
        s = self._s
        self._check_key()

        def check(cur: Any) -> LedgerTip:
            cached = self._tip_row(cur)
            if cached is None:
                raise StorageError(f"there is no ledger named {self.name!r}")
            cur.execute(
                f"SELECT {_RECORD_COLUMNS} FROM {s}.records WHERE ledger = %s ORDER BY seq",
                (self.name,),
            )
            rows: list[RecordRow] = cur.fetchall()
            check_ledger(rows, cached, self._snapshot_rows(cur), self._key)
            cur.execute(
                f"SELECT version, at, head, meta, prev_hash, hash FROM {s}.meta_history "
                "WHERE ledger = %s ORDER BY version",
                (self.name,),
            )
            history = cur.fetchall()
            cur.execute(f"SELECT meta FROM {s}.ledgers WHERE name = %s", (self.name,))
            check_meta_history(history, cur.fetchone()[0], self._key)
            return cached

        tip = self._read(check, repeatable=True)
        self._tip_cache = tip
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
        s = self._s
        self._check_key()

        def check(cur: Any) -> LedgerTip | None:
            cached = self._tip_row(cur)
            if cached is None:
                raise StorageError(f"there is no ledger named {self.name!r}")
            latest = self._snapshot_rows(cur, latest=True)
            if not latest:
                return None
            snap = snapshot_of(latest[0], self._key)
            rows: list[RecordRow] = cur.execute(
                f"SELECT {_RECORD_COLUMNS} FROM {s}.records WHERE ledger = %s AND seq >= %s "
                "ORDER BY seq", (self.name, snap.tip.head - 1),
            ).fetchall()
            anchor = None
            if rows and rows[0][0] == snap.tip.head - 1:
                anchor = str(rows.pop(0)[3])
            check_since_snapshot(snap, anchor, rows, cached, self._key)
            history = cur.execute(
                f"SELECT version, at, head, meta, prev_hash, hash FROM {s}.meta_history "
                "WHERE ledger = %s ORDER BY version", (self.name,),
            ).fetchall()
            current = cur.execute(f"SELECT meta FROM {s}.ledgers WHERE name = %s",
                                  (self.name,)).fetchone()[0]
            check_meta_history(history, current, self._key)
            self.snapshot = snap
            return cached

        tip = self._read(check, repeatable=True)
        if tip is None:
            return self.verify()
        self._tip_cache = tip
        return tip

    def snapshots(self) -> list[Snapshot]:
        """Every stored snapshot, oldest first, each link checked."""
        rows = self._read(lambda cur: self._snapshot_rows(cur))
        return [snapshot_of(row, self._key) for row in rows]

    def write_snapshot(self, head: int, settings: str, state: str | None) -> bool:
        """Store a snapshot of the ledger after ``head`` records, if that is still its
        head (else nothing is written and False is returned)."""

        def insert(cur: Any) -> bool:
            tip = self._locked_tip(cur, lock=True)
            if tip.head != head or head == 0:
                return False
            cur.execute(
                f"INSERT INTO {self._s}.snapshots VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT DO NOTHING",
                (self.name, head, tip.last_hash, frac_text(tip.epsilon_sum),
                 frac_text(tip.delta_sum), settings, state,
                 snapshot_link(tip, settings, state, self._key)),
            )
            return bool(cur.rowcount == 1)

        return self._write(insert)

    def _snapshot_rows(self, cur: Any, latest: bool = False) -> list[SnapshotRow]:
        rows = cur.execute(
            "SELECT head, last_hash, epsilon_sum, delta_sum, settings, state, hash FROM "
            f"{self._s}.snapshots WHERE ledger = %s ORDER BY head"
            + (" DESC LIMIT 1" if latest else ""), (self.name,),
        ).fetchall()
        return [tuple(r) for r in rows]

    def _verify_on_open(self) -> None:
        if self.full_verify:
            self.verify()
            latest = self._read(lambda cur: self._snapshot_rows(cur, latest=True))
            self.snapshot = snapshot_of(latest[0], self._key) if latest else None
        else:
            self.verify_recent()

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

    # -- internals ----------------------------------------------------------------------

    def _setup(self, conn: Any) -> None:
        # Every statement is idempotent; a schema made before append_within existed
        # gets its function here.
        def present() -> bool:
            return bool(conn.execute(
                "SELECT to_regclass(%s) IS NOT NULL AND to_regprocedure(%s) IS NOT NULL "
                "AND to_regprocedure(%s) IS NOT NULL AND to_regprocedure(%s) IS NOT NULL "
                "AND to_regclass(%s) IS NOT NULL",
                (f"{self._s}.meta_history", f"{self._s}.{_WITHIN_SIGNATURE}",
                 f"{self._s}.{_TIP_FUNCTION}()", f"{self._s}.{_SUMS_FUNCTION}()",
                 f"{self._s}.snapshots"),
            ).fetchone()[0])

        if present():
            return
        if self.read_only:
            raise StorageError(
                f"schema {self.schema!r} holds no dpaccount ledger tables this version can "
                "read (opened read-only: nothing was created; a schema made by an earlier "
                "dpaccount is upgraded by opening it once without read_only)"
            )
        # A session lock, then a fresh transaction: a process that waited while another
        # created the schema checks again in a transaction that starts after that one
        # committed, and does not re-run the DDL (CREATE TRIGGER's table locks deadlock
        # with the first process's charges).
        conn.execute("SELECT pg_advisory_lock(7346287161)")
        try:
            with conn.transaction():
                if not present():
                    for statement in _schema_sql(self.schema):
                        conn.execute(statement)
        finally:
            conn.execute("SELECT pg_advisory_unlock(7346287161)")

    def _connection(self) -> Any:
        if self._conn is None or self._conn.closed or self._conn.broken:
            conn = self._pg.connect(self._conninfo, autocommit=True)
            try:
                pid, sync = conn.execute(
                    "SELECT pg_backend_pid(), current_setting('synchronous_commit')"
                ).fetchone()
                if pid != conn.info.backend_pid:  # a pooler answered the connection
                    self._refuse_transaction_pooling(conn)
                ms = max(int(self.lock_timeout * 1000), 1)
                conn.execute(f"SET lock_timeout = {ms}")
                if self.read_only:
                    conn.execute("SET default_transaction_read_only = on")
                # A charge must be flushed before append() returns: never run with the
                # server's synchronous_commit = off (stricter settings are kept).
                if sync == "off":
                    conn.execute("SET synchronous_commit = on")
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _refuse_transaction_pooling(self, conn: Any) -> None:
        """Refuse a pooler that does not give this connection one server session.

        Behind PgBouncer (or a similar pooler) the backend key the client was sent is
        not the server process's id. In session mode the connection keeps its server
        process for its whole life, which the store needs (session settings, prepared
        statements, a session advisory lock while creating the schema). To tell: a
        second connection opens a transaction, which pins the server process that
        ``conn`` just released if the pooler hands processes out per transaction; then
        ``conn`` asks for its process id. The same id as before means a session of its
        own. Another id, or waiting until the second transaction ends, means
        transaction (or statement) pooling.

        Raises:
            ConfigError: The pooler hands out server processes per transaction or
                statement.
        """
        first = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        result: list[Any] = []
        probe = self._pg.connect(self._conninfo, autocommit=True)
        try:
            try:
                probe.execute("BEGIN")
                probe.execute("SELECT pg_backend_pid()")
            except self._pg.Error:
                result.append("statement")  # a multi-statement transaction is refused
            else:
                asker = threading.Thread(
                    target=lambda: result.append(
                        conn.execute("SELECT pg_backend_pid()").fetchone()[0]
                    ),
                    daemon=True,
                )
                asker.start()
                asker.join(_POOLER_PROBE_SECONDS)
                if asker.is_alive():
                    result.append("waited for the other transaction")
                probe.execute("COMMIT")
                asker.join()
        finally:
            probe.close()
        if result != [first]:
            raise ConfigError(
                f"ledger {self.name!r}: the connection goes through a pooler (PgBouncer?) "
                "that hands out server sessions per transaction or statement; a ledger "
                "needs one server session per connection. Use the pooler's session mode "
                "(pool_mode = session) for the ledger's database, or connect to "
                "PostgreSQL directly"
            )

    def _call(self, body: Callable[[Any], T]) -> T:
        """Run ``body(connection)``, mapping database errors to the error tree."""
        errors = self._pg.errors
        with self._lock:
            try:
                return body(self._connection())
            except errors.LockNotAvailable as exc:
                raise StorageError(
                    f"could not lock ledger {self.name!r} within {self.lock_timeout:g} s; "
                    "nothing was written"
                ) from exc
            except errors.UniqueViolation as exc:
                raise LedgerConflictError(f"a concurrent writer recorded first: {exc}") from exc
            except self._pg.Error as exc:
                raise StorageError(f"PostgreSQL failed for ledger {self.name!r}: {exc}") from exc

    def _write(self, body: Callable[[Any], T], serializable: bool = False) -> T:
        self._writable()

        def run(conn: Any) -> T:
            for _attempt in range(_SERIALIZATION_RETRIES):
                try:
                    with conn.transaction():
                        if serializable:
                            conn.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
                        return body(conn.cursor())
                except (
                    self._pg.errors.SerializationFailure,
                    self._pg.errors.DeadlockDetected,
                ):
                    continue
            raise StorageError(
                f"ledger {self.name!r}: serialization failures persisted after "
                f"{_SERIALIZATION_RETRIES} retries; nothing was written"
            )

        return self._call(run)

    def _read(self, body: Callable[[Any], T], repeatable: bool = False) -> T:
        def run(conn: Any) -> T:
            with conn.transaction():
                if repeatable:
                    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                return body(conn.cursor())

        return self._call(run)

    def _locked_tip(self, cur: Any, lock: bool, name: str | None = None,
                    settings: str | None = None) -> LedgerTip:
        """The ledger row's tip (``FOR UPDATE`` when ``lock``), after checking that its
        settings are the ones this store opened under (for another ledger of the schema,
        ``name``: that they are ``settings``, and keyed with this store's key)."""
        cur.execute(
            f"SELECT head, last_hash, epsilon_sum, delta_sum, meta FROM {self._s}.ledgers "
            "WHERE name = %s" + (" FOR UPDATE" if lock else ""),
            (self.name if name is None else name,),
        )
        row = cur.fetchone()
        if row is None:
            raise StorageError(f"ledger {self.name if name is None else name!r} is not "
                               "initialized")
        if name is None:
            self._check_meta(row[4])
        else:
            if settings is not None and str(row[4]) != settings:
                raise self._migrated(name)
            check_key(str(row[4]), self._key, name)
        return LedgerTip(int(row[0]), row[1], parse_frac(row[2], "epsilon_sum"),
                         parse_frac(row[3], "delta_sum"))

    def _store_at(self, cur: Any, tip: LedgerTip, record: LedgerRecord, payload: str,
                  name: str | None = None) -> LedgerTip:
        """Insert ``record`` (numbered ``tip.head``) and advance the ledger row; the new
        tip (in the caller's transaction, with the row locked)."""
        name = self.name if name is None else name
        record_hash = chain_hash_payload(tip.last_hash, payload, self._key)
        new = tip.after(record, record_hash)
        self._insert_record(cur, record, payload, tip.last_hash, record_hash, name)
        cur.execute(
            f"UPDATE {self._s}.ledgers SET head = %s, last_hash = %s, epsilon_sum = %s, "
            "delta_sum = %s WHERE name = %s",
            (new.head, new.last_hash, frac_text(new.epsilon_sum), frac_text(new.delta_sum),
             name),
        )
        return new

    def _writable(self) -> None:
        if self.read_only:
            raise ReadOnlyLedgerError(
                f"ledger {self.name!r} was opened read-only; nothing was written"
            )

    def _keyed(self, meta: LedgerMeta) -> LedgerMeta:
        """``meta`` naming this store's key (or none)."""
        return meta.model_copy(update={"key_id": None if self._key is None else self._key.key_id})

    def _check_key(self) -> None:
        row = self._fetchone(f"SELECT meta FROM {self._s}.ledgers WHERE name = %s", (self.name,))
        check_key(None if row is None else str(row[0]), self._key, self.name)

    def _migrated(self, name: str | None = None) -> StorageError:
        return StorageError(
            f"ledger {self.name if name is None else name!r} was migrated to other settings "
            "(budget, rule or relation) since it was opened; nothing was written. Reopen "
            "it, so that every charge is decided under the stored settings."
        )

    def _check_meta(self, stored: Any) -> None:
        """Fail closed if the stored settings are not the ones this store opened under
        (call with the ledger row locked)."""
        if self._meta_text is not None and str(stored) != self._meta_text:
            raise self._migrated()

    def _rows_since(self, executor: Any, start: int, name: str | None = None
                    ) -> tuple[str, list[RecordRow]]:
        """The hash of record ``start - 1`` and the rows from ``start`` on, in one
        statement (one snapshot, one round trip)."""
        rows: list[RecordRow] = executor.execute(
            f"SELECT {_RECORD_COLUMNS} FROM {self._s}.records WHERE ledger = %s "
            "AND seq >= %s ORDER BY seq",
            (self.name if name is None else name, start - 1 if start > 0 else 0),
        ).fetchall()
        prev = GENESIS_HASH
        if start > 0:
            if not rows or rows[0][0] != start - 1:
                raise LedgerCorruptError(f"record {start - 1} is missing", seq=start - 1)
            prev = rows.pop(0)[3]
        return prev, rows

    def _fetchone(self, query: str, params: tuple[Any, ...]) -> Any:
        return self._call(lambda conn: conn.execute(query, params).fetchone())

    def _tip_row(self, cur: Any) -> LedgerTip | None:
        cur.execute(
            f"SELECT head, last_hash, epsilon_sum, delta_sum FROM {self._s}.ledgers "
            "WHERE name = %s",
            (self.name,),
        )
        row = cur.fetchone()
        if row is None:
            return None
        return LedgerTip(
            int(row[0]), row[1], parse_frac(row[2], "epsilon_sum"),
            parse_frac(row[3], "delta_sum"),
        )

    def _fetch_tip(self) -> LedgerTip:
        tip = self._call(lambda conn: self._tip_row(conn.cursor()))
        if tip is None:
            raise StorageError(f"ledger {self.name!r} is not initialized")
        self._tip_cache = tip
        return tip

    def _insert_record(self, cur: Any, record: LedgerRecord, payload: str, prev: str,
                       record_hash: str, name: str | None = None) -> None:
        cur.execute(
            f"INSERT INTO {self._s}.records VALUES (%s, %s, %s, %s, %s, %s)",
            (self.name if name is None else name, record.seq, payload, prev, record_hash,
             record.query_id),
        )

    def _advance_tip_cache(self, start: int, prev: str, records: Sequence[LedgerRecord],
                           last_hash: str) -> None:
        """Fold records just read (and chain-checked) into the cached tip, if it is theirs.

        After losing a race the accountant reads the winners' records; folding them here
        lets the retried append go straight to the database without re-reading the tip.
        """
        tip = self._tip_cache
        if tip is None or tip.head != start or tip.last_hash != prev or not records:
            return
        for record in records[:-1]:
            tip = tip.after(record, chain_hash(tip.last_hash, record, self._key))
        self._tip_cache = tip.after(records[-1], last_hash)

    def _append_conditional(self, tip: LedgerTip, record: LedgerRecord, payload: str) -> None:
        record_hash = chain_hash_payload(tip.last_hash, payload, self._key)
        new = tip.after(record, record_hash)
        params = {
            "name": self.name, "seq": tip.head, "prev": tip.last_hash, "head": new.head,
            "hash": record_hash, "eps": frac_text(new.epsilon_sum),
            "delta": frac_text(new.delta_sum), "payload": payload, "qid": record.query_id,
            "meta": self._meta_text,
        }
        self._tip_cache = None
        appended, rows = self._call(lambda conn: self._append_round_trip(conn, params))
        if appended:
            tip, rows = new, rows[1:]  # our own record comes first
        try:
            records = check_records(rows, tip.head, tip.last_hash, self._key)
        except LedgerCorruptError:
            records = []  # the next read() finds and reports it
        self._tip_cache = tip
        if records:
            self._advance_tip_cache(tip.head, tip.last_hash, records, rows[-1][3])
            self._prefetch = (time.monotonic(), tip.head, records)
        if not appended:
            if self._meta_text is not None:  # lost to a migration, not to a writer?
                row = self._fetchone(
                    f"SELECT meta FROM {self._s}.ledgers WHERE name = %s", (self.name,)
                )
                self._check_meta(None if row is None else row[0])
            raise LedgerConflictError(
                f"expected {tip.head} records: another writer appended first"
            )

    def _append_round_trip(
        self, conn: Any, params: dict[str, Any]
    ) -> tuple[bool, list[RecordRow]]:
        """Run one append's statements in one round trip (see ``_sql_append``).

        ``"group"``: ``BEGIN``, ``SET LOCAL synchronous_commit = off``, the
        compare-and-append statement, ``COMMIT`` (the row lock is released here, before
        any flush); then, in one implicit transaction with the session's synchronous
        commit, the barrier (it writes a WAL record only if our record is stored, so the
        commit must flush the WAL through its own commit record, hence through the
        append's) and the read of the records from ``seq`` on. After a lost race the
        barrier writes nothing and the commit costs no flush. ``"sync"``: the append and
        the read in one implicit transaction, committed synchronously while the ledger
        row is still locked.

        Returns:
            Whether the record was appended (and is durable), and the rows read last
            (starting with our own record if it was appended).
        """
        cur = self._run_prepared(conn, self._sql_append[self.commit], params)
        appended = False
        selects: list[list[RecordRow]] = []
        while True:
            status = cur.statusmessage or ""
            if status.startswith("INSERT"):
                appended = cur.rowcount == 1
            elif status.startswith("SELECT"):
                selects.append(cur.fetchall())
            if not cur.nextset():
                break
        rows = selects[-1] if selects else []
        barrier_ok = self.commit == "sync" or len(selects[0]) == 1
        if appended and (not barrier_ok or not rows or rows[0][3] != params["hash"]):
            raise StorageError(
                f"ledger {self.name!r}: record {params['seq']} was not found after its "
                "commit; the charge is refused"
            )
        return appended, rows

    def _prepare(self, conn: Any) -> None:
        """Prepare the append statements once per connection (again after they are lost).

        The connection is this store's own, so ``DEALLOCATE ALL`` first makes preparing
        idempotent: after psycopg (or a pooler) dropped some or all of them, they are
        prepared afresh.
        """
        if self._prepared_on is conn:
            return
        try:
            conn.execute("DEALLOCATE ALL")
            for name, sql in self._prepare_sql.items():
                conn.execute(f"PREPARE {name} {sql}")
        except self._pg.Error:
            conn.close()  # start over on a fresh connection next time
            raise
        self._prepared_on = conn

    def _run_prepared(self, conn: Any, sql: str, params: dict[str, Any]) -> Any:
        """Execute one round trip of prepared statements; survive lost statements.

        A failed transaction makes psycopg reset the session's prepared statements
        (``DEALLOCATE ALL``), e.g. after losing a ``query_id`` race: they are prepared
        again and the round trip retried once, so the writer keeps working.
        """
        for attempt in (1, 2):
            self._prepare(conn)
            cur = self._pg.ClientCursor(conn)
            try:
                cur.execute(sql, params)
            except self._pg.errors.InvalidSqlStatementName:
                self._rollback(conn)
                self._prepared_on = None
                if attempt == 2:
                    raise
                continue
            except self._pg.Error:
                self._rollback(conn)
                self._prepared_on = None  # the session may have lost them: re-prepare
                raise
            return cur
        raise StorageError("unreachable")  # pragma: no cover

    def _within_round_trip(
        self, conn: Any, params: dict[str, Any]
    ) -> tuple[list[RecordRow], tuple[Any, ...], bool]:
        """Run append_within's statements in one round trip (see ``_sql_within``).

        ``"group"``: ``BEGIN``, ``SET LOCAL synchronous_commit = off``, the function
        call, ``COMMIT`` (releasing the row lock before any flush), then the barrier in
        its own synchronous transaction: it writes a WAL record only if our record is
        stored, so its commit flushes the WAL through the append's commit record.
        ``"sync"``: the function call alone, committed synchronously under the lock.

        Returns:
            The record rows the function returned (from ``known - 1``), its status row,
            and whether the barrier found our record (always True for ``"sync"``).
        """
        cur = self._run_prepared(conn, self._sql_within[self.commit], params)
        selects: list[list[Any]] = []
        while True:
            if (cur.statusmessage or "").startswith("SELECT"):
                selects.append(cur.fetchall())
            if not cur.nextset():
                break
        if not selects or not selects[0]:
            raise StorageError(f"ledger {self.name!r}: append_within returned no status")
        rows = selects[0]
        barrier_ok = self.commit == "sync" or (len(selects) == 2 and len(selects[1]) == 1)
        return [tuple(r[:5]) for r in rows[:-1]], tuple(rows[-1]), barrier_ok

    def _fresh_prefetch(self) -> tuple[int, list[LedgerRecord]] | None:
        """The records the last append brought back, if they are recent enough."""
        prefetch = self._prefetch
        if prefetch is None or time.monotonic() - prefetch[0] > _PREFETCH_SECONDS:
            return None
        return prefetch[1], prefetch[2]

    def _barrier(self, record_hash: str, seq: int, name: str | None = None) -> None:
        """Wait until the append of record ``seq`` is flushed (see ``_append_round_trip``)."""
        params = {"name": self.name if name is None else name, "seq": seq, "hash": record_hash}

        def run(conn: Any) -> None:
            if conn.execute(self._sql_barrier, params).fetchone() is None:
                raise StorageError(
                    f"ledger {self.name!r}: record {seq} vanished before its durability "
                    "barrier; the charge is refused"
                )

        self._call(run)

    def _rollback(self, conn: Any) -> None:
        """End a failed explicit transaction so the connection can be reused."""
        idle = self._pg.pq.TransactionStatus.IDLE
        if conn.closed or conn.broken or conn.info.transaction_status == idle:
            return
        try:
            conn.execute("ROLLBACK")
        except self._pg.Error:
            conn.close()  # reconnect on the next call

    def _append_locked(self, expected_head: int, record: LedgerRecord, payload: str) -> None:
        row_lock = self.locking == "row"

        def insert(cur: Any) -> LedgerTip:
            if self.commit == "group":
                cur.execute("SET LOCAL synchronous_commit = off")
            tip = self._locked_tip(cur, lock=row_lock)
            if tip.head != expected_head:
                raise LedgerConflictError(f"expected {expected_head} records, found {tip.head}")
            return self._store_at(cur, tip, record, payload)

        self._tip_cache = None
        new = self._write(insert, serializable=not row_lock)
        if self.commit == "group":
            self._barrier(new.last_hash, expected_head)
        self._tip_cache = new

    def _insert_meta(self, cur: Any, version: int, prev: str, head: int, meta_json: str) -> None:
        at = datetime.now(UTC).isoformat()
        cur.execute(
            f"INSERT INTO {self._s}.meta_history VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (self.name, version, at, head, meta_json, prev,
             meta_hash(prev, version, at, head, meta_json, self._key)),
        )

    def missing_protections(self) -> list[str]:
        """The protective triggers that are missing or disabled (dropped or switched off)."""
        expected = {"records_append_only", "records_no_truncate", "meta_history_append_only",
                    "meta_history_no_truncate", "ledgers_keep", "ledgers_tip_moves_forward",
                    "ledgers_sums_follow_records", "snapshots_append_only",
                    "snapshots_no_truncate"}

        def get(conn: Any) -> list[str]:
            rows = conn.execute(
                "SELECT t.tgname, t.tgenabled FROM pg_trigger t JOIN pg_class c "
                "ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND NOT t.tgisinternal", (self.schema,)
            ).fetchall()
            enabled = {str(name) for name, state in rows if str(state) != "D"}
            return sorted(expected - enabled)

        return self._call(get)

    def __repr__(self) -> str:
        return f"PostgresStore(name={self.name!r}, schema={self.schema!r})"
