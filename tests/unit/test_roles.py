"""Least privilege, built and tested with real roles (issue 28, item 4).

Each test creates its own login roles on the CI PostgreSQL (unique names, dropped
afterwards), grants them a ledger with ``dpaccount ledger grant`` as the schema's owner
(the test server's ``postgres``), connects as them, and checks what they can and cannot
do. Every refusal is the database's own (a ``psycopg`` error raised by the server, or
dpaccount's `StorageError` wrapping one), not a check in the client.
"""

from __future__ import annotations

import io
import os
import sqlite3
import stat
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from storage_helpers import PG_URL, pg_schema

from dpaccount import Budget, PrivacyCost, open_ledger
from dpaccount.accountant import SNAPSHOT_EVERY
from dpaccount.errors import (
    BudgetExceededError,
    ConfigError,
    DeltaWarning,
    LedgerConflictError,
    StorageError,
)
from dpaccount.ledger_cli import ledger_main
from dpaccount.records import LedgerRecord
from dpaccount.storage.base import GroupAppend

pytest.importorskip("psycopg")


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return ledger_main(["ledger", *argv], out=out), out.getvalue()


class Server:
    """A schema of its own, raw SQL as the owner, and login roles made for the test."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.s = f'"{schema}"'
        self.url = f"{PG_URL}?schema={schema}"
        self.roles: list[str] = []

    def sql(self, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(PG_URL, autocommit=True) as conn:
            cur = conn.execute(statement.format(s=self.s), params or None)
            return cur.fetchall() if cur.description else []

    def role(self) -> str:
        name = f"dpacct_role_{uuid.uuid4().hex[:10]}"
        self.sql(f'CREATE ROLE "{name}" LOGIN')
        self.roles.append(name)
        return name

    def url_as(self, role: str) -> str:
        return self.url.replace("//postgres@", f"//{role}@", 1)

    def connect_as(self, role: str) -> Any:
        import psycopg

        return psycopg.connect(PG_URL.replace("//postgres@", f"//{role}@", 1),
                               autocommit=True)

    def grant(self, name: str, role: str, access: str) -> str:
        status, text = cli("grant", self.url, "--name", name, "--role", role, "--as", access)
        assert status == 0, text
        return text

    def count(self, name: str) -> int:
        return int(self.sql("SELECT count(*) FROM {s}.records WHERE ledger = %s",
                            (name,))[0][0])

    def drop_roles(self) -> None:
        for name in self.roles:
            self.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE usename = %s", (name,))
            self.sql(f'DROP OWNED BY "{name}"')
            self.sql(f'DROP ROLE "{name}"')


@pytest.fixture
def server() -> Iterator[Server]:
    for schema in pg_schema():
        srv = Server(schema)
        try:
            yield srv
        finally:
            srv.drop_roles()


def _record(seq: int, eps: str = "1/100") -> LedgerRecord:
    return LedgerRecord(seq=seq, label="direct", charge=PrivacyCost(eps),
                        cost=PrivacyCost(eps), rule="basic",
                        timestamp=datetime(2026, 1, 1, tzinfo=UTC))


# -- the writer ---------------------------------------------------------------------------


@pytest.mark.parametrize("rule", ["basic", "filter"])
def test_a_writer_role_opens_by_name_and_charges(server: Server, rule: str) -> None:
    budget = Budget(1, "1e-6") if rule == "basic" else Budget(10, "1e-6")
    open_ledger(server.url, name="L", budget=budget, rule=rule).close()
    writer = server.role()
    assert "may charge (writer) ledger 'L'" in server.grant("L", writer, "writer")
    with open_ledger(server.url_as(writer), name="L") as acct:  # settings adopted
        assert acct.rule.name == rule
        acct.charge(PrivacyCost("0.25"), label="q", query_id="q1")
        acct.charge(PrivacyCost("0.25"))
        with pytest.raises(BudgetExceededError):
            acct.charge(PrivacyCost("0.75") if rule == "basic" else PrivacyCost(20))
    with open_ledger(server.url, name="L") as owner:  # the owner sees the writer's charges
        assert [(r.query_id, r.cost.epsilon) for r in owner.records] == [
            ("q1", Fraction(1, 4)), (None, Fraction(1, 4))]


def test_a_writer_role_writes_snapshots_and_decides_under_the_row_lock(server: Server
                                                                       ) -> None:
    # Every write an ordinary Accountant makes while charging: snapshots every 256
    # records, and (any rule but basic) the decision under the row lock, here called
    # on the store directly, and the compare-and-append of one charge to several ledgers.
    open_ledger(server.url, name="L", budget=Budget(10**6, "1e-6"), rule="filter").close()
    writer = server.role()
    server.grant("L", writer, "writer")
    with open_ledger(server.url_as(writer), name="L") as acct:
        for _ in range(SNAPSHOT_EVERY + 1):  # the 257th charge snapshots the first 256
            acct.charge(PrivacyCost("1/1000"))
        store: Any = acct.store
        head = store.head()
        result = store.append_decided(head, _record(head), lambda missed: True)
        assert result.appended and result.seq == head
        group = store.append_group([GroupAppend("L", head + 1, _record(head + 1), None,
                                                lambda missed: True)])
        assert group[0].appended
    assert [h for (h,) in server.sql("SELECT head FROM {s}.snapshots")] == [SNAPSHOT_EVERY]
    assert server.count("L") == SNAPSHOT_EVERY + 3
    assert cli("verify", server.url, "--name", "L")[0] == 0


def test_writer_roles_that_meet_decide_under_the_row_lock(server: Server) -> None:
    # Two writers of the role take turns on a filter ledger: each finds the other's
    # record, loses the compare-and-append once, and from then on decides under the row
    # lock (the lock function and the compare-and-append function, as the role).
    open_ledger(server.url, name="L", budget=Budget(10, "1e-6"), rule="filter").close()
    writer = server.role()
    server.grant("L", writer, "writer")
    a = open_ledger(server.url_as(writer), name="L")
    b = open_ledger(server.url_as(writer), name="L")
    for _ in range(10):
        a.charge(PrivacyCost("1/100"))
        b.charge(PrivacyCost("1/100"))
    assert len(a.records) == len(b.records) == server.count("L") == 20
    assert a.spent == b.spent
    a.close()
    b.close()
    assert cli("verify", server.url, "--name", "L")[0] == 0


def test_a_writer_role_is_refused_everything_else_by_the_database(server: Server) -> None:
    import psycopg

    open_ledger(server.url, name="L", budget=Budget(1)).close()
    writer = server.role()
    server.grant("L", writer, "writer")
    with open_ledger(server.url_as(writer), name="L") as acct:
        acct.charge(PrivacyCost("0.5"))
    s = server.s
    attempts = [
        f"UPDATE {s}.records SET payload = 'x'",
        f"DELETE FROM {s}.records",
        f"TRUNCATE {s}.records",
        f"UPDATE {s}.ledgers SET epsilon_sum = '0/1', delta_sum = '0/1'",  # reset the sums
        f"UPDATE {s}.ledgers SET meta = replace(meta, '\"1/1\"', '\"9/1\"')",
        f"INSERT INTO {s}.records VALUES ('L', 1, '{{}}', 'x', 'y', NULL)",  # a forged record
        f"INSERT INTO {s}.grants VALUES ('{writer}'::regrole, 'other', 'write', 'other')",
        f"DELETE FROM {s}.snapshots",
        f"ALTER TABLE {s}.ledgers DISABLE TRIGGER ledgers_tip_moves_forward",
        f"ALTER TABLE {s}.records DISABLE TRIGGER ALL",
        f"DROP TRIGGER ledgers_tip_moves_forward ON {s}.ledgers",
        f"CREATE TRIGGER evil BEFORE UPDATE ON {s}.ledgers FOR EACH ROW "
        f"EXECUTE FUNCTION {s}.dpaccount_append_only()",
        f"CREATE OR REPLACE FUNCTION {s}.dpaccount_cmp_v1(a text, b text) RETURNS integer "
        "LANGUAGE sql IMMUTABLE AS 'SELECT 0'",
        f"CREATE FUNCTION {s}.mine() RETURNS int LANGUAGE sql AS 'SELECT 1'",
        f"CREATE TABLE {s}.mine (x int)",
        f"ALTER FUNCTION {s}.dpaccount_append_within_v4 SECURITY INVOKER",
        "SET session_replication_role = replica",  # needs a superuser
        f"SELECT * FROM {s}.dpaccount_append_within_v3('L', 1, NULL, '{{', '}}', NULL, "
        "'0/1', '0/1', NULL, '1/1', NULL, NULL)",  # the old function runs as its caller
        f"SELECT {s}.dpaccount_may_write_v1(ARRAY['L'], false)",  # helpers: not EXECUTE
    ]
    with server.connect_as(writer) as conn:
        for attempt in attempts:
            with pytest.raises(psycopg.Error) as info:
                conn.execute(attempt)
                raise AssertionError(f"the database allowed: {attempt}")
            assert isinstance(info.value, (psycopg.errors.InsufficientPrivilege,
                                           psycopg.errors.RaiseException)), attempt
    assert server.count("L") == 1
    assert cli("verify", server.url, "--name", "L")[0] == 0


def test_a_writer_role_reads_only_the_ledgers_it_was_granted(server: Server) -> None:
    for name in ("L", "other"):
        with open_ledger(server.url, name=name, budget=Budget(1)) as acct:
            acct.charge(PrivacyCost("0.1"), label=f"secret of {name}")
    writer = server.role()
    server.grant("L", writer, "writer")
    with server.connect_as(writer) as conn:
        for table, column in (("ledgers", "name"), ("records", "ledger"),
                              ("meta_history", "ledger"), ("snapshots", "ledger")):
            seen = {r[0] for r in conn.execute(
                f"SELECT DISTINCT {column} FROM {server.s}.{table}").fetchall()}
            assert seen <= {"L"}, table
    assert cli("list", server.url_as(writer))[1].count("\n") == 3  # header, rule, L
    with pytest.raises(ConfigError, match="no ledger named 'other'"):  # not for it
        open_ledger(server.url_as(writer), name="other")
    with pytest.raises(StorageError):  # and nothing can be created or charged there
        open_ledger(server.url_as(writer), name="other", budget=Budget(5))
    assert server.count("other") == 1


def test_a_writer_role_cannot_create_or_migrate_a_ledger(server: Server) -> None:
    open_ledger(server.url, name="L", budget=Budget(1)).close()
    writer = server.role()
    server.grant("L", writer, "writer")
    with pytest.raises(StorageError):
        open_ledger(server.url_as(writer), name="L", budget=Budget(100), migrate=True)
    with pytest.raises(StorageError):
        open_ledger(server.url_as(writer), name="new", budget=Budget(1))
    assert server.sql("SELECT name, meta FROM {s}.ledgers") == [
        ("L", server.sql("SELECT meta FROM {s}.meta_history")[0][0])]


def test_a_share_writer_charges_only_through_the_share(server: Server) -> None:
    import psycopg

    open_ledger(server.url, name="census", budget=Budget(1)).close()
    open_ledger(server.url, name="census/hr", budget=Budget("0.5"), parent="census").close()
    writer = server.role()
    text = server.grant("census/hr", writer, "writer")
    assert "may also read 'census'" in text
    with open_ledger(server.url_as(writer), name="census/hr") as hr:
        hr.charge(PrivacyCost("0.25"))
    assert server.count("census") == server.count("census/hr") == 1
    with open_ledger(server.url_as(writer), name="census") as parent:  # it may read it
        assert parent.spent.epsilon == Fraction(1, 4)
        with pytest.raises(StorageError, match="may not charge"):
            parent.charge(PrivacyCost("0.25"))  # but never charge the parent alone
    s = server.s
    direct = [  # ... nor through any function, nor the share alone
        f"SELECT * FROM {s}.dpaccount_lock_v1(ARRAY['census'], ARRAY[0::bigint])",
        f"SELECT * FROM {s}.dpaccount_lock_v1(ARRAY['census/hr'], ARRAY[0::bigint])",
        f"SELECT * FROM {s}.dpaccount_append_within_v4('census/hr', 1, '{{', '}}', NULL, "
        "'0/1', '0/1', NULL, '1/1', NULL, NULL, NULL, NULL, NULL, NULL)",
        f"SELECT * FROM {s}.dpaccount_append_at_v1(ARRAY['census'], ARRAY[1::bigint], "
        "ARRAY['x'], ARRAY['0/1'], ARRAY['0/1'], ARRAY[NULL], ARRAY['{{}}'], ARRAY['y'], "
        "ARRAY[NULL], ARRAY['0/1'], ARRAY['0/1'])",
    ]
    with server.connect_as(writer) as conn:
        for attempt in direct:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(attempt)
        # a snapshot of the parent: refused (it could under-count others' charges)
        assert conn.execute(
            f"SELECT {s}.dpaccount_snapshot_v1('census', 1, 'x', '1/4', '0/1', NULL, '{{}}', "
            "NULL, 'x')").fetchone() == ("refused",)
    assert server.count("census") == server.count("census/hr") == 1


# -- the auditor --------------------------------------------------------------------------


def test_an_auditor_reads_and_verifies_and_cannot_charge(server: Server, tmp_path: Path
                                                         ) -> None:
    import psycopg

    with open_ledger(server.url, name="L", budget=Budget(1)) as acct:
        acct.charge(PrivacyCost("0.25"), label="count")
    open_ledger(server.url, name="hidden", budget=Budget(1)).close()
    auditor = server.role()
    assert "read and verify (auditor)" in server.grant("L", auditor, "auditor")
    url = server.url_as(auditor)
    assert cli("verify", url, "--name", "L")[0] == 0
    status, shown = cli("show", url, "--name", "L")
    assert status == 0 and "count" in shown
    assert cli("export", url, "--name", "L", "--output", str(tmp_path / "e.json"))[0] == 0
    assert cli("report", url, "--name", "L", "--output", str(tmp_path / "r.html"))[0] == 0
    status, listed = cli("list", url)
    assert status == 0 and "hidden" not in listed and "L" in listed
    with open_ledger(url, name="L", read_only=True) as dashboard:
        assert dashboard.spent.epsilon == Fraction(1, 4)
    with open_ledger(url, name="L") as acct, pytest.raises(StorageError,
                                                           match="permission denied"):
        acct.charge(PrivacyCost("0.1"))
    with server.connect_as(auditor) as conn:
        for attempt in (f"UPDATE {server.s}.ledgers SET epsilon_sum = '0/1'",
                        f"SELECT * FROM {server.s}.dpaccount_lock_v1(ARRAY['L'], "
                        "ARRAY[0::bigint])"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(attempt)
    assert server.count("L") == 1


# -- revoke, and grants while writers run -------------------------------------------------


def test_revoke_removes_it_all(server: Server) -> None:
    import psycopg

    open_ledger(server.url, name="census", budget=Budget(1)).close()
    open_ledger(server.url, name="census/hr", budget=Budget(1), parent="census").close()
    writer = server.role()
    server.grant("census/hr", writer, "writer")
    hr = open_ledger(server.url_as(writer), name="census/hr")
    hr.charge(PrivacyCost("0.1"))
    status, text = cli("revoke", server.url, "--name", "census/hr", "--role", writer)
    assert status == 0 and "revoked" in text
    with pytest.raises(StorageError, match="permission denied"):
        hr.charge(PrivacyCost("0.1"))  # the running writer is refused at once
    hr.close()
    assert server.sql("SELECT count(*) FROM {s}.grants") == [(0,)]
    with server.connect_as(writer) as conn:
        for table in ("ledgers", "records", "grants"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"SELECT * FROM {server.s}.{table}")
    assert cli("revoke", server.url, "--name", "census/hr", "--role", writer)[1].startswith(
        f"role {writer!r} had no grant")
    assert server.count("census/hr") == 1


def test_a_grant_while_writers_run_does_not_stop_them(server: Server) -> None:
    # A grant changes the functions' privileges, hence their catalog rows: running
    # writers check the functions again (still dpaccount's), pin them anew, and go on.
    owner = open_ledger(server.url, name="L", budget=Budget(10, "1e-6"), rule="filter")
    owner.charge(PrivacyCost("0.1"))
    first = server.role()
    server.grant("L", first, "writer")
    writer = open_ledger(server.url_as(first), name="L")
    writer.charge(PrivacyCost("0.1"))
    server.grant("L", server.role(), "writer")
    owner.charge(PrivacyCost("0.1"))
    writer.charge(PrivacyCost("0.1"))
    assert server.count("L") == 4
    owner.close()
    writer.close()


def test_grant_is_for_the_owner_of_an_existing_ledger_and_role(server: Server) -> None:
    open_ledger(server.url, name="L", budget=Budget(1)).close()
    writer = server.role()
    assert cli("grant", server.url, "--name", "L", "--role", "nobody_" + uuid.uuid4().hex,
               "--as", "writer")[0] == 2
    assert cli("grant", server.url, "--name", "missing", "--role", writer,
               "--as", "writer")[0] == 2
    server.grant("L", writer, "writer")
    other = server.role()  # a writer cannot grant others (nor itself more)
    assert cli("grant", server.url_as(writer), "--name", "L", "--role", other,
               "--as", "writer")[0] == 2
    assert cli("revoke", server.url_as(writer), "--name", "L", "--role", writer)[0] == 2
    assert server.sql("SELECT count(*) FROM {s}.grants") == [(1,)]


def test_a_granted_role_retries_nothing_on_a_duplicate_query_id(server: Server) -> None:
    open_ledger(server.url, name="L", budget=Budget(1)).close()
    writer = server.role()
    server.grant("L", writer, "writer")
    with open_ledger(server.url_as(writer), name="L") as acct:
        acct.charge(PrivacyCost("0.1"), query_id="once")
        store: Any = acct.store
        with pytest.raises(LedgerConflictError):
            store.append_within(1, LedgerRecord(
                seq=1, label=None, charge=PrivacyCost("0.1"), cost=PrivacyCost("0.1"),
                rule="basic", timestamp=datetime(2026, 1, 1, tzinfo=UTC), query_id="once"),
                None, Fraction(0), None)
    assert server.count("L") == 1


# -- SQLite: no roles, file permissions ---------------------------------------------------


def test_grant_on_sqlite_points_at_the_file_permission_runbook(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    open_ledger(url, name="L", budget=Budget(1)).close()
    for argv in (["grant", url, "--name", "L", "--role", "r", "--as", "writer"],
                 ["revoke", url, "--name", "L", "--role", "r"]):
        assert cli(*argv)[0] == 2


def _loosen(path: Path, mode: int) -> Callable[[], None]:
    before = stat.S_IMODE(os.stat(path).st_mode)
    path.chmod(mode)
    return lambda: path.chmod(before)


@pytest.mark.parametrize("target", ["file", "wal", "shm", "directory"])
def test_verify_warns_about_ledger_files_others_can_write(tmp_path: Path, target: str,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    folder = tmp_path / "ledgers"
    folder.mkdir(mode=0o700)
    db = folder / "l.db"
    url = f"sqlite:///{db}"
    with open_ledger(url, name="L", budget=Budget(1)) as acct:
        acct.charge(PrivacyCost("0.1"))
        holder = sqlite3.connect(db)  # keeps the -wal and -shm files in place
        status, text = cli("verify", url, "--name", "L")
        assert status == 0 and "warning" not in text  # new files are private
        path = {"file": db, "wal": Path(f"{db}-wal"), "shm": Path(f"{db}-shm"),
                "directory": folder}[target]
        restore = _loosen(path, 0o777 if target == "directory" else 0o666)
        try:
            status, text = cli("verify", url, "--name", "L")
        finally:
            restore()
            holder.close()
    assert status == 0  # the ledger itself verified
    warning = next(line for line in text.splitlines() if line.startswith("warning:"))
    assert str(path) in warning and "group and others" in warning
    assert text.splitlines()[-1].startswith("ok:")
    assert "dpaccount: warning:" in capsys.readouterr().err


@pytest.mark.parametrize("path", ["within", "decided", "group"])
def test_a_hostile_writer_cannot_spend_past_a_basic_ledgers_stored_budget(
        server: Server, path: str) -> None:
    # A writer that bypasses the Accountant and calls the store's write paths itself,
    # with limits of its choosing or a decision that admits anything: the database
    # compares the sums with the budget stored in the ledger's settings (the basic rule)
    # at commit, on every path that moves the tip, and refuses; nothing is recorded.
    open_ledger(server.url, name="L", budget=Budget(1, "1e-6")).close()
    writer = server.role()
    server.grant("L", writer, "writer")
    with open_ledger(server.url_as(writer), name="L") as acct:
        acct.charge(PrivacyCost("0.5"))
        store: Any = acct.store
        head = store.head()
        over = _record(head, eps="3/4")  # 0.5 + 0.75 > 1
        with pytest.raises(StorageError, match="past its stored epsilon budget"):
            if path == "within":
                store.append_within(head, over, Fraction(100), Fraction(1), None)
            elif path == "decided":
                store.append_decided(head, over, lambda missed: True)
            else:
                store.append_group([GroupAppend("L", head, over, None, lambda missed: True)])
        # what fits is still charged (the writer's ordinary path)
        acct.charge(PrivacyCost("0.5"))
        with pytest.raises(BudgetExceededError):
            acct.charge(PrivacyCost("1/1000"))
    assert server.count("L") == 2
    assert server.sql("SELECT epsilon_sum FROM {s}.ledgers WHERE name = 'L'") == [("1/1",)]
    assert cli("verify", server.url, "--name", "L")[0] == 0


def test_the_stored_delta_budget_and_dataset_size_hold_against_a_hostile_writer(
        server: Server) -> None:
    with pytest.warns(DeltaWarning):  # delta 1/1000 >= 1/n: the size is the binding limit
        open_ledger(server.url, name="L", budget=Budget(10, "1/1000"),
                    dataset_size=2000).close()
    writer = server.role()
    server.grant("L", writer, "writer")
    with pytest.warns(DeltaWarning), open_ledger(server.url_as(writer), name="L") as acct:
        store: Any = acct.store
        record = LedgerRecord(seq=0, label="direct", charge=PrivacyCost(0, "1/2000"),
                              cost=PrivacyCost(0, "1/2000"), rule="basic",
                              timestamp=datetime(2026, 1, 1, tzinfo=UTC))
        # 1/2000 fits the delta budget 1/1000 but not delta < 1/n with n = 2000
        with pytest.raises(StorageError, match="past its stored delta budget"):
            store.append_within(0, record, None, Fraction(1), None)
    assert server.count("L") == 0
