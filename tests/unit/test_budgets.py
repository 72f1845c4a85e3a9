"""Sub-budgets and block windows: one charge to several ledgers, all or nothing (issue:
ledgers for a data platform, item 3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpaccount import Budget, PrivacyCost, open_ledger
from dpaccount.budgets import BlockLedgers, charge_together, sub_budget
from dpaccount.errors import BudgetExceededError, ConfigError, DuplicateQueryError


def _ids(acct: object) -> list[str | None]:
    return [r.query_id for r in acct.records]  # type: ignore[attr-defined]


def test_a_sub_budget_charges_itself_and_its_parent_all_or_nothing(url: str) -> None:
    open_ledger(url, name="census", budget=Budget(1)).close()
    team_a = open_ledger(url, name="census/team-a", budget=Budget("0.6"), parent="census")
    team_b = open_ledger(url, name="census/team-b", budget=Budget("0.6"), parent="census")
    team_a.charge(PrivacyCost("0.5"), label="a", query_id="a1")
    team_b.charge(PrivacyCost("0.5"), label="b", query_id="b1")
    with pytest.raises(BudgetExceededError) as parent_full:
        team_b.charge(PrivacyCost("0.05"), query_id="b2")  # the parent would pass 1
    assert parent_full.value.ledger == "census"
    with pytest.raises(BudgetExceededError) as share_full:
        team_a.charge(PrivacyCost("0.2"), query_id="a2")  # team-a would pass 0.6
    assert share_full.value.ledger == "census/team-a"
    with open_ledger(url, name="census") as census:
        assert census.spent == PrivacyCost(1)
        assert _ids(census) == ["a1", "b1"]  # the refused charges left no trace anywhere
    assert _ids(team_a) == ["a1"] and _ids(team_b) == ["b1"]
    team_a.close()
    team_b.close()
    with open_ledger(url, name="census/team-b") as again:  # by name: the parent is stored
        with pytest.raises(BudgetExceededError):
            again.charge(PrivacyCost("0.05"))
        with pytest.raises(DuplicateQueryError):
            again.charge(PrivacyCost("0.01"), query_id="b1")


def test_a_sub_budget_of_a_sub_budget_charges_every_ancestor(sqlite_url: str) -> None:
    open_ledger(sqlite_url, name="root", budget=Budget(1)).close()
    open_ledger(sqlite_url, name="root/a", budget=Budget(1), parent="root").close()
    with open_ledger(sqlite_url, name="root/a/x", budget=Budget("0.3"),
                     parent="root/a") as leaf:
        leaf.charge(PrivacyCost("0.25"), query_id="q")
    for name in ("root", "root/a", "root/a/x"):
        with open_ledger(sqlite_url, name=name) as acct:
            assert _ids(acct) == ["q"], name


def test_a_missing_parent_is_refused_and_nothing_is_created(sqlite_url: str) -> None:
    open_ledger(sqlite_url, name="other", budget=1).close()
    with pytest.raises(ConfigError, match="parent ledger 'census' does not exist"):
        open_ledger(sqlite_url, name="census/team-a", budget=1, parent="census")
    with pytest.raises(ConfigError, match="no ledger named"):
        open_ledger(sqlite_url, name="census/team-a")


def test_a_different_parent_is_refused_like_other_settings(sqlite_url: str) -> None:
    for name in ("p1", "p2"):
        open_ledger(sqlite_url, name=name, budget=1).close()
    open_ledger(sqlite_url, name="c", budget=1, parent="p1").close()
    with pytest.raises(ConfigError, match="created with"):
        open_ledger(sqlite_url, name="c", budget=1, parent="p2")


def test_sub_budgets_in_memory() -> None:
    from dpaccount import Accountant

    census = Accountant(Budget(1), name="census")
    team = sub_budget(census, "census/team", Budget("0.5"))
    team.charge(PrivacyCost("0.5"))
    with pytest.raises(BudgetExceededError) as info:
        team.charge(PrivacyCost("0.01"))
    assert info.value.ledger == "census/team"
    census.charge(PrivacyCost("0.5"))
    with pytest.raises(BudgetExceededError):
        census.charge(PrivacyCost("0.01"))
    assert census.spent == PrivacyCost(1) and len(census.records) == 2


def test_a_window_is_charged_to_each_block_all_or_nothing(url: str) -> None:
    with BlockLedgers(url, "events", budget_per_block=Budget(1)) as blocks:
        blocks.charge(PrivacyCost("0.6"), ["d1", "d2"], query_id="w1")
        with pytest.raises(BudgetExceededError) as info:
            blocks.charge(PrivacyCost("0.6"), ["d3", "d2"], query_id="w2")
        assert info.value.ledger == "events/d2"
        assert blocks.remaining("d3").epsilon == 1  # untouched: all or nothing
        blocks.charge(PrivacyCost("0.6"), ["d3"], query_id="w3")
        assert blocks.remaining("d4").epsilon == 1  # a new block: a fresh budget
        assert [blocks.remaining(b).epsilon for b in ("d1", "d2", "d3")] == [
            PrivacyCost("0.4").epsilon] * 3
    with BlockLedgers(url, "events", budget_per_block=Budget(1)) as again:
        assert _ids(again.ledger("d2")) == ["w1"] and _ids(again.ledger("d3")) == ["w3"]


def test_blocks_need_a_fully_adaptive_rule(sqlite_url: str) -> None:
    blocks = BlockLedgers(sqlite_url, "events", budget_per_block=Budget(1, "1e-6"),
                          rule="optimal")
    with pytest.raises(ConfigError):
        blocks.charge(PrivacyCost("0.1"), ["d1"])


def test_blocks_in_memory() -> None:
    with BlockLedgers("memory://", "s", budget_per_block=1) as blocks:
        blocks.charge(PrivacyCost("0.75"), ["a", "b"])
        with pytest.raises(BudgetExceededError):
            blocks.charge(PrivacyCost("0.5"), ["c", "a"])
        assert blocks.remaining("c").epsilon == 1


def test_ledgers_of_different_databases_cannot_be_charged_together(tmp_path: Path) -> None:
    one = open_ledger(f"sqlite:///{tmp_path / 'a.db'}", name="x", budget=1)
    two = open_ledger(f"sqlite:///{tmp_path / 'b.db'}", name="y", budget=1)
    with pytest.raises(ConfigError, match="not in one database"):
        charge_together([one, two], PrivacyCost("0.1"))
    one.close()
    two.close()


def test_grouped_charges_are_snapshotted_like_single_ones(sqlite_url: str) -> None:
    from dpaccount.accountant import SNAPSHOT_EVERY

    with BlockLedgers(sqlite_url, "s", budget_per_block=Budget(10)) as blocks:
        for _ in range(SNAPSHOT_EVERY + 1):
            blocks.charge(PrivacyCost("1/1000"), ["a", "b"])
        heads = [s.tip.head for s in blocks.ledger("b").store.snapshots()]  # type: ignore[attr-defined]
    assert heads == [SNAPSHOT_EVERY]
