"""open_ledger / open_store URLs and the ``dpaccount ledger`` commands."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
from fractions import Fraction
from pathlib import Path

import pytest

from dpaccount.accountant import Accountant
from dpaccount.costs import Budget, PrivacyCost
from dpaccount.errors import ConfigError, StorageError
from dpaccount.ledger_cli import ledger_main
from dpaccount.ledgers import open_ledger, open_store
from dpaccount.storage.memory import MemoryStore
from dpaccount.storage.sqlite import SQLiteStore


def test_memory_url() -> None:
    acct = open_ledger("memory://", budget=1)
    assert isinstance(acct, Accountant) and isinstance(acct.store, MemoryStore)
    assert isinstance(open_ledger("memory://", budget=1, migrate=True).store, MemoryStore)


def test_sqlite_relative_and_absolute_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    rel = open_store("sqlite:///rel.db")
    assert isinstance(rel, SQLiteStore) and rel.path == "rel.db"
    rel.close()
    absolute = open_store(f"sqlite:///{tmp_path / 'abs.db'}?lock_timeout=5", name="n")
    assert isinstance(absolute, SQLiteStore)
    assert absolute.path == str(tmp_path / "abs.db")
    assert (absolute.name, absolute.lock_timeout) == ("n", 5.0)
    absolute.close()


@pytest.mark.parametrize(
    "url",
    ["mysql://x/y", "ftp://a", "nope", "sqlite://host/x.db", "sqlite:///", "sqlite:///x.db?bad=1",
     "sqlite:///x.db?lock_timeout=-1", "sqlite:///x.db?lock_timeout=nan"],
)
def test_bad_urls_are_config_errors(url: str, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError):
        open_ledger(url, budget=1)


def test_postgres_url_options_are_stripped(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}

    class Fake:
        def __init__(self, conninfo: str, **kwargs: object) -> None:
            seen.update(kwargs, conninfo=conninfo)

    import dpaccount.storage.postgres as pg

    monkeypatch.setattr(pg, "PostgresStore", Fake)
    open_store("postgres://u@h:5/db?schema=s1&lock_timeout=3&sslmode=disable", name="L")
    assert seen == {"conninfo": "postgresql://u@h:5/db?sslmode=disable", "name": "L",
                    "schema": "s1", "lock_timeout": 3.0, "commit": "group", "key": None,
                    "read_only": False, "full_verify": False}
    open_store("postgres://u@h:5/db?commit=sync", name="L")
    assert seen["commit"] == "sync" and seen["conninfo"] == "postgresql://u@h:5/db"


def test_missing_psycopg_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(ImportError, match=r'pip install "dpaccount\[postgres\]"'):
        open_store("postgresql://u@h/db")


def test_failed_open_closes_the_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    open_ledger(url, budget=1).store.close()
    with pytest.raises(ConfigError, match="created with budget"):
        open_ledger(url, budget=2)


# -- the CLI ------------------------------------------------------------------------------


@pytest.fixture
def ledger_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    acct = open_ledger(url, name="census", budget=Budget(1, "1e-6"))
    acct.charge(PrivacyCost("0.25"), label="count adults", query_id="q1")
    acct.charge(PrivacyCost("0.5", "1e-7"), label="sum income")
    acct.store.close()
    return url


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    status = ledger_main(["ledger", *argv], out=out)
    return status, out.getvalue()


def test_show_lists_charges_spent_and_remaining(ledger_url: str) -> None:
    status, text = run("show", ledger_url, "--name", "census")
    assert status == 0
    assert "count adults" in text and "sum income" in text and "q1" in text
    # 1/4 + 1/2 = 3/4 exactly; the decimal delta 10**-7 is shown exactly
    assert "spent: (ε=0.75, δ=1e-07)" in text
    # remaining delta 9e-7 shown rounded down (9e-7 as a float is above 9 * 10**-7)
    assert f"remaining (shown rounded down): epsilon 0.25, delta {9e-7!r}" in text


def test_verify_ok_then_corrupt(ledger_url: str) -> None:
    status, text = run("verify", ledger_url, "--name", "census")
    assert status == 0 and "2 intact records" in text
    path = ledger_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TRIGGER records_append_only_update")
        conn.execute(
            "UPDATE records SET payload = replace(payload, '\"1/2\"', '\"1/10\"') WHERE seq=1"
        )
    conn.close()
    status, text = run("verify", ledger_url, "--name", "census")
    assert status == 1
    assert "first bad record: 1" in text


def test_missing_ledger_is_an_error(ledger_url: str) -> None:
    assert run("verify", ledger_url, "--name", "nobody")[0] == 2
    assert run("show", "memory://")[0] == 2


def test_export_json_and_csv(ledger_url: str, tmp_path: Path) -> None:
    status, text = run("export", ledger_url, "--name", "census", "--format", "json")
    data = json.loads(text)
    assert status == 0
    assert data["ledger"]["budget_epsilon"] == "1/1"
    assert [r["record"]["cost"]["epsilon"] for r in data["records"]] == ["1/4", "1/2"]
    out = tmp_path / "x.csv"
    assert run("export", ledger_url, "--name", "census", "--format", "csv",
               "--out", str(out))[0] == 0
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert [Fraction(r["epsilon"]) for r in rows] == [Fraction(1, 4), Fraction(1, 2)]
    # the decimal first (never below the value), the exact fraction beside it
    assert rows[1]["delta"] == "1e-07" and rows[1]["delta_exact"] == "1/10000000"


def test_report_writes_a_png(ledger_url: str, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "spend.png"
    assert run("report", ledger_url, "--name", "census", "--out", str(out))[0] == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_without_matplotlib_names_the_extra(
    ledger_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"dpaccount\[plot\]"):
        run("report", ledger_url, "--name", "census", "--out", str(tmp_path / "a.png"))


def test_store_error_is_not_a_conflict() -> None:
    assert not issubclass(StorageError, ConfigError)


def test_migration_to_a_rule_with_budget_defaults(tmp_path: Path) -> None:
    # The filter rule takes its delta slack from the budget: the migrated settings must
    # be built exactly as the accountant builds them, or the reopen would be refused.
    from dpaccount import Budget, PrivacyCost, open_ledger

    url = f"sqlite:///{tmp_path / 'm.db'}"
    budget = Budget(1, "1e-5")
    first = open_ledger(url, name="d", budget=budget)
    first.charge(PrivacyCost("0.25"))
    first.store.close()
    moved = open_ledger(url, name="d", budget=budget, rule="filter", migrate=True)
    assert moved.rule.name == "filter" and len(moved.records) == 1
    moved.store.close()
    again = open_ledger(url, name="d", budget=budget, rule="filter")
    assert again.rule.name == "filter"
    again.store.close()
    from dpaccount import ConfigError

    with pytest.raises(ConfigError, match="stored settings"):  # n is a stored setting too
        open_ledger(url, name="d", budget=budget, rule="filter", dataset_size=1000)


def _admitted(budget: Budget, cost: PrivacyCost, rule: str) -> int:
    from dpaccount.errors import BudgetExceededError

    acct, n = Accountant(budget, rule=rule), 0
    while True:
        try:
            acct.charge(cost)
        except BudgetExceededError:
            return n
        n += 1


def test_a_lost_race_is_decided_under_the_store_lock(tmp_path: Path) -> None:
    # Two writers on one SQLite ledger under the filter rule. The second is behind:
    # its compare-and-append loses, and its retry is decided under SQLite's write lock
    # on the records as they are (append_decided), with the first writer's record in.
    from dpaccount.errors import BudgetExceededError
    from dpaccount.storage.sqlite import SQLiteStore as Store

    calls: list[int] = []

    class Counting(Store):
        def append_decided(self, known_head, record, decide):  # type: ignore[no-untyped-def]
            calls.append(known_head)
            return super().append_decided(known_head, record, decide)

    cost = PrivacyCost("0.2")
    # a budget that admits exactly two such charges (found with an in-memory ledger)
    budget = next(b for b in (Budget(Fraction(k, 4), "1e-5") for k in range(4, 40))
                  if _admitted(b, cost, "filter") == 2)
    path = str(tmp_path / "f.db")
    first = Accountant(budget, store=Counting(path, name="f"), name="f", rule="filter")
    second = Accountant(budget, store=Counting(path, name="f"), name="f", rule="filter")
    first.charge(cost)
    record = second.charge(cost)
    assert calls == [1] and record.seq == 1  # lost once, caught up, decided under the lock
    assert len(second.records) == 2
    with pytest.raises(BudgetExceededError):
        first.charge(cost)  # behind by one: refused on the records as they are
    assert len(first.records) == 2


def test_writers_that_meet_decide_under_the_lock_until_they_are_alone(
    tmp_path: Path,
) -> None:
    # Compare-and-append while a writer has the ledger to itself; after a lost race, the
    # decision is made under the store's lock (no further lost races) until 8 charges in
    # a row find that nobody else appended.
    from dpaccount.storage.sqlite import SQLiteStore as Store

    paths: list[str] = []
    reads: list[int] = []

    class Counting(Store):
        def append(self, expected_head, record):  # type: ignore[no-untyped-def]
            paths.append("cas")
            return super().append(expected_head, record)

        def append_decided(self, known_head, record, decide):  # type: ignore[no-untyped-def]
            result = super().append_decided(known_head, record, decide)
            paths.append(f"decided/{len(result.missed)}")
            return result

        def read(self, start=0):  # type: ignore[no-untyped-def]
            records = super().read(start)
            reads.append(len(records))
            return records

    budget, cost = Budget(100, "1e-5"), PrivacyCost("0.01")
    path = str(tmp_path / "f.db")
    a = Accountant(budget, store=Counting(path, name="f"), name="f", rule="filter")
    b = Accountant(budget, store=Counting(path, name="f"), name="f", rule="filter")
    a.charge(cost)
    assert paths == ["cas"]
    paths.clear()
    b.charge(cost)  # behind: loses the race once, then decides under the lock
    assert paths == ["cas", "decided/0"]
    paths.clear()
    reads.clear()
    for _ in range(3):  # taking turns: every charge misses the other's record, read
        a.charge(cost)  # before the lock is asked for (SQLite reads cost no round trip)
        b.charge(cost)
    assert paths == ["cas", "decided/0"] + ["decided/0"] * 5
    # ... one record each time (a's first after its lost race); reads that found nothing
    # new (a right after catching up on its lost race) read no record
    assert [n for n in reads if n] == [1] * 6
    paths.clear()
    for _ in range(9):  # b alone: 8 quiet charges, then compare-and-append again
        b.charge(cost)
    assert paths == ["decided/0"] * 8 + ["cas"]
    assert len(b.records) == 17
    fresh = Accountant(budget, store=Store(path, name="f"), name="f", rule="filter")
    assert fresh.spent == b.spent  # the decisions under the lock kept b's state exact
