"""Fail closed inside the deciding transaction (issue 28, item 3).

A hostile review found that each writer opened *before* someone dropped or disabled a
trigger, set ``session_replication_role = replica`` or replaced the append function got
one charge past the budget (1.1 spent of 1). Here a writer is opened, charges, then
someone bypasses the protections behind its back; its next charge must be refused with
`LedgerCorruptError`, nothing recorded, and the guarded query must not run. Expected
values: the budget arithmetic is exact (0.9 + 0.2 > 1), and "nothing recorded" is read
back with plain SQL, not through dpaccount.
"""

from __future__ import annotations

import contextlib
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from storage_helpers import PG_URL, need_postgres, pg_schema

from dpaccount import Budget, LaplaceMechanism, PrivacyCost, open_ledger
from dpaccount.accountant import Accountant
from dpaccount.errors import LedgerCorruptError, StorageError
from dpaccount.records import LedgerRecord, canonical_bytes, chain_hash_payload
from dpaccount.storage.sqlite.schema import SCHEMA, TRIGGERS

RULES = ["basic", "filter"]
BUDGETS = {"basic": Budget(1), "filter": Budget(10, "1e-6")}


def guarded_query(acct: Accountant, epsilon: str = "0.2") -> list[int]:
    """Run a guarded query; return what it ran (nothing, if the charge was refused)."""
    ran: list[int] = []
    mechanism = LaplaceMechanism(epsilon=epsilon, sensitivity=1)
    with pytest.raises(LedgerCorruptError):
        acct.run(mechanism, lambda: ran.append(1) or 1)
    return ran


# -- PostgreSQL ---------------------------------------------------------------------------


