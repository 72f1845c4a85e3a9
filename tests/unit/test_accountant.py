"""The Accountant: atomic check-and-record, refusals that change nothing, the guard."""

from __future__ import annotations

import asyncio
from fractions import Fraction
from typing import Any

import pytest

from dpaccount import (
    Accountant,
    Budget,
    BudgetExceededError,
    ConfigError,
    DuplicateQueryError,
    InvalidCostError,
    Parallel,
    PrivacyCost,
    Relation,
    Repeated,
    Scheme,
    Subsampled,
    UnsupportedChargeError,
)
from dpaccount.mechanisms.base import Mechanism


class _Identity(Mechanism):
    """A test double: charges a fixed cost and releases the value unchanged."""

    def __init__(self, cost: PrivacyCost) -> None:
        self._cost = cost
        self.released: list[Any] = []

    @property
    def charge(self) -> PrivacyCost:
        return self._cost

    def release(self, value: Any) -> Any:
        self.released.append(value)
        return value


def snapshot(acct: Accountant) -> tuple[object, ...]:
    return (acct.spent, acct.remaining, tuple(acct.records))


def test_whole_budget_then_any_positive_amount_is_refused() -> None:
    acct = Accountant(Budget("1", "1e-6"))
    acct.charge(PrivacyCost("1", "1e-6"))
    before = snapshot(acct)
    for tiny in [PrivacyCost(Fraction(1, 10**100)), PrivacyCost(0, Fraction(1, 10**100)),
                 PrivacyCost(5e-324)]:
        with pytest.raises(BudgetExceededError):
            acct.charge(tiny)
        assert snapshot(acct) == before
    acct.charge(PrivacyCost(0))  # a free query still fits


def test_refusal_carries_the_numbers_and_the_accountant_stays_usable() -> None:
    acct = Accountant(Budget(1))
    acct.charge(PrivacyCost("0.75"), label="first")
    with pytest.raises(BudgetExceededError) as info:
        acct.charge(PrivacyCost("0.5"))
    err = info.value
    assert err.requested == PrivacyCost("0.5")
    assert err.spent == PrivacyCost("0.75")
    assert err.budget == Budget(1)
    assert err.would_be == PrivacyCost("1.25")
    assert "0.5" in str(err) and "0.75" in str(err) and "1.25" in str(err)
    record = acct.charge(PrivacyCost("0.25"), label="last")
    assert (record.seq, record.label, record.cost) == (1, "last", PrivacyCost("0.25"))
    assert acct.spent == PrivacyCost(1)


def test_ten_float_tenths_exceed_a_budget_of_one() -> None:
    acct = Accountant(Budget(1))
    for _ in range(9):
        acct.charge(PrivacyCost(0.1))
    with pytest.raises(BudgetExceededError):
        acct.charge(PrivacyCost(0.1))  # 10 x float(0.1) is above 1 exactly
    acct = Accountant(Budget(1))
    for _ in range(10):
        acct.charge(PrivacyCost("0.1"))  # decimal tenths fit exactly
    assert acct.spent.epsilon == 1


@pytest.mark.parametrize("bad", [float("nan"), -1, "x", True, None, 0.5, (0.1, 0.0)])
def test_invalid_charges_raise_and_change_nothing(bad: Any) -> None:
    acct = Accountant(Budget(1))
    acct.charge(PrivacyCost("0.1"))
    before = snapshot(acct)
    with pytest.raises(InvalidCostError):
        acct.charge(bad)
    assert snapshot(acct) == before


def test_forged_cost_is_caught_when_it_enters_the_ledger() -> None:
    forged = PrivacyCost(1)
    object.__setattr__(forged, "epsilon", Fraction(-5))
    acct = Accountant(Budget(1))
    with pytest.raises(InvalidCostError):
        acct.charge(forged)
    assert acct.records == ()


def test_records_and_timestamps() -> None:
    acct = Accountant(Budget(2))
    first = acct.charge(PrivacyCost("0.5"), label="a")
    second = acct.charge(PrivacyCost("0.5"), label="b")
    assert [r.seq for r in acct.records] == [0, 1]
    assert first.timestamp <= second.timestamp
    assert first.timestamp.tzinfo is not None


def test_can_afford_does_not_record() -> None:
    acct = Accountant(Budget(1))
    assert acct.can_afford(PrivacyCost(1))
    assert not acct.can_afford(PrivacyCost(1.5))
    assert acct.records == ()


