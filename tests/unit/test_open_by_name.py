"""Opening a ledger by name alone, as a context manager, and read-only (issue: ledgers
for a data platform, item 2)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from dpaccount import Budget, GaussianCharge, PrivacyCost, open_ledger
from dpaccount.errors import ConfigError, ReadOnlyLedgerError, StorageError

SETTINGS: list[dict[str, Any]] = [
    {"budget": Budget(1)},
    {"budget": Budget(2, "1e-5"), "rule": "filter"},
    {"budget": Budget(2, "1e-5"), "rule": "rdp", "relation": "substitution"},
    {"budget": Budget(2, "1e-5"), "rule": "advanced", "plan": (PrivacyCost("0.1"), 50)},
    {"budget": Budget(2, "1e-9"), "rule": "gdp", "dataset_size": 10**6},
]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: s.get("rule", "basic"))
def test_a_ledger_opens_by_name_alone_with_its_stored_settings(url: str,
                                                               settings: dict[str, Any]
                                                               ) -> None:
    charge: Any = PrivacyCost("0.1")
    if settings.get("rule") == "gdp":
        charge = GaussianCharge(sigma=5, sensitivity=1, epsilon=1)
    with open_ledger(url, name="census", **settings) as creator:
        creator.charge(charge)
        described = creator.rule.describe()
    with open_ledger(url, name="census") as job:  # a nightly job: no settings restated
        assert job.budget == settings["budget"]
        assert job.rule.describe() == described
        assert job.relation.value == settings.get("relation", "add_remove")
        job.charge(charge)
        assert len(job.records) == 2
    other = dict(settings, budget=Budget(5, "1e-10"))
    with pytest.raises(ConfigError, match="created with"):
        open_ledger(url, name="census", **other)  # other settings still need migrate=True


def test_the_context_manager_closes_the_connection(sqlite_url: str) -> None:
    with open_ledger(sqlite_url, name="L", budget=1) as acct:
        acct.charge(PrivacyCost("0.5"))
    with pytest.raises(StorageError):
        acct.charge(PrivacyCost("0.1"))
    with open_ledger(sqlite_url, name="L") as again:
        assert again.spent == PrivacyCost("0.5")


def test_a_missing_sqlite_file_is_named_and_not_created(tmp_path: Path) -> None:
    path = tmp_path / "typo.db"
    with pytest.raises(StorageError, match=r"typo\.db"):
        open_ledger(f"sqlite:///{path}", name="L")
    assert not path.exists()
    with pytest.raises(StorageError, match=r"typo\.db"):
        open_ledger(f"sqlite:///{path}", name="L", read_only=True)
    assert not path.exists()


def test_a_missing_ledger_in_an_existing_database_is_refused_without_settings(url: str
                                                                              ) -> None:
    open_ledger(url, name="exists", budget=1).close()
    with pytest.raises(ConfigError, match=r"no ledger named 'other'.*give budget="):
        open_ledger(url, name="other")
    with pytest.raises(StorageError, match="no ledger named 'other'"):
        open_ledger(url, name="other", budget=1, create=False)
    with open_ledger(url, name="exists") as acct:
        assert acct.records == []


def test_read_only_reads_and_refuses_every_write(url: str) -> None:
    with open_ledger(url, name="L", budget=1) as writer:
        writer.charge(PrivacyCost("0.25"), label="count")
    with open_ledger(url, name="L", read_only=True) as dashboard:
        assert dashboard.spent == PrivacyCost("0.25")
        assert dashboard.remaining.epsilon == 0.75
        with pytest.raises(ReadOnlyLedgerError, match="read-only"):
            dashboard.charge(PrivacyCost("0.1"))
        with pytest.raises(ReadOnlyLedgerError):
            dashboard.store.append(1, attrs_evolve(dashboard.records[0], seq=1))
        assert len(dashboard.records) == 1
    with pytest.raises(ConfigError, match="read_only"):
        open_ledger(url, name="L", budget=2, read_only=True, migrate=True)
    with open_ledger(url, name="L") as writer:
        assert len(writer.records) == 1


def attrs_evolve(record: Any, **changes: Any) -> Any:
    import attrs

    return attrs.evolve(record, **changes)


def test_read_only_sqlite_refuses_writes_at_the_connection(sqlite_url: str) -> None:
    with open_ledger(sqlite_url, name="L", budget=1) as writer:
        writer.charge(PrivacyCost("0.25"))
    with open_ledger(sqlite_url, name="L", read_only=True) as dashboard:
        conn: sqlite3.Connection = dashboard.store._conn  # type: ignore[attr-defined]
        with pytest.raises(sqlite3.OperationalError, match=r"readonly|read-only|query_only"):
            conn.execute("DELETE FROM ledgers")


def test_a_stored_plan_of_mechanism_charges_must_be_restated(sqlite_url: str) -> None:
    plan = (GaussianCharge(sigma=4, sensitivity=1, epsilon=1), 10)
    open_ledger(sqlite_url, name="P", budget=Budget(3, "1e-5"), rule="pld", plan=plan).close()
    with pytest.raises(ConfigError, match="give rule="):
        open_ledger(sqlite_url, name="P")
    with open_ledger(sqlite_url, name="P", rule="pld", plan=plan) as acct:
        assert acct.budget == Budget(3, "1e-5")