class Pg:
    """A ledger schema on the test server, and raw SQL on it as a superuser."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.s = f'"{schema}"'
        self.url = f"{PG_URL}?schema={schema}"

    def sql(self, statement: str, params: tuple[Any, ...] = (), replica: bool = False
            ) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(PG_URL, autocommit=True) as conn:
            if replica:  # this session's triggers do not fire; the catalogs are untouched
                conn.execute("SET session_replication_role = replica")
            cur = conn.execute(statement.format(s=self.s), params or None)
            return cur.fetchall() if cur.description else []

    def count(self, name: str = "L") -> int:
        return int(self.sql("SELECT count(*) FROM {s}.records WHERE ledger = %s",
                            (name,))[0][0])


@pytest.fixture
def pg() -> Iterator[Pg]:
    for schema in pg_schema():
        yield Pg(schema)


def _writer(url: str, rule: str, name: str = "L") -> Accountant:
    """A writer that has charged 0.5 and 0.4 itself."""
    acct = open_ledger(url, name=name, budget=BUDGETS[rule], rule=rule)
    acct.charge(PrivacyCost("0.5"))
    acct.charge(PrivacyCost("0.4"))
    return acct


def _stale_writer(url: str, rule: str) -> Accountant:
    """The review's writer: opened before another writer spent 0.9 (0.5 and 0.4), whose
    records it has not read yet. Its own total is 0, so a charge of 0.2 goes to the
    store, which (under the basic rule) decides on the cached sums: reset to 0 they used
    to admit it, 1.1 spent of a budget of 1."""
    writer = open_ledger(url, name="L", budget=BUDGETS[rule], rule=rule)
    with open_ledger(url, name="L") as other:
        other.charge(PrivacyCost("0.5"))
        other.charge(PrivacyCost("0.4"))
    return writer


RESET = "UPDATE {s}.ledgers SET epsilon_sum = '0/1' WHERE name = 'L'"

#: How the protections are bypassed before the cached sums are reset to 0.
PG_BYPASSES: dict[str, list[str]] = {
    "drop trigger": ["DROP TRIGGER ledgers_tip_moves_forward ON {s}.ledgers", RESET],
    "disable one trigger": [
        "ALTER TABLE {s}.ledgers DISABLE TRIGGER ledgers_tip_moves_forward", RESET],
    "disable all triggers": ["ALTER TABLE {s}.ledgers DISABLE TRIGGER ALL", RESET],
    "disabled, reset, enabled again": [
        "ALTER TABLE {s}.ledgers DISABLE TRIGGER ledgers_tip_moves_forward", RESET,
        "ALTER TABLE {s}.ledgers ENABLE TRIGGER ledgers_tip_moves_forward"],
}


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("bypass", sorted(PG_BYPASSES))
def test_postgres_a_bypass_behind_a_running_writer_fails_closed(pg: Pg, bypass: str,
                                                                rule: str) -> None:
    # The review's 1.1-of-1 overspend: the writer used to admit 0.2 on the reset sums.
    writer = _stale_writer(pg.url, rule)
    for statement in PG_BYPASSES[bypass]:
        pg.sql(statement)
    assert guarded_query(writer) == []
    assert pg.count() == 2
    writer.close()


@pytest.mark.parametrize("rule", RULES)
def test_postgres_a_reset_in_a_replica_session_fails_closed(pg: Pg, rule: str) -> None:
    # session_replication_role = replica in the tamperer's session: its triggers do not
    # fire and the catalogs keep no trace. The records since the tip the writer saw do
    # not add up to the cached sums: refused before anything is written.
    writer = _stale_writer(pg.url, rule)
    pg.sql(RESET, replica=True)
    assert guarded_query(writer) == []
    assert pg.count() == 2
    writer.close()


@pytest.mark.parametrize("rule", RULES)
def test_postgres_a_protection_down_is_refused_even_without_a_reset(pg: Pg, rule: str
                                                                    ) -> None:
    writer = _writer(pg.url, rule)
    pg.sql("ALTER TABLE {s}.records DISABLE TRIGGER records_append_only")
    assert guarded_query(writer, "0.01") == []
    assert pg.count() == 2
    writer.close()


def _function_names() -> list[str]:
    from dpaccount.storage.postgres.schema import function_sources

    return sorted(function_sources("x"))


def _replace(pg: Pg, function: str, edit: Callable[[str], str]) -> None:
    definition = pg.sql(
        "SELECT pg_get_functiondef(p.oid) FROM pg_proc p WHERE p.proname = %s "
        "AND p.pronamespace = %s::regnamespace", (function, pg.s))[0][0]
    pg.sql(edit(definition).replace("{", "{{").replace("}", "}}"))


@pytest.mark.parametrize("function", _function_names())
def test_postgres_a_replaced_function_behind_a_running_writer_fails_closed(
    pg: Pg, function: str
) -> None:
    writer = _writer(pg.url, "basic")
    # The same body with a comment: the source differs (a forgery could do anything).
    _replace(pg, function, lambda text: text.replace("$function$", "$function$ /* x */", 1))
    assert guarded_query(writer, "0.01") == []
    assert pg.count() == 2
    writer.close()


@pytest.mark.parametrize("rule", RULES)
def test_postgres_a_lenient_append_function_cannot_overspend(pg: Pg, rule: str) -> None:
    # The review's finding itself: a replaced function that admits anything. Replaced
    # while the writer runs: refused (the guard runs after it, in its transaction).
    writer = _stale_writer(pg.url, rule)
    pg.sql(RESET, replica=True)  # and the sums reset: the lenient function's chance
    lenient = {"basic": ("dpaccount_append_within_v4", "v_ok := (", "v_ok := true OR ("),
               "filter": ("dpaccount_append_at_v1", "v_all_ok := v_all_ok AND",
                          "v_all_ok := true OR")}[rule]
    _replace(pg, lenient[0], lambda text: text.replace(lenient[1], lenient[2], 1))
    assert guarded_query(writer) == []
    assert pg.count() == 2
    writer.close()


@pytest.mark.parametrize("rule", RULES)
def test_postgres_a_migration_by_another_process_fails_closed(pg: Pg, rule: str) -> None:
    writer = _writer(pg.url, rule)
    open_ledger(pg.url, name="L", budget=Budget("0.5", BUDGETS[rule].delta), rule=rule,
                migrate=True).close()
    ran: list[int] = []
    with pytest.raises(LedgerCorruptError, match="migrated"):
        writer.run(LaplaceMechanism(epsilon="0.01", sensitivity=1),
                   lambda: ran.append(1) or 1)
    assert ran == [] and pg.count() == 2
    writer.close()


def _terminate(user: str | None = None, database: str | None = None) -> None:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> "
            "pg_backend_pid() AND (%s::text IS NULL OR usename = %s) "
            "AND (%s::text IS NULL OR datname = %s)", (user, user, database, database))


def _new_session_refused(writer: Accountant, count: Callable[[], int]) -> None:
    """The writer's session was ended: its next charge fails on the dead connection
    (nothing written), and the one after runs in a new session, which inherits
    ``session_replication_role = replica``: refused."""
    ran: list[int] = []
    mechanism = LaplaceMechanism(epsilon="0.01", sensitivity=1)
    with pytest.raises(StorageError):
        writer.run(mechanism, lambda: ran.append(1) or 1)
    with pytest.raises(LedgerCorruptError, match="session_replication_role"):
        writer.run(mechanism, lambda: ran.append(1) or 1)
    assert ran == [] and count() == 2


@pytest.mark.parametrize("rule", RULES)
def test_postgres_replica_inherited_from_alter_role_fails_closed(pg: Pg, rule: str) -> None:
    from dpaccount.ledger_cli import ledger_main

    role = f"dpacct_srr_{uuid.uuid4().hex[:10]}"
    pg.sql(f'CREATE ROLE "{role}" LOGIN')
    try:
        open_ledger(pg.url, name="L", budget=BUDGETS[rule], rule=rule).close()
        assert ledger_main(["ledger", "grant", pg.url, "--name", "L", "--role", role,
                            "--as", "writer"]) == 0
        url = pg.url.replace("postgres@", f"{role}@", 1)
        writer = open_ledger(url, name="L")
        writer.charge(PrivacyCost("0.5"))
        writer.charge(PrivacyCost("0.4"))
        pg.sql(f'ALTER ROLE "{role}" SET session_replication_role = replica')
        _terminate(user=role)
        _new_session_refused(writer, pg.count)
        writer.close()
    finally:
        pg.sql(f'ALTER ROLE "{role}" RESET ALL')
        _terminate(user=role)
        pg.sql(f'DROP OWNED BY "{role}"')
        pg.sql(f'DROP ROLE "{role}"')


def test_postgres_replica_inherited_from_alter_database_fails_closed() -> None:
    import psycopg

    need_postgres()
    database = f"dpacct_srr_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    base = PG_URL.rsplit("/", 1)[0]
    url = f"{base}/{database}"
    try:
        writer = _writer(url, "basic")
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{database}" SET session_replication_role = replica')
        _terminate(database=database)

        def count() -> int:
            with psycopg.connect(url) as conn:
                return int(conn.execute("SELECT count(*) FROM dpaccount.records").fetchone()[0])

        _new_session_refused(writer, count)
        writer.close()
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def test_postgres_a_share_refuses_when_its_parents_sums_were_reset(pg: Pg) -> None:
    # The charge to a share goes to its parent in the same transaction: the parent's tip
    # is checked too (against what the parent's own store saw).
    open_ledger(pg.url, name="census", budget=Budget(1)).close()
    hr = open_ledger(pg.url, name="census/hr", budget=Budget(1), parent="census")
    hr.charge(PrivacyCost("0.9"))
    pg.sql("UPDATE {s}.ledgers SET epsilon_sum = '0/1' WHERE name = 'census'", replica=True)
    assert guarded_query(hr) == []
    assert pg.count("census") == pg.count("census/hr") == 1
    hr.close()


def _forged_record(prev: str, seq: int) -> tuple[str, str]:
    record = LedgerRecord(seq=seq, label="forged", charge=PrivacyCost("0.5"),
                          cost=PrivacyCost("0.5"), rule="basic",
                          timestamp=datetime(2026, 1, 1, tzinfo=UTC))
    payload = canonical_bytes(record).decode()
    return payload, chain_hash_payload(prev, payload)


def test_postgres_a_tip_moved_forward_past_records_it_leaves_out_stops_the_writer(pg: Pg
                                                                                  ) -> None:
    # Forward, but under-counting: a record of 0.5 appended with the sums left as they
    # were (in a session whose triggers do not fire). The basic rule's function decides
    # on the sums, so it first adds up the records since the tip the writer saw.
    writer = _writer(pg.url, "basic")
    (prev,), = pg.sql("SELECT last_hash FROM {s}.ledgers WHERE name = 'L'")
    payload, link = _forged_record(prev, 2)
    pg.sql("INSERT INTO {s}.records VALUES ('L', 2, %s, %s, %s, NULL)", (payload, prev, link),
           replica=True)
    pg.sql("UPDATE {s}.ledgers SET head = 3, last_hash = %s WHERE name = 'L'", (link,),
           replica=True)
    assert guarded_query(writer, "0.01") == []
    assert guarded_query(writer, "0.01") == []  # and again: nothing is ever written
    assert pg.count() == 3
    writer.close()


# -- SQLite -------------------------------------------------------------------------------


class Lite:
    """A SQLite ledger file and raw SQL on it (the tamperer's sqlite3 shell)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.url = f"sqlite:///{path}"

    def sql(self, *statements: str, params: tuple[Any, ...] = ()) -> list[Any]:
        with contextlib.closing(sqlite3.connect(self.path)) as conn, conn:
            rows: list[Any] = []
            for statement in statements:
                rows = conn.execute(statement, params if "?" in statement else ()).fetchall()
            return rows

    def count(self, name: str = "L") -> int:
        return int(self.sql(f"SELECT count(*) FROM records WHERE ledger = '{name}'")[0][0])


@pytest.fixture
def lite(tmp_path: Path) -> Lite:
    return Lite(tmp_path / "ledger.db")


def _recreate(name: str) -> str:
    return next(s for s in SCHEMA if f" {name}\n" in s or f" {name} " in s)


LITE_RESET = "UPDATE ledgers SET epsilon_sum = '0/1' WHERE name = 'L'"
LITE_BYPASSES: dict[str, list[str]] = {
    "drop trigger": ["DROP TRIGGER ledgers_tip_moves_forward", LITE_RESET],
    "dropped, reset, re-created": ["DROP TRIGGER ledgers_tip_moves_forward", LITE_RESET,
                                   _recreate("ledgers_tip_moves_forward")],
    "re-created lenient": ["DROP TRIGGER ledgers_tip_moves_forward", LITE_RESET,
                           "CREATE TRIGGER ledgers_tip_moves_forward BEFORE UPDATE ON ledgers "
                           "WHEN 0 BEGIN SELECT 1; END"],
}


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("bypass", sorted(LITE_BYPASSES))
def test_sqlite_a_bypass_behind_a_running_writer_fails_closed(lite: Lite, bypass: str,
                                                              rule: str) -> None:
    writer = _stale_writer(lite.url, rule)
    lite.sql(*LITE_BYPASSES[bypass])
    assert guarded_query(writer) == []
    assert lite.count() == 2
    writer.close()


@pytest.mark.parametrize("trigger", sorted(TRIGGERS))
def test_sqlite_each_dropped_trigger_stops_a_running_writer(lite: Lite, trigger: str) -> None:
    writer = _writer(lite.url, "basic")
    lite.sql(f"DROP TRIGGER {trigger}")
    assert guarded_query(writer, "0.01") == []
    assert lite.count() == 2
    writer.close()


@pytest.mark.parametrize("rule", RULES)
def test_sqlite_a_migration_by_another_process_fails_closed(lite: Lite, rule: str) -> None:
    writer = _writer(lite.url, rule)
    open_ledger(lite.url, name="L", budget=Budget("0.5", BUDGETS[rule].delta), rule=rule,
                migrate=True).close()
    ran: list[int] = []
    with pytest.raises(LedgerCorruptError, match="migrated"):
        writer.run(LaplaceMechanism(epsilon="0.01", sensitivity=1),
                   lambda: ran.append(1) or 1)
    assert ran == [] and lite.count() == 2
    writer.close()


def test_sqlite_a_schema_change_that_keeps_the_triggers_does_not_stop_writers(lite: Lite
                                                                             ) -> None:
    # VACUUM and unrelated tables change PRAGMA schema_version: the triggers are read
    # again, found standing, and the writer goes on.
    writer = _writer(lite.url, "basic")
    lite.sql("CREATE TABLE unrelated (x INTEGER)")
    writer.charge(PrivacyCost("0.05"))
    with contextlib.closing(sqlite3.connect(lite.path, isolation_level=None)) as conn:
        conn.execute("VACUUM")
    writer.charge(PrivacyCost("0.05"))
    assert lite.count() == 4
    writer.close()


def test_sqlite_a_share_refuses_when_its_parents_sums_were_reset(lite: Lite) -> None:
    open_ledger(lite.url, name="census", budget=Budget(1)).close()
    hr = open_ledger(lite.url, name="census/hr", budget=Budget(1), parent="census")
    hr.charge(PrivacyCost("0.9"))
    lite.sql("DROP TRIGGER ledgers_tip_moves_forward",
             "UPDATE ledgers SET epsilon_sum = '0/1' WHERE name = 'census'",
             _recreate("ledgers_tip_moves_forward"))
    assert guarded_query(hr) == []
    assert lite.count("census") == lite.count("census/hr") == 1
    hr.close()


def test_sqlite_a_tip_moved_forward_past_records_it_leaves_out_stops_the_writer(lite: Lite
                                                                                ) -> None:
    writer = _writer(lite.url, "basic")
    (prev,), = lite.sql("SELECT last_hash FROM ledgers WHERE name = 'L'")
    payload, link = _forged_record(prev, 2)
    lite.sql("DROP TRIGGER ledgers_tip_moves_forward")
    lite.sql("INSERT INTO records VALUES ('L', 2, ?, ?, ?, NULL)", params=(payload, prev, link))
    lite.sql("UPDATE ledgers SET head = 3, last_hash = ? WHERE name = 'L'", params=(link,))
    lite.sql(_recreate("ledgers_tip_moves_forward"))
    assert guarded_query(writer, "0.01") == []
    assert guarded_query(writer, "0.01") == []  # and again: nothing is ever written
    assert lite.count() == 3
    writer.close()


# -- both: a cache that rounded its sums is not tampering --------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
def any_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
    else:
        for schema in pg_schema():
            yield f"{PG_URL}?schema={schema}"


def test_a_writer_that_missed_records_whose_sums_the_cache_rounded_still_charges(
    any_url: str
) -> None:
    # 50 charges of 1/(10**100 + k) by another writer: their exact sum's denominator
    # passes 4096 bits, so the cache rounds each new sum up (never down). The writer
    # that missed them adds them up exactly: the cache is above that, by less than one
    # rounding step per record, and that is no tampering.
    from fractions import Fraction

    writer = open_ledger(any_url, name="L", budget=Budget(1))
    with open_ledger(any_url, name="L") as other:
        for k in range(50):
            other.charge(PrivacyCost(Fraction(1, 10**100 + k)))
    writer.charge(PrivacyCost("0.5"))
    assert len(writer.records) == 51
    writer.close()


def test_a_writer_that_missed_others_records_adds_them_up_and_charges(any_url: str) -> None:
    # No tampering: epsilon and delta both move, with denominators that differ from
    # record to record (the exact sums keep a common denominator, or multiply out).
    from fractions import Fraction

    costs = [PrivacyCost("0.1", "1e-7"), PrivacyCost(Fraction(1, 3), Fraction(1, 7 * 10**8)),
             PrivacyCost("0.05", 0), PrivacyCost(0, "3e-8")]
    writer = open_ledger(any_url, name="L", budget=Budget(1, "1e-6"))
    writer.charge(PrivacyCost("0.01", "1e-9"))
    with open_ledger(any_url, name="L") as other:
        for cost in costs:
            other.charge(cost)
    writer.charge(PrivacyCost("0.01", "1e-9"))
    expected = sum((c.epsilon for c in costs), Fraction(2, 100))
    assert writer.spent.epsilon == expected  # the records, folded by the basic rule
    assert len(writer.records) == 6
    writer.close()