def test_remaining_k_is_exact_for_basic() -> None:
    acct = Accountant(Budget(1, "1e-6"))
    acct.charge(PrivacyCost("0.2", "1e-7"))
    per = acct.remaining_for(4)
    assert per == Budget("0.2", "2.25e-7")
    for _ in range(4):
        acct.charge(PrivacyCost(per.epsilon, per.delta))
    assert acct.spent == PrivacyCost(1, "1e-6")
    with pytest.raises(InvalidCostError):
        acct.remaining_for(0)


def test_repeated_equals_separate_charges() -> None:
    a, b = Accountant(Budget(10, 1e-6)), Accountant(Budget(10, 1e-6))
    a.charge(Repeated(PrivacyCost(0.3, 1e-9), 7))
    for _ in range(7):
        b.charge(PrivacyCost(0.3, 1e-9))
    assert a.spent == b.spent


def test_parallel_costs_the_maximum_partition() -> None:
    acct = Accountant(Budget(1))
    acct.charge(Parallel([PrivacyCost("0.5"), PrivacyCost("0.25"), PrivacyCost("0.5")]))
    assert acct.spent == PrivacyCost("0.5")


def test_relation_mismatch_is_refused() -> None:
    acct = Accountant(Budget(1), relation="substitution")
    with pytest.raises(UnsupportedChargeError, match="add_remove"):
        acct.charge(Parallel([PrivacyCost("0.1")]))
    with pytest.raises(UnsupportedChargeError):
        acct.charge(Subsampled(PrivacyCost(1), 0.1, Scheme.POISSON))
    acct.charge(Subsampled(PrivacyCost(1), 0.1, Scheme.WITHOUT_REPLACEMENT))
    acct.charge(Parallel([PrivacyCost("0.1")], relation=Relation.SUBSTITUTION))
    with pytest.raises(ConfigError):
        Accountant(Budget(1), relation="swap")


def test_unknown_rule_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown composition rule"):
        Accountant(Budget(1), rule="magic")


def test_duplicate_query_id_is_refused_and_not_charged() -> None:
    acct = Accountant(Budget(1))
    first = acct.charge(PrivacyCost("0.1"), query_id="q-1")
    with pytest.raises(DuplicateQueryError) as info:
        acct.charge(PrivacyCost("0.1"), query_id="q-1")
    assert info.value.record == first
    assert acct.spent == PrivacyCost("0.1")


def test_guard_charges_first_and_refused_query_never_runs() -> None:
    acct = Accountant(Budget(1))
    mech = _Identity(PrivacyCost("0.6"))
    calls: list[int] = []

    @acct.guard(mech, label="count")
    def query(x: int) -> int:
        calls.append(x)
        return x * 2

    assert query(3) == 6
    assert calls == [3] and acct.records[0].label == "count"
    with pytest.raises(BudgetExceededError):
        query(4)
    assert calls == [3]  # the refused query never ran
    assert mech.released == [6]


def test_failed_query_keeps_its_charge() -> None:
    acct = Accountant(Budget(1))
    mech = _Identity(PrivacyCost("0.5"))

    def boom() -> int:
        raise RuntimeError("data-dependent failure")

    with pytest.raises(RuntimeError):
        acct.run(mech, boom)
    assert acct.spent == PrivacyCost("0.5")  # no refund
    assert mech.released == []


def test_async_guard_and_run() -> None:
    acct = Accountant(Budget(1))
    mech = _Identity(PrivacyCost("0.5"))
    ran: list[str] = []

    @acct.guard(mech)
    async def query() -> int:
        ran.append("q")
        return 7

    assert asyncio.run(query()) == 7

    async def other() -> int:
        ran.append("o")
        return 8

    assert asyncio.run(acct.run(mech, other)) == 8
    coro = acct.run(mech, other)
    with pytest.raises(BudgetExceededError):
        asyncio.run(coro)
    assert ran == ["q", "o"]


def test_guard_refuses_a_non_mechanism() -> None:
    acct = Accountant(Budget(1))
    with pytest.raises(TypeError):
        acct.guard(PrivacyCost(1))  # type: ignore[arg-type]


def test_budget_forms() -> None:
    assert Accountant(1).budget == Budget(1)
    assert Accountant((1, "1e-6")).budget == Budget(1, "1e-6")
    assert Accountant(PrivacyCost(2)).budget == Budget(2)
    with pytest.raises(InvalidCostError):
        Accountant(float("nan"))


def test_unlimited_budget_tracks_only() -> None:
    acct = Accountant(Budget.unlimited())
    for _ in range(100):
        acct.charge(PrivacyCost(1000))
    assert acct.spent == PrivacyCost(100_000)
    assert acct.remaining.epsilon is None


def test_delta_reaching_one_over_n_is_refused() -> None:
    from dpaccount.errors import DeltaWarning

    acct = Accountant(Budget(10, "1e-6"), dataset_size=1000)  # 1e-6 << 1/1000: no warning
    acct.charge(PrivacyCost(0, "1e-7"))
    with pytest.warns(DeltaWarning, match="1/n"):
        big = Accountant(Budget(10, "0.01"), dataset_size=100)
    big.charge(PrivacyCost(0, "0.005"))
    before = big.spent
    with pytest.raises(BudgetExceededError, match="1/n"):
        big.charge(PrivacyCost(0, "0.005"))  # total would be exactly 1/100
    assert big.spent == before
    big.charge(PrivacyCost(0, Fraction(1, 200) - Fraction(1, 10**12)))


def test_max_queries_matches_charging_until_refused() -> None:
    for rule, budget, unit in [
        ("basic", Budget(1, "1e-6"), PrivacyCost("0.07", "1e-8")),
        ("filter", Budget(1, "1e-5"), PrivacyCost("0.01")),
    ]:
        acct = Accountant(budget, rule=rule)
        predicted = acct.max_queries(unit)
        admitted = 0
        with pytest.raises(BudgetExceededError):
            while True:
                acct.charge(unit)
                admitted += 1
        assert predicted == admitted
        assert acct.max_queries(unit) == 0


def test_max_queries_and_can_afford_respect_the_one_over_n_cap() -> None:
    from dpaccount.errors import DeltaWarning

    with pytest.warns(DeltaWarning):  # the budget's delta 1e-3 is above 1/n = 1e-4
        acct = Accountant(Budget(10, "1e-3"), dataset_size=10_000)
    unit = PrivacyCost("0.01", "1e-5")
    assert acct.max_queries(unit) == 9  # 10 x 1e-5 reaches 1/n exactly: refused
    for _ in range(9):
        acct.charge(unit)
    assert not acct.can_afford(unit)
    with pytest.raises(BudgetExceededError):
        acct.charge(unit)
    # delta-free charges are not capped: (10 - 9 x 0.01) / 0.01 of them still fit
    assert acct.max_queries(PrivacyCost("0.01")) == 991


def test_a_charge_that_takes_delta_to_one_is_refused_not_invalid() -> None:
    # the summed delta would reach 1: no PrivacyCost can state the total, but it is a
    # refusal like any other (BudgetExceededError), and nothing changes
    acct = Accountant(Budget(100, "0.9"))
    acct.charge(PrivacyCost(1, "0.6"))
    before = snapshot(acct)
    with pytest.raises(BudgetExceededError, match="delta of 1 or more") as info:
        acct.charge(PrivacyCost(1, "0.5"))
    assert info.value.would_be is None
    assert snapshot(acct) == before


def test_cached_costs_follow_a_charge_forged_after_use() -> None:
    # costs are cached by the charge's exact values, not by the object: a charge whose
    # field is replaced past attrs is costed again from what it now says
    from dpaccount.charges import GaussianCharge, cost_of

    charge = GaussianCharge(sigma=4, sensitivity=1, epsilon=1)
    first = cost_of(charge)
    object.__setattr__(charge, "sigma", Fraction(1))
    assert cost_of(charge).delta > first.delta
    assert cost_of(charge) == cost_of(GaussianCharge(sigma=1, sensitivity=1, epsilon=1))


@pytest.mark.parametrize("rule", ["basic", "filter", "rdp"])
def test_preview_records_nothing_and_matches_the_charge(rule: str) -> None:
    acct = Accountant(Budget(3, "1e-5"), rule=rule)
    acct.charge(PrivacyCost("0.3"))
    before = snapshot(acct)
    seen = acct.preview(PrivacyCost("0.3"))
    assert snapshot(acct) == before  # nothing recorded
    assert seen.cost == PrivacyCost("0.3") and seen.rule == rule
    assert seen.spent == acct.spent
    if seen.admitted:
        acct.charge(PrivacyCost("0.3"))
        assert acct.spent == seen.spent_after
    else:
        with pytest.raises(BudgetExceededError):
            acct.charge(PrivacyCost("0.3"))
    assert not acct.preview(PrivacyCost(50)).admitted
